"""Peak memory and time of attention: naive vs block-wise (FlashAttention's algorithm), torch's
fused kernel, and masked-full vs banded sliding-window attention (CPU).

1. Peak memory vs sequence length ``n`` (one head, ``d = 64``, float32) of
   ``naive_attention`` (builds the ``n × n`` scores) and ``blockwise_attention`` (one block at
   a time), forward and forward + backward, measured with
   ``companion.measure.peak_memory_bytes``; the log-log slope of peak against ``n`` is fitted
   (2 means ``∝ n²``, 1 means ``∝ n``).
2. Which kernel ``F.scaled_dot_product_attention`` runs here, its median time against the naive
   formula (interleaved), and its forward peak memory.
3. Sliding-window attention (causal, window 128): the naive attention with a
   ``sliding_window_mask`` (still ``n²`` scores) against ``sliding_window_attention`` (only the
   band), time and forward peak memory.

Usage: ``nice -n 19 python benchmarks/attention_memory.py [--threads 1] [--repeats 3]``
(under a minute on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

from companion.efficient_attention import (
    blockwise_attention,
    naive_attention,
    sliding_window_attention,
)
from companion.masking import sliding_window_mask
from companion.measure import compare_with_naive, median_seconds, peak_memory_bytes

LENGTHS = (1024, 2048, 4096, 8192)
D, BLOCK, WINDOW = 64, 128, 128
MIB = 2**20


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    covariance = sum((a - mx) * (b - my) for a, b in zip(lx, ly))
    return covariance / sum((a - mx) ** 2 for a in lx)


def qkv(n: int, requires_grad: bool = False) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(n)
    return [torch.randn(1, n, D, generator=generator).requires_grad_(requires_grad) for _ in "qkv"]


def blockwise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return blockwise_attention(q, k, v, block_size=BLOCK)


def forward_backward(fn, q, k, v) -> None:
    fn(q, k, v).sum().backward()


def memory_table() -> None:
    print(f"\n1. peak memory (MiB), one head, d={D}, float32, block {BLOCK}; forward time (ms)")
    columns = ("naive fwd", "block fwd", "naive f+b", "block f+b")
    print(f"{'n':>6} {'n×n fp32':>9} " + " ".join(f"{c:>10}" for c in columns), end="")
    print(f" {'naive ms':>9} {'block ms':>9}")
    peaks: dict[str, list[float]] = {column: [] for column in columns}
    for n in LENGTHS:
        q, k, v = qkv(n)
        peaks["naive fwd"].append(peak_memory_bytes(naive_attention, q, k, v))
        peaks["block fwd"].append(peak_memory_bytes(blockwise, q, k, v))
        naive_ms = median_seconds(naive_attention, q, k, v, repeats=1) * 1e3
        block_ms = median_seconds(blockwise, q, k, v, repeats=1) * 1e3
        q, k, v = qkv(n, requires_grad=True)
        peaks["naive f+b"].append(peak_memory_bytes(forward_backward, naive_attention, q, k, v))
        peaks["block f+b"].append(peak_memory_bytes(forward_backward, blockwise, q, k, v))
        row = " ".join(f"{peaks[c][-1] / MIB:>10.2f}" for c in columns)
        print(f"{n:>6} {n * n * 4 / MIB:>9.1f} {row} {naive_ms:>9.1f} {block_ms:>9.1f}")
    slopes = " ".join(f"{loglog_slope(LENGTHS, peaks[c]):>10.2f}" for c in columns)
    print(f"{'slope':>6} {'':>9} {slopes}   (log-log fit, n = {LENGTHS[0]}..{LENGTHS[-1]})")
    last = " ".join(f"{math.log2(peaks[c][-1] / peaks[c][-2]):>10.2f}" for c in columns)
    print(f"{'slope':>6} {'':>9} {last}   (the last doubling, {LENGTHS[-2]} → {LENGTHS[-1]})")


def sdpa_table(repeats: int) -> None:
    print("\n2. F.scaled_dot_product_attention vs naive, (1, 1, n, 64) float32, forward")
    print(
        f"{'n':>6} {'causal':>6} {'backend':>16} {'sdpa ms':>9} {'naive ms':>9} {'speed-up':>8} "
        f"{'sdpa MiB':>9} {'naive MiB':>9}"
    )
    for n in (1024, 2048, 4096):
        q, k, v = (x[None] for x in qkv(n))
        for causal in (False, True):
            timing = compare_with_naive(q, k, v, is_causal=causal, repeats=repeats)
            fused_peak = peak_memory_bytes(
                F.scaled_dot_product_attention, q, k, v, is_causal=causal
            )
            naive_peak = peak_memory_bytes(naive_attention, q, k, v, is_causal=causal)
            print(
                f"{n:>6} {causal!s:>6} {timing.backend.name:>16} {timing.sdpa_seconds * 1e3:>9.2f} "
                f"{timing.naive_seconds * 1e3:>9.2f} {timing.speedup:>8.1f} "
                f"{fused_peak / MIB:>9.2f} {naive_peak / MIB:>9.2f}"
            )


def sliding_table(repeats: int) -> None:
    print(f"\n3. causal sliding window {WINDOW}: masked full attention vs banded, forward")
    print(f"{'n':>6} {'masked ms':>10} {'banded ms':>10} {'masked MiB':>11} {'banded MiB':>11}")
    lengths = LENGTHS
    peaks: dict[str, list[float]] = {"masked": [], "banded": []}
    times: dict[str, list[float]] = {"masked": [], "banded": []}

    for n in lengths:
        q, k, v = qkv(n)
        mask = sliding_window_mask(n, window=WINDOW, causal=True)  # built outside: not counted

        def masked(q, k, v, mask=mask):
            return naive_attention(q, k, v, mask=mask)

        def banded(q, k, v):
            return sliding_window_attention(q, k, v, window=WINDOW)

        for name, fn in (("masked", masked), ("banded", banded)):
            times[name].append(median_seconds(fn, q, k, v, repeats=repeats))
            peaks[name].append(peak_memory_bytes(fn, q, k, v))
        print(
            f"{n:>6} {times['masked'][-1] * 1e3:>10.1f} {times['banded'][-1] * 1e3:>10.1f} "
            f"{peaks['masked'][-1] / MIB:>11.2f} {peaks['banded'][-1] / MIB:>11.2f}"
        )
    print(
        f"{'slope':>6} {loglog_slope(lengths, times['masked']):>10.2f} "
        f"{loglog_slope(lengths, times['banded']):>10.2f} "
        f"{loglog_slope(lengths, peaks['masked']):>11.2f} "
        f"{loglog_slope(lengths, peaks['banded']):>11.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per measurement")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), load {os.getloadavg()}")
    start = time.perf_counter()
    memory_table()
    sdpa_table(args.repeats)
    sliding_table(args.repeats)
    print(f"\n{time.perf_counter() - start:.0f} s, load {os.getloadavg()}")


if __name__ == "__main__":
    main()
