"""Attention: scaled dot-product attention (chapters 1-2) and multi-head attention (chapter 3).

Mask convention for the whole package: a boolean mask is ``True`` where a query **may attend**
to a key, ``False`` where it is blocked (the convention of
``torch.nn.functional.scaled_dot_product_attention``). See :mod:`companion.masking` to build
masks and to convert from/to the opposite convention used by ``torch.nn.MultiheadAttention``.

A query whose keys are *all* blocked gets all-zero attention weights and therefore an
all-zero output vector - never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import (
    check_bool_mask,
    check_floating,
    check_min_ndim,
    check_positive_int,
    check_probability,
    shape_str,
)

__all__ = ["scaled_dot_product_attention", "AdditiveScore"]


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Validate ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``, ``v (..., k_len, d_v)``."""
    check_floating("q", q)
    check_floating("k", k)
    check_floating("v", v)
    check_min_ndim("q", q, 2, "(..., q_len, d_k)")
    check_min_ndim("k", k, 2, "(..., k_len, d_k)")
    check_min_ndim("v", v, 2, "(..., k_len, d_v)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k must have the same last dimension d_k as q: q has shape {shape_str(q.shape)}, "
            f"so k must be (..., k_len, {q.shape[-1]}), got {shape_str(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key: k has shape {shape_str(k.shape)}, so v must be "
            f"(..., {k.shape[-2]}, d_v), got {shape_str(v.shape)}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "q, k and v must have identical leading (batch) dimensions - nothing is broadcast: "
            f"got q {shape_str(q.shape)}, k {shape_str(k.shape)}, v {shape_str(v.shape)}"
        )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Attention written out step by step: ``softmax(q kᵀ / √d_k) v``.

    Args:
        q: queries, shape ``(..., q_len, d_k)``; any leading (batch, head) dimensions.
        k: keys, shape ``(..., k_len, d_k)``; same leading dimensions as ``q``.
        v: values, shape ``(..., k_len, d_v)``; same leading dimensions as ``q``.
        mask: optional boolean tensor, ``True`` where a query may attend to a key; it must
            broadcast to the score shape ``(..., q_len, k_len)`` (e.g. ``(batch, 1, 1, k_len)``
            for padding, ``(q_len, k_len)`` for a causal mask).
        dropout_p: probability of dropping an attention weight (applied to the weights that
            multiply ``v``; the returned weights are the ones *before* dropout).
        scale: factor applied to the scores; default ``1/√d_k``. Pass ``1.0`` to see what
            happens without scaling (chapter 2).

    Returns:
        ``(output, weights)``: output of shape ``(..., q_len, d_v)`` and weights of shape
        ``(..., q_len, k_len)`` whose rows sum to 1 (or are all zero for a query that may
        attend to no key at all).
    """
    _check_qkv(q, k, v)
    dropout_p = check_probability("dropout_p", dropout_p)
    q_len, k_len = q.shape[-2], k.shape[-2]
    score_shape = (*q.shape[:-2], q_len, k_len)
    if mask is not None:
        check_bool_mask("mask", mask, score_shape, "the scores (..., q_len, k_len)")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    scores = (q @ k.transpose(-2, -1)) * scale  # (..., q_len, k_len)
    if mask is not None:
        # The most negative finite number, not -inf: a fully blocked row then gives a finite
        # (uniform) softmax instead of 0/0 = NaN, and is set to zero just below.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # (..., q_len, k_len)
    weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # (..., q_len, k_len) blocked keys get 0
    mixed = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights  # (..., q_len, k_len)
    output = mixed @ v  # (..., q_len, d_v)
    return output, weights


class AdditiveScore(nn.Module):
    r"""Additive (Bahdanau) relevance score ``α(q, k) = wᵀ tanh(W_q q + W_k k)``.

    The alternative to the dot product from chapter 1: a tiny one-hidden-layer network scores
    every (query, key) pair. It has parameters of its own and costs
    ``O(q_len · k_len · d_hidden)`` work instead of one matrix product.

    Args:
        d_query: size of a query vector.
        d_key: size of a key vector.
        d_hidden: width of the hidden layer.
    """

    def __init__(self, d_query: int, d_key: int, d_hidden: int) -> None:
        super().__init__()
        check_positive_int("d_query", d_query)
        check_positive_int("d_key", d_key)
        check_positive_int("d_hidden", d_hidden)
        self.query_proj = nn.Linear(d_query, d_hidden, bias=False)
        self.key_proj = nn.Linear(d_key, d_hidden, bias=False)
        self.score_proj = nn.Linear(d_hidden, 1, bias=False)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """Scores for every pair: ``q (..., q_len, d_query)``, ``k (..., k_len, d_key)`` →
        ``(..., q_len, k_len)``."""
        check_floating("q", q)
        check_floating("k", k)
        check_min_ndim("q", q, 2, "(..., q_len, d_query)")
        check_min_ndim("k", k, 2, "(..., k_len, d_key)")
        if q.shape[-1] != self.query_proj.in_features:
            raise ValueError(
                f"q must be (..., q_len, {self.query_proj.in_features}), got {shape_str(q.shape)}"
            )
        if k.shape[-1] != self.key_proj.in_features:
            raise ValueError(
                f"k must be (..., k_len, {self.key_proj.in_features}), got {shape_str(k.shape)}"
            )
        if q.shape[:-2] != k.shape[:-2]:
            raise ValueError(
                "q and k must have identical leading dimensions, "
                f"got q {shape_str(q.shape)} and k {shape_str(k.shape)}"
            )
        hq = self.query_proj(q).unsqueeze(-2)  # (..., q_len, 1, d_hidden)
        hk = self.key_proj(k).unsqueeze(-3)  # (..., 1, k_len, d_hidden)
        return self.score_proj(torch.tanh(hq + hk)).squeeze(-1)  # (..., q_len, k_len)
