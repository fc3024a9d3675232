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

* **ward 1** (bugs 1-10): bugs planted in the model, found with the tests of the toolkit:
  :func:`parity` (after copying weights), :func:`causal_leak`,
  :func:`is_permutation_equivariant`, ``count_parameters``, :func:`overfit_one_batch`;
* **ward 2** (bugs 11-18): short, self-contained cases (attention functions, a layer, an
  embedding) with their own one-line tests.

The toy task is :func:`toy_batch`: reverse 12 symbols, vocabulary 11 (the four special tokens
of :mod:`companion.data.vocab` and 7 symbols).

Every public name is importable from here (``from companion import clinic``; ``clinic.build``);
the files, in reading order:

- :mod:`companion.clinic.patient`: the model, blog style (correct), and the toy task's ids.
- :mod:`companion.clinic.toolkit`: the toy task and the tests that examine the model.
- :mod:`companion.clinic.ward1`: bugs 1-10, each overriding one method of the correct class.
- :mod:`companion.clinic.ward2`: bugs 11-18, a few lines of buggy code beside the fix.
- :mod:`companion.clinic.registry`: :data:`BUGS` and :func:`build`.
"""

from __future__ import annotations

from companion.clinic.patient import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SEQ_LEN,
    UNK_ID,
    VOCAB_SIZE,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    Parts,
    PositionalEncoding,
    Transformer,
    greedy_decode,
    sequence_loss,
)
from companion.clinic.patient import TokenEmbedding as TokenEmbedding  # public, not in __all__
from companion.clinic.registry import BUGS, Bug, build
from companion.clinic.toolkit import (
    causal_leak,
    greedy_accuracy,
    is_permutation_equivariant,
    overfit_one_batch,
    parity,
    reference_model,
    toy_batch,
    train_toy,
)
from companion.clinic.ward1 import (
    CausalOffByOne,
    DoubledExponentPositions,
    InvertedCausalMask,
    ScaleAfterSoftmax,
    ScaleByDk,
    SharedAttentionLayer,
    SharedHeadProjection,
    SlicedPositions,
    SoftmaxGenerator,
    SwappedDecoderCall,
    TruthinessMask,
    ValueResidual,
    ViewWithoutTranspose,
    last_token_greedy_decode,
)
from companion.clinic.ward2 import (
    CrossInputsSwapped,
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
    cross_padding_mask,
    discarded_mask_attention,
    interleaved_stacks,
    no_softmax_attention,
    past_blocking_attention,
    stacked,
)

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
