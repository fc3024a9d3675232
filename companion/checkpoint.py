"""Checkpoint files (chapter 8): what a training run saves, written atomically and read back
safely.

- :func:`save_checkpoint` writes a state (e.g. :meth:`companion.trainer.Trainer.state_dict`)
  atomically with :func:`companion._files.atomic_write` (a temporary file in the same folder,
  then ``os.replace``), so a crash while saving leaves the previous checkpoint intact;
- :func:`load_checkpoint` reads one with ``torch.load(..., weights_only=True)``: a checkpoint
  holds only tensors and plain Python containers, so loading a file cannot run code;
- :func:`model_from_checkpoint` rebuilds the trained :class:`~companion.model.Transformer`
  (used by :meth:`companion.metrics.Translator.from_checkpoint`);
- :func:`rng_state` and :func:`restore_rng_state` capture and restore the random number
  generators (torch, CUDA, Python, NumPy), so a resumed run continues exactly;
- :func:`write_json` writes the small JSON files of a run (configuration, history, results).

A checkpoint (format :data:`CHECKPOINT_FORMAT`) holds the model, optimiser and scheduler
state, step/epoch/position in the epoch, the random number generators' states, the
configuration (a dict), the vocabularies (:meth:`~companion.data.Vocab.to_dict`) and the
history. This module sits below training and evaluation: it imports neither.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from companion._files import atomic_write
from companion.model import Transformer, TransformerConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "write_json",
    "save_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "rng_state",
    "restore_rng_state",
]

#: Version of the checkpoint layout written by :func:`save_checkpoint`.
CHECKPOINT_FORMAT = 1
_CHECKPOINT_KEYS = ("format", "model", "model_config", "config")


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` (plain Python types) as indented JSON to ``path``, atomically."""
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    return atomic_write(path, lambda file: file.write(text.encode("utf-8")))


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Save ``state`` (e.g. :meth:`companion.trainer.Trainer.state_dict`) to ``path`` atomically.

    The file is first written to a temporary file in the same folder and then renamed over
    ``path`` (``os.replace``): an exception or a crash during the save leaves the previous
    checkpoint untouched, and no temporary file behind (unless the process is killed).
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    return atomic_write(path, lambda file: torch.save(dict(state), file))


def load_checkpoint(
    path: str | os.PathLike[str], map_location: str | torch.device | None = "cpu"
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` with ``weights_only=True``
    (plain containers and tensors only: loading a file cannot run arbitrary code).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a :mod:`companion.checkpoint` checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    missing = [
        k for k in _CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint
    ]
    if missing:
        raise ValueError(
            f"{path} is not a companion.checkpoint checkpoint: it lacks the key(s) {missing}"
        )
    if checkpoint["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} has checkpoint format {checkpoint['format']}, this version reads "
            f"format {CHECKPOINT_FORMAT}"
        )
    return checkpoint


def model_from_checkpoint(checkpoint: Mapping[str, Any] | str | os.PathLike[str]) -> Transformer:
    """A :class:`~companion.model.Transformer` with the weights of a checkpoint (a path or the
    dict from :func:`load_checkpoint`), in evaluation mode."""
    if not isinstance(checkpoint, Mapping):
        checkpoint = load_checkpoint(checkpoint)
    model = Transformer(TransformerConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval()


def rng_state() -> dict[str, Any]:
    """The states of every random number generator training uses (torch, CUDA when available,
    Python's :mod:`random`, NumPy), as tensors and plain data for a checkpoint."""
    numpy_state = np.random.get_state()
    python_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [python_state[0], list(python_state[1]), python_state[2]],
        "numpy": [
            numpy_state[0],
            numpy_state[1].tolist(),
            int(numpy_state[2]),
            int(numpy_state[3]),
            float(numpy_state[4]),
        ],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`rng_state`'s output. The CUDA states are restored only on a machine
    with as many GPUs as the one that saved them."""
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = [s.cpu() for s in state["cuda"]]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
