"""Exercises of chapter 3, "Multi-head attention".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several shapes, including the ones where a
wrong reshape still produces the right shape), and returns a
:class:`~companion.exercises._checker.CheckResult` that is truthy when every case matches.
The checks call your function with keyword arguments, so keep the parameter names of the stub
in the notebook.

=================================  ============================================
exercise                           check
=================================  ============================================
split a per-head fused projection  :func:`check_split_fused_qkv`
multi-head attention from weights  :func:`check_multi_head_attention`
grouped-query attention            :func:`check_grouped_query_attention`
parameters of MHA / GQA / MQA      :func:`check_attention_parameter_count`
the key/value cache in bytes       :func:`check_kv_cache_bytes`
=================================  ============================================

Weight matrices follow the *math* convention of the chapter, ``y = x W`` with ``W`` of shape
``(in, out)`` - the transpose of what ``nn.Linear`` stores in ``.weight``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from companion.exercises._checker import Case, CheckResult, run_check, seeded_generator

__all__ = [
    "check_split_fused_qkv",
    "check_multi_head_attention",
    "check_grouped_query_attention",
    "check_attention_parameter_count",
    "check_kv_cache_bytes",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: split a fused projection laid out head by head
# --------------------------------------------------------------------------------------------


def reference_split_fused_qkv(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Split the output of one fused projection whose features are grouped **per head**.

    The layout of each position's ``3·d_model`` features is
    ``[q_0 | k_0 | v_0 | q_1 | k_1 | v_1 | ...]``, each block ``head_dim`` wide (the layout of
    the UvA deep-learning tutorials), not ``[all queries | all keys | all values]``.

    Args:
        qkv: shape ``(batch, len, 3·d_model)``.
        num_heads: number of heads; ``d_model = num_heads · head_dim``.

    Returns:
        ``(q, k, v)``, each of shape ``(batch, num_heads, len, head_dim)``.
    """
    batch, length, width = qkv.shape
    head_dim = width // (3 * num_heads)
    per_head = qkv.view(batch, length, num_heads, 3 * head_dim)  # (batch, len, heads, 3·head_dim)
    per_head = per_head.transpose(1, 2)  # (batch, heads, len, 3·head_dim)
    q, k, v = per_head.chunk(3, dim=-1)  # each (batch, heads, len, head_dim)
    return q, k, v


def _fused_cases() -> list[Case]:
    g = seeded_generator(301)
    shapes = [
        # (batch, len, num_heads, head_dim)
        (2, 5, 3, 4),  # the chapter's walk-through sizes
        (1, 3, 2, 4),
        (3, 4, 4, 4),  # len = heads = head_dim = 4: a reshape without transpose fits
        (2, 2, 2, 2),  # likewise
        (2, 6, 1, 6),  # one head: the two layouts coincide
        (2, 1, 6, 1),  # head_dim = 1
    ]
    return [
        {"qkv": torch.randn(batch, length, 3 * heads * dim, generator=g), "num_heads": heads}
        for batch, length, heads, dim in shapes
    ]


