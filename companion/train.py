"""Training: teacher forcing, label-smoothed loss, the inverse-square-root warm-up schedule,
and the whole training loop of chapter 8.

The core pieces every chapter that trains a model uses (chapters 3, 5, 6, 7 and 8):

- :func:`shift_targets` splits a target batch ``<bos> y1 … yn <eos>`` into the decoder input
  ``<bos> y1 … yn`` and the labels ``y1 … yn <eos>`` (teacher forcing);
- :func:`sequence_loss` is the cross-entropy over non-padding positions, with label smoothing;
- :func:`inverse_sqrt_warmup` is the learning-rate schedule of "Attention Is All You Need";
- :func:`train_step` does one forward + backward + clipped optimiser step.

The training loop (chapter 8):

- :class:`Trainer` runs epochs over token-bucketed batches (Adam + the warm-up schedule,
  gradient clipping, dropout, label smoothing) with a progress bar (loss, target tokens per
  second, learning rate) that works in a notebook and in a terminal; it stops at a time
  budget, a number of steps or of epochs, computes the validation loss after every epoch,
  records a :class:`History` for plots and saves **checkpoints** that resume exactly;
- :func:`train` builds data, model and trainer from a :class:`~companion.configs.TrainConfig`,
  trains, and scores the test set (BLEU on Multi30k, exact-match accuracy on a toy task);
- ``python -m companion.train --config cpu --out runs/cpu`` is the same function on the
  command line (``--help`` lists the options); under ``torchrun --nproc_per_node=N`` it
  trains with ``DistributedDataParallel``, each process taking its share of every batch.

Checkpoints (:func:`save_checkpoint`) are written atomically (a temporary file in the same
folder, then ``os.replace``), so a crash while saving leaves the previous checkpoint intact.
They hold only tensors and plain Python containers, so ``torch.load(path, weights_only=True)``
reads them: model, optimiser and scheduler state, step/epoch/position in the epoch, the random
number generators' states, the configuration (a dict), the vocabularies
(:meth:`~companion.data.Vocab.to_dict`) and the history.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from companion._files import atomic_write
from companion._validation import (
    check_floating,
    check_ndim,
    check_positive_int,
    check_probability,
    check_tensor,
    shape_str,
)
from companion.configs import TrainConfig, get_config
from companion.data import (
    PAD_ID,
    CopyReverseDataset,
    TokenBatchSampler,
    Tokenizer,
    Vocab,
    WordTokenizer,
    collate_batch,
    prepare_multi30k,
)
from companion.model import Transformer, TransformerConfig

__all__ = [
    # core
    "StepStats",
    "inverse_sqrt_warmup",
    "sequence_loss",
    "shift_targets",
    "train_step",
    # loop
    "History",
    "Trainer",
    "save_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "RunData",
    "prepare_data",
    "build_model",
    "TrainResult",
    "train",
    "main",
]


def shift_targets(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Teacher forcing: ``tgt (batch, tgt_len)`` → decoder input and labels, each
    ``(batch, tgt_len - 1)``. Position ``t`` of the input predicts position ``t`` of the labels.
    """
    check_tensor("tgt", tgt)
    check_ndim("tgt", tgt, 2, "(batch, tgt_len)")
    if tgt.shape[1] < 2:
        raise ValueError(
            f"tgt needs at least 2 positions (<bos> and one token), got shape {shape_str(tgt.shape)}"
        )
    return tgt[:, :-1], tgt[:, 1:]  # (batch, tgt_len - 1) each


