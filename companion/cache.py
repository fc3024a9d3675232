"""What incremental (token-by-token) decoding keeps between steps (chapter 7).

Decoding one token at a time, a step needs the keys and values of every earlier token. They
do not change, so instead of recomputing them the model keeps them:

* :class:`KeyValueCache` - the projected keys and values of one attention module;
* :class:`DecoderLayerCache` - a decoder layer's two: self-attention (grows by one step's
  tokens per call) and cross-attention (the projected encoder output, computed once);
* :class:`DecoderCache` - every layer's, plus which of the tokens decoded so far are padding;
* :class:`DecoderOnlyCache` - the same for a decoder-only model (one growing
  :class:`KeyValueCache` per layer, no cross-attention), which can also serve as
  Transformer-XL's segment memory (:meth:`DecoderOnlyCache.keep_last`).

``reorder(indices)`` keeps the batch rows ``indices`` (beam search follows its surviving
beams with it). The modules that fill the caches are :class:`companion.attention.MultiHeadAttention`
(``cache=``), :class:`companion.layers.DecoderLayer` and :class:`companion.model.Transformer`
(``model.new_cache()``, ``model.decode(..., cache=cache)``), and
:class:`companion.families.DecoderOnlyTransformer` (``model(tokens, cache=cache)``).

**Segment memory** (Transformer-XL, Dai et al., 2019): ``keep_last(n)`` keeps only the last
``n`` cached positions of every layer, detached from the autograd graph, and remembers in
``start`` the absolute position of the first one kept. The next call attends over the kept
keys and values and its own, with its positions continuing at ``start + length``
(:attr:`KeyValueCache.next_position`): RoPE rotates the new queries and keys there, and
ALiBi, which sees only the distances between the queries and the contiguous cached + new
keys, needs nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from companion._validation import (
    check_bool_tensor,
    check_integer,
    check_ndim,
    check_positive_int,
    shape_str,
)

__all__ = [
    "KeyValueCache",
    "DecoderLayerCache",
    "DecoderCache",
    "DecoderOnlyCache",
    "LatentCache",
    "check_key_padding",
]


def _bytes(tensor: Tensor | None) -> int:
    """Bytes of ``tensor``'s elements (0 for ``None``)."""
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


@dataclass
class KeyValueCache:
    """Keys and values that one attention module has already projected.

    * ``growing=True`` (decoder self-attention): every call appends the keys and values of its
      new positions and attends over all of them;
    * ``growing=False`` (cross-attention): the first call projects the encoder output
      (``memory``) and stores it; later calls reuse it and project only the queries.

    Attributes:
        growing: see above.
        keys, values: ``(batch, kv_heads, cached_len, head_dim)``, ``None`` before the first
            call. ``kv_heads`` is the module's number of key/value heads: ``num_heads`` for
            multi-head attention, fewer with grouped-query attention, 1 with multi-query
            attention (``MultiHeadAttention(num_kv_heads=...)``). With rotary embeddings the
            keys are stored already rotated.
        start: absolute position of the first cached key: 0, unless :meth:`keep_last`
            dropped earlier positions (segment memory).
    """

    growing: bool = True
    keys: Tensor | None = None
    values: Tensor | None = None
    start: int = 0

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def next_position(self) -> int:
        """Absolute position of the next new key: ``start + length``."""
        return self.start + self.length

    def keep_last(self, n: int) -> None:
        """Keep only the last ``n`` cached positions (all of them if there are fewer),
        detached from the autograd graph, and advance :attr:`start` past the dropped ones:
        the memory of segment recurrence (Transformer-XL) carries no gradient into the
        segment that produced it."""
        check_positive_int("n", n, minimum=0)
        if self.keys is None:
            return
        dropped = max(self.length - n, 0)
        self.keys = self.keys[:, :, dropped:].detach()  # (batch, kv_heads, min(len, n), head_dim)
        self.values = self.values[:, :, dropped:].detach()  # (batch, kv_heads, min(len, n), hd)
        self.start += dropped

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (0 before the first call):
        ``2 · batch · kv_heads · cached_len · head_dim · bytes per number``."""
        return sum(_bytes(tensor) for tensor in (self.keys, self.values))

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)``, e.g. the surviving beams."""
        if self.keys is not None:
            self.keys = self.keys.index_select(0, indices)  # (new_batch, heads, len, head_dim)
            self.values = self.values.index_select(0, indices)  # (new_batch, heads, len, head_dim)


