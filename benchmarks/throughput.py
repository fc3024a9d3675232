"""Training-step throughput: companion.Transformer vs torch.nn.Transformer (CPU or GPU).

Both models get the same configuration, the same batches and the same training step
(forward, label-smoothed cross-entropy (ε = 0.1; torch's ``F.cross_entropy`` for torch,
``companion.train.sequence_loss`` for companion), backward, Adam step with
``companion.train.adam`` for both), dropout 0.1 in train mode at the same sites
(``--attention-dropout`` and ``--activation-dropout`` change two of them in both models,
as ``TransformerConfig`` does in companion's). To compare the
*stacks* only, both use the same kind of token embeddings (companion.TokenEmbedding, ×√d),
the same sinusoidal positions and the same generator (nn.Linear to the vocabulary); only the
encoder/decoder stacks differ:

* companion: ``companion.Transformer`` (``final_norm=True``, because ``nn.Transformer``
  always has final encoder/decoder norms - so both do the same arithmetic);
* torch: the same embeddings + ``torch.nn.Transformer(batch_first=True)`` + generator, masks
  passed the torch way (``*_key_padding_mask`` True = padding, ``tgt_mask`` from
  ``generate_square_subsequent_mask`` with ``tgt_is_causal=True``).

The two models run interleaved in one process - pairs of single training steps, alternating
which goes first - and the script prints the median over pairs of the throughput ratio
companion ÷ torch (a slow spell of a shared CPU then hits both members of a pair). It also
counts the FLOPs of one companion step (``torch.utils.flop_counter``) and divides the achieved
FLOP/s by the FLOP/s of a 2048 × 2048 ``torch.mm`` timed inside every pair (the product runs
under the same conditions as the steps around it: one reference measured apart, at the end of
a run, moved by ±15 % from run to run on a 2-core machine); it prints the median over pairs
of that fraction with its quartiles.

Usage: ``python benchmarks/throughput.py [--norm-first] [--batch 16] [--length 128]``
``[--d-model 256] [--layers 3] [--heads 8] [--d-ff 1024] [--vocab 1000] [--budget 150]``
``[--device cuda]``: the run stops timing pairs early enough to finish within ``--budget``
seconds (at least one pair), so it stays under 3 minutes even on a busy machine. On a GPU both
models and the ``torch.mm`` reference use TensorFloat-32 matrix products, as
``companion.run`` trains there (``loss.item()`` ends every step, so the timings wait for the
GPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_flop_count

import companion
from companion.measure import median_seconds
from companion.model import TokenEmbedding
from companion.positional import SinusoidalPositionalEncoding
from companion.train import adam, allow_tf32, compile_model, sequence_loss

PAD = 0
#: Label smoothing of the course's runs, used by both models' losses.
SMOOTHING = 0.1


class TorchReference(nn.Module):
    """Embeddings + positions + ``torch.nn.Transformer`` + generator."""

    def __init__(
        self,
        vocab: int,
        d_model: int,
        heads: int,
        layers: int,
        d_ff: int,
        dropout: float,
        norm_first: bool,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
    ) -> None:
        super().__init__()
        self.src_embedding = TokenEmbedding(vocab, d_model)
        self.tgt_embedding = TokenEmbedding(vocab, d_model)
        self.src_positions = SinusoidalPositionalEncoding(d_model, dropout=dropout)
        self.tgt_positions = SinusoidalPositionalEncoding(d_model, dropout=dropout)
        self.transformer = nn.Transformer(
            d_model, heads, layers, layers, d_ff, dropout, batch_first=True, norm_first=norm_first
        )
        self.generator = nn.Linear(d_model, vocab)
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            for name in ("self_attn", "multihead_attn"):  # the decoder has both
                if attention_dropout is not None and hasattr(layer, name):
                    getattr(layer, name).dropout = attention_dropout
            if activation_dropout is not None:
                layer.dropout.p = activation_dropout  # torch's feed-forward dropout

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        tgt_len = tgt.shape[1]
        square = nn.Transformer.generate_square_subsequent_mask
        causal = square(tgt_len, device=tgt.device)  # (tgt_len, tgt_len)
        src_padding = src == PAD  # (batch, src_len), True = padding
        out = self.transformer(
            self.src_positions(self.src_embedding(src)),
            self.tgt_positions(self.tgt_embedding(tgt)),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            tgt_key_padding_mask=tgt == PAD,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )  # (batch, tgt_len, d_model)
        return self.generator(out)  # (batch, tgt_len, vocab)


def make_batches(
    count: int, batch: int, length: int, vocab: int, seed: int
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Random (src, tgt_in, tgt_out) batches; lengths vary in [3/4·length, length], padded."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):

        def tokens() -> Tensor:
            ids = torch.randint(1, vocab, (batch, length + 1), generator=gen)
            lengths = torch.randint(3 * length // 4, length + 1, (batch,), generator=gen)
            ids[torch.arange(length + 1) > lengths[:, None]] = PAD
            return ids

        src, tgt = tokens()[:, :length], tokens()
        batches.append((src, tgt[:, :-1], tgt[:, 1:]))
    return batches


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[Tensor, Tensor, Tensor]
) -> float:
    """One step; each model gets its own library's loss (the same label-smoothed mean)."""
    src, tgt_in, tgt_out = batch
    optimizer.zero_grad(set_to_none=True)
    logits = model(src, tgt_in)  # (batch, tgt_len, vocab)
    if isinstance(model, TorchReference):
        loss = F.cross_entropy(
            logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, label_smoothing=SMOOTHING
        )
    else:  # what companion.train computes
        loss = sequence_loss(logits, tgt_out, pad_id=PAD, label_smoothing=SMOOTHING)
    loss.backward()
    optimizer.step()
    return loss.item()


