"""Chapter 2, section 2.5: the retrieval layer trained for 200 steps instead of 60 (CPU, 1 thread).

The chapter trains at d_k = 64 and 1024 for 60 Adam steps; at d_k = 1024 the unscaled layer is
still far behind after 60 steps and still falling. Does the gap close later, as the lag at
d_k = 64 does? The chapter's time budget leaves no room for it, so this script runs the
**chapter's own code** (the task, loss and training function of
``book/02_scaled_dot_product.ipynb``, cells ``ch02-train`` and ``ch02-train-loop``) for 200 steps at d_k = 64 and 1024:
scaled (blue), unscaled (red), control 1 (green: unscaled, W_Q started divided by √d_k) and
control 3 (``slow_wq``: red's start, W_Q's learning rate divided by √d_k, the missing cell of the
2 × 2 of start and rate), seeds 0, 1 and 2, learning rate 0.01 (the chapter's setting). Its first
60 steps are the chapter's runs. It records the held-out loss every 10 steps (500 held-out
queries, generator seed 100, as in the chapter).

It also records a **trace** of the first 60 steps of blue, red and green, every step: on the
held-out queries, the median weight on the right (copied) key, the share of queries whose largest
weight is on the right key, and the standard deviation of the softmax inputs s̃ = λ q·k (all
500 × 16 of them). The trace replays ``train_curve``'s draws and steps; its held-out losses are
checked against ``train_curve``'s. The chapter reads ``companion/results/ch02_long_horizon.json``.

Usage: ``python benchmarks/ch02_long_horizon.py`` (about a minute of CPU time).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from notebook_code import chapter_code as run_chapter_cell
from notebook_code import write_record

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "book" / "02_scaled_dot_product.ipynb"
CELL_ID, LOOP_CELL_ID = "ch02-train", "ch02-train-loop"
OUT = ROOT / "companion" / "results" / "ch02_long_horizon.json"
SEEDS = (0, 1, 2)
D_KS = (64, 1024)
SETTINGS = ("scaled", "unscaled", "control", "slow_wq")
TRACE_SETTINGS, TRACE_STEPS = ("scaled", "unscaled", "control"), 60
STEPS, EVAL_EVERY = 200, 10
PRELUDE = """
import itertools
import math
import torch
from companion.attention import scaled_dot_product_attention
N_KEYS = 16
"""


def chapter_code() -> dict:
    """Execute the chapter's task and loss (cell ``ch02-train``) and its training function (cell
    ``ch02-train-loop``, up to the chapter's own runs); return their one namespace."""
    code = run_chapter_cell(NOTEBOOK, CELL_ID, "# the shortcut is attention", PRELUDE)
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    (loop,) = ["".join(c["source"]) for c in cells if c.get("id") == LOOP_CELL_ID]
    if "curves = {" not in loop:
        raise ValueError(
            f"cell {LOOP_CELL_ID} no longer contains 'curves = {{': update this script"
        )
    exec(compile(loop.split("curves = {")[0], f"{NOTEBOOK.name}:{LOOP_CELL_ID}", "exec"), code)  # noqa: S102
    return code


def run_setting(code: dict, d_k: int, setting: str, seed: int) -> list[float]:
    """``train_curve`` for blue, red or a control: section 2.7.3's controls are red (unscaled)
    with W_Q's start (control 1, ``control``) or its learning rate (control 3, ``slow_wq``)
    divided by √d_k."""
    factors = {"control": {"wq_start": d_k**-0.5}, "slow_wq": {"wq_lr": d_k**-0.5}}
    if setting in factors:
        return code["train_curve"](d_k, "unscaled", seed, **factors[setting])
    return code["train_curve"](d_k, setting, seed)


