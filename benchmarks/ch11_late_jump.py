"""Section 11.4's late jump of the leaking loss: a control run.

The chapter trains the model with the mask off by one for 400 steps (initial weights and batches
from seed 0, Adam at a constant 3e-3) and marks the highest loss after the loss first fell below
0.1. On the machine that recorded this file the loss jumped back above 1 late in that run. This
script keeps the same initial weights (``clinic.build("mask off by one")``, seed 0) and changes
one thing at a time: the order of the training batches (``train_toy``'s data seed) or the
learning rate. It records, per run, the first step whose 10-step mean loss is below 0.1 and the
highest loss from 20 steps after it to step 400 (the chapter's definitions). It writes
``companion/results/ch11_late_jump.json``, which the chapter reads, shows and asserts on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch11_late_jump.py

Another CPU rounds sums differently and can move or remove such a jump: the record says what
happened on one machine, not what must happen on every one.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from companion import clinic
from companion.utils import set_threads

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch11_late_jump.json"
STEPS, LEVEL, WINDOW, AFTER = 400, 0.1, 10, 20
RUNS = [
    (3e-3, 0),
    (3e-3, 1),
    (3e-3, 2),
    (3e-3, 3),
    (3e-3, 4),
    (1e-3, 0),
]  # (learning rate, data seed)


def first_step_below(curve: list[float], level: float = LEVEL, window: int = WINDOW) -> int:
    """The chapter's definition: the first step (from 1) whose last-``window`` mean loss is
    below ``level``; ``len(curve) + 1`` if none."""
    steps = range(window, len(curve) + 1)
    return next((s for s in steps if sum(curve[s - window : s]) < level * window), len(curve) + 1)


def run(lr: float, data_seed: int) -> dict[str, float]:
    """One 400-step run of the leaking model from seed 0's initial weights."""
    model = clinic.build("mask off by one", seed=0)
    curve = clinic.train_toy(model, STEPS, lr=lr, seed=data_seed)
    low = first_step_below(curve)
    late = range(low + AFTER, len(curve) + 1)  # steps counted from 1
    peak = max(late, key=lambda s: curve[s - 1])
    return {
        "lr": lr,
        "data_seed": data_seed,
        "first_step_below": low,
        "peak_step": peak,
        "peak_loss": curve[peak - 1],
    }


def main() -> None:
    set_threads(limit=1)
    record = {
        "setup": f'clinic.build("mask off by one", seed=0), clinic.train_toy(model, {STEPS}, lr=lr, '
        f"seed=data_seed): the first step whose {WINDOW}-step mean loss is below {LEVEL}, and the "
        f"highest loss from {AFTER} steps after it to step {STEPS}",
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "runs": [],
    }
    for lr, data_seed in RUNS:
        start = time.perf_counter()
        r = run(lr, data_seed)
        record["runs"].append(r)
        print(
            f"lr {lr:g}, data seed {data_seed}: below {LEVEL} at step {r['first_step_below']}, "
            f"then at most {r['peak_loss']:.3f} (step {r['peak_step']}) ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
