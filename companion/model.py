"""The encoder-decoder Transformer of "Attention Is All You Need", assembled from the layers.

* :class:`TokenEmbedding` - token ids → vectors, scaled by ``√d_model`` (section 3.4).
* :class:`Encoder`, :class:`Decoder` - stacks of :class:`~companion.layers.EncoderLayer` /
  :class:`~companion.layers.DecoderLayer`, with an optional final LayerNorm.
* :class:`Transformer` - embeddings + positions + encoder + decoder + the ``generator``
  (the final linear layer to vocabulary logits), built from a :class:`TransformerConfig`.

The model returns **logits**, never probabilities: the loss (cross-entropy on logits) lives in
:mod:`companion.train` (chapter 8) and the decoding strategies in :mod:`companion.decode`
(chapter 7). Chapter 7 assembles this module's model piece by piece.

Final LayerNorms. A Pre-LN stack (``norm_first=True``) leaves its output un-normalised, so it
needs a final LayerNorm; a Post-LN stack already ends with one. ``final_norm=None`` (default)
therefore means "``norm_first``". Note that ``torch.nn.Transformer`` *always* adds
``encoder.norm`` and ``decoder.norm``, even with ``norm_first=False``: pass
``final_norm=True`` to match it exactly (:meth:`Transformer.load_from_torch` requires it).

Incremental decoding: ``cache = model.new_cache()`` then ``model.decode(new_tokens, memory,
src_mask, cache=cache)`` step by step gives the same logits as decoding the whole prefix at
once, but each step projects only its new tokens (a :class:`DecoderCache` keeps every layer's
keys and values, and the padding of the tokens seen so far; ``cache.reorder(rows)`` follows
the surviving beams). The decoding strategies themselves live in :mod:`companion.decode`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from companion._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_divisible,
    check_finite,
    check_floating,
    check_index_range,
    check_integer,
    check_ndim,
    check_positive_int,
    check_probability,
    check_size,
    shape_str,
)
from companion.layers import (
    ACTIVATIONS,
    DecoderLayer,
    DecoderLayerCache,
    EncoderLayer,
    _check_sequence,
    _copy_params,
)
from companion.masking import causal_mask, padding_mask
from companion.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = [
    "TokenEmbedding",
    "Encoder",
    "Decoder",
    "DecoderCache",
    "TransformerConfig",
    "Transformer",
]


class TokenEmbedding(nn.Module):
    """Token ids → vectors, multiplied by ``√d_model`` as in the paper (section 3.4).

    The table is initialised with standard deviation ``1/√d_model``, so the scaled vectors have
    entries of size about 1 - the same scale as the sinusoidal position encodings they are
    added to (and sensible logits when the table is tied to the output layer).

    Args:
        vocab_size: number of token ids; ids must be in ``[0, vocab_size)``.
        d_model: size of the vectors.
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = check_positive_int("d_model", d_model)
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    @property
    def weight(self) -> nn.Parameter:
        """The table, shape ``(vocab_size, d_model)``."""
        return self.embedding.weight

    def forward(self, tokens: Tensor, name: str = "tokens") -> Tensor:
        """``tokens (...)`` integer ids → ``(..., d_model)``; ``name`` is used in error messages."""
        check_integer(name, tokens)
        check_index_range(name, tokens, self.vocab_size, "vocab_size")
        return self.embedding(tokens) * self.scale  # (..., d_model)


def _stack_weights(weights: list[Tensor | None]) -> Tensor | None:
    """Stack per-layer weights into ``(layers, batch, heads, q_len, k_len)``, or ``None``."""
    if not weights or any(w is None for w in weights):
        return None
    return torch.stack(weights)  # (layers, batch, heads, q_len, k_len)


