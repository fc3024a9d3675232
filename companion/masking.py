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
local band (sliding window)          ``(q_len, k_len)``          :func:`sliding_window_mask`
global tokens (Longformer)           ``(length, length)``        :func:`global_tokens_mask`
local + global + random (BigBird)    ``(length, length)``        :func:`bigbird_mask`
either of two masks                  the broadcast shape         :func:`union_masks`
prefix LM (bidirectional prefix)     ``(length, length)``        :func:`prefix_lm_mask`
===================================  ==========================  ============================

:func:`combine_masks` keeps what *every* mask allows (AND: padding and causal);
:func:`union_masks` keeps what *any* mask allows (OR: a local band plus global tokens).

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

from collections.abc import Sequence

import torch
from torch import Tensor

from companion._validation import (
    check_bool,
    check_bool_tensor,
    check_floating,
    check_instance,
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
    "sliding_window_mask",
    "sliding_window_mask_at",
    "global_tokens_mask",
    "union_masks",
    "bigbird_mask",
    "prefix_lm_mask",
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
    present = _present_masks(masks)
    if not present:
        return None
    combined = present[0]
    for m in present[1:]:
        combined = combined & m  # broadcast shape
    return combined


def _present_masks(masks: tuple[Tensor | None, ...]) -> list[Tensor]:
    """The masks that are not ``None``, checked: boolean, and broadcasting against each other."""
    present = [(i, m) for i, m in enumerate(masks) if m is not None]
    for i, m in present:
        check_bool_tensor(f"masks[{i}]", m)
    try:
        torch.broadcast_shapes(*(m.shape for _, m in present))
    except RuntimeError:
        shapes = ", ".join(shape_str(m.shape) for _, m in present)
        raise ValueError(
            f"masks must broadcast against each other (each dimension 1 or equal), "
            f"got shapes {shapes}"
        ) from None
    return [m for _, m in present]


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


# ---------------------------------------------------------------------------------------------
# Sparse patterns for long sequences: a local band (Mistral, Longformer), global tokens
# (Longformer) and random keys (BigBird). Each is a boolean (q_len, k_len) mask, True = may
# attend, so it composes with causal_mask and padding masks through combine_masks.
# ---------------------------------------------------------------------------------------------


def sliding_window_mask_at(
    query_positions: Tensor, key_positions: Tensor, *, window: int, causal: bool = False
) -> Tensor:
    """The sliding-window rule for queries and keys at the given positions.

    A query at position ``i`` may attend to a key at position ``j`` when ``|i - j| < window``,
    and with ``causal=True`` only when also ``j <= i``. See :func:`sliding_window_mask` for
    what ``window`` counts. Used by banded attention to build the mask of one chunk without
    building the whole ``(q_len, k_len)`` mask.

    Args:
        query_positions: integer tensor of shape ``(q_len,)``.
        key_positions: integer tensor of shape ``(k_len,)``, on the same device.
        window: the band's size, at least 1.
        causal: also block keys after the query.

    Returns:
        Boolean mask of shape ``(q_len, k_len)``.
    """
    if checks_enabled():
        check_integer("query_positions", query_positions)
        check_ndim("query_positions", query_positions, 1, "(q_len,)")
        check_integer("key_positions", key_positions)
        check_ndim("key_positions", key_positions, 1, "(k_len,)")
        check_positive_int("window", window)
        check_bool("causal", causal)
    distance = query_positions[:, None] - key_positions[None, :]  # (q_len, k_len) i - j
    if causal:
        return (distance >= 0) & (distance < window)  # (q_len, k_len) the key and window-1 before
    return distance.abs() < window  # (q_len, k_len) window-1 keys on each side


def sliding_window_mask(
    q_len: int,
    k_len: int | None = None,
    *,
    window: int,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """Local attention: each query attends only to the keys near its own position.

    **What ``window`` counts.** A query at position ``i`` may attend to the key at position
    ``j`` when the distance ``|i - j|`` is *less than* ``window``: the window counts the
    query's own position. Without ``causal`` a query sees ``2·window - 1`` keys (itself and
    ``window - 1`` on each side); with ``causal=True`` it sees ``window`` keys (itself and the
    ``window - 1`` before it). ``window=1`` is the diagonal alone, and a window at least as long
    as the sequence allows every key (with ``causal=True``: equals :func:`causal_mask`). Rows
    near the ends see fewer keys. Some libraries count only the keys *before* the query, so
    their window ``W`` is this function's ``W + 1``: check the convention before comparing.

    Positions are aligned as in :func:`causal_mask`: with ``k_len > q_len`` the queries are the
    last ``q_len`` positions, query ``i`` sitting at position ``i + (k_len - q_len)``.

    Args:
        q_len: number of queries.
        k_len: number of keys, at least ``q_len``; default ``q_len``.
        window: the band's size as defined above, at least 1.
        causal: also block every key after the query (Mistral's local causal attention);
            without it the band is symmetric (Longformer's local attention).
        device: where to create the mask.

    Returns:
        Boolean mask of shape ``(q_len, k_len)``, ``True`` inside the band.
    """
    k_len = q_len if k_len is None else k_len
    if checks_enabled():
        _check_window_sizes(q_len, k_len)
        check_positive_int("window", window)
        check_bool("causal", causal)
    query_positions = torch.arange(q_len, device=device) + (k_len - q_len)  # (q_len,)
    key_positions = torch.arange(k_len, device=device)  # (k_len,)
    return sliding_window_mask_at(
        query_positions, key_positions, window=window, causal=causal
    )  # (q_len, k_len)


def _check_window_sizes(q_len: object, k_len: object) -> None:
    check_positive_int("q_len", q_len)
    check_positive_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(
            f"k_len must be >= q_len for a sliding-window mask (queries are the last q_len "
            f"positions), got q_len={q_len} and k_len={k_len}"
        )


def _global_positions(length: int, global_positions: object) -> list[int]:
    """Check ``global_positions`` (a sequence of ints or a 1-D integer tensor, each in
    ``[0, length)``) and return it as a list of ints."""
    if isinstance(global_positions, Tensor):
        check_integer("global_positions", global_positions)
        check_ndim("global_positions", global_positions, 1, "(num_global,)")
        positions = [int(p) for p in global_positions.tolist()]
    else:
        check_instance(
            "global_positions", global_positions, Sequence, "a sequence of ints or a 1-D tensor"
        )
        positions = list(global_positions)  # type: ignore[arg-type]
        for index, position in enumerate(positions):
            if isinstance(position, bool) or not isinstance(position, int):
                raise TypeError(
                    f"global_positions[{index}] must be an int, got "
                    f"{type(position).__name__} ({position!r})"
                )
    for index, position in enumerate(positions):
        if not 0 <= position < length:
            raise ValueError(
                f"global_positions[{index}] must be a position in [0, {length - 1}] "
                f"(length={length}), got {position}"
            )
    return positions


def global_tokens_mask(
    length: int,
    global_positions: Sequence[int] | Tensor,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """Longformer's global attention: a global token attends to every token, and every token
    attends to it.

    The mask allows only these global rows and columns; join it to a local band with
    :func:`union_masks` (``union_masks(sliding_window_mask(n, window=w), global_tokens_mask(n,
    [0]))`` is Longformer's pattern with a global first token, e.g. a classification token).

    Args:
        length: sequence length (queries and keys are the same sequence).
        global_positions: positions of the global tokens, each in ``[0, length)``; a sequence of
            ints or a 1-D integer tensor; may be empty.
        device: where to create the mask.

    Returns:
        Boolean mask of shape ``(length, length)``: ``True`` in the rows and the columns of the
        global positions.
    """
    check_positive_int("length", length)
    positions = _global_positions(length, global_positions)
    is_global = torch.zeros(length, dtype=torch.bool, device=device)  # (length,)
    is_global[positions] = True
    return is_global[:, None] | is_global[None, :]  # (length, length)


def union_masks(*masks: Tensor | None) -> Tensor | None:
    """Join boolean masks: a query may attend to a key if *any* mask allows it.

    The OR counterpart of :func:`combine_masks` (which is AND). ``None`` entries are skipped;
    the result is ``None`` when all are ``None``. Masks broadcast against each other, but
    sizes that differ and are not 1 raise an error.

    Returns:
        Boolean mask of the broadcast shape, or ``None``.
    """
    present = _present_masks(masks)
    if not present:
        return None
    joined = present[0]
    for m in present[1:]:
        joined = joined | m  # broadcast shape
    return joined


def bigbird_mask(
    length: int,
    *,
    window: int,
    global_positions: Sequence[int] | Tensor = (),
    num_random: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """BigBird's sparse pattern: a local band, global tokens and random keys in every row.

    Each query may attend to (1) the keys of its sliding window (:func:`sliding_window_mask`,
    non-causal, same ``window``), (2) the global tokens, and is attended to by them
    (:func:`global_tokens_mask`), and (3) ``num_random`` further keys drawn uniformly, without
    replacement, from the keys that (1) and (2) do not already give it - so a row sees exactly
    ``num_random`` more keys than the local + global pattern, or every key when fewer are left.
    BigBird draws blocks of tokens rather than single tokens; this is the token-level version.
    Combine with :func:`causal_mask` (through :func:`combine_masks`) for a decoder: random keys
    in the future are then blocked.

    Args:
        length: sequence length.
        window: the band's size, as in :func:`sliding_window_mask`.
        global_positions: positions of the global tokens (may be empty).
        num_random: random keys per row, from 0 to ``length``.
        generator: source of the random draw; the same generator state gives the same mask.
        device: where to create the mask (the draw happens on the generator's device).

    Returns:
        Boolean mask of shape ``(length, length)``.
    """
    check_positive_int("length", length)
    check_positive_int("window", window)
    check_positive_int("num_random", num_random, minimum=0)
    if num_random > length:
        raise ValueError(f"num_random must be <= length ({length}), got {num_random}")
    if generator is not None:
        check_instance("generator", generator, torch.Generator, "a torch.Generator or None")
    here = generator.device if generator is not None else torch.device("cpu")  # draw there
    local = sliding_window_mask(length, window=window, device=here)  # (length, length)
    global_ = global_tokens_mask(length, global_positions, device=here)  # (length, length)
    allowed = local | global_  # (length, length)
    if num_random > 0:
        noise = torch.rand(length, length, generator=generator, device=here)  # (length, length)
        noise = noise.masked_fill(allowed, -1.0)  # (length, length) keys already seen rank last
        picks = noise.topk(num_random, dim=-1).indices  # (length, num_random)
        drawn = torch.zeros_like(allowed).scatter_(-1, picks, True)  # (length, length)
        allowed = allowed | drawn  # (length, length)
    return allowed.to(device) if device is not None else allowed  # (length, length)


# ---------------------------------------------------------------------------------------------
# The prefix language model (T5's "prefix LM", UniLM's sequence-to-sequence mask): one stack of
# self-attention reads a prefix bidirectionally and continues it causally (chapter 10).
# ---------------------------------------------------------------------------------------------


def prefix_lm_mask(
    length: int, prefix_len: int, *, device: torch.device | str | None = None
) -> Tensor:
    """The mask of a prefix language model: the prefix is read bidirectionally, the rest causally.

    Query ``i`` may attend to key ``j`` when ``j < prefix_len`` (every position sees the whole
    prefix, later prefix tokens included) or ``j <= i`` (the causal rule). So the first
    ``prefix_len`` rows and columns form a block of ``True`` (the prefix attends to itself both
    ways), and the positions after the prefix see the whole prefix and the positions up to
    their own. ``prefix_len = 0`` (or ``1``) gives :func:`causal_mask`; ``prefix_len = length``
    gives the all-``True`` mask of an encoder.

    A model trained with this mask must not be asked to predict a token inside the prefix: the
    prefix positions see it. :func:`companion.data.prefix_lm_example` drops those targets.

    Args:
        length: sequence length (queries and keys are the same sequence), at least 1.
        prefix_len: number of prefix positions, from 0 to ``length``.
        device: where to create the mask.

    Returns:
        Boolean mask of shape ``(length, length)``, ``True`` = may attend.
    """
    check_positive_int("length", length)
    check_positive_int("prefix_len", prefix_len, minimum=0)
    if prefix_len > length:
        raise ValueError(f"prefix_len must be <= length ({length}), got {prefix_len}")
    positions = torch.arange(length, device=device)  # (length,)
    causal = positions[None, :] <= positions[:, None]  # (length, length) key j <= query i
    in_prefix = positions[None, :] < prefix_len  # (1, length) key j inside the prefix
    return causal | in_prefix  # (length, length)
