"""Attention: scaled dot-product attention (chapters 1-2) and multi-head attention (chapter 3).

* :func:`scaled_dot_product_attention` - the formula written out step by step, returning the
  attention weights for plots.
* :class:`AdditiveScore` - the additive (Bahdanau) score, for comparison.
* :class:`MultiHeadAttention` - ``num_heads`` attentions in parallel on learned projections,
  batch-first, weight-compatible with ``torch.nn.MultiheadAttention``.
* :func:`fused_linear` - several linear layers applied to one input as a single matrix product
  (the q, k and v projections of self-attention); it lives with the other fast paths in
  :mod:`companion.kernels` and is importable from here too.

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
from torch import Tensor, nn

from companion import kernels
from companion._attention_checks import (
    check_attention_inputs,
    check_bias,
    check_kv_heads,
    check_positional,
    check_query_positions,
    checked_cache_length,
)
from companion._validation import (
    check_bool,
    check_bool_mask,
    check_divisible,
    check_floating,
    check_min_ndim,
    check_ndim,
    check_positive_float,
    check_positive_int,
    check_probability,
    check_qkv,
    check_size,
    check_tensor,
    checked,
    checks_enabled,
    shape_str,
)
from companion.cache import KeyValueCache
from companion.dropout import dropout
from companion.kernels import fused_linear
from companion.positional import RotaryEmbedding, alibi_bias, alibi_slopes

__all__ = [
    "scaled_dot_product_attention",
    "AdditiveScore",
    "MultiHeadAttention",
    "repeat_kv_heads",
    "fused_linear",
    "POSITIONAL",
]

#: The position schemes :class:`MultiHeadAttention` applies itself (``positional=``).
POSITIONAL: tuple[str, ...] = ("rope", "alibi")


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    scale: float | None = None,
    bias: Tensor | None = None,
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
        bias: optional float tensor added to the scaled scores before the softmax (ALiBi's
            distance penalty, :func:`companion.positional.alibi_bias`), broadcastable to
            ``(..., q_len, k_len)``, the dtype of ``q``, finite; blocked positions stay
            blocked whatever their bias.

    Returns:
        ``(output, weights)``: output of shape ``(..., q_len, d_v)`` and weights of shape
        ``(..., q_len, k_len)`` whose rows sum to 1 (or are all zero for a query that may
        attend to no key at all).
    """
    check_qkv(q, k, v)
    dropout_p = check_probability("dropout_p", dropout_p)
    q_len, k_len = q.shape[-2], k.shape[-2]
    score_shape = (*q.shape[:-2], q_len, k_len)
    if mask is not None:
        check_bool_mask("mask", mask, score_shape, "the scores (..., q_len, k_len)")
    if bias is not None and checks_enabled():  # not when a checked module calls it
        check_bias(bias, score_shape, q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    scores = (q @ k.transpose(-2, -1)) * scale  # (..., q_len, k_len)
    if bias is not None:
        scores = scores + bias  # (..., q_len, k_len)
    if mask is not None:
        # The most negative finite number, not -inf: a fully blocked row then gives a finite
        # (uniform) softmax instead of 0/0 = NaN, and is set to zero just below.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # (..., q_len, k_len)
    weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # (..., q_len, k_len) blocked keys get 0
    mixed = dropout(weights, dropout_p)  # (..., q_len, k_len)
    output = mixed @ v  # (..., q_len, d_v)
    return output, weights


class AdditiveScore(nn.Module):
    r"""Additive (Bahdanau) relevance score ``e_ij = tanh(a_i W_q + a_j W_k) w_a``.

    Row vectors, as in the course's notation: ``a_i`` is row ``i`` of ``q``, ``a_j`` row ``j``
    of ``k``; ``W_q``, ``W_k`` and ``w_a`` are ``query_proj``, ``key_proj`` and ``score_proj``
    (``nn.Linear`` stores each weight transposed).

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


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al., 2017, section 3.2.2), batch-first.

    Each of the ``num_heads`` heads attends with its own ``head_dim = d_model / num_heads``
    slice of learned query, key and value projections; the heads' outputs are concatenated and
    mixed by an output projection::

        head_r = attention(query W_Q^(r), key W_K^(r), value W_V^(r))   for r = 0 .. h-1
        output = concat(head_0, ..., head_(h-1)) W_O

    Query, key and value may come from different sequences of different lengths:
    ``attn(x, x, x)`` is self-attention, ``attn(y, memory, memory)`` is cross-attention.

    :meth:`forward` reads as the math: :meth:`project` (the three projections, split into
    heads), :meth:`attend` (attention in every head at once), :meth:`merge_heads`, ``out_proj``.
    Its inputs are checked once, by :meth:`check_inputs`, when a user calls it; a layer that
    calls it from inside has checked its own input already (see
    :func:`companion._validation.checked`).

    Two computation paths give the same output:

    * ``need_weights=True`` - the explicit path through :func:`scaled_dot_product_attention`,
      which also returns the per-head weights ``(batch, heads, q_len, k_len)`` for plots;
    * ``need_weights=False`` (default) - the fast path through
      ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels), weights ``None``.

    For self-attention (``query is key is value``) the three projections run as one matrix
    product on the concatenated weights (:func:`fused_linear`), as
    ``torch.nn.MultiheadAttention`` does; likewise keys and values when ``key is value``. The
    parameters stay separate and readable. Conversion from and to
    ``torch.nn.MultiheadAttention``: :mod:`companion.interop`.

    **Fewer key/value heads** (``num_kv_heads``): grouped-query attention (GQA, Ainslie et al.,
    2023) projects keys and values to ``num_kv_heads`` heads only, each shared by a group of
    ``num_heads / num_kv_heads`` consecutive query heads: query head ``r`` reads key/value head
    ``r // (num_heads / num_kv_heads)`` (:func:`repeat_kv_heads`, the grouping of
    ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``).
    ``num_kv_heads = num_heads`` is multi-head attention, ``num_kv_heads = 1`` multi-query
    attention (MQA, Shazeer 2019). A :class:`KeyValueCache` then holds
    ``num_kv_heads`` heads, not ``num_heads``: the cache shrinks by the group size.

    **Positions inside attention** (``positional``, for self-attention): ``"rope"`` rotates
    every head's queries and keys (:class:`~companion.positional.RotaryEmbedding`);
    ``"alibi"`` adds ``-slope_h · distance`` to the scores of head ``h``
    (:func:`~companion.positional.alibi_bias`, the symmetric form unless ``is_causal``). Keys
    sit at positions ``0 .. k_len - 1`` and the queries are the *last* ``q_len`` of them
    (with a cache: the new positions after the cached ones), the alignment of ``is_causal``.
    Both depend only on the distance between a query and a key. A cache trimmed to segment
    memory (:meth:`KeyValueCache.keep_last`) keeps its keys rotated at their absolute
    positions and starts the new ones at ``cache.next_position``; ALiBi's distances between
    the contiguous cached and new keys need no offset.

    Args:
        d_model: size of the input and output vectors; must be divisible by ``num_heads``.
        num_heads: number of (query) heads.
        dropout: dropout probability on the attention weights (training mode only).
        bias: whether the four projections have biases.
        num_kv_heads: number of key/value heads; ``None`` means ``num_heads``. Must divide
            ``num_heads``.
        positional: ``None``, ``"rope"`` or ``"alibi"`` (see above).
        rope_base: the base of the rotary frequencies (``positional="rope"`` only).

    Parameters: ``query_proj``, ``out_proj`` (``nn.Linear(d_model, d_model)``), ``key_proj``,
    ``value_proj`` (``nn.Linear(d_model, num_kv_heads · head_dim)``): with ``g = num_kv_heads``
    and ``h = num_heads``, ``2·d_model² + 2·d_model²·g/h`` weights plus
    ``2·d_model + 2·d_model·g/h`` biases (``4·d_model² + 4·d_model`` for multi-head
    attention). RoPE and ALiBi add no parameters.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
        positional: str | None = None,
        rope_base: float = 10000.0,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_divisible("d_model", d_model, "num_heads", num_heads)
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.num_kv_heads = check_kv_heads(num_kv_heads, num_heads)
        self.positional = check_positional(positional, self.head_dim, POSITIONAL)
        self.dropout = check_probability("dropout", dropout)
        self.bias = check_bool("bias", bias)
        kv_dim = self.num_kv_heads * self.head_dim
        self.query_proj = nn.Linear(d_model, d_model, bias=bias)
        self.key_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.value_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        rope_base = check_positive_float("rope_base", rope_base)
        self.rotary = (
            RotaryEmbedding(self.head_dim, base=rope_base) if positional == "rope" else None
        )
        slopes = alibi_slopes(num_heads) if positional == "alibi" else None  # (num_heads,)
        self.register_buffer("alibi_slopes", slopes, persistent=False)  # not in the state dict
        self.reset_parameters()

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """``.to()``, ``.double()``, ...: convert, then recompute the ALiBi slopes in float64 and
        cast them once (a float64 module gets float64 slopes, not float32 ones widened)."""
        super()._apply(fn, recurse)
        if self.alibi_slopes is not None:
            exact = alibi_slopes(self.num_heads, dtype=torch.float64)  # (num_heads,)
            self.alibi_slopes = exact.to(self.alibi_slopes.device, self.alibi_slopes.dtype)
        return self

    def reset_parameters(self) -> None:
        """Initialise like ``torch.nn.MultiheadAttention``: Xavier-uniform projections, zero biases."""
        for proj in (self.query_proj, self.key_proj, self.value_proj):
            nn.init.xavier_uniform_(proj.weight)
        for proj in (self.query_proj, self.key_proj, self.value_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def extra_repr(self) -> str:
        text = f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"
        if self.num_kv_heads != self.num_heads:
            text += f", num_kv_heads={self.num_kv_heads}"
        if self.positional is not None:
            text += f", positional={self.positional!r}"
        return text

    # ------------------------------------------------------------------ forward

    @checked("check_inputs")
    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KeyValueCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from every query position to the key/value positions.

        Args:
            query: shape ``(batch, q_len, d_model)``.
            key: shape ``(batch, k_len, d_model)``.
            value: shape ``(batch, k_len, d_model)``.
            mask: optional boolean mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, q_len, k_len)``; e.g. padding ``(batch, 1, 1, k_len)`` or
                causal ``(q_len, k_len)`` (see :mod:`companion.masking`).
            need_weights: return the per-head attention weights (explicit path).
            is_causal: also apply :func:`companion.masking.causal_mask` ``(q_len, k_len)``
                (bottom-right aligned when ``k_len > q_len``); combined with ``mask``.
            cache: keys and values of earlier decoding steps (:class:`KeyValueCache`); ``k_len``
                then counts the cached positions too, and the cache is updated in place.

        Returns:
            ``(output, weights)``: output ``(batch, q_len, d_model)``; weights
            ``(batch, heads, q_len, k_len)`` (before dropout) or ``None``. A query with no
            key to attend to (in any head) gets all-zero weights and an all-zero output.

        Empty inputs: ``batch = 0`` or ``q_len = 0`` give an empty output of the shape above
        (as ``torch.nn.MultiheadAttention``); ``k_len = 0`` (no keys) follows the "no key to
        attend to" rule: an all-zero output, where ``torch.nn.MultiheadAttention`` returns
        ``out_proj``'s bias.
        """
        q, k, v = self.project(query, key, value, cache)  # (batch, heads or kv_heads, len, hd)
        bias = self.position_bias(q, k, is_causal)  # ALiBi (heads, q_len, k_len) or None
        explicit = need_weights or bias is not None  # else the kernel may apply is_causal itself
        mask, kernel_causal = kernels.causal_or_mask(
            mask, is_causal, q.shape[-2], k.shape[-2], q.device, explicit
        )  # mask broadcastable to (batch, heads, q_len, k_len) or None
        per_head, weights = self.attend(
            q, k, v, mask, need_weights=need_weights, is_causal=kernel_causal, bias=bias
        )  # (batch, heads, q_len, head_dim), (batch, heads, q_len, k_len) or None
        output = self.out_proj(self.merge_heads(per_head))  # (batch, q_len, d_model)
        # a query no head lets attend anywhere (or no key at all): zeros, not out_proj's bias
        return kernels.zero_queries_without_keys(output, mask, k.shape[-2]), weights

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = False,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention in every head at once (no input checks).

        Args:
            q: ``(batch, heads, q_len, head_dim)``.
            k, v: ``(batch, kv_heads, k_len, head_dim)``; query head ``r`` uses key/value head
                ``r // (heads / kv_heads)`` (:func:`repeat_kv_heads`).
            mask: boolean, ``True`` = may attend, broadcastable to ``(batch, heads, q_len, k_len)``.
            need_weights: compute the weights explicitly and return them.
            is_causal: let the fused kernel apply a square causal mask (``q_len == k_len``,
                no ``mask`` and no ``bias``).
            bias: float, added to the scores, broadcastable to ``(batch, heads, q_len, k_len)``
                (ALiBi's ``(heads, q_len, k_len)``).

        Returns:
            ``(batch, heads, q_len, head_dim)`` and the weights ``(batch, heads, q_len, k_len)``
            or ``None``. A query with no key gets zero weights and a zero vector.
        """
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:  # the formula written out (chapter 2), weights kept for plots
            k, v = repeat_kv_heads(k, self.num_heads), repeat_kv_heads(v, self.num_heads)
            return scaled_dot_product_attention(q, k, v, mask, dropout_p, bias=bias)
        per_head = kernels.attention(q, k, v, mask, dropout_p, is_causal, bias)  # fused kernels
        return per_head, None  # (batch, heads, q_len, head_dim)

    def project(
        self, query: Tensor, key: Tensor, value: Tensor, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Project and split into heads, rotating queries and keys with RoPE.

        ``(batch, len, d_model)`` → queries ``(batch, heads, q_len, head_dim)``, keys and
        values ``(batch, kv_heads, k_len, head_dim)``. With a ``cache``, the keys and values
        come from / go to it (see :class:`KeyValueCache`).
        """
        if cache is not None and not cache.growing and cache.keys is not None:
            # cross-attention, memory already projected at an earlier step
            q = self.split_heads(self.query_proj(query))  # (batch, heads, q_len, head_dim)
            return q, cache.keys, cache.values
        projections = (self.query_proj, self.key_proj, self.value_proj)
        sizes = [self.d_model, self.key_proj.out_features, self.value_proj.out_features]
        if query is key and key is value:  # self-attention: one matrix product for q, k and v
            qkv = fused_linear(query, projections)  # (batch, len, d_model + 2·kv_dim)
            q, k, v = qkv.split(sizes, dim=-1)  # (batch, len, d_model), (batch, len, kv_dim) ×2
        elif key is value:  # cross-attention: one product for k and v
            q = self.query_proj(query)  # (batch, q_len, d_model)
            kv = fused_linear(key, projections[1:])  # (batch, k_len, 2·kv_dim)
            k, v = kv.split(sizes[1:], dim=-1)  # (batch, k_len, kv_dim) each
        else:
            q = self.query_proj(query)  # (batch, q_len, d_model)
            k = self.key_proj(key)  # (batch, k_len, kv_dim)
            v = self.value_proj(value)  # (batch, k_len, kv_dim)
        q = self.split_heads(q)  # (batch, heads, q_len, head_dim)
        k = self.split_heads(k, self.num_kv_heads)  # (batch, kv_heads, new_len, head_dim)
        v = self.split_heads(v, self.num_kv_heads)  # (batch, kv_heads, new_len, head_dim)
        if self.rotary is not None:  # RoPE, before the keys are cached (stored rotated)
            q, k = self.rotate(q, k, 0 if cache is None else cache.next_position)
        if cache is not None:
            if cache.growing and cache.keys is not None:  # append the new positions
                k = torch.cat([cache.keys, k], dim=2)  # (batch, kv_heads, cached + new, head_dim)
                v = torch.cat([cache.values, v], dim=2)  # (batch, kv_heads, cached + new, head_dim)
            cache.keys, cache.values = k, v
        return q, k, v

    def rotate(self, q: Tensor, k: Tensor, cached: int) -> tuple[Tensor, Tensor]:
        """RoPE on the new keys ``k (batch, kv_heads, new_len, head_dim)``, at positions
        ``cached .. cached + new_len - 1`` (after the cached ones of a growing cache:
        ``cached`` is its :attr:`~companion.cache.KeyValueCache.next_position`, which counts
        the positions that segment memory dropped too), and on the queries
        ``q (batch, heads, q_len, head_dim)``, the last ``q_len`` of those positions.
        Plain-int offsets: no host synchronisation. Returns tensors of the same shapes."""
        query_offset = cached + k.shape[2] - q.shape[2]  # queries are the last q_len positions
        q = self.rotary.rotate(q, offset=query_offset)  # (batch, heads, q_len, head_dim)
        k = self.rotary.rotate(k, offset=cached)  # (batch, kv_heads, new_len, head_dim)
        return q, k

    def position_bias(self, q: Tensor, k: Tensor, is_causal: bool = False) -> Tensor | None:
        """The ALiBi bias ``(heads, q_len, k_len)`` in ``q``'s dtype for queries ``q (..., q_len,
        head_dim)`` that are the last ``q_len`` of the key positions of ``k (..., k_len,
        head_dim)``; ``None`` unless ``positional="alibi"``. Causal form with ``is_causal``,
        symmetric otherwise (the two agree wherever a causal mask lets a query look)."""
        if self.alibi_slopes is None:
            return None
        q_len, k_len = q.shape[-2], k.shape[-2]
        bias = alibi_bias(
            self.alibi_slopes, q_len, k_len, offset=k_len - q_len, causal=is_causal
        )  # (heads, q_len, k_len)
        return bias.to(q.dtype)  # (heads, q_len, k_len)

    def split_heads(self, x: Tensor, num_heads: int | None = None) -> Tensor:
        """Cut projected queries, keys or values into heads.

        Head ``r`` gets features ``r·head_dim`` to ``(r+1)·head_dim - 1`` of every position:
        ``view`` splits the last axis, ``transpose`` puts the heads in front of the positions.
        The result is a view of ``x`` (no copy); :meth:`merge_heads` is the inverse.

        Args:
            x: shape ``(batch, len, num_heads · head_dim)``: ``(batch, len, d_model)`` for
                queries, ``(batch, len, num_kv_heads · head_dim)`` for grouped keys/values.
            num_heads: number of heads in ``x``; default the module's ``num_heads``.

        Returns:
            Tensor of shape ``(batch, num_heads, len, head_dim)``.
        """
        heads = self.num_heads if num_heads is None else check_positive_int("num_heads", num_heads)
        width = heads * self.head_dim
        if not (isinstance(x, Tensor) and x.dim() == 3 and x.shape[2] == width):
            layout = f"(batch, len, {width})"  # checks that raise a clear error
            check_ndim("x", check_tensor("x", x), 3, layout)
            check_size("x", x, 2, width, layout)
        batch, seq_len, _ = x.shape
        split = x.view(batch, seq_len, heads, self.head_dim)  # (batch, len, heads, head_dim)
        return split.transpose(1, 2)  # (batch, heads, len, head_dim)

    def merge_heads(self, x: Tensor) -> Tensor:
        """Concatenate the heads of every position: the inverse of :meth:`split_heads`.

        Position ``i`` becomes ``[x[:, 0, i] | x[:, 1, i] | ... ]``. ``reshape`` copies only
        when ``x.transpose(1, 2)`` is not contiguous: on the explicit path (weights returned)
        it is not, so it copies; a fused kernel may already return this memory order, and then
        nothing is copied.

        Args:
            x: shape ``(batch, heads, len, head_dim)``.

        Returns:
            Tensor of shape ``(batch, len, d_model)``.
        """
        shape_ok = isinstance(x, Tensor) and x.dim() == 4
        if not (shape_ok and x.shape[1] == self.num_heads and x.shape[3] == self.head_dim):
            layout = f"(batch, {self.num_heads}, len, {self.head_dim})"  # a clear error
            check_ndim("x", check_tensor("x", x), 4, layout)
            check_size("x", x, 1, self.num_heads, layout)
            check_size("x", x, 3, self.head_dim, layout)
        batch, _, seq_len, _ = x.shape
        heads_last = x.transpose(1, 2)  # (batch, len, heads, head_dim)
        return heads_last.reshape(batch, seq_len, self.d_model)  # (batch, len, d_model)

    # ------------------------------------------------------------------ checks

    def check_inputs(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KeyValueCache | None = None,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments); the
        checks are :mod:`companion._attention_checks`'s."""
        check_attention_inputs(self, query, key, value, mask, need_weights, is_causal, cache)

    def check_positions(self, q_len: int, k_len: int, cache: KeyValueCache | None) -> None:
        """With ``positional`` set, the queries are the last ``q_len`` of the ``k_len`` key
        positions, continued by a growing cache (self-attention); raise a clear error otherwise."""
        check_query_positions(self, q_len, k_len, cache)

    def cached_length(self, cache: object, batch: int, new_len: int, name: str = "cache") -> int:
        """Check ``cache`` (called ``name`` in the messages) for a call with ``batch`` rows and
        ``new_len`` new positions; the number of keys the call attends to (cached + new): the
        cached keys and values must be ``(batch, num_kv_heads, len, head_dim)`` of this module,
        on its device, of its dtype (unless autocast is on)."""
        return checked_cache_length(self, cache, batch, new_len, name)


def repeat_kv_heads(x: Tensor, num_heads: int) -> Tensor:
    """Give each of ``num_heads`` query heads its key/value head (grouped-query attention).

    Key/value head ``j`` serves the ``group = num_heads / kv_heads`` consecutive query heads
    ``j·group .. (j+1)·group - 1``, so query head ``r`` reads head ``r // group``: every head
    is repeated ``group`` times *in place* (``repeat_interleave`` on the head axis; ``repeat``
    would tile the whole stack instead and pair query head ``r`` with ``r % kv_heads``). This
    is the grouping of ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``.

    Args:
        x: keys or values, shape ``(batch, kv_heads, len, head_dim)``.
        num_heads: number of query heads, a multiple of ``kv_heads``.

    Returns:
        Tensor of shape ``(batch, num_heads, len, head_dim)`` (``x`` itself when
        ``kv_heads == num_heads``).
    """
    if checks_enabled():  # not when called from inside a checked module
        check_floating("x", x)
        check_ndim("x", x, 4, "(batch, kv_heads, len, head_dim)")
        check_positive_int("num_heads", num_heads)
        if num_heads % x.shape[1] != 0:
            raise ValueError(
                f"num_heads must be a multiple of the key/value heads of x (dimension 1 of "
                f"{shape_str(x.shape)}), got num_heads={num_heads}"
            )
    group = num_heads // x.shape[1]
    if group == 1:
        return x
    return x.repeat_interleave(group, dim=1)  # (batch, num_heads, len, head_dim)
