"""The registry of chapter 11's bug clinic: :data:`BUGS`, each bug with the symptom it produces,
the test that catches it and its fixed twin, and :func:`build`, a clinic model with one bug of
ward 1 planted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from companion.clinic.patient import (
    Decoder,
    DecoderLayer,
    MultiHeadAttention,
    Parts,
    PositionalEncoding,
    Transformer,
    greedy_decode,
)
from companion.clinic.ward1 import (
    CausalOffByOne,
    DoubledExponentPositions,
    ScaleAfterSoftmax,
    SharedAttentionLayer,
    SharedHeadProjection,
    SoftmaxGenerator,
    SwappedDecoderCall,
    ValueResidual,
    ViewWithoutTranspose,
    last_token_greedy_decode,
)
from companion.clinic.ward2 import (
    DetachedPositions,
    DropoutAfterNorm,
    DropoutBeforeAdd,
    InlineNormBlock,
    LearnedPositions,
    MaskedPaddingEncoder,
    OneBasedEmbedding,
    PaddingIdxEncoder,
    RegisteredNormBlock,
    ZeroBasedEmbedding,
    causal_attention,
    discarded_mask_attention,
    interleaved_stacks,
    no_softmax_attention,
    stacked,
)

__all__ = ["Bug", "BUGS", "build"]


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
