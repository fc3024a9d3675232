"""Ward 1 of chapter 11's bug clinic: bugs 1-10, planted in the model, and the common bugs of
a reader's own model (the conditions of :data:`companion.clinic.registry.CONDITIONS`).

Each bug overrides one method of the correct class of :mod:`companion.clinic.patient` (bug 9
is a decoding function, the twin of :func:`~companion.clinic.patient.greedy_decode`), so that
``inspect.getsource`` shows the bug beside the fix. The second half plants the common bugs in
:class:`~companion.clinic.patient.ReaderTransformer` or in the code around it (the loss, the
label shift, the evaluation call); the diagnostics of :mod:`companion.clinic.toolkit` find
each without knowing the model's parameter names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.clinic.patient import (
    BOS_ID,
    Decoder,
    DecoderLayer,
    MultiHeadAttention,
    PositionalEncoding,
    ReaderAttention,
    ReaderTransformer,
    Transformer,
)

__all__ = [
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
    "SeqFirstPositions",
    "SoftmaxOverQueries",
    "loss_over_padding",
    "unshifted_labels",
    "QueryAxisPaddingMask",
    "ForgottenPaddingMask",
    "logits_without_eval",
    "logits_in_eval",
    "LayersInAList",
    "UnscaledTiedOutput",
]


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
    """Bug 3: the shared head projection: one small ``Linear(head_dim, head_dim)`` per
    projection, shared by all heads and applied after the split, instead of a full
    ``d_model × d_model`` projection."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, num_heads, dropout)
        self.query_proj = nn.Linear(self.head_dim, self.head_dim)  # BUG: head_dim × head_dim
        self.key_proj = nn.Linear(self.head_dim, self.head_dim)
        self.value_proj = nn.Linear(self.head_dim, self.head_dim)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Split first, then the same small projection in every head: no mixing across heads."""
        q = self.query_proj(self.split_heads(query))  # (batch, heads, q_len, head_dim)
        k = self.key_proj(self.split_heads(key))  # (batch, heads, k_len, head_dim)
        v = self.value_proj(self.split_heads(value))  # (batch, heads, k_len, head_dim)
        return q, k, v


class ViewWithoutTranspose(MultiHeadAttention):
    """Bug 4: the heads are split with a ``view`` straight to ``(batch, heads, len, head_dim)``."""

    def split_heads(self, x: Tensor) -> Tensor:
        """Right shape, wrong contents: memory order puts pieces of several tokens in a head."""
        batch, seq_len, _ = x.shape
        return x.view(batch, self.num_heads, seq_len, self.head_dim)  # BUG: no transpose


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
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (batch, heads, q_len, k_len)
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
        weights = torch.softmax(scores, dim=-1) / math.sqrt(self.head_dim)  # BUG: after softmax
        return self.dropout(weights) @ v, weights


class ScaleByDk(MultiHeadAttention):
    """Bug 7b: the scores divided by ``d_k`` instead of ``√d_k``."""

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Weights too flat: a softmax at temperature ``√d_k``."""
        scores = q @ k.transpose(-2, -1) / self.head_dim  # BUG: should be math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (batch, heads, q_len, k_len)
        return self.dropout(weights) @ v, weights


class DoubledExponentPositions(PositionalEncoding):
    """Bug 8: the loop index ``two_m`` already steps by 2, yet the exponent doubles it again; and
    the cosine takes the frequency of the next index."""

    @staticmethod
    def build_table(max_len: int, d_model: int) -> Tensor:
        """The table built by a double loop over positions and features."""
        table = torch.zeros(max_len, d_model)  # (max_len, d_model)
        for pos in range(max_len):
            for two_m in range(0, d_model, 2):  # 2m = 0, 2, 4, ...: pair m's even index
                sin_base = 10000 ** (2 * two_m / d_model)  # BUG: 2·2m, the exponent doubled
                cos_base = 10000 ** (2 * (two_m + 1) / d_model)  # BUG: 2m + 1, the next pair's
                table[pos, two_m] = math.sin(pos / sin_base)
                table[pos, two_m + 1] = math.cos(pos / cos_base)
        return table


class SlicedPositions(DoubledExponentPositions):
    """Bug 8's popular "fix": slicing the table with ``x.size(1)`` and an explicit last axis.
    It selects the same rows as before, so the bug stays."""

    def forward(self, x: Tensor) -> Tensor:
        """The same slice, spelled differently."""
        return x + self.table[:, : x.size(1), :]  # (batch, seq_len, d_model): changes nothing


def last_token_greedy_decode(model: Transformer, src: Tensor, max_len: int) -> Tensor:
    """Bug 9: the last-token loop: a tempting inference loop. It feeds back only the last
    token, reads the prediction with ``.item()`` (a batch of one only) and loops for the
    *source* length, ignoring ``max_len``."""
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # DecoderLayer's arguments
        super().__init__(*args, **kwargs)
        self.cross_attention = self.self_attention  # BUG: the same weights for both


