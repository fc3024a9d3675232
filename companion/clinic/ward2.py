"""Ward 2 of chapter 11's bug clinic: bugs 11-18, self-contained cases (a few lines of buggy
code beside the fix): attention functions, a layer, an embedding, each with its own one-line
test.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from companion.clinic.patient import PAD_ID, DecoderLayer, MultiHeadAttention, Transformer

__all__ = [
    "discarded_mask_attention",
    "past_blocking_attention",
    "causal_attention",
    "no_softmax_attention",
    "InlineNormBlock",
    "RegisteredNormBlock",
    "DetachedPositions",
    "LearnedPositions",
    "PaddingIdxEncoder",
    "MaskedPaddingEncoder",
    "interleaved_stacks",
    "stacked",
    "CrossInputsSwapped",
    "cross_padding_mask",
    "DropoutAfterNorm",
    "DropoutBeforeAdd",
    "OneBasedEmbedding",
    "ZeroBasedEmbedding",
]


def discarded_mask_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Bug 12: causal attention whose ``masked_fill`` result is thrown away.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)``.
    """
    n = q.shape[-2]
    blocked = torch.tril(torch.ones(n, n)) == 1  # BUG 12b: True on the past and the diagonal
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores.masked_fill(blocked, float("-inf"))  # BUG 12a: not in place, the result is lost
    return torch.softmax(scores, dim=-1) @ v  # (batch, n, d)


def past_blocking_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Bug 12 half fixed: the result kept, the ``tril == 1`` mask still marks the past.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)`` (the last row is NaN: all blocked).
    """
    n = q.shape[-2]
    blocked = torch.tril(torch.ones(n, n)) == 1  # BUG 12b: blocks the past, not the future
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores = scores.masked_fill(blocked, float("-inf"))  # kept now
    return torch.softmax(scores, dim=-1) @ v  # (batch, n, d)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The fix of bugs 12 and 13: scaled, masked (future blocked), softmax over the keys.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)``.
    """
    n = q.shape[-2]
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))  # (n, n): True = may attend
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores = scores.masked_fill(~allowed, float("-inf"))  # keep the result
    return torch.softmax(scores, dim=-1) @ v  # (batch, n, d)


def no_softmax_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Bug 13: the scores used as weights, no softmax.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)``.
    """
    n = q.shape[-2]
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))  # (n, n)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores = scores.masked_fill(~allowed, 0.0)  # (batch, n, n)
    return scores @ v  # BUG: rows of "weights" that do not sum to 1


class InlineNormBlock(nn.Module):
    """Bug 14: a residual block whose LayerNorm is built inside ``forward`` (over the last two
    axes, ``(len, d_model)``)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        y = x + self.linear(x)  # (batch, len, d_model)
        return nn.LayerNorm(y.shape[1:])(y)  # BUG: new, unregistered γ/β; normalises len too


class RegisteredNormBlock(nn.Module):
    """The fix of bug 14: the LayerNorm is a registered sub-module over ``d_model``."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        return self.norm(x + self.linear(x))  # (batch, len, d_model)


class DetachedPositions(nn.Module):
    """Bug 15: learned positions added through ``.data``, which detaches them from autograd."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        return x + self.pos_embedding.data[:, : x.shape[1]]  # BUG: .data gets no gradient


class LearnedPositions(DetachedPositions):
    """The fix of bug 15: the parameter itself is added."""

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        return x + self.pos_embedding[:, : x.shape[1]]  # (batch, len, d_model)


class PaddingIdxEncoder(nn.Module):
    """Bug 11: ``padding_idx`` taken for a padding mask. It only zeroes the pads' embedding
    (and its gradient); attention still gives the pads weight."""

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, pad_id: int = PAD_ID) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.attention = MultiHeadAttention(d_model, num_heads)

    def forward(self, tokens: Tensor) -> Tensor:
        """``(batch, len)`` ids → ``(batch, len, d_model)``."""
        x = self.embedding(tokens)  # (batch, len, d_model)
        return self.attention(x, x, x)  # BUG: no mask, the pads are attended to


class MaskedPaddingEncoder(PaddingIdxEncoder):
    """The fix of bug 11: a key padding mask built from the ids."""

    def forward(self, tokens: Tensor) -> Tensor:
        """``(batch, len)`` ids → ``(batch, len, d_model)``."""
        x = self.embedding(tokens)  # (batch, len, d_model)
        mask = (tokens != self.pad_id)[:, None, None, :]  # (batch, 1, 1, len)
        return self.attention(x, x, x, mask)  # (batch, len, d_model)


