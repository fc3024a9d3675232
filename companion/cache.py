"""What incremental (token-by-token) decoding keeps between steps (chapter 7).

Decoding one token at a time, a step needs the keys and values of every earlier token. They
do not change, so instead of recomputing them the model keeps them:

* :class:`KeyValueCache` - the projected keys and values of one attention module;
* :class:`DecoderLayerCache` - a decoder layer's two: self-attention (grows by one step's
  tokens per call) and cross-attention (the projected encoder output, computed once);
* :class:`DecoderCache` - every layer's, plus which of the tokens decoded so far are padding.

``reorder(indices)`` keeps the batch rows ``indices`` (beam search follows its surviving
beams with it). The modules that fill the caches are :class:`companion.attention.MultiHeadAttention`
(``cache=``), :class:`companion.layers.DecoderLayer` and :class:`companion.model.Transformer`
(``model.new_cache()``, ``model.decode(..., cache=cache)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from companion._validation import check_integer, check_ndim, check_positive_int

__all__ = ["KeyValueCache", "DecoderLayerCache", "DecoderCache"]


@dataclass
class KeyValueCache:
    """Keys and values that one attention module has already projected.

    * ``growing=True`` (decoder self-attention): every call appends the keys and values of its
      new positions and attends over all of them;
    * ``growing=False`` (cross-attention): the first call projects the encoder output
      (``memory``) and stores it; later calls reuse it and project only the queries.

    Attributes:
        growing: see above.
        keys, values: ``(batch, heads, cached_len, head_dim)``, ``None`` before the first call.
    """

    growing: bool = True
    keys: Tensor | None = None
    values: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return 0 if self.keys is None else self.keys.shape[-2]

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