def check_split_fused_qkv(
    split_fused_qkv: Callable[[Tensor, int], tuple[Tensor, Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``split_fused_qkv(qkv, num_heads)``: ``(batch, len, 3·d_model)`` with the
    per-head layout → ``(q, k, v)``, each ``(batch, heads, len, head_dim)``."""
    return run_check(
        "split_fused_qkv",
        split_fused_qkv,
        reference_split_fused_qkv,
        _fused_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: multi-head attention from weight matrices
# --------------------------------------------------------------------------------------------


def reference_multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    w_o: Tensor,
    num_heads: int,
) -> tuple[Tensor, Tensor]:
    """Multi-head attention without biases, weights in the math convention ``y = x W``.

    Args:
        query: shape ``(batch, q_len, d_model)``.
        key: shape ``(batch, k_len, d_model)``.
        value: shape ``(batch, k_len, d_model)``.
        w_q: shape ``(d_model, num_heads · d_k)``; head ``h`` uses columns
            ``h·d_k … (h+1)·d_k - 1``.
        w_k: shape ``(d_model, num_heads · d_k)``.
        w_v: shape ``(d_model, num_heads · d_v)``.
        w_o: shape ``(num_heads · d_v, d_model)``.
        num_heads: number of heads.

    Returns:
        ``(output, weights)`` of shapes ``(batch, q_len, d_model)`` and
        ``(batch, num_heads, q_len, k_len)``.
    """
    batch, q_len, _ = query.shape
    k_len = key.shape[1]
    d_k = w_q.shape[1] // num_heads
    d_v = w_v.shape[1] // num_heads
    q = (query @ w_q).view(batch, q_len, num_heads, d_k).transpose(1, 2)  # (batch, h, q_len, d_k)
    k = (key @ w_k).view(batch, k_len, num_heads, d_k).transpose(1, 2)  # (batch, h, k_len, d_k)
    v = (value @ w_v).view(batch, k_len, num_heads, d_v).transpose(1, 2)  # (batch, h, k_len, d_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (batch, h, q_len, k_len)
    weights = torch.softmax(scores, dim=-1)  # (batch, h, q_len, k_len)
    heads = weights @ v  # (batch, h, q_len, d_v)
    merged = heads.transpose(1, 2).reshape(batch, q_len, num_heads * d_v)  # (batch, q_len, h·d_v)
    return merged @ w_o, weights  # (batch, q_len, d_model), (batch, h, q_len, k_len)


def _mha_cases() -> list[Case]:
    g = seeded_generator(303)
    shapes = [
        # (batch, q_len, k_len, d_model, num_heads, d_k, d_v)
        (2, 5, 5, 12, 3, 4, 4),  # self-attention, the chapter's sizes: every W is square
        (2, 4, 6, 12, 3, 4, 4),  # cross-attention: q_len != k_len
        (1, 4, 4, 8, 2, 3, 5),  # d_k != d_v and h·d_v = 10 != d_model: W_O is (10, 8)
        (3, 2, 5, 6, 3, 2, 4),  # h·d_v = 12 > d_model = 6
        (2, 3, 3, 8, 1, 8, 8),  # a single head: plain scaled dot-product attention
        (1, 4, 4, 16, 4, 4, 4),  # q_len = heads = d_k: a split without transpose fits
    ]
    cases: list[Case] = []
    for batch, q_len, k_len, d_model, heads, d_k, d_v in shapes:
        std = 1 / math.sqrt(d_model)
        cases.append(
            {
                "query": torch.randn(batch, q_len, d_model, generator=g),
                "key": torch.randn(batch, k_len, d_model, generator=g),
                "value": torch.randn(batch, k_len, d_model, generator=g),
                "w_q": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_k": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_v": std * torch.randn(d_model, heads * d_v, generator=g),
                "w_o": torch.randn(heads * d_v, d_model, generator=g) / math.sqrt(heads * d_v),
                "num_heads": heads,
            }
        )
    return cases


def check_multi_head_attention(
    multi_head_attention: Callable[..., tuple[Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``multi_head_attention(query, key, value, w_q, w_k, w_v, w_o, num_heads)`` →
    ``(output (batch, q_len, d_model), weights (batch, heads, q_len, k_len))``."""
    return run_check(
        "multi_head_attention",
        multi_head_attention,
        reference_multi_head_attention,
        _mha_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: grouped-query attention
# --------------------------------------------------------------------------------------------


def reference_grouped_query_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    w_o: Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> Tensor:
    """Grouped-query attention (Ainslie et al., 2023) without biases, math convention ``y = x W``.

    ``num_heads`` query heads share ``num_kv_heads`` key/value heads: query heads
    ``g·r … (g+1)·r - 1`` use key/value head ``g``, with ``r = num_heads / num_kv_heads``
    (``repeat_interleave``). ``num_kv_heads == num_heads`` is multi-head attention, 1 is
    multi-query attention.

    Args:
        query: shape ``(batch, q_len, d_model)``.
        key, value: shape ``(batch, k_len, d_model)``.
        w_q: shape ``(d_model, num_heads · d_k)``.
        w_k, w_v: shape ``(d_model, num_kv_heads · d_k)``.
        w_o: shape ``(num_heads · d_k, d_model)``.
        num_heads, num_kv_heads: numbers of query and of key/value heads.

    Returns:
        Shape ``(batch, q_len, d_model)``.
    """
    batch, q_len, _ = query.shape
    k_len = key.shape[1]
    d_k = w_q.shape[1] // num_heads
    group = num_heads // num_kv_heads
    q = (query @ w_q).view(batch, q_len, num_heads, d_k).transpose(1, 2)  # (batch, h, q_len, d_k)
    k = (key @ w_k).view(batch, k_len, num_kv_heads, d_k).transpose(1, 2)  # (batch, g, k_len, d_k)
    v = (
        (value @ w_v).view(batch, k_len, num_kv_heads, d_k).transpose(1, 2)
    )  # (batch, g, k_len, d_k)
    k = k.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k): kv head g for its r queries
    v = v.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)  # (batch, h, q, k)
    heads = weights @ v  # (batch, h, q_len, d_k)
    merged = heads.transpose(1, 2).reshape(batch, q_len, num_heads * d_k)  # (batch, q_len, h·d_k)
    return merged @ w_o  # (batch, q_len, d_model)


def _gqa_cases() -> list[Case]:
    g = seeded_generator(306)
    shapes = [
        # (batch, q_len, k_len, d_model, num_heads, num_kv_heads)
        (2, 5, 5, 16, 4, 2),  # two groups of two query heads
        (2, 3, 6, 24, 6, 3),  # cross-attention, groups of two
        (1, 4, 4, 32, 8, 2),  # groups of four: repeat and repeat_interleave differ
        (2, 4, 4, 12, 6, 2),  # groups of three
        (2, 3, 3, 16, 4, 1),  # multi-query attention: one key/value head
        (1, 5, 5, 12, 3, 3),  # groups of one: ordinary multi-head attention
    ]
    cases: list[Case] = []
    for batch, q_len, k_len, d_model, heads, kv_heads in shapes:
        d_k = d_model // heads
        std = 1 / math.sqrt(d_model)
        cases.append(
            {
                "query": torch.randn(batch, q_len, d_model, generator=g),
                "key": torch.randn(batch, k_len, d_model, generator=g),
                "value": torch.randn(batch, k_len, d_model, generator=g),
                "w_q": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_k": 2 * std * torch.randn(d_model, kv_heads * d_k, generator=g),
                "w_v": std * torch.randn(d_model, kv_heads * d_k, generator=g),
                "w_o": std * torch.randn(heads * d_k, d_model, generator=g),
                "num_heads": heads,
                "num_kv_heads": kv_heads,
            }
        )
    return cases


def check_grouped_query_attention(
    grouped_query_attention: Callable[..., Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``grouped_query_attention(query, key, value, w_q, w_k, w_v, w_o, num_heads,
    num_kv_heads)`` → ``(batch, q_len, d_model)``."""
    return run_check(
        "grouped_query_attention",
        grouped_query_attention,
        reference_grouped_query_attention,
        _gqa_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: parameters of multi-head, grouped-query and multi-query attention
# --------------------------------------------------------------------------------------------


def reference_attention_parameter_count(
    d_model: int, num_heads: int, num_kv_heads: int, bias: bool
) -> int:
    """Parameters of one attention block whose ``num_heads`` query heads share
    ``num_kv_heads`` key/value heads (MHA: ``num_kv_heads = num_heads``; MQA: 1; GQA: between).

    Every head has width ``head_dim = d_model / num_heads``. ``W_Q`` and ``W_O`` are
    ``d_model × d_model``; ``W_K`` and ``W_V`` are ``d_model × (num_kv_heads · head_dim)``;
    with ``bias`` each projection also has one bias per output.
    """
    head_dim = d_model // num_heads
    kv_dim = num_kv_heads * head_dim
    weights = 2 * d_model * d_model + 2 * d_model * kv_dim  # W_Q, W_O; W_K, W_V
    biases = 2 * d_model + 2 * kv_dim if bias else 0
    return weights + biases


def _parameter_cases() -> list[Case]:
    # (d_model, num_heads, num_kv_heads, bias)
    settings = [
        (12, 3, 3, True),  # the walk-through's module: 4·144 + 4·12 = 624
        (512, 8, 8, True),  # the paper's base model: 1,050,624
        (512, 8, 8, False),
        (4096, 32, 8, False),  # grouped-query attention, 8 key/value heads
        (4096, 32, 1, False),  # multi-query attention
        (64, 4, 2, True),  # GQA with biases
        (8, 2, 1, True),
    ]
    return [{"d_model": d, "num_heads": h, "num_kv_heads": g, "bias": b} for d, h, g, b in settings]


def check_attention_parameter_count(
    attention_parameter_count: Callable[[int, int, int, bool], int], verbose: bool = True
) -> CheckResult:
    """Check ``attention_parameter_count(d_model, num_heads, num_kv_heads, bias)`` (exact)."""
    return run_check(
        "attention_parameter_count",
        attention_parameter_count,
        reference_attention_parameter_count,
        _parameter_cases(),
        atol=0.0,
        rtol=0.0,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 5: the key/value cache, in bytes
# --------------------------------------------------------------------------------------------


def reference_kv_cache_bytes(
    seq_len: int,
    num_layers: int,
    d_model: int,
    num_heads: int,
    num_kv_heads: int,
    bytes_per_value: int,
    batch: int,
) -> int:
    """Bytes needed to cache the keys *and* values of ``seq_len`` tokens in every layer.

    Each layer stores, per sequence and per token, one key and one value vector for each of the
    ``num_kv_heads`` key/value heads, each of ``head_dim = d_model / num_heads`` numbers.
    """
    head_dim = d_model // num_heads
    values_per_token = 2 * num_kv_heads * head_dim  # one key + one value per key/value head
    return batch * seq_len * num_layers * values_per_token * bytes_per_value


def _kv_cases() -> list[Case]:
    # (seq_len, num_layers, d_model, num_heads, num_kv_heads, bytes_per_value, batch)
    settings = [
        (4096, 1, 4096, 32, 32, 2, 1),  # MHA, one layer: 64 MiB in fp16
        (4096, 1, 4096, 32, 8, 2, 1),  # GQA: 16 MiB
        (4096, 1, 4096, 32, 1, 2, 1),  # MQA: 2 MiB
        (4096, 32, 4096, 32, 8, 2, 4),  # a batch of 4 through 32 layers
        (100, 6, 512, 8, 8, 4, 3),  # the paper's base model in fp32
        (7, 2, 12, 3, 1, 1, 2),  # int8, tiny
    ]
    return [
        {
            "seq_len": n,
            "num_layers": layers,
            "d_model": d,
            "num_heads": h,
            "num_kv_heads": g,
            "bytes_per_value": size,
            "batch": batch,
        }
        for n, layers, d, h, g, size, batch in settings
    ]


def check_kv_cache_bytes(kv_cache_bytes: Callable[..., int], verbose: bool = True) -> CheckResult:
    """Check ``kv_cache_bytes(seq_len, num_layers, d_model, num_heads, num_kv_heads,
    bytes_per_value, batch)`` (exact)."""
    return run_check(
        "kv_cache_bytes",
        kv_cache_bytes,
        reference_kv_cache_bytes,
        _kv_cases(),
        atol=0.0,
        rtol=0.0,
        verbose=verbose,
    )
