"""Chapter 6's α-only control: does restoring the decoder's input reading end the Post-LN stall?

Section 6.4 finds two things wrong with Post-LN trained at 3e-3 without warm-up: the gradient
fades on its way down the decoder, and the decoder barely reads its input, which every norm on
the residual path dilutes. DeepNorm (section 6.6.4) trains, but it changes two things: it
multiplies the residual path by a constant α > 1 before each norm, and it scales some initial
weights down by β, which makes the first updates smaller. This script keeps only α: section 6.4's
stalled run (6 + 6-layer Post-LN, constant 3e-3, no warm-up, seeds 0-2, 100 steps, the same data,
batches, Adam and clipping, ``norm_study.train_run``) with every layer computing LN(α·x + F(x)),
DeepNorm's α (encoder 0.81·(N⁴M)^(1/16), decoder (3M)^(1/4)), and the usual initialisation. At
initialisation this model reads its input about as well as the 2 + 2-layer model (section 6.4's
bar chart); its first updates are as large as the stalled model's.

Writes ``companion/results/ch06_alpha_only.json`` (per seed: the loss of every step, the
bottom/top decoder gradient ratio of every step, the logits' relative change made by each of the
first updates, and the mean D of the 18 decoder norms at every step), which the chapter loads and
asserts.

    .venv/bin/python benchmarks/ch06_alpha_only.py            # seeds 0-2 (about 10 CPU-s each)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from companion import norm_study
from companion.model import Transformer
from companion.utils import set_seed

LAYERS, LR, STEPS = 6, 3e-3, 100  # section 6.4's stalled run
ALPHA = {
    "encoder": 0.81 * (LAYERS**4 * LAYERS) ** (1 / 16),
    "decoder": (3 * LAYERS) ** (1 / 4),
}  # DeepNorm's α for N = M = 6
OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch06_alpha_only.json"


def alpha_only_model(seed: int, vocab_size: int) -> Transformer:
    """Section 6.4's Post-LN model, built as the chapter builds it for ``seed``, with DeepNorm's
    α on every residual path (LN(α·x + F(x))) and nothing else changed."""
    set_seed(seed)
    model = norm_study.build_model(LAYERS, norm_first=False, vocab_size=vocab_size)
    for stack in ("encoder", "decoder"):
        for layer in getattr(model, stack).layers:
            layer.residual_scale = ALPHA[stack]
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(
        {
            "about": "chapter 6 α-only control: 6 + 6-layer Post-LN with DeepNorm's α on the "
            "residuals (no β-scaled init), constant 3e-3, no warm-up",
            "torch": torch.__version__,
            "threads": 1,
            "steps": STEPS,
            "lr": LR,
            "alpha": ALPHA,
        }
    )
    data = norm_study.train_data()
    arms = result.setdefault("arms", {})
    for seed in args.seeds:
        key = f"alpha-only|{seed}"
        start = time.perf_counter()
        model = alpha_only_model(seed, data.vocab_size)
        record = norm_study.train_run(model, data, LR, "constant", seed, steps=STEPS)
        arms[key] = {
            "loss": [round(float(v), 6) for v in record["loss"]],
            "grad_ratio": [float(f"{v:.4g}") for v in record["grad_ratio"]],
            "delta_f": [round(float(v), 5) for v in record["delta_f"]],
            "adam_step": [round(float(v), 5) for v in record["adam_step"]],
            "norm_scale_mean": [round(float(v), 5) for v in record["norm_scale"].mean(1)],
            "seconds": round(time.perf_counter() - start, 1),
            "commit": commit,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        loss = np.array(arms[key]["loss"])
        print(
            f"{key}: loss at step 100 {loss[75:100].mean():.3f}, grad ratio (median, steps 21-100) "
            f"{np.median(record['grad_ratio'][20:]):.2e} ({arms[key]['seconds']} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
