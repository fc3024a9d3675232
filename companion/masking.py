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
*additive* float masks (``0`` = may attend, ``-inf`` = blocked). Convert with
:func:`to_torch_key_padding_mask`, :func:`to_torch_attn_mask`,
:func:`from_torch_key_padding_mask`, :func:`from_torch_attn_mask`,
:func:`from_additive_mask` and :func:`to_additive_mask`; never flip a mask by hand.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion._validation import (
    check_bool_mask,
    check_bool_tensor,
    check_floating,
    check_integer,
    check_ndim,
    check_positive_int,
    check_tensor,
    shape_str,
)

__all__ = [
    "padding_mask",
    "causal_mask",
    "combine_masks",
    "from_additive_mask",
    "to_additive_mask",
    "from_torch_key_padding_mask",
    "to_torch_key_padding_mask",
    "from_torch_attn_mask",
    "to_torch_attn_mask",
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
    check_positive_int("q_len", q_len)
    k_len = q_len if k_len is None else check_positive_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(
            f"k_len must be >= q_len for a causal mask (queries are the last q_len positions), "
            f"got q_len={q_len} and k_len={k_len}"
        )
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)  # (q_len, k_len)
    return torch.tril(ones, diagonal=k_len - q_len)  # (q_len, k_len)


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


def from_torch_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """Convert ``torch.nn.MultiheadAttention``'s ``key_padding_mask`` to this package's mask.

    Args:
        key_padding_mask: shape ``(batch, k_len)``; boolean (``True`` = padding, blocked) or
            additive float (``-inf`` = blocked).

    Returns:
        Boolean mask of shape ``(batch, 1, 1, k_len)``, ``True`` where the key may be attended.
    """
    check_tensor("key_padding_mask", key_padding_mask)
    check_ndim("key_padding_mask", key_padding_mask, 2, "(batch, k_len)")
    if key_padding_mask.is_floating_point():
        allowed = from_additive_mask(key_padding_mask)  # (batch, k_len)
    else:
        allowed = ~check_bool_tensor("key_padding_mask", key_padding_mask)  # (batch, k_len)
    return allowed[:, None, None, :]  # (batch, 1, 1, k_len)


def to_torch_key_padding_mask(mask: Tensor) -> Tensor:
    """Convert a padding mask of this package to ``torch.nn.MultiheadAttention``'s convention.

    Args:
        mask: boolean, ``True`` = may attend, shape ``(batch, 1, 1, k_len)`` (as made by
            :func:`padding_mask`) or ``(batch, k_len)``.

    Returns:
        Boolean ``key_padding_mask`` of shape ``(batch, k_len)``, ``True`` = padding (blocked).
    """
    check_bool_tensor("mask", mask)
    check_ndim("mask", mask, (2, 4), "(batch, 1, 1, k_len) or (batch, k_len)")
    if mask.dim() == 4:
        if mask.shape[1] != 1 or mask.shape[2] != 1:
            raise ValueError(
                "mask must have shape (batch, 1, 1, k_len) to be a key padding mask, "
                f"got shape {shape_str(mask.shape)}"
            )
        mask = mask[:, 0, 0, :]  # (batch, k_len)
    return ~mask  # (batch, k_len)


def from_torch_attn_mask(attn_mask: Tensor, num_heads: int | None = None) -> Tensor:
    """Convert ``torch.nn.MultiheadAttention``'s ``attn_mask`` to this package's mask.

    Args:
        attn_mask: boolean (``True`` = blocked) or additive float (``-inf`` = blocked), shape
            ``(q_len, k_len)`` or ``(batch * num_heads, q_len, k_len)``.
        num_heads: required for the 3-D form, to split ``batch * num_heads``.

    Returns:
        Boolean mask (``True`` = may attend) of shape ``(q_len, k_len)`` or
        ``(batch, num_heads, q_len, k_len)``.
    """
    check_tensor("attn_mask", attn_mask)
    check_ndim(
        "attn_mask", attn_mask, (2, 3), "(q_len, k_len) or (batch * num_heads, q_len, k_len)"
    )
    if attn_mask.is_floating_point():
        allowed = from_additive_mask(attn_mask)  # same shape as attn_mask
    else:
        allowed = ~check_bool_tensor("attn_mask", attn_mask)  # same shape as attn_mask
    if allowed.dim() == 2:
        return allowed  # (q_len, k_len)
    if num_heads is None:
        raise ValueError(
            "num_heads is required to convert a 3-D attn_mask of shape "
            f"{shape_str(attn_mask.shape)} (batch * num_heads, q_len, k_len)"
        )
    check_positive_int("num_heads", num_heads)
    rows, q_len, k_len = allowed.shape
    if rows % num_heads != 0:
        raise ValueError(
            f"attn_mask's first dimension must be batch * num_heads (a multiple of "
            f"num_heads={num_heads}), got shape {shape_str(attn_mask.shape)}"
        )
    return allowed.view(rows // num_heads, num_heads, q_len, k_len)  # (batch, heads, q_len, k_len)


def to_torch_attn_mask(mask: Tensor, num_heads: int | None = None) -> Tensor:
    """Convert a mask of this package to ``torch.nn.MultiheadAttention``'s boolean ``attn_mask``.

    Args:
        mask: boolean, ``True`` = may attend; shape ``(q_len, k_len)`` or
            ``(batch, heads, q_len, k_len)`` where ``heads`` is 1 or ``num_heads``.
        num_heads: required for the 4-D form.

    Returns:
        Boolean ``attn_mask`` (``True`` = blocked) of shape ``(q_len, k_len)`` or
        ``(batch * num_heads, q_len, k_len)``.
    """
    check_bool_tensor("mask", mask)
    check_ndim("mask", mask, (2, 4), "(q_len, k_len) or (batch, heads, q_len, k_len)")
    if mask.dim() == 2:
        return ~mask  # (q_len, k_len)
    if num_heads is None:
        raise ValueError(
            f"num_heads is required to convert a 4-D mask of shape {shape_str(mask.shape)}"
        )
    check_positive_int("num_heads", num_heads)
    batch, _, q_len, k_len = mask.shape
    check_bool_mask(
        "mask", mask, (batch, num_heads, q_len, k_len), "(batch, num_heads, q_len, k_len)"
    )
    expanded = mask.expand(batch, num_heads, q_len, k_len)  # (batch, heads, q_len, k_len)
    return ~expanded.reshape(batch * num_heads, q_len, k_len)  # (batch * heads, q_len, k_len)
