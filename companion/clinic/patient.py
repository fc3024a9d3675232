"""The patient of chapter 11's bug clinic: a Transformer written in the usual from-scratch
style (correct).

Short classes (:class:`PositionalEncoding`, :class:`MultiHeadAttention`, :class:`FeedForward`,
:class:`EncoderLayer`, :class:`DecoderLayer`, :class:`Encoder`, :class:`Decoder`,
:class:`Transformer`), :func:`greedy_decode`, :func:`sequence_loss`, and the toy task's ids. The
bugs of :mod:`companion.clinic.ward1` each override one method of these classes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_callable, check_instance, check_positive_int

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "VOCAB_SIZE",
    "SEQ_LEN",
    "Parts",
    "PositionalEncoding",
    "MultiHeadAttention",
    "FeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "Transformer",
    "TokenEmbedding",
    "greedy_decode",
    "sequence_loss",
    "READER_VOCAB_SIZE",
    "padded_batch",
    "teacher_forcing",
    "ReaderAttention",
    "ReaderTransformer",
    "Patient",
]

#: The toy task's ids follow :mod:`companion.data.vocab`: four special tokens, then 7 symbols.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
VOCAB_SIZE = 11
#: Symbols per toy sequence; a source is the symbols and ``<eos>``: 13 tokens.
SEQ_LEN = 12


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table of the paper: ``PE[p, 2m] = sin(p / 10000^(2m/d_model))``,
    ``PE[p, 2m+1] = cos(p / 10000^(2m/d_model))`` for pair ``m``.

    The table is a non-persistent buffer: it is not in ``state_dict``, as in
    :class:`companion.positional.SinusoidalPositionalEncoding`.

    Args:
        d_model: size of the vectors (even).
        max_len: number of positions in the table.
    """

    def __init__(self, d_model: int, max_len: int = 64) -> None:
        super().__init__()
        table = self.build_table(max_len, d_model)  # (max_len, d_model)
        self.register_buffer("table", table[None], persistent=False)  # (1, max_len, d_model)

    @staticmethod
    def build_table(max_len: int, d_model: int) -> Tensor:
        """The ``(max_len, d_model)`` table, sine on even and cosine on odd dimensions."""
        position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
        two_m = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,): 2m = 0, 2, 4, ...
        angle = position / 10000 ** (two_m / d_model)  # (max_len, d_model/2)
        table = torch.zeros(max_len, d_model, dtype=torch.float64)  # (max_len, d_model)
        table[:, 0::2] = torch.sin(angle)  # even dimensions 2m
        table[:, 1::2] = torch.cos(angle)  # odd dimensions 2m + 1, the same frequency
        return table.float()  # (max_len, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``x (batch, seq_len, d_model)`` → the same shape, positions added."""
        seq_len = x.size(1)
        if seq_len > self.table.size(1):  # a shorter slice would fail to broadcast, unnamed
            raise ValueError(f"x has {seq_len} positions, the table max_len={self.table.size(1)}")
        return x + self.table[:, :seq_len]  # (batch, seq_len, d_model)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project, split into heads, attend, merge, project.

    Args:
        d_model: size of the vectors; ``head_dim = d_model / num_heads``.
        num_heads: number of heads.
        dropout: dropout on the attention weights.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.query_proj = nn.Linear(d_model, d_model)
        self.key_proj = nn.Linear(d_model, d_model)
        self.value_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """``query (batch, q_len, d_model)``, ``key``/``value (batch, k_len, d_model)``, ``mask``
        boolean broadcastable to ``(batch, heads, q_len, k_len)`` (``True`` = may attend) →
        ``(batch, q_len, d_model)``."""
        q, k, v = self.project(query, key, value)  # (batch, heads, len, head_dim) each
        out, _ = self.attend(q, k, v, mask)  # (batch, heads, q_len, head_dim)
        return self.out_proj(self.merge_heads(out))  # (batch, q_len, d_model)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The three ``d_model × d_model`` projections, then the split into heads."""
        q = self.split_heads(self.query_proj(query))  # (batch, heads, q_len, head_dim)
        k = self.split_heads(self.key_proj(key))  # (batch, heads, k_len, head_dim)
        v = self.split_heads(self.value_proj(value))  # (batch, heads, k_len, head_dim)
        return q, k, v

    def split_heads(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → ``(batch, heads, len, head_dim)``: head ``r`` gets
        features ``r·head_dim … (r+1)·head_dim − 1`` of every token."""
        batch, seq_len, _ = x.shape
        x = x.view(batch, seq_len, self.num_heads, self.head_dim)  # (batch, len, heads, head_dim)
        return x.transpose(1, 2)  # (batch, heads, len, head_dim)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(batch, heads, len, head_dim)`` → ``(batch, len, d_model)``."""
        batch, _, seq_len, _ = x.shape
        x = x.transpose(1, 2)  # (batch, len, heads, head_dim)
        return x.reshape(batch, seq_len, self.num_heads * self.head_dim)  # (batch, len, d_model)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Scaled dot-product attention in every head: ``(output, weights)``, shapes
        ``(batch, heads, q_len, head_dim)`` and ``(batch, heads, q_len, k_len)``."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (batch, heads, q_len, k_len)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # blocked keys get no weight
        weights = torch.softmax(scores, dim=-1)  # (batch, heads, q_len, k_len), rows sum to 1
        return self.dropout(weights) @ v, weights  # (batch, heads, q_len, head_dim)


class FeedForward(nn.Module):
    """``Linear(d_model, d_ff)`` → ReLU → dropout → ``Linear(d_ff, d_model)``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.hidden_proj = nn.Linear(d_model, d_ff)
        self.output_proj = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, len, d_model)`` → the same shape."""
        return self.output_proj(self.dropout(F.relu(self.hidden_proj(x))))  # (batch, len, d_model)


@dataclass(frozen=True)
class Parts:
    """The classes a :class:`Transformer` is built from; a bug replaces one of them."""

    positions: type[PositionalEncoding] = PositionalEncoding
    attention: type[MultiHeadAttention] = MultiHeadAttention
    decoder_layer: type[DecoderLayer] | None = None  # None: DecoderLayer
    decoder: type[Decoder] | None = None  # None: Decoder


class EncoderLayer(nn.Module):
    """Post-LN encoder layer: ``x = norm(x + dropout(sublayer(x)))`` around self-attention,
    then around the feed-forward network."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        attention: type[MultiHeadAttention] = MultiHeadAttention,
    ) -> None:
        super().__init__()
        self.self_attention = attention(d_model, num_heads, dropout)
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x (batch, src_len, d_model)``, ``mask`` over the keys → the same shape."""
        attended = self.self_attention(x, x, x, mask)  # (batch, src_len, d_model)
        x = self.self_attention_norm(x + self.dropout(attended))  # (batch, src_len, d_model)
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))  # same shape