def sequence_loss(
    logits: Tensor, labels: Tensor, pad_id: int | None = None, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy per non-padding token.

    Args:
        logits: ``(batch, tgt_len, vocab)``, unnormalised scores from the model.
        labels: ``(batch, tgt_len)`` token ids; positions equal to ``pad_id`` are ignored.
        pad_id: padding id, or ``None`` when nothing is padded.
        label_smoothing: ε of label smoothing (Szegedy et al., 2016): the target puts
            ``1 - ε`` on the right token and spreads ``ε`` uniformly over the vocabulary.
    """
    check_floating("logits", logits)
    check_ndim("logits", logits, 3, "(batch, tgt_len, vocab)")
    check_tensor("labels", labels)
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape {shape_str(logits.shape[:2])} to match logits "
            f"{shape_str(logits.shape)}, got {shape_str(labels.shape)}"
        )
    label_smoothing = check_probability("label_smoothing", label_smoothing)
    return F.cross_entropy(
        logits.flatten(0, 1),  # (batch * tgt_len, vocab)
        labels.flatten(),  # (batch * tgt_len,)
        ignore_index=-100 if pad_id is None else pad_id,
        label_smoothing=label_smoothing,
    )


def inverse_sqrt_warmup(
    d_model: int, warmup_steps: int, factor: float = 1.0
) -> Callable[[int], float]:
    r"""The paper's schedule as a function of the step (for ``torch.optim.lr_scheduler.LambdaLR``
    with a base learning rate of 1):

    .. math:: \text{lr}(s) = \text{factor} \cdot d_\text{model}^{-1/2}
              \cdot \min(s^{-1/2},\; s \cdot \text{warmup}^{-3/2}),

    a linear warm-up for ``warmup_steps`` steps, then decay as :math:`1/\sqrt{s}`. Step ``0``
    (before the first update) is treated as step 1.
    """
    check_positive_int("d_model", d_model)
    check_positive_int("warmup_steps", warmup_steps)
    if not (isinstance(factor, (int, float)) and factor > 0 and math.isfinite(factor)):
        raise ValueError(f"factor must be a positive finite number, got {factor!r}")

    def lr_at(step: int) -> float:
        step = max(step, 1)
        return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    return lr_at


@dataclass
class StepStats:
    """What one training step measured."""

    loss: float  #: mean loss per non-padding target token
    tokens: int  #: non-padding target tokens in the batch
    grad_norm: float  #: gradient norm before clipping
    lr: float  #: learning rate used for this step


def train_step(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    pad_id: int | None = None,
    label_smoothing: float = 0.0,
    clip_norm: float | None = 1.0,
) -> StepStats:
    """One step of teacher-forced training of an encoder-decoder.

    Args:
        model: called as ``model(src, decoder_input)`` and returning logits
            ``(batch, tgt_len - 1, vocab)`` (e.g. :class:`companion.model.Transformer`).
        src: ``(batch, src_len)`` source ids.
        tgt: ``(batch, tgt_len)`` target ids including ``<bos>`` … ``<eos>``.
        optimizer, scheduler: the scheduler (if any) is stepped after the optimiser.
        pad_id: target padding id, ignored by the loss.
        label_smoothing: see :func:`sequence_loss`.
        clip_norm: maximum gradient norm, or ``None`` for no clipping.
    """
    model.train()
    decoder_input, labels = shift_targets(tgt)  # (batch, tgt_len - 1) each
    logits = model(src, decoder_input)  # (batch, tgt_len - 1, vocab)
    loss = sequence_loss(logits, labels, pad_id, label_smoothing)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"the loss is {loss.item()}: training diverged")
    lr = optimizer.param_groups[0]["lr"]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    max_norm = float("inf") if clip_norm is None else clip_norm
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    tokens = int(labels.numel() if pad_id is None else (labels != pad_id).sum())
    return StepStats(loss=loss.item(), tokens=tokens, grad_norm=float(grad_norm), lr=lr)


# ---------------------------------------------------------------------------------------------
# History
# ---------------------------------------------------------------------------------------------


@dataclass
class History:
    """What a training run measured, as parallel lists (plot ``history.loss`` against
    ``history.step``, ``history.val_loss`` against ``history.val_step``).

    Per step: ``step`` (1, 2, …), ``loss`` (mean label-smoothed loss per target token),
    ``lr``, ``tokens`` (non-padding target tokens of the whole batch), ``time`` (seconds of
    training so far). Per validation (after every epoch and when a run stops mid-epoch):
    ``val_step``, ``val_epoch`` (fractional when mid-epoch), ``val_loss`` (cross-entropy per
    target token, without label smoothing, so ``exp(val_loss)`` is the perplexity).
    """

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    val_step: list[int] = field(default_factory=list)
    val_epoch: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)

    def record_step(self, step: int, stats: StepStats, seconds: float) -> None:
        """Append one training step."""
        self.step.append(step)
        self.loss.append(stats.loss)
        self.lr.append(stats.lr)
        self.tokens.append(stats.tokens)
        self.time.append(seconds)

    def record_validation(self, step: int, epoch: float, loss: float) -> None:
        """Append one validation loss."""
        self.val_step.append(step)
        self.val_epoch.append(epoch)
        self.val_loss.append(loss)

    def tokens_per_second(self, last: int | None = None) -> float:
        """Target tokens per second of training, over all steps or the ``last`` ones."""
        if len(self.step) < 2:
            return 0.0
        first = 0 if last is None else max(0, len(self.step) - last)
        seconds = self.time[-1] - self.time[first]
        return sum(self.tokens[first + 1 :]) / seconds if seconds > 0 else 0.0

    def to_dict(self) -> dict[str, list]:
        """Plain lists (JSON- and ``weights_only``-safe)."""
        return {f.name: list(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> History:
        """Rebuild from :meth:`to_dict`'s output."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be History.to_dict()'s output, got {type(state).__name__}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: list(v) for k, v in state.items() if k in known})

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (atomically)."""
        return _write_json(path, self.to_dict())

    @classmethod
    def load_json(cls, path: str | os.PathLike[str]) -> History:
        """Read a file written by :meth:`save_json`."""
        return cls.from_dict(json.loads(Path(path).read_text()))


# ---------------------------------------------------------------------------------------------
# Atomic files, checkpoints
# ---------------------------------------------------------------------------------------------


def _write_json(path: str | os.PathLike[str], data: Any) -> Path:
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    return atomic_write(path, lambda file: file.write(text.encode("utf-8")))


#: Version of the checkpoint layout written by :func:`save_checkpoint`.
CHECKPOINT_FORMAT = 1
_CHECKPOINT_KEYS = ("format", "model", "model_config", "config")


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Save ``state`` (e.g. :meth:`Trainer.state_dict`) to ``path`` atomically.

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
        ValueError: the file is not a :mod:`companion.train` checkpoint.
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
            f"{path} is not a companion.train checkpoint: it lacks the key(s) {missing}"
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
    model = Transformer.from_config(TransformerConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval()


def _rng_state() -> dict[str, Any]:
    """The states of every random number generator training uses, as plain data."""
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


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = [s.cpu() for s in state["cuda"]]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


# ---------------------------------------------------------------------------------------------
# Distributed data parallel
# ---------------------------------------------------------------------------------------------


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _init_distributed(device: str | torch.device | None) -> tuple[torch.device, bool]:
    """Start the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``).

    Returns the device of this process and whether this call started the group (then
    :func:`train` also ends it). Backend: NCCL on GPUs, gloo on CPUs.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    started = False
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        started = True
    return device, started


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------


