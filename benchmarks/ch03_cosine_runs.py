"""Chapter 3, section 3.5: one head on the four-neighbours task with a decaying learning rate (CPU, 1 thread).

``benchmarks/ch03_long_runs.py`` trains one head for 8,000 steps at the chapter's constant
learning rate (1e-2) and finds it still below four heads. Does a decaying learning rate close
the gap? This script runs the **chapter's own code** (cell ids ``ch03-neighbours-example`` and
``ch03-neighbours``, through ``ch03_long_runs.chapter_code``) for seeds 0, 1 and 2: one head for
8,000 steps, Adam with the learning rate decaying from 1e-2 to 0 along a cosine
(``CosineAnnealingLR``, one scheduler step per training step). It records the share of test
tokens whose four neighbours are all named right (the chapter's 2,000 test sequences, generator
seed 9) at every 1,000 steps. The chapter reads ``companion/results/ch03_cosine_runs.json``.

Usage: ``python benchmarks/ch03_cosine_runs.py`` (about 1 CPU-minute).
"""

from __future__ import annotations

import time

import torch
from ch03_long_runs import ROOT, SEEDS, all_four_right_scorer, chapter_code, train_curve
from notebook_code import write_record

OUT = ROOT / "companion" / "results" / "ch03_cosine_runs.json"
LAST_STEP = 8000
EVAL_STEPS = list(range(1000, LAST_STEP + 1, 1000))


def main() -> None:
    torch.set_num_threads(1)
    code = chapter_code()
    all_four_right = all_four_right_scorer(code)

    runs: dict[str, list[float]] = {}
    start = time.process_time()
    for seed in SEEDS:
        # the chapter's train_neighbours loop (one head), with a cosine-decayed learning rate
        curve = train_curve(code, 1, seed, LAST_STEP, EVAL_STEPS, all_four_right, cosine=True)
        runs[str(seed)] = curve
        print(f"one head, seed {seed}: all four right {curve[-1]:.3f} at {LAST_STEP}")
    record = {
        "task": "chapter 3's four-neighbours task (section 3.5), d_model 16, one head, Adam lr 1e-2"
        " decaying to 0 along a cosine over 8,000 steps",
        "metric": "share of 2,000 test sequences' tokens with all four neighbours named right",
        "steps": EVAL_STEPS,
        "all_four_right": runs,
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
