"""Chapter 2, section 2.5: the retrieval toy with a soft target, whose best weights are not one-hot (CPU, 1 thread).

Section 2.5's task rewards a sharp softmax: its best weights are one-hot on the copied key. Does
the unscaled layer's lag come from that? This script runs the **chapter's own training code**
(cell ``ch02-train`` of ``book/02_scaled_dot_product.ipynb``: ``train_curve``, Adam at 0.01, 60
steps, batches of 64, 500 held-out queries, seeds 0, 1, 2, d_k = 64 and 1024) on another task.
The query is a fresh random token (not a copy of a key), and the wanted output is a fixed
*teacher* attention's output: ``softmax(x_q M xᵀ) v`` with ``M`` a fixed random
d_model × d_model matrix whose scores have standard deviation ``TEACHER_STD``. The best
weights are the teacher's, spread over several keys, and ``W_Q W_Kᵀ`` can represent them
exactly (``W_Q W_Kᵀ = M`` scaled by √d_k or not). Only the task changes: ``retrieval_batch`` and
``held_out`` are replaced in the chapter code's namespace, which ``train_curve`` reads at call
time. It records the held-out loss every 5 steps, the uniform-weight loss, and the mean largest
weight of the teacher and of both layers at step 0. The chapter reads
``companion/results/ch02_soft_target.json``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch02_soft_target.py   # ~10 CPU-s
"""

from __future__ import annotations

import math
import time

import torch
from ch02_long_horizon import ROOT, chapter_code
from notebook_code import write_record

OUT = ROOT / "companion" / "results" / "ch02_soft_target.json"
SEEDS, D_KS, SETTINGS = (0, 1, 2), (64, 1024), ("scaled", "unscaled")
TEACHER_STD = 1.5  # the teacher's scores: standard deviation 1.5, weights far from one-hot


def main() -> None:
    torch.set_num_threads(1)
    code = chapter_code()
    d_model, d_v, n_keys = code["D_MODEL"], code["D_V"], code["N_KEYS"]
    teacher = (
        TEACHER_STD
        * torch.randn(d_model, d_model, generator=torch.Generator().manual_seed(1000))
        / d_model
    )

    def teacher_weights(x_query: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x_query @ teacher @ x.transpose(-2, -1), dim=-1)  # (batch, 1, n_keys)

    def soft_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """The query's token (batch, 1, d_model), the keys' tokens (batch, n_keys, d_model), the
        values (batch, n_keys, d_v) and the teacher's output (batch, d_v)."""
        x = torch.randn(batch, n_keys, d_model, generator=gen)
        values = torch.randn(batch, n_keys, d_v, generator=gen)
        x_query = torch.randn(batch, 1, d_model, generator=gen)
        wanted = (teacher_weights(x_query, x) @ values).squeeze(-2)  # (batch, d_v)
        return x_query, x, values, wanted

    start = time.process_time()
    held_out = soft_batch(500, torch.Generator().manual_seed(100))
    code["retrieval_batch"], code["held_out"] = soft_batch, held_out  # train_curve reads these
    x_query, x, values, wanted = held_out
    teacher_top = teacher_weights(x_query, x).max(-1).values.mean().item()
    uniform = ((values.mean(-2) - wanted) ** 2).sum(-1).mean().item()
    step0_top: dict[str, dict[str, float]] = {}
    for d_k in D_KS:
        for setting in SETTINGS:  # step-0 weights: train_curve's first draws of W_Q, W_K
            tops = []
            for seed in SEEDS:
                gen = torch.Generator().manual_seed(seed)
                w_q = torch.randn(d_model, d_k, generator=gen) / math.sqrt(d_model)
                w_k = torch.randn(d_model, d_k, generator=gen) / math.sqrt(d_model)
                lam = 1 / math.sqrt(d_k) if setting == "scaled" else 1.0
                scores = lam * (x_query @ w_q) @ (x @ w_k).transpose(-2, -1)  # (500, 1, n_keys)
                tops.append(torch.softmax(scores, -1).max(-1).values.mean().item())
            step0_top.setdefault(str(d_k), {})[setting] = round(sum(tops) / len(tops), 4)
    runs: dict[str, dict[str, dict[str, list[float]]]] = {}
    for d_k in D_KS:
        for setting in SETTINGS:
            for seed in SEEDS:
                curve = code["train_curve"](d_k, setting, seed)
                runs.setdefault(str(d_k), {}).setdefault(setting, {})[str(seed)] = [
                    float(f"{v:.6g}") for v in curve
                ]
            ends = [runs[str(d_k)][setting][str(s)][-1] for s in SEEDS]
            print(f"d_k {d_k} {setting}: start {runs[str(d_k)][setting]['0'][0]:.3f}, ends {ends}")
    print(
        f"teacher's mean largest weight {teacher_top:.3f}, uniform loss {uniform:.3f}, step 0 {step0_top}"
    )
    record = {
        "task": f"soft target: wanted = softmax(x_q M x^T) v, M fixed random ({d_model} x {d_model}, "
        f"scores of std {TEACHER_STD}); {n_keys} keys, d_v {d_v}; the query is a fresh random token",
        "training": "chapter 2's train_curve (cell ch02-train): Adam lr 0.01, 60 steps, batch 64, "
        "W_Q, W_K fan-in initialised (q, k entries of variance 1)",
        "seeds": list(SEEDS),
        "metric": "held-out loss (500 queries, squared error of the output), every 5 steps",
        "steps": list(range(0, code["TRAIN_STEPS"] + 1, code["EVAL_EVERY"])),
        "teacher_mean_top_weight": round(teacher_top, 4),
        "uniform_loss": round(uniform, 4),
        "step0_mean_top_weight": step0_top,
        "held_out_loss": runs,
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