def timed(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, steps: int, start: int
) -> float:
    """Seconds for ``steps`` training steps on batches ``start, start + 1, ...``."""
    t0 = time.perf_counter()
    for i in range(steps):
        train_step(model, optimizer, batches[(start + i) % len(batches)])
    return time.perf_counter() - t0


def matmul_flops_per_s(device: torch.device, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a ``size`` × ``size`` ``torch.mm`` on ``device``: the median of ``repeats``."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    inner = 1 if device.type == "cpu" else 50  # one GPU product is too short to time alone

    def products(x: Tensor, y: Tensor) -> None:
        for _ in range(inner):
            x @ y

    return 2 * size**3 * inner / median_seconds(products, a, b, repeats=repeats, warmup=0)


def _register_cpu_flash_flops() -> None:
    """``torch.utils.flop_counter`` has no formula for the CPU flash-attention kernels."""
    aten = torch.ops.aten

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
    def _forward(query, key, value, *args, out_val=None, **kwargs) -> int:  # noqa: ANN001
        return sdpa_flop_count(query.shape, key.shape, value.shape)

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)
    def _backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:  # noqa: ANN001
        # backward ≈ 2 × forward (the standard estimate: two products per forward product)
        return 2 * sdpa_flop_count(query.shape, key.shape, value.shape)


