"""The input checks of :mod:`companion.attention`, kept out of the chapters' story.

:class:`~companion.attention.MultiHeadAttention` checks its inputs once, at the edge (see
:func:`companion._validation.checked`); its ``check_inputs``, ``check_positions`` and
``cached_length`` methods are one line each and call the functions here with the module
itself (``attention``), so that ``attention.py`` reads as chapters 1-3 and 9 tell it. The
constructor's argument checks (:func:`check_kv_heads`, :func:`check_positional`) and the
``bias`` check of :func:`~companion.attention.scaled_dot_product_attention`
(:func:`check_bias`) live here too. Each raises the clear error the tests name; the generic
helpers (``check_floating``, ``check_bool_mask``, ...) are :mod:`companion._validation`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from companion._validation import (
    check_bool,
    check_bool_mask,
    check_finite,
    check_floating,
    check_ndim,
    check_positive_int,
    check_same_device,
    check_same_dtype,
    check_size,
    shape_str,
)
from companion.cache import KeyValueCache

__all__ = [
    "check_bias",
    "check_kv_heads",
    "check_positional",
    "check_attention_inputs",
    "check_query_positions",
    "checked_cache_length",
]


def check_bias(bias: object, score_shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """A finite float ``bias`` of ``dtype`` broadcasting to ``score_shape`` without growing it."""
    check_floating("bias", bias)
    check_same_dtype("bias", bias, dtype, "q")
    padded = (1,) * (len(score_shape) - bias.dim()) + tuple(bias.shape)
    if bias.dim() > len(score_shape) or any(b not in (1, t) for b, t in zip(padded, score_shape)):
        raise ValueError(
            f"bias of shape {shape_str(bias.shape)} does not broadcast to the scores "
            f"(..., q_len, k_len) {shape_str(score_shape)}; each dimension must be 1 or equal"
        )
    check_finite("bias", bias)


def check_kv_heads(num_kv_heads: object, num_heads: int) -> int:
    """``num_kv_heads`` (``None`` = ``num_heads``): a positive int dividing ``num_heads``."""
    if num_kv_heads is None:
        return num_heads
    check_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads must divide num_heads (each key/value head serves a group of "
            f"num_heads / num_kv_heads query heads): got num_heads={num_heads} and "
            f"num_kv_heads={num_kv_heads}"
        )
    return num_kv_heads


def check_positional(positional: object, head_dim: int, schemes: tuple[str, ...]) -> str | None:
    """``positional``: ``None`` or one of ``schemes`` (:data:`companion.attention.POSITIONAL`:
    ``"rope"``, which needs an even ``head_dim``, or ``"alibi"``)."""
    if positional is None:
        return None
    if positional not in schemes:
        raise ValueError(f"positional must be None, 'rope' or 'alibi', got {positional!r}")
    if positional == "rope" and head_dim % 2:
        raise ValueError(
            "positional='rope' needs an even head_dim = d_model / num_heads (RoPE rotates "
            f"pairs of dimensions), got head_dim={head_dim}"
        )
    return positional


def check_attention_inputs(
    attention: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    need_weights: bool = False,
    is_causal: bool = False,
    cache: KeyValueCache | None = None,
) -> None:
    """Raise a clear error for anything ``attention.forward`` cannot take (its arguments, the
    keyword-only ones passed by position); ``attention`` is a
    :class:`~companion.attention.MultiHeadAttention`."""
    d, dtype, owner = attention.d_model, attention.out_proj.weight.dtype, "the module's parameters"
    for name, tensor, length in (
        ("query", query, "q_len"),
        ("key", key, "k_len"),
        ("value", value, "k_len"),
    ):
        check_floating(name, tensor)
        check_ndim(name, tensor, 3, f"(batch, {length}, {d})")
        check_size(name, tensor, 2, d, f"(batch, {length}, {d})")
        if not torch.is_autocast_enabled(tensor.device.type):  # autocast mixes dtypes
            check_same_dtype(name, tensor, dtype, owner)
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(
            "key and value must have the same batch size and length (batch, k_len), "
            f"got key {shape_str(key.shape)} and value {shape_str(value.shape)}"
        )
    if key.shape[0] != query.shape[0]:
        raise ValueError(
            "query and key must have the same batch size - nothing is broadcast: "
            f"got query {shape_str(query.shape)} and key {shape_str(key.shape)}"
        )
    check_finite("query", query)
    if key is not query:
        check_finite("key", key)
    if value is not key and value is not query:
        check_finite("value", value)
    check_bool("need_weights", need_weights)
    check_bool("is_causal", is_causal)
    batch, q_len, _ = query.shape
    k_len = key.shape[1] if cache is None else attention.cached_length(cache, batch, key.shape[1])
    if mask is not None:
        score_shape = (batch, attention.num_heads, q_len, k_len)
        check_bool_mask("mask", mask, score_shape, "(batch, heads, q_len, k_len)")
    if is_causal and k_len < q_len:
        raise ValueError(
            f"k_len must be >= q_len with is_causal (the queries are the last q_len "
            f"positions), "
            f"got q_len={q_len} and k_len={k_len}"
        )
    if attention.positional is not None:
        attention.check_positions(q_len, k_len, cache)


def check_query_positions(
    attention: nn.Module, q_len: int, k_len: int, cache: KeyValueCache | None
) -> None:
    """With ``attention.positional`` set, the queries are the last ``q_len`` of the ``k_len``
    key positions, continued by a growing cache (self-attention); raise a clear error otherwise."""
    if cache is not None and not cache.growing:
        raise ValueError(
            f"cache must be a growing KeyValueCache (self-attention) for a module with "
            f"positional={attention.positional!r}; cross-attention takes no positions, got "
            "KeyValueCache(growing=False)"
        )
    if k_len < q_len:
        raise ValueError(
            f"k_len must be >= q_len with positional={attention.positional!r} (the queries "
            f"are the last q_len of the key positions), got q_len={q_len} and k_len={k_len}"
        )


def checked_cache_length(
    attention: nn.Module, cache: object, batch: int, new_len: int, name: str = "cache"
) -> int:
    """Check ``cache`` (called ``name`` in the messages) for a call of ``attention`` with
    ``batch`` rows and ``new_len`` new positions; the number of keys the call attends to
    (cached + new).

    The cached keys and values must be ``(batch, num_kv_heads, len, head_dim)`` of this
    module (a cache filled by another model or module fails here, not in ``torch.cat``),
    on its device, and of its dtype unless autocast is on (which mixes dtypes)."""
    if not isinstance(cache, KeyValueCache):
        raise TypeError(f"{name} must be a KeyValueCache, got {type(cache).__name__}")
    if cache.keys is None and cache.values is None:
        return new_len
    layout = f"({batch}, {attention.num_kv_heads}, len, {attention.head_dim})"
    what = "(batch, kv_heads, len, head_dim) for this call and module"
    weight = attention.out_proj.weight
    for part in ("keys", "values"):
        tensor = getattr(cache, part)
        check_floating(f"{name}.{part}", tensor)
        fits = tensor.dim() == 4 and tensor.shape[0] == batch
        fits = fits and tensor.shape[1] == attention.num_kv_heads
        if not (fits and tensor.shape[3] == attention.head_dim):
            raise ValueError(
                f"{name} must hold {part} of shape {layout} {what}, got "
                f"{shape_str(tensor.shape)}; a cache is made by the model that fills it"
            )
        check_same_device(f"{name}.{part}", tensor, weight)
        if not torch.is_autocast_enabled(tensor.device.type):  # autocast mixes dtypes
            check_same_dtype(f"{name}.{part}", tensor, weight.dtype, "the module's parameters")
    if cache.values.shape != cache.keys.shape:
        raise ValueError(
            f"{name}.values must have the shape of {name}.keys "
            f"{shape_str(cache.keys.shape)}, got {shape_str(cache.values.shape)}"
        )
    return cache.length + new_len if cache.growing else cache.length