def trace_run(code: dict, d_k: int, setting: str, seed: int) -> dict[str, list[float]]:
    """Replay ``train_curve(d_k, setting, seed)`` for TRACE_STEPS steps, measuring every step."""
    gen = torch.Generator().manual_seed(seed)  # train_curve's draws, in its order
    query_proj = torch.randn(code["D_MODEL"], d_k, generator=gen) / math.sqrt(code["D_MODEL"])
    if setting.startswith("control"):
        query_proj = query_proj / math.sqrt(d_k)
    query_proj.requires_grad_()
    key_proj = (
        torch.randn(code["D_MODEL"], d_k, generator=gen) / math.sqrt(code["D_MODEL"])
    ).requires_grad_()
    optimizer = torch.optim.Adam([{"params": [query_proj]}, {"params": [key_proj]}], lr=0.01)
    scale = 1 / math.sqrt(d_k) if setting == "scaled" else 1.0
    x_query, x_keys, values, wanted = code["held_out"]
    target = (x_keys == x_query).all(-1).float().argmax(-1)  # (500,) the copied key
    rows = torch.arange(len(target))
    trace: dict[str, list[float]] = {
        "loss": [],
        "right_weight": [],
        "right_top": [],
        "score_std": [],
    }
    for step in range(TRACE_STEPS + 1):
        with torch.no_grad():
            soft_in = scale * (x_query @ (query_proj @ key_proj.T)) @ x_keys.transpose(-2, -1)
            alpha = torch.softmax(soft_in.squeeze(-2), dim=-1)  # (500, 16)
            trace["loss"].append(
                code["retrieval_loss"](query_proj, key_proj, scale, code["held_out"]).item()
            )
            trace["right_weight"].append(alpha[rows, target].median().item())
            trace["right_top"].append((alpha.argmax(-1) == target).float().mean().item())
            trace["score_std"].append(soft_in.std().item())
        if step < TRACE_STEPS:
            batch = code["retrieval_batch"](64, gen)
            loss = code["retrieval_loss"](query_proj, key_proj, scale, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {k: [float(f"{x:.6g}") for x in v] for k, v in trace.items()}


def main() -> None:
    torch.set_num_threads(1)
    code = chapter_code()
    code["TRAIN_STEPS"], code["EVAL_EVERY"] = STEPS, EVAL_EVERY  # read by train_curve at call time
    runs: dict[str, dict[str, dict[str, list[float]]]] = {}
    start = time.process_time()
    for d_k in D_KS:
        runs[str(d_k)] = {}
        for setting in SETTINGS:
            runs[str(d_k)][setting] = {}
            for seed in SEEDS:
                curve = run_setting(code, d_k, setting, seed)
                runs[str(d_k)][setting][str(seed)] = [float(f"{x:.6g}") for x in curve]
                print(f"d_k = {d_k}, {setting}, seed {seed}: {curve[0]:.2f} -> {curve[-1]:.4f}")
    traces: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {}
    for d_k in D_KS:
        traces[str(d_k)] = {}
        for setting in TRACE_SETTINGS:
            traces[str(d_k)][setting] = {}
            for seed in SEEDS:
                trace = trace_run(code, d_k, setting, seed)
                # the replay is train_curve's run: same held-out losses at its evaluation steps
                ours = trace["loss"][::EVAL_EVERY]
                theirs = runs[str(d_k)][setting][str(seed)][: len(ours)]
                assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(ours, theirs)), (
                    ours,
                    theirs,
                )
                traces[str(d_k)][setting][str(seed)] = trace
    record = {
        "task": "chapter 2's retrieval layer (section 2.5), d_model = 32, Adam lr 0.01, 200 steps",
        "metric": "held-out loss (500 queries): 0 perfect retrieval, 15 uniform weights",
        "settings": "scaled (blue), unscaled (red), control = control 1 (green: W_Q started ÷√d_k), "
        "slow_wq = control 3 (red's start, W_Q's learning rate ÷√d_k)",
        "steps": list(range(0, STEPS + 1, EVAL_EVERY)),
        "held_out_loss": runs,
        "trace": traces,
        "trace_metrics": "every step 0-60 on the held-out queries: loss; median weight on the right key; "
        "share of queries whose largest weight is on it; std of the softmax inputs λ q·k",
        "sqrt_d_k": {str(d): math.sqrt(d) for d in D_KS},
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
