"""Chapter 6's causal test: does the fading gradient cause the Post-LN stall?

Section 6.5 shows a chain in Post-LN without warm-up: full-size first updates make the decoder
norms' inputs grow, so their divisor D grows, so the gradient that passes back through 15 or
more norms fades. That the gradient fades does not show that the fading causes the stall. This
script intervenes on the last link only. It trains section 6.4's stalled run (6 + 6-layer
Post-LN, constant 3e-3, seeds 0-2, 100 steps, same data, batches, Adam and clipping) with each
of the 18 decoder LayerNorms replaced by one whose forward pass is unchanged, but whose
backward pass is altered:

* ``"rescaled"``: the exact gradient of the norm, multiplied by D / D0, where D0 is the norm's D
  at step 0 (the mean over the first batch's target tokens, one number per norm). The gradient
  is then divided by D0, not by the current D: the fading by a growing D is removed, and nothing
  else changes.
* ``"frozen"``: the gradient is divided by D0, and D is treated as a constant, so the term of the
  exact gradient that projects out the direction of the normalised input is dropped too.
* ``"detached"``: the gradient is divided by the current D, as usual, but D is treated as a
  constant (no projection term). The fading stays.

"rescaled" and "frozen" each have a control (``"rescaled-warmup"``, ``"frozen-warmup"``) that
trains the same altered model with section 6.4's warm-up: it checks that the altered gradient can train this model at
all. If "rescaled" stalls while its control trains, the fading is not what stalls the model.
Each arm also records section 6.4's input test after its last step (``input_test_end``: the
logits' relative change when the decoder's input digits are shuffled, and their spread across
positions; ``ch06_alpha_only.input_test``). Writes ``companion/results/ch06_frozen_norm.json``,
which the chapter loads, plots and asserts.

    .venv/bin/python benchmarks/ch06_frozen_norm.py            # every arm, seeds 0-2
    .venv/bin/python benchmarks/ch06_frozen_norm.py --arms rescaled --seeds 0
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from ch06_alpha_only import input_test
from notebook_code import head_commit
from torch import Tensor, nn

from companion import norm_study
from companion.data import collate_batch
from companion.model import Transformer
from companion.utils import set_seed

LAYERS, LR, STEPS = 6, 3e-3, 100  # section 6.4's stalled run: Post-LN, constant 3e-3
MODES = ("rescaled", "frozen", "detached")
ARMS = {  # name → (backward mode, schedule)
    "rescaled": ("rescaled", "constant"),
    "rescaled-warmup": ("rescaled", "warm-up"),  # control: does the altered gradient train at all?
    "frozen": ("frozen", "constant"),
    "detached": ("detached", "constant"),
    "frozen-warmup": ("frozen", "warm-up"),
}
OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch06_frozen_norm.json"


class AlteredBackwardNorm(nn.Module):
    """A LayerNorm with the same forward pass as ``norm`` (same parameters) and an altered
    backward pass (``mode``: ``"frozen"`` or ``"detached"``, see the module docstring)."""

    def __init__(self, norm: nn.LayerNorm, mode: str) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        self.norm, self.mode, self.eps = norm, mode, norm.eps
        self.d0: float | None = None  # "frozen": D at step 0, set by the first forward pass

    def forward(self, x: Tensor) -> Tensor:  # (..., d_model) → same
        z = x - x.mean(dim=-1, keepdim=True)
        d = torch.sqrt(z.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        if self.mode == "rescaled":  # the exact gradient of the norm, times D / D0
            if self.d0 is None:
                raise RuntimeError("rescaled: D0 is set by alter()")
            factor = (d / self.d0).detach()  # (..., 1)
            return self.norm(x * factor + (x - x * factor).detach())  # value x, gradient × factor
        if self.mode == "detached":
            x_hat = z / d.detach()
        else:
            if self.d0 is None:
                raise RuntimeError("frozen: D0 is set by alter()")
            x_hat = z / self.d0 + (z / d - z / self.d0).detach()  # value z / D, gradient 1 / D0
        return x_hat * self.norm.weight + self.norm.bias


def decoder_norms(model: Transformer) -> list[tuple[nn.Module, str]]:
    """(layer, attribute) of the decoder's 18 norms, bottom to top."""
    names = ("self_attention_norm", "cross_attention_norm", "feed_forward_norm")
    return [(layer, name) for layer in model.decoder.layers for name in names]


