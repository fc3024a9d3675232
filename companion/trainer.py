"""The training loop of chapter 8: :class:`Trainer`.

A :class:`Trainer` runs epochs over token-bucketed batches (Adam + the inverse-square-root
warm-up, gradient clipping, dropout, label smoothing), every step being
:func:`companion.train.train_step`, with a progress bar (loss, target tokens per second,
learning rate) that works in a notebook and in a terminal. It stops at a time budget, a
number of steps or of epochs, computes the validation loss after every epoch, records a
:class:`~companion.history.History` and saves checkpoints
(:mod:`companion.checkpoint`) from which a run resumes exactly. In a process group
(``torchrun``) it trains with ``DistributedDataParallel`` (:mod:`companion.distributed`),
each process taking its share of every batch.

:func:`companion.run.train` builds the data, the model and a trainer from a configuration.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import Dataset

from companion._validation import check_positive_int
from companion.checkpoint import (
    CHECKPOINT_FORMAT,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from companion.configs import TrainConfig
from companion.data import TokenBatchSampler, Tokenizer, Vocab, collate_batch
from companion.distributed import rank_and_world, whole_batch_loss
from companion.history import History
from companion.model import Transformer, TransformerConfig
from companion.train import (
    StepStats,
    adam,
    autocast_dtype,
    compile_model,
    grad_scaler,
    inverse_sqrt_warmup,
    sequence_loss,
    shift_targets,
    train_step,
)

__all__ = ["Trainer"]


def _check_dataset(name: str, dataset: object) -> Dataset:
    if not (hasattr(dataset, "lengths") and hasattr(dataset, "__getitem__")):
        raise TypeError(
            f"{name} must be a dataset of (src_ids, tgt_ids) pairs with a .lengths property "
            f"(TranslationDataset, CopyReverseDataset), got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} must hold at least one example, got an empty dataset")
    return dataset


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value}")
    return float(value)


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
        self.rank, self.world_size = rank_and_world()
        self.ddp: nn.Module | None = None
        if self.world_size > 1:
            self.ddp = nn.parallel.DistributedDataParallel(
                module=self.model,
                device_ids=[self.device] if self.device.type == "cuda" else None,
                broadcast_buffers=False,  # no running statistics to synchronise
            )
        #: what a training step runs: the model, DDP's wrapper, or either compiled
        self.step_model = self.model if self.ddp is None else self.ddp
        if config.compile:
            self.step_model = compile_model(self.step_model)
        self.optimizer = adam(
            self.model.parameters(),
            lr=1.0,  # the schedule gives the actual learning rate
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
        )
        #: mixed precision (``config.precision``): the autocast type and, for fp16, a scaler
        self.amp_dtype = autocast_dtype(config.precision, self.device)
        self.scaler = grad_scaler(self.amp_dtype, self.device)
        schedule = inverse_sqrt_warmup(
            config.model.d_model, config.warmup_steps, config.lr_factor, ramp=config.warmup
        )
        # LambdaLR counts from 0; update number n (1, 2, …) gets the paper's lr(n)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda done: schedule(done + 1)
        )
        self.sampler = TokenBatchSampler(
            lengths=self.train_data.lengths,
            max_tokens=config.max_tokens,
            shuffle=True,
            seed=config.seed,
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

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The global batches of ``epoch`` (identical in every process).

        With several processes, a batch with fewer sentences than processes is left out (every
        process must get at least one sentence)."""
        batches = self.sampler.batches(epoch)
        if self.world_size > 1:
            batches = [b for b in batches if len(b) >= self.world_size]
        return batches

    @property
    def epochs_done(self) -> float:
        """Epochs done, the current one counted by its share of batches done (e.g. ``2.25``)."""
        batches = len(self.epoch_batches(self.epoch)) or 1
        return self.epoch + self.batch_index / batches

    def _local_batch(self, indices: Sequence[int], dataset: Dataset) -> tuple[Tensor, Tensor]:
        """This process's share of a global batch, collated and moved to the device."""
        share = list(indices)[self.rank :: self.world_size]
        src, tgt = collate_batch([dataset[i] for i in share])  # (batch, src_len), (batch, tgt_len)
        return src.to(self.device), tgt.to(self.device)

    # ------------------------------------------------------------------ steps

    def train_step(self, src: Tensor, tgt: Tensor) -> StepStats:
        """One optimiser step on (this process's share of) a batch: :func:`train_step`.

        ``src (batch, src_len)``, ``tgt (batch, tgt_len)`` with ``<bos>``/``<eos>``. In a
        process group the step runs the ``DistributedDataParallel`` model and
        :func:`~companion.distributed.whole_batch_loss` weights the loss of each process by
        its share of the batch's target tokens; the reported loss and token count are those
        of the whole batch.
        """
        return train_step(
            model=self.step_model,
            src=src,
            tgt=tgt,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            pad_id=self.pad_id,
            label_smoothing=self.config.label_smoothing,
            clip_norm=self.config.clip_norm,
            amp_dtype=self.amp_dtype,
            scaler=self.scaler,
            whole_batch=None if self.ddp is None else whole_batch_loss,
        )

    @torch.no_grad()
    def evaluate(self, dataset: Dataset | None = None) -> float:
        """Mean cross-entropy per target token (no label smoothing) on ``dataset``
        (default: the validation set), in evaluation mode. Shared between processes."""
        dataset = self.val_data if dataset is None else _check_dataset("dataset", dataset)
        if dataset is None:
            raise ValueError("evaluate needs a dataset: this Trainer has no val_data")
        sampler = TokenBatchSampler(
            lengths=dataset.lengths,
            max_tokens=2 * self.config.max_tokens,
            shuffle=False,
            bucketing=True,
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

    def _steps_planned(self, max_steps: int | None, max_epochs: int | None) -> int | None:
        """The step at which the run will stop, for the progress bar's ETA: ``max_steps`` or
        the end of epoch ``max_epochs`` (this epoch's batch count for every epoch left),
        whichever is first; ``None`` when only a time budget limits the run."""
        planned = [] if max_steps is None else [max_steps]
        if max_epochs is not None:
            per_epoch = len(self.epoch_batches(self.epoch))
            planned.append(self.step - self.batch_index + per_epoch * (max_epochs - self.epoch))
        return min(planned) if planned else None

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

        bar = tqdm(
            total=self._steps_planned(max_steps, max_epochs),  # None: a time budget only
            initial=self.step,
            desc="training",
            disable=not self.progress,
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5,
        )
        reason = None
        while reason is None:
            reason = self._stop_reason(
                max_steps=max_steps,
                time_budget=time_budget,
                max_epochs=max_epochs,
                elapsed=elapsed(),
            )
            if reason is not None:
                break
            batches = self.epoch_batches(self.epoch)
            epoch_start, epoch_tokens, smoothed = time.perf_counter(), 0, None
            while self.batch_index < len(batches):
                reason = self._stop_reason(
                    max_steps=max_steps, time_budget=time_budget, max_epochs=None, elapsed=elapsed()
                )
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
                postfix = {
                    "epoch": f"{self.epoch + self.batch_index / len(batches):.2f}",
                    "loss": f"{smoothed:.3f}",
                    "tok_s": f"{rate:,.0f}",
                    "lr": f"{stats.lr:.2e}",
                }
                if time_budget is not None:
                    postfix["left"] = f"{max(time_budget - elapsed(), 0):.0f}s"
                bar.set_postfix(postfix, refresh=False)
                bar.update(1)
            if reason is not None:
                break
            self.epoch += 1
            self.batch_index = 0
            if self.val_data is not None:
                self.history.record_validation(self.step, float(self.epoch), self.evaluate())
            self.elapsed = elapsed()
            if self.out_dir is not None:
                self.save_checkpoint()
        bar.close()
        if self.val_data is not None and (
            not self.history.val_step or self.history.val_step[-1] != self.step
        ):
            self.history.record_validation(self.step, self.epochs_done, self.evaluate())
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
        rng: Any = rng_state()
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
            **({} if self.scaler is None else {"scaler": self.scaler.state_dict()}),
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
        try:  # through the config class: fields added since the checkpoint take their defaults
            theirs = asdict(TransformerConfig(**state["model_config"]))
        except (TypeError, ValueError) as error:
            raise ValueError(f"the checkpoint's model_config cannot be rebuilt: {error}") from None
        if theirs != ours:
            diff = {k: (v, ours.get(k)) for k, v in theirs.items() if ours.get(k) != v}
            raise ValueError(
                f"the checkpoint's model does not match this trainer's: (checkpoint, ours) = {diff}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        progress = state["progress"]
        self.step, self.epoch = int(progress["step"]), int(progress["epoch"])
        self.batch_index, self.elapsed = int(progress["batch_index"]), float(progress["elapsed"])
        self.history = History.from_dict(state["history"])
        rng = state["rng"]
        if isinstance(rng, list):  # saved by a process group: one state per process
            if len(rng) == self.world_size:
                restore_rng_state(rng[self.rank])
            else:  # another number of processes: a fresh but reproducible stream
                torch.manual_seed(self.config.seed + 1 + self.rank + 7919 * self.step)
        elif self.world_size == 1:
            restore_rng_state(rng)
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