def _check_dataset(name: str, dataset: object) -> Dataset:
    if not (hasattr(dataset, "lengths") and hasattr(dataset, "__getitem__")):
        raise TypeError(
            f"{name} must be a dataset of (src_ids, tgt_ids) pairs with a .lengths property "
            f"(TranslationDataset, CopyReverseDataset), got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} must hold at least one example, got an empty dataset")
    return dataset


class Trainer:
    """Train an encoder-decoder on token-bucketed batches; checkpoint; resume exactly.

    Every step: a batch of at most ``config.max_tokens`` tokens from a
    :class:`~companion.data.TokenBatchSampler`, the label-smoothed loss, Adam
    (``β = (adam_beta1, adam_beta2)``, ``eps``) with the inverse-square-root warm-up
    (:func:`inverse_sqrt_warmup`), gradient clipping at ``config.clip_norm`` - that is,
    :func:`train_step`. After every epoch: the validation loss and (with ``out_dir``) a
    checkpoint ``out_dir/checkpoint.pt``.

    In a process group (``torchrun``) the model is wrapped in ``DistributedDataParallel``;
    every process builds the same global batches and takes every ``world_size``-th sentence of
    each. Each process weights its loss by its share of the batch's target tokens, so the
    gradient is exactly that of the whole batch's mean loss, as in a single process.

    Args:
        model: a :class:`~companion.model.Transformer` with ``tgt_pad_id`` set.
        config: the :class:`~companion.configs.TrainConfig` (optimiser, batches, budget).
        train_data, val_data: datasets of ``(src_ids, tgt_ids)`` with ``.lengths``.
        src_vocab, tgt_vocab, tokenizer: stored in checkpoints (to translate later).
        device: where to train; default the model's device.
        out_dir: folder for ``checkpoint.pt`` (``None``: no checkpoints).
        progress: show tqdm progress bars (first process only).

    Attributes:
        step, epoch, batch_index: optimiser steps done, epochs finished, batches done in the
            current epoch; elapsed: seconds of training so far.
        history: the :class:`History`.
    """

    def __init__(
        self,
        model: Transformer,
        config: TrainConfig,
        train_data: Dataset,
        val_data: Dataset | None = None,
        *,
        src_vocab: Vocab | None = None,
        tgt_vocab: Vocab | None = None,
        tokenizer: Tokenizer | None = None,
        device: str | torch.device | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
    ) -> None:
        if not isinstance(model, Transformer):
            raise TypeError(
                f"model must be a companion.model.Transformer, got {type(model).__name__}"
            )
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if model.config.tgt_pad_id is None:
            raise ValueError(
                "model must be built with tgt_pad_id (e.g. tgt_pad_id=PAD_ID) so that padding "
                "is ignored by the loss, got tgt_pad_id=None"
            )
        self.config = config
        self.train_data = _check_dataset("train_data", train_data)
        self.val_data = None if val_data is None else _check_dataset("val_data", val_data)
        self.src_vocab, self.tgt_vocab, self.tokenizer = src_vocab, tgt_vocab, tokenizer
        self.device = next(model.parameters()).device if device is None else torch.device(device)
        self.model = model.to(self.device)
        self.pad_id = model.config.tgt_pad_id
        self.rank, self.world_size = _rank_and_world()
        self.ddp: nn.Module | None = None
        if self.world_size > 1:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device] if self.device.type == "cuda" else None,
                broadcast_buffers=False,  # no running statistics to synchronise
            )
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=1.0,  # the schedule gives the actual learning rate
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
        )
        schedule = inverse_sqrt_warmup(config.d_model, config.warmup_steps, config.lr_factor)
        # LambdaLR counts from 0; update number n (1, 2, …) gets the paper's lr(n)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda done: schedule(done + 1)
        )
        self.sampler = TokenBatchSampler(
            self.train_data.lengths, config.max_tokens, shuffle=True, seed=config.seed
        )
        self.out_dir = None if out_dir is None else Path(out_dir)
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
        self.progress = progress and self.rank == 0
        self.step = self.epoch = self.batch_index = 0
        self.elapsed = 0.0
        self.history = History()
        #: Why the last :meth:`fit` stopped: ``"max_steps"``, ``"time_budget"``, ``"max_epochs"``.
        self.stop_reason: str | None = None

    # ------------------------------------------------------------------ batches

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """The global batches of ``epoch`` (identical in every process).

        With several processes, a batch with fewer sentences than processes is left out (every
        process must get at least one sentence)."""
        batches = self.sampler.batches(epoch)
        if self.world_size > 1:
            batches = [b for b in batches if len(b) >= self.world_size]
        return batches

    def _local_batch(self, indices: Sequence[int], dataset: Dataset) -> tuple[Tensor, Tensor]:
        """This process's share of a global batch, collated and moved to the device."""
        share = list(indices)[self.rank :: self.world_size]
        src, tgt = collate_batch([dataset[i] for i in share])  # (batch, src_len), (batch, tgt_len)
        return src.to(self.device), tgt.to(self.device)

    # ------------------------------------------------------------------ steps

    def train_step(self, src: Tensor, tgt: Tensor) -> StepStats:
        """One optimiser step on (this process's share of) a batch.

        ``src (batch, src_len)``, ``tgt (batch, tgt_len)`` with ``<bos>``/``<eos>``. In a
        single process this is :func:`train_step`; in a process group the loss of each process
        is weighted by its share of the global batch's target tokens before the gradients are
        averaged, and the reported loss and token count are those of the global batch.
        """
        config = self.config
        if self.ddp is None:
            return train_step(
                self.model,
                src,
                tgt,
                self.optimizer,
                self.scheduler,
                pad_id=self.pad_id,
                label_smoothing=config.label_smoothing,
                clip_norm=config.clip_norm,
            )
        self.ddp.train()
        decoder_input, labels = shift_targets(tgt)  # (batch, tgt_len - 1) each
        logits = self.ddp(src, decoder_input)  # (batch, tgt_len - 1, vocab)
        mean_loss = sequence_loss(logits, labels, self.pad_id, config.label_smoothing)
        local_tokens = (labels != self.pad_id).sum()  # ()
        totals = torch.stack([mean_loss.detach() * local_tokens, local_tokens.to(mean_loss.dtype)])
        dist.all_reduce(totals)  # (2,): summed over processes
        global_loss, global_tokens = totals[0] / totals[1], totals[1]
        if not torch.isfinite(global_loss):
            raise FloatingPointError(f"the loss is {global_loss.item()}: training diverged")
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over the processes: the weight world · local / global makes
        # the average the gradient of the global batch's mean loss
        weight = local_tokens * self.world_size / global_tokens
        (mean_loss * weight).backward()
        max_norm = float("inf") if config.clip_norm is None else config.clip_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.scheduler.step()
        return StepStats(
            loss=global_loss.item(), tokens=int(global_tokens), grad_norm=float(grad_norm), lr=lr
        )

    @torch.no_grad()
    def evaluate(self, dataset: Dataset | None = None) -> float:
        """Mean cross-entropy per target token (no label smoothing) on ``dataset``
        (default: the validation set), in evaluation mode. Shared between processes."""
        dataset = self.val_data if dataset is None else _check_dataset("dataset", dataset)
        if dataset is None:
            raise ValueError("evaluate needs a dataset: this Trainer has no val_data")
        sampler = TokenBatchSampler(
            dataset.lengths, 2 * self.config.max_tokens, shuffle=False, bucketing=True
        )
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # (loss sum, tokens)
        for indices in sampler.batches(0)[self.rank :: self.world_size]:
            src, tgt = collate_batch([dataset[i] for i in indices])
            src, tgt = src.to(self.device), tgt.to(self.device)
            decoder_input, labels = shift_targets(tgt)  # (batch, tgt_len - 1) each
            logits = self.model(src, decoder_input)  # (batch, tgt_len - 1, vocab)
            tokens = (labels != self.pad_id).sum()  # ()
            loss = sequence_loss(logits, labels, self.pad_id)  # ()
            total += torch.stack([loss.double() * tokens, tokens.double()])  # (2,)
        if self.world_size > 1:
            dist.all_reduce(total)
        self.model.train(was_training)
        return float(total[0] / total[1])

    # ------------------------------------------------------------------ the loop

    def _stop_reason(
        self,
        max_steps: int | None,
        time_budget: float | None,
        max_epochs: int | None,
        elapsed: float,
    ) -> str | None:
        """Why to stop before the next step (``None``: go on); agreed by all processes."""
        reason = 0
        if max_steps is not None and self.step >= max_steps:
            reason = 1
        elif max_epochs is not None and self.epoch >= max_epochs:
            reason = 2
        elif time_budget is not None and elapsed >= time_budget:
            reason = 3
        if self.world_size > 1:  # the clocks differ: stop when any process says so
            flag = torch.tensor([reason], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            reason = int(flag.item())
        return {0: None, 1: "max_steps", 2: "max_epochs", 3: "time_budget"}[reason]

    def fit(
        self,
        *,
        max_steps: int | None = None,
        time_budget: float | None = None,
        max_epochs: int | None = None,
    ) -> History:
        """Train until a limit is reached; returns the :attr:`history`.

        Each limit defaults to the configuration's (``config.max_steps``, ``time_budget``,
        ``max_epochs``) and counts from the start of the run: a resumed run continues the
        step count and the training time of its checkpoint. At least one limit must be set.
        After the last step the validation loss is computed (if the last epoch did not just
        end) and a checkpoint is saved (with ``out_dir``).
        """
        config = self.config
        max_steps = config.max_steps if max_steps is None else max_steps
        time_budget = config.time_budget if time_budget is None else time_budget
        max_epochs = config.max_epochs if max_epochs is None else max_epochs
        if max_steps is not None:
            check_positive_int("max_steps", max_steps)
        if max_epochs is not None:
            check_positive_int("max_epochs", max_epochs)
        if time_budget is not None:
            _check_seconds("time_budget", time_budget)
        if max_steps is None and time_budget is None and max_epochs is None:
            raise ValueError(
                "fit needs a limit: pass max_steps, time_budget or max_epochs (or set one in "
                "the config), got none"
            )
        from tqdm.auto import tqdm

        start, already = time.perf_counter(), self.elapsed

        def elapsed() -> float:
            return already + time.perf_counter() - start

        reason = None
        while reason is None:
            reason = self._stop_reason(max_steps, time_budget, max_epochs, elapsed())
            if reason is not None:
                break
            batches = self._epoch_batches(self.epoch)
            bar = tqdm(
                total=len(batches),
                initial=self.batch_index,
                desc=f"epoch {self.epoch + 1}",
                disable=not self.progress,
                unit="batch",
                dynamic_ncols=True,
                mininterval=0.5,
            )
            epoch_start, epoch_tokens, smoothed = time.perf_counter(), 0, None
            while self.batch_index < len(batches):
                reason = self._stop_reason(max_steps, time_budget, None, elapsed())
                if reason is not None:
                    break
                src, tgt = self._local_batch(batches[self.batch_index], self.train_data)
                stats = self.train_step(src, tgt)
                self.step += 1
                self.batch_index += 1
                self.history.record_step(self.step, stats, elapsed())
                epoch_tokens += stats.tokens
                smoothed = stats.loss if smoothed is None else 0.9 * smoothed + 0.1 * stats.loss
                rate = epoch_tokens / max(time.perf_counter() - epoch_start, 1e-9)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{smoothed:.3f}",
                    tok_s=f"{rate:,.0f}",
                    lr=f"{stats.lr:.2e}",
                    refresh=False,
                )
            bar.close()
            if reason is not None:
                break
            self.epoch += 1
            self.batch_index = 0
            if self.val_data is not None:
                self.history.record_validation(self.step, float(self.epoch), self.evaluate())
            self.elapsed = elapsed()
            if self.out_dir is not None:
                self.save_checkpoint()
        if self.val_data is not None and (
            not self.history.val_step or self.history.val_step[-1] != self.step
        ):
            batches = len(self._epoch_batches(self.epoch)) or 1
            position = self.epoch + self.batch_index / batches
            self.history.record_validation(self.step, position, self.evaluate())
        self.elapsed = elapsed()
        self.stop_reason = reason
        if self.out_dir is not None:
            self.save_checkpoint()
        return self.history

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly, as tensors and plain containers.

        In a process group this is a collective call (the random states of all processes are
        gathered), so every process must call it."""
        rng: Any = _rng_state()
        if self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, rng)
            rng = gathered
        return {
            "format": CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "model_config": asdict(self.model.config),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "progress": {
                "step": self.step,
                "epoch": self.epoch,
                "batch_index": self.batch_index,
                "elapsed": self.elapsed,
            },
            "rng": rng,
            "world_size": self.world_size,
            "config": self.config.to_dict(),
            "vocab": None
            if self.src_vocab is None or self.tgt_vocab is None
            else {"src": self.src_vocab.to_dict(), "tgt": self.tgt_vocab.to_dict()},
            "tokenizer": self.tokenizer.to_dict() if hasattr(self.tokenizer, "to_dict") else None,
            "history": self.history.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (from this or a fresh trainer of the same model)."""
        ours = asdict(self.model.config)
        if dict(state["model_config"]) != ours:
            diff = {
                k: (v, ours.get(k)) for k, v in state["model_config"].items() if ours.get(k) != v
            }
            raise ValueError(
                f"the checkpoint's model does not match this trainer's: (checkpoint, ours) = {diff}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        progress = state["progress"]
        self.step, self.epoch = int(progress["step"]), int(progress["epoch"])
        self.batch_index, self.elapsed = int(progress["batch_index"]), float(progress["elapsed"])
        self.history = History.from_dict(state["history"])
        rng = state["rng"]
        if isinstance(rng, list):  # saved by a process group: one state per process
            if len(rng) == self.world_size:
                _set_rng_state(rng[self.rank])
            else:  # another number of processes: a fresh but reproducible stream
                torch.manual_seed(self.config.seed + 1 + self.rank + 7919 * self.step)
        elif self.world_size == 1:
            _set_rng_state(rng)
        else:
            torch.manual_seed(self.config.seed + 1 + self.rank + 7919 * self.step)

    @property
    def checkpoint_path(self) -> Path | None:
        """``out_dir / "checkpoint.pt"``, or ``None`` without ``out_dir``."""
        return None if self.out_dir is None else self.out_dir / "checkpoint.pt"

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None) -> Path | None:
        """Save :meth:`state_dict` atomically (first process only; a collective call in a
        process group). Default path: :attr:`checkpoint_path`."""
        target = self.checkpoint_path if path is None else Path(path)
        if target is None:
            raise ValueError("save_checkpoint needs a path: this Trainer has no out_dir")
        state = self.state_dict()
        if self.rank == 0:
            save_checkpoint(state, target)
        return target

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None) -> None:
        """Load a checkpoint file into this trainer (see :meth:`load_state_dict`)."""
        target = self.checkpoint_path if path is None else Path(path)
        if target is None:
            raise ValueError("load_checkpoint needs a path: this Trainer has no out_dir")
        self.load_state_dict(load_checkpoint(target, map_location=self.device))


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value}")
    return float(value)


