"""Chapter 2, section 2.5: is the small Transformer's gap a learning-rate or clipping artefact? (CPU, 1 thread)

``ch02_transformer.py`` trains both arms at one learning rate (1e-3) with gradients clipped at
norm 1. This script reruns the unscaled arm (the 1/√d_k removed in all 6 attentions), same
model, task, seeds, batches and steps, at two other learning rates, 3e-4 and 3e-3 (clipped at
1, as before), and at 1e-3 without clipping. It also reruns both arms at 1e-3, clipped, to record
how often clipping acted: the share of steps whose gradient norm before clipping exceeded 1.
The chapter reads ``companion/results/ch02_transformer_rates.json``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch02_transformer_rates.py   # ~170 CPU-s
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ch02_transformer import (  # noqa: E402
    BATCH,
    EVAL_EVERY,
    SEEDS,
    STEPS,
    check_remove_scale,
    reverse_data,
    seeded_model,
    train_curve,
)
from notebook_code import write_record  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch02_transformer_rates.json"
# (arm, learning rate, clip norm or None), named as in the record
RUNS = {
    "scaled_lr1e-3_clip1": ("scaled", 1e-3, 1.0),
    "unscaled_lr1e-3_clip1": ("unscaled", 1e-3, 1.0),
    "unscaled_lr3e-4_clip1": ("unscaled", 3e-4, 1.0),
    "unscaled_lr3e-3_clip1": ("unscaled", 3e-3, 1.0),
    "unscaled_lr1e-3_noclip": ("unscaled", 1e-3, None),
}


def main() -> None:
    torch.set_num_threads(1)
    check_remove_scale()
    start = time.process_time()
    train, val_src, val_tgt = reverse_data()
    runs: dict[str, dict[str, dict[str, list[float] | float]]] = {name: {} for name in RUNS}
    for name, (arm, lr, clip) in RUNS.items():
        for seed in SEEDS:
            model = seeded_model(seed, train.vocab_size, arm)
            curve = train_curve(model, train, val_src, val_tgt, seed, lr, clip)
            runs[name][str(seed)] = curve
            print(
                f"{name} seed {seed}: tokens right {curve['token_accuracy'][-1]:.3f}, "
                f"norm > 1 on {curve['share_of_steps_norm_above_1']:.0%} of steps",
                flush=True,
            )
    record = {
        "task": "as ch02_transformer.json (reverse, digit strings of length 1-8, 500 held-out pairs)",
        "model": "as ch02_transformer.json (d_model 64, one head, 2+2 layers)",
        "runs": {name: {"arm": a, "lr": lr, "clip_norm": c} for name, (a, lr, c) in RUNS.items()},
        "training": f"Adam, batch {BATCH}, {STEPS} steps; seed s: set_seed(s) and "
        "Generator().manual_seed(s), as ch02_transformer.py",
        "metric": "held-out teacher-forced cross-entropy per token (loss), share of tokens right; "
        "share_of_steps_norm_above_1: steps whose gradient norm before clipping exceeded 1",
        "steps": list(range(0, STEPS + 1, EVAL_EVERY)),
        "held_out": runs,
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