def alter(model: Transformer, mode: str, first_batch: tuple[Tensor, Tensor]) -> list[float]:
    """Replace the decoder norms in place; for ``"frozen"``, set each D0 from the first batch
    (mean over its target tokens). Returns the D0 of each norm (the step-0 D either way)."""
    wrappers = []
    for layer, name in decoder_norms(model):
        wrapper = AlteredBackwardNorm(getattr(layer, name), mode)
        setattr(layer, name, wrapper)
        wrappers.append(wrapper)
    src, tgt = first_batch
    real = tgt[:, :-1] != norm_study.PAD_ID  # (batch, tgt_len - 1)
    d0 = []

    def record(module: AlteredBackwardNorm, inputs: tuple[Tensor]) -> None:
        var = inputs[0].var(dim=-1, correction=0)[real]  # as train_run's norm_scale
        d0.append(float(torch.sqrt(var + module.eps).mean()))

    for w in wrappers:  # the forward pass is the same in both modes: measure D with "detached"
        w.mode = "detached"
    handles = [w.register_forward_pre_hook(record) for w in wrappers]
    with torch.no_grad():
        model.eval()(src, tgt[:, :-1])
    for handle in handles:
        handle.remove()
    for w, value in zip(wrappers, d0):
        w.mode, w.d0 = mode, value if mode in ("frozen", "rescaled") else None
    return d0


def check_forward(model: Transformer, first_batch: tuple[Tensor, Tensor]) -> None:
    """The altered norms' forward pass matches nn.LayerNorm's (same logits)."""
    src, tgt = first_batch
    with torch.no_grad():
        altered = model.eval()(src, tgt[:, :-1])
        for layer, name in decoder_norms(model):
            setattr(layer, name, getattr(layer, name).norm)
        plain = model(src, tgt[:, :-1])
    gap = (altered - plain).abs().max().item()
    if gap > 1e-4:
        raise AssertionError(
            f"expected the altered norms to leave the logits unchanged, max gap {gap}"
        )


def run_arm(arm: str, seed: int, data) -> dict:
    mode, schedule = ARMS[arm]
    set_seed(seed)
    model = norm_study.build_model(LAYERS, False, data.vocab_size)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=norm_study.BATCH,
        shuffle=True,
        collate_fn=collate_batch,
        generator=torch.Generator().manual_seed(seed),
    )
    first_batch = next(iter(loader))  # train_run's first batch (same generator seed)
    with torch.random.fork_rng():
        check = norm_study.build_model(LAYERS, False, data.vocab_size)
        check.load_state_dict(model.state_dict())
        alter(check, mode, first_batch)
        check_forward(check, first_batch)
    d0 = alter(model, mode, first_batch)
    record = norm_study.train_run(model, data, LR, schedule, seed, STEPS)
    input_test_end = input_test(model)  # forward passes only, after the last step
    return {
        "input_test_end": input_test_end,
        "loss": [round(float(v), 6) for v in record["loss"]],
        "grad_ratio": [float(f"{v:.4e}") for v in record["grad_ratio"]],
        "norm_scale_mean": [round(float(v), 5) for v in record["norm_scale"].mean(1)],
        "d0": [round(v, 5) for v in d0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = head_commit()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(
        {
            "about": "chapter 6 causal test: 6 + 6-layer Post-LN, constant 3e-3, decoder norms' backward altered",
            "torch": torch.__version__,
            "threads": 1,
            "steps": STEPS,
            "lr": LR,
        }
    )
    data = norm_study.train_data()
    arms = result.setdefault("arms", {})
    for seed in args.seeds:
        for arm in args.arms:
            key = f"{arm}|{seed}"
            start = time.perf_counter()
            arms[key] = run_arm(arm, seed, data)
            arms[key]["seconds"] = round(time.perf_counter() - start, 1)
            arms[key]["commit"] = commit
            args.out.write_text(json.dumps(result, indent=1) + "\n")
            loss = np.array(arms[key]["loss"])
            print(
                f"{key}: loss at step 100 {loss[75:100].mean():.3f} ({arms[key]['seconds']} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
