"""Greedy decoding with and without the key/value cache (CPU).

Without the cache, step ``t`` of greedy decoding runs the decoder on the whole prefix of ``t``
tokens again (``O(t)`` work per step, ``O(n²)`` for ``n`` tokens); with the cache it runs the
decoder on the newest token only, reusing each layer's self-attention keys/values and the
cross-attention keys/values of the encoder output (``O(1)`` per step apart from attention).

The model has the ``cpu`` configuration's sizes (``d_model=256``, 3 + 3 layers, Multi30k-sized
vocabularies) with random weights: the speed does not depend on the weights. ``<eos>`` is
given an id the model cannot produce, so every sentence is decoded to exactly ``--tokens``
output tokens. The two variants run interleaved (pairs of runs, alternating which goes first)
and the script prints the median time of each and the median speed-up, for a single sentence
and for a batch.

Usage: ``python benchmarks/kv_cache.py [--tokens 50] [--batch 64] [--repeats 5] [--threads 1]``
(about a minute on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from companion.configs import get_config
from companion.decode import greedy_decode
from companion.run import build_model

SRC_VOCAB, TGT_VOCAB = 8011, 6270  # Multi30k word vocabularies (min_freq=2)


def time_decoding(model, src: torch.Tensor, tokens: int, use_cache: bool) -> float:
    """Seconds for one greedy decoding of ``src`` to exactly ``tokens`` tokens."""
    never = TGT_VOCAB  # an <eos> id the model cannot produce
    start = time.perf_counter()
    out = greedy_decode(model, src, max_len=tokens, use_cache=use_cache, eos_id=never)
    elapsed = time.perf_counter() - start
    assert out.shape == (src.shape[0], tokens), out.shape
    return elapsed


def measure(model, src: torch.Tensor, tokens: int, repeats: int) -> dict[str, float]:
    cached, uncached, ratios = [], [], []
    for repeat in range(repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        times = {flag: time_decoding(model, src, tokens, flag) for flag in order}
        cached.append(times[True])
        uncached.append(times[False])
        ratios.append(times[False] / times[True])
    return {
        "cached_s": statistics.median(cached),
        "uncached_s": statistics.median(uncached),
        "speedup": statistics.median(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=50, help="output tokens per sentence")
    parser.add_argument("--batch", type=int, default=64, help="sentences in the batched run")
    parser.add_argument("--src-len", type=int, default=15, help="source length (Multi30k: ~13)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved pairs of runs")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = get_config("cpu")
    model = build_model(config, SRC_VOCAB, TGT_VOCAB).eval()
    # agreement first: the cache must not change a single token
    src = torch.randint(4, SRC_VOCAB, (8, args.src_len))  # (8, src_len)
    with_cache = greedy_decode(model, src, max_len=args.tokens, use_cache=True)
    without = greedy_decode(model, src, max_len=args.tokens, use_cache=False)
    assert torch.equal(with_cache, without), "cached and uncached greedy decoding differ"
    print(
        f"model: d_model={config.model.d_model}, {config.model.num_layers}+{config.model.num_layers} layers, "
        f"vocab {SRC_VOCAB}/{TGT_VOCAB}; {args.tokens} output tokens, source length "
        f"{args.src_len}, {args.threads} thread(s); identical tokens with and without cache"
    )
    for batch in (1, args.batch):
        src = torch.randint(4, SRC_VOCAB, (batch, args.src_len))  # (batch, src_len)
        time_decoding(model, src, 5, True)  # warm-up
        result = measure(model, src, args.tokens, args.repeats)
        print(
            f"batch {batch:3d}: cached {result['cached_s'] * 1e3:8.1f} ms, "
            f"re-running the prefix {result['uncached_s'] * 1e3:8.1f} ms, "
            f"speed-up x{result['speedup']:.2f} (median of {args.repeats})"
        )


if __name__ == "__main__":
    main()
