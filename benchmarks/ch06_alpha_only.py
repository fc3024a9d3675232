"""Chapter 6's α-only control: does restoring the decoder's input reading end the Post-LN stall?

Section 6.5 finds two things wrong with Post-LN trained at 3e-3 without warm-up: the gradient
fades on its way down the decoder, and the decoder barely reads its input, which every norm on
the residual path dilutes. DeepNorm (section 6.7.4) trains, but it changes two things: it
multiplies the residual path by a constant α > 1 before each norm, and it scales some initial
weights down by β, which makes the first updates smaller. This script keeps only α: section 6.4's
stalled run (6 + 6-layer Post-LN, constant 3e-3, no warm-up, seeds 0-2, 100 steps, the same data,
batches, Adam and clipping, ``norm_study.train_run``) with every layer computing LN(α·x + F(x)),
DeepNorm's α (encoder 0.81·(N⁴M)^(1/16), decoder (3M)^(1/4)), and the usual initialisation. At
initialisation this model reads its input about as well as the 2 + 2-layer model (section 6.5's
bar chart); its first updates are as large as the stalled model's.

``--forward-only`` runs the second control (keys ``alpha-fwd|seed``): the same α in the forward
pass only. Each Post-LN residual computes LN(x + (α − 1)·stop_gradient(x) + F(x)): its value is
the α model's LN(α·x + F(x)), so the decoder reads its input exactly as well, but the gradient
along the residual path is not multiplied by α, so it is divided by the larger D at every norm and
fades as in the stalled run. Together with section 6.7.5's test 1 (gradient restored, input not)
this separates the lost input from the faded gradient. Both kinds of run also record the input
test (the logits' relative change when the decoder's input digits are shuffled, and their spread
across positions) at initialisation and after the last step.

Writes ``companion/results/ch06_alpha_only.json`` (per seed: the loss of every step, the
bottom/top decoder gradient ratio of every step, the logits' relative change made by each of the
first updates, and the mean D of the 18 decoder norms at every step), which the chapter loads and
asserts.

    .venv/bin/python benchmarks/ch06_alpha_only.py                   # seeds 0-2 (about 10 CPU-s each)
    .venv/bin/python benchmarks/ch06_alpha_only.py --forward-only    # seeds 0-2 (about 13 CPU-s each)
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import numpy as np
import torch
from notebook_code import head_commit

from companion import norm_study
from companion.exercises.ch06 import shuffled_digits
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


def forward_only_residual(self, x, sublayer, norm):  # noqa: ANN001, ANN201 - a layer's residual
    """LN(x + (α − 1)·x.detach() + F(x)): the value of LN(α·x + F(x)), the gradient of LN(x + F(x))."""
    scaled = x + (self.residual_scale - 1) * x.detach()
    return norm(scaled + self.residual_dropout(sublayer(x)))


def input_test(model: Transformer) -> list[float]:
    """Section 6.4's input test on the probe batch, in eval mode: the logits' relative change when
    the decoder's input digits are shuffled, and their relative spread across positions."""
    src, tgt_input, _, real = norm_study.probe_batch()
    shuffled = shuffled_digits(tgt_input, real)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits, logits_shuffled = model(src, tgt_input), model(src, shuffled)
    model.train(was_training)
    change = (logits - logits_shuffled)[real].norm() / logits[real].norm()
    centred = logits - logits.mean(-1, keepdim=True)
    sequence_mean = (centred * real[..., None]).sum(1, keepdim=True) / real.sum(1)[:, None, None]
    spread = (centred - sequence_mean)[real].norm() / centred[real].norm()
    return [float(f"{change.item():.4g}"), float(f"{spread.item():.4g}")]  # 4 significant digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--forward-only", action="store_true", help="α in the forward pass only (alpha-fwd arms)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = head_commit()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(
        {
            "about": "chapter 6 α-only control: 6 + 6-layer Post-LN with DeepNorm's α on the "
            "residuals (no β-scaled init), constant 3e-3, no warm-up; alpha-fwd arms: the same α "
            "in the forward pass only (the residual path's gradient is not scaled)",
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
        key = f"alpha-{'fwd' if args.forward_only else 'only'}|{seed}"
        start = time.perf_counter()
        model = alpha_only_model(seed, data.vocab_size)
        if args.forward_only:
            for stack in ("encoder", "decoder"):
                for layer in getattr(model, stack).layers:
                    layer.residual = types.MethodType(forward_only_residual, layer)
        extra = {"input_test_init": input_test(model)}  # forward passes only: no RNG drawn
        record = norm_study.train_run(model, data, LR, "constant", seed, steps=STEPS)
        extra["input_test_end"] = input_test(model)
        arms[key] = {
            "loss": [round(float(v), 6) for v in record["loss"]],
            "grad_ratio": [float(f"{v:.4g}") for v in record["grad_ratio"]],
            "delta_f": [round(float(v), 5) for v in record["delta_f"]],
            "adam_step": [round(float(v), 5) for v in record["adam_step"]],
            "norm_scale_mean": [round(float(v), 5) for v in record["norm_scale"].mean(1)],
            "seconds": round(time.perf_counter() - start, 1),
            "commit": commit,
            **extra,
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
