"""Conversion between ``companion`` modules and their ``torch.nn`` counterparts.

The course checks every module against PyTorch's own implementation with the same weights
(chapters 3, 5, 7). Everything that knows how ``torch.nn`` stores its parameters lives here,
so the teaching modules contain only the Transformer itself:

* :func:`to_torch` - a new ``torch.nn`` module with the weights of a ``companion`` one;
* :func:`from_torch` - a new ``companion`` module with the weights of a ``torch.nn`` one;
* :func:`load_from_torch` / :func:`copy_to_torch` - copy weights between existing modules;
* the mask converters: ``torch.nn.MultiheadAttention`` and ``torch.nn.Transformer`` mark
  *blocked* positions with ``True``, this package marks the positions that *may be attended*
  (:mod:`companion.masking`).

=======================================  =========================================
companion                                torch.nn (``batch_first=True``)
=======================================  =========================================
:class:`~companion.attention.MultiHeadAttention`  ``MultiheadAttention``
:class:`~companion.layers.EncoderLayer`  ``TransformerEncoderLayer``
:class:`~companion.layers.DecoderLayer`  ``TransformerDecoderLayer``
:class:`~companion.model.Encoder`        ``TransformerEncoder``
:class:`~companion.model.Decoder`        ``TransformerDecoder``
:class:`~companion.model.Transformer`    ``Transformer`` (stacks only: torch's has no
                                         embeddings or generator)
=======================================  =========================================
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import (
    check_bool_mask,
    check_bool_tensor,
    check_ndim,
    check_positive_int,
    check_tensor,
    shape_str,
)
from companion.attention import MultiHeadAttention
from companion.layers import DecoderLayer, EncoderLayer
from companion.masking import from_additive_mask
from companion.model import Decoder, Encoder, Transformer

__all__ = [
    "to_torch",
    "from_torch",
    "load_from_torch",
    "copy_to_torch",
    "from_torch_key_padding_mask",
    "to_torch_key_padding_mask",
    "from_torch_attn_mask",
    "to_torch_attn_mask",
]

Layer = EncoderLayer | DecoderLayer
TorchLayer = nn.TransformerEncoderLayer | nn.TransformerDecoderLayer


# ---------------------------------------------------------------------------------------------
# The four entry points
# ---------------------------------------------------------------------------------------------


def to_torch(module: nn.Module) -> nn.Module:
    """A new ``torch.nn`` module (``batch_first=True``, same device and dtype) with the weights
    of ``module``: a MultiHeadAttention, EncoderLayer, DecoderLayer, Encoder, Decoder or
    Transformer (its two stacks; see the table in the module docstring)."""
    _check_torch_has_it(module)
    if isinstance(module, MultiHeadAttention):
        return _attention_to_torch(module)
    if isinstance(module, (EncoderLayer, DecoderLayer)):
        return _layer_to_torch(module)
    if isinstance(module, (Encoder, Decoder)):
        return _stack_to_torch(module)
    if isinstance(module, Transformer):
        return _transformer_to_torch(module)
    raise TypeError(
        f"module must be a companion module with a torch.nn counterpart, got {_name(module)}"
    )


def from_torch(module: nn.Module) -> nn.Module:
    """A new ``companion`` module (same device and dtype) with the configuration and weights of
    a ``torch.nn.MultiheadAttention``, ``TransformerEncoderLayer`` or ``TransformerDecoderLayer``
    (``batch_first=True``)."""
    if isinstance(module, nn.MultiheadAttention):
        _check_torch_attention("module", module)
        ours: nn.Module = MultiHeadAttention(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
        )
    elif isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        cls = EncoderLayer if isinstance(module, nn.TransformerEncoderLayer) else DecoderLayer
        options = _layer_options_from_torch(module)
        if options["activation"] is None:
            raise ValueError(
                f"module.activation must be relu or gelu to be copied, got {module.activation!r}"
            )
        d_model, num_heads, d_ff = (
            options.pop("d_model"),
            options.pop("num_heads"),
            options.pop("d_ff"),
        )
        ours = cls(d_model, num_heads, d_ff, **options)
    else:
        raise TypeError(
            "module must be a torch.nn.MultiheadAttention, TransformerEncoderLayer or "
            f"TransformerDecoderLayer, got {_name(module)}"
        )
    weight = next(module.parameters())
    ours.to(device=weight.device, dtype=weight.dtype)
    load_from_torch(ours, module)
    return ours


def load_from_torch(ours: nn.Module, theirs: nn.Module) -> None:
    """Copy the weights of the ``torch.nn`` module ``theirs`` into the matching ``companion``
    module ``ours`` (same sizes; a clear error names what differs)."""
    _check_torch_has_it(ours)
    if isinstance(ours, MultiHeadAttention):
        _check_torch_attention("theirs", theirs)
        _check_same_attention(ours, theirs)
        with torch.no_grad():
            weights = theirs.in_proj_weight.chunk(3, dim=0)  # 3 × (d_model, d_model)
            biases = (None,) * 3 if theirs.in_proj_bias is None else theirs.in_proj_bias.chunk(3)
            for proj, w, b in zip(_input_projections(ours), weights, biases):
                proj.weight.copy_(w)
                if b is not None:
                    proj.bias.copy_(b)
        _copy_params(theirs.out_proj, ours.out_proj)
    elif isinstance(ours, (EncoderLayer, DecoderLayer)):
        _check_same_layer(ours, theirs)
        for attention, torch_attention in _attention_pairs(ours, theirs):
            load_from_torch(attention, torch_attention)
        for mine, torch_module in _norm_and_linear_pairs(ours, theirs):
            _copy_params(torch_module, mine)
    elif isinstance(ours, (Encoder, Decoder)):
        _check_same_stack(ours, theirs)
        for layer, torch_layer in zip(ours.layers, theirs.layers):
            load_from_torch(layer, torch_layer)
        if ours.final_norm is not None:
            _copy_params(theirs.norm, ours.final_norm)
    elif isinstance(ours, Transformer):
        if not isinstance(theirs, nn.Transformer):
            raise TypeError(f"theirs must be a torch.nn.Transformer, got {_name(theirs)}")
        load_from_torch(ours.encoder, theirs.encoder)
        load_from_torch(ours.decoder, theirs.decoder)
    else:
        raise TypeError(
            f"ours must be a companion module with a torch.nn counterpart, got {_name(ours)}"
        )


def copy_to_torch(ours: nn.Module, theirs: nn.Module) -> None:
    """Copy the weights of the ``companion`` module ``ours`` (attention or layer) into the
    existing, matching ``torch.nn`` module ``theirs``."""
    _check_torch_has_it(ours)
    if isinstance(ours, MultiHeadAttention):
        _check_torch_attention("theirs", theirs)
        _check_same_attention(ours, theirs)
        with torch.no_grad():
            projections = _input_projections(ours)
            theirs.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
            if ours.bias:
                theirs.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
        _copy_params(ours.out_proj, theirs.out_proj)
    elif isinstance(ours, (EncoderLayer, DecoderLayer)):
        _check_same_layer(ours, theirs)
        for attention, torch_attention in _attention_pairs(ours, theirs):
            copy_to_torch(attention, torch_attention)
        for mine, torch_module in _norm_and_linear_pairs(ours, theirs):
            _copy_params(mine, torch_module)
    else:
        raise TypeError(
            f"ours must be a MultiHeadAttention, EncoderLayer or DecoderLayer, got {_name(ours)}"
        )


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def _check_torch_has_it(module: object) -> None:
    """Refuse a module whose attention ``torch.nn`` cannot express: grouped-query or
    multi-query attention (``nn.MultiheadAttention`` has one key/value head per query head)
    and positions inside attention (RoPE, ALiBi). A model without positions (NoPE) converts:
    ``torch.nn.Transformer`` adds none itself either."""
    if not isinstance(module, nn.Module):
        return  # the entry points raise their own TypeError
    for name, attention in module.named_modules():
        if not isinstance(attention, MultiHeadAttention):
            continue
        where = f" ({name})" if name else ""
        if attention.num_kv_heads != attention.num_heads:
            raise ValueError(
                f"cannot convert attention with num_kv_heads={attention.num_kv_heads} and "
                f"num_heads={attention.num_heads}{where} (grouped-query or multi-query "
                "attention) between companion and torch.nn, whose MultiheadAttention has one "
                "key/value head per query head; only num_kv_heads=None (= num_heads) converts"
            )
        if attention.positional is not None:
            raise ValueError(
                f"cannot convert attention with positional={attention.positional!r}{where} "
                "between companion and torch.nn, whose attention has no rotary embedding and "
                "no ALiBi bias; only positional=None (positions added to the embeddings, or "
                "none) converts"
            )


def _input_projections(attention: MultiHeadAttention) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """Ours, in the order of torch's stacked ``in_proj_weight`` rows: query, key, value."""
    return attention.query_proj, attention.key_proj, attention.value_proj


