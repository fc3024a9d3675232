"""Transformer layers: the position-wise feed-forward network, the encoder and decoder layers.

Every sub-layer (attention or feed-forward) is wrapped in a residual connection with dropout
and a LayerNorm, placed in one of two ways (``norm_first``), see :meth:`EncoderLayer.residual`:

* **Post-LN** (``norm_first=False``, the original paper): ``x = norm(x + dropout(sublayer(x)))``;
* **Pre-LN** (``norm_first=True``, more stable to train deep): ``x = x + dropout(sublayer(norm(x)))``.

``norm="rms"`` replaces every LayerNorm by an RMSNorm (Zhang & Sennrich, 2019), which divides by
the root mean square and drops both the mean subtraction and the bias (see :func:`make_norm`).

Post-LN layers take ``residual_scale`` (α, default 1), which scales the residual path:
``x = norm(α·x + dropout(sublayer(x)))``, the residual connection of DeepNorm (Wang et al.,
2022, "DeepNet: Scaling Transformers to 1,000 Layers"; chapter 6 pairs it with the β-scaled
initialisation). It is an attribute that can also be set after construction, e.g. on the
layers of a :class:`companion.model.Transformer`.

``num_kv_heads`` (grouped-query or multi-query attention, in every attention module) and
``positional`` (``"rope"`` or ``"alibi"``, in the self-attention only) are passed through to
:class:`~companion.attention.MultiHeadAttention`.

The layers compute exactly what ``torch.nn.TransformerEncoderLayer`` /
``torch.nn.TransformerDecoderLayer`` (``batch_first=True``) compute; :mod:`companion.interop`
copies weights between the two.

Attention weights for plots: call a layer with ``need_weights=True`` and read
``layer.self_attention_weights`` (and ``layer.cross_attention_weights`` for a decoder layer),
each ``(batch, heads, q_len, k_len)``. They hold the weights of the most recent call and are
reset to ``None`` by a call without ``need_weights``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion import kernels
from companion._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_floating,
    check_min_ndim,
    check_module_dtype,
    check_positive_int,
    check_probability,
    check_sequence,
    check_size,
    checked,
    shape_str,
)
from companion.attention import MultiHeadAttention
from companion.cache import DecoderLayerCache, KeyValueCache
from companion.dropout import Dropout

__all__ = ["FeedForward", "EncoderLayer", "DecoderLayer", "ACTIVATIONS", "NORMS", "make_norm"]

#: Activation functions of the feed-forward network, by name (GELU is the exact, erf form).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}

#: The normalisations a layer can use: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm).
NORMS: tuple[str, ...] = ("layer", "rms")


class _RMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` for torch < 2.4 (same parameter ``weight``, same result)."""

    def __init__(self, normalized_shape: int, eps: float) -> None:
        super().__init__()
        self.normalized_shape = (normalized_shape,)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return self.weight * (x / rms)  # (..., d_model)


