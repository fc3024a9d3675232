"""Checkpoint files (chapter 8): what a training run saves, written atomically and read back
safely.

- :func:`save_checkpoint` writes a state (e.g. :meth:`companion.trainer.Trainer.state_dict`)
  atomically with :func:`companion._files.atomic_write` (a temporary file in the same folder,
  then ``os.replace``), so a crash while saving leaves the previous checkpoint intact;
- :func:`load_checkpoint` reads one with ``torch.load(..., weights_only=True)``: a checkpoint
  holds only tensors and plain Python containers, so loading a file cannot run code;
- every checkpoint carries a SHA-256 digest of its content (:func:`checkpoint_digest`: every
  tensor's bytes, dtype and shape, and every other value), written at save time and checked at
  load time, so a damaged file (flipped bytes, a partial copy) raises :class:`CheckpointError`
  instead of loading wrong weights; a file that cannot be read at all (missing, empty,
  truncated, not a checkpoint) raises :class:`CheckpointError` too, naming the path and what to
  do. A checkpoint written before digests existed loads with a :class:`CheckpointWarning`
  (nothing can tell whether it is intact); saving it again adds the digest;
- :func:`model_from_checkpoint` rebuilds the trained :class:`~companion.model.Transformer`
  (used by :meth:`companion.metrics.Translator.from_checkpoint`);
- :func:`model_checkpoint` and :func:`rebuild_model` save and rebuild a model of another
  class built from a :class:`~companion.model.TransformerConfig` (the decoder-only and
  encoder-only models of :mod:`companion.families`, whose ``from_checkpoint`` passes their
  class in, so this module never imports them). The class is recorded under
  ``"model_kind"``; a checkpoint without one (every checkpoint written before) holds a
  :class:`~companion.model.Transformer`;
- :func:`rng_state` and :func:`restore_rng_state` capture and restore the random number
  generators (torch, CUDA, Python, NumPy), so a resumed run continues exactly;
- :func:`write_json` writes the small JSON files of a run (configuration, history, results).

A checkpoint (format :data:`CHECKPOINT_FORMAT`) holds the model, optimiser and scheduler
state, step/epoch/position in the epoch, the random number generators' states, the
configuration (a dict), the vocabularies (:meth:`~companion.data.Vocab.to_dict`) and the
history. This module sits below training and evaluation: it imports neither.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from companion._files import atomic_write
from companion.model import Transformer, TransformerConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "CheckpointWarning",
    "checkpoint_digest",
    "write_json",
    "save_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "model_checkpoint",
    "rebuild_model",
    "rng_state",
    "restore_rng_state",
]

#: Version of the checkpoint layout written by :func:`save_checkpoint`.
CHECKPOINT_FORMAT = 1
_CHECKPOINT_KEYS = ("format", "model", "model_config", "config")
_DIGEST_KEY = "sha256"  # the digest of everything else, written by save_checkpoint
_KIND_KEY = "model_kind"  # the model's class name; absent in a Transformer's checkpoint
Model = TypeVar("Model", bound=nn.Module)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: missing, empty, truncated, damaged (its content
    does not match its SHA-256 digest), or not a :mod:`companion.checkpoint` checkpoint. The
    message names the file and what to do."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """No checkpoint file at the path (a :class:`CheckpointError` and a ``FileNotFoundError``)."""


class CheckpointWarning(UserWarning):
    """A checkpoint without a digest (written before digests existed) was loaded unchecked."""


def checkpoint_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a checkpoint's content, the ``"sha256"`` entry itself left out.

    Every tensor contributes its dtype, shape and raw bytes, every other value its type and
    ``repr``, every dict key its ``repr``, in order: two states have the same digest only if
    they hold the same values. :func:`save_checkpoint` stores it, :func:`load_checkpoint`
    recomputes and compares it.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    digest = hashlib.sha256()
    _digest_update(digest, {k: v for k, v in state.items() if k != _DIGEST_KEY})
    return digest.hexdigest()


def _digest_update(digest: Any, value: Any) -> None:
    """Feed ``value`` (nested dicts, lists and tuples of tensors and plain values) to ``digest``."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)  # (numel,)
        digest.update(f"tensor:{tensor.dtype}:{tuple(value.shape)}:".encode())
        digest.update(tensor.view(torch.uint8).numpy())  # its bytes (numel * element size,)
    elif isinstance(value, Mapping):
        digest.update(f"dict:{len(value)}:".encode())
        for key, item in value.items():
            digest.update(f"{key!r}=".encode())
            _digest_update(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"list:{len(value)}:".encode())
        for item in value:
            _digest_update(digest, item)
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` (plain Python types) as indented JSON to ``path``, atomically."""
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    return atomic_write(path, lambda file: file.write(text.encode("utf-8")))


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Save ``state`` (e.g. :meth:`companion.trainer.Trainer.state_dict`) to ``path`` atomically.

    The file is first written to a temporary file in the same folder and then renamed over
    ``path`` (``os.replace``): an exception or a crash during the save leaves the previous
    checkpoint untouched, and no temporary file behind (unless the process is killed). The
    state is saved with its SHA-256 digest (:func:`checkpoint_digest`) under ``"sha256"``.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    content = {k: v for k, v in state.items() if k != _DIGEST_KEY}
    content[_DIGEST_KEY] = checkpoint_digest(content)
    return atomic_write(path, lambda file: torch.save(content, file))


def load_checkpoint(
    path: str | os.PathLike[str], map_location: str | torch.device | None = "cpu"
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` with ``weights_only=True``
    (plain containers and tensors only: loading a file cannot run arbitrary code), and check
    its SHA-256 digest.

    A checkpoint without a digest (saved by an older version of :mod:`companion`) loads with a
    :class:`CheckpointWarning`: it may be damaged, and nothing can tell.

    Raises:
        CheckpointError: the file cannot be used - missing (then also a
            ``FileNotFoundError``), empty, truncated or otherwise unreadable, damaged (its
            content does not match its digest), or not a :mod:`companion.checkpoint`
            checkpoint. The message names the path and what to do.
    """
    path = Path(path)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "nothing"
        raise MissingCheckpointError(
            f"no checkpoint at {path} (found {what}); check the path, or start a new run "
            "(python -m companion.run writes checkpoint.pt in its --out folder)"
        )
    damaged = (
        "delete or move it, and resume from another copy of the checkpoint or start the run "
        "again (save_checkpoint writes atomically, so the file was damaged after it was saved: "
        "an interrupted copy, a full disk, a storage error or an edit)"
    )
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes); {damaged}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:  # torch's message would suggest an unsafe load
        if "Unsupported global" in str(error):  # a pickled class, e.g. a whole nn.Module
            raise CheckpointError(
                f"{path} is not a companion.checkpoint checkpoint: it holds Python objects "
                "other than tensors and plain containers (e.g. a whole nn.Module saved with "
                "torch.save), which load_checkpoint never unpickles; load a file written by "
                "save_checkpoint, or re-save the weights with save_checkpoint where the file "
                "is trusted"
            ) from None
        raise CheckpointError(
            f"checkpoint {path} ({size} bytes) cannot be read: it is truncated, damaged or not "
            f"a PyTorch file; {damaged}"
        ) from None
    except Exception as error:  # noqa: BLE001 - any failure to parse is a damaged file
        raise CheckpointError(
            f"checkpoint {path} ({size} bytes) cannot be read ({type(error).__name__}): it is "
            f"truncated, damaged or not a PyTorch file; {damaged}"
        ) from None
    missing = [
        k for k in _CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint
    ]
    if missing:
        kind = "a dict" if isinstance(checkpoint, dict) else f"a {type(checkpoint).__name__}"
        raise CheckpointError(
            f"{path} is not a companion.checkpoint checkpoint: it lacks the key(s) {missing} "
            f"(it holds {kind}); pass a file written by save_checkpoint (e.g. the checkpoint.pt "
            "of a run)"
        )
    if checkpoint["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} has checkpoint format {checkpoint['format']!r}, this version reads "
            f"format {CHECKPOINT_FORMAT}; use the version of companion that wrote it"
        )
    expected = checkpoint.get(_DIGEST_KEY)
    if expected is None:
        warnings.warn(
            f"checkpoint {path} has no SHA-256 digest (it was saved by an older version of "
            "companion), so damage cannot be detected; save it again with save_checkpoint to "
            "add one",
            CheckpointWarning,
            stacklevel=2,
        )
    elif checkpoint_digest(checkpoint) != expected:
        raise CheckpointError(
            f"checkpoint {path} is damaged: its content does not match the SHA-256 digest "
            f"written when it was saved, so its weights are not loaded; {damaged}"
        )
    return checkpoint


def model_from_checkpoint(checkpoint: Mapping[str, Any] | str | os.PathLike[str]) -> Transformer:
    """A :class:`~companion.model.Transformer` with the weights of a checkpoint (a path or the
    dict from :func:`load_checkpoint`), in evaluation mode, in the dtype of the saved weights.

    Raises:
        CheckpointError: the file cannot be read (see :func:`load_checkpoint`), or its model
            configuration or weights do not make a :class:`~companion.model.Transformer`.
    """
    return rebuild_model(checkpoint, lambda config, options: Transformer(config), "Transformer")


def model_checkpoint(
    model: nn.Module,
    kind: str,
    *,
    options: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint of ``model`` alone, for :func:`save_checkpoint`: its weights, its
    ``model.config`` (a :class:`~companion.model.TransformerConfig`) as a dict, its class
    ``kind`` (e.g. ``"DecoderOnlyTransformer"``), the other arguments its constructor takes
    (``options``, plain values) and a run configuration ``config`` (default empty).
    :func:`rebuild_model` reads it back."""
    if not isinstance(getattr(model, "config", None), TransformerConfig):
        raise TypeError(
            f"model must have a TransformerConfig as .config, got {type(model).__name__}"
        )
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"kind must be the model's class name (a str), got {kind!r}")
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model.state_dict(),
        "model_config": asdict(model.config),
        _KIND_KEY: kind,
        "model_options": dict(options or {}),
        "config": dict(config or {}),
    }


