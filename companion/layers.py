"""Transformer layers: the position-wise feed-forward network, the encoder and decoder layers.

Every sub-layer (attention or feed-forward) is wrapped in a residual connection with dropout
and a LayerNorm, placed in one of two ways (``norm_first``):

* **Post-LN** (``norm_first=False``, the original paper): ``x = norm(x + dropout(sublayer(x)))``;
* **Pre-LN** (``norm_first=True``, more stable to train deep): ``x = x + dropout(sublayer(norm(x)))``.

Post-LN layers take ``residual_scale`` (α, default 1), which scales the residual path:
``x = norm(α·x + dropout(sublayer(x)))``, the residual connection of DeepNorm (Wang et al.,
2022, "DeepNet: Scaling Transformers to 1,000 Layers"; chapter 6 pairs it with the β-scaled
initialisation). It is an attribute that can also be set after construction, e.g. on the
layers of a :class:`companion.model.Transformer`.

The layers compute exactly what ``torch.nn.TransformerEncoderLayer`` /
``torch.nn.TransformerDecoderLayer`` (``batch_first=True``) compute, and can copy weights from
and to them (``from_torch``, ``load_from_torch``, ``to_torch``).

Attention weights for plots: call a layer with ``need_weights=True`` and read
``layer.self_attention_weights`` (and ``layer.cross_attention_weights`` for a decoder layer),
each ``(batch, heads, q_len, k_len)``. They hold the weights of the most recent call and are
reset to ``None`` by a call without ``need_weights``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_finite,
    check_floating,
    check_min_ndim,
    check_ndim,
    check_positive_int,
    check_probability,
    check_size,
    shape_str,
)
from companion.attention import KeyValueCache, MultiHeadAttention

__all__ = ["FeedForward", "EncoderLayer", "DecoderLayer", "DecoderLayerCache", "ACTIVATIONS"]

#: Activation functions of the feed-forward network, by name (GELU is the exact, erf form).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


def _check_sequence(name: str, x: object, d_model: int, length: str, finite: bool = True) -> Tensor:
    """Check a ``(batch, length, d_model)`` float tensor (without NaN/inf if ``finite``)."""
    layout = f"(batch, {length}, {d_model})"
    tensor = check_floating(name, x)
    check_ndim(name, tensor, 3, layout)
    check_size(name, tensor, 2, d_model, layout)
    return check_finite(name, tensor) if finite else tensor


def _copy_params(source: nn.Module, target: nn.Module) -> None:
    """Copy the parameters of ``source`` into the identically structured ``target``."""
    with torch.no_grad():
        for (name, src), (_, dst) in zip(source.named_parameters(), target.named_parameters()):
            if src.shape != dst.shape:
                raise ValueError(
                    f"cannot copy parameter {name!r}: expected shape {shape_str(dst.shape)}, "
                    f"got {shape_str(src.shape)}"
                )
            dst.copy_(src)


def _torch_activation_name(layer: nn.Module) -> str | None:
    """``'relu'``/``'gelu'`` for a torch layer's activation, ``None`` for anything else."""
    activation = layer.activation
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if activation is F.gelu or (
        isinstance(activation, nn.GELU) and activation.approximate == "none"
    ):
        return "gelu"
    return None


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``output_proj(dropout(activation(hidden_proj(x))))``.

    The same two-layer network is applied to every position independently (section 3.3 of the
    paper); it widens each vector to ``d_ff`` (usually ``4·d_model``) and back.

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
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}"

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` → ``(..., d_model)``."""
        check_floating("x", x)
        check_min_ndim("x", x, 1, f"(..., {self.d_model})")
        check_size("x", x, -1, self.d_model, f"(..., {self.d_model})")
        hidden = self.activation(self.hidden_proj(x))  # (..., d_ff)
        return self.output_proj(self.dropout(hidden))  # (..., d_model)


class _ResidualLayer(nn.Module):
    """What encoder and decoder layers share: sizes, residual dropout, Pre-/Post-LN, feed-forward."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        activation: str,
        norm_first: bool,
        layer_norm_eps: float,
        bias: bool,
        residual_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.norm_first = check_bool("norm_first", norm_first)
        self.residual_scale = residual_scale  # checked by the property below
        self.layer_norm_eps = float(layer_norm_eps)
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {layer_norm_eps}")
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation, bias)
        self.residual_dropout = nn.Dropout(check_probability("dropout", dropout))
        #: Check ``x`` (and ``memory``) for NaN/inf; a parent stack that has already checked
        #: its input switches this off.
        self.check_finite_inputs = True

    def _layer_norm(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.d_model, eps=self.layer_norm_eps, bias=self.feed_forward_bias)

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

    def _check_no_residual_scale(self) -> None:
        """``torch.nn`` layers have no residual scale: refuse to convert one that is not 1."""
        if self.residual_scale != 1:
            raise ValueError(
                f"cannot convert a layer with residual_scale={self.residual_scale} to torch.nn "
                "(which has no residual scale); only residual_scale=1 converts"
            )

    @property
    def feed_forward_bias(self) -> bool:
        return self.feed_forward.hidden_proj.bias is not None

    def _self_attention_block(
        self,
        x: Tensor,
        mask: Tensor | None,
        need_weights: bool,
        is_causal: bool,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        """Self-attention sub-layer before the residual: ``(batch, len, d_model)`` → same."""
        # out: (batch, len, d_model); weights: (batch, heads, len, len) or None
        out, weights = self.self_attention(x, x, x, mask, need_weights, is_causal, cache)
        self.self_attention_weights = weights
        return self.residual_dropout(out)  # (batch, len, d_model)

    def _feed_forward_block(self, x: Tensor) -> Tensor:
        """Feed-forward sub-layer before the residual: ``(batch, len, d_model)`` → same."""
        return self.residual_dropout(self.feed_forward(x))  # (batch, len, d_model)

    def _config(self) -> dict[str, object]:
        ff = self.feed_forward
        return {
            "d_model": self.d_model,
            "nhead": self.num_heads,
            "dim_feedforward": ff.d_ff,
            "dropout": ff.dropout.p,
            "activation": ff.activation_name,
            "layer_norm_eps": self.layer_norm_eps,
            "norm_first": self.norm_first,
            "bias": self.feed_forward_bias,
        }

    @staticmethod
    def _torch_config(layer: nn.Module) -> dict[str, object]:
        return {
            "d_model": layer.linear1.in_features,
            "nhead": layer.self_attn.num_heads,
            "dim_feedforward": layer.linear1.out_features,
            "dropout": layer.dropout.p,
            "activation": _torch_activation_name(layer),
            "layer_norm_eps": layer.norm1.eps,
            "norm_first": layer.norm_first,
            "bias": layer.linear1.bias is not None,
        }

    def _check_compatible(self, name: str, layer: nn.Module, cls: type) -> None:
        if not isinstance(layer, cls):
            raise TypeError(f"{name} must be a torch.nn.{cls.__name__}, got {type(layer).__name__}")
        if not layer.self_attn.batch_first:
            raise ValueError(f"{name} must be built with batch_first=True, got batch_first=False")
        ours, theirs = self._config(), self._torch_config(layer)
        ours.pop("dropout"), theirs.pop("dropout")  # no weights: may differ
        if ours != theirs:
            diff = ", ".join(
                f"{k}: expected {ours[k]!r}, got {theirs[k]!r}"
                for k in ours
                if ours[k] != theirs[k]
            )
            raise ValueError(f"{name} does not match this layer ({diff})")

    @classmethod
    def _kwargs_from_torch(cls, layer: nn.Module) -> dict[str, object]:
        config = cls._torch_config(layer)
        if config["activation"] is None:
            raise ValueError(
                f"layer.activation must be relu or gelu to be copied, got {layer.activation!r}"
            )
        return {
            "d_model": config["d_model"],
            "num_heads": config["nhead"],
            "d_ff": config["dim_feedforward"],
            "dropout": config["dropout"],
            "activation": config["activation"],
            "norm_first": config["norm_first"],
            "layer_norm_eps": config["layer_norm_eps"],
            "bias": config["bias"],
        }


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
        dropout: dropout probability (attention weights, feed-forward hidden layer, residual
            branches), as in ``torch.nn.TransformerEncoderLayer``.
        activation: ``"relu"`` or ``"gelu"``.
        norm_first: Pre-LN if ``True``, Post-LN (the paper) if ``False``.
        layer_norm_eps: epsilon of the LayerNorms.
        bias: biases in the linear layers and LayerNorms.
        residual_scale: α multiplying the residual path of a Post-LN layer,
            ``norm(α·x + dropout(sublayer(x)))`` (DeepNorm); must be 1 for Pre-LN.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        residual_scale: float = 1.0,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            d_ff,
            dropout,
            activation,
            norm_first,
            layer_norm_eps,
            bias,
            residual_scale,
        )
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout, bias)
        self.self_attention.check_finite_inputs = False  # this layer checks x itself
        self.self_attention_norm = self._layer_norm()
        self.feed_forward_norm = self._layer_norm()
        #: Weights ``(batch, heads, len, len)`` of the last call with ``need_weights=True``.
        self.self_attention_weights: Tensor | None = None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> Tensor:
        """Encode a sequence.

        Args:
            x: shape ``(batch, src_len, d_model)``.
            mask: boolean self-attention mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, src_len, src_len)``, e.g. padding ``(batch, 1, 1, src_len)``.
            need_weights: store the attention weights in ``self_attention_weights``.
            is_causal: also apply a causal mask (for decoder-only models).

        Returns:
            Tensor of shape ``(batch, src_len, d_model)``.
        """
        _check_sequence("x", x, self.d_model, "src_len", self.check_finite_inputs)
        if mask is not None:
            batch, src_len, _ = x.shape
            target = (batch, self.num_heads, src_len, src_len)
            check_bool_mask("mask", mask, target, "(batch, heads, src_len, src_len)")
        if self.norm_first:
            x = x + self._self_attention_block(
                self.self_attention_norm(x), mask, need_weights, is_causal
            )  # (batch, src_len, d_model)
            x = x + self._feed_forward_block(self.feed_forward_norm(x))  # (batch, src_len, d_model)
        else:
            a = self.residual_scale  # α of DeepNorm, 1 for the plain Post-LN of the paper
            x = self.self_attention_norm(
                a * x + self._self_attention_block(x, mask, need_weights, is_causal)
            )  # (batch, src_len, d_model)
            x = self.feed_forward_norm(
                a * x + self._feed_forward_block(x)
            )  # (batch, src_len, d_model)
        return x  # (batch, src_len, d_model)

    # ------------------------------------------------------------- torch.nn

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """A new layer with the configuration and weights of a ``torch.nn.TransformerEncoderLayer``."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(
                f"layer must be a torch.nn.TransformerEncoderLayer, got {type(layer).__name__}"
            )
        weight = layer.linear1.weight
        ours = cls(**cls._kwargs_from_torch(layer)).to(device=weight.device, dtype=weight.dtype)
        ours.load_from_torch(layer)
        return ours

    def _pairs(self, layer: nn.TransformerEncoderLayer) -> list[tuple[nn.Module, nn.Module]]:
        """(ours, theirs) for every linear layer and LayerNorm."""
        return [
            (self.feed_forward.hidden_proj, layer.linear1),
            (self.feed_forward.output_proj, layer.linear2),
            (self.self_attention_norm, layer.norm1),
            (self.feed_forward_norm, layer.norm2),
        ]

    def load_from_torch(self, layer: nn.TransformerEncoderLayer) -> None:
        """Copy the weights of a matching ``torch.nn.TransformerEncoderLayer(batch_first=True)``."""
        self._check_compatible("layer", layer, nn.TransformerEncoderLayer)
        self.self_attention.load_from_torch(layer.self_attn)
        for ours, theirs in self._pairs(layer):
            _copy_params(theirs, ours)

    def to_torch(self) -> nn.TransformerEncoderLayer:
        """A new ``torch.nn.TransformerEncoderLayer(batch_first=True)`` with this layer's weights."""
        self._check_no_residual_scale()
        weight = self.feed_forward.hidden_proj.weight
        layer = nn.TransformerEncoderLayer(
            **self._config(), batch_first=True, device=weight.device, dtype=weight.dtype
        )
        self.self_attention.copy_to_torch(layer.self_attn)
        for ours, theirs in self._pairs(layer):
            _copy_params(ours, theirs)
        return layer


@dataclass
class DecoderLayerCache:
    """What one :class:`DecoderLayer` keeps between incremental decoding steps: the keys and
    values of its self-attention (growing by one step's tokens per call) and of its
    cross-attention (the projected encoder output, computed at the first step)."""

    self_attention: KeyValueCache = field(default_factory=lambda: KeyValueCache(growing=True))
    cross_attention: KeyValueCache = field(default_factory=lambda: KeyValueCache(growing=False))

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)`` (beam search)."""
        self.self_attention.reorder(indices)
        self.cross_attention.reorder(indices)


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
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        residual_scale: float = 1.0,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            d_ff,
            dropout,
            activation,
            norm_first,
            layer_norm_eps,
            bias,
            residual_scale,
        )
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout, bias)
        self.cross_attention = MultiHeadAttention(d_model, num_heads, dropout, bias)
        for attention in (self.self_attention, self.cross_attention):
            attention.check_finite_inputs = False  # this layer checks x and memory itself
        self.self_attention_norm = self._layer_norm()
        self.cross_attention_norm = self._layer_norm()
        self.feed_forward_norm = self._layer_norm()
        #: Weights ``(batch, heads, tgt_len, tgt_len)`` of the last call with ``need_weights``.
        self.self_attention_weights: Tensor | None = None
        #: Weights ``(batch, heads, tgt_len, src_len)`` of the last call with ``need_weights``.
        self.cross_attention_weights: Tensor | None = None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
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
            cache: keys and values of the earlier decoding steps (:class:`DecoderLayerCache`),
                updated in place; ``x`` then holds only the new positions, and ``tgt_mask``
                covers the cached keys too: ``(batch, heads, tgt_len, cached_len + tgt_len)``.

        Returns:
            Tensor of shape ``(batch, tgt_len, d_model)``.
        """
        _check_sequence("x", x, self.d_model, "tgt_len", self.check_finite_inputs)
        _check_sequence("memory", memory, self.d_model, "src_len", self.check_finite_inputs)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"memory must have the same batch size as x: x has shape {shape_str(x.shape)}, "
                f"so memory must be ({x.shape[0]}, src_len, {self.d_model}), "
                f"got {shape_str(memory.shape)}"
            )
        batch, tgt_len, _ = x.shape
        src_len = memory.shape[1]
        if cache is not None and not isinstance(cache, DecoderLayerCache):
            raise TypeError(f"cache must be a DecoderLayerCache, got {type(cache).__name__}")
        self_cache = None if cache is None else cache.self_attention
        cross_cache = None if cache is None else cache.cross_attention
        keys = tgt_len + (0 if self_cache is None else self_cache.length)  # self-attention keys
        if tgt_mask is not None:
            target = (batch, self.num_heads, tgt_len, keys)
            layout = "tgt_len" if self_cache is None else "cached_len + tgt_len"
            check_bool_mask("tgt_mask", tgt_mask, target, f"(batch, heads, tgt_len, {layout})")
        if memory_mask is not None:
            target = (batch, self.num_heads, tgt_len, src_len)
            check_bool_mask("memory_mask", memory_mask, target, "(batch, heads, tgt_len, src_len)")
        if self.norm_first:
            x = x + self._self_attention_block(
                self.self_attention_norm(x), tgt_mask, need_weights, is_causal, self_cache
            )  # (batch, tgt_len, d_model)
            x = x + self._cross_attention_block(
                self.cross_attention_norm(x), memory, memory_mask, need_weights, cross_cache
            )  # (batch, tgt_len, d_model)
            x = x + self._feed_forward_block(self.feed_forward_norm(x))  # (batch, tgt_len, d_model)
        else:
            a = self.residual_scale  # α of DeepNorm, 1 for the plain Post-LN of the paper
            x = self.self_attention_norm(
                a * x + self._self_attention_block(x, tgt_mask, need_weights, is_causal, self_cache)
            )  # (batch, tgt_len, d_model)
            x = self.cross_attention_norm(
                a * x
                + self._cross_attention_block(x, memory, memory_mask, need_weights, cross_cache)
            )  # (batch, tgt_len, d_model)
            x = self.feed_forward_norm(
                a * x + self._feed_forward_block(x)
            )  # (batch, tgt_len, d_model)
        return x  # (batch, tgt_len, d_model)

    def _cross_attention_block(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None,
        need_weights: bool,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        """Cross-attention sub-layer before the residual: ``(batch, tgt_len, d_model)`` → same."""
        # out: (batch, tgt_len, d_model); weights: (batch, heads, tgt_len, src_len) or None
        out, weights = self.cross_attention(x, memory, memory, mask, need_weights, False, cache)
        self.cross_attention_weights = weights
        return self.residual_dropout(out)  # (batch, tgt_len, d_model)

    # ------------------------------------------------------------- torch.nn

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """A new layer with the configuration and weights of a ``torch.nn.TransformerDecoderLayer``."""
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(
                f"layer must be a torch.nn.TransformerDecoderLayer, got {type(layer).__name__}"
            )
        weight = layer.linear1.weight
        ours = cls(**cls._kwargs_from_torch(layer)).to(device=weight.device, dtype=weight.dtype)
        ours.load_from_torch(layer)
        return ours

    def _pairs(self, layer: nn.TransformerDecoderLayer) -> list[tuple[nn.Module, nn.Module]]:
        """(ours, theirs) for every linear layer and LayerNorm."""
        return [
            (self.feed_forward.hidden_proj, layer.linear1),
            (self.feed_forward.output_proj, layer.linear2),
            (self.self_attention_norm, layer.norm1),
            (self.cross_attention_norm, layer.norm2),
            (self.feed_forward_norm, layer.norm3),
        ]

    def load_from_torch(self, layer: nn.TransformerDecoderLayer) -> None:
        """Copy the weights of a matching ``torch.nn.TransformerDecoderLayer(batch_first=True)``."""
        self._check_compatible("layer", layer, nn.TransformerDecoderLayer)
        self.self_attention.load_from_torch(layer.self_attn)
        self.cross_attention.load_from_torch(layer.multihead_attn)
        for ours, theirs in self._pairs(layer):
            _copy_params(theirs, ours)

    def to_torch(self) -> nn.TransformerDecoderLayer:
        """A new ``torch.nn.TransformerDecoderLayer(batch_first=True)`` with this layer's weights."""
        self._check_no_residual_scale()
        weight = self.feed_forward.hidden_proj.weight
        layer = nn.TransformerDecoderLayer(
            **self._config(), batch_first=True, device=weight.device, dtype=weight.dtype
        )
        self.self_attention.copy_to_torch(layer.self_attn)
        self.cross_attention.copy_to_torch(layer.multihead_attn)
        for ours, theirs in self._pairs(layer):
            _copy_params(ours, theirs)
        return layer
