"""Attention without the whole score matrix: FlashAttention's algorithm and local
(sliding-window) attention.

The formula ``softmax(q kᵀ · scale) v`` seems to need the ``(q_len, k_len)`` matrix of scores,
which grows as ``n²``: 64 MiB for one head of 4,096 tokens in float32. It does not:

* :func:`naive_attention` - the reference that *does* build the matrix (so its memory grows
  as ``n²``).
* :func:`blockwise_attention` - FlashAttention's algorithm (Dao et al. 2022) written in plain
  PyTorch, its backward in FlashAttention-2's form (Dao 2023: one saved statistic per row, the
  log-sum-exp, where FlashAttention-1 saved the row maximum and the row sum): keys and values
  are visited one block at a time with an *online softmax* (a running row maximum and a running
  row sum, and a running output rescaled whenever the maximum grows), and the backward pass
  recomputes each block's probabilities from ``q``, ``k``, the output and the row log-sum-exp
  instead of storing them. Neither pass holds more than a block of scores.
  :func:`blockwise_forward` and :func:`blockwise_backward` are the two passes,
  :class:`BlockwiseAttention` joins them for autograd.
* :func:`sliding_window_attention` - local attention that computes only the band of
  :func:`companion.masking.sliding_window_mask`, chunk by chunk: ``O(n·window)`` time and
  memory where the masked full attention pays ``O(n²)``.

Written for reading, not speed: the Python loops over blocks are what a GPU kernel does inside
its on-chip memory. :mod:`companion.measure` measures the memory of each, and which of
torch's fused kernels (``torch.nn.functional.scaled_dot_product_attention``) runs here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from companion._validation import (
    check_bool,
    check_bool_mask,
    check_finite,
    check_finite_float,
    check_positive_int,
    check_qkv,
    shape_str,
)
from companion.masking import sliding_window_mask_at

__all__ = [
    "naive_attention",
    "blockwise_attention",
    "blockwise_forward",
    "blockwise_backward",
    "BlockwiseAttention",
    "sliding_window_attention",
]


# ---------------------------------------------------------------------------------------------
# The reference: the whole (q_len, k_len) matrix at once
# ---------------------------------------------------------------------------------------------


def naive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """``softmax(q kᵀ · scale) v`` with the whole score matrix built (memory ``∝ q_len·k_len``).

    Args:
        q: queries ``(..., q_len, d)``.
        k: keys ``(..., k_len, d)``, same leading dimensions as ``q``.
        v: values ``(..., k_len, d_v)``, same leading dimensions as ``q``.
        mask: optional boolean mask, ``True`` = may attend, broadcasting to
            ``(..., q_len, k_len)``.
        is_causal: block the keys after each query (bottom-right aligned when
            ``k_len > q_len``, as :func:`companion.masking.causal_mask`).
        scale: factor on the scores; default ``1/√d``.

    Returns:
        Output ``(..., q_len, d_v)``; a query that may attend to no key gets zeros.
    """
    scale = _check_inputs(q, k, v, mask, is_causal, scale)
    allowed = _full_mask(q, k, mask, is_causal)  # None or broadcasts to (..., q_len, k_len)
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., q_len, k_len)
    if allowed is None:
        return torch.softmax(scores, dim=-1) @ v  # (..., q_len, d_v)
    # The most negative finite number, not -inf, so a fully blocked row gives no 0/0.
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # (..., q_len, k_len)
    weights = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)  # (..., q_len, k_len)
    return weights @ v  # (..., q_len, d_v)


# ---------------------------------------------------------------------------------------------
# FlashAttention's algorithm: forward with the online softmax, backward by recomputation
# ---------------------------------------------------------------------------------------------


def blockwise_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block_size: int = 64,
    is_causal: bool = False,
    scale: float | None = None,
    mask: Tensor | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention computed block by block, never holding the ``(q_len, k_len)`` score matrix.

    Equal to :func:`naive_attention` (to rounding), forward and backward. The forward pass runs
    :func:`blockwise_forward`; the gradients come from :func:`blockwise_backward`, which
    recomputes each block's probabilities, so memory grows as ``n`` in both passes (plus one
    ``block_size × block_size`` block of scores at a time).

    Args:
        q: queries ``(..., q_len, d)``.
        k: keys ``(..., k_len, d)``, same leading dimensions as ``q``.
        v: values ``(..., k_len, d_v)``, same leading dimensions as ``q``.
        block_size: rows of queries and of keys per block, at least 1; need not divide the
            lengths (the last block is shorter).
        is_causal: block the keys after each query, bottom-right aligned when
            ``k_len > q_len`` (as :func:`companion.masking.causal_mask`); key blocks wholly in
            a query block's future are skipped, not computed.
        scale: factor on the scores; default ``1/√d``.
        mask: optional boolean mask (``True`` = may attend) broadcasting to
            ``(..., q_len, k_len)``, e.g. padding ``(batch, 1, 1, k_len)``; it is read one
            block at a time through a broadcast view.
        return_lse: also return the log-sum-exp of each row's scores.

    Returns:
        Output ``(..., q_len, d_v)`` - a query that may attend to no key gets zeros - or, with
        ``return_lse=True``, ``(output, lse)`` with ``lse`` of shape ``(..., q_len)``:
        ``log Σ_j exp(score_ij)`` over the keys row ``i`` may attend to (``-inf`` for a row
        with none). Both are differentiable.
    """
    scale = _check_inputs(q, k, v, mask, is_causal, scale)
    check_positive_int("block_size", block_size)
    check_bool("return_lse", return_lse)
    output, lse = BlockwiseAttention.apply(q, k, v, mask, block_size, is_causal, scale)
    return (output, lse) if return_lse else output


