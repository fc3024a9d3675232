"""Where one training step of a course configuration spends its time (CPU profile).

For each named configuration (default ``cpu`` and ``gpu``), the script builds the model that
``companion.run`` trains (Multi30k's vocabulary sizes), makes batches of that configuration's
real shape (``max_tokens`` tokens, source + target, Multi30k-like lengths with padding),
runs a few warm-up steps of ``companion.train.train_step`` (Adam, inverse-square-root
schedule, label smoothing, clipping, dropout on: exactly the course's step), then profiles a
few more with ``torch.profiler`` and prints the share of the step in

* matrix products (``mm``, ``addmm``, ``bmm``, ``linear``),
* attention kernels (``scaled_dot_product_*``),
* dropout and random numbers (``bernoulli_``, ``native_dropout``, ...),
* the loss over the vocabulary (log-softmax, NLL, their backward),
* normalisation (LayerNorm forward and backward),
* copies and fills (``copy_``, ``fill_``, ``zero_``, ``cat``, ``clone``),
* the optimiser (Adam's element-wise updates, gradient clipping),
* other operators,
* host-side Python: the step's wall time not covered by any operator.

Usage: ``python benchmarks/profile_step.py [--config cpu gpu toy] [--steps 3] [--threads N]``
``[--compile]``. The ``gpu`` configuration is profiled on the CPU unless CUDA is available
(its shapes are what matters for the shares; its absolute times are a CPU's).
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from companion.configs import get_config
from companion.data import PAD_ID
from companion.run import build_model
from companion.train import adam, allow_tf32, compile_model, inverse_sqrt_warmup, train_step

#: Multi30k's vocabulary sizes with the course's settings (min_freq 2, cased).
SRC_VOCAB, TGT_VOCAB = 8011, 6270
#: Mean and spread of Multi30k sentence lengths in tokens (with <bos>/<eos>), de and en.
MEAN_LENGTH, SPREAD = 15, 5

#: Operator-name patterns of each category, tried in this order (first match wins).
CATEGORIES: list[tuple[str, re.Pattern[str]]] = [
    ("attention", re.compile(r"scaled_dot_product|flash_attention|efficient_attention")),
    ("dropout / RNG", re.compile(r"bernoulli|dropout|rand|philox")),
    ("loss", re.compile(r"log_softmax|nll_loss|cross_entropy")),
    ("norms", re.compile(r"layer_norm")),
    ("matrix products", re.compile(r"^aten::(mm|addmm|bmm|matmul|linear|baddbmm|_addmm)")),
    ("optimizer", re.compile(r"_foreach|adam|clip_grad|Optimizer|lerp|addcdiv|addcmul|sqrt")),
    ("copies / fills", re.compile(r"copy_|fill_|zero_|^aten::cat|clone|contiguous|masked_fill")),
]


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other operators"


def make_batch(max_tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, tgt)`` with about ``max_tokens`` tokens (source + target, padding included)."""
    length = MEAN_LENGTH + SPREAD
    batch = max(1, max_tokens // (2 * length))
    src = torch.randint(4, SRC_VOCAB, (batch, length), generator=generator)
    tgt = torch.randint(4, TGT_VOCAB, (batch, length), generator=generator)
    for ids in (src, tgt):
        lengths = torch.randint(MEAN_LENGTH - SPREAD, length + 1, (batch,), generator=generator)
        ids[torch.arange(length) >= lengths[:, None]] = PAD_ID
    return src, tgt  # (batch, length) each


def profile_config(
    name: str, steps: int, compile_step: bool, top_operators: int = 12
) -> dict[str, float]:
    config = get_config(name)
    torch.manual_seed(0)
    model = build_model(config, SRC_VOCAB, TGT_VOCAB).train()
    device = torch.device("cuda" if torch.cuda.is_available() and name == "gpu" else "cpu")
    model.to(device)
    allow_tf32(device)  # as companion.run trains on a GPU
    optimizer = adam(  # as companion.trainer.Trainer makes it
        model.parameters(),
        lr=1.0,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
    )
    schedule = inverse_sqrt_warmup(config.model.d_model, config.warmup_steps, config.lr_factor)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    step_model = compile_model(model) if compile_step else model
    generator = torch.Generator().manual_seed(1)
    batches = [make_batch(config.max_tokens, generator) for _ in range(steps + 2)]

    def one_step(src: torch.Tensor, tgt: torch.Tensor) -> None:
        train_step(
            model=step_model,
            src=src.to(device),
            tgt=tgt.to(device),
            optimizer=optimizer,
            scheduler=scheduler,
            pad_id=PAD_ID,
            label_smoothing=config.label_smoothing,
            clip_norm=config.clip_norm,
        )

    for src, tgt in batches[:2]:  # warm-up (and compilation)
        one_step(src, tgt)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for src, tgt in batches[2:]:
            one_step(src, tgt)
    wall_us = (time.perf_counter() - start) * 1e6
    shares: dict[str, float] = defaultdict(float)
    operators: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith(("ProfilerStep", "## ")):
            continue
        shares[category(event.key)] += event.self_cpu_time_total
        operators[event.key] = event.self_cpu_time_total
    covered = sum(shares.values())
    shares["host-side Python"] = max(0.0, wall_us - covered)
    tokens = sum(int((s != PAD_ID).sum() + (t != PAD_ID).sum()) for s, t in batches[2:])
    print(
        f"\n{name}: d_model={config.model.d_model}, layers={config.model.num_layers}+"
        f"{config.model.num_layers}, batch {tuple(batches[2][0].shape)} + "
        f"{tuple(batches[2][1].shape)} (~{config.max_tokens} tokens), {steps} steps, "
        f"{wall_us / steps / 1e3:,.0f} ms a step, {tokens / (wall_us / 1e6):,.0f} real tokens/s"
    )
    total = sum(shares.values())
    for label, micros in sorted(shares.items(), key=lambda item: -item[1]):
        print(f"  {label:18s} {100 * micros / total:5.1f} %   {micros / steps / 1e3:8.1f} ms/step")
    top = sorted(operators.items(), key=lambda item: -item[1])[:top_operators]
    print(f"  top {len(top)} operators (self time):")
    for key, micros in top:
        print(f"    {key:44s} {100 * micros / total:5.1f} %  ({category(key)})")
    return {label: micros / total for label, micros in shares.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", nargs="+", default=["cpu", "gpu"])
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per config")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--top", type=int, default=12, help="operators listed per config")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.config:
        profile_config(name, max(1, args.steps), args.compile, args.top)


if __name__ == "__main__":
    main()