class _Stack(nn.Module):
    """Shared by :class:`Encoder` and :class:`Decoder`: a list of layers and a final norm."""

    def __init__(
        self,
        layers: list[nn.Module],
        d_model: int,
        norm_first: bool,
        final_norm: bool | None,
        layer_norm_eps: float,
        bias: bool,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        for layer in self.layers:
            layer.check_finite_inputs = False  # the stack checks its input once
        #: Check the input (and ``memory``) for NaN/inf; :class:`Transformer` switches it off.
        self.check_finite_inputs = True
        self.d_model = d_model
        use_final_norm = norm_first if final_norm is None else check_bool("final_norm", final_norm)
        self.final_norm = (
            nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias) if use_final_norm else None
        )

    def load_from_torch(self, stack: nn.Module) -> None:
        """Copy a ``torch.nn.TransformerEncoder``/``TransformerDecoder`` with the same layers.

        Its ``norm`` must exist exactly when this stack has a ``final_norm``.
        """
        name = type(self).__name__
        if len(stack.layers) != len(self.layers):
            raise ValueError(
                f"stack must have {len(self.layers)} layers to match this {name}, "
                f"got {len(stack.layers)}"
            )
        if (stack.norm is None) != (self.final_norm is None):
            raise ValueError(
                f"stack.norm must be {'None' if self.final_norm is None else 'a LayerNorm'} to "
                f"match this {name} (final_norm={self.final_norm is not None}), "
                f"got {type(stack.norm).__name__}; build it with final_norm="
                f"{stack.norm is not None}"
            )
        for ours, theirs in zip(self.layers, stack.layers):
            ours.load_from_torch(theirs)
        if self.final_norm is not None:
            _copy_params(stack.norm, self.final_norm)

    def _torch_norm(self) -> nn.LayerNorm | None:
        if self.final_norm is None:
            return None
        norm = nn.LayerNorm(
            self.d_model,
            eps=self.final_norm.eps,
            bias=self.final_norm.bias is not None,
            device=self.final_norm.weight.device,
            dtype=self.final_norm.weight.dtype,
        )
        _copy_params(self.final_norm, norm)
        return norm


class Encoder(_Stack):
    """``num_layers`` encoder layers, then an optional final LayerNorm.

    Args:
        num_layers: number of :class:`~companion.layers.EncoderLayer`.
        d_model, num_heads, d_ff, dropout, activation, norm_first, layer_norm_eps, bias: as
            :class:`~companion.layers.EncoderLayer`.
        final_norm: add a final LayerNorm; default ``norm_first`` (see the module docstring).
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        final_norm: bool | None = None,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        check_positive_int("num_layers", num_layers)
        layers = [
            EncoderLayer(
                d_model, num_heads, d_ff, dropout, activation, norm_first, layer_norm_eps, bias
            )
            for _ in range(num_layers)
        ]
        super().__init__(layers, d_model, norm_first, final_norm, layer_norm_eps, bias)

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """Encode the (embedded) source.

        Args:
            x: shape ``(batch, src_len, d_model)``.
            mask: boolean self-attention mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, src_len, src_len)``, e.g. ``padding_mask(src, pad_id)``.
            need_weights: store every layer's weights (see :attr:`attention_weights`).

        Returns:
            ``memory`` of shape ``(batch, src_len, d_model)``.
        """
        _check_sequence("x", x, self.d_model, "src_len", self.check_finite_inputs)
        for layer in self.layers:
            x = layer(x, mask, need_weights)  # (batch, src_len, d_model)
        if self.final_norm is not None:
            x = self.final_norm(x)  # (batch, src_len, d_model)
        return x

    @property
    def attention_weights(self) -> Tensor | None:
        """Self-attention weights of the last call with ``need_weights=True``:
        ``(layers, batch, heads, src_len, src_len)``, or ``None``."""
        return _stack_weights([layer.self_attention_weights for layer in self.layers])

    def to_torch(self) -> nn.TransformerEncoder:
        """A ``torch.nn.TransformerEncoder`` (batch-first layers) with this stack's weights."""
        layers = [layer.to_torch() for layer in self.layers]
        stack = nn.TransformerEncoder(
            layers[0], len(layers), norm=self._torch_norm(), enable_nested_tensor=False
        )
        stack.layers = nn.ModuleList(layers)
        return stack


class DecoderCache:
    """Everything the decoder keeps between incremental decoding steps.

    Attributes:
        layers: one :class:`~companion.layers.DecoderLayerCache` per decoder layer.
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

    def reorder(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ``(new_batch,)``, e.g. the surviving beams."""
        check_integer("indices", indices)
        check_ndim("indices", indices, 1, "(new_batch,)")
        for layer in self.layers:
            layer.reorder(indices)
        if self.key_padding is not None:
            self.key_padding = self.key_padding.index_select(0, indices)  # (new_batch, length)


