"""companion.checkpoint: atomic saves, ``weights_only`` loads, the model of a checkpoint,
random number generator states; and the layering: checkpoints and metrics sit below the
training modules and import none of them."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import companion.checkpoint
import companion.metrics
from companion.checkpoint import (
    load_checkpoint,
    model_from_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    write_json,
)


def test_checkpoint_loads_with_weights_only(make_trainer, tiny_config, tmp_path):
    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_steps=3)
    path = tmp_path / "checkpoint.pt"
    raw = torch.load(path, weights_only=True)  # plain containers and tensors only
    assert raw["progress"]["step"] == 3
    assert raw["config"] == tiny_config.to_dict()
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
        ValueError, match=r"not a companion.checkpoint checkpoint: it lacks the key\(s\)"
    ):
        load_checkpoint(tmp_path / "other.pt")


def test_rng_state_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    path = save_checkpoint({"rng": rng_state()}, tmp_path / "rng.pt")
    expected = (torch.rand(3), random.random(), np.random.rand())
    restore_rng_state(torch.load(path, weights_only=True)["rng"])
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(again[0], expected[0]) and again[1:] == expected[1:]


def test_write_json_round_trip(tmp_path):
    path = write_json(tmp_path / "out" / "results.json", {"steps": 3, "bleu": None})
    assert json.loads(path.read_text()) == {"steps": 3, "bleu": None}
    with pytest.raises(TypeError):
        write_json(path, {"not json": object()})
    assert json.loads(path.read_text()) == {"steps": 3, "bleu": None}


# ------------------------------------------------------------------------- layering

TRAINING_MODULES = {"companion.train", "companion.trainer", "companion.run"}


def _imported_modules(module) -> set[str]:
    """Every module an ``import``, ``from … import`` or ``importlib.import_module("…")``
    anywhere in ``module``'s source names (top level or inside functions), with
    ``from companion import train`` read as ``companion.train``."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return names


def test_the_layering_finds_imports():
    imported = _imported_modules(companion.metrics)
    assert "companion.checkpoint" in imported and "companion.decode.beam_search" in imported


@pytest.mark.parametrize(
    "module", [companion.checkpoint, companion.metrics], ids=lambda m: m.__name__
)
def test_checkpoint_and_metrics_do_not_import_training(module):
    """metrics → checkpoint, never metrics → train/trainer/run: no import cycle."""
    imported = _imported_modules(module)
    bad = {
        name
        for name in imported
        if name.startswith(".")
        or any(name == m or name.startswith(m + ".") for m in TRAINING_MODULES)
    }
    assert not bad, f"{module.__name__} imports {sorted(bad)}"