def count_step_flops(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple) -> int:
    try:
        _register_cpu_flash_flops()
    except Exception:  # noqa: BLE001 - older torch: attention FLOPs are then not counted
        pass
    with FlopCounterMode(display=False) as counter:
        train_step(model, optimizer, batch)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="sentence pairs per batch")
    parser.add_argument("--length", type=int, default=128, help="tokens per sentence")
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--norm-first", action="store_true", help="Pre-LN instead of Post-LN")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3, help="encoder layers = decoder layers")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument(
        "--attention-dropout", type=float, default=None, help="default: the dropout, 0.1"
    )
    parser.add_argument(
        "--activation-dropout", type=float, default=None, help="default: the dropout, 0.1"
    )
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the whole run")
    parser.add_argument("--max-pairs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile the companion model as companion.run --compile does (compile_model)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    allow_tf32(device)  # as companion.run trains on a GPU
    started = time.perf_counter()

    d_model, heads, layers, d_ff, dropout = args.d_model, args.heads, args.layers, args.d_ff, 0.1
    sites = {
        "attention_dropout": args.attention_dropout,
        "activation_dropout": args.activation_dropout,
    }
    torch.manual_seed(0)
    ours = companion.Transformer(companion.TransformerConfig(
        args.vocab, args.vocab, d_model, heads, layers, d_ff, dropout, args.norm_first,
        src_pad_id=PAD, tgt_pad_id=PAD, final_norm=True, **sites,
    ))  # fmt: skip
    theirs = TorchReference(
        args.vocab, d_model, heads, layers, d_ff, dropout, args.norm_first, **sites
    )
    ours.to(device)
    theirs.to(device)
    ours_step = compile_model(ours) if args.compile else ours  # same parameters
    models = {"companion": ours_step.train(), "torch": theirs.train()}
    # companion.train's Adam (fused where torch has the kernel) for both: the models differ
    optimizers = {name: adam(m.parameters(), lr=1e-4) for name, m in models.items()}
    n_params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    batches = [
        tuple(t.to(device) for t in batch)
        for batch in make_batches(4, args.batch, args.length, args.vocab, seed=0)
    ]
    tokens_per_step = 2 * args.batch * args.length  # source + target positions (with padding)

    load_before = os.getloadavg()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f}\n"
        f"d_model={d_model}, heads={heads}, layers={layers}+{layers}, d_ff={d_ff}, "
        f"dropout={dropout} (attention {args.attention_dropout}, feed-forward "
        f"{args.activation_dropout}; None = dropout; train mode), "
        f"norm_first={args.norm_first}, vocab={args.vocab}, "
        f"batch={args.batch} pairs x {args.length} tokens = {tokens_per_step:,} tokens (src+tgt)"
    )
    print(f"parameters: companion {n_params['companion']:,}, torch {n_params['torch']:,}")
    if device.type == "cpu" and torch.get_num_threads() > 1 and load_before[0] > 0.5:
        print(
            "note: other processes are using the CPU; with several threads each operation "
            "waits for its slowest thread, so steps can be many times slower and noisier - "
            "--threads 1 gives steadier figures on a shared machine"
        )

    warm_up = {name: timed(models[name], optimizers[name], batches, 1, 0) for name in models}
    if args.compile:  # compilation happens in the first steps (train mode, then shapes)
        compile_seconds = warm_up["companion"] + timed(
            ours_step, optimizers["companion"], batches, 3, 1
        )
        print(f"compiled the companion model: first 4 steps took {compile_seconds:.1f} s")
        warm_up["companion"] = timed(ours_step, optimizers["companion"], batches, 1, 0)
    deadline = time.perf_counter() + args.budget

    # Pairs of single steps in ABBA order, so that a slow spell of a shared CPU hits both.
    # Stop in time to leave one more companion step (FLOP count) and the matrix product.
    ratios, seconds, mm_rates, size = [], {name: [] for name in models}, [], 2048
    matmul_flops_per_s(device, repeats=1)  # the reference's own warm-up
    pair, pair_seconds = 0, sum(warm_up.values())
    while pair < args.max_pairs:
        one_step = statistics.median(seconds["companion"] or [warm_up["companion"]])
        if pair > 0 and time.perf_counter() + pair_seconds + one_step + 3 > deadline:
            break
        order = list(models) if pair % 2 == 0 else list(models)[::-1]
        step_seconds = {
            name: timed(models[name], optimizers[name], batches, 1, pair) for name in order
        }
        for name, value in step_seconds.items():
            seconds[name].append(value)
        ratios.append(step_seconds["torch"] / step_seconds["companion"])
        mm_rates.append(matmul_flops_per_s(device, repeats=1))  # between this pair and the next
        pair_seconds = sum(step_seconds.values()) + 2 * size**3 / mm_rates[-1]
        pair += 1

    median_seconds = {name: statistics.median(values) for name, values in seconds.items()}
    rate = {name: tokens_per_step / value for name, value in median_seconds.items()}
    step_flops = count_step_flops(ours, optimizers["companion"], batches[0])
    peak = statistics.median(mm_rates)
    achieved = step_flops / median_seconds["companion"]
    fractions = [  # achieved FLOP/s of each companion step ÷ the product's of its pair
        step_flops / step / rate for step, rate in zip(seconds["companion"], mm_rates)
    ]
    load_after = os.getloadavg()

    def quartiles(values: list[float]) -> list[float]:
        return statistics.quantiles(values, n=4) if len(values) > 1 else values * 3

    ratio_q, fraction_q, mm_q = quartiles(ratios), quartiles(fractions), quartiles(mm_rates)
    print(f"\n{pair} interleaved pairs of training steps")
    print(
        f"median step: companion {median_seconds['companion'] * 1e3:,.0f} ms "
        f"({rate['companion']:,.0f} tokens/s), torch {median_seconds['torch'] * 1e3:,.0f} ms "
        f"({rate['torch']:,.0f} tokens/s)"
    )
    print(
        f"throughput ratio companion / torch: median {statistics.median(ratios):.3f} "
        f"(quartiles {ratio_q[0]:.3f} - {ratio_q[2]:.3f})"
    )
    print(
        f"companion step: {step_flops / 1e9:.1f} GFLOP -> {achieved / 1e9:.1f} GFLOP/s (median "
        f"step); torch.mm {size}x{size}, once a pair: median {peak / 1e9:.1f} GFLOP/s "
        f"(quartiles {mm_q[0] / 1e9:.1f} - {mm_q[2] / 1e9:.1f})"
    )
    print(
        f"achieved / mm, per pair: median {statistics.median(fractions):.3f} "
        f"(quartiles {fraction_q[0]:.3f} - {fraction_q[2]:.3f})"
    )
    print(
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"total {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
