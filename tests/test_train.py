"""companion.train's loop: schedule, checkpoints (atomic, weights_only, exact resume), time
budget, the toy task, the Multi30k pipeline and the command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from companion.configs import CONFIGS, TrainConfig, get_config, resolve_config_name
from companion.data import PAD_ID
from companion.train import (
    History,
    Trainer,
    build_model,
    inverse_sqrt_warmup,
    load_checkpoint,
    main,
    model_from_checkpoint,
    prepare_data,
    save_checkpoint,
    train,
)

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_ROOT", ROOT.parent / "shared" / "data" / "multi30k"))

#: A small, fast configuration: the toy copy task with little data and small batches.
TINY = get_config("toy", toy_examples=300, max_tokens=400, dropout=0.1, max_epochs=None)


def make_trainer(config: TrainConfig = TINY, out_dir=None, seed: int = 0) -> Trainer:
    data = prepare_data(config)
    torch.manual_seed(seed)
    model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
    torch.manual_seed(seed + 1)
    return Trainer(
        model,
        config,
        data.train,
        data.val,
        src_vocab=data.src_vocab,
        tgt_vocab=data.tgt_vocab,
        tokenizer=data.tokenizer,
        out_dir=out_dir,
        progress=False,
    )


# ------------------------------------------------------------------------- configurations


def test_named_configs_and_auto():
    assert set(CONFIGS) == {"cpu", "gpu", "toy"}
    assert resolve_config_name("auto") == ("gpu" if torch.cuda.is_available() else "cpu")
    cpu = get_config("cpu")
    assert (cpu.d_model, cpu.num_layers, cpu.label_smoothing) == (256, 3, 0.1)
    assert cpu.time_budget is not None and cpu.time_budget <= 600
    gpu = get_config("gpu")
    assert gpu.d_model > cpu.d_model and gpu.num_layers > cpu.num_layers
    assert TrainConfig.from_dict(cpu.to_dict()) == cpu
    assert get_config("cpu", dropout=0.3).dropout == 0.3


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: get_config("laptop"), ValueError, r"config must be one of 'auto', 'cpu', 'gpu', 'toy', got 'laptop'"),
        (lambda: get_config("cpu", time_budget=0), ValueError, r"time_budget must be a positive number of seconds or None, got 0"),
        (lambda: get_config("cpu", time_budget=-5.0), ValueError, r"time_budget must be a positive .* got -5.0"),
        (lambda: get_config("cpu", max_steps=0), ValueError, r"max_steps must be >= 1, got 0"),
        (lambda: get_config("cpu", beam_size=0), ValueError, r"beam_size must be >= 1, got 0"),
        (lambda: get_config("cpu", num_heads=3), ValueError, r"d_model must be divisible by num_heads"),
        (lambda: get_config("cpu", task="de-fr"), ValueError, r"task must be one of 'multi30k', 'copy', 'reverse', got 'de-fr'"),
        (lambda: get_config("cpu", learning_rate=1.0), TypeError, r"unknown TrainConfig field\(s\) \['learning_rate'\]"),
        (lambda: get_config("cpu", dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
    ],
)  # fmt: skip
def test_config_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


# ------------------------------------------------------------------------- schedule, history


def test_learning_rate_follows_the_schedule():
    trainer = make_trainer()
    trainer.fit(max_steps=6)
    schedule = inverse_sqrt_warmup(TINY.d_model, TINY.warmup_steps, TINY.lr_factor)
    assert trainer.history.lr == pytest.approx([schedule(n) for n in range(1, 7)])
    assert trainer.history.step == list(range(1, 7))
    # warm-up rises linearly, then decays as 1/sqrt(step)
    assert schedule(20) == pytest.approx(schedule(10) * 2)
    assert schedule(4 * TINY.warmup_steps) == pytest.approx(schedule(TINY.warmup_steps) / 2)
    assert all(t > 0 for t in trainer.history.tokens)
    assert trainer.history.time == sorted(trainer.history.time)
    # stopped mid-epoch: one validation at the last step
    assert trainer.history.val_step == [6] and 0 < trainer.history.val_epoch[0] < 1


def test_history_round_trip(tmp_path):
    trainer = make_trainer()
    trainer.fit(max_steps=3)
    path = trainer.history.save_json(tmp_path / "history.json")
    again = History.load_json(path)
    assert again == trainer.history
    assert set(json.loads(path.read_text())) >= {"step", "loss", "lr", "tokens", "val_loss"}


def test_fit_needs_a_limit_and_checks_it():
    trainer = make_trainer(TINY.replace(max_epochs=None))
    with pytest.raises(ValueError, match="fit needs a limit"):
        trainer.fit()
    with pytest.raises(
        ValueError, match=r"time_budget must be a positive number of seconds, got 0"
    ):
        trainer.fit(time_budget=0)
    with pytest.raises(ValueError, match=r"max_steps must be >= 1, got -1"):
        trainer.fit(max_steps=-1)


def test_trainer_rejects_a_model_without_padding_id():
    data = prepare_data(TINY)
    model = build_model(TINY, len(data.src_vocab), len(data.tgt_vocab))
    model_without_pad = type(model)(14, 14, d_model=16, num_heads=2, num_layers=1, d_ff=16)
    with pytest.raises(ValueError, match="tgt_pad_id"):
        Trainer(model_without_pad, TINY, data.train)
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        Trainer(model, {"d_model": 64}, data.train)


# ------------------------------------------------------------------------- checkpoints


def test_checkpoint_loads_with_weights_only(tmp_path):
    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_steps=3)
    path = tmp_path / "checkpoint.pt"
    raw = torch.load(path, weights_only=True)  # plain containers and tensors only
    assert raw["progress"]["step"] == 3
    assert raw["config"] == TINY.to_dict()
    assert raw["vocab"]["src"] == trainer.src_vocab.to_dict()
    assert {"model", "optimizer", "scheduler", "rng", "history"} <= set(raw)
    model = model_from_checkpoint(path)
    for name, tensor in trainer.model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)


def test_checkpoint_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(
        {"format": 1, "model": {"w": torch.ones(3)}, "model_config": {}, "config": {}}, path
    )
    before = path.read_bytes()

    def crash(obj, file, *args, **kwargs):
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"format": 1, "model": {"w": torch.zeros(3)}}, path)
    assert path.read_bytes() == before  # the old checkpoint is intact ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # ... and no temp file
    torch.testing.assert_close(load_checkpoint(path)["model"]["w"], torch.ones(3))


def test_load_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"weights": torch.ones(2)}, tmp_path / "other.pt")
    with pytest.raises(
        ValueError, match=r"not a companion.train checkpoint: it lacks the key\(s\)"
    ):
        load_checkpoint(tmp_path / "other.pt")


def test_resume_continues_exactly(tmp_path):
    """N steps straight == N/2 steps, save, load into fresh objects, N/2 more (dropout on, an
    epoch boundary in between): the same losses and the same weights, bit for bit."""
    steps = 14
    straight = make_trainer(seed=0)
    assert len(straight._epoch_batches(0)) < steps  # the run crosses an epoch boundary
    straight.fit(max_steps=steps)

    first = make_trainer(out_dir=tmp_path, seed=0)
    first.fit(max_steps=steps // 2)  # saves tmp_path/checkpoint.pt
    torch.manual_seed(1234)  # disturb the random state: the checkpoint must restore it
    second = make_trainer(out_dir=tmp_path, seed=99)  # other initial weights, fresh optimiser
    second.load_checkpoint()
    assert second.step == steps // 2
    second.fit(max_steps=steps)

    assert second.history.loss == straight.history.loss
    assert second.history.lr == straight.history.lr
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], tensor), name


def test_resume_refuses_another_model(tmp_path):
    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_steps=1)
    other = make_trainer(TINY.replace(d_model=32))
    with pytest.raises(ValueError, match="does not match this trainer's.*d_model"):
        other.load_checkpoint(tmp_path / "checkpoint.pt")


# ------------------------------------------------------------------------- budgets


def test_time_budget_is_respected():
    trainer = make_trainer(TINY.replace(toy_examples=2000))
    budget = 1.5
    start = time.perf_counter()
    trainer.fit(time_budget=budget)
    wall = time.perf_counter() - start
    assert trainer.stop_reason == "time_budget"
    slowest_step = max(b - a for a, b in zip(trainer.history.time, trainer.history.time[1:]))
    # the last step started before the budget ran out
    assert trainer.history.time[-1] - budget <= slowest_step + 0.5
    assert wall < budget + 5.0  # + one step, one validation pass


def test_max_epochs_validates_every_epoch(tmp_path):
    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_epochs=2)
    per_epoch = len(trainer._epoch_batches(0))
    assert trainer.stop_reason == "max_epochs" and trainer.epoch == 2
    assert trainer.history.val_epoch == [1.0, 2.0]
    assert trainer.history.val_step[0] == per_epoch
    assert load_checkpoint(tmp_path / "checkpoint.pt")["progress"]["epoch"] == 2


# ------------------------------------------------------------------------- whole runs


def test_toy_task_learns(tmp_path):
    """The toy configuration copies about 90% of unseen sequences exactly after 300 steps."""
    result = train("toy", tmp_path, max_steps=300, progress=False)
    assert result.results["test_accuracy"] >= 0.8, result.results
    assert result.history.val_loss[-1] < 0.25 * result.history.val_loss[0]
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["steps"] == 300 and written["test_accuracy"] == result.results["test_accuracy"]


@pytest.mark.skipif(not (MULTI30K / "train.de.gz").is_file(), reason="no local Multi30k copy")
def test_multi30k_pipeline_end_to_end(tmp_path):
    from companion.metrics import Translator

    config = get_config(
        "cpu", d_model=32, num_heads=2, num_layers=1, d_ff=32, max_tokens=2000, beam_size=2
    )
    result = train(
        config, tmp_path, data_root=MULTI30K, download=False, max_steps=2, progress=False
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 2 and math.isfinite(results["val_loss"])
    assert 0 <= results["test_bleu"] <= 100 and 0 <= results["test_tokenized_bleu"] <= 100
    assert len((tmp_path / "test_translations.txt").read_text().splitlines()) == 1000
    assert {p.name for p in tmp_path.iterdir()} >= {
        "checkpoint.pt",
        "history.json",
        "config.json",
        "results.json",
    }
    translator = Translator.from_checkpoint(tmp_path / "checkpoint.pt", beam_size=1)
    out = translator.translate(["Ein Hund läuft.", ""])
    assert len(out) == 2 and all(isinstance(s, str) for s in out) and out[1] == ""
    assert translator.tgt_vocab == result.data.tgt_vocab


# ------------------------------------------------------------------------- command line


def test_cli_help():
    done = subprocess.run(
        [sys.executable, "-m", "companion.train", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0
    for option in ("--config", "--out", "--time-budget", "--max-steps", "--data-root", "--set"):
        assert option in done.stdout


def test_cli_runs_the_toy_task(tmp_path, capsys):
    results = main(
        ["--config", "toy", "--out", str(tmp_path), "--max-steps", "3", "--no-progress",
         "--set", "toy_examples=200", "--set", "dropout=0.2"]
    )  # fmt: skip
    assert results["steps"] == 3
    assert json.loads((tmp_path / "config.json").read_text())["dropout"] == 0.2
    assert '"steps": 3' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "laptop"], "invalid choice: 'laptop'"),
        (["--time-budget", "0"], "must be a positive number of seconds, got 0"),
        (["--time-budget", "-3"], "must be a positive number of seconds"),
        (["--max-steps", "0"], "must be >= 1, got 0"),
        (["--set", "colour=blue"], "unknown field 'colour'"),
        (["--set", "dropout=high"], "expected a value of type float, got 'high'"),
        (["--set", "dropout=1.5"], "dropout must be in [0, 1), got 1.5"),
    ],
)
def test_cli_errors(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *argv])
    assert message in capsys.readouterr().err


def test_build_model_uses_padding_id():
    model = build_model(TINY, 14, 14)
    assert model.config.src_pad_id == model.config.tgt_pad_id == PAD_ID