def make_norm(kind: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    r"""The normalisation of every sub-layer, over the last axis ``(..., d_model)`` → same.

    * ``"layer"``: ``torch.nn.LayerNorm``,
      :math:`\gamma \odot (x - \mu) / \sqrt{\sigma^2 + \varepsilon} + \beta`
      (the bias :math:`\beta` only when ``bias``);
    * ``"rms"``: ``torch.nn.RMSNorm`` (Zhang & Sennrich, 2019),
      :math:`\gamma \odot x / \sqrt{\operatorname{mean}(x^2) + \varepsilon}`: no mean
      subtraction and no bias, whatever ``bias`` says. On torch < 2.4, which has no
      ``nn.RMSNorm``, a module with the same parameter and result is used.
    """
    check_choice("norm", kind, NORMS)
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    rms_norm = getattr(nn, "RMSNorm", None)
    return _RMSNorm(d_model, eps) if rms_norm is None else rms_norm(d_model, eps=eps)


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``output_proj(dropout(activation(hidden_proj(x))))``.

    The same two-layer network is applied to every position independently (section 3.3 of the
    paper); it widens each vector to ``d_ff`` (usually ``4·d_model``) and back.

    Training with ReLU and dropout on a CPU (eager) computes the same function in fewer passes
    over the wide hidden tensor (:func:`companion.kernels.kept_relu_linear`): the ``dropout``
    module's ``p`` and random decisions are used, but not its ``forward``, so hooks on it do
    not run there.

    Args:
        d_model: size of the input and output vectors.
        d_ff: size of the hidden layer.
        dropout: dropout probability on the hidden activations (training mode only).
        activation: ``"relu"`` (the paper) or ``"gelu"``.
        bias: whether the two linear layers have biases.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.activation_name = check_choice("activation", activation, tuple(ACTIVATIONS))
        self.activation = ACTIVATIONS[activation]
        self.hidden_proj = nn.Linear(d_model, d_ff, bias=check_bool("bias", bias))
        self.output_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = Dropout(check_probability("dropout", dropout))

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}"

    @checked("check_inputs")
    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` → ``(..., d_model)``."""
        hidden = self.hidden_proj(x)  # (..., d_ff)
        if kernels.relu_dropout_applies(self.dropout, self.activation_name, hidden):
            return kernels.kept_relu_linear(
                hidden, self.dropout.p, self.output_proj
            )  # fewer passes
        hidden = self.activation(hidden)  # (..., d_ff)
        return self.output_proj(self.dropout(hidden))  # (..., d_model)

    def check_inputs(self, x: Tensor) -> None:
        """Raise a clear error unless ``x`` is a float tensor ``(..., d_model)``."""
        check_floating("x", x)
        check_min_ndim("x", x, 1, f"(..., {self.d_model})")
        check_size("x", x, -1, self.d_model, f"(..., {self.d_model})")
        check_module_dtype("x", x, self)


def _probability_or(name: str, value: float | None, default: float) -> float:
    """``value`` checked as a probability, or ``default`` when it is ``None``."""
    return default if value is None else check_probability(name, value)


class _ResidualLayer(nn.Module):
    """What encoder and decoder layers share: sizes, residual dropout, Pre-/Post-LN, feed-forward."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float,
        activation: str,
        norm_first: bool,
        layer_norm_eps: float,
        bias: bool,
        residual_scale: float,
        norm: str,
        num_kv_heads: int | None,
        positional: str | None,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        #: Key/value heads of every attention (checked by :class:`MultiHeadAttention`).
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        #: ``None``, ``"rope"`` or ``"alibi"``: what the self-attention applies (never the
        #: cross-attention).
        self.positional = positional
        self.norm_first = check_bool("norm_first", norm_first)
        self.residual_scale = residual_scale  # checked by the property below
        self.layer_norm_eps = float(layer_norm_eps)
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {layer_norm_eps}")
        self.bias = check_bool("bias", bias)
        self.norm = check_choice("norm", norm, NORMS)
        #: Dropout on the residual branches (and, by default, everywhere else).
        self.dropout = check_probability("dropout", dropout)
        #: Dropout on the attention weights; ``None`` given = :attr:`dropout`.
        self.attention_dropout = _probability_or("attention_dropout", attention_dropout, dropout)
        #: Dropout on the feed-forward hidden layer; ``None`` given = :attr:`dropout`.
        self.activation_dropout = _probability_or("activation_dropout", activation_dropout, dropout)
        self.feed_forward = FeedForward(
            d_model, d_ff, dropout=self.activation_dropout, activation=activation, bias=bias
        )
        self.residual_dropout = Dropout(dropout)

    def attention(self, positional: str | None = None) -> MultiHeadAttention:
        return MultiHeadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.attention_dropout,
            bias=self.bias,
            num_kv_heads=self.num_kv_heads,
            positional=positional,
        )

    def layer_norm(self) -> nn.Module:
        return make_norm(self.norm, self.d_model, eps=self.layer_norm_eps, bias=self.bias)

    def residual(self, x: Tensor, sublayer: Callable[[Tensor], Tensor], norm: nn.Module) -> Tensor:
        """One sub-layer with its residual connection, ``(batch, len, d_model)`` → same:
        Pre-LN ``x + dropout(sublayer(norm(x)))``, Post-LN ``norm(α·x + dropout(sublayer(x)))``."""
        if self.norm_first:
            return x + self.residual_dropout(sublayer(norm(x)))  # (batch, len, d_model)
        scaled = x if self.residual_scale == 1 else self.residual_scale * x  # α·x, no ×1 pass
        return norm(scaled + self.residual_dropout(sublayer(x)))  # (batch, len, d_model)

    def self_attend(
        self,
        x: Tensor,
        mask: Tensor | None,
        need_weights: bool,
        is_causal: bool,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        """Self-attention, ``(batch, len, d_model)`` → same; keeps the weights if asked."""
        out, self.self_attention_weights = self.self_attention(
            x, x, x, mask, need_weights=need_weights, is_causal=is_causal, cache=cache
        )  # (batch, len, d_model), (batch, heads, len, keys) or None
        return out

    @property
    def residual_scale(self) -> float:
        """α of DeepNorm: Post-LN sub-layers compute ``norm(α·x + dropout(sublayer(x)))``."""
        return self._residual_scale

    @residual_scale.setter
    def residual_scale(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"residual_scale must be a positive float, got {type(value).__name__}")
        if not (0.0 < float(value) < float("inf")):
            raise ValueError(f"residual_scale must be a positive finite number, got {value}")
        if self.norm_first and value != 1:
            raise ValueError(
                f"residual_scale must be 1 for a Pre-LN layer (norm_first=True), got {value}: "
                "the scaled residual (DeepNorm) is defined for Post-LN"
            )
        self._residual_scale = float(value)


class EncoderLayer(_ResidualLayer):
    """One encoder layer: self-attention, then feed-forward, each with residual + LayerNorm.

    Post-LN (``norm_first=False``)::

        x = self_attention_norm(x + dropout(self_attention(x, x, x)))
        x = feed_forward_norm(x + dropout(feed_forward(x)))

    Pre-LN (``norm_first=True``)::

        x = x + dropout(self_attention(self_attention_norm(x), ...))
        x = x + dropout(feed_forward(feed_forward_norm(x)))

    Args:
        d_model: size of the vectors; divisible by ``num_heads``.
        num_heads: attention heads.
        d_ff: hidden size of the feed-forward network.
        dropout: dropout probability of the residual branches and, unless the two arguments
            below say otherwise, of the attention weights and the feed-forward hidden layer
            (one probability everywhere, as in ``torch.nn.TransformerEncoderLayer``).
        activation: ``"relu"`` or ``"gelu"``.
        norm_first: Pre-LN if ``True``, Post-LN (the paper) if ``False``.
        layer_norm_eps: epsilon of the LayerNorms (or RMSNorms).
        bias: biases in the linear layers and LayerNorms (an RMSNorm never has one).
        residual_scale: α multiplying the residual path of a Post-LN layer,
            ``norm(α·x + dropout(sublayer(x)))`` (DeepNorm); must be 1 for Pre-LN.
        norm: ``"layer"`` (LayerNorm, the paper) or ``"rms"`` (RMSNorm), see :func:`make_norm`.
        num_kv_heads: key/value heads of the attention modules (grouped-query attention,
            :class:`~companion.attention.MultiHeadAttention`); ``None`` = ``num_heads``.
        positional: ``None``, ``"rope"`` or ``"alibi"``: positions applied inside the
            self-attention (cross-attention never takes any).
        attention_dropout: dropout on the attention weights; ``None`` = ``dropout``.
        activation_dropout: dropout on the feed-forward hidden layer; ``None`` = ``dropout``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        residual_scale: float = 1.0,
        norm: str = "layer",
        num_kv_heads: int | None = None,
        positional: str | None = None,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
            activation=activation,
            norm_first=norm_first,
            layer_norm_eps=layer_norm_eps,
            bias=bias,
            residual_scale=residual_scale,
            norm=norm,
            num_kv_heads=num_kv_heads,
            positional=positional,
        )
        self.self_attention = self.attention(positional)
        self.self_attention_norm = self.layer_norm()
        self.feed_forward_norm = self.layer_norm()
        #: Weights ``(batch, heads, len, len)`` of the last call with ``need_weights=True``.
        self.self_attention_weights: Tensor | None = None

    @checked("check_inputs")
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        """Encode a sequence.

        Args:
            x: shape ``(batch, src_len, d_model)``.
            mask: boolean self-attention mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, src_len, src_len)``, e.g. padding ``(batch, 1, 1, src_len)``
                (with a ``cache``, the last axis counts the cached positions too).
            need_weights: store the attention weights in ``self_attention_weights``.
            is_causal: also apply a causal mask (for decoder-only models).
            cache: a growing :class:`~companion.cache.KeyValueCache` of the self-attention:
                ``x`` holds only the new positions, which attend to the cached ones too (a
                decoder-only model generating token by token).

        Returns:
            Tensor of shape ``(batch, src_len, d_model)``.
        """
        x = self.residual(
            x,
            lambda h: self.self_attend(h, mask, need_weights, is_causal, cache),
            self.self_attention_norm,
        )  # (batch, src_len, d_model)
        return self.residual(
            x, self.feed_forward, self.feed_forward_norm
        )  # (batch, src_len, d_model)

    def check_inputs(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KeyValueCache | None = None,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        check_sequence("x", x, self.d_model, "src_len")
        check_module_dtype("x", x, self)
        if cache is not None:  # the attention knows how many keys the cache adds
            self.self_attention.check_inputs(
                x, x, x, mask, need_weights=need_weights, is_causal=is_causal, cache=cache
            )
            return
        batch, src_len, _ = x.shape
        if mask is not None:
            target = (batch, self.num_heads, src_len, src_len)
            check_bool_mask("mask", mask, target, "(batch, heads, src_len, src_len)")
        check_bool("need_weights", need_weights)
        check_bool("is_causal", is_causal)


class DecoderLayer(_ResidualLayer):
    """One decoder layer: masked self-attention, cross-attention over the encoder output
    (``memory``), feed-forward; each with residual + LayerNorm (Pre-LN or Post-LN).

    Post-LN (``norm_first=False``)::

        x = self_attention_norm(x + dropout(self_attention(x, x, x, causal)))
        x = cross_attention_norm(x + dropout(cross_attention(x, memory, memory)))
        x = feed_forward_norm(x + dropout(feed_forward(x)))

    Args: as :class:`EncoderLayer`.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        residual_scale: float = 1.0,
        norm: str = "layer",
        num_kv_heads: int | None = None,
        positional: str | None = None,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
            activation=activation,
            norm_first=norm_first,
            layer_norm_eps=layer_norm_eps,
            bias=bias,
            residual_scale=residual_scale,
            norm=norm,
            num_kv_heads=num_kv_heads,
            positional=positional,
        )
        self.self_attention = self.attention(positional)
        self.cross_attention = self.attention()  # no positions across two sequences
        self.self_attention_norm = self.layer_norm()
        self.cross_attention_norm = self.layer_norm()
        self.feed_forward_norm = self.layer_norm()
        #: Weights ``(batch, heads, tgt_len, tgt_len)`` of the last call with ``need_weights``.
        self.self_attention_weights: Tensor | None = None
        #: Weights ``(batch, heads, tgt_len, src_len)`` of the last call with ``need_weights``.
        self.cross_attention_weights: Tensor | None = None

    @checked("check_inputs")
    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = True,
        cache: DecoderLayerCache | None = None,
    ) -> Tensor:
        """Decode: every target position attends to earlier targets and to the whole source.

        Args:
            x: target sequence, shape ``(batch, tgt_len, d_model)``.
            memory: encoder output, shape ``(batch, src_len, d_model)``.
            tgt_mask: boolean self-attention mask (``True`` = may attend) broadcastable to
                ``(batch, heads, tgt_len, tgt_len)``, e.g. target padding
                ``(batch, 1, 1, tgt_len)``; combined with the causal mask when ``is_causal``.
            memory_mask: boolean cross-attention mask broadcastable to
                ``(batch, heads, tgt_len, src_len)``, e.g. source padding ``(batch, 1, 1, src_len)``.
            need_weights: store ``self_attention_weights`` and ``cross_attention_weights``.
            is_causal: apply the causal mask in self-attention (default; a decoder must not
                see the future). ``False`` uses ``tgt_mask`` alone.
            cache: keys and values of the earlier decoding steps (a
                :class:`~companion.cache.DecoderLayerCache`), updated in place; ``x`` then
                holds only the new positions, and ``tgt_mask`` covers the cached keys too:
                ``(batch, heads, tgt_len, cached_len + tgt_len)``.

        Returns:
            Tensor of shape ``(batch, tgt_len, d_model)``.
        """
        own, cross = (
            (None, None) if cache is None else (cache.self_attention, cache.cross_attention)
        )
        x = self.residual(
            x,
            lambda h: self.self_attend(h, tgt_mask, need_weights, is_causal, own),
            self.self_attention_norm,
        )  # (batch, tgt_len, d_model)
        x = self.residual(
            x,
            lambda h: self.cross_attend(h, memory, memory_mask, need_weights, cross),
            self.cross_attention_norm,
        )  # (batch, tgt_len, d_model)
        return self.residual(
            x, self.feed_forward, self.feed_forward_norm
        )  # (batch, tgt_len, d_model)

    def cross_attend(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None,
        need_weights: bool,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        """Cross-attention from ``x (batch, tgt_len, d_model)`` to ``memory``; same shape out."""
        out, self.cross_attention_weights = self.cross_attention(
            x, memory, memory, mask, need_weights=need_weights, cache=cache
        )  # (batch, tgt_len, d_model), (batch, heads, tgt_len, src_len) or None
        return out

    def check_inputs(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = True,
        cache: DecoderLayerCache | None = None,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        check_sequence("x", x, self.d_model, "tgt_len")
        check_sequence("memory", memory, self.d_model, "src_len")
        check_module_dtype("x", x, self)
        check_module_dtype("memory", memory, self)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"memory must have the same batch size as x: x has shape {shape_str(x.shape)}, "
                f"so memory must be ({x.shape[0]}, src_len, {self.d_model}), "
                f"got {shape_str(memory.shape)}"
            )
        if cache is not None and not isinstance(cache, DecoderLayerCache):
            raise TypeError(f"cache must be a DecoderLayerCache, got {type(cache).__name__}")
        batch, tgt_len, _ = x.shape
        keys, src_len = tgt_len, memory.shape[1]
        if cache is not None:  # self-attention keys: cached + new; the cache fits this batch
            keys = self.self_attention.cached_length(
                cache.self_attention, batch, tgt_len, "cache.self_attention"
            )
            src_len = self.cross_attention.cached_length(  # a filled cache's keys win
                cache.cross_attention, batch, src_len, "cache.cross_attention"
            )
        layout = "tgt_len" if cache is None else "cached_len + tgt_len"
        if tgt_mask is not None:
            target = (batch, self.num_heads, tgt_len, keys)
            check_bool_mask("tgt_mask", tgt_mask, target, f"(batch, heads, tgt_len, {layout})")
        if memory_mask is not None:
            target = (batch, self.num_heads, tgt_len, src_len)
            check_bool_mask("memory_mask", memory_mask, target, "(batch, heads, tgt_len, src_len)")
        check_bool("need_weights", need_weights)
        check_bool("is_causal", is_causal)
