"""The two other Transformer families, built from the same blocks as the encoder-decoder of
:mod:`companion.model`, with no new attention code.

* :class:`DecoderOnlyTransformer` (GPT-style, a causal language model): token embedding
  (×√d_model) + positions → ``num_layers`` :class:`~companion.layers.EncoderLayer` blocks
  whose self-attention is causal → final norm → ``lm_head``, the logits of the next token.
  :meth:`~DecoderOnlyTransformer.generate` continues a prompt with the key/value cache,
  greedily (``temperature=0``) or by sampling (temperature, top-k). The same cache, trimmed
  by :meth:`~companion.cache.DecoderOnlyCache.keep_last`, is the segment memory of
  Transformer-XL.
* :class:`EncoderOnlyTransformer` (BERT-style, bidirectional): token embedding + positions →
  an :class:`~companion.model.Encoder` → hidden states; a masked-language-model head tied to
  the embedding (:meth:`~EncoderOnlyTransformer.mlm_logits`) and an optional classification
  head on the [CLS] position or the mean of the real positions
  (:meth:`~EncoderOnlyTransformer.classify`). It also encodes vectors that are not token
  embeddings (:meth:`~EncoderOnlyTransformer.encode_embeddings`, e.g. the patches of a
  Vision Transformer).

A decoder-only block is the encoder layer with a causal mask: there is no memory to
cross-attend to. Both families take the :class:`~companion.model.TransformerConfig` of the
encoder-decoder and read only the fields they need (see each class). Pre-LN or Post-LN is
the config's ``norm_first`` (default ``False``, the paper's Post-LN): GPT-2 and later are
Pre-LN, so pass ``norm_first=True`` for them. Each saves and loads through
:mod:`companion.checkpoint`: ``save_checkpoint(model.to_checkpoint(), path)``, then
``DecoderOnlyTransformer.from_checkpoint(path)``.

Inputs are checked once, at the public call, as in :mod:`companion.model`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from companion._validation import (
    check_bool,
    check_bool_mask,
    check_bool_tensor,
    check_choice,
    check_floating,
    check_index_range,
    check_instance,
    check_module_dtype,
    check_ndim,
    check_nonnegative_float,
    check_positive_int,
    check_sequence,
    check_size,
    check_token_ids,
    checked,
    shape_str,
)
from companion.cache import DecoderOnlyCache, KeyValueCache, check_key_padding
from companion.checkpoint import model_checkpoint, rebuild_model
from companion.decode import sampling_distribution
from companion.layers import EncoderLayer
from companion.masking import causal_mask
from companion.model import (
    Encoder,
    TokenEmbedding,
    TransformerConfig,
    final_norm,
    position_encoding,
)

__all__ = [
    "DecoderOnlyTransformer",
    "EncoderOnlyTransformer",
    "POOLINGS",
]

#: How :class:`EncoderOnlyTransformer` turns hidden states into one vector per sequence:
#: ``"cls"`` (position 0, BERT's [CLS] token) or ``"mean"`` (the mean of the real positions).
POOLINGS: tuple[str, ...] = ("cls", "mean")


# ------------------------------------------------------------------------ the parts


def _xavier_init(*modules: nn.Module | None) -> None:
    """Xavier-uniform for every matrix of ``modules`` and zero output-head biases, as
    :class:`~companion.model.Transformer` initialises its stacks and generator."""
    for module in modules:
        if module is None:
            continue
        for parameter in module.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def _stack_weights(layers: nn.ModuleList) -> Tensor | None:
    """``(layers, batch, heads, len, keys)`` from each layer's last weights, or ``None``."""
    weights = [layer.self_attention_weights for layer in layers]
    if not weights or any(w is None for w in weights):
        return None
    return torch.stack(weights)  # (layers, batch, heads, len, keys)


# ------------------------------------------------------------------------ the two models