class Decoder(_Stack):
    """``num_layers`` decoder layers, then an optional final LayerNorm.

    Args: as :class:`Encoder`, with :class:`~companion.layers.DecoderLayer`.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        final_norm: bool | None = None,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        check_positive_int("num_layers", num_layers)
        layers = [
            DecoderLayer(
                d_model, num_heads, d_ff, dropout, activation, norm_first, layer_norm_eps, bias
            )
            for _ in range(num_layers)
        ]
        super().__init__(layers, d_model, norm_first, final_norm, layer_norm_eps, bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = True,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Decode the (embedded) target given the encoder output.

        Args:
            x: shape ``(batch, tgt_len, d_model)``.
            memory: encoder output, shape ``(batch, src_len, d_model)``.
            tgt_mask: boolean self-attention mask broadcastable to
                ``(batch, heads, tgt_len, tgt_len)`` (e.g. target padding), combined with the
                causal mask when ``is_causal``.
            memory_mask: boolean cross-attention mask broadcastable to
                ``(batch, heads, tgt_len, src_len)`` (e.g. source padding).
            need_weights: store every layer's weights (see :attr:`attention_weights`,
                :attr:`cross_attention_weights`).
            is_causal: apply the causal mask (default).
            cache: keys and values of the earlier steps (:meth:`new_cache`), updated in place;
                ``x`` then holds only the new positions and ``tgt_mask`` also covers the
                cached ones: ``(batch, heads, tgt_len, cached_len + tgt_len)``.

        Returns:
            Tensor of shape ``(batch, tgt_len, d_model)``.
        """
        _check_sequence("x", x, self.d_model, "tgt_len", self.check_finite_inputs)
        _check_sequence("memory", memory, self.d_model, "src_len", self.check_finite_inputs)
        if cache is not None and not isinstance(cache, DecoderCache):
            raise TypeError(f"cache must be a DecoderCache, got {type(cache).__name__}")
        if is_causal and tgt_mask is not None:
            # Combine the two masks once here instead of once per layer.
            batch, tgt_len, _ = x.shape
            keys = tgt_len + (0 if cache is None else cache.length)
            target = (batch, self.layers[0].num_heads, tgt_len, keys)
            layout = "tgt_len" if cache is None else "cached_len + tgt_len"
            check_bool_mask("tgt_mask", tgt_mask, target, f"(batch, heads, tgt_len, {layout})")
            causal = causal_mask(tgt_len, keys, device=x.device)  # (tgt_len, keys)
            tgt_mask = tgt_mask & causal  # (batch or 1, heads or 1, tgt_len, keys)
            is_causal = False
        for i, layer in enumerate(self.layers):  # x stays (batch, tgt_len, d_model)
            layer_cache = None if cache is None else cache.layers[i]
            x = layer(x, memory, tgt_mask, memory_mask, need_weights, is_causal, layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)  # (batch, tgt_len, d_model)
        return x

    @property
    def attention_weights(self) -> Tensor | None:
        """Self-attention weights of the last call with ``need_weights=True``:
        ``(layers, batch, heads, tgt_len, tgt_len)``, or ``None``."""
        return _stack_weights([layer.self_attention_weights for layer in self.layers])

    def new_cache(self) -> DecoderCache:
        """An empty :class:`DecoderCache` for incremental decoding with this decoder."""
        return DecoderCache(len(self.layers))

    @property
    def cross_attention_weights(self) -> Tensor | None:
        """Cross-attention weights of the last call with ``need_weights=True``:
        ``(layers, batch, heads, tgt_len, src_len)``, or ``None``."""
        return _stack_weights([layer.cross_attention_weights for layer in self.layers])

    def to_torch(self) -> nn.TransformerDecoder:
        """A ``torch.nn.TransformerDecoder`` (batch-first layers) with this stack's weights."""
        layers = [layer.to_torch() for layer in self.layers]
        stack = nn.TransformerDecoder(layers[0], len(layers), norm=self._torch_norm())
        stack.layers = nn.ModuleList(layers)
        return stack


