"""What the course's own machine measured for chapter 8's translator, so that a run can be
compared with a recorded run after the **same number of steps**.

The numbers live in ``companion/results/translator.json``, written by
``benchmarks/translator_runs.py --write-reference`` from its runs (nothing in it is typed by
hand). For each training configuration it holds one run scored after several step counts
(validation loss, test BLEU with greedy decoding and with beam search) and the same scores for
several seeds at the chapter's step budget::

    reference = load_reference("cpu")
    reference.at(600, "val_loss")          # what seed 0 measured after 600 steps
    reference.seed_spread("val_loss")      # the standard deviation over the seeds there
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

from companion._validation import check_instance, check_positive_int

__all__ = ["ReferenceRun", "load_reference", "reference_configs"]

_FILE = "translator.json"


@dataclass(frozen=True)
class ReferenceRun:
    """One configuration's recorded runs.

    Attributes:
        config: the training configuration's name (``"cpu"``).
        changes: the changes to it the runs used (``{}``: the configuration as it is).
        steps: the step counts the seed-0 run was scored at, increasing.
        values: ``{score: one value per entry of steps}`` (``val_loss``, ``val_bleu_greedy``,
            ``test_bleu_greedy``, ``test_bleu_beam4``, ...).
        seed_steps: the step count of the seed table (the chapter's budget).
        seeds: ``{score: one value per seed}`` at ``seed_steps``.
        machine: the CPU, torch version and thread count that measured it; ``date``: when.
        ablation: ``{variant: {"changes": ..., "seeds": [...], score: [one per seed]}}``, the
            variants of the configuration trained for ``seed_steps`` steps with three seeds or
            more (the warm-up ablation of chapter 8), scored on the validation set.
    """

    config: str
    changes: dict[str, Any]
    steps: tuple[int, ...]
    values: dict[str, tuple[float, ...]]
    seed_steps: int
    seeds: dict[str, tuple[float, ...]]
    machine: str
    date: str
    ablation: dict[str, dict[str, Any]]

    def at(self, steps: int, score: str) -> float | None:
        """The recorded ``score`` after ``steps`` steps: interpolated linearly between the
        recorded step counts, the last one's beyond them, ``None`` below the first (no
        reference there)."""
        check_positive_int("steps", steps)
        if score not in self.values:
            raise KeyError(f"score must be one of {sorted(self.values)}, got {score!r}")
        if steps < self.steps[0]:
            return None
        points = list(zip(self.steps, self.values[score]))
        for (s0, v0), (s1, v1) in zip(points, points[1:]):
            if s0 <= steps <= s1:
                return v0 + (v1 - v0) * (steps - s0) / (s1 - s0)
        return points[-1][1]

    def seed_mean(self, score: str) -> float:
        """The mean of ``score`` over the seeds at :attr:`seed_steps`."""
        return statistics.mean(self._seed_values(score))

    def seed_spread(self, score: str) -> float:
        """The sample standard deviation of ``score`` over the seeds at :attr:`seed_steps`."""
        return statistics.stdev(self._seed_values(score))

    def _seed_values(self, score: str) -> tuple[float, ...]:
        if score not in self.seeds:
            raise KeyError(f"score must be one of {sorted(self.seeds)}, got {score!r}")
        return self.seeds[score]


def _read() -> dict[str, Any]:
    text = resources.files("companion").joinpath("results", _FILE).read_text(encoding="utf-8")
    return json.loads(text)


def reference_configs() -> tuple[str, ...]:
    """The configurations that have a recorded reference."""
    return tuple(sorted(_read()))


def load_reference(config: str = "cpu") -> ReferenceRun | None:
    """The recorded runs of the configuration named ``config``, or ``None`` when it has none
    (the ``gpu`` configuration until a GPU run is recorded)."""
    check_instance("config", config, str, "a configuration name such as 'cpu'")
    entry = _read().get(config)
    if entry is None:
        return None
    return ReferenceRun(
        config=config,
        changes=dict(entry["changes"]),
        steps=tuple(int(s) for s in entry["steps"]),
        values={k: tuple(float(x) for x in v) for k, v in entry["values"].items()},
        seed_steps=int(entry["seed_steps"]),
        seeds={k: tuple(float(x) for x in v) for k, v in entry["seeds"].items()},
        machine=str(entry["machine"]),
        date=str(entry["date"]),
        ablation={name: dict(values) for name, values in entry.get("ablation", {}).items()},
    )