class BlockwiseAttention(torch.autograd.Function):
    """Autograd glue: forward by :func:`blockwise_forward`, backward by
    :func:`blockwise_backward`. What it saves for the backward pass is ``q``, ``k``, ``v``,
    the output and the row log-sum-exp, ``O(n·d)``, and the caller's mask if there is one (a
    padding mask is ``O(n)``): no ``n × n`` matrix of its own.

    Call it through :func:`blockwise_attention`, which checks the inputs:
    ``BlockwiseAttention.apply(q, k, v, mask, block_size, is_causal, scale)`` →
    ``(output (..., q_len, d_v), lse (..., q_len))``.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        block_size: int,
        is_causal: bool,
        scale: float,
    ) -> tuple[Tensor, Tensor]:
        output, lse = blockwise_forward(
            q, k, v, block_size=block_size, is_causal=is_causal, scale=scale, mask=mask
        )  # (..., q_len, d_v), (..., q_len)
        ctx.save_for_backward(q, k, v, output, lse, mask)
        ctx.settings = (block_size, is_causal, scale)  # type: ignore[attr-defined]
        return output, lse

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_output: Tensor, grad_lse: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, None, None, None, None]:
        q, k, v, output, lse, mask = ctx.saved_tensors
        block_size, is_causal, scale = ctx.settings
        grad_q, grad_k, grad_v = blockwise_backward(
            q,
            k,
            v,
            output,
            lse,
            grad_output,
            grad_lse,
            block_size=block_size,
            is_causal=is_causal,
            scale=scale,
            mask=mask,
        )  # shapes of q, k, v
        return grad_q, grad_k, grad_v, None, None, None, None


def blockwise_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block_size: int,
    is_causal: bool,
    scale: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """FlashAttention's forward pass: the online softmax over blocks of keys.

    For each block of queries, the keys and values are read one block at a time. Each row keeps
    three running quantities (the course writes ŝ and z; Dao et al. write m and ℓ): the largest
    score seen so far ``ŝ``, the sum ``z`` of ``exp(score - ŝ)`` over the keys seen so far, and
    the output so far (``Σ exp(score - ŝ) v``, not yet divided by ``z``). When a new block
    raises the maximum from ``ŝ`` to ``ŝ'``, what was
    summed under ``ŝ`` is multiplied by ``exp(ŝ - ŝ')`` - the *rescaling* - so that every term is
    relative to the same maximum. At the end the output is divided by ``z`` once, and
    ``ŝ + log z`` is the row's log-sum-exp, which the backward pass needs.

    No input checks (see :func:`blockwise_attention`).

    Args:
        q: ``(..., q_len, d)``; k: ``(..., k_len, d)``; v: ``(..., k_len, d_v)``.
        block_size: rows per block of queries and of keys.
        is_causal: block future keys (bottom-right aligned).
        scale: factor on the scores.
        mask: ``None`` or a boolean mask broadcasting to ``(..., q_len, k_len)``.

    Returns:
        ``(output, lse)``: ``(..., q_len, d_v)`` and ``(..., q_len)``.
    """
    q_len, d_v = q.shape[-2], v.shape[-1]
    output = q.new_zeros(*q.shape[:-1], d_v)  # (..., q_len, d_v)
    lse = q.new_zeros(q.shape[:-1])  # (..., q_len)
    full_mask = _mask_view(q, k, mask)  # None or a view (..., q_len, k_len), no copy
    for q_start, q_end in _blocks(0, q_len, block_size):
        q_block = q[..., q_start:q_end, :] * scale  # (..., bq, d)
        row_max = q.new_full(q_block.shape[:-1], float("-inf"))  # (..., bq)  ŝ
        row_sum = q.new_zeros(q_block.shape[:-1])  # (..., bq)  z
        accumulated = q.new_zeros(*q_block.shape[:-1], d_v)  # (..., bq, d_v)
        for k_start, k_end in _key_blocks(q_start, q_end, q_len, k, block_size, is_causal):
            scores = q_block @ k[..., k_start:k_end, :].transpose(-2, -1)  # (..., bq, bk)
            scores = _block_mask(scores, full_mask, q_len, k, q_start, k_start, is_causal)
            new_max = torch.maximum(row_max, scores.amax(dim=-1))  # (..., bq)  ŝ'
            shift = _finite(new_max)  # (..., bq) a row with no key yet subtracts 0, not -inf
            probs = torch.exp(scores - shift[..., None])  # (..., bq, bk) unnormalised
            rescale = torch.exp(row_max - shift)  # (..., bq) exp(ŝ - ŝ'), 0 for the first keys
            row_sum = row_sum * rescale + probs.sum(dim=-1)  # (..., bq)
            accumulated = accumulated * rescale[..., None] + probs @ v[..., k_start:k_end, :]
            row_max = new_max  # (..., bq)
        # A row that saw a key has z >= 1 (its maximum contributes exp(0)); a row that saw none
        # has z = 0 and a zero sum: divide it by 1 to keep its zeros.
        safe_sum = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))  # (..., bq)
        output[..., q_start:q_end, :] = accumulated / safe_sum[..., None]  # (..., bq, d_v)
        lse[..., q_start:q_end] = row_max + torch.log(row_sum)  # (..., bq) -inf when no key
    return output, lse


def blockwise_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    output: Tensor,
    lse: Tensor,
    grad_output: Tensor,
    grad_lse: Tensor | None = None,
    *,
    block_size: int,
    is_causal: bool,
    scale: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention's backward pass: recompute each block's probabilities, never store them.

    Recomputation is FlashAttention-1's idea already (Dao et al. 2022). The probabilities are
    recomputed from one saved log-sum-exp per row, as FlashAttention-2 (Dao 2023) does. The loop
    order (query blocks outside) is chosen for reading: FlashAttention-2's backward loops over
    key/value blocks outside, so that ``dK`` and ``dV`` build up in on-chip memory.

    With ``S = scale · q kᵀ``, ``P = softmax(S)`` and ``O = P v``, the gradients are
    ``dV = Pᵀ dO``, ``dP = dO vᵀ``, ``dS = P ∘ (dP - D)`` with ``D_i = Σ_j P_ij dP_ij``, then
    ``dq = scale · dS k`` and ``dk = scale · dSᵀ q``. Two facts make this blockwise:
    ``P_ij = exp(S_ij - lse_i)`` can be recomputed for one block from the saved log-sum-exp,
    and ``D_i = Σ_j P_ij (dO_i · v_j) = dO_i · O_i`` needs only the saved output. A gradient
    reaching ``lse`` adds ``P ∘ d(lse)`` to ``dS`` (``∂lse_i/∂S_ij = P_ij``), i.e. it is
    subtracted from ``D``.

    No input checks (see :func:`blockwise_attention`).

    Args:
        q, k, v, block_size, is_causal, scale, mask: as in :func:`blockwise_forward`.
        output: the forward output ``(..., q_len, d_v)``.
        lse: the forward log-sum-exp ``(..., q_len)``.
        grad_output: gradient of the loss with respect to ``output``, ``(..., q_len, d_v)``.
        grad_lse: gradient with respect to ``lse``, ``(..., q_len)``, or ``None``.

    Returns:
        ``(grad_q, grad_k, grad_v)`` with the shapes of ``q``, ``k``, ``v``.
    """
    q_len = q.shape[-2]
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (grad_output * output).sum(dim=-1)  # (..., q_len)  D
    if grad_lse is not None:
        delta = delta - grad_lse  # (..., q_len)
    row_lse = _finite(lse)  # (..., q_len) a row with no key has only -inf scores: exp gives 0
    full_mask = _mask_view(q, k, mask)  # None or a view (..., q_len, k_len), no copy
    for q_start, q_end in _blocks(0, q_len, block_size):
        q_block = q[..., q_start:q_end, :] * scale  # (..., bq, d)
        grad_out_block = grad_output[..., q_start:q_end, :]  # (..., bq, d_v)
        lse_block = row_lse[..., q_start:q_end, None]  # (..., bq, 1)
        delta_block = delta[..., q_start:q_end, None]  # (..., bq, 1)
        for k_start, k_end in _key_blocks(q_start, q_end, q_len, k, block_size, is_causal):
            k_block = k[..., k_start:k_end, :]  # (..., bk, d)
            v_block = v[..., k_start:k_end, :]  # (..., bk, d_v)
            scores = q_block @ k_block.transpose(-2, -1)  # (..., bq, bk)
            scores = _block_mask(scores, full_mask, q_len, k, q_start, k_start, is_causal)
            probs = torch.exp(scores - lse_block)  # (..., bq, bk) the softmax, recomputed
            grad_v[..., k_start:k_end, :] += probs.transpose(-2, -1) @ grad_out_block
            grad_probs = grad_out_block @ v_block.transpose(-2, -1)  # (..., bq, bk)  dP
            grad_scores = probs * (grad_probs - delta_block)  # (..., bq, bk)  dS
            grad_q[..., q_start:q_end, :] += (grad_scores @ k_block) * scale  # (..., bq, d)
            grad_k[..., k_start:k_end, :] += grad_scores.transpose(-2, -1) @ q_block
    return grad_q, grad_k, grad_v


def _blocks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """``(begin, end)`` of consecutive blocks of ``size`` covering ``[start, stop)``; the last
    one may be shorter."""
    for begin in range(start, stop, size):
        yield begin, min(begin + size, stop)


def _key_blocks(
    q_start: int, q_end: int, q_len: int, k: Tensor, block_size: int, is_causal: bool
) -> Iterator[tuple[int, int]]:
    """The key blocks a block of queries ``[q_start, q_end)`` needs: all of them, or with
    ``is_causal`` only those up to its last query's position (``q_end - 1 + k_len - q_len``);
    later blocks are wholly in the future and are skipped."""
    k_len = k.shape[-2]
    stop = min(k_len, q_end + k_len - q_len) if is_causal else k_len
    return _blocks(0, stop, block_size)


def _mask_view(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor | None:
    """The mask broadcast to ``(..., q_len, k_len)`` as a view (no memory), or ``None``."""
    if mask is None:
        return None
    return mask.expand(*q.shape[:-2], q.shape[-2], k.shape[-2])  # (..., q_len, k_len) a view


def _block_mask(
    scores: Tensor,
    full_mask: Tensor | None,
    q_len: int,
    k: Tensor,
    q_start: int,
    k_start: int,
    is_causal: bool,
) -> Tensor:
    """Set the blocked entries of one block of scores ``(..., bq, bk)`` to ``-inf``."""
    block_q, block_k = scores.shape[-2], scores.shape[-1]
    if is_causal:
        offset = k.shape[-2] - q_len  # query i sits at position i + offset
        query_pos = torch.arange(q_start, q_start + block_q, device=scores.device) + offset
        key_pos = torch.arange(k_start, k_start + block_k, device=scores.device)  # (bk,)
        future = key_pos[None, :] > query_pos[:, None]  # (bq, bk)
        scores = scores.masked_fill(future, float("-inf"))  # (..., bq, bk)
    if full_mask is not None:
        allowed = full_mask[..., q_start : q_start + block_q, k_start : k_start + block_k]
        scores = scores.masked_fill(~allowed, float("-inf"))  # (..., bq, bk)
    return scores


def _finite(x: Tensor) -> Tensor:
    """``x`` with ``-inf`` replaced by 0 (a row that has no key so far)."""
    return torch.where(torch.isinf(x), torch.zeros_like(x), x)  # shape of x


# ---------------------------------------------------------------------------------------------
# Local attention that computes only the band
# ---------------------------------------------------------------------------------------------


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool = True,
    scale: float | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Sliding-window attention that computes only the band: ``O(n·window)`` time and memory.

    Equal to full attention with the mask ``sliding_window_mask(q_len, k_len, window=window,
    causal=causal)`` (same definition of ``window``: a query at position ``i`` sees the keys
    ``j`` with ``|i - j| < window``, and ``j <= i`` when ``causal``), but the queries are taken
    ``chunk_size`` at a time and each chunk is scored only against the keys its band can
    reach: ``chunk_size + window - 1`` keys (causal) or ``chunk_size + 2·window - 2``, not
    ``k_len``. The full attention, masked, still computes and stores all ``q_len × k_len``
    scores. Plain autograd gives the gradients; what it saves is also ``O(n·window)``.

    Args:
        q: queries ``(..., q_len, d)``.
        k: keys ``(..., k_len, d)``, ``k_len >= q_len`` (queries are the last ``q_len``
            positions, as in :func:`companion.masking.causal_mask`).
        v: values ``(..., k_len, d_v)``.
        window: the band's size, at least 1.
        causal: also block the keys after each query (default, as in a decoder).
        scale: factor on the scores; default ``1/√d``.
        chunk_size: queries per chunk; default ``max(window, 64)``.

    Returns:
        Output ``(..., q_len, d_v)``.
    """
    _check_qkv(q, k, v)
    scale = _check_scale(scale, q.shape[-1])
    check_positive_int("window", window)
    check_bool("causal", causal)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    q_len, k_len = q.shape[-2], k.shape[-2]
    if k_len < q_len:
        raise ValueError(
            f"k must have at least as many positions as q (queries are the last q_len "
            f"positions), got q {shape_str(q.shape)} and k {shape_str(k.shape)}"
        )
    chunk = chunk_size if chunk_size is not None else max(window, 64)
    offset = k_len - q_len  # query i sits at position i + offset
    reach_ahead = 0 if causal else window - 1  # how far past its own position a query sees
    outputs = []
    for q_start, q_end in _blocks(0, q_len, chunk):
        k_start = max(0, q_start + offset - (window - 1))  # first key the chunk's band reaches
        k_end = min(k_len, q_end + offset + reach_ahead)  # one past the last one
        query_pos = torch.arange(q_start, q_end, device=q.device) + offset  # (c,)
        key_pos = torch.arange(k_start, k_end, device=q.device)  # (keys,)
        band = sliding_window_mask_at(query_pos, key_pos, window=window, causal=causal)
        q_chunk = q[..., q_start:q_end, :] * scale  # (..., c, d)
        scores = q_chunk @ k[..., k_start:k_end, :].transpose(-2, -1)  # (..., c, keys)
        scores = scores.masked_fill(~band, float("-inf"))  # (..., c, keys) each row sees itself
        weights = torch.softmax(scores, dim=-1)  # (..., c, keys)
        outputs.append(weights @ v[..., k_start:k_end, :])  # (..., c, d_v)
    if not outputs:  # no query
        return q.new_zeros(*q.shape[:-1], v.shape[-1])  # (..., 0, d_v)
    return torch.cat(outputs, dim=-2)  # (..., q_len, d_v)


# ---------------------------------------------------------------------------------------------
# Input checks, shared by the public functions above
# ---------------------------------------------------------------------------------------------


def _check_inputs(
    q: object, k: object, v: object, mask: object, is_causal: object, scale: object
) -> float:
    """Check the arguments of :func:`naive_attention` and :func:`blockwise_attention`; return
    the scale to use."""
    _check_qkv(q, k, v)
    assert isinstance(q, Tensor) and isinstance(k, Tensor)
    check_bool("is_causal", is_causal)
    if is_causal and k.shape[-2] < q.shape[-2]:
        raise ValueError(
            f"is_causal needs k_len >= q_len (queries are the last q_len positions), got "
            f"q {shape_str(q.shape)} and k {shape_str(k.shape)}"
        )
    if mask is not None:
        score_shape = (*q.shape[:-2], q.shape[-2], k.shape[-2])
        check_bool_mask("mask", mask, score_shape, "the scores (..., q_len, k_len)")
    return _check_scale(scale, q.shape[-1])


def _check_qkv(q: object, k: object, v: object) -> None:
    """:func:`~companion._validation.check_qkv`, then finite values (NaN in, NaN out otherwise)."""
    check_qkv(q, k, v)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        check_finite(name, tensor)


def _check_scale(scale: object, d: int) -> float:
    """``scale`` checked (a finite number), or ``1/√d`` for ``None``."""
    if scale is None:
        return 1.0 / math.sqrt(d) if d > 0 else 1.0
    return check_finite_float("scale", scale, "a finite number or None")


def _full_mask(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor | None:
    """The mask and the causal rule as one boolean mask broadcasting to the scores, or None."""
    if not is_causal:
        return mask
    q_len, k_len = q.shape[-2], k.shape[-2]
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)  # (q_len, k_len)
    causal = ones.tril(diagonal=k_len - q_len)  # (q_len, k_len) causal_mask's rule, any length
    return causal if mask is None else causal & mask  # broadcasts to (..., q_len, k_len)