def _attention_to_torch(attention: MultiHeadAttention) -> nn.MultiheadAttention:
    weight = attention.out_proj.weight
    mha = nn.MultiheadAttention(
        attention.d_model,
        attention.num_heads,
        dropout=attention.dropout,
        bias=attention.bias,
        batch_first=True,
        device=weight.device,
        dtype=weight.dtype,
    )
    copy_to_torch(attention, mha)
    return mha


def _check_torch_attention(name: str, mha: object) -> None:
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(f"{name} must be a torch.nn.MultiheadAttention, got {_name(mha)}")
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError(
            f"{name} must use kdim = vdim = embed_dim, add_bias_kv=False and "
            "add_zero_attn=False to be copied (those variants have no counterpart here)"
        )


def _check_same_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    their_shape = (theirs.embed_dim, theirs.num_heads, theirs.in_proj_bias is not None)
    our_shape = (ours.d_model, ours.num_heads, ours.bias)
    if their_shape != our_shape:
        raise ValueError(
            f"theirs (a torch.nn.MultiheadAttention) must have embed_dim={our_shape[0]}, "
            f"num_heads={our_shape[1]}, bias={our_shape[2]} to match this module, got "
            f"embed_dim={their_shape[0]}, num_heads={their_shape[1]}, bias={their_shape[2]}"
        )


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def _torch_activation_name(layer: TorchLayer) -> str | None:
    """``'relu'``/``'gelu'`` for a torch layer's activation, ``None`` for anything else."""
    activation = layer.activation
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if activation is F.gelu or (
        isinstance(activation, nn.GELU) and activation.approximate == "none"
    ):
        return "gelu"
    return None


