"""Section 9.6's length-extrapolation runs, repeated over seeds.

The chapter trains four small causal stacks (sinusoidal, learned, RoPE and ALiBi positions) on
16 tokens and tests them on 64, for one seed live. Which of its findings hold in every seed,
and how far does RoPE fall by 4n_train? This script runs the chapter's own code for several
seeds and writes ``companion/results/ch09_extrapolation_seeds.json``:

* ``lag2``: every scheme on the chapter's task (y_i = x_(i-2)), at most 600 steps, and a
  control with no position code at all (``none``: only the causal mask tells positions apart),
  for fewer seeds;
* ``lag8``: the control (y_i = x_(i-8)), RoPE and ALiBi, at most 400 steps;
* ``lag8_long``: ALiBi on the control with 1,500 steps, to see whether 400 steps were too few;
* ``lag2_fixed``: sinusoidal, learned and RoPE on the chapter's task for exactly 600 steps (no
  early stop), the budget ALiBi uses in every seed: a control for the unequal step counts;
* ``lag8_lr`` and ``lag2_lr``: ALiBi at other learning rates than the chapter's 2e-3 (Adam), on
  the control and on the chapter's task, with the same step caps: is its slow or partial learning
  a matter of the one rate tried?

The training code is not copied: the script reads the notebook, takes the cell that defines
``train_and_test`` (everything before its ``SEEDS =`` line) and executes it. The JSON is written
after every run, and a re-run skips the runs already recorded.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch09_extrapolation_seeds.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch09_extrapolation_seeds.py --seeds 0 1

The chapter reads the JSON, shows the spread over seeds and asserts the claims it makes from it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from companion.masking import causal_mask
from companion.model import Encoder, TokenEmbedding, TransformerConfig
from companion.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from companion.utils import set_seed, set_threads

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "book" / "09_after_2017.ipynb"
CELL_ID = "d759d417"  # section 9.6's training cell
OUT = ROOT / "companion" / "results" / "ch09_extrapolation_seeds.json"
LONG_STEPS = 1500  # the lag-8 control's ALiBi run without the 400-step cap
OTHER_LRS = (1e-3, 5e-3, 1e-2)  # ALiBi's learning-rate control; the chapter trains at 2e-3


def chapter_code() -> dict:
    """Execute the definitions of section 9.6's training cell; return its namespace."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = "".join(next(c for c in cells if c.get("id") == CELL_ID)["source"])
    definitions = source.split("\nSEEDS =")[0]
    assert "def train_and_test" in definitions, (
        "section 9.6's cell no longer defines train_and_test"
    )
    namespace = {
        "torch": torch, "F": F, "nn": nn, "set_seed": set_seed, "causal_mask": causal_mask,
        "Encoder": Encoder, "TokenEmbedding": TokenEmbedding, "TransformerConfig": TransformerConfig,
        "LearnedPositionalEmbedding": LearnedPositionalEmbedding,
        "SinusoidalPositionalEncoding": SinusoidalPositionalEncoding,
    }  # fmt: skip
    exec(compile(definitions, f"{NOTEBOOK.name}:{CELL_ID}", "exec"), namespace)
    return namespace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(6)))
    parser.add_argument("--long-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--none-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr-seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    set_threads(limit=1)
    code = chapter_code()
    train_and_test = code["train_and_test"]
    if OUT.exists():
        results = json.loads(OUT.read_text())
    else:
        results = {
            "about": "section 9.6's runs over seeds (benchmarks/ch09_extrapolation_seeds.py): "
            "per run the steps taken and the accuracy at each of the 64 test positions",
            "train_len": code["TRAIN_LEN"],
            "test_len": code["TEST_LEN"],
            "lag": code["LAG"],
            "far_lag": code["FAR_LAG"],
            "long_steps": LONG_STEPS,
            "lag2": {},
            "lag8": {},
            "lag8_long": {},
        }
    results.setdefault("lag2_fixed", {})
    results.setdefault("lag8_lr", {})
    results.setdefault("lag2_lr", {})
    results["machine"] = f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    # (group, kind, seed, max_steps, lag, target[, lr]): a target above 1 is never met, so no
    # early stop; the run's key in its group is the kind, or "alibi, lr 0.005" for another rate
    plan = [
        ("lag2", kind, seed, 600, code["LAG"], 0.95)
        for seed in args.seeds
        for kind in code["EXTRAPOLATION_KINDS"]
    ]
    plan += [("lag2", "none", seed, 600, code["LAG"], 0.95) for seed in args.none_seeds]
    plan += [
        ("lag8", kind, seed, 400, code["FAR_LAG"], 0.95)
        for seed in args.seeds
        for kind in ("rope", "alibi")
    ]
    plan += [
        ("lag8_long", "alibi", seed, LONG_STEPS, code["FAR_LAG"], 0.95) for seed in args.long_seeds
    ]
    plan += [
        ("lag2_fixed", kind, seed, 600, code["LAG"], 2.0)
        for seed in args.seeds
        for kind in ("sinusoidal", "learned", "rope")
    ]
    plan += [
        (group, "alibi", seed, max_steps, lag, 0.95, lr)
        for group, max_steps, lag in (
            ("lag8_lr", 400, code["FAR_LAG"]),
            ("lag2_lr", 600, code["LAG"]),
        )
        for lr in OTHER_LRS
        for seed in args.lr_seeds
    ]
    for group, kind, seed, max_steps, lag, target, *lr in plan:
        key = f"{kind}, lr {lr[0]:g}" if lr else kind
        runs = results[group].setdefault(key, {})
        if str(seed) in runs:
            continue
        start = time.perf_counter()
        options = {"lr": lr[0]} if lr else {}
        steps, accuracy = train_and_test(
            kind, seed, max_steps=max_steps, lag=lag, target=target, **options
        )
        runs[str(seed)] = {"steps": steps, "accuracy": [round(float(a), 4) for a in accuracy]}
        OUT.write_text(json.dumps(results, indent=1) + "\n")
        print(
            f"{group:9} {key:16} seed {seed}: {steps} steps, {time.perf_counter() - start:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
