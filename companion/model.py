"""The encoder-decoder Transformer of "Attention Is All You Need", assembled from the layers.

Read top to bottom: :class:`TransformerConfig` (every size and switch of the model, the
defaults are the paper's base model), then the parts - :class:`TokenEmbedding` (token ids →
vectors ×√d_model, section 3.4), :class:`Encoder` and :class:`Decoder` (stacks of
:class:`~companion.layers.EncoderLayer` / :class:`~companion.layers.DecoderLayer` with an
optional final LayerNorm) - then the whole: :class:`Transformer` (embeddings + positions +
encoder + decoder + the ``generator``, the final linear layer to vocabulary logits), built as
``Transformer(config)``.

The model returns **logits**, never probabilities: the loss (cross-entropy on logits) lives in
:mod:`companion.train` (chapter 8) and the decoding strategies in :mod:`companion.decode`
(chapter 7). Chapter 7 assembles this module's model piece by piece.

Inputs are checked once, at the public call (``model(src, tgt)``, ``model.encode``,
``model.decode``); the parts called from inside do not check again.

Final LayerNorms. A Pre-LN stack (``norm_first=True``) leaves its output un-normalised, so it
needs a final LayerNorm; a Post-LN stack already ends with one. ``final_norm=None`` (default)
therefore means "``norm_first``". Note that ``torch.nn.Transformer`` *always* adds
``encoder.norm`` and ``decoder.norm``, even with ``norm_first=False``: pass
``final_norm=True`` to match it exactly (:func:`companion.interop.load_from_torch` requires it).

Positions (``config.positional``): added to the embeddings (sinusoidal, learned), applied
inside every self-attention (RoPE, ALiBi; the embeddings get none), or none at all (NoPE).
``config.num_kv_heads`` gives every attention fewer key/value heads (grouped-query or
multi-query attention), which shrinks the decoding cache by the same factor.

Incremental decoding: ``cache = model.new_cache()`` then ``model.decode(new_tokens, memory,
src_mask, cache=cache)`` step by step gives the same logits as decoding the whole prefix at
once, but each step projects only its new tokens (a :class:`~companion.cache.DecoderCache`
keeps every layer's keys and values, and the padding of the tokens seen so far).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from companion._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_divisible,
    check_index_range,
    check_instance,
    check_module_dtype,
    check_ndim,
    check_positive_int,
    check_probability,
    check_sequence,
    check_token_ids,
    checked,
    shape_str,
)
from companion.attention import POSITIONAL
from companion.cache import DecoderCache, DecoderLayerCache, check_key_padding
from companion.layers import ACTIVATIONS, NORMS, DecoderLayer, EncoderLayer, make_norm
from companion.masking import causal_mask, padding_mask
from companion.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
)

__all__ = [
    "TransformerConfig",
    "TokenEmbedding",
    "Encoder",
    "Decoder",
    "Transformer",
    "position_encoding",
    "final_norm",
]


#: What ``TransformerConfig.positional`` may name: positions added to the embeddings
#: (``"sinusoidal"``, ``"learned"``), applied inside every self-attention (``"rope"``,
#: ``"alibi"``), or none at all (``"none"``).
POSITIONAL_KINDS = ("sinusoidal", "learned", "rope", "alibi", "none")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of a :class:`Transformer`; the defaults are the paper's base model.

    Attributes:
        src_vocab, tgt_vocab: vocabulary sizes; a :class:`Transformer` needs them, an
            :class:`Encoder` or :class:`Decoder` built on its own does not (``None``).
        d_model: size of every vector in the model.
        num_heads: attention heads (``d_model`` must be divisible by it).
        num_layers: encoder layers (and decoder layers unless ``num_decoder_layers``).
        d_ff: hidden size of the feed-forward networks.
        dropout: dropout probability of the embeddings (+ positions) and the residual
            branches, and of the attention weights and the feed-forward hidden layer unless
            the next two say otherwise.
        attention_dropout: dropout on the attention weights; ``None`` = ``dropout``.
        activation_dropout: dropout on the feed-forward hidden layer; ``None`` = ``dropout``.
            Setting both to 0 leaves dropout on the residual branches and embeddings only
            (fairseq's default for its Transformer); on a CPU the attention then runs
            torch's fused kernel in training too.
        norm_first: Pre-LN (``True``) or Post-LN (``False``, the paper).
        tie_embeddings: share one matrix between the target embedding and the generator
            (Press & Wolf, 2017).
        tie_source_embedding: the source embedding uses the target embedding's matrix too
            (section 3.4 of the paper, for a vocabulary shared by both languages); needs
            ``src_vocab == tgt_vocab``. With ``tie_embeddings`` one matrix serves all three.
        num_decoder_layers: decoder layers; default ``num_layers``.
        activation: ``"relu"`` or ``"gelu"`` in the feed-forward networks.
        positional: how the model knows where a token is:

            * ``"sinusoidal"`` (the paper; grows to any length) or ``"learned"`` (up to
              ``max_len``): a vector added to each embedding;
            * ``"rope"`` (rotary, Su et al. 2021) or ``"alibi"`` (Press et al. 2022): applied
              inside every self-attention, encoder and decoder (cross-attention takes no
              positions); the embeddings get none. Both see only the distance between a
              query and a key;
            * ``"none"`` ("NoPE"): no position information at all. The encoder then cannot
              tell the order of the source: permuting the source tokens (and their padding
              mask) permutes its output the same way. The causal decoder still can.
        max_len: (initial) number of positions of the position table.
        src_pad_id, tgt_pad_id: padding ids used to build the default masks, or ``None``.
        final_norm: final LayerNorm after each stack; default ``norm_first``
            (``torch.nn.Transformer`` always has one - pass ``True`` to match it).
        layer_norm_eps: epsilon of every LayerNorm (or RMSNorm).
        norm: ``"layer"`` (LayerNorm, the paper) or ``"rms"`` (RMSNorm, no mean and no bias)
            in every layer and final norm; ``torch.nn.Transformer`` has only LayerNorm, so
            :mod:`companion.interop` refuses an RMSNorm model.
        num_kv_heads: key/value heads of every attention module: ``None`` (= ``num_heads``,
            multi-head attention), a divisor of ``num_heads`` (grouped-query attention) or 1
            (multi-query attention); see :class:`~companion.attention.MultiHeadAttention`.
    """

    src_vocab: int | None = None
    tgt_vocab: int | None = None
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
    norm: str = "layer"
    num_kv_heads: int | None = None
    attention_dropout: float | None = None
    activation_dropout: float | None = None

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        check_positive_int("d_model", self.d_model)
        check_positive_int("num_heads", self.num_heads)
        check_divisible("d_model", self.d_model, "num_heads", self.num_heads)
        check_positive_int("num_layers", self.num_layers)
        if self.num_decoder_layers is not None:
            check_positive_int("num_decoder_layers", self.num_decoder_layers)
        check_positive_int("d_ff", self.d_ff)
        check_probability("dropout", self.dropout)
        for name in ("attention_dropout", "activation_dropout"):
            if getattr(self, name) is not None:
                check_probability(name, getattr(self, name))
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
        if self.num_kv_heads is not None:
            check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    "num_kv_heads must divide num_heads (each key/value head serves a group of "
                    f"query heads), got num_heads={self.num_heads} and "
                    f"num_kv_heads={self.num_kv_heads}"
                )
        if self.positional == "rope" and (self.d_model // self.num_heads) % 2:
            raise ValueError(
                "positional='rope' needs an even head_dim = d_model / num_heads (RoPE rotates "
                f"pairs of dimensions), got d_model={self.d_model}, num_heads={self.num_heads}"
            )
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
                if vocab is not None and pad_id >= vocab:
                    vocab_name = name[:3] + "_vocab"
                    raise ValueError(
                        f"{name} must be in [0, {vocab - 1}] ({vocab_name}={vocab}), got {pad_id}"
                    )
        if self.final_norm is not None:
            check_bool("final_norm", self.final_norm)
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        check_choice("norm", self.norm, NORMS)

    @property
    def decoder_layers(self) -> int:
        """Number of decoder layers."""
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def layer_options(self) -> dict[str, object]:
        """The keyword arguments every :class:`~companion.layers.EncoderLayer` and
        :class:`~companion.layers.DecoderLayer` of the model gets (besides the three sizes)."""
        return {
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation_dropout": self.activation_dropout,
            "activation": self.activation,
            "norm_first": self.norm_first,
            "layer_norm_eps": self.layer_norm_eps,
            "norm": self.norm,
            "num_kv_heads": self.num_kv_heads,
            "positional": self.attention_positional,
        }

    @property
    def attention_positional(self) -> str | None:
        """What the self-attention modules apply: ``"rope"``, ``"alibi"`` or ``None`` (the
        positions are added to the embeddings, or there are none)."""
        return self.positional if self.positional in POSITIONAL else None

    @property
    def has_final_norm(self) -> bool:
        """Whether each stack ends with a LayerNorm (``final_norm``, default ``norm_first``)."""
        return self.norm_first if self.final_norm is None else self.final_norm


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

    @checked("check_inputs")
    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens (...)`` integer ids → ``(..., d_model)``."""
        return self.embedding(tokens) * self.scale  # (..., d_model)

    def check_inputs(self, tokens: Tensor) -> None:
        """Raise a clear error unless ``tokens`` holds integer ids in ``[0, vocab_size)``."""
        check_token_ids("tokens", tokens)
        check_index_range("tokens", tokens, self.vocab_size, "vocab_size")


def _stack_weights(weights: list[Tensor | None]) -> Tensor | None:
    """Stack per-layer weights into ``(layers, batch, heads, q_len, k_len)``, or ``None``."""
    if not weights or any(w is None for w in weights):
        return None
    return torch.stack(weights)  # (layers, batch, heads, q_len, k_len)


def final_norm(config: TransformerConfig) -> nn.Module | None:
    """The norm that ends a stack, or ``None`` (see :attr:`TransformerConfig.has_final_norm`)."""
    if not config.has_final_norm:
        return None
    return make_norm(config.norm, config.d_model, eps=config.layer_norm_eps)


class _Stack(nn.Module):
    """``count`` layers of one kind built from ``config``, then an optional final LayerNorm."""

    def __init__(
        self, config: TransformerConfig, layer: type[EncoderLayer | DecoderLayer], count: int
    ) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.layers = nn.ModuleList(
            layer(config.d_model, config.num_heads, config.d_ff, **config.layer_options)
            for _ in range(count)
        )
        self.final_norm = final_norm(config)


class Encoder(_Stack):
    """``config.num_layers`` encoder layers, then an optional final LayerNorm.

    Args:
        config: the sizes and switches (its vocabulary fields are not used).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config, EncoderLayer, _check_config(config).num_layers)

    @checked("check_inputs")
    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> Tensor:
        """Encode the (embedded) source.

        Args:
            x: shape ``(batch, src_len, d_model)``.
            mask: boolean self-attention mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, src_len, src_len)``, e.g. ``padding_mask(src, pad_id)``.
            need_weights: store every layer's weights (see :attr:`attention_weights`).

        Returns:
            ``memory`` of shape ``(batch, src_len, d_model)``.
        """
        for layer in self.layers:
            x = layer(x, mask, need_weights=need_weights)  # (batch, src_len, d_model)
        if self.final_norm is not None:
            x = self.final_norm(x)  # (batch, src_len, d_model)
        return x

    def check_inputs(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        self.layers[0].check_inputs(x, mask, need_weights=need_weights)

    @property
    def attention_weights(self) -> Tensor | None:
        """Self-attention weights of the last call with ``need_weights=True``:
        ``(layers, batch, heads, src_len, src_len)``, or ``None``."""
        return _stack_weights([layer.self_attention_weights for layer in self.layers])


class Decoder(_Stack):
    """``config.decoder_layers`` decoder layers, then an optional final LayerNorm.

    Args:
        config: the sizes and switches (its vocabulary fields are not used).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config, DecoderLayer, _check_config(config).decoder_layers)

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
        if is_causal and tgt_mask is not None:  # combine the two masks once, not per layer
            tgt_len = x.shape[1]
            keys = tgt_len + (0 if cache is None else cache.length)
            tgt_mask = tgt_mask & causal_mask(
                tgt_len, keys, device=x.device
            )  # (..., tgt_len, keys)
            is_causal = False
        for i, layer in enumerate(self.layers):  # x stays (batch, tgt_len, d_model)
            x = layer(
                x,
                memory,
                tgt_mask,
                memory_mask,
                need_weights=need_weights,
                is_causal=is_causal,
                cache=None if cache is None else cache.layers[i],
            )
        if self.final_norm is not None:
            x = self.final_norm(x)  # (batch, tgt_len, d_model)
        return x

    def check_inputs(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        is_causal: bool = True,
        cache: DecoderCache | None = None,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        if cache is not None:
            check_sequence("x", x, self.layers[0].d_model, "tgt_len")
            check_sequence("memory", memory, self.layers[0].d_model, "src_len")
            self.check_cache(cache, x.shape[0], x.shape[1], memory.shape[1])
        self.layers[0].check_inputs(
            x,
            memory,
            tgt_mask,
            memory_mask,
            need_weights=need_weights,
            is_causal=is_causal,
            cache=None if cache is None else cache.layers[0],
        )

    def new_cache(self) -> DecoderCache:
        """An empty :class:`~companion.cache.DecoderCache` for incremental decoding."""
        return DecoderCache(len(self.layers))

    def check_cache(self, cache: object, batch: int, tgt_len: int, src_len: int) -> int:
        """Raise a clear error unless ``cache`` is a :class:`~companion.cache.DecoderCache` that
        every layer of this decoder can continue with ``tgt_len`` new positions of a ``batch``
        (its keys and values the shape, dtype and device of each layer's attention, one
        cached length for all); the number of cached positions. A cache filled by another
        model fails here: inside a checked call the layers do not check their caches."""
        if not isinstance(cache, DecoderCache):
            raise TypeError(f"cache must be a DecoderCache, got {type(cache).__name__}")
        if len(cache.layers) != len(self.layers):
            raise ValueError(
                f"cache must have one entry per decoder layer ({len(self.layers)}), "
                f"got {len(cache.layers)}; make it with decoder.new_cache()"
            )
        for i, kept in enumerate(cache.layers):
            check_instance(f"cache.layers[{i}]", kept, DecoderLayerCache, "a DecoderLayerCache")
        if cache.batch_size not in (None, batch):
            raise ValueError(
                f"tgt must have the cache's batch size {cache.batch_size}, got shape "
                f"{shape_str((batch, tgt_len))}"
            )
        for i, (layer, kept) in enumerate(zip(self.layers, cache.layers)):
            name = f"cache.layers[{i}]"
            keys = layer.self_attention.cached_length(
                kept.self_attention, batch, tgt_len, f"{name}.self_attention"
            )
            if keys - tgt_len != cache.length:
                raise ValueError(
                    f"{name}.self_attention holds {keys - tgt_len} positions, layer 0 "
                    f"{cache.length}: every layer must cache the same positions"
                )
            layer.cross_attention.cached_length(
                kept.cross_attention, batch, src_len, f"{name}.cross_attention"
            )
        return cache.length

    @property
    def attention_weights(self) -> Tensor | None:
        """Self-attention weights of the last call with ``need_weights=True``:
        ``(layers, batch, heads, tgt_len, tgt_len)``, or ``None``."""
        return _stack_weights([layer.self_attention_weights for layer in self.layers])

    @property
    def cross_attention_weights(self) -> Tensor | None:
        """Cross-attention weights of the last call with ``need_weights=True``:
        ``(layers, batch, heads, tgt_len, src_len)``, or ``None``."""
        return _stack_weights([layer.cross_attention_weights for layer in self.layers])


def _check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(
            f"config must be a TransformerConfig, got {type(config).__name__}; "
            "build one with TransformerConfig(d_model=..., num_heads=..., ...)"
        )
    return config


class Transformer(nn.Module):
    """The encoder-decoder Transformer (Vaswani et al., 2017), returning logits.

    ``src`` → :class:`TokenEmbedding` (×√d_model) + positions → :class:`Encoder` → ``memory``;
    ``tgt`` (the target shifted right) → embedding + positions → :class:`Decoder` (causal
    self-attention, cross-attention to ``memory``) → ``generator`` → logits over ``tgt_vocab``.

    Args:
        config: a :class:`TransformerConfig` with ``src_vocab`` and ``tgt_vocab`` set, e.g.
            ``Transformer(TransformerConfig(src_vocab=8000, tgt_vocab=6000, d_model=256))``.

    Attributes:
        config: the :class:`TransformerConfig` (``Transformer(model.config)`` builds a model
            of the same shape).
        src_embedding, tgt_embedding, src_positions, tgt_positions, encoder, decoder,
        generator: the parts, usable on their own.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        _check_config(config)
        if config.src_vocab is None or config.tgt_vocab is None:
            raise ValueError(
                "config must set src_vocab and tgt_vocab for a Transformer, got "
                f"src_vocab={config.src_vocab}, tgt_vocab={config.tgt_vocab}; e.g. "
                "dataclasses.replace(config, src_vocab=len(src_vocab), tgt_vocab=len(tgt_vocab))"
            )
        self.config = config
        self.src_embedding = TokenEmbedding(config.src_vocab, config.d_model)
        self.tgt_embedding = TokenEmbedding(config.tgt_vocab, config.d_model)
        self.src_positions = position_encoding(config)
        self.tgt_positions = position_encoding(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = nn.Linear(config.d_model, config.tgt_vocab)
        self._reset_parameters()
        if config.tie_embeddings:
            self.generator.weight = self.tgt_embedding.weight
        if config.tie_source_embedding:
            self.src_embedding.embedding.weight = self.tgt_embedding.weight

    def _reset_parameters(self) -> None:
        """Xavier-uniform for every matrix of the two stacks and the generator (as
        ``torch.nn.Transformer`` and the Annotated Transformer do), zero generator bias."""
        for module in (self.encoder, self.decoder, self.generator):
            for parameter in module.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        nn.init.zeros_(self.generator.bias)

    # --------------------------------------------------------------- forward

    @checked("check_forward")
    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
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
        if src_mask is None:
            src_mask = self.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        memory = self.encode(src, src_mask, need_weights=need_weights)  # (batch, src_len, d_model)
        return self.decode(tgt, memory, src_mask, tgt_mask, need_weights=need_weights)

    @checked("check_encode")
    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, *, need_weights: bool = False
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
        if src_mask is None:
            src_mask = self.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        x = self.src_positions(self.src_embedding(src))  # (batch, src_len, d_model)
        return self.encoder(x, src_mask, need_weights=need_weights)  # (batch, src_len, d_model)

    @checked("check_decode")
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
                ``cache.length``). RoPE and ALiBi see only distances between the tokens of
                the call (and the cache), so ``offset`` changes nothing for them.
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
        if cache is not None:
            offset = cache.length  # positions continue from the cached ones
            if tgt_mask is None:
                tgt_mask = self._remember_padding(cache, tgt)  # (batch, 1, 1, cached + tgt_len)
        elif tgt_mask is None:
            tgt_mask = self.make_tgt_mask(tgt)  # (batch, 1, 1, tgt_len) or None
        y = self.tgt_positions(self.tgt_embedding(tgt), offset)  # (batch, tgt_len, d_model)
        y = self.decoder(
            y,
            memory,
            tgt_mask,
            src_mask,
            need_weights=need_weights,
            is_causal=is_causal,
            cache=cache,
        )  # (batch, tgt_len, d_model)
        return self.generator(y)  # (batch, tgt_len, tgt_vocab)

    # ------------------------------------------------------------------ masks

    def make_src_mask(self, src: Tensor) -> Tensor | None:
        """Padding mask ``(batch, 1, 1, src_len)`` from ``config.src_pad_id``, ``None``
        without a pad id."""
        pad_id = self.config.src_pad_id
        return None if pad_id is None else padding_mask(src, pad_id)

    def make_tgt_mask(self, tgt: Tensor) -> Tensor | None:
        """Padding mask ``(batch, 1, 1, tgt_len)`` from ``config.tgt_pad_id``, or ``None``.
        The causal mask is not included: the decoder always applies it."""
        pad_id = self.config.tgt_pad_id
        return None if pad_id is None else padding_mask(tgt, pad_id)

    def new_cache(self) -> DecoderCache:
        """An empty :class:`~companion.cache.DecoderCache` for incremental decoding (see
        :meth:`decode`)."""
        return self.decoder.new_cache()

    def _remember_padding(self, cache: DecoderCache, tgt: Tensor) -> Tensor | None:
        """Record which new tokens are padding; the mask over every token decoded so far."""
        if self.config.tgt_pad_id is None:
            return None
        real = tgt != self.config.tgt_pad_id  # (batch, tgt_len)
        seen = cache.key_padding
        cache.key_padding = real if seen is None else torch.cat([seen, real], dim=1)
        return cache.key_padding[:, None, None, :]  # (batch, 1, 1, cached + tgt_len)

    # ------------------------------------------------------------------ checks

    def check_forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        self.check_source(src, src_mask)
        self._check_tokens("tgt", tgt, self.config.tgt_vocab)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"src and tgt must have the same batch size, got src {shape_str(src.shape)} "
                f"and tgt {shape_str(tgt.shape)}"
            )
        self._check_masks(
            batch=src.shape[0],
            src_len=src.shape[1],
            tgt_len=tgt.shape[1],
            cached=0,
            tgt_mask=tgt_mask,
        )
        check_bool("need_weights", need_weights)

    def check_source(self, src: Tensor, src_mask: Tensor | None = None) -> None:
        """Check source ids and a source mask that both the encoder and cross-attention can
        use: broadcastable to ``(batch, heads, 1, src_len)`` (what :meth:`forward` and the
        decoding functions of :mod:`companion.decode` pass to both)."""
        self._check_tokens("src", src, self.config.src_vocab)
        if src_mask is not None:
            target = (src.shape[0], self.config.num_heads, 1, src.shape[1])
            check_bool_mask("src_mask", src_mask, target, "(batch, heads, 1, src_len)")

    def check_encode(
        self, src: Tensor, src_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> None:
        """Raise a clear error for anything :meth:`encode` cannot take (same arguments)."""
        self._check_tokens("src", src, self.config.src_vocab)
        if src_mask is not None:
            target = (src.shape[0], self.config.num_heads, src.shape[1], src.shape[1])
            check_bool_mask("src_mask", src_mask, target, "(batch, heads, src_len, src_len)")
        check_bool("need_weights", need_weights)

    def check_decode(
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
    ) -> None:
        """Raise a clear error for anything :meth:`decode` cannot take (same arguments)."""
        self._check_tokens("tgt", tgt, self.config.tgt_vocab)
        check_sequence("memory", memory, self.config.d_model, "src_len")
        check_module_dtype("memory", memory, self.decoder)
        if memory.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"memory must have the same batch size as tgt ({tgt.shape[0]}), "
                f"got memory of shape {shape_str(memory.shape)}"
            )
        check_positive_int("offset", offset, minimum=0)
        check_bool("need_weights", need_weights)
        check_bool("is_causal", is_causal)
        cached = 0
        if cache is not None:
            if not isinstance(cache, DecoderCache):
                raise TypeError(f"cache must be a DecoderCache, got {type(cache).__name__}")
            if offset != 0:
                raise ValueError(
                    f"offset must be 0 with a cache (positions continue from the cache's "
                    f"length, {cache.length}), got {offset}"
                )
            cached = self.decoder.check_cache(cache, tgt.shape[0], tgt.shape[1], memory.shape[1])
            if self.config.tgt_pad_id is not None and tgt_mask is None:
                check_key_padding(cache, tgt.shape[0])  # the padding mask covers the cache
        self._check_length("tgt", tgt.shape[1], offset + cached)
        self._check_masks(
            batch=tgt.shape[0],
            src_len=memory.shape[1],
            tgt_len=tgt.shape[1],
            cached=cached,
            tgt_mask=tgt_mask,
            src_mask=src_mask,
        )

    def _check_masks(
        self,
        *,
        batch: int,
        src_len: int,
        tgt_len: int,
        cached: int,
        tgt_mask: Tensor | None,
        src_mask: Tensor | None = None,
    ) -> None:
        heads = self.config.num_heads
        if tgt_mask is not None:
            layout = "tgt_len" if cached == 0 else "cached_len + tgt_len"
            target = (batch, heads, tgt_len, cached + tgt_len)
            check_bool_mask("tgt_mask", tgt_mask, target, f"(batch, heads, tgt_len, {layout})")
        if src_mask is not None:
            target = (batch, heads, tgt_len, src_len)
            check_bool_mask("src_mask", src_mask, target, "(batch, heads, tgt_len, src_len)")

    def _check_tokens(self, name: str, tokens: object, vocab: int) -> Tensor:
        tensor = check_token_ids(name, tokens)
        check_ndim(name, tensor, 2, f"(batch, {name}_len)")
        if tensor.shape[1] == 0:
            raise ValueError(
                f"{name} must have at least one position, got shape {shape_str(tensor.shape)}"
            )
        self._check_length(name, tensor.shape[1])
        return check_index_range(name, tensor, vocab, f"{name}_vocab")

    def _check_length(self, name: str, length: int, offset: int = 0) -> None:
        """Learned positions exist only up to ``config.max_len``: name the sequence too long."""
        max_len = self.config.max_len
        if self.config.positional == "learned" and offset + length > max_len:
            at = f" starting at position {offset}" if offset else ""
            raise ValueError(
                f"{name} has {length} position{'s' if length != 1 else ''}{at}, so it needs "
                f"positions up to "
                f"{offset + length - 1}, but the learned position embedding "
                f"(config.positional='learned') has max_len={max_len} (positions 0..{max_len - 1});"
                f" pass shorter sequences or build the model with a larger max_len"
            )


def position_encoding(config: TransformerConfig) -> nn.Module:
    """The position encoding the config names (with the model's dropout after it); nothing
    but the dropout when attention applies the positions (RoPE, ALiBi) or there are none."""
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.max_len, config.d_model, config.dropout)
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len, config.dropout)
    return NoPositionalEncoding(config.d_model, config.dropout)
