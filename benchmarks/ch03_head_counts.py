"""Chapter 3, section 3.7: the head-count sweep's test accuracy for three seeds (CPU, 1 thread).

The chapter trains the counting task for ``h = 1, 2, 4, 8, 16`` at ``d_model = 32``; the build
cannot afford the full runs. This script runs the **chapter's own code** (the training cell of
``book/03_multi_head_attention.ipynb``, cell id ``b88fb933``, up to the sweep) for seeds 0, 1
and 2, all 1,200 steps, and writes every run's test-accuracy curve (every ``EVAL_EVERY`` steps)
to ``companion/results/ch03_head_counts.json``. The chapter reruns the first 200 steps of seed
0 for every ``h``, checks them against the recording, and shows the recorded curves, step-200
accuracies and end points (means and spread over the three seeds).

Usage: ``python benchmarks/ch03_head_counts.py [--seeds 0 1 2]`` (about 4 CPU-minutes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from notebook_code import chapter_code as run_chapter_cell
from notebook_code import write_record

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "book" / "03_multi_head_attention.ipynb"
CELL_ID = "b88fb933"
OUT = ROOT / "companion" / "results" / "ch03_head_counts.json"
HEAD_COUNTS = (1, 2, 4, 8, 16)
PRELUDE = """
import math, statistics
import numpy as np
import torch
from torch import nn
from companion.attention import MultiHeadAttention
from companion.utils import count_parameters, set_seed
"""


def chapter_code() -> dict:
    """Execute the chapter's task, model and training function; return their namespace."""
    return run_chapter_cell(NOTEBOOK, CELL_ID, "HEAD_COUNTS = (1, 2, 4, 8, 16)", PRELUDE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    code = chapter_code()
    runs: dict[str, dict[str, list[float]]] = {}
    steps: list[int] = []
    start = time.process_time()
    for seed in args.seeds:
        runs[str(seed)] = {}
        for h in HEAD_COUNTS:
            _, curve = code["train_counter"](h, seed)
            runs[str(seed)][str(h)] = [round(a, 4) for a in curve["test accuracy"]]
            steps = curve["step"]
            print(f"seed {seed}, h = {h:2d}: final test accuracy {curve['test accuracy'][-1]:.3f}")
    record = {
        "task": "chapter 3's counting task (section 3.7), d_model 32, 1,200 steps, cosine decay",
        "head_counts": list(HEAD_COUNTS),
        "steps": steps,
        "test_accuracy": runs,
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