# --------------------------------------------------------------------------------------------
# The common bugs of a reader's model (ReaderTransformer) and of the code around it
# --------------------------------------------------------------------------------------------


class SeqFirstPositions(ReaderTransformer):
    """batch_first confusion: the position table sliced with ``x.size(0)``, as in code written
    for ``(len, batch, d_model)`` tensors (the old PyTorch tutorial), applied to a
    ``(batch, len, d_model)`` tensor."""

    def add_positions(self, x: Tensor) -> Tensor:
        """Sentence ``b`` gets the vector of position ``b`` on every token."""
        return x + self.pe[: x.size(0), None, :]  # BUG: size(0) is the batch, not the sequence


class SoftmaxOverQueries(ReaderAttention):
    """The softmax taken over the wrong axis: over the queries (``dim=-2``), not the keys."""

    def normalise(self, scores: Tensor) -> Tensor:
        """Columns sum to 1, rows do not; a query's weights depend on the later queries."""
        return torch.softmax(scores, dim=-2)  # BUG: should be dim=-1, the keys


def loss_over_padding(logits: Tensor, targets: Tensor) -> Tensor:
    """Padding tokens counted in the loss: ``logits (batch, len, vocab)``, ``targets (batch,
    len)`` → the mean over *every* position, pads included (the fix:
    :func:`~companion.clinic.patient.sequence_loss`, ``ignore_index=PAD_ID``)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # BUG: no ignore_index


def unshifted_labels(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Labels not shifted: ``tgt (batch, tgt_len)`` → ``(tgt_in, labels)`` where the label of
    position ``t`` is the token the decoder reads at ``t`` (the fix:
    :func:`~companion.clinic.patient.teacher_forcing`)."""
    return tgt[:, :-1], tgt[:, :-1]  # BUG: labels should be tgt[:, 1:]


class QueryAxisPaddingMask(ReaderTransformer):
    """The encoder's padding mask on the query axis: ``(batch, 1, src_len, 1)`` instead of
    ``(batch, 1, 1, src_len)``. It blocks the pads' *rows*; every real token still attends to
    the pads."""

    def encoder_mask(self, src: Tensor) -> Tensor:
        """``unsqueeze(-1)`` where ``unsqueeze(-2)`` was meant."""
        return (src != self.pad_id)[:, None, :, None]  # BUG: (batch, 1, src_len, 1)


class ForgottenPaddingMask(ReaderTransformer):
    """No padding mask in the encoder: the pads' embeddings are taken for masked (as if
    ``padding_idx`` in ``nn.Embedding`` did it), so every token attends to the pads. Its
    findings are those of :class:`QueryAxisPaddingMask`, whose mask blocks only the pads' own
    rows: to tell the two apart, look at the mask the model builds."""

    def encoder_mask(self, src: Tensor) -> Tensor | None:  # type: ignore[override]
        """No mask where the source's key padding mask was meant."""
        return None  # BUG: should be self.padding_mask(src), (batch, 1, 1, src_len)


def logits_without_eval(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """Forgetting ``model.eval()``: an evaluation forward ``(src, tgt_in)`` → logits that leaves
    the model in training mode, so dropout is still on."""

    def logits(src: Tensor, tgt_in: Tensor) -> Tensor:
        with torch.no_grad():
            return model(src, tgt_in)  # BUG: no model.eval(), dropout stays on

    return logits


def logits_in_eval(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """The fix of :func:`logits_without_eval`: switch the model to evaluation mode first."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")

    def logits(src: Tensor, tgt_in: Tensor) -> Tensor:
        model.eval()  # dropout off
        with torch.no_grad():
            return model(src, tgt_in)  # (batch, tgt_len, vocab)

    return logits


class LayersInAList(ReaderTransformer):
    """Layers kept in a plain Python list: not registered, so not in ``parameters()`` (never
    trained), not in ``state_dict()`` (never saved), not moved by ``.to()``."""

    def make_stack(self, make_layer: Callable[[], nn.Module], num_layers: int) -> list:
        """A list where an ``nn.ModuleList`` was needed."""
        return [make_layer() for _ in range(num_layers)]  # BUG: a plain Python list


class UnscaledTiedOutput(ReaderTransformer):
    """The tied output without its ``1/√d_model`` (T5's convention; Vaswani et al. leave the
    output as it is and scale only the input). With this model's table, initialised at std
    ``1/√d_model`` for the rescaled output, the logits are ``√d_model`` times larger than
    intended and the loss before any training is far above ``ln(vocabulary size)``: the
    initial-loss check flags it, whether it is a slip or the other convention."""

    def output(self, y: Tensor) -> Tensor:
        """The tied product, not rescaled."""
        return y @ self.embed.weight.T  # BUG here: this model's init expects × d_model ** -0.5
