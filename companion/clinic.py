"""The bug clinic of chapter 11: a compact from-scratch Transformer, its classic bugs, and the
tests that find them.

The model here is written the way blog posts write a Transformer from scratch: short classes
(:class:`PositionalEncoding`, :class:`MultiHeadAttention`, :class:`FeedForward`,
:class:`EncoderLayer`, :class:`DecoderLayer`, :class:`Encoder`, :class:`Decoder`,
:class:`Transformer`), Post-LN as in the paper, sinusoidal positions, no input checks inside
``forward`` (a bug must show its true symptom, not a friendly error). The correct version
computes exactly what :class:`companion.model.Transformer` computes: its parameters carry the
same names, so :func:`reference_model` copies them into the package's model and
:func:`parity` compares the two outputs.

Each bug of the chapter is a small subclass that overrides one method (or a function next to
its fixed twin), so that ``inspect.getsource`` shows the bug beside the fix. :data:`BUGS` lists
them with the symptom each produces and the test that catches it:

* **ward 1** (bugs 1-10): bugs planted in the model, found with the tests at the end of this
  module: :func:`parity` (after copying weights), :func:`causal_leak`,
  :func:`is_permutation_equivariant`, ``count_parameters``, :func:`overfit_one_batch`;
* **ward 2** (bugs 11-18): short, self-contained cases (attention functions, a layer, an
  embedding) with their own one-line tests.

The toy task is :func:`toy_batch`: reverse 12 symbols, vocabulary 11 (the four special tokens
of :mod:`companion.data.vocab` and 7 symbols).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_instance, check_positive_int
from companion.model import Transformer as ReferenceTransformer
from companion.model import TransformerConfig

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
    "greedy_decode",
    "sequence_loss",
    "toy_batch",
    "train_toy",
    "greedy_accuracy",
    "reference_model",
    "parity",
    "causal_leak",
    "is_permutation_equivariant",
    "overfit_one_batch",
    # ward 1: the bugs planted in the model
    "SwappedDecoderCall",
    "ValueResidual",
    "SharedHeadProjection",
    "ViewWithoutTranspose",
    "SoftmaxGenerator",
    "TruthinessMask",
    "InvertedCausalMask",
    "CausalOffByOne",
    "ScaleAfterSoftmax",
    "ScaleByDk",
    "DoubledExponentPositions",
    "SlicedPositions",
    "last_token_greedy_decode",
    "SharedAttentionLayer",
    # ward 2: self-contained cases
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
    "Bug",
    "BUGS",
    "build",
]

#: The toy task's ids follow :mod:`companion.data.vocab`: four special tokens, then 7 symbols.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
VOCAB_SIZE = 11
#: Symbols per toy sequence; a source is the symbols and ``<eos>``: 13 tokens.
SEQ_LEN = 12


# ============================================================================================
# The model, blog style (correct)
# ============================================================================================


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table of the paper: ``PE[p, 2i] = sin(p / 10000^(2i/d))``,
    ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``.

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
        two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,): 0, 2, 4, ...
        angle = position / 10000 ** (two_i / d_model)  # (max_len, d_model/2)
        table = torch.zeros(max_len, d_model, dtype=torch.float64)  # (max_len, d_model)
        table[:, 0::2] = torch.sin(angle)  # even dimensions 2i
        table[:, 1::2] = torch.cos(angle)  # odd dimensions 2i + 1, the same frequency
        return table.float()  # (max_len, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``x (batch, seq_len, d_model)`` → the same shape, positions added."""
        seq_len = x.size(1)
        return x + self.table[:, :seq_len]  # (batch, seq_len, d_model)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project, split into heads, attend, merge, project.

    Args:
        d_model: size of the vectors; ``d_head = d_model / num_heads``.
        num_heads: number of heads.
        dropout: dropout on the attention weights.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads, self.d_head = num_heads, d_model // num_heads
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
        q, k, v = self.project(query, key, value)  # (batch, heads, len, d_head) each
        out, _ = self.attend(q, k, v, mask)  # (batch, heads, q_len, d_head)
        return self.out_proj(self.merge_heads(out))  # (batch, q_len, d_model)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The three ``d_model × d_model`` projections, then the split into heads."""
        q = self.split_heads(self.query_proj(query))  # (batch, heads, q_len, d_head)
        k = self.split_heads(self.key_proj(key))  # (batch, heads, k_len, d_head)
        v = self.split_heads(self.value_proj(value))  # (batch, heads, k_len, d_head)
        return q, k, v

    def split_heads(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → ``(batch, heads, seq, d_head)``: head ``h`` gets
        features ``h·d_head … (h+1)·d_head − 1`` of every token."""
        batch, seq, _ = x.shape
        x = x.view(batch, seq, self.num_heads, self.d_head)  # (batch, seq, heads, d_head)
        return x.transpose(1, 2)  # (batch, heads, seq, d_head)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(batch, heads, seq, d_head)`` → ``(batch, seq, d_model)``."""
        batch, _, seq, _ = x.shape
        x = x.transpose(1, 2)  # (batch, seq, heads, d_head)
        return x.reshape(batch, seq, self.num_heads * self.d_head)  # (batch, seq, d_model)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Scaled dot-product attention in every head: ``(output, weights)``, shapes
        ``(batch, heads, q_len, d_head)`` and ``(batch, heads, q_len, k_len)``."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (batch, heads, q_len, k_len)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # blocked keys get no weight
        weights = torch.softmax(scores, dim=-1)  # (batch, heads, q_len, k_len), rows sum to 1
        return self.dropout(weights) @ v, weights  # (batch, heads, q_len, d_head)


class FeedForward(nn.Module):
    """``Linear(d_model, d_ff)`` → ReLU → dropout → ``Linear(d_ff, d_model)``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.hidden_proj = nn.Linear(d_model, d_ff)
        self.output_proj = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → the same shape."""
        return self.output_proj(self.dropout(F.relu(self.hidden_proj(x))))  # (batch, seq, d_model)


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


# ============================================================================================
# The toy task and the toolkit
# ============================================================================================


def toy_batch(
    batch_size: int, generator: torch.Generator, seq_len: int = SEQ_LEN
) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of the reverse task: ``(src, tgt_in, tgt_out)``, each ``(batch, seq_len + 1)``.

    ``src`` is ``seq_len`` random symbols (ids 4-10) and ``<eos>``; ``tgt_out`` the symbols
    reversed and ``<eos>``; ``tgt_in`` is ``tgt_out`` shifted right behind ``<bos>`` (teacher
    forcing). Source and target have the same length, as in many toy tasks: the case where a
    bug that mixes them up still runs.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    shape = (batch_size, seq_len)
    symbols = torch.randint(4, VOCAB_SIZE, shape, generator=generator)  # (batch, seq_len)
    eos = torch.full((batch_size, 1), EOS_ID)  # (batch, 1)
    bos = torch.full((batch_size, 1), BOS_ID)  # (batch, 1)
    src = torch.cat([symbols, eos], dim=1)  # (batch, seq_len + 1)
    tgt_out = torch.cat([symbols.flip(1), eos], dim=1)  # (batch, seq_len + 1)
    tgt_in = torch.cat([bos, symbols.flip(1)], dim=1)  # (batch, seq_len + 1)
    return src, tgt_in, tgt_out


def train_toy(
    model: nn.Module, steps: int, *, batch_size: int = 64, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Train ``model`` on fresh :func:`toy_batch` batches with Adam; the loss of every step."""
    check_positive_int("steps", steps)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        src, tgt_in, tgt_out = toy_batch(batch_size, generator)
        loss = sequence_loss(model(src, tgt_in), tgt_out)  # a scalar
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def greedy_accuracy(
    model: nn.Module,
    decode: Callable[..., Tensor] = greedy_decode,
    *,
    batch_size: int = 200,
    seed: int = 1,
    one_by_one: bool = False,
) -> float:
    """Share of target tokens (``<eos>`` included) that ``decode(model, src, max_len)`` gets
    right on a fresh toy batch; ``one_by_one`` calls it on one sentence at a time."""
    src, _, tgt_out = toy_batch(batch_size, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if one_by_one:
            rows = [decode(model, src[b : b + 1], tgt_out.shape[1]) for b in range(batch_size)]
            out = torch.cat(rows)  # (batch, len)
        else:
            out = decode(model, src, tgt_out.shape[1])  # (batch, len)
    return (out == tgt_out).float().mean().item()


def reference_model(model: Transformer) -> ReferenceTransformer:
    """A :class:`companion.model.Transformer` of the same sizes with ``model``'s weights.

    The parameters of the clinic model carry the package's names, so this is one
    ``load_state_dict`` (``strict``: a missing, extra or differently shaped weight raises).
    """
    sizes = model.sizes
    config = TransformerConfig(
        src_vocab=sizes["vocab_size"], tgt_vocab=sizes["vocab_size"], d_model=sizes["d_model"],
        num_heads=sizes["num_heads"], num_layers=sizes["num_layers"], d_ff=sizes["d_ff"],
        dropout=0.0, max_len=sizes["max_len"], src_pad_id=sizes["pad_id"],
        tgt_pad_id=sizes["pad_id"], norm_first=False,
    )  # fmt: skip
    reference = ReferenceTransformer(config)
    reference.load_state_dict(model.state_dict())
    return reference.eval()


def parity(model: Transformer, src: Tensor, tgt: Tensor) -> float:
    """Largest difference between ``model(src, tgt)`` and the package's model with the same
    weights (:func:`reference_model`); about ``1e-6`` for a correct model."""
    reference = reference_model(model)
    model.eval()
    with torch.no_grad():
        return (model(src, tgt) - reference(src, tgt)).abs().max().item()


def causal_leak(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    """``(tgt_len, tgt_len)`` boolean: ``[i, j]`` is ``True`` when changing decoder input token
    ``j`` changes the logits at position ``i``. A decoder that does not leak gives the lower
    triangle (``j <= i``) at most; anything above the diagonal is a leak from the future.

    Args:
        model: maps ``(src (1, src_len), tgt (1, tgt_len))`` to ``(1, tgt_len, vocab)``.
        src, tgt: one example, shapes ``(1, src_len)`` and ``(1, tgt_len)``.
    """
    model.eval()
    with torch.no_grad():
        base = model(src, tgt)  # (1, tgt_len, vocab)
        seen = torch.zeros(tgt.shape[1], tgt.shape[1], dtype=torch.bool)  # (tgt_len, tgt_len)
        for j in range(tgt.shape[1]):
            changed = tgt.clone()
            changed[0, j] = 4 + (changed[0, j] - 3) % (VOCAB_SIZE - 4)  # another symbol
            seen[:, j] = (model(src, changed) - base).abs().amax(dim=-1)[0] > 1e-5  # (tgt_len,)
    return seen


def is_permutation_equivariant(fn: Callable[[Tensor], Tensor], x: Tensor, seed: int = 0) -> bool:
    """Whether permuting the tokens of ``x (batch, seq, d)`` permutes ``fn(x)`` the same way, as
    self-attention without positions must."""
    order = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(seed))  # (seq,)
    with torch.no_grad():
        return torch.allclose(fn(x[:, order]), fn(x)[:, order], atol=1e-5)


def overfit_one_batch(
    model: nn.Module, steps: int = 100, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Train on one fixed batch of 16 toy examples: a correct model drives the loss towards 0."""
    src, tgt_in, tgt_out = toy_batch(16, torch.Generator().manual_seed(seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        loss = sequence_loss(model(src, tgt_in), tgt_out)  # a scalar
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


# ============================================================================================
# Ward 1: the bugs planted in the model (each overrides one method of the correct class)
# ============================================================================================


class SwappedDecoderCall(Decoder):
    """Bug 1: the layers are called with ``x`` and ``memory`` swapped, so the decoder's
    self-attention runs on the encoder output."""

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        """As :meth:`Decoder.forward`, arguments in the wrong order."""
        for layer in self.layers:
            x = layer(memory, x, src_mask, tgt_mask)  # BUG: should be layer(x, memory, ...)
        return x


class ValueResidual(DecoderLayer):
    """Bug 2: the cross-attention's residual adds its *value* input (the encoder output)."""

    def cross_attention_block(self, x: Tensor, memory: Tensor, src_mask: Tensor | None) -> Tensor:
        """As :meth:`DecoderLayer.cross_attention_block`, adding the wrong input."""
        attended = self.cross_attention(x, memory, memory, src_mask)  # (batch, tgt_len, d_model)
        return self.cross_attention_norm(memory + self.dropout(attended))  # BUG: memory, not x


class SharedHeadProjection(MultiHeadAttention):
    """Bug 3: one small ``Linear(d_head, d_head)`` per projection, shared by all heads and
    applied after the split, instead of a full ``d_model × d_model`` projection."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, num_heads, dropout)
        self.query_proj = nn.Linear(self.d_head, self.d_head)  # BUG: d_head × d_head
        self.key_proj = nn.Linear(self.d_head, self.d_head)
        self.value_proj = nn.Linear(self.d_head, self.d_head)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Split first, then the same small projection in every head: no mixing across heads."""
        q = self.query_proj(self.split_heads(query))  # (batch, heads, q_len, d_head)
        k = self.key_proj(self.split_heads(key))  # (batch, heads, k_len, d_head)
        v = self.value_proj(self.split_heads(value))  # (batch, heads, k_len, d_head)
        return q, k, v


class ViewWithoutTranspose(MultiHeadAttention):
    """Bug 4: the heads are split with a ``view`` straight to ``(batch, heads, seq, d_head)``."""

    def split_heads(self, x: Tensor) -> Tensor:
        """Right shape, wrong contents: memory order puts pieces of several tokens in a head."""
        batch, seq, _ = x.shape
        return x.view(batch, self.num_heads, seq, self.d_head)  # BUG: no transpose


class SoftmaxGenerator(Transformer):
    """Bug 5: the generator applies softmax, and ``F.cross_entropy`` applies it again."""

    def generate(self, y: Tensor) -> Tensor:
        """Probabilities instead of logits."""
        return torch.softmax(self.generator(y), dim=-1)  # BUG: the loss expects logits


class TruthinessMask(MultiHeadAttention):
    """Bug 6a: the mask is tested with Python truthiness (``if mask:``)."""

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """As :meth:`MultiHeadAttention.attend` with ``if mask:``."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (batch, heads, q_len, k_len)
        if mask:  # BUG: should be `if mask is not None:`
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (batch, heads, q_len, k_len)
        return self.dropout(weights) @ v, weights


class InvertedCausalMask(Transformer):
    """Bug 6b: the causal mask built with ``== 0`` for code whose convention is ``True`` = may
    attend: every query sees only the strictly later keys."""

    def causal_mask(self, size: int) -> Tensor:
        """The blocked positions, passed where the allowed ones are expected."""
        return torch.tril(torch.ones(size, size)) == 0  # BUG: True above the diagonal


class CausalOffByOne(Transformer):
    """Bug 6c: the causal mask shifted by one diagonal: each query also sees the next token."""

    def causal_mask(self, size: int) -> Tensor:
        """One diagonal too many."""
        return torch.tril(torch.ones(size, size, dtype=torch.bool), diagonal=1)  # BUG: diagonal=0


class ScaleAfterSoftmax(MultiHeadAttention):
    """Bug 7a: the ``√d_k`` scale applied to the weights, after the softmax."""

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Rows of weights sum to ``1/√d_k``."""
        scores = q @ k.transpose(-2, -1)  # (batch, heads, q_len, k_len)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1) / math.sqrt(self.d_head)  # BUG: after softmax
        return self.dropout(weights) @ v, weights


class ScaleByDk(MultiHeadAttention):
    """Bug 7b: the scores divided by ``d_k`` instead of ``√d_k``."""

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Weights too flat: a softmax at temperature ``√d_k``."""
        scores = q @ k.transpose(-2, -1) / self.d_head  # BUG: should be math.sqrt(self.d_head)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (batch, heads, q_len, k_len)
        return self.dropout(weights) @ v, weights


class DoubledExponentPositions(PositionalEncoding):
    """Bug 8: the loop index ``i`` already steps by 2, yet the exponent doubles it again; and
    the cosine takes the frequency of the next index."""

    @staticmethod
    def build_table(max_len: int, d_model: int) -> Tensor:
        """The table of the blog posts' double loop."""
        table = torch.zeros(max_len, d_model)  # (max_len, d_model)
        for pos in range(max_len):
            for i in range(0, d_model, 2):  # i = 0, 2, 4, ...: i is already "2i"
                table[pos, i] = math.sin(pos / 10000 ** (2 * i / d_model))  # BUG: 2·i
                table[pos, i + 1] = math.cos(pos / 10000 ** (2 * (i + 1) / d_model))  # BUG: i + 1
        return table


class SlicedPositions(DoubledExponentPositions):
    """Bug 8's popular "fix": slicing the table with ``x.size(1)`` and an explicit last axis.
    It selects the same rows as before, so the bug stays."""

    def forward(self, x: Tensor) -> Tensor:
        """The same slice, spelled differently."""
        return x + self.table[:, : x.size(1), :]  # (batch, seq_len, d_model): changes nothing


def last_token_greedy_decode(model: Transformer, src: Tensor, max_len: int) -> Tensor:
    """Bug 9: the inference loop of the blog posts. It feeds back only the last token, reads the
    prediction with ``.item()`` (a batch of one only) and loops for the *source* length,
    ignoring ``max_len``."""
    memory = model.encode(src, model.make_src_mask(src))  # (1, src_len, d_model)
    token = torch.tensor([[BOS_ID]])  # (1, 1)
    out = []
    for _ in range(src.shape[1]):  # BUG: the source length, not max_len
        logits = model.decode(token, memory, model.make_src_mask(src))  # BUG: only the last token
        next_id = logits[:, -1].argmax(dim=-1).item()  # BUG: .item() works for batch 1 only
        out.append(next_id)
        token = torch.tensor([[next_id]])  # (1, 1): the history is lost
    return torch.tensor([out])  # (1, src_len)


class SharedAttentionLayer(DecoderLayer):
    """Bug 10: one attention module object serves self- and cross-attention."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        attention: type[MultiHeadAttention] = MultiHeadAttention,
    ) -> None:
        super().__init__(d_model, num_heads, d_ff, dropout, attention)
        self.cross_attention = self.self_attention  # BUG: the same weights for both


# ============================================================================================
# Ward 2: self-contained cases (a few lines of buggy code beside the fix)
# ============================================================================================


def discarded_mask_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Bug 11: causal attention whose ``masked_fill`` result is thrown away.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)``.
    """
    n = q.shape[-2]
    blocked = torch.tril(torch.ones(n, n)) == 1  # BUG 11b: True on the past and the diagonal
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores.masked_fill(blocked, float("-inf"))  # BUG 11a: not in place, the result is lost
    return torch.softmax(scores, dim=-1) @ v  # (batch, n, d)


def past_blocking_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Bug 11 half fixed: the result kept, the ``tril == 1`` mask still marks the past.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)`` (the last row is NaN: all blocked).
    """
    n = q.shape[-2]
    blocked = torch.tril(torch.ones(n, n)) == 1  # BUG 11b: blocks the past, not the future
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores = scores.masked_fill(blocked, float("-inf"))  # kept now
    return torch.softmax(scores, dim=-1) @ v  # (batch, n, d)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The fix of bugs 11 and 12: scaled, masked (future blocked), softmax over the keys.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)``.
    """
    n = q.shape[-2]
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))  # (n, n): True = may attend
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores = scores.masked_fill(~allowed, float("-inf"))  # keep the result
    return torch.softmax(scores, dim=-1) @ v  # (batch, n, d)


def no_softmax_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Bug 12: the scores used as weights, no softmax.

    ``q``, ``k``, ``v``: ``(batch, n, d)`` → ``(batch, n, d)``.
    """
    n = q.shape[-2]
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))  # (n, n)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, n, n)
    scores = scores.masked_fill(~allowed, 0.0)  # (batch, n, n)
    return scores @ v  # BUG: rows of "weights" that do not sum to 1


class InlineNormBlock(nn.Module):
    """Bug 13: a residual block whose LayerNorm is built inside ``forward`` (over the last two
    axes, ``(seq, d_model)``)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → the same shape."""
        y = x + self.linear(x)  # (batch, seq, d_model)
        return nn.LayerNorm(y.shape[1:])(y)  # BUG: new, unregistered γ/β; normalises seq too


class RegisteredNormBlock(nn.Module):
    """The fix of bug 13: the LayerNorm is a registered sub-module over ``d_model``."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → the same shape."""
        return self.norm(x + self.linear(x))  # (batch, seq, d_model)


class DetachedPositions(nn.Module):
    """Bug 14: learned positions added through ``.data``, which detaches them from autograd."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → the same shape."""
        return x + self.pos_embedding.data[:, : x.shape[1]]  # BUG: .data gets no gradient


class LearnedPositions(DetachedPositions):
    """The fix of bug 14: the parameter itself is added."""

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → the same shape."""
        return x + self.pos_embedding[:, : x.shape[1]]  # (batch, seq, d_model)


class PaddingIdxEncoder(nn.Module):
    """Bug 15: ``padding_idx`` taken for a padding mask. It only zeroes the pads' embedding
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
    """The fix of bug 15: a key padding mask built from the ids."""

    def forward(self, tokens: Tensor) -> Tensor:
        """``(batch, len)`` ids → ``(batch, len, d_model)``."""
        x = self.embedding(tokens)  # (batch, len, d_model)
        mask = (tokens != self.pad_id)[:, None, None, :]  # (batch, 1, 1, len)
        return self.attention(x, x, x, mask)  # (batch, len, d_model)


def interleaved_stacks(model: Transformer, src: Tensor, tgt: Tensor) -> Tensor:
    """Bug 16a: encoder and decoder layers run as ``(encoder layer, decoder layer)`` pairs, so
    decoder layer ``l`` reads encoder layer ``l``. ``src (batch, src_len)``, ``tgt (batch,
    tgt_len)`` → logits ``(batch, tgt_len, vocab)``."""
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
        """``(batch, seq, d_model)`` → the same shape."""
        return self.dropout(self.norm(x + self.sublayer(x)))  # BUG: drops the residual stream


class DropoutBeforeAdd(DropoutAfterNorm):
    """The fix of bug 17: dropout on the sub-layer's output, before the residual addition."""

    def forward(self, x: Tensor) -> Tensor:
        """``(batch, seq, d_model)`` → the same shape."""
        return self.norm(x + self.dropout(self.sublayer(x)))  # (batch, seq, d_model)


class OneBasedEmbedding(nn.Module):
    """Bug 18: words numbered ``1 … V`` looked up in ``nn.Embedding(V, d)``."""

    def __init__(self, num_words: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_words, d_model)  # BUG: rows 0 … V-1 for ids 1 … V

    def forward(self, word_ids: Tensor) -> Tensor:
        """``(batch, len)`` ids in ``1 … V`` → ``(batch, len, d_model)``."""
        return self.embedding(word_ids)  # IndexError on id V; row 0 is never used


class ZeroBasedEmbedding(OneBasedEmbedding):
    """The fix of bug 18: shift the ids to ``0 … V-1`` (or number them from 0)."""

    def forward(self, word_ids: Tensor) -> Tensor:
        """``(batch, len)`` ids in ``1 … V`` → ``(batch, len, d_model)``."""
        return self.embedding(word_ids - 1)  # (batch, len, d_model)


# ============================================================================================
# The registry
# ============================================================================================


@dataclass(frozen=True)
class Bug:
    """One bug class of the clinic.

    Attributes:
        number: 1-18 (ward 1: 1-10, ward 2: 11-18).
        title: what is wrong, in a few words.
        symptom: what a learner sees.
        caught_by: the test that pinpoints it.
        buggy: the class or function holding the bug.
        fixed: its correct twin.
    """

    number: int
    title: str
    symptom: str
    caught_by: str
    buggy: object
    fixed: object

    @property
    def ward(self) -> int:
        """1 for the bugs planted in the model, 2 for the self-contained cases."""
        return 1 if self.number <= 10 else 2


BUGS: dict[str, Bug] = {
    bug.title: bug
    for bug in [
        Bug(1, "decoder self-attention on the encoder output", "future target tokens change earlier outputs",
            "causal leak test", SwappedDecoderCall, Decoder),
        Bug(2, "residual adds the value input", "outputs differ from the reference; a shape error when lengths differ",
            "parity after copying weights", ValueResidual, DecoderLayer),
        Bug(3, "one d_head × d_head projection shared by the heads", "fewer parameters; weights do not load",
            "parameter count", SharedHeadProjection, MultiHeadAttention),
        Bug(4, "heads split by view without transpose", "tokens mixed across positions",
            "permutation equivariance", ViewWithoutTranspose, MultiHeadAttention),
        Bug(5, "softmax in the generator and in the loss", "the loss stalls",
            "overfitting one batch", SoftmaxGenerator, Transformer),
        Bug(6, "mask by truthiness, inverted, or off by one", "an error, NaN, or a leak",
            "causal leak test", CausalOffByOne, Transformer),
        Bug(7, "scale after the softmax, or by d_k", "weights that do not sum to 1, or too flat",
            "parity after copying weights", ScaleAfterSoftmax, MultiHeadAttention),
        Bug(8, "positional exponent doubled, cosine of the next index", "a table unlike the paper's",
            "parity after copying weights", DoubledExponentPositions, PositionalEncoding),
        Bug(9, "inference feeds back the last token only", "low greedy accuracy; batch 1 only",
            "greedy accuracy and batched decoding", last_token_greedy_decode, greedy_decode),
        Bug(10, "one attention module for self- and cross-attention", "fewer parameters",
            "parameter count", SharedAttentionLayer, DecoderLayer),
        Bug(11, "masked_fill result discarded; tril == 1 mask", "future keys get weight",
            "causal leak test", discarded_mask_attention, causal_attention),
        Bug(12, "no softmax", "weights that do not sum to 1",
            "constant-value test", no_softmax_attention, causal_attention),
        Bug(13, "LayerNorm built inside forward", "γ, β missing from parameters and state_dict",
            "state_dict and parameter count", InlineNormBlock, RegisteredNormBlock),
        Bug(14, ".data detaches the learned positions", "zero gradient, frozen table",
            "gradient check", DetachedPositions, LearnedPositions),
        Bug(15, "padding_idx taken for a padding mask", "outputs change with the amount of padding",
            "batch invariance", PaddingIdxEncoder, MaskedPaddingEncoder),
        Bug(16, "decoder layer l reads encoder layer l", "outputs differ from the reference",
            "parity after copying weights", interleaved_stacks, stacked),
        Bug(17, "dropout after the LayerNorm", "the residual stream itself is dropped",
            "train/eval comparison with a zero sub-layer", DropoutAfterNorm, DropoutBeforeAdd),
        Bug(18, "ids 1 … V in nn.Embedding(V, d)", "IndexError on the last word; row 0 unused",
            "embedding the last id", OneBasedEmbedding, ZeroBasedEmbedding),
    ]
}  # fmt: skip


def build(bug: int | None = None, seed: int = 0, **sizes: int | float) -> Transformer:
    """A clinic :class:`Transformer` with bug ``bug`` of ward 1 planted (``None``: correct),
    initialised from ``torch.manual_seed(seed)``; ``sizes`` go to :class:`Transformer`.

    Bugs 6 and 7 have variants: ``6`` is the off-by-one causal mask, ``7`` the scale after the
    softmax (build :class:`InvertedCausalMask`, :class:`TruthinessMask` and :class:`ScaleByDk`
    with :class:`Parts` or directly). Bug 9 is in the decoding loop, not the model.
    """
    kinds: dict[int | None, tuple[type[Transformer], Parts]] = {
        None: (Transformer, Parts()),
        1: (Transformer, Parts(decoder=SwappedDecoderCall)),
        2: (Transformer, Parts(decoder_layer=ValueResidual)),
        3: (Transformer, Parts(attention=SharedHeadProjection)),
        4: (Transformer, Parts(attention=ViewWithoutTranspose)),
        5: (SoftmaxGenerator, Parts()),
        6: (CausalOffByOne, Parts()),
        7: (Transformer, Parts(attention=ScaleAfterSoftmax)),
        8: (Transformer, Parts(positions=DoubledExponentPositions)),
        9: (Transformer, Parts()),
        10: (Transformer, Parts(decoder_layer=SharedAttentionLayer)),
    }
    if bug not in kinds:
        raise ValueError(f"bug must be None or a ward-1 bug number 1-10, got {bug!r}")
    cls, parts = kinds[bug]
    torch.manual_seed(seed)
    return cls(parts=parts, **sizes)  # type: ignore[arg-type]
