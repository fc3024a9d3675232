"""Chapter 6's grid: {Post-LN, Pre-LN} x {constant, warm-up, decay} x peak learning rates.

Chapter 6 trains a 6 + 6-layer Transformer on the reversal task at one peak learning rate
(3e-3), where "warm-up" and "a lower learning rate" are confounded. This script trains
every arm of the grid with the chapter's setup (same model, data, batch order, Adam and
schedule; 200 steps, the length of the chapter's longest run) so that the two can be told
apart, and writes ``companion/results/ch06_grid.json`` after every run (it can be stopped
at any time; a re-run skips the arms already recorded).

Rates: 1.5e-3, 3e-3 and 6e-3 for both placements; Post-LN also at 1.875e-4, 3.75e-4 and
7.5e-4, and Pre-LN at 7.5e-4, so that each placement's best rate lies inside the grid (each
schedule is then compared at its own best rate).

Schedules: ``norm_study.lr_schedule``'s "constant", "warm-up" and "decay" ("decay" is the
warm-up's schedule without its ramp: the peak rate from the first step to step ``WARMUP``,
then the same 1/sqrt(step) decay). Warm-up and decay differ only in the first ``WARMUP``
steps, so comparing them isolates the ramp.

Warm-up length: every "warm-up" arm ramps for ``WARMUP`` (60) steps; Post-LN at the chapter's
rate also ramps for 20 and 120 steps (``WARMUP_LENGTHS``; keys end in ``|w20`` and ``|w120``).

    .venv/bin/python benchmarks/ch06_grid.py                      # the whole grid
    .venv/bin/python benchmarks/ch06_grid.py --seeds 0 1 --time   # time one arm first
    .venv/bin/python benchmarks/ch06_grid.py --schedules decay    # only some arms
    .venv/bin/python benchmarks/ch06_grid.py --long               # the longer runs

Longer runs (``--long``): Post-LN and Pre-LN at the chapter's constant rate, Post-LN with
warm-up to it, and Post-LN at its best constant rate (3.75e-4) and with warm-up to its best
peak rate (7.5e-4), and (added later) decay only at its best rate (3.75e-4), seed 0, for
``LONG_STEPS`` (1,000) steps on ``norm_study.train_data(LONG_STEPS)``, 1,000 new batches (not
the grid's 200: its batches differ from the first step on); keys end in ``|s1000``. They ask
whether the stalled run plateaus or escapes, and whether warm-up beats a lower constant rate
once its ramp is a small part of training; the decay-only arm asks whether the warm-up
schedule's decay, rather than its ramp, explains the difference.

The chapter reads the JSON, plots it, asserts the conclusions it draws from it, and re-runs
one arm to check that the file matches the code.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from notebook_code import head_commit

from companion import norm_study
from companion.data import CopyReverseDataset
from companion.norm_study import BATCH, STEPS, WARMUP
from companion.utils import set_seed

# the chapter's setup (section 6.4), from companion.norm_study
LAYERS, MAIN_LR = 6, 3e-3
LEARNING_RATES = (1.5e-3, 3e-3, 6e-3)  # half, once and twice the chapter's peak rate
POST_LN_LOW_RATES = (1.875e-4, 3.75e-4, 7.5e-4)  # Post-LN only: 1/16, 1/8 and 1/4 of it
PRE_LN_LOW_RATES = (7.5e-4,)  # Pre-LN only: 1/4 of it, below Pre-LN's best rate
WARMUP_LENGTHS = (20, 120)  # Post-LN, warm-up to MAIN_LR: ramps shorter and longer than WARMUP
LONG_STEPS = 1000  # the longer runs: MAIN_LR, seed 0
# (placement, schedule, peak rate): the chapter's rate, then Post-LN's best constant rate and best
# warm-up rate of the grid (lowest mean loss at step 200 over seeds 0-2)
LONG_ARMS = (
    ("Post-LN", "constant", MAIN_LR),
    ("Pre-LN", "constant", MAIN_LR),
    ("Post-LN", "warm-up", MAIN_LR),
    ("Post-LN", "constant", 3.75e-4),
    ("Post-LN", "warm-up", 7.5e-4),
    # added later: decay only (the warm-up's 1/sqrt(step) decay without its ramp) at Post-LN's best
    # decay-only rate of the grid, so that the 1,000-step comparison has a decaying schedule
    # without a ramp
    ("Post-LN", "decay", 3.75e-4),
)
PLACEMENTS = ("Post-LN", "Pre-LN")
SCHEDULES = norm_study.SCHEDULES
OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch06_grid.json"


def train_arm(
    placement: str,
    schedule: str,
    peak_lr: float,
    seed: int,
    steps: int = STEPS,
    data: CopyReverseDataset | None = None,
    warmup: int = WARMUP,
) -> np.ndarray:
    """One arm of the grid, exactly as the chapter trains (``norm_study.train_run``):
    returns the loss of every step."""
    data = norm_study.train_data() if data is None else data
    set_seed(seed)
    model = norm_study.build_model(LAYERS, placement == "Pre-LN", data.vocab_size)
    return norm_study.train_run(model, data, peak_lr, schedule, seed, steps, warmup=warmup)["loss"]


def arm_key(
    placement: str,
    schedule: str,
    peak_lr: float,
    seed: int,
    warmup: int = WARMUP,
    steps: int = STEPS,
) -> str:
    suffix = ("" if warmup == WARMUP else f"|w{warmup}") + ("" if steps == STEPS else f"|s{steps}")
    return f"{placement}|{schedule}|{peak_lr:g}|{seed}{suffix}"


def run_long(result: dict, out: Path, commit: str) -> None:
    """The longer runs (``LONG_ARMS``, seed 0, ``LONG_STEPS`` steps)."""
    data = norm_study.train_data(LONG_STEPS)
    result["long_steps"] = LONG_STEPS
    arms = result.setdefault("arms", {})
    for placement, schedule, peak_lr in LONG_ARMS:
        key = arm_key(placement, schedule, peak_lr, 0, steps=LONG_STEPS)
        if key in arms:
            continue
        start = time.perf_counter()
        losses = train_arm(placement, schedule, peak_lr, 0, steps=LONG_STEPS, data=data)
        arms[key] = {
            "loss": [round(float(v), 6) for v in losses],
            "seconds": round(time.perf_counter() - start, 1),
            "commit": commit,
        }
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(
            f"{key}: loss at step 200 {losses[175:200].mean():.3f}, {LONG_STEPS} "
            f"{losses[-25:].mean():.3f} ({arms[key]['seconds']} s)",
            flush=True,
        )


def default_arms(placement: str, schedule: str) -> list[tuple[float, int]]:
    """(peak rate, warm-up length) of every arm of one placement and schedule."""
    low = POST_LN_LOW_RATES if placement == "Post-LN" else PRE_LN_LOW_RATES
    arms = [(peak_lr, WARMUP) for peak_lr in (*low, *LEARNING_RATES)]
    if placement == "Post-LN" and schedule == "warm-up":
        arms += [(MAIN_LR, warmup) for warmup in WARMUP_LENGTHS]
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--time", action="store_true", help="time one arm and stop")
    parser.add_argument("--long", action="store_true", help="only the longer runs (LONG_ARMS)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS))
    parser.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        help="default: LEARNING_RATES, plus POST_LN_LOW_RATES or PRE_LN_LOW_RATES, plus WARMUP_LENGTHS",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = norm_study.train_data()
    if args.time:
        start = time.perf_counter()
        train_arm("Post-LN", "warm-up", MAIN_LR, 0, data=data)
        print(f"one arm of {STEPS} steps: {time.perf_counter() - start:.1f} s")
        return
    commit = head_commit()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(
        {
            "about": "chapter 6 grid: 6 + 6-layer Transformer, reversal task, loss (nats/token) of every step",
            # the commit of the first arms; each newer arm names its own
            "commit": result.get("commit", commit),
            "torch": torch.__version__,
            "threads": 1,
            "steps": STEPS,
            "batch": BATCH,
            "warmup": WARMUP,
            "learning_rates": list(LEARNING_RATES),
            "post_ln_low_learning_rates": list(POST_LN_LOW_RATES),
            "pre_ln_low_learning_rates": list(PRE_LN_LOW_RATES),
            "warmup_lengths": list(WARMUP_LENGTHS),
            "placements": list(PLACEMENTS),
            "schedules": list(SCHEDULES),
            "seeds": sorted(set(result.get("seeds", [])) | set(args.seeds)),
        }
    )
    if args.long:
        run_long(result, args.out, commit)
        return
    arms = result.setdefault("arms", {})
    for seed in args.seeds:  # seed by seed, so that a stopped grid still has whole seeds
        for placement in args.placements:
            for schedule in args.schedules:
                arms_wanted = (
                    [(peak_lr, WARMUP) for peak_lr in args.lrs]
                    if args.lrs
                    else default_arms(placement, schedule)
                )
                for peak_lr, warmup in arms_wanted:
                    key = arm_key(placement, schedule, peak_lr, seed, warmup)
                    if key in arms:
                        continue
                    start = time.perf_counter()
                    losses = train_arm(placement, schedule, peak_lr, seed, data=data, warmup=warmup)
                    arms[key] = {
                        "loss": [round(float(v), 6) for v in losses],
                        "seconds": round(time.perf_counter() - start, 1),
                        "commit": commit,
                    }
                    args.out.write_text(json.dumps(result, indent=1) + "\n")
                    print(
                        f"{key}: loss at step 100 {losses[75:100].mean():.3f}, "
                        f"200 {losses[175:200].mean():.3f} ({arms[key]['seconds']} s)",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
