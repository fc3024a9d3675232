"""Chapter 2, section 2.5: the retrieval layer trained with a wide head, d_model = d_k (CPU, 1 thread).

The chapter trains its layer with d_model = 32, so at d_k = 64 and 1024 the queries and keys lie in
a 32-dimensional subspace of their d_k dimensions: its d_k = 1024 panel tests only what larger
unscaled scores do. Does the lag of the unscaled layer survive in a head as wide as its input?
The chapter's time budget leaves no room for it, so this script runs the **chapter's own code** (the task, loss
and training function of ``book/02_scaled_dot_product.ipynb``, cells ``ch02-train`` and ``ch02-train-loop``) with
d_model = d_k, for d_k = 64 and 256, scaled and unscaled, seeds 0, 1 and 2, 60 Adam steps at
learning rate 0.01 (the chapter's setting). It records the held-out loss every 5 steps (500
held-out queries, generator seed 100, as in the chapter). The chapter reads
``companion/results/ch02_wide_head.json``.

Usage: ``python benchmarks/ch02_wide_head.py`` (a few CPU-seconds; 3.1 when recorded).
"""

from __future__ import annotations

import math
import time

import torch
from ch02_long_horizon import ROOT, chapter_code
from notebook_code import write_record

OUT = ROOT / "companion" / "results" / "ch02_wide_head.json"
SEEDS = (0, 1, 2)
WIDTHS = (64, 256)  # d_model = d_k
SETTINGS = ("scaled", "unscaled")


def main() -> None:
    torch.set_num_threads(1)
    code = chapter_code()
    runs: dict[str, dict[str, dict[str, list[float]]]] = {}
    start = time.process_time()
    for width in WIDTHS:
        code["D_MODEL"] = width  # read by retrieval_batch and train_curve at call time
        code["held_out"] = code["retrieval_batch"](500, torch.Generator().manual_seed(100))
        runs[str(width)] = {}
        for setting in SETTINGS:
            runs[str(width)][setting] = {}
            for seed in SEEDS:
                curve = code["train_curve"](width, setting, seed)
                runs[str(width)][setting][str(seed)] = [float(f"{x:.6g}") for x in curve]
                print(
                    f"d_model = d_k = {width}, {setting}, seed {seed}: {curve[0]:.2f} -> {curve[-1]:.4f}"
                )
    record = {
        "task": "chapter 2's retrieval layer (section 2.5) with d_model = d_k, Adam lr 0.01, 60 steps",
        "metric": "held-out loss (500 queries): 0 perfect retrieval, 15 uniform weights",
        "steps": list(range(0, code["TRAIN_STEPS"] + 1, code["EVAL_EVERY"])),
        "held_out_loss": runs,
        "one_hot_loss": 2 * code["D_V"] * (1 - 1 / code["N_KEYS"]),
        "uniform_loss": code["D_V"] * (1 - 1 / code["N_KEYS"]),
        "sqrt_d_k": {str(w): math.sqrt(w) for w in WIDTHS},
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