def _layer_options_from_torch(layer: TorchLayer) -> dict[str, object]:
    """The arguments of our layer class that rebuild ``layer`` (``activation=None`` when it is
    neither ReLU nor exact GELU, which we cannot copy)."""
    return {
        "d_model": layer.linear1.in_features,
        "num_heads": layer.self_attn.num_heads,
        "d_ff": layer.linear1.out_features,
        "dropout": layer.dropout1.p,  # residual branches
        "attention_dropout": layer.self_attn.dropout,
        "activation_dropout": layer.dropout.p,  # torch's name for the feed-forward's
        "activation": _torch_activation_name(layer),
        "norm_first": layer.norm_first,
        "layer_norm_eps": layer.norm1.eps,
        "bias": layer.linear1.bias is not None,
        "norm": "layer",  # torch's layers have LayerNorm only
    }


def _layer_options(layer: Layer) -> dict[str, object]:
    """Our layer's configuration under the names of our constructor."""
    feed_forward = layer.feed_forward
    return {
        "d_model": layer.d_model,
        "num_heads": layer.num_heads,
        "d_ff": feed_forward.d_ff,
        "dropout": layer.residual_dropout.p,  # the modules' values, even if changed since
        "attention_dropout": layer.self_attention.dropout,
        "activation_dropout": feed_forward.dropout.p,
        "activation": feed_forward.activation_name,
        "norm_first": layer.norm_first,
        "layer_norm_eps": layer.layer_norm_eps,
        "bias": layer.bias,
        "norm": layer.norm,
    }


def _check_same_layer(ours: Layer, theirs: object) -> None:
    cls = (
        nn.TransformerEncoderLayer if isinstance(ours, EncoderLayer) else nn.TransformerDecoderLayer
    )
    if not isinstance(theirs, cls):
        raise TypeError(f"the torch layer must be a torch.nn.{cls.__name__}, got {_name(theirs)}")
    if not theirs.self_attn.batch_first:
        raise ValueError(
            "the torch layer must be built with batch_first=True, got batch_first=False"
        )
    mine, other = _layer_options(ours), _layer_options_from_torch(theirs)
    for name in ("dropout", "attention_dropout", "activation_dropout"):  # no weights: may differ
        mine.pop(name), other.pop(name)
    if mine != other:
        diff = ", ".join(
            f"{k}: expected {mine[k]!r}, got {other[k]!r}" for k in mine if mine[k] != other[k]
        )
        raise ValueError(f"the torch layer does not match this layer ({diff})")


def _attention_pairs(
    ours: Layer, theirs: TorchLayer
) -> list[tuple[MultiHeadAttention, nn.MultiheadAttention]]:
    pairs = [(ours.self_attention, theirs.self_attn)]
    if isinstance(ours, DecoderLayer):
        pairs.append((ours.cross_attention, theirs.multihead_attn))
    return pairs


def _norm_and_linear_pairs(ours: Layer, theirs: TorchLayer) -> list[tuple[nn.Module, nn.Module]]:
    """(ours, theirs) for every linear layer and LayerNorm outside attention."""
    pairs = [
        (ours.feed_forward.hidden_proj, theirs.linear1),
        (ours.feed_forward.output_proj, theirs.linear2),
        (ours.self_attention_norm, theirs.norm1),
    ]
    if isinstance(ours, DecoderLayer):
        pairs += [(ours.cross_attention_norm, theirs.norm2), (ours.feed_forward_norm, theirs.norm3)]
    else:
        pairs.append((ours.feed_forward_norm, theirs.norm2))
    return pairs