class DecoderLayer(nn.Module):
    """Post-LN decoder layer: causal self-attention over the target, cross-attention to the
    encoder output (``memory``), feed-forward network."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        attention: type[MultiHeadAttention] = MultiHeadAttention,
    ) -> None:
        super().__init__()
        self.self_attention = attention(d_model, num_heads, dropout)
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.cross_attention = attention(d_model, num_heads, dropout)
        self.cross_attention_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        """``x (batch, tgt_len, d_model)``, ``memory (batch, src_len, d_model)`` → like ``x``."""
        attended = self.self_attention(x, x, x, tgt_mask)  # (batch, tgt_len, d_model)
        x = self.self_attention_norm(x + self.dropout(attended))  # (batch, tgt_len, d_model)
        x = self.cross_attention_block(x, memory, src_mask)  # (batch, tgt_len, d_model)
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))  # same shape

    def cross_attention_block(self, x: Tensor, memory: Tensor, src_mask: Tensor | None) -> Tensor:
        """Queries from the target, keys and values from the source; the residual carries
        ``x``, the sub-layer's input."""
        attended = self.cross_attention(x, memory, memory, src_mask)  # (batch, tgt_len, d_model)
        return self.cross_attention_norm(x + self.dropout(attended))  # (batch, tgt_len, d_model)


