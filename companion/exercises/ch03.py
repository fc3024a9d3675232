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
split ``d_model`` into heads       :func:`check_split_heads`
merge the heads back               :func:`check_merge_heads`
multi-head attention from weights  :func:`check_multi_head_attention`
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
    "check_split_heads",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_attention_parameter_count",
    "check_kv_cache_bytes",
    "reference_split_heads",
    "reference_merge_heads",
    "reference_multi_head_attention",
    "reference_attention_parameter_count",
    "reference_kv_cache_bytes",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: split d_model into heads
# --------------------------------------------------------------------------------------------


def reference_split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Cut every vector into ``num_heads`` consecutive slices and move the heads forward.

    Args:
        x: projected queries, keys or values, shape ``(batch, len, d_model)``.
        num_heads: number of heads; divides ``d_model``.

    Returns:
        Shape ``(batch, num_heads, len, d_model / num_heads)``; ``result[:, h]`` holds
        features ``h·head_dim … (h+1)·head_dim - 1`` of every position.
    """
    batch, length, d_model = x.shape
    split = x.view(batch, length, num_heads, d_model // num_heads)  # (batch, len, heads, head_dim)
    return split.transpose(1, 2)  # (batch, heads, len, head_dim)


def _split_cases() -> list[Case]:
    g = seeded_generator(301)
    shapes = [
        # (batch, len, d_model, num_heads)
        (2, 5, 12, 3),  # the chapter's walk-through
        (1, 3, 8, 2),
        (3, 4, 16, 4),  # len = heads = head_dim = 4: a reshape without transpose fits
        (2, 2, 4, 2),  # len = heads = head_dim = 2, likewise
        (2, 6, 6, 1),  # one head: nothing to split
        (2, 1, 6, 6),  # head_dim = 1
    ]
    return [
        {"x": torch.randn(batch, length, d_model, generator=g), "num_heads": heads}
        for batch, length, d_model, heads in shapes
    ]


def check_split_heads(
    split_heads: Callable[[Tensor, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``split_heads(x, num_heads)``: ``(batch, len, d_model)`` →
    ``(batch, heads, len, head_dim)``."""
    return run_check(
        "split_heads", split_heads, reference_split_heads, _split_cases(), verbose=verbose
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: merge the heads back (concatenation)
# --------------------------------------------------------------------------------------------


def reference_merge_heads(x: Tensor) -> Tensor:
    """Concatenate the heads of every position: the inverse of :func:`reference_split_heads`.

    Args:
        x: per-head outputs, shape ``(batch, heads, len, head_dim)``.

    Returns:
        Shape ``(batch, len, heads · head_dim)``: position ``t`` is
        ``concat(x[:, 0, t], x[:, 1, t], …)``.
    """
    batch, heads, length, head_dim = x.shape
    heads_last = x.transpose(1, 2)  # (batch, len, heads, head_dim)
    return heads_last.reshape(batch, length, heads * head_dim)  # (batch, len, heads * head_dim)


def _merge_cases() -> list[Case]:
    g = seeded_generator(302)
    shapes = [
        # (batch, heads, len, head_dim)
        (2, 3, 5, 4),  # the chapter's walk-through
        (1, 2, 3, 4),
        (3, 4, 4, 4),  # heads = len: a reshape without transpose fits
        (2, 2, 2, 2),
        (2, 1, 6, 6),  # one head
        (2, 6, 1, 1),  # one position
    ]
    return [{"x": torch.randn(*shape, generator=g)} for shape in shapes]


def check_merge_heads(merge_heads: Callable[[Tensor], Tensor], verbose: bool = True) -> CheckResult:
    """Check ``merge_heads(x)``: ``(batch, heads, len, head_dim)`` →
    ``(batch, len, heads · head_dim)``."""
    return run_check(
        "merge_heads", merge_heads, reference_merge_heads, _merge_cases(), verbose=verbose
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: multi-head attention from weight matrices
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
