"""What a training run measured (chapter 8): :class:`History`, the loss, learning rate,
tokens and time of every step and the validation loss of every epoch, as parallel lists for
the chapter's plots. :class:`~companion.trainer.Trainer` records it, checkpoints store it
(:meth:`History.to_dict`) and :func:`companion.run.train` writes it to ``history.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from companion.checkpoint import write_json
from companion.train import StepStats

__all__ = ["History"]


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
        missing = sorted(known - set(state))
        if missing:
            raise ValueError(
                f"state must be History.to_dict()'s output, it lacks the key(s) {missing}"
            )
        if not all(isinstance(state[k], (list, tuple)) for k in known):
            raise TypeError("state must be History.to_dict()'s output: a dict of lists")
        return cls(**{k: list(v) for k, v in state.items() if k in known})

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (atomically)."""
        return write_json(path, self.to_dict())

    @classmethod
    def load_json(cls, path: str | os.PathLike[str]) -> History:
        """Read a file written by :meth:`save_json`.

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: the file is empty, truncated, not JSON or not a history (the message
                names the path).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no history file at {path}")
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as error:  # JSONDecodeError and UnicodeError included
            raise ValueError(
                f"{path} is not a history written by History.save_json ({error}); it may be "
                "truncated or damaged: the checkpoint of the run holds the same history"
            ) from None