POSITIONAL_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of a :class:`Transformer`; the defaults are the paper's base model.

    Attributes:
        src_vocab, tgt_vocab: vocabulary sizes.
        d_model: size of every vector in the model.
        num_heads: attention heads (``d_model`` must be divisible by it).
        num_layers: encoder layers (and decoder layers unless ``num_decoder_layers``).
        d_ff: hidden size of the feed-forward networks.
        dropout: dropout probability everywhere (embeddings + positions, attention weights,
            feed-forward hidden layer, residual branches).
        norm_first: Pre-LN (``True``) or Post-LN (``False``, the paper).
        tie_embeddings: share one matrix between the target embedding and the generator
            (Press & Wolf, 2017).
        tie_source_embedding: the source embedding uses the target embedding's matrix too
            (section 3.4 of the paper, for a vocabulary shared by both languages); needs
            ``src_vocab == tgt_vocab``. With ``tie_embeddings`` one matrix serves all three.
        num_decoder_layers: decoder layers; default ``num_layers``.
        activation: ``"relu"`` or ``"gelu"`` in the feed-forward networks.
        positional: ``"sinusoidal"`` (grows to any length) or ``"learned"`` (``max_len``).
        max_len: (initial) number of positions of the position table.
        src_pad_id, tgt_pad_id: padding ids used to build the default masks, or ``None``.
        final_norm: final LayerNorm after each stack; default ``norm_first``
            (``torch.nn.Transformer`` always has one - pass ``True`` to match it).
        layer_norm_eps: epsilon of every LayerNorm.
    """

    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    norm_first: bool = False
    tie_embeddings: bool = False
    num_decoder_layers: int | None = None
    activation: str = "relu"
    positional: str = "sinusoidal"
    max_len: int = 5000
    src_pad_id: int | None = None
    tgt_pad_id: int | None = None
    final_norm: bool | None = None
    layer_norm_eps: float = 1e-5
    tie_source_embedding: bool = False

    def __post_init__(self) -> None:
        check_positive_int("src_vocab", self.src_vocab)
        check_positive_int("tgt_vocab", self.tgt_vocab)
        check_positive_int("d_model", self.d_model)
        check_positive_int("num_heads", self.num_heads)
        check_divisible("d_model", self.d_model, "num_heads", self.num_heads)
        check_positive_int("num_layers", self.num_layers)
        if self.num_decoder_layers is not None:
            check_positive_int("num_decoder_layers", self.num_decoder_layers)
        check_positive_int("d_ff", self.d_ff)
        check_probability("dropout", self.dropout)
        check_bool("norm_first", self.norm_first)
        check_bool("tie_embeddings", self.tie_embeddings)
        check_bool("tie_source_embedding", self.tie_source_embedding)
        if self.tie_source_embedding and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                "tie_source_embedding needs one vocabulary shared by source and target "
                f"(src_vocab == tgt_vocab), got src_vocab={self.src_vocab} and "
                f"tgt_vocab={self.tgt_vocab}"
            )
        check_choice("activation", self.activation, tuple(ACTIVATIONS))
        check_choice("positional", self.positional, POSITIONAL_KINDS)
        check_positive_int("max_len", self.max_len)
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"d_model must be even for sinusoidal positions (sin/cos pairs), got {self.d_model}"
            )
        for name, pad_id, vocab in (
            ("src_pad_id", self.src_pad_id, self.src_vocab),
            ("tgt_pad_id", self.tgt_pad_id, self.tgt_vocab),
        ):
            if pad_id is not None:
                check_positive_int(name, pad_id, minimum=0)
                if pad_id >= vocab:
                    vocab_name = name[:3] + "_vocab"
                    raise ValueError(
                        f"{name} must be in [0, {vocab - 1}] ({vocab_name}={vocab}), got {pad_id}"
                    )
        if self.final_norm is not None:
            check_bool("final_norm", self.final_norm)
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")

    @property
    def decoder_layers(self) -> int:
        """Number of decoder layers."""
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers


def _padding_mask_or_none(tokens: Tensor, pad_id: int | None) -> Tensor | None:
    """``padding_mask(tokens, pad_id)`` ``(batch, 1, 1, len)``; ``None`` if nothing is padding."""
    if pad_id is None:
        return None
    mask = padding_mask(tokens, pad_id)  # (batch, 1, 1, len)
    return None if bool(mask.all()) else mask


class Transformer(nn.Module):
    """The encoder-decoder Transformer (Vaswani et al., 2017), returning logits.

    ``src`` → :class:`TokenEmbedding` (×√d_model) + positions → :class:`Encoder` → ``memory``;
    ``tgt`` (the target shifted right) → embedding + positions → :class:`Decoder` (causal
    self-attention, cross-attention to ``memory``) → ``generator`` → logits over ``tgt_vocab``.

    Args:
        src_vocab, tgt_vocab, d_model, num_heads, num_layers, d_ff, dropout, norm_first,
        tie_embeddings, num_decoder_layers, activation, positional, max_len, src_pad_id,
        tgt_pad_id, final_norm, layer_norm_eps, tie_source_embedding: see :class:`TransformerConfig` (which checks
        them all).

    Attributes:
        config: the :class:`TransformerConfig` (``Transformer.from_config(model.config)``
            builds a model of the same shape).
        src_embedding, tgt_embedding, src_positions, tgt_positions, encoder, decoder,
        generator: the parts, usable on their own.
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int = 512,
        num_heads: int = 8,
        num_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        norm_first: bool = False,
        tie_embeddings: bool = False,
        *,
        num_decoder_layers: int | None = None,
        activation: str = "relu",
        positional: str = "sinusoidal",
        max_len: int = 5000,
        src_pad_id: int | None = None,
        tgt_pad_id: int | None = None,
        final_norm: bool | None = None,
        layer_norm_eps: float = 1e-5,
        tie_source_embedding: bool = False,
    ) -> None:
        super().__init__()
        config = TransformerConfig(
            src_vocab=src_vocab,
            tgt_vocab=tgt_vocab,
            d_model=d_model,
            num_heads=num_heads,
            num_layers=num_layers,
            d_ff=d_ff,
            dropout=dropout,
            norm_first=norm_first,
            tie_embeddings=tie_embeddings,
            num_decoder_layers=num_decoder_layers,
            activation=activation,
            positional=positional,
            max_len=max_len,
            src_pad_id=src_pad_id,
            tgt_pad_id=tgt_pad_id,
            final_norm=final_norm,
            layer_norm_eps=layer_norm_eps,
            tie_source_embedding=tie_source_embedding,
        )
        self.config = config
        self.src_embedding = TokenEmbedding(config.src_vocab, d_model)
        self.tgt_embedding = TokenEmbedding(config.tgt_vocab, d_model)
        self.src_positions = self._positional(config)
        self.tgt_positions = self._positional(config)
        stack_args = (d_model, num_heads, d_ff, dropout, config.activation, norm_first)
        stack_kwargs = {"final_norm": config.final_norm, "layer_norm_eps": config.layer_norm_eps}
        self.encoder = Encoder(num_layers, *stack_args, **stack_kwargs)
        self.decoder = Decoder(config.decoder_layers, *stack_args, **stack_kwargs)
        self.generator = nn.Linear(d_model, config.tgt_vocab)
        for module in (self.src_positions, self.tgt_positions, self.encoder, self.decoder):
            module.check_finite_inputs = False  # their inputs come from the embeddings
        self._reset_parameters()
        if tie_embeddings:
            self.generator.weight = self.tgt_embedding.weight
        if tie_source_embedding:
            self.src_embedding.embedding.weight = self.tgt_embedding.weight

    @staticmethod
    def _positional(config: TransformerConfig) -> nn.Module:
        if config.positional == "learned":
            return LearnedPositionalEmbedding(config.max_len, config.d_model, config.dropout)
        return SinusoidalPositionalEncoding(config.d_model, config.max_len, config.dropout)

    def _reset_parameters(self) -> None:
        """Xavier-uniform for every matrix of the two stacks and the generator (as
        ``torch.nn.Transformer`` and the Annotated Transformer do), zero generator bias."""
        for module in (self.encoder, self.decoder, self.generator):
            for parameter in module.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        nn.init.zeros_(self.generator.bias)

    @classmethod
    def from_config(cls, config: TransformerConfig) -> Transformer:
        """Build a model from a :class:`TransformerConfig`."""
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        return cls(**asdict(config))

    # ------------------------------------------------------------------ masks

    def make_src_mask(self, src: Tensor) -> Tensor | None:
        """Padding mask ``(batch, 1, 1, src_len)`` from ``config.src_pad_id``.

        ``None`` without a pad id, or when ``src`` holds no padding at all (then attention
        runs unmasked, which the fused kernels do faster).
        """
        self._check_tokens("src", src, self.config.src_vocab)
        return _padding_mask_or_none(src, self.config.src_pad_id)

    def make_tgt_mask(self, tgt: Tensor) -> Tensor | None:
        """Padding mask ``(batch, 1, 1, tgt_len)`` from ``config.tgt_pad_id``, or ``None``
        (as :meth:`make_src_mask`). Without a padding mask the decoder can use the fused
        causal kernel.

        The causal mask is not included: the decoder always applies it.
        """
        self._check_tokens("tgt", tgt, self.config.tgt_vocab)
        return _padding_mask_or_none(tgt, self.config.tgt_pad_id)

    def _check_tokens(self, name: str, tokens: object, vocab: int) -> Tensor:
        tensor = check_integer(name, tokens)
        check_ndim(name, tensor, 2, f"(batch, {name}_len)")
        if tensor.shape[1] == 0:
            raise ValueError(
                f"{name} must have at least one position, got shape {shape_str(tensor.shape)}"
            )
        return check_index_range(name, tensor, vocab, f"{name}_vocab")

    # --------------------------------------------------------------- forward

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = False
    ) -> Tensor:
        """Encode source token ids.

        Args:
            src: shape ``(batch, src_len)``, ids in ``[0, src_vocab)``.
            src_mask: boolean, ``True`` = may attend, broadcastable to
                ``(batch, heads, src_len, src_len)``; default :meth:`make_src_mask`.
            need_weights: store attention weights (``self.encoder.attention_weights``).

        Returns:
            ``memory`` of shape ``(batch, src_len, d_model)``.
        """
        self._check_tokens("src", src, self.config.src_vocab)
        if src_mask is None:
            src_mask = self.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        x = self.src_positions(self.src_embedding(src, "src"))  # (batch, src_len, d_model)
        return self.encoder(x, src_mask, need_weights)  # (batch, src_len, d_model)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
        offset: int = 0,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        is_causal: bool = True,
    ) -> Tensor:
        """Decode target token ids given the encoder output; returns logits.

        Args:
            tgt: decoder input ids (the target shifted right), shape ``(batch, tgt_len)``.
            memory: encoder output, shape ``(batch, src_len, d_model)``.
            src_mask: boolean mask over the source positions (the keys of cross-attention),
                broadcastable to ``(batch, heads, tgt_len, src_len)``, typically
                ``model.make_src_mask(src)`` ``(batch, 1, 1, src_len)``. ``None`` lets every
                target position attend to every source position (``memory`` carries no
                token ids to find padding in).
            tgt_mask: boolean mask over the target keys, broadcastable to
                ``(batch, heads, tgt_len, tgt_len)`` (with a cache: ``(batch, heads, tgt_len,
                cached_len + tgt_len)``), combined with the causal mask (always applied);
                default: the padding of ``config.tgt_pad_id`` (with a cache: of every token
                decoded so far, which the cache remembers).
            offset: position of ``tgt[:, 0]`` in the target sequence when decoding a
                continuation without a cache (with a cache, positions continue from
                ``cache.length``).
            need_weights: store attention weights (``self.decoder.attention_weights`` and
                ``self.decoder.cross_attention_weights``).
            cache: a :meth:`new_cache` for incremental decoding: pass only the new token(s)
                as ``tgt``; the cache keeps the keys and values of the earlier ones and is
                updated in place. Step-by-step logits equal those of the whole prefix.
            is_causal: apply the causal mask in self-attention (default). ``False`` lets
                every target position see the later ones: wrong for a decoder, available
                only to demonstrate the leak (chapter 5).

        Returns:
            logits of shape ``(batch, tgt_len, tgt_vocab)``.
        """
        self._check_tokens("tgt", tgt, self.config.tgt_vocab)
        check_bool("is_causal", is_causal)
        check_floating("memory", memory)
        check_ndim("memory", memory, 3, f"(batch, src_len, {self.config.d_model})")
        check_size(
            "memory", memory, 2, self.config.d_model, f"(batch, src_len, {self.config.d_model})"
        )
        check_finite("memory", memory)
        if memory.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"memory must have the same batch size as tgt ({tgt.shape[0]}), "
                f"got memory of shape {shape_str(memory.shape)}"
            )
        if cache is not None:
            offset, tgt_mask = self._use_cache(cache, tgt, offset, tgt_mask)
        elif tgt_mask is None:
            tgt_mask = self.make_tgt_mask(tgt)  # (batch, 1, 1, tgt_len) or None
        y = self.tgt_positions(self.tgt_embedding(tgt, "tgt"), offset)  # (batch, tgt_len, d_model)
        y = self.decoder(
            y, memory, tgt_mask, src_mask, need_weights, is_causal=is_causal, cache=cache
        )  # (batch, tgt_len, d_model)
        return self.generator(y)  # (batch, tgt_len, tgt_vocab)

    def new_cache(self) -> DecoderCache:
        """An empty :class:`DecoderCache` for incremental decoding (see :meth:`decode`)."""
        return self.decoder.new_cache()

    def _use_cache(
        self, cache: DecoderCache, tgt: Tensor, offset: int, tgt_mask: Tensor | None
    ) -> tuple[int, Tensor | None]:
        """Position offset and self-attention mask for a cached step; records the padding."""
        if not isinstance(cache, DecoderCache):
            raise TypeError(f"cache must be a DecoderCache, got {type(cache).__name__}")
        if offset != 0:
            raise ValueError(
                f"offset must be 0 with a cache (positions continue from the cache's length, "
                f"{cache.length}), got {offset}"
            )
        if cache.length and cache.layers[0].self_attention.keys.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"tgt must have the cache's batch size "
                f"{cache.layers[0].self_attention.keys.shape[0]}, got shape {shape_str(tgt.shape)}"
            )
        if tgt_mask is None and self.config.tgt_pad_id is not None:
            real = tgt != self.config.tgt_pad_id  # (batch, tgt_len)
            seen = cache.key_padding
            cache.key_padding = real if seen is None else torch.cat([seen, real], 1)  # (batch, len)
            if not bool(cache.key_padding.all()):
                tgt_mask = cache.key_padding[:, None, None, :]  # (batch, 1, 1, cached + tgt_len)
        return cache.length, tgt_mask

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """Logits for every target position (teacher forcing).

        Args:
            src: source ids, shape ``(batch, src_len)``.
            tgt: decoder input ids (target shifted right), shape ``(batch, tgt_len)``.
            src_mask: boolean mask over the source keys, used by the encoder *and* by
                cross-attention, so it must broadcast to ``(batch, heads, 1, src_len)``;
                default ``padding_mask(src, config.src_pad_id)`` (or none without a pad id).
            tgt_mask: boolean mask over the target keys broadcastable to
                ``(batch, heads, tgt_len, tgt_len)``, combined with the causal mask;
                default ``padding_mask(tgt, config.tgt_pad_id)``.
            need_weights: store the attention weights of every layer.

        Returns:
            logits of shape ``(batch, tgt_len, tgt_vocab)`` (no softmax).
        """
        self._check_tokens("src", src, self.config.src_vocab)
        self._check_tokens("tgt", tgt, self.config.tgt_vocab)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"src and tgt must have the same batch size, got src {shape_str(src.shape)} "
                f"and tgt {shape_str(tgt.shape)}"
            )
        if src_mask is None:
            src_mask = self.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        else:
            target = (src.shape[0], self.config.num_heads, 1, src.shape[1])
            check_bool_mask("src_mask", src_mask, target, "(batch, heads, 1, src_len)")
        memory = self.encode(src, src_mask, need_weights)  # (batch, src_len, d_model)
        return self.decode(tgt, memory, src_mask, tgt_mask, need_weights=need_weights)

    # ------------------------------------------------------------- torch.nn

    def load_from_torch(self, transformer: nn.Transformer) -> None:
        """Copy the encoder and decoder stacks of a ``torch.nn.Transformer`` (batch-first).

        ``torch.nn.Transformer`` has no embeddings or generator; those are left unchanged.
        It always has final norms, so this model needs ``final_norm=True`` (or
        ``norm_first=True``).
        """
        if not isinstance(transformer, nn.Transformer):
            raise TypeError(
                f"transformer must be a torch.nn.Transformer, got {type(transformer).__name__}"
            )
        self.encoder.load_from_torch(transformer.encoder)
        self.decoder.load_from_torch(transformer.decoder)

    def to_torch(self) -> nn.Transformer:
        """A ``torch.nn.Transformer(batch_first=True)`` with this model's encoder and decoder
        stacks (a missing final norm becomes ``norm=None``)."""
        layer = self.encoder.layers[0]
        weight = layer.feed_forward.hidden_proj.weight
        config = self.config
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
        transformer.encoder = self.encoder.to_torch()
        transformer.decoder = self.decoder.to_torch()
        return transformer
