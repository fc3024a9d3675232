"""companion.reference_runs: the recorded translator runs chapter 8 compares with."""

from __future__ import annotations

import math

import pytest

from companion.configs import get_config
from companion.reference_runs import ReferenceRun, load_reference, reference_configs


def _run(**changes) -> ReferenceRun:
    fields = dict(
        config="cpu",
        changes={},
        steps=(100, 200, 400),
        values={"val_loss": (4.0, 3.0, 2.0), "test_bleu_greedy": (5.0, 15.0, 25.0)},
        seed_steps=400,
        seeds={"val_loss": (2.0, 2.1, 1.9), "test_bleu_greedy": (25.0, 24.0, 26.0)},
        machine="a CPU",
        date="2026-11-27",
        ablation={},
    )
    return ReferenceRun(**{**fields, **changes})


def test_at_interpolates_between_the_recorded_steps():
    run = _run()
    assert run.at(100, "val_loss") == 4.0 and run.at(400, "val_loss") == 2.0
    assert run.at(150, "val_loss") == pytest.approx(3.5)
    assert run.at(300, "test_bleu_greedy") == pytest.approx(20.0)
    assert run.at(1000, "val_loss") == 2.0  # beyond the last: the last value
    assert run.at(99, "val_loss") is None  # below the first: no reference
    with pytest.raises(KeyError, match="score must be one of"):
        run.at(200, "val_bleu")
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        run.at(0, "val_loss")


def test_the_seed_statistics():
    run = _run()
    assert run.seed_mean("val_loss") == pytest.approx(2.0)
    assert run.seed_spread("test_bleu_greedy") == pytest.approx(1.0)
    with pytest.raises(KeyError, match="score must be one of"):
        run.seed_mean("bleu")


def test_the_recorded_cpu_run_is_complete_and_sane():
    """The file chapter 8 reads: the cpu configuration's run, increasing steps up to the
    chapter's budget and beyond, a falling validation loss, three seeds or more, and the
    scores the chapter's checks use."""
    assert "cpu" in reference_configs() and load_reference("gpu") is None
    run = load_reference("cpu")
    assert run is not None and run.config == "cpu"
    assert list(run.steps) == sorted(set(run.steps)) and run.steps[0] <= 100
    assert run.seed_steps in run.steps
    for key in ("val_loss", "test_bleu_greedy", "test_bleu_beam4", "train_seconds"):
        assert len(run.values[key]) == len(run.steps), key
        assert all(math.isfinite(v) for v in run.values[key]), key
    losses = run.values["val_loss"]
    assert all(b < a for a, b in zip(losses, losses[1:])), f"validation loss should fall: {losses}"
    for key in ("val_loss", "test_bleu_greedy", "test_bleu_beam4"):
        assert len(run.seeds[key]) >= 3 and run.seed_spread(key) > 0, key
    assert run.at(run.seed_steps, "val_loss") == pytest.approx(run.seeds["val_loss"][0])
    config = get_config("cpu")  # the recorded run is the configuration the chapter trains
    assert all(
        getattr(config, k, getattr(config.model, k, None)) == v for k, v in run.changes.items()
    )
    for name, variant in run.ablation.items():
        assert len(variant["seeds"]) >= 3 and len(variant["val_bleu_greedy"]) == len(
            variant["seeds"]
        ), name


def test_load_reference_refuses_a_name_that_is_not_a_string():
    with pytest.raises(TypeError, match="config must be"):
        load_reference(None)