class Encoder(nn.Module):
    """``num_layers`` encoder layers."""

    def __init__(self, num_layers: int, make_layer: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(make_layer() for _ in range(num_layers))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``(batch, src_len, d_model)`` → the same shape."""
        for layer in self.layers:
            x = layer(x, mask)  # (batch, src_len, d_model)
        return x


class Decoder(nn.Module):
    """``num_layers`` decoder layers, each reading the final encoder output."""

    def __init__(self, num_layers: int, make_layer: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(make_layer() for _ in range(num_layers))

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        """``x (batch, tgt_len, d_model)``, ``memory (batch, src_len, d_model)`` → like ``x``."""
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)  # (batch, tgt_len, d_model)
        return x


class Transformer(nn.Module):
    """The encoder-decoder of the paper, small, for the toy task; returns logits.

    Args:
        vocab_size: one vocabulary for source and target.
        d_model, num_heads, num_layers, d_ff: sizes (``num_layers`` in each stack).
        dropout: dropout probability everywhere.
        max_len: positions in the table.
        pad_id: the padding id (its keys are masked).
        parts: the classes to build from (:class:`Parts`); a bug swaps one.
    """

    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        d_model: int = 32,
        num_heads: int = 4,
        num_layers: int = 2,
        d_ff: int = 64,
        dropout: float = 0.0,
        max_len: int = 64,
        pad_id: int = PAD_ID,
        parts: Parts | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("d_ff", d_ff), ("max_len", max_len)):  # fmt: skip
            check_positive_int(name, value)
        if d_model % (2 * num_heads):
            raise ValueError(
                f"d_model must be a multiple of 2·num_heads = {2 * num_heads} (heads of even "
                f"size, sin/cos pairs), got d_model={d_model}"
            )
        parts = check_instance("parts", Parts() if parts is None else parts, Parts)
        self.sizes = dict(vocab_size=vocab_size, d_model=d_model, num_heads=num_heads,
                          num_layers=num_layers, d_ff=d_ff, dropout=dropout, max_len=max_len,
                          pad_id=pad_id)  # fmt: skip
        self.pad_id = pad_id
        decoder_layer = parts.decoder_layer or DecoderLayer
        self.src_embedding = TokenEmbedding(vocab_size, d_model)
        self.tgt_embedding = TokenEmbedding(vocab_size, d_model)
        self.src_positions = parts.positions(d_model, max_len)
        self.tgt_positions = parts.positions(d_model, max_len)
        self.encoder = Encoder(
            num_layers, lambda: EncoderLayer(d_model, num_heads, d_ff, dropout, parts.attention)
        )
        self.decoder = (parts.decoder or Decoder)(
            num_layers, lambda: decoder_layer(d_model, num_heads, d_ff, dropout, parts.attention)
        )
        self.generator = nn.Linear(d_model, vocab_size)
        for module in (self.encoder, self.decoder, self.generator):
            for parameter in module.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        nn.init.zeros_(self.generator.bias)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """``src (batch, src_len)``, ``tgt (batch, tgt_len)`` (the target shifted right) →
        logits ``(batch, tgt_len, vocab_size)``."""
        src_mask = self.make_src_mask(src)  # (batch, 1, 1, src_len)
        memory = self.encode(src, src_mask)  # (batch, src_len, d_model)
        return self.decode(tgt, memory, src_mask)  # (batch, tgt_len, vocab_size)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (batch, src_len)`` → ``memory (batch, src_len, d_model)``."""
        x = self.src_positions(self.src_embedding(src))  # (batch, src_len, d_model)
        return self.encoder(x, src_mask)  # (batch, src_len, d_model)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``tgt (batch, tgt_len)``, ``memory (batch, src_len, d_model)`` → logits."""
        causal = self.causal_mask(tgt.shape[1]).to(tgt.device)  # (tgt_len, tgt_len)
        tgt_mask = (tgt != self.pad_id)[:, None, None, :] & causal  # (batch, 1, tgt_len, tgt_len)
        y = self.tgt_positions(self.tgt_embedding(tgt))  # (batch, tgt_len, d_model)
        y = self.decoder(y, memory, src_mask, tgt_mask)  # (batch, tgt_len, d_model)
        return self.generate(y)  # (batch, tgt_len, vocab_size)

    def generate(self, y: Tensor) -> Tensor:
        """``(batch, tgt_len, d_model)`` → logits ``(batch, tgt_len, vocab_size)``: no softmax,
        the loss applies it."""
        return self.generator(y)  # (batch, tgt_len, vocab_size)

    def make_src_mask(self, src: Tensor) -> Tensor:
        """``(batch, 1, 1, src_len)``, ``True`` for the real (non-padding) source keys."""
        return (src != self.pad_id)[:, None, None, :]  # (batch, 1, 1, src_len)

    def causal_mask(self, size: int) -> Tensor:
        """``(size, size)``, ``True`` where query ``i`` may attend to key ``j``: ``j <= i``."""
        return torch.tril(torch.ones(size, size, dtype=torch.bool))  # (size, size)


class TokenEmbedding(nn.Module):
    """Token ids → vectors × ``√d_model`` (the table starts with std ``1/√d_model``)."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        """``(batch, len)`` ids → ``(batch, len, d_model)``."""
        return self.embedding(tokens) * self.scale  # (batch, len, d_model)


def greedy_decode(model: Transformer, src: Tensor, max_len: int) -> Tensor:
    """Greedy decoding for a whole batch: feed the growing sequence back at every step.

    Args:
        model: a clinic :class:`Transformer`.
        src: ``(batch, src_len)`` source ids.
        max_len: number of tokens to generate (the toy targets have a fixed length, so the
            loop does not stop at ``<eos>``).

    Returns:
        ``(batch, max_len)`` ids, without the leading ``<bos>``.
    """
    check_positive_int("max_len", max_len)
    if max_len > model.sizes["max_len"]:  # the last prefix fed back reads positions 0..max_len-1
        raise ValueError(
            f"max_len must be <= the model's max_len={model.sizes['max_len']}, got {max_len}"
        )
    src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len)
    memory = model.encode(src, src_mask)  # (batch, src_len, d_model)
    ys = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long)  # (batch, 1)
    for _ in range(max_len):
        logits = model.decode(ys, memory, src_mask)  # (batch, t, vocab): the whole prefix
        next_token = logits[:, -1].argmax(dim=-1)  # (batch,): every row at once
        ys = torch.cat([ys, next_token[:, None]], dim=1)  # (batch, t + 1)
    return ys[:, 1:]  # (batch, max_len)


def sequence_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits (batch, len, vocab)`` against ``targets (batch, len)``,
    padding ignored. ``F.cross_entropy`` applies the log-softmax itself: pass logits."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_ID)


# --------------------------------------------------------------------------------------------
# Ward 1 for any model: a reader's Transformer, a padded variable-length task, the patient
# --------------------------------------------------------------------------------------------

#: The padded task's vocabulary: the four special tokens and 12 symbols (ids 4-15). It differs
#: from :data:`VOCAB_SIZE` on purpose: the diagnostics of :mod:`companion.clinic.toolkit` take
#: the vocabulary as an argument, never from a constant.
READER_VOCAB_SIZE = 16


def padded_batch(
    batch_size: int,
    generator: torch.Generator,
    *,
    vocab_size: int = READER_VOCAB_SIZE,
    min_len: int = 4,
    max_len: int = 9,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> tuple[Tensor, Tensor]:
    """A padded batch of the *every other symbol, reversed* task: ``(src, tgt)``.

    Sentence ``b`` has ``n_b`` symbols (drawn from ``min_len … max_len``, ids ``4 …
    vocab_size - 1``). ``src (batch, src_len)`` is the symbols and ``<eos>``, right-padded
    with ``<pad>`` to the longest source; ``tgt (batch, tgt_len)`` is ``<bos>``, the symbols at
    even positions ``0, 2, 4, …`` in reverse order, ``<eos>``, right-padded. Source and target
    lengths differ (``tgt`` holds about half the symbols), and every batch has padding on
    both sides unless all lengths agree: the case where padding and loss bugs show symptoms.
    :func:`teacher_forcing` splits ``tgt`` into the decoder input and the labels.
    ``pad_id``, ``bos_id`` and ``eos_id`` are the special ids (default ``0, 1, 2``, the
    course's; fairseq and BART use ``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2). The symbols are
    drawn from the ids ``4 … vocab_size - 1`` that are none of the three; with the defaults,
    ``4 … vocab_size - 1``.
    """
    check_positive_int("batch_size", batch_size)
    check_instance("generator", generator, torch.Generator, "a torch.Generator")
    check_positive_int("vocab_size", vocab_size, minimum=5)
    check_positive_int("min_len", min_len)
    check_positive_int("max_len", max_len, minimum=min_len)
    special = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
    for name, value in special.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
            raise ValueError(f"{name} must be an int in 0 … {vocab_size - 1}, got {value!r}")
    if len(set(special.values())) < 3:
        raise ValueError(f"pad_id, bos_id and eos_id must differ, got {special}")
    allowed = torch.tensor([i for i in range(4, vocab_size) if i not in special.values()])
    if len(allowed) < 2:
        raise ValueError(f"vocab_size {vocab_size} leaves fewer than 2 symbol ids")
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (batch,)
    src_rows, tgt_rows = [], []
    for n in lengths.tolist():
        symbols = allowed[torch.randint(0, len(allowed), (n,), generator=generator)]  # (n,)
        src_rows.append(torch.cat([symbols, torch.tensor([eos_id])]))  # (n + 1,)
        kept = symbols[0::2].flip(0)  # (ceil(n / 2),): even positions, reversed
        tgt_rows.append(torch.cat([torch.tensor([bos_id]), kept, torch.tensor([eos_id])]))
    src = nn.utils.rnn.pad_sequence(src_rows, batch_first=True, padding_value=pad_id)
    tgt = nn.utils.rnn.pad_sequence(tgt_rows, batch_first=True, padding_value=pad_id)
    return src, tgt  # (batch, src_len), (batch, tgt_len)


def teacher_forcing(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """``tgt (batch, tgt_len)`` → ``(tgt_in, labels)``, each ``(batch, tgt_len - 1)``: the
    decoder reads tokens ``0 … n-2`` and predicts tokens ``1 … n-1`` (the label of position
    ``t`` is the *next* token)."""
    if not isinstance(tgt, Tensor) or tgt.dim() != 2 or tgt.shape[1] < 2:
        got = f"shape {tuple(tgt.shape)}" if isinstance(tgt, Tensor) else type(tgt).__name__
        raise ValueError(f"tgt must be a (batch, tgt_len) tensor of ids, tgt_len >= 2, got {got}")
    return tgt[:, :-1], tgt[:, 1:]  # (batch, tgt_len - 1) each


class ReaderAttention(MultiHeadAttention):
    """The clinic's attention written as most tutorials write it: blocked scores set to
    ``-1e9`` (not ``-inf``), so a row with every key blocked gives a uniform softmax instead of
    NaN, and a mask on the wrong axis runs without a sign."""

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``q (batch, heads, q_len, head_dim)``, ``k``/``v (batch, heads, k_len, head_dim)`` →
        ``(output, weights)``, ``(batch, heads, q_len, head_dim)`` and ``(batch, heads, q_len,
        k_len)``."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (batch, heads, q_len, k_len)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)  # blocked keys: weight exp(-1e9) = 0
        weights = self.normalise(scores)  # (batch, heads, q_len, k_len)
        return self.dropout(weights) @ v, weights  # (batch, heads, q_len, head_dim)

    def normalise(self, scores: Tensor) -> Tensor:
        """Softmax over the keys (the last axis): each query's weights sum to 1."""
        return torch.softmax(scores, dim=-1)  # (batch, heads, q_len, k_len)


class ReaderTransformer(nn.Module):
    """A reader's encoder-decoder in plain PyTorch, for the diagnostics that work on any model.

    Its own names (``embed``, ``encoder_layers``, ``decoder_layers``), one embedding table
    shared by source, target and output (tied weights, no output bias, the output rescaled by
    ``1/√d_model``), sinusoidal positions,
    the clinic's Post-LN layers with :class:`ReaderAttention`, dropout 0.1 by default. Each
    bug for any model (in :mod:`companion.clinic.ward1`) overrides one method. Its small
    tied output makes the loss start at ``ln(vocabulary size)`` but learn one batch more
    slowly than the clinic's :class:`Transformer`: chapter 11's recipe gives one batch 300 Adam
    steps at ``lr=5e-3`` with ``dropout=0`` (at ``lr=1e-2`` its loss can spike back up late
    in the run).

    Args:
        vocab_size: one vocabulary for source, target and output.
        d_model, num_heads, num_layers, d_ff: sizes (``num_layers`` in each stack).
        dropout: dropout probability everywhere.
        max_len: positions in the table.
        pad_id: the padding id (masked as a key).
        attention: the attention class (default :class:`ReaderAttention`); a bug swaps it.
    """

    def __init__(
        self,
        vocab_size: int = READER_VOCAB_SIZE,
        d_model: int = 32,
        num_heads: int = 4,
        num_layers: int = 2,
        d_ff: int = 64,
        dropout: float = 0.1,
        max_len: int = 64,
        pad_id: int = PAD_ID,
        attention: type[ReaderAttention] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("d_ff", d_ff), ("max_len", max_len)):  # fmt: skip
            check_positive_int(name, value)
        if d_model % (2 * num_heads):
            raise ValueError(
                f"d_model must be a multiple of 2·num_heads = {2 * num_heads}, got {d_model}"
            )
        attention = ReaderAttention if attention is None else attention
        if not (isinstance(attention, type) and issubclass(attention, ReaderAttention)):
            raise TypeError(f"attention must be a ReaderAttention subclass, got {attention!r}")
        self.sizes = dict(vocab_size=vocab_size, d_model=d_model, num_heads=num_heads,
                          num_layers=num_layers, d_ff=d_ff, dropout=dropout, max_len=max_len,
                          pad_id=pad_id)  # fmt: skip
        self.pad_id, self.d_model = pad_id, d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.init_embedding()
        table = PositionalEncoding.build_table(max_len, d_model)  # (max_len, d_model)
        self.register_buffer("pe", table, persistent=False)  # (max_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.encoder_layers = self.make_stack(
            lambda: EncoderLayer(d_model, num_heads, d_ff, dropout, attention), num_layers
        )
        self.decoder_layers = self.make_stack(
            lambda: DecoderLayer(d_model, num_heads, d_ff, dropout, attention), num_layers
        )

    def init_embedding(self) -> None:
        """Rows of std ``1/√d_model``: ``× √d_model`` at the input gives unit-size vectors, and
        the tied output logits of size about 1 before its ``1/√d_model`` rescaling."""
        nn.init.normal_(self.embed.weight, std=self.d_model**-0.5)

    def make_stack(self, make_layer: Callable[[], nn.Module], num_layers: int) -> nn.Module:
        """``num_layers`` layers in an ``nn.ModuleList``: registered, so in ``parameters()``,
        ``state_dict()`` and moved by ``.to()``."""
        return nn.ModuleList(make_layer() for _ in range(num_layers))

    def add_positions(self, x: Tensor) -> Tensor:
        """``x (batch, len, d_model)`` → the same shape: position ``p`` added to token ``p``."""
        return x + self.pe[: x.size(1)]  # (len, d_model) broadcast over the batch

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """``(batch, len)`` ids → ``(batch, len, d_model)``: scaled embedding, positions, dropout."""
        return self.drop(self.add_positions(self.embed(ids) * math.sqrt(self.d_model)))

    def padding_mask(self, ids: Tensor) -> Tensor:
        """``(batch, 1, 1, len)``, ``True`` on the real keys: every query ignores the pads."""
        return (ids != self.pad_id)[:, None, None, :]  # (batch, 1, 1, len)

    def encoder_mask(self, src: Tensor) -> Tensor:
        """The encoder's self-attention mask: the source's key padding mask."""
        return self.padding_mask(src)  # (batch, 1, 1, src_len)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """``src (batch, src_len)``, ``tgt_in (batch, tgt_len)`` → logits ``(batch, tgt_len,
        vocab_size)``."""
        memory = self.embed_tokens(src)  # (batch, src_len, d_model)
        for layer in self.encoder_layers:
            memory = layer(memory, self.encoder_mask(src))  # (batch, src_len, d_model)
        tgt_len = tgt_in.shape[1]
        causal = torch.tril(torch.ones(tgt_len, tgt_len, dtype=torch.bool, device=tgt_in.device))
        tgt_mask = self.padding_mask(tgt_in) & causal  # (batch, 1, tgt_len, tgt_len)
        y = self.embed_tokens(tgt_in)  # (batch, tgt_len, d_model)
        for layer in self.decoder_layers:
            y = layer(y, memory, self.padding_mask(src), tgt_mask)  # (batch, tgt_len, d_model)
        return self.output(y)  # (batch, tgt_len, vocab_size)

    def output(self, y: Tensor) -> Tensor:
        """``(batch, tgt_len, d_model)`` → logits ``(batch, tgt_len, vocab_size)``: the tied
        table, rescaled by ``1/√d_model`` (the input multiplied by ``√d_model``; T5 rescales its
        tied output the same way), so that the logits start small and the loss near
        ``ln(vocabulary size)``."""
        return (y @ self.embed.weight.T) * self.d_model**-0.5  # (batch, tgt_len, vocab_size)


@dataclass
class Patient:
    """A model as a reader hands it to the clinic: the model and the code around it.

    Attributes:
        model: the ``nn.Module``.
        logits: the reader's evaluation forward, ``(src (batch, src_len), tgt_in (batch,
            tgt_len))`` → logits ``(batch, tgt_len, vocab_size)``.
        loss: ``(logits (batch, len, vocab), labels (batch, len))`` → a scalar.
        shift: ``tgt (batch, tgt_len)`` → ``(tgt_in, labels)`` (:func:`teacher_forcing`).
        vocab_size, pad_id: the vocabulary size and the padding id.
        bos_id, eos_id: the ids of ``<bos>`` and ``<eos>``; with ``pad_id``, the special ids
            of :meth:`batch`, the batch that :func:`~companion.clinic.toolkit.examine` tests on.
        label: what the patient's repr shows (a mystery patient hides its bug).
    """

    model: nn.Module
    logits: Callable[..., Tensor]
    loss: Callable[[Tensor, Tensor], Tensor]
    shift: Callable[[Tensor], tuple[Tensor, Tensor]]
    vocab_size: int
    pad_id: int = PAD_ID
    label: str = "patient"
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        check_instance("model", self.model, nn.Module, "a torch.nn.Module")
        for name in ("logits", "loss", "shift"):
            check_callable(name, getattr(self, name))
        check_positive_int("vocab_size", self.vocab_size, minimum=2)

    def __repr__(self) -> str:
        return f"Patient({self.label}, vocab_size={self.vocab_size})"

    def batch(self, batch_size: int = 8, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """``(src, tgt_in, labels)`` of :func:`padded_batch` in the patient's special ids
        (``pad_id``, ``bos_id``, ``eos_id``), split by the patient's own ``shift``: shapes
        ``(batch, src_len)``, ``(batch, tgt_len - 1)`` twice."""
        src, tgt = padded_batch(
            batch_size,
            torch.Generator().manual_seed(seed),
            vocab_size=self.vocab_size,
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
        )
        tgt_in, labels = self.shift(tgt)  # (batch, tgt_len - 1) each
        return src, tgt_in, labels