@dataclass
class DecoderLayerCache:
    """What one decoder layer keeps: the keys and values of its self-attention (growing) and
    of its cross-attention (the projected encoder output, computed at the first step)."""

    self_attention: KeyValueCache = field(default_factory=lambda: KeyValueCache(growing=True))
    cross_attention: KeyValueCache = field(default_factory=lambda: KeyValueCache(growing=False))

    @property
    def nbytes(self) -> int:
        """Bytes held by both caches (self-attention and cross-attention)."""
        return self.self_attention.nbytes + self.cross_attention.nbytes

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)`` (beam search)."""
        self.self_attention.reorder(indices)
        self.cross_attention.reorder(indices)


class DecoderCache:
    """Everything the decoder keeps between incremental decoding steps.

    Attributes:
        layers: one :class:`DecoderLayerCache` per decoder layer.
        key_padding: ``(batch, length)`` boolean, ``True`` for the real (non-padding) tokens
            decoded so far, or ``None`` when the model has no target pad id.
    """

    def __init__(self, num_layers: int) -> None:
        self.layers = [
            DecoderLayerCache() for _ in range(check_positive_int("num_layers", num_layers))
        ]
        self.key_padding: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.layers[0].self_attention.length

    @property
    def nbytes(self) -> int:
        """Bytes held: every layer's keys and values (:attr:`DecoderLayerCache.nbytes`) and the
        padding record ``key_padding``. Per decoded token only the self-attention keys and
        values grow (plus one byte per row of ``key_padding``); the cross-attention ones are
        the projected source, fixed after the first step. ``layers[i].self_attention.nbytes``
        counts one layer's self-attention alone."""
        return sum(layer.nbytes for layer in self.layers) + _bytes(self.key_padding)

    @property
    def batch_size(self) -> int | None:
        """Rows in the cache, ``None`` before the first step."""
        keys = self.layers[0].self_attention.keys
        return None if keys is None else keys.shape[0]

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)``, e.g. the surviving beams."""
        check_integer("indices", indices)
        check_ndim("indices", indices, 1, "(new_batch,)")
        for layer in self.layers:
            layer.reorder(indices)
        if self.key_padding is not None:
            self.key_padding = self.key_padding.index_select(0, indices)  # (new_batch, length)


class DecoderOnlyCache:
    """Everything a decoder-only model keeps between calls: one growing
    :class:`KeyValueCache` per layer (self-attention only), and the padding of the tokens seen.

    Incremental decoding appends every call's tokens; :meth:`keep_last` turns it into the
    segment memory of Transformer-XL (see the module docstring).

    Attributes:
        layers: one :class:`KeyValueCache` (``growing=True``) per layer.
        key_padding: ``(batch, length)`` boolean, ``True`` for the real (non-padding) cached
            tokens, or ``None`` when the model has no pad id.
    """

    def __init__(self, num_layers: int) -> None:
        count = check_positive_int("num_layers", num_layers)
        self.layers = [KeyValueCache(growing=True) for _ in range(count)]
        self.key_padding: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return self.layers[0].length

    @property
    def start(self) -> int:
        """Absolute position of the first cached token (0 unless :meth:`keep_last` dropped some)."""
        return self.layers[0].start

    @property
    def next_position(self) -> int:
        """Absolute position of the next token a call processes: ``start + length``."""
        return self.layers[0].next_position

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's keys and values and the padding record."""
        return sum(layer.nbytes for layer in self.layers) + _bytes(self.key_padding)

    @property
    def batch_size(self) -> int | None:
        """Rows in the cache, ``None`` before the first call."""
        keys = self.layers[0].keys
        return None if keys is None else keys.shape[0]

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)``."""
        check_integer("indices", indices)
        check_ndim("indices", indices, 1, "(new_batch,)")
        for layer in self.layers:
            layer.reorder(indices)
        if self.key_padding is not None:
            self.key_padding = self.key_padding.index_select(0, indices)  # (new_batch, length)

    def keep_last(self, n: int) -> None:
        """Keep the last ``n`` positions of every layer, detached (no gradient flows into the
        earlier segment), with :attr:`start` advanced past the dropped ones: the memory the
        next segment attends to (Transformer-XL). ``n = 0`` forgets every position but keeps
        counting them, so the next call's positions still continue."""
        check_positive_int("n", n, minimum=0)
        for layer in self.layers:
            layer.keep_last(n)
        if self.key_padding is not None:
            dropped = max(self.key_padding.shape[1] - n, 0)
            self.key_padding = self.key_padding[:, dropped:]  # (batch, min(length, n))


@dataclass
class LatentCache:
    """What multi-head latent attention keeps between decoding steps: one latent per token.

    :class:`companion.latent_attention.MultiHeadLatentAttention` rebuilds every head's keys and
    values from a token's latent ``c`` (or, in its absorbed form, attends to ``c`` directly),
    so ``c`` is all a step needs of the earlier tokens. Each call appends the latents of its
    new positions. Per token and layer that is ``d_latent`` numbers, where a
    :class:`KeyValueCache` holds ``2·heads·head_dim`` (``2·kv_heads·head_dim`` with grouped
    keys and values).

    Attributes:
        latents: ``(batch, cached_len, d_latent)``, ``None`` before the first call.
    """

    latents: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return 0 if self.latents is None else self.latents.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes the cached latents occupy: ``batch · cached_len · d_latent · element size``."""
        return _bytes(self.latents)

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)``, e.g. the surviving beams."""
        if self.latents is not None:
            self.latents = self.latents.index_select(0, indices)  # (new_batch, len, d_latent)


def check_key_padding(cache: DecoderCache | DecoderOnlyCache, batch: int) -> None:
    """For a model with a pad id: raise a clear error unless ``cache.key_padding`` records
    every cached token, boolean ``(batch, cache.length)`` (``None`` while the cache is
    empty). A cache filled by a model without a pad id has no record, and the padding mask of
    the next call would not cover the cached keys."""
    cached, record = cache.length, cache.key_padding
    if record is None:
        if cached:
            raise ValueError(
                f"cache.key_padding is None but the cache holds {cached} position(s): it was "
                "filled by a model without a pad id; make the cache with this model's "
                "new_cache()"
            )
        return
    check_bool_tensor("cache.key_padding", record)
    if tuple(record.shape) != (batch, cached):
        raise ValueError(
            f"cache.key_padding must have shape (batch, cache.length) = ({batch}, {cached}) "
            f"(True for the real cached tokens), got {shape_str(record.shape)}"
        )