def _check_layer_norm_only(norm: str, what: str) -> None:
    """torch.nn's Transformer layers take no choice of normalisation: LayerNorm only."""
    if norm != "layer":
        raise ValueError(
            f"cannot convert {what} with norm={norm!r} to torch.nn, whose Transformer layers "
            "have LayerNorm only; only norm='layer' converts"
        )


def _layer_to_torch(layer: Layer) -> TorchLayer:
    _check_layer_norm_only(layer.norm, "a layer")
    if layer.residual_scale != 1:
        raise ValueError(
            f"cannot convert a layer with residual_scale={layer.residual_scale} to torch.nn "
            "(which has no residual scale); only residual_scale=1 converts"
        )
    cls = (
        nn.TransformerEncoderLayer
        if isinstance(layer, EncoderLayer)
        else nn.TransformerDecoderLayer
    )
    options = _layer_options(layer)
    weight = layer.feed_forward.hidden_proj.weight
    torch_layer = cls(
        d_model=options["d_model"],
        nhead=options["num_heads"],
        dim_feedforward=options["d_ff"],
        dropout=options["dropout"],
        activation=options["activation"],
        layer_norm_eps=options["layer_norm_eps"],
        norm_first=options["norm_first"],
        bias=options["bias"],
        batch_first=True,
        device=weight.device,
        dtype=weight.dtype,
    )
    for _, torch_attention in _attention_pairs(layer, torch_layer):
        torch_attention.dropout = options["attention_dropout"]
    torch_layer.dropout.p = options["activation_dropout"]  # the feed-forward's, in torch
    copy_to_torch(layer, torch_layer)
    return torch_layer


# ---------------------------------------------------------------------------------------------
# Stacks and the whole model
# ---------------------------------------------------------------------------------------------


def _check_same_stack(ours: Encoder | Decoder, theirs: object) -> None:
    cls = nn.TransformerEncoder if isinstance(ours, Encoder) else nn.TransformerDecoder
    name = type(ours).__name__
    if not isinstance(theirs, cls):
        raise TypeError(f"the torch stack must be a torch.nn.{cls.__name__}, got {_name(theirs)}")
    if len(theirs.layers) != len(ours.layers):
        raise ValueError(
            f"the torch stack must have {len(ours.layers)} layers to match this {name}, "
            f"got {len(theirs.layers)}"
        )
    if (theirs.norm is None) != (ours.final_norm is None):
        raise ValueError(
            f"the torch stack's norm must be {'None' if ours.final_norm is None else 'a LayerNorm'} "
            f"to match this {name} (final_norm={ours.final_norm is not None}), got "
            f"{type(theirs.norm).__name__}; build it with final_norm={theirs.norm is not None}"
        )


def _stack_to_torch(stack: Encoder | Decoder) -> nn.TransformerEncoder | nn.TransformerDecoder:
    layers = [_layer_to_torch(layer) for layer in stack.layers]
    norm = None
    if stack.final_norm is not None:
        ours = stack.final_norm
        norm = nn.LayerNorm(
            stack.d_model,
            eps=ours.eps,
            bias=ours.bias is not None,
            device=ours.weight.device,
            dtype=ours.weight.dtype,
        )
        _copy_params(ours, norm)
    if isinstance(stack, Encoder):
        torch_stack = nn.TransformerEncoder(
            layers[0], len(layers), norm=norm, enable_nested_tensor=False
        )
    else:
        torch_stack = nn.TransformerDecoder(layers[0], len(layers), norm=norm)
    torch_stack.layers = nn.ModuleList(layers)
    return torch_stack


def _transformer_to_torch(model: Transformer) -> nn.Transformer:
    """A ``torch.nn.Transformer(batch_first=True)`` with the model's two stacks (a missing
    final norm becomes ``norm=None``); torch's has no embeddings or generator."""
    config = model.config
    _check_layer_norm_only(config.norm, "a Transformer")
    weight = model.generator.weight
    with warnings.catch_warnings():  # its encoder is replaced below anyway
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        transformer = nn.Transformer(
            d_model=config.d_model,
            nhead=config.num_heads,
            num_encoder_layers=config.num_layers,
            num_decoder_layers=config.decoder_layers,
            dim_feedforward=config.d_ff,
            dropout=config.dropout,
            activation=config.activation,
            layer_norm_eps=config.layer_norm_eps,
            batch_first=True,
            norm_first=config.norm_first,
            device=weight.device,
            dtype=weight.dtype,
        )
    transformer.encoder = _stack_to_torch(model.encoder)
    transformer.decoder = _stack_to_torch(model.decoder)
    return transformer


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


def _name(value: object) -> str:
    return type(value).__name__


# ---------------------------------------------------------------------------------------------
# Masks: torch.nn marks blocked positions with True, this package the ones that may be attended
# ---------------------------------------------------------------------------------------------


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