def interleaved_stacks(model: Transformer, src: Tensor, tgt: Tensor) -> Tensor:
    """Bug 16a: the miswired stacks: encoder and decoder layers run as ``(encoder layer,
    decoder layer)`` pairs, so each decoder layer reads the encoder layer of the same index.
    ``src (batch, src_len)``, ``tgt (batch, tgt_len)`` → logits ``(batch, tgt_len, vocab)``."""
    src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len)
    tgt_mask = model.causal_mask(tgt.shape[1])  # (tgt_len, tgt_len)
    x = model.src_positions(model.src_embedding(src))  # (batch, src_len, d_model)
    y = model.tgt_positions(model.tgt_embedding(tgt))  # (batch, tgt_len, d_model)
    for enc_layer, dec_layer in zip(model.encoder.layers, model.decoder.layers):
        x = enc_layer(x, src_mask)  # (batch, src_len, d_model)
        y = dec_layer(y, x, src_mask, tgt_mask)  # BUG: x is not the final memory yet
    return model.generate(y)  # (batch, tgt_len, vocab)


def stacked(model: Transformer, src: Tensor, tgt: Tensor) -> Tensor:
    """The fix of bug 16a: the whole encoder first, then every decoder layer reads its output.
    Same shapes as :func:`interleaved_stacks`."""
    src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len)
    tgt_mask = model.causal_mask(tgt.shape[1])  # (tgt_len, tgt_len)
    x = model.src_positions(model.src_embedding(src))  # (batch, src_len, d_model)
    y = model.tgt_positions(model.tgt_embedding(tgt))  # (batch, tgt_len, d_model)
    for enc_layer in model.encoder.layers:
        x = enc_layer(x, src_mask)  # (batch, src_len, d_model)
    for dec_layer in model.decoder.layers:
        y = dec_layer(y, x, src_mask, tgt_mask)  # (batch, tgt_len, d_model): the final memory
    return model.generate(y)  # (batch, tgt_len, vocab)


class CrossInputsSwapped(DecoderLayer):
    """Bug 16b: cross-attention with queries *and keys* from the decoder, values from the
    encoder."""

    def cross_attention_block(self, x: Tensor, memory: Tensor, src_mask: Tensor | None) -> Tensor:
        """Runs only when the source and target lengths agree."""
        attended = self.cross_attention(x, x, memory, src_mask)  # BUG: (x, memory, memory)
        return self.cross_attention_norm(x + self.dropout(attended))  # (batch, tgt_len, d_model)


def cross_padding_mask(query_tokens: Tensor, key_tokens: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """The cross-attention mask: ``(batch, 1, q_len, k_len)``, ``True`` where key token ``j``
    is real. Cross-attention's queries come from the target and its keys from the source:
    ``cross_padding_mask(tgt, src)``. Bug 16c swaps the arguments, ``cross_padding_mask(src,
    tgt)``: the mask then follows the *target's* pads, and shape-checks only when the lengths
    agree."""
    real = key_tokens != pad_id  # (batch, k_len)
    q_len = query_tokens.shape[1]
    return real[:, None, None, :].expand(-1, 1, q_len, -1)  # (batch, 1, q_len, k_len)


class DropoutAfterNorm(nn.Module):
    """Bug 17: dropout applied after the LayerNorm, to the whole residual stream."""

    def __init__(self, sublayer: nn.Module, d_model: int, dropout: float) -> None:
        super().__init__()
        self.sublayer = sublayer
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        return self.dropout(self.norm(x + self.sublayer(x)))  # BUG: drops the residual stream


class DropoutBeforeAdd(DropoutAfterNorm):
    """The fix of bug 17: dropout on the sub-layer's output, before the residual addition."""

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        return self.norm(x + self.dropout(self.sublayer(x)))  # (batch, len, d_model)


class OneBasedEmbedding(nn.Module):
    """Bug 18: words numbered ``1 … vocab_size`` looked up in ``nn.Embedding(vocab_size, d)``."""

    def __init__(self, num_words: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_words, d_model)  # BUG: ids 1 … vocab_size

    def forward(self, word_ids: Tensor) -> Tensor:
        """``(batch, len)`` ids in ``1 … vocab_size`` → ``(batch, len, d_model)``."""
        return self.embedding(word_ids)  # IndexError on id vocab_size; row 0 is never used


class ZeroBasedEmbedding(OneBasedEmbedding):
    """The fix of bug 18: shift the ids to ``0 … vocab_size - 1`` (or number them from 0)."""

    def forward(self, word_ids: Tensor) -> Tensor:
        """``(batch, len)`` ids in ``1 … vocab_size`` → ``(batch, len, d_model)``."""
        return self.embedding(word_ids - 1)  # (batch, len, d_model)
