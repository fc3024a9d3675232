"""Section 7.7's toy model, retrained from independent seeds (a different initialisation and data order).

``benchmarks/ch07_nudge_runs.py`` measures the spread of one training run under rounding-sized
nudges: its runs share one initialisation and one data order. This script measures the spread
across independent runs instead. For seed s it trains the same toy with ``set_seed(s)`` (the
initialisation) and a data loader shuffled by a generator seeded with s (the order of the same
training examples); the task, schedule, step budget and the 300 test sequences are the chapter's.
Seed 0 is the chapter's own run. For each seed it records, with and without the factor sqrt(d_model),
the same quantities as the nudge script: greedy exact match, the beam of 3 under both stopping
rules (with the factor) and the mean loss of the last 20 steps. It writes
``companion/results/ch07_seed_runs.json``, which the chapter reads, shows and asserts on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch07_seed_runs.py 1 2 3 4 5 6 7 8
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ch07_nudge_runs import describe, run  # noqa: E402

from companion.utils import set_threads  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch07_seed_runs.json"


def record_seeds(out: Path, setup: str, seeds: list[int], run_seed, describe_run) -> None:
    """Run ``run_seed(seed)`` for each seed on one thread and write the record to ``out`` after
    every seed (an interrupted run keeps its finished seeds)."""
    set_threads(limit=1)
    record = {
        "setup": setup,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "runs": {},
    }
    for seed in seeds:
        result = run_seed(seed)
        record["runs"][str(seed)] = result
        print(describe_run(seed, result), flush=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", out)


def main(seeds: list[int]) -> None:
    record_seeds(
        OUT,
        "section 7.7's toy, as in ch07_nudge_runs.json, unnudged; seed s: set_seed(s) before the "
        "model is built (initialisation) and the training loader shuffled by Generator().manual_seed(s) "
        "(data order); same training examples, schedule and 300 test sequences; s = 0 is the chapter's run",
        seeds,
        lambda seed: {**run(0, init_seed=seed), **run(0, factor=False, init_seed=seed)},
        lambda seed, result: describe(f"seed {seed}", result),
    )


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or list(range(1, 9)))
