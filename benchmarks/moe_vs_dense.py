"""A Mixture-of-Experts feed-forward vs a dense one of equal active parameters (CPU, 1 thread).

The task is the course's toy task (chapters 3, 5-7), reversing a sequence of symbols (12 of
20 by default), posed to a small decoder-only model
(:class:`companion.families.DecoderOnlyTransformer`, 2 Pre-LN layers, d_model 64, 4 heads) as
a language model: ``<bos> s_1 .. s_L <eos> s_L .. s_1``, the loss counting only the reversed
half. All
sequences have the same length, so there is no padding. The variants differ only in the
feed-forward network of each layer, freshly initialised the same way (``nn.Linear``'s default):

* ``dense``: a :class:`~companion.layers.FeedForward` with ``d_ff = top_k * d_ff_expert``;
* ``moe``: a :class:`~companion.moe.MoEFeedForward` with ``num_experts`` experts of
  ``d_ff_expert``, ``top_k`` of them per token (the same active parameters, plus the router),
  trained with ``+ balance_coef * balance_loss`` per layer (Switch: 0.01);
* ``dense_total`` (context): a dense network with the MoE's *total* hidden size,
  ``d_ff = num_experts * d_ff_expert``.

Each variant trains ``--steps`` steps of AdamW for each of ``--seeds`` seeds (the same data
order for every variant of a seed), interleaved so that a busy machine slows them alike. The
validation loss on the reversed half is measured every ``--eval-every`` steps. The script
reports the final validation loss and next-token accuracy (mean ± sample standard deviation
over seeds), the first measured step with a validation loss below ``--target`` (the task is
learnt in a sudden drop, so this says which variant learns it sooner), the share of routing
assignments the capacity dropped (in training and on the validation set), and the time per
training step (wall and CPU; on a busy machine the CPU time is the steadier one), and writes
``benchmarks/results/moe_vs_dense.json``.

Usage: ``python benchmarks/moe_vs_dense.py [--steps 300] [--seeds 3]`` (about 2 CPU-minutes).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.data.toy import CopyReverseDataset
from companion.data.vocab import BOS_ID, EOS_ID
from companion.families import DecoderOnlyTransformer
from companion.layers import FeedForward
from companion.model import TransformerConfig
from companion.moe import MoEFeedForward
from companion.utils import count_parameters, set_seed

RESULTS = Path(__file__).resolve().parent / "results" / "moe_vs_dense.json"
VARIANTS = ("dense", "moe", "dense_total")


def reverse_sequences(num_examples: int, length: int, num_symbols: int, seed: int) -> Tensor:
    """``(num_examples, 2 * length + 2)`` ids: ``<bos> source <eos> reversed source``."""
    data = CopyReverseDataset(
        "reverse", num_examples, min_len=length, max_len=length, num_symbols=num_symbols, seed=seed
    )
    rows = [[BOS_ID, *src, EOS_ID, *tgt] for src, tgt in (data[i] for i in range(len(data)))]
    return torch.tensor(rows)  # (num_examples, 2 * length + 2)


def build(variant: str, args: argparse.Namespace, vocab: int, seed: int) -> DecoderOnlyTransformer:
    """The model of one variant; every feed-forward network is replaced by a fresh one."""
    set_seed(seed)
    config = TransformerConfig(
        tgt_vocab=vocab,
        d_model=args.d_model,
        num_heads=args.heads,
        num_layers=args.layers,
        d_ff=args.d_ff_expert,  # replaced below
        dropout=0.0,
        norm_first=True,
        max_len=64,
    )
    model = DecoderOnlyTransformer(config)
    for layer in model.layers:
        if variant == "moe":
            layer.feed_forward = MoEFeedForward(
                args.d_model, args.d_ff_expert, args.experts, args.top_k, args.capacity_factor
            )
        else:
            width = args.top_k if variant == "dense" else args.experts
            layer.feed_forward = FeedForward(args.d_model, width * args.d_ff_expert)
    return model


def active_ffn_parameters(ffn: nn.Module) -> int:
    """Parameters one token uses in a feed-forward network (router + top_k experts)."""
    if isinstance(ffn, MoEFeedForward):
        return count_parameters(ffn.router) + ffn.top_k * count_parameters(ffn.experts[0])
    return count_parameters(ffn)


def loss_and_aux(model: DecoderOnlyTransformer, batch: Tensor, length: int) -> tuple[Tensor, ...]:
    """Task loss on the reversed half ``(,)``, summed balance loss ``(,)``, next-token
    accuracy ``(,)`` and dropped share ``(,)`` of one batch ``(batch, 2 * length + 2)``."""
    logits = model(batch[:, :-1])  # (batch, 2L + 1, vocab)
    answer = logits[:, length + 1 :]  # (batch, L, vocab): predictions of the reversed half
    targets = batch[:, length + 2 :]  # (batch, L)
    loss = F.cross_entropy(answer.reshape(-1, answer.shape[-1]), targets.reshape(-1))  # ()
    accuracy = (answer.argmax(-1) == targets).float().mean()  # ()
    balance = torch.zeros(())
    dropped, routed = 0, 0
    for layer in model.layers:
        stats = getattr(layer.feed_forward, "last_aux", None)
        if stats is not None:
            balance = balance + stats.balance_loss  # ()
            dropped += int(stats.dropped)
            routed += int(stats.dropped) + int(stats.tokens_per_expert.sum())
    return loss, balance, accuracy, torch.tensor(dropped / max(routed, 1))


def train(variant: str, args: argparse.Namespace, seed: int, train_data: Tensor, valid: Tensor):
    vocab = 4 + args.symbols
    model = build(variant, args, vocab, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    order = torch.Generator().manual_seed(1000 + seed)
    curve, wall, cpu, train_dropped = [], 0.0, 0.0, 0.0
    for step in range(1, args.steps + 1):
        model.train()
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        rows = torch.randint(0, train_data.shape[0], (args.batch,), generator=order)  # (batch,)
        loss, balance, _, dropped = loss_and_aux(model, train_data[rows], args.length)
        train_dropped += float(dropped) / args.steps
        optimizer.zero_grad(set_to_none=True)
        (loss + args.balance_coef * balance).backward()
        optimizer.step()
        wall += time.perf_counter() - start_wall
        cpu += time.process_time() - start_cpu
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                loss, balance, accuracy, dropped = loss_and_aux(model, valid, args.length)
            curve.append((step, float(loss)))
    layers = model.layers
    return {
        "seed": seed,
        "valid_loss_curve": curve,
        "steps_to_target": next((step for step, value in curve if value < args.target), None),
        "valid_loss": float(loss),
        "valid_accuracy": float(accuracy),
        "valid_balance_loss_per_layer": float(balance) / len(layers),
        "valid_dropped_share": float(dropped),
        "train_dropped_share": train_dropped,
        "train_ms_per_step": 1000 * wall / args.steps,
        "train_cpu_ms_per_step": 1000 * cpu / args.steps,
        "parameters": count_parameters(model),
        "ffn_parameters_per_layer": count_parameters(layers[0].feed_forward),
        "ffn_active_parameters_per_layer": active_ffn_parameters(layers[0].feed_forward),
    }


def summary(runs: list[dict]) -> dict:
    def mean_sd(key: str) -> tuple[float, float]:
        values = [run[key] for run in runs]
        return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    out = {}
    reached = [run["steps_to_target"] for run in runs]
    if None not in reached:
        out["steps_to_target_mean"] = statistics.mean(reached)
        out["steps_to_target_sd"] = statistics.stdev(reached) if len(reached) > 1 else 0.0
    out["steps_to_target"] = reached
    for key in ("valid_loss", "valid_accuracy", "valid_dropped_share", "train_dropped_share",
                "train_ms_per_step", "train_cpu_ms_per_step"):  # fmt: skip
        out[key + "_mean"], out[key + "_sd"] = mean_sd(key)
    for key in ("parameters", "ffn_parameters_per_layer", "ffn_active_parameters_per_layer"):
        out[key] = runs[0][key]
    steps = [step for step, _ in runs[0]["valid_loss_curve"]]
    by_step = zip(*([loss for _, loss in run["valid_loss_curve"]] for run in runs))
    out["valid_loss_curve_mean"] = [
        (step, statistics.mean(losses)) for step, losses in zip(steps, by_step)
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--length", type=int, default=12, help="symbols per sequence")
    parser.add_argument("--symbols", type=int, default=20)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--d-ff-expert", type=int, default=64)
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--balance-coef", type=float, default=0.01)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--target", type=float, default=0.1, help="validation loss to reach")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    train_data = reverse_sequences(20_000, args.length, args.symbols, seed=0)
    valid = reverse_sequences(1_000, args.length, args.symbols, seed=1)
    runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for seed in range(args.seeds):
        order = VARIANTS if seed % 2 == 0 else VARIANTS[::-1]  # interleaved, alternating
        for variant in order:
            run = train(variant, args, seed, train_data, valid)
            runs[variant].append(run)
            print(f"seed {seed} {variant:11s} valid loss {run['valid_loss']:.4f} "
                  f"acc {run['valid_accuracy']:.4f} dropped (train) {run['train_dropped_share']:.4f} "
                  f"{run['train_ms_per_step']:.1f} ms/step ({run['train_cpu_ms_per_step']:.1f} CPU)",
                  flush=True)  # fmt: skip

    result = {
        "task": f"reverse {args.length} digits ({args.symbols} symbols), decoder-only LM",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "summary": {variant: summary(runs[variant]) for variant in VARIANTS},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'variant':12s} {'valid loss':>16s} {'accuracy':>14s} {'steps to target':>16s} "
          f"{'CPU ms/step':>12s} {'FFN params (active)':>22s}")  # fmt: skip
    for variant, s in result["summary"].items():
        print(
            f"{variant:12s} {s['valid_loss_mean']:8.4f} ± {s['valid_loss_sd']:.4f} "
            f"{s['valid_accuracy_mean']:7.3f} ± {s['valid_accuracy_sd']:.3f} "
            f"{str(s['steps_to_target']):>16s} "
            f"{s['train_cpu_ms_per_step_mean']:6.1f} ± {s['train_cpu_ms_per_step_sd']:.1f} "
            f"{s['ffn_parameters_per_layer']:>10,d} ({s['ffn_active_parameters_per_layer']:,d})"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
