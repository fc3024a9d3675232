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


# ---------------------------------------------------------------------------------------------
# Damaged and foreign files (issue 11, item 2): one clear CheckpointError naming the path and
# what to do, never torch's advice to load with weights_only=False; a SHA-256 digest catches
# flipped bytes.
# ---------------------------------------------------------------------------------------------

MARKER = torch.arange(4096, dtype=torch.float32) + 0.5  # easy to find in the file's bytes


def small_checkpoint(path):
    state = {"format": 1, "model": {"w": MARKER.clone()}, "model_config": {}, "config": {}}
    return save_checkpoint(state, path)


def damage(kind, path):
    """Write a damaged or foreign file of the given ``kind`` at ``path``."""
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        data = small_checkpoint(path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random bytes":
        path.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)))
    elif kind == "text":
        path.write_text("step 10, loss 2.3\nthis is not a checkpoint\n")
    elif kind == "json":
        path.write_text(json.dumps({"format": 1, "model": {}}))
    elif kind == "plain pickle":
        import pickle

        path.write_bytes(pickle.dumps({"format": 1}, protocol=2))
    elif kind == "tensor":
        torch.save(torch.ones(3), path)
    elif kind == "whole module":
        torch.save(torch.nn.Linear(2, 2), path)  # needs an unsafe load: refused
    elif kind == "state dict":
        torch.save(torch.nn.Linear(2, 2).state_dict(), path)
    elif kind == "folder":
        path.mkdir()
    else:
        raise AssertionError(kind)
    return path


DAMAGE = [
    "empty",
    "truncated",
    "random bytes",
    "text",
    "json",
    "plain pickle",
    "tensor",
    "whole module",
    "state dict",
    "folder",
]


@pytest.mark.parametrize("kind", DAMAGE)
def test_unreadable_files_give_one_clear_error(kind, tmp_path):
    from companion.checkpoint import CheckpointError

    path = damage(kind, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert str(path) in message
    assert "weights_only" not in message and "weights_only=False" not in repr(caught.value)
    error = caught.value  # torch's own error (and its advice) is not chained to ours
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert any(hint in message for hint in ("start the run", "save_checkpoint", "start a new"))
    assert ("holds Python objects" in message) == (kind == "whole module")
    with pytest.raises(CheckpointError):  # the model cannot be built from it either
        model_from_checkpoint(path)


def test_missing_file_is_a_checkpoint_error_and_a_file_not_found_error(tmp_path):
    from companion.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="no checkpoint at") as caught:
        load_checkpoint(tmp_path / "missing.pt")
    assert isinstance(caught.value, FileNotFoundError)


def test_flipped_bytes_in_the_weights_are_detected(tmp_path):
    from companion.checkpoint import CheckpointError

    path = small_checkpoint(tmp_path / "checkpoint.pt")
    data = bytearray(path.read_bytes())
    start = bytes(data).index(MARKER.numpy().tobytes()[:64])  # the tensor's bytes in the file
    for offset in (4001, 4002, 4003):  # the exponent byte of three floats: weights of ~1e38
        data[start + offset] ^= 0x7F
    path.write_bytes(bytes(data))
    raw = torch.load(path, weights_only=True)  # torch itself reads the damaged file ...
    assert not torch.equal(raw["model"]["w"], MARKER)
    with pytest.raises(CheckpointError, match="is damaged: its content does not match"):
        load_checkpoint(path)  # ... load_checkpoint refuses it


def test_digest_is_saved_and_covers_every_value(tmp_path):
    from companion.checkpoint import checkpoint_digest

    path = small_checkpoint(tmp_path / "checkpoint.pt")
    loaded = load_checkpoint(path)
    assert loaded["sha256"] == checkpoint_digest(loaded) and len(loaded["sha256"]) == 64
    for change in (
        lambda s: s["model"].__setitem__("w", MARKER.double()),  # same values, other dtype
        lambda s: s["model"].__setitem__("w", MARKER.view(64, 64)),  # other shape
        lambda s: s.__setitem__("config", {"lr": 1.0}),  # a plain value
    ):
        state = load_checkpoint(path)
        change(state)
        assert checkpoint_digest(state) != loaded["sha256"]
    save_checkpoint(loaded, tmp_path / "again.pt")  # re-saving a loaded checkpoint works
    assert load_checkpoint(tmp_path / "again.pt")["sha256"] == loaded["sha256"]


def test_checkpoint_without_digest_loads_with_a_warning(tmp_path):
    from companion.checkpoint import CheckpointWarning

    state = {"format": 1, "model": {"w": MARKER}, "model_config": {}, "config": {}}
    torch.save(state, tmp_path / "old.pt")  # as save_checkpoint wrote it before digests
    with pytest.warns(CheckpointWarning, match="has no SHA-256 digest"):
        loaded = load_checkpoint(tmp_path / "old.pt")
    assert torch.equal(loaded["model"]["w"], MARKER)


def test_unsupported_format_is_a_clear_error(tmp_path):
    from companion.checkpoint import CheckpointError

    state = {"format": 99, "model": {}, "model_config": {}, "config": {}}
    save_checkpoint(state, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match="checkpoint format 99, this version reads format 1"):
        load_checkpoint(tmp_path / "future.pt")
