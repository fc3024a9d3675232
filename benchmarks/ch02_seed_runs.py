"""Chapter 2, section 2.7.4: which layer ends lower at d_k = 64 after 200 steps? (CPU, 1 thread)

The chapter's 16 stacked initialisations (cell ``ch02-train-long``) share one stream of
batches, and section 2.5's three seeds continued to step 200 (``ch02_long_horizon.py``) end
the other way round in median. This script settles the question with independent runs: it
executes the **chapter's own code** (cell ``ch02-train``: the task, loss and ``train_curve``)
for 200 steps at d_k = 64, scaled (blue), unscaled (red) and control 1 (green: unscaled, W_Q
started divided by √d_k), seeds 0-31. ``train_curve(d_k,
setting, seed)`` draws W_Q, W_K and every batch from ``Generator().manual_seed(seed)``, so
each seed is its own initialisation and its own batch stream; blue and red of one seed share
both (a paired comparison), and so does green. Seeds 0-2 are section 2.5's runs. It records the held-out loss
(500 queries, as in the chapter) every 20 steps. The chapter reads
``companion/results/ch02_seed_runs.json``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch02_seed_runs.py   # ~30 CPU-s
"""

from __future__ import annotations

import time

import torch
from ch02_long_horizon import ROOT, chapter_code, run_setting
from notebook_code import write_record

OUT = ROOT / "companion" / "results" / "ch02_seed_runs.json"
SEEDS = range(32)
D_K, STEPS, EVAL_EVERY = 64, 200, 20


def main() -> None:
    torch.set_num_threads(1)
    code = chapter_code()
    code["TRAIN_STEPS"], code["EVAL_EVERY"] = STEPS, EVAL_EVERY  # read by train_curve at call time
    start = time.process_time()
    runs: dict[str, dict[str, list[float]]] = {"scaled": {}, "unscaled": {}, "control": {}}
    for seed in SEEDS:
        for setting in runs:
            curve = run_setting(code, D_K, setting, seed)
            runs[setting][str(seed)] = [float(f"{x:.6g}") for x in curve]
        ends = [runs[setting][str(seed)][-1] for setting in runs]
        print(f"seed {seed}: blue {ends[0]:.4f}, red {ends[1]:.4f}, green {ends[2]:.4f}")
    record = {
        "task": "chapter 2's retrieval layer (section 2.5), d_model = 32, d_k = 64, Adam lr 0.01, 200 steps",
        "metric": "held-out loss (500 queries): 0 perfect retrieval, 15 uniform weights",
        "seeds": "train_curve's seed: W_Q, W_K and every batch from Generator().manual_seed(seed); "
        "blue, red and green of one seed share them; seeds 0-2 are section 2.5's runs",
        "settings": "scaled (blue), unscaled (red), control = control 1 (green: unscaled, W_Q started ÷√d_k)",
        "steps": list(range(0, STEPS + 1, EVAL_EVERY)),
        "held_out_loss": runs,
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