class DecoderOnlyTransformer(nn.Module):
    """A causal language model (GPT, Radford et al. 2018/2019): logits of the next token at
    every position.

    ``tokens`` → :class:`~companion.model.TokenEmbedding` (×√d_model) + positions →
    ``config.num_layers`` :class:`~companion.layers.EncoderLayer` blocks with causal
    self-attention → final norm → ``lm_head``. Position ``t`` sees tokens ``0 .. t`` only.

    From the config: the vocabulary is ``config.tgt_vocab`` and the padding id
    ``config.tgt_pad_id`` (a language model *generates*, like the decoder of the
    encoder-decoder; ``src_vocab`` and ``src_pad_id`` are not used). Keys equal to the pad id
    are masked out, and :meth:`generate` never produces it. ``positional`` as in the
    encoder-decoder (sinusoidal or learned: added to the embeddings; RoPE or ALiBi: inside
    every self-attention; ``"none"``). ``norm_first`` picks Pre-LN (GPT-2 onwards; pass
    ``True``) or Post-LN (the default, the paper's); the final norm follows
    ``config.final_norm`` (default: only with Pre-LN). ``tie_embeddings`` shares one matrix
    between the embedding and ``lm_head`` (as GPT-2 does). ``num_decoder_layers``,
    ``src_vocab``, ``src_pad_id`` and ``tie_source_embedding`` are ignored.

    **Cache.** ``cache = model.new_cache()``, then ``model(new_tokens, cache=cache)`` call
    after call: each call processes only its new tokens and attends over the cached keys and
    values too; its positions continue after the cached ones. The logits equal those of the
    whole sequence at once.

    **Segment memory** (Transformer-XL, Dai et al., 2019). To read a long text in segments of
    ``n`` tokens with the previous segment as extra context::

        memory = model.new_cache()
        for segment in segments:  # (batch, n) each
            logits = model(segment, cache=memory)  # attends over memory + segment
            ...  # loss, backward
            memory.keep_last(n)  # detach; keep the last n positions of every layer

    The memory carries no gradient. Positions continue across segments: RoPE rotates at the
    absolute position (``memory.next_position``), ALiBi needs only the distances, so the
    relative offsets between a segment and its memory are right; with sinusoidal or learned
    positions the absolute positions keep growing (learned ones end at ``max_len``: a clear
    error), which is why Transformer-XL made its positions relative. Unlike Transformer-XL,
    which keeps each layer's *input* and projects it with the current weights, the memory
    here holds the projected keys and values; they are the same up to the weights of one
    optimiser step.

    Args:
        config: a :class:`~companion.model.TransformerConfig` with ``tgt_vocab`` set.

    Attributes:
        config: the configuration.
        token_embedding, positions, layers, final_norm (or ``None``), lm_head: the parts.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = _check_config(config, "tgt_vocab", "DecoderOnlyTransformer")
        self.token_embedding = TokenEmbedding(config.tgt_vocab, config.d_model)
        self.positions = position_encoding(config)
        self.layers = nn.ModuleList(
            EncoderLayer(config.d_model, config.num_heads, config.d_ff, **config.layer_options)
            for _ in range(config.num_layers)
        )
        self.final_norm = final_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.tgt_vocab)
        _xavier_init(self.layers, self.lm_head)
        if config.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    @checked("check_forward")
    def forward(
        self,
        tokens: Tensor,
        mask: Tensor | None = None,
        *,
        cache: DecoderOnlyCache | None = None,
        is_causal: bool = True,
        need_weights: bool = False,
    ) -> Tensor:
        """Logits of the next token at every position.

        Args:
            tokens: ids ``(batch, len)`` in ``[0, tgt_vocab)``.
            mask: an extra boolean mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, len, keys)`` (``keys = len``, with a cache
                ``cache.length + len``); combined with the padding mask of
                ``config.tgt_pad_id`` and, when ``is_causal``, the causal mask.
            cache: a :meth:`new_cache`, updated in place; ``tokens`` then holds only the new
                positions, which start at ``cache.next_position``.
            is_causal: apply the causal mask (default). ``False`` with a prefix-LM ``mask``
                gives a prefix language model; ``False`` alone lets positions see the future.
            need_weights: keep every layer's weights (:attr:`attention_weights`).

        Returns:
            logits ``(batch, len, tgt_vocab)``.
        """
        offset = 0 if cache is None else cache.next_position  # position of tokens[:, 0]
        mask = self.make_mask(tokens, mask, cache=cache, is_causal=is_causal)  # (.., len, keys)
        x = self.positions(self.token_embedding(tokens), offset)  # (batch, len, d_model)
        kernel_causal = is_causal and mask is None  # else the causal mask is inside `mask`
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.layers[i]
            x = layer(
                x, mask, need_weights=need_weights, is_causal=kernel_causal, cache=layer_cache
            )  # (batch, len, d_model)
        if self.final_norm is not None:
            x = self.final_norm(x)  # (batch, len, d_model)
        return self.lm_head(x)  # (batch, len, tgt_vocab)

    def make_mask(
        self,
        tokens: Tensor,
        mask: Tensor | None = None,
        *,
        cache: DecoderOnlyCache | None = None,
        is_causal: bool = True,
    ) -> Tensor | None:
        """The self-attention mask of a call: the padding of every key (the cache remembers
        its tokens' padding, and records that of ``tokens``), ``mask``, and the causal mask
        ``(len, keys)`` when ``is_causal`` and there is any other mask (alone, the causal mask
        is left to the attention kernel's ``is_causal``).

        Args:
            tokens: ``(batch, len)``. mask, cache, is_causal: as in :meth:`forward`.

        Returns:
            boolean ``(batch or 1, heads or 1, len, keys)``, ``True`` = may attend, or ``None``.
        """
        padding = self.remember_padding(tokens, cache)  # (batch, 1, 1, keys) or None
        if padding is not None:
            mask = padding if mask is None else mask & padding  # (.., len or 1, keys)
        if mask is None or not is_causal:
            return mask
        length = tokens.shape[1]
        keys = length if cache is None else cache.length + length
        return mask & causal_mask(length, keys, device=tokens.device)  # (.., len, keys)

    def remember_padding(self, tokens: Tensor, cache: DecoderOnlyCache | None) -> Tensor | None:
        """The keys that are real tokens, ``(batch, 1, 1, keys)``, or ``None`` without a pad
        id; with a cache, ``tokens (batch, len)`` are appended to its record first."""
        pad_id = self.config.tgt_pad_id
        if pad_id is None:
            return None
        real = tokens != pad_id  # (batch, len)
        if cache is not None:
            seen = cache.key_padding
            cache.key_padding = real if seen is None else torch.cat([seen, real], dim=1)
            real = cache.key_padding  # (batch, cached + len)
        return real[:, None, None, :]  # (batch, 1, 1, keys)

    def new_cache(self) -> DecoderOnlyCache:
        """An empty :class:`~companion.cache.DecoderOnlyCache`: one growing key/value cache per
        layer (incremental decoding, or segment memory after ``keep_last``)."""
        return DecoderOnlyCache(len(self.layers))

    @property
    def attention_weights(self) -> Tensor | None:
        """Every layer's self-attention weights from the last call with ``need_weights=True``:
        ``(layers, batch, heads, len, keys)``, or ``None``."""
        return _stack_weights(self.layers)

    # ---------------------------------------------------------------- generation

    @checked("check_generate")
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
    ) -> Tensor:
        """Continue every prompt by ``max_new_tokens`` tokens, one at a time, with the cache.

        Each step turns the last position's logits into the next token: the most likely one
        when ``temperature == 0`` (greedy, no random draw), else a draw from
        :func:`~companion.decode.sampling_distribution` (``softmax(logits / temperature)``
        over the ``top_k`` most likely tokens). The pad id is never generated. Runs in
        evaluation mode without gradients; the model's mode is restored afterwards.

        Args:
            prompt: ids ``(batch, prompt_len)``, ``batch >= 1`` and ``prompt_len >= 1`` (a
                model without a start token has nothing to condition the first token on:
                begin with a ``<bos>`` id). Every row has the same length; pad ids in it are
                masked out but still take positions.
            max_new_tokens: ``>= 0``; ``0`` returns the prompt.
            temperature: ``>= 0``; ``0`` is greedy, ``< 1`` sharpens, ``> 1`` flattens.
            top_k: sample among the ``top_k`` most likely tokens (an int ``>= 1``), or all.
            generator: a ``torch.Generator`` on the model's device, for reproducible draws.
            eos_id: a row that generates this id is finished: it gets the pad id (or
                ``eos_id`` again without one) afterwards, and generation stops early once
                every row has finished.

        Returns:
            ``(batch, prompt_len + new)`` long ids on the model's device, the prompt first;
            ``new = max_new_tokens`` unless every row finished earlier.
        """
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self._generate(prompt, max_new_tokens, temperature, top_k, generator, eos_id)
        finally:
            self.train(was_training)

    def _generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        generator: torch.Generator | None,
        eos_id: int | None,
    ) -> Tensor:
        """The loop of :meth:`generate` (checked arguments, eval mode, no gradients)."""
        tokens = prompt.to(self.lm_head.weight.device, torch.long)  # (batch, prompt_len)
        pad_id = self.config.tgt_pad_id
        fill = eos_id if pad_id is None else pad_id  # what a finished row gets
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)  # (b,)
        cache = self.new_cache()
        logits = self(tokens, cache=cache)[:, -1]  # (batch, vocab)
        for step in range(max_new_tokens):
            next_token = self.next_token(logits, temperature, top_k, generator)  # (batch,)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, fill)  # (batch,)
                finished = finished | (next_token == eos_id)  # (batch,)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (batch, len + 1)
            if step + 1 == max_new_tokens or (eos_id is not None and bool(finished.all())):
                break
            logits = self(next_token[:, None], cache=cache)[:, -1]  # (batch, vocab)
        return tokens

    @checked("check_next_token")
    def next_token(
        self,
        logits: Tensor,
        temperature: float,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """One step of :meth:`generate`: ``logits (batch, vocab)`` → next ids ``(batch,)``;
        the argmax when ``temperature == 0``, else a draw from
        :func:`~companion.decode.sampling_distribution`. The pad id is never chosen."""
        logits = logits.float()  # (batch, vocab)
        if self.config.tgt_pad_id is not None:
            pad = torch.tensor([self.config.tgt_pad_id], device=logits.device)  # (1,)
            logits = logits.index_fill(-1, pad, -torch.inf)  # (batch, vocab)
        if temperature == 0:
            return logits.argmax(dim=-1)  # (batch,)
        probs = sampling_distribution(logits, temperature, top_k)  # (batch, vocab)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (batch,)

    # ---------------------------------------------------------------- checkpoints

    def to_checkpoint(self) -> dict[str, Any]:
        """A checkpoint of this model for :func:`companion.checkpoint.save_checkpoint`."""
        return model_checkpoint(self, "DecoderOnlyTransformer")

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Mapping[str, Any] | str | os.PathLike[str]
    ) -> DecoderOnlyTransformer:
        """The model saved with :meth:`to_checkpoint` (a path or a loaded checkpoint), in
        evaluation mode, on the CPU, in the dtype it was saved in (a float64 model comes back
        float64, exactly); a :class:`~companion.checkpoint.CheckpointError` otherwise."""
        return rebuild_model(
            checkpoint, lambda config, options: cls(config), "DecoderOnlyTransformer"
        )

    # ---------------------------------------------------------------- checks

    def check_forward(
        self,
        tokens: Tensor,
        mask: Tensor | None = None,
        *,
        cache: DecoderOnlyCache | None = None,
        is_causal: bool = True,
        need_weights: bool = False,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        _check_tokens("tokens", tokens, self.config.tgt_vocab, "tgt_vocab")
        batch, length = tokens.shape
        cached = 0
        if cache is not None:
            check_instance(
                "cache", cache, DecoderOnlyCache, "a DecoderOnlyCache (model.new_cache())"
            )
            if len(cache.layers) != len(self.layers):
                raise ValueError(
                    f"cache must have one entry per layer ({len(self.layers)}), got "
                    f"{len(cache.layers)}; make it with model.new_cache()"
                )
            for i, kept in enumerate(cache.layers):
                check_instance(f"cache.layers[{i}]", kept, KeyValueCache, "a KeyValueCache")
            if cache.batch_size not in (None, batch):
                raise ValueError(
                    f"tokens must have the cache's batch size {cache.batch_size}, got shape "
                    f"{shape_str(tokens.shape)}"
                )
            cached = self.check_cache(cache, batch, length)
        _check_length(self.config, "tokens", length, 0 if cache is None else cache.next_position)
        if mask is not None:
            layout = "len" if cache is None else "cache.length + len"
            target = (batch, self.config.num_heads, length, cached + length)
            check_bool_mask("mask", mask, target, f"(batch, heads, len, {layout})")
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)

    def check_cache(self, cache: DecoderOnlyCache, batch: int, length: int) -> int:
        """Raise a clear error unless every layer can continue ``cache`` with ``length`` new
        tokens of a ``batch``: its keys and values the shape, dtype and device of that layer's
        attention (a cache filled by another model fails here, where the layers, called
        inside this checked call, check nothing), one cached length and start for all, the
        padding of every cached token recorded when the model has a pad id. Returns the
        number of cached positions."""
        for i, (layer, kept) in enumerate(zip(self.layers, cache.layers)):
            name = f"cache.layers[{i}]"
            keys = layer.self_attention.cached_length(kept, batch, length, name)
            if not kept.growing:
                raise ValueError(f"{name} must be a growing KeyValueCache, got growing=False")
            if keys - length != cache.length or kept.start != cache.start:
                raise ValueError(
                    f"{name} holds positions {kept.start}..{kept.next_position - 1}, layer 0 "
                    f"{cache.start}..{cache.next_position - 1}: every layer must cache the "
                    "same positions; make the cache with model.new_cache()"
                )
        if self.config.tgt_pad_id is not None:
            check_key_padding(cache, batch)
        return cache.length

    def check_next_token(
        self,
        logits: Tensor,
        temperature: float,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        """Raise a clear error for anything :meth:`next_token` cannot take (same arguments)."""
        vocab = self.config.tgt_vocab
        check_floating("logits", logits)
        check_ndim("logits", logits, 2, f"(batch, {vocab})")
        check_size("logits", logits, 1, vocab, f"(batch, {vocab})")
        self.check_sampling(temperature, top_k, generator)

    def check_sampling(
        self, temperature: float, top_k: int | None, generator: torch.Generator | None
    ) -> None:
        """Raise a clear error unless ``temperature >= 0``, ``top_k`` is ``None`` or an int
        ``>= 1`` and ``generator`` is ``None`` or a ``torch.Generator`` on the model's device."""
        check_nonnegative_float("temperature", temperature)
        if top_k is not None:
            check_positive_int("top_k", top_k)
        if generator is not None:
            check_instance("generator", generator, torch.Generator, "a torch.Generator")
            device = self.lm_head.weight.device
            if generator.device.type != device.type:
                raise ValueError(
                    f"generator must be on the model's device ({device}), got a generator on "
                    f"{generator.device}"
                )

    def check_generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
    ) -> None:
        """Raise a clear error for anything :meth:`generate` cannot take (same arguments)."""
        vocab = self.config.tgt_vocab
        _check_tokens("prompt", prompt, vocab, "tgt_vocab", empty=_EMPTY_PROMPT)
        if prompt.shape[0] == 0:
            raise ValueError(
                f"prompt must hold at least one sequence, got shape {shape_str(prompt.shape)}"
            )
        check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
        _check_length(self.config, "prompt", prompt.shape[1])
        if self.config.positional == "learned" and max_new_tokens > 0:
            # the last new token is returned, never fed back: the model reads positions
            # 0 .. prompt_len + max_new_tokens - 2
            fed, max_len = prompt.shape[1] + max_new_tokens - 1, self.config.max_len
            if fed > max_len:
                raise ValueError(
                    f"max_new_tokens={max_new_tokens} after a prompt of {prompt.shape[1]} feeds "
                    f"the model {fed} positions (the last new token is not fed back), but the "
                    f"learned position embedding has max_len={max_len}; generate at most "
                    f"{max_len - prompt.shape[1] + 1} new tokens"
                )
        self.check_sampling(temperature, top_k, generator)
        if eos_id is not None:
            check_positive_int("eos_id", eos_id, minimum=0)
            if eos_id >= vocab:
                raise ValueError(
                    f"eos_id must be in [0, {vocab - 1}] (tgt_vocab={vocab}), got {eos_id}"
                )


class EncoderOnlyTransformer(nn.Module):
    """A bidirectional encoder (BERT, Devlin et al. 2019): every position sees every other.

    ``tokens`` → :class:`~companion.model.TokenEmbedding` (×√d_model) + positions →
    :class:`~companion.model.Encoder` (``config.num_layers`` layers with the padding mask of
    ``config.src_pad_id``, then the config's final norm) → hidden states. On top:

    * :meth:`mlm_logits`: the masked-language-model head, ``hidden @ embeddingᵀ + bias``,
      always tied to the token embedding as in BERT (BERT also puts a dense + GELU +
      LayerNorm transform before it; this head is the tied linear layer and its bias alone);
    * :meth:`classify`: ``classifier(pool(hidden))`` with ``pooling="cls"`` (the vector at
      position 0, where the input puts a [CLS] token; BERT adds a dense + tanh "pooler",
      left out here) or ``"mean"`` (the mean over the real, non-padding positions);
    * :meth:`encode_embeddings`: the same encoder on vectors instead of token ids (a Vision
      Transformer's patch embeddings and a learned [CLS] vector): positions are added there
      too.

    From the config: the vocabulary is ``config.src_vocab``, the padding id
    ``config.src_pad_id`` (what an encoder reads is a "source"). ``positional``,
    ``norm_first``, ``final_norm`` and the sizes as in the encoder-decoder;
    ``tie_embeddings``, ``tgt_vocab``, ``tgt_pad_id`` and ``num_decoder_layers`` are not used.
    ``model.encoder`` is an :class:`~companion.model.Encoder`, so
    :func:`companion.interop.to_torch` turns it into a ``torch.nn.TransformerEncoder``.

    Args:
        config: a :class:`~companion.model.TransformerConfig` with ``src_vocab`` set.
        num_classes: classes of the classification head, or ``None`` for no head.
        pooling: ``"cls"`` or ``"mean"`` (see :data:`POOLINGS`).
    """

    def __init__(
        self, config: TransformerConfig, *, num_classes: int | None = None, pooling: str = "cls"
    ) -> None:
        super().__init__()
        self.config = _check_config(config, "src_vocab", "EncoderOnlyTransformer")
        if num_classes is not None:
            check_positive_int("num_classes", num_classes)
        self.num_classes = num_classes
        self.pooling = check_choice("pooling", pooling, POOLINGS)
        self.token_embedding = TokenEmbedding(config.src_vocab, config.d_model)
        self.positions = position_encoding(config)
        self.encoder = Encoder(config)
        self.mlm_head = nn.Linear(config.d_model, config.src_vocab)
        self.classifier = None if num_classes is None else nn.Linear(config.d_model, num_classes)
        _xavier_init(self.encoder, self.mlm_head, self.classifier)
        self.mlm_head.weight = self.token_embedding.weight

    @checked("check_tokens")
    def forward(self, tokens: Tensor, *, need_weights: bool = False) -> Tensor:
        """Hidden states of token ids.

        Args:
            tokens: ids ``(batch, len)`` in ``[0, src_vocab)``, padded with ``src_pad_id``.
            need_weights: keep every layer's weights (:attr:`attention_weights`).

        Returns:
            ``(batch, len, d_model)``.
        """
        x = self.token_embedding(tokens)  # (batch, len, d_model)
        return self.encode_embeddings(x, self.real_positions(tokens), need_weights=need_weights)

    @checked("check_embeddings")
    def encode_embeddings(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> Tensor:
        """Hidden states of vectors: positions are added (or applied inside attention), then
        the encoder runs.

        Args:
            x: ``(batch, len, d_model)``, e.g. a [CLS] vector followed by patch embeddings.
            mask: boolean ``(batch, len)``, ``True`` at the real positions; the others
                (padding) are never attended to. ``None``: every position is real.
            need_weights: keep every layer's weights (:attr:`attention_weights`).

        Returns:
            ``(batch, len, d_model)``.
        """
        x = self.positions(x)  # (batch, len, d_model)
        attend = None if mask is None else mask[:, None, None, :]  # (batch, 1, 1, len)
        return self.encoder(x, attend, need_weights=need_weights)  # (batch, len, d_model)

    @checked("check_tokens")
    def mlm_logits(self, tokens: Tensor) -> Tensor:
        """Masked-language-model logits: ``tokens (batch, len)`` → ``(batch, len, src_vocab)``,
        the scores of every token id at every position."""
        return self.mlm_head(self(tokens))  # (batch, len, src_vocab)

    @checked("check_classify")
    def classify(self, tokens: Tensor) -> Tensor:
        """Class logits of token ids: ``tokens (batch, len)`` → ``(batch, num_classes)``,
        pooled as ``self.pooling`` says (padding never counts)."""
        real = self.real_positions(tokens)  # (batch, len) or None
        return self.classifier(self.pool(self(tokens), real))  # (batch, num_classes)

    @checked("check_classify_embeddings")
    def classify_embeddings(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Class logits of vectors ``x (batch, len, d_model)`` (``mask`` as in
        :meth:`encode_embeddings`) → ``(batch, num_classes)``: a Vision Transformer's head."""
        hidden = self.encode_embeddings(x, mask)  # (batch, len, d_model)
        return self.classifier(self.pool(hidden, mask))  # (batch, num_classes)

    def pool(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """One vector per sequence: ``hidden (batch, len, d_model)`` → ``(batch, d_model)``,
        position 0 (``pooling="cls"``) or the mean over the positions where ``mask (batch,
        len)`` is ``True`` (``"mean"``; every position without a mask; zeros for a row with
        no real position)."""
        if self.pooling == "cls":
            return hidden[:, 0]  # (batch, d_model)
        if mask is None:
            return hidden.mean(dim=1)  # (batch, d_model)
        weights = mask.to(hidden.dtype)[:, :, None]  # (batch, len, 1)
        total = (hidden * weights).sum(dim=1)  # (batch, d_model)
        return total / weights.sum(dim=1).clamp(min=1.0)  # (batch, d_model)

    def real_positions(self, tokens: Tensor) -> Tensor | None:
        """``tokens (batch, len)`` → boolean ``(batch, len)``, ``True`` where the token is not
        ``config.src_pad_id``; ``None`` without a pad id."""
        pad_id = self.config.src_pad_id
        return None if pad_id is None else tokens != pad_id  # (batch, len)

    @property
    def attention_weights(self) -> Tensor | None:
        """Every layer's self-attention weights from the last call with ``need_weights=True``:
        ``(layers, batch, heads, len, len)``, or ``None``."""
        return self.encoder.attention_weights

    # ---------------------------------------------------------------- checkpoints

    def to_checkpoint(self) -> dict[str, Any]:
        """A checkpoint of this model (with ``num_classes`` and ``pooling``) for
        :func:`companion.checkpoint.save_checkpoint`."""
        options = {"num_classes": self.num_classes, "pooling": self.pooling}
        return model_checkpoint(self, "EncoderOnlyTransformer", options=options)

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Mapping[str, Any] | str | os.PathLike[str]
    ) -> EncoderOnlyTransformer:
        """The model saved with :meth:`to_checkpoint` (a path or a loaded checkpoint), in
        evaluation mode, on the CPU, in the dtype it was saved in (a float64 model comes back
        float64, exactly); a :class:`~companion.checkpoint.CheckpointError` otherwise."""
        return rebuild_model(
            checkpoint, lambda config, options: cls(config, **options), "EncoderOnlyTransformer"
        )

    # ---------------------------------------------------------------- checks

    def check_tokens(self, tokens: Tensor, *, need_weights: bool = False) -> None:
        """Raise a clear error unless ``tokens`` are ids ``(batch, len)`` in ``[0, src_vocab)``
        that the positions can take (:meth:`forward`, :meth:`mlm_logits`)."""
        _check_tokens("tokens", tokens, self.config.src_vocab, "src_vocab")
        _check_length(self.config, "tokens", tokens.shape[1])
        check_bool("need_weights", need_weights)

    def check_embeddings(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> None:
        """Raise a clear error for anything :meth:`encode_embeddings` cannot take."""
        check_sequence("x", x, self.config.d_model, "len")
        check_module_dtype("x", x, self.encoder)
        if x.shape[1] == 0:
            raise ValueError(f"x must have at least one position, got shape {shape_str(x.shape)}")
        _check_length(self.config, "x", x.shape[1])
        if mask is not None:
            check_bool_tensor("mask", mask)
            if tuple(mask.shape) != tuple(x.shape[:2]):
                raise ValueError(
                    f"mask must have shape (batch, len) = {shape_str(x.shape[:2])} (True at the "
                    f"real positions of x), got {shape_str(mask.shape)}"
                )
        check_bool("need_weights", need_weights)

    def check_classify(self, tokens: Tensor) -> None:
        """Raise a clear error for anything :meth:`classify` cannot take."""
        self.check_head()
        self.check_tokens(tokens)

    def check_classify_embeddings(self, x: Tensor, mask: Tensor | None = None) -> None:
        """Raise a clear error for anything :meth:`classify_embeddings` cannot take."""
        self.check_head()
        self.check_embeddings(x, mask)

    def check_head(self) -> None:
        """Raise a clear error when the model has no classification head."""
        if self.classifier is None:
            raise ValueError(
                "classify needs a classification head, but the model was built with "
                "num_classes=None; build it with EncoderOnlyTransformer(config, num_classes=...)"
            )


# ------------------------------------------------------------------------ checks


def _check_config(config: object, vocab_field: str, model: str) -> TransformerConfig:
    """``config`` is a :class:`TransformerConfig` whose ``vocab_field`` is set."""
    check_instance("config", config, TransformerConfig, "a TransformerConfig")
    if getattr(config, vocab_field) is None:
        raise ValueError(
            f"config.{vocab_field} must be set for a {model} (its vocabulary size), got None; "
            f"e.g. dataclasses.replace(config, {vocab_field}=len(vocab))"
        )
    return config


_EMPTY_PROMPT = (
    "the first new token is predicted from the last prompt token, so a model without one has "
    "nothing to condition on: begin every prompt with a <bos> id"
)


def _check_tokens(
    name: str, tokens: object, vocab: int, vocab_name: str, empty: str = ""
) -> Tensor:
    """Ids ``(batch, len)`` with ``len >= 1``, each in ``[0, vocab)``; ``empty`` explains
    why no position is not enough."""
    tensor = check_token_ids(name, tokens)
    check_ndim(name, tensor, 2, f"(batch, {name}_len)")
    if tensor.shape[1] == 0:
        why = f"; {empty}" if empty else ""
        raise ValueError(
            f"{name} must have at least one position, got shape {shape_str(tensor.shape)}{why}"
        )
    return check_index_range(name, tensor, vocab, vocab_name)


def _check_length(config: TransformerConfig, name: str, length: int, offset: int = 0) -> None:
    """Learned positions exist only up to ``config.max_len``: name the sequence too long."""
    max_len = config.max_len
    if config.positional == "learned" and offset + length > max_len:
        at = f" starting at position {offset}" if offset else ""
        raise ValueError(
            f"{name} has {length} position(s){at}, so it needs positions up to "
            f"{offset + length - 1}, but the learned position embedding "
            f"(config.positional='learned') has max_len={max_len} (positions 0..{max_len - 1}); "
            "pass a shorter sequence or build the model with a larger max_len"
        )