def rebuild_model(
    checkpoint: Mapping[str, Any] | str | os.PathLike[str],
    build: Callable[[TransformerConfig, Mapping[str, Any]], Model],
    kind: str,
) -> Model:
    """The model of a checkpoint (a path or the dict from :func:`load_checkpoint`), with its
    weights, in evaluation mode: ``build(config, options)`` makes it from the saved
    :class:`~companion.model.TransformerConfig` and ``"model_options"``. Its parameters and
    buffers get the dtypes of the saved weights (a float64 model comes back float64, every
    weight exact), on the CPU.

    Args:
        checkpoint: a path or a loaded checkpoint.
        build: makes an untrained model, e.g. ``lambda config, options: cls(config, **options)``.
        kind: the class the checkpoint must hold (its ``"model_kind"``; ``"Transformer"``
            for a checkpoint that names none).

    Raises:
        CheckpointError: the file cannot be read (see :func:`load_checkpoint`), it holds
            another kind of model (the message names it and how to rebuild it), or its
            configuration or weights do not make the model.
    """
    where = "the checkpoint"
    if not isinstance(checkpoint, Mapping):
        where = str(checkpoint)
        checkpoint = load_checkpoint(checkpoint)
    saved = checkpoint.get(_KIND_KEY, "Transformer")
    if saved != kind:
        rebuild = (
            "companion.checkpoint.model_from_checkpoint"
            if saved == "Transformer"
            else f"companion.families.{saved}.from_checkpoint"
        )
        raise CheckpointError(
            f"{where} holds a {saved} (model_kind={saved!r}), not a {kind}; rebuild it "
            f"with {rebuild}"
        )
    try:
        model = build(
            TransformerConfig(**checkpoint["model_config"]), checkpoint.get("model_options", {})
        )
        _take_saved_dtypes(model, checkpoint["model"])  # a float64 model comes back float64
        model.load_state_dict(checkpoint["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())[:300]  # one line: torch's can run to pages
        raise CheckpointError(
            f"{where} does not hold a model this version can rebuild "
            f"({type(error).__name__}: {reason}); pass a checkpoint written by "
            "save_checkpoint from a training run of companion"
        ) from None
    return model.eval()


def _take_saved_dtypes(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Give ``model``'s floating-point parameters and buffers the dtypes of their saved
    tensors in ``state``, before ``load_state_dict`` copies the values in (which would round
    them to the freshly built model's float32). One saved dtype: ``model.to(dtype)``, which
    also converts the buffers a checkpoint does not hold (ALiBi's slopes)."""
    if not isinstance(state, Mapping):
        return  # load_state_dict names the problem
    saved = {
        v.dtype for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
    }
    if len(saved) == 1:
        model.to(saved.pop())
        return
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        value = state.get(name)
        if (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and tensor.is_floating_point()
        ):
            tensor.data = tensor.data.to(value.dtype)


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
