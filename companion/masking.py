"""Attention masks: padding, causal, combining them, and converting between conventions.

The mask convention of the whole package
========================================

**A boolean mask is** ``True`` **where a query may attend to a key** and ``False`` where it is
blocked. This is the convention of ``torch.nn.functional.scaled_dot_product_attention``.

A mask must *broadcast* to the score shape ``(batch, heads, q_len, k_len)``; the usual shapes
are

===================================  ==========================  ============================
mask                                 shape                       built by
===================================  ==========================  ============================
padding (which keys are real)        ``(batch, 1, 1, k_len)``    :func:`padding_mask`
causal (no peeking ahead)            ``(q_len, k_len)``          :func:`causal_mask`
both                                 ``(batch, 1, q_len, k_len)`` :func:`combine_masks`
===================================  ==========================  ============================

A query row whose keys are *all* blocked (e.g. a sequence made only of padding) gets all-zero
attention weights and an all-zero output - never NaN (``softmax`` of a row of ``-inf`` would be
``0/0``).

``torch.nn.MultiheadAttention`` and ``torch.nn.Transformer`` use the **opposite** convention
(``True`` = *blocked*) for ``key_padding_mask`` and boolean ``attn_mask``, and also accept
*additive* float masks (``0`` = may attend, ``-inf`` = blocked). Convert additive masks with
:func:`from_additive_mask` and :func:`to_additive_mask`, and torch's boolean masks with the
converters of :mod:`companion.interop`; never flip a mask by hand.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion._validation import (
    check_bool_tensor,
    check_floating,
    check_integer,
    check_ndim,
    check_positive_int,
    checks_enabled,
    shape_str,
)

__all__ = [
    "padding_mask",
    "causal_mask",
    "combine_masks",
    "from_additive_mask",
    "to_additive_mask",
]

#: Additive-mask values at or below this count as "blocked" in :func:`from_additive_mask`
#: (``-inf``, ``-1e9``, ``torch.finfo(dtype).min`` and the fp16-era ``-1e4`` all qualify).
ADDITIVE_BLOCKED_AT_OR_BELOW = -1e4


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Mask that lets every query attend to the real (non-padding) keys only.

    Args:
        tokens: token ids, shape ``(batch, k_len)``, integer dtype.
        pad_id: the id used for padding.

    Returns:
        Boolean mask of shape ``(batch, 1, 1, k_len)``: ``True`` where the key is a real token.
        The two size-1 dimensions broadcast over heads and queries.
    """
    check_integer("tokens", tokens)
    check_ndim("tokens", tokens, 2, "(batch, k_len)")
    check_positive_int("pad_id", pad_id, minimum=0)
    return (tokens != pad_id)[:, None, None, :]  # (batch, 1, 1, k_len)


def causal_mask(
    q_len: int, k_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Mask that lets query ``i`` attend to keys ``0..i`` only (no peeking at the future).

    With ``k_len > q_len`` (a KV cache: the queries are the *last* ``q_len`` positions of a
    sequence whose ``k_len`` keys are all known) the diagonal is shifted so that query ``i``
    sits at position ``i + (k_len - q_len)`` - the "bottom-right" alignment.

    Args:
        q_len: number of queries.
        k_len: number of keys, at least ``q_len``; default ``q_len``.
        device: where to create the mask.

    Returns:
        Boolean mask of shape ``(q_len, k_len)``: ``True`` on and below the (shifted) diagonal.
    """
    k_len = q_len if k_len is None else k_len
    if checks_enabled():  # not when called from inside a checked module
        _check_causal_sizes(q_len, k_len)
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)  # (q_len, k_len)
    return torch.tril(ones, diagonal=k_len - q_len)  # (q_len, k_len)


def _check_causal_sizes(q_len: object, k_len: object) -> None:
    check_positive_int("q_len", q_len)
    check_positive_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(
            f"k_len must be >= q_len for a causal mask (queries are the last q_len positions), "
            f"got q_len={q_len} and k_len={k_len}"
        )


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Combine boolean masks: a query may attend to a key only if *every* mask allows it.

    ``None`` entries are skipped; the result is ``None`` when all are ``None``. Masks broadcast
    against each other (e.g. padding ``(batch, 1, 1, k_len)`` and causal ``(q_len, k_len)``
    give ``(batch, 1, q_len, k_len)``), but sizes that differ and are not 1 raise an error.

    Returns:
        Boolean mask of the broadcast shape, or ``None``.
    """
    present = [(i, m) for i, m in enumerate(masks) if m is not None]
    for i, m in present:
        check_bool_tensor(f"masks[{i}]", m)
    if not present:
        return None
    try:
        torch.broadcast_shapes(*(m.shape for _, m in present))
    except RuntimeError:
        shapes = ", ".join(shape_str(m.shape) for _, m in present)
        raise ValueError(
            f"masks must broadcast against each other (each dimension 1 or equal), "
            f"got shapes {shapes}"
        ) from None
    combined = present[0][1]
    for _, m in present[1:]:
        combined = combined & m  # broadcast shape
    return combined


def from_additive_mask(mask: Tensor) -> Tensor:
    """Convert an additive float mask (``0`` = may attend, ``-inf`` = blocked) to a boolean one.

    Values at or below ``-1e4`` (``-inf``, ``-1e9``, ``torch.finfo(dtype).min``) count as
    blocked. Any other non-zero value is a *soft bias* (e.g. ALiBi) that a boolean mask cannot
    express, and raises ``ValueError``.

    Args:
        mask: float tensor of any shape.

    Returns:
        Boolean tensor of the same shape, ``True`` where the additive mask is ``0``.
    """
    check_floating("mask", mask)
    if bool(torch.isnan(mask).any()):
        raise ValueError("mask contains NaN; expected 0 (may attend) or -inf (blocked)")
    allowed = mask == 0  # same shape as mask
    blocked = mask <= ADDITIVE_BLOCKED_AT_OR_BELOW  # same shape as mask
    soft = ~(allowed | blocked)  # same shape as mask
    if bool(soft.any()):
        example = float(mask[soft][0])
        raise ValueError(
            f"mask must contain only 0 (may attend) and -inf or values <= "
            f"{ADDITIVE_BLOCKED_AT_OR_BELOW:g} (blocked), got {example:g}: a soft bias "
            "cannot be represented as a boolean mask"
        )
    return allowed


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Convert a boolean mask (``True`` = may attend) to an additive one: ``0`` or ``-inf``.

    Args:
        mask: boolean tensor of any shape.
        dtype: floating dtype of the result.

    Returns:
        Float tensor of the same shape.
    """
    check_bool_tensor("mask", mask)
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)  # same shape as mask
    return additive.masked_fill(~mask, float("-inf"))  # same shape as mask