# ---------------------------------------------------------------------------------------------
# A whole run: data, model, training, evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class RunData:
    """Datasets and vocabularies of a run (:func:`prepare_data`).

    ``test_pairs`` holds the raw ``(source, reference)`` sentences of the test set for BLEU
    (Multi30k); it is empty for a toy task.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    src_vocab: Vocab
    tgt_vocab: Vocab
    tokenizer: Tokenizer
    test_pairs: list[tuple[str, str]]


def prepare_data(
    config: TrainConfig,
    data_root: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    progress: bool = True,
) -> RunData:
    """The datasets of ``config.task``: Multi30k (from ``data_root``, ``$MULTI30K_ROOT`` or
    the download cache) or a :class:`~companion.data.CopyReverseDataset` (train / validation
    / test drawn with seeds ``seed``, ``seed + 1``, ``seed + 2``)."""
    if config.task == "multi30k":
        data = prepare_multi30k(
            data_root,
            min_freq=config.min_freq,
            lowercase=config.lowercase,
            download=download,
            progress=progress,
        )
        return RunData(
            train=data.datasets["train"],
            val=data.datasets["val"],
            test=data.datasets["test_2016_flickr"],
            src_vocab=data.src_vocab,
            tgt_vocab=data.tgt_vocab,
            tokenizer=data.tokenizer,
            test_pairs=data.datasets["test_2016_flickr"].pairs,
        )
    sizes = {"train": config.toy_examples, "val": max(config.toy_examples // 10, 1)}
    sizes["test"] = sizes["val"]
    sets = {
        split: CopyReverseDataset(
            config.task,
            size,
            max_len=config.toy_max_len,
            num_symbols=config.toy_symbols,
            seed=config.seed + offset,
        )
        for offset, (split, size) in enumerate(sizes.items())
    }
    vocab = sets["train"].vocab
    return RunData(
        train=sets["train"],
        val=sets["val"],
        test=sets["test"],
        src_vocab=vocab,
        tgt_vocab=vocab,
        tokenizer=WordTokenizer(),
        test_pairs=[],
    )


def build_model(config: TrainConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
    """The :class:`~companion.model.Transformer` of ``config`` (padding id :data:`PAD_ID`)."""
    return Transformer(
        src_vocab_size,
        tgt_vocab_size,
        d_model=config.d_model,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        d_ff=config.d_ff,
        dropout=config.dropout,
        norm_first=config.norm_first,
        tie_embeddings=config.tie_embeddings,
        activation=config.activation,
        src_pad_id=PAD_ID,
        tgt_pad_id=PAD_ID,
    )


@dataclass
class TrainResult:
    """What :func:`train` returns: the trainer (with ``model`` and ``history``), the data and
    the final figures (also written to ``out_dir/results.json``)."""

    trainer: Trainer
    data: RunData
    results: dict[str, Any]

    @property
    def model(self) -> Transformer:
        return self.trainer.model

    @property
    def history(self) -> History:
        return self.trainer.history


def _final_evaluation(trainer: Trainer, data: RunData, out_dir: Path | None) -> dict[str, Any]:
    """Test-set figures of a finished run: BLEU for Multi30k, exact match for a toy task."""
    from companion.metrics import Translator, sequence_accuracy

    config = trainer.config
    start = time.perf_counter()
    if config.task != "multi30k":
        accuracy = sequence_accuracy(trainer.model, data.test)
        return {"test_accuracy": accuracy, "decode_seconds": time.perf_counter() - start}
    translator = Translator(
        trainer.model,
        data.tokenizer,
        data.src_vocab,
        data.tgt_vocab,
        beam_size=config.beam_size,
        length_penalty=config.length_penalty,
    )
    scores, translations = translator.evaluate(data.test_pairs)
    if out_dir is not None:
        text = "".join(line + "\n" for line in translations)
        atomic_write(out_dir / "test_translations.txt", lambda f: f.write(text.encode("utf-8")))
    return {
        "test_bleu": scores.bleu,
        "test_tokenized_bleu": scores.tokenized_bleu,
        "beam_size": config.beam_size,
        "decode_seconds": time.perf_counter() - start,
    }


def train(
    config: TrainConfig | str = "auto",
    out_dir: str | os.PathLike[str] | None = None,
    *,
    data_root: str | os.PathLike[str] | None = None,
    download: bool = True,
    time_budget: float | None = None,
    max_steps: int | None = None,
    max_epochs: int | None = None,
    resume: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
    evaluate: bool = True,
) -> TrainResult:
    """Train a Transformer as ``config`` says and score it on the test set.

    Args:
        config: a :class:`~companion.configs.TrainConfig` or a name (``"auto"``, ``"cpu"``,
            ``"gpu"``, ``"toy"``; see :mod:`companion.configs`).
        out_dir: folder for ``checkpoint.pt`` (after every epoch and at the end),
            ``history.json``, ``config.json``, ``results.json`` and, for Multi30k,
            ``test_translations.txt``. ``None`` writes nothing.
        data_root: folder with the Multi30k files (else ``$MULTI30K_ROOT`` or the cache).
        download: allow downloading Multi30k when no local copy is found.
        time_budget, max_steps, max_epochs: override the configuration's limits.
        resume: continue from ``out_dir/checkpoint.pt`` if it exists.
        device: default ``"cuda"`` when available, else ``"cpu"``.
        progress: progress bars.
        evaluate: score the test set at the end (BLEU, or exact match for a toy task).

    Returns:
        a :class:`TrainResult`; ``results`` holds the step count, training time, target
        tokens per second, the last validation loss and the test figures.

    Under ``torchrun`` (``WORLD_SIZE > 1``) it joins the process group (gloo on CPU, NCCL on
    GPU); only the first process writes files and evaluates the test set.
    """
    if isinstance(config, str):
        config = get_config(config)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig or a name, got {type(config).__name__}")
    changes = {"time_budget": time_budget, "max_steps": max_steps, "max_epochs": max_epochs}
    config = config.replace(**{k: v for k, v in changes.items() if v is not None})
    if config.time_budget is None and config.max_steps is None and config.max_epochs is None:
        raise ValueError("train needs a limit: time_budget, max_steps or max_epochs, got none")
    device, started_group = _init_distributed(device)
    rank, world = _rank_and_world()
    if device.type == "cuda":  # TensorFloat-32 matrix products: much faster, accurate enough
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = None if out_dir is None else Path(out_dir)
    try:
        if world > 1 and rank != 0:
            dist.barrier()  # the first process prepares (and maybe downloads) the data first
        data = prepare_data(config, data_root, download=download, progress=progress and rank == 0)
        if world > 1 and rank == 0:
            dist.barrier()
        torch.manual_seed(config.seed)  # the same initial weights in every process
        model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
        torch.manual_seed(config.seed + 1 + rank)  # dropout: a different stream per process
        random.seed(config.seed + rank)
        np.random.seed(config.seed + rank)
        trainer = Trainer(
            model,
            config,
            data.train,
            data.val,
            src_vocab=data.src_vocab,
            tgt_vocab=data.tgt_vocab,
            tokenizer=data.tokenizer,
            device=device,
            out_dir=out,
            progress=progress,
        )
        if resume and trainer.checkpoint_path is not None and trainer.checkpoint_path.is_file():
            trainer.load_checkpoint()
        if out is not None and rank == 0:
            _write_json(out / "config.json", config.to_dict())
        trainer.fit()
    finally:
        if started_group and dist.is_initialized():
            dist.destroy_process_group()
    history = trainer.history
    batches_per_epoch = max(len(trainer._epoch_batches(trainer.epoch)), 1)
    results: dict[str, Any] = {
        "config": config.name,
        "task": config.task,
        "world_size": world,
        "device": str(device),
        "stop_reason": trainer.stop_reason,
        "steps": trainer.step,
        "epochs": trainer.epoch + trainer.batch_index / batches_per_epoch,
        "train_seconds": trainer.elapsed,
        "target_tokens_per_second": history.tokens_per_second(),
        "val_loss": history.val_loss[-1] if history.val_loss else None,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
    }
    if rank == 0:
        if evaluate:
            results.update(_final_evaluation(trainer, data, out))
        if out is not None:
            history.save_json(out / "history.json")
            _write_json(out / "results.json", results)
    return TrainResult(trainer, data, results)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _parse_setting(text: str) -> tuple[str, Any]:
    """``"FIELD=VALUE"`` → ``(field, value)`` converted to the TrainConfig field's type."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects FIELD=VALUE, got {text!r}")
    name, raw = (part.strip() for part in text.split("=", 1))
    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    if name not in types:
        raise argparse.ArgumentTypeError(
            f"--set: unknown field {name!r}; the fields are {', '.join(sorted(types))}"
        )
    kind = types[name]
    if raw.lower() == "none" and "None" in kind:
        return name, None
    try:
        if kind.startswith("bool"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return name, raw.lower() in ("true", "1")
        if kind.startswith("int"):
            return name, int(raw)
        if kind.startswith("float"):
            return name, float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--set {name}: expected a value of type {kind}, got {raw!r}"
        ) from None
    return name, raw


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m companion.train``."""
    from companion.configs import CONFIG_NAMES

    parser = argparse.ArgumentParser(
        prog="python -m companion.train",
        description=(
            "Train the course's Transformer (Multi30k German->English, or a toy task) and\n"
            "write checkpoint.pt, history.json, config.json and results.json (test BLEU) into\n"
            "--out. Under 'torchrun --nproc_per_node=N' it trains with DistributedDataParallel."
        ),
        epilog=(
            "examples:\n"
            "  python -m companion.train --config cpu --out runs/cpu\n"
            "  python -m companion.train --config toy --out runs/toy --max-steps 300\n"
            "  torchrun --nproc_per_node=2 --standalone -m companion.train --config cpu "
            "--out runs/ddp"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        default="auto",
        choices=CONFIG_NAMES,
        help="named configuration; auto = gpu if CUDA is available, else cpu (default: auto)",
    )
    parser.add_argument("--out", required=True, help="output folder (checkpoint, history, results)")
    parser.add_argument(
        "--time-budget", type=_positive_float, help="seconds of training (overrides the config)"
    )
    parser.add_argument("--max-steps", type=_positive_int, help="optimiser steps at most")
    parser.add_argument("--max-epochs", type=_positive_int, help="epochs at most")
    parser.add_argument("--data-root", help="folder with the Multi30k .gz files")
    parser.add_argument(
        "--no-download", action="store_true", help="never download Multi30k (fail instead)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument(
        "--threads", type=_positive_int, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument("--beam-size", type=_positive_int, help="beam width for the test BLEU")
    parser.add_argument("--max-tokens", type=_positive_int, help="tokens per (global) batch")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=_parse_setting,
        metavar="FIELD=VALUE",
        help="change any TrainConfig field, e.g. --set dropout=0.2 (repeatable)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m companion.train``; returns the results dict."""
    parser = build_parser()
    args = parser.parse_args(argv)
    changes = dict(args.settings)
    for name, value in (
        ("beam_size", args.beam_size),
        ("max_tokens", args.max_tokens),
        ("seed", args.seed),
    ):
        if value is not None:
            changes[name] = value
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        config = get_config(args.config, **changes)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    result = train(
        config,
        args.out,
        data_root=args.data_root,
        download=not args.no_download,
        time_budget=args.time_budget,
        max_steps=args.max_steps,
        max_epochs=args.max_epochs,
        resume=args.resume,
        device=args.device,
        progress=not args.no_progress,
        evaluate=not args.no_eval,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.results, indent=1), file=sys.stdout, flush=True)
    return result.results


if __name__ == "__main__":
    main()
