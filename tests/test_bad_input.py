"""Bad input gets a clear error: ``TypeError`` for a wrong type or dtype, ``ValueError`` for a
wrong shape or value, and the message names the argument, what was expected and what was given.

Each case is ``(id, function that must raise, exception type, regex the message must match)``.
"""

import pytest
import torch
from torch import nn

from companion.attention import MultiHeadAttention, fused_linear
from companion.interop import from_torch_attn_mask, load_from_torch, to_torch_key_padding_mask
from companion.layers import DecoderLayer, EncoderLayer, FeedForward
from companion.masking import causal_mask, combine_masks, from_additive_mask, padding_mask
from companion.model import TokenEmbedding, Transformer, TransformerConfig
from companion.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_frequencies,
    sinusoidal_table,
)

torch.manual_seed(0)
MHA = MultiHeadAttention(8, 2)
X = torch.randn(2, 3, 8)  # (batch, q_len, d_model)
MEMORY = torch.randn(2, 4, 8)  # (batch, k_len, d_model)
ENCODER_LAYER = EncoderLayer(8, 2, 16)
DECODER_LAYER = DecoderLayer(8, 2, 16)
MODEL = Transformer(TransformerConfig(10, 11, 8, 2, 1, 16, src_pad_id=0, tgt_pad_id=0))
SRC = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])  # (batch=2, src_len=4)
TGT = torch.tensor([[1, 2, 3], [4, 5, 6]])  # (batch=2, tgt_len=3)
ROPE = RotaryEmbedding(4)


def nan_at(tensor: torch.Tensor) -> torch.Tensor:
    bad = tensor.clone()
    bad.view(-1)[1] = float("nan")
    return bad


CASES = [
    # --- MultiHeadAttention: construction
    ("mha-d_model-not-divisible", lambda: MultiHeadAttention(10, 3), ValueError,
     r"d_model must be divisible by num_heads: got d_model=10 and num_heads=3"),
    ("mha-negative-d_model", lambda: MultiHeadAttention(-4, 2), ValueError,
     r"d_model must be >= 1, got -4"),
    ("mha-heads-float", lambda: MultiHeadAttention(8, 2.0), TypeError,
     r"num_heads must be an int, got float \(2.0\)"),
    ("mha-dropout-out-of-range", lambda: MultiHeadAttention(8, 2, dropout=1.5), ValueError,
     r"dropout must be in \[0, 1\), got 1.5"),
    # --- MultiHeadAttention: inputs
    ("mha-query-rank", lambda: MHA(X[0], X[0], X[0]), ValueError,
     r"query must have shape \(batch, q_len, 8\) \(3-D\), got a 2-D tensor of shape \(3, 8\)"),
    ("mha-query-d_model", lambda: MHA(X[..., :6], X, X), ValueError,
     r"query must have shape \(batch, q_len, 8\) \(size 8 in dimension 2\), got shape \(2, 3, 6\)"),
    ("mha-key-value-lengths", lambda: MHA(X, MEMORY, MEMORY[:, :3]), ValueError,
     r"key and value must have the same batch size and length .* got key \(2, 4, 8\) and value \(2, 3, 8\)"),
    ("mha-batch-mismatch", lambda: MHA(X, MEMORY[:1], MEMORY[:1]), ValueError,
     r"query and key must have the same batch size .* got query \(2, 3, 8\) and key \(1, 4, 8\)"),
    ("mha-integer-query", lambda: MHA(X.long(), X.long(), X.long()), TypeError,
     r"query must be a floating-point tensor \(e.g. torch.float32\), got dtype torch.int64"),
    ("mha-dtype-mismatch", lambda: MHA(X.double(), X.double(), X.double()), TypeError,
     r"query must have dtype torch.float32 to match the module's parameters, got dtype torch.float64"),
    ("mha-nan-query", lambda: MHA(nan_at(X), X, X), ValueError,
     r"query contains 1 NaN or infinite value\(s\); expected finite values"),
    ("mha-mask-float", lambda: MHA(X, X, X, torch.zeros(3, 3)), TypeError,
     r"mask must be a boolean tensor \(True = may attend\), got dtype torch.float32; .*from_additive_mask"),
    ("mha-mask-shape", lambda: MHA(X, MEMORY, MEMORY, torch.ones(2, 1, 1, 5, dtype=torch.bool)),
     ValueError,
     r"mask of shape \(2, 1, 1, 5\) does not broadcast to \(batch, heads, q_len, k_len\) \(2, 2, 3, 4\)"),
    ("mha-mask-too-many-dims", lambda: MHA(X, X, X, torch.ones(1, 2, 1, 3, 3, dtype=torch.bool)),
     ValueError, r"mask of shape \(1, 2, 1, 3, 3\) does not broadcast to .* \(2, 2, 3, 3\)"),
    ("mha-need_weights-type", lambda: MHA(X, X, X, need_weights="yes"), TypeError,
     r"need_weights must be a bool, got str \('yes'\)"),
    ("mha-causal-fewer-keys", lambda: MHA(X, MEMORY[:, :2], MEMORY[:, :2], is_causal=True),
     ValueError, r"k_len must be >= q_len .* got q_len=3 and k_len=2"),
    ("mha-load-mismatch", lambda: load_from_torch(MHA, nn.MultiheadAttention(8, 4)), ValueError,
     r"theirs .*must have embed_dim=8, num_heads=2, bias=True .* got embed_dim=8, num_heads=4"),
    # --- MultiHeadAttention: the head reshapes, fused_linear
    ("split-heads-rank", lambda: MHA.split_heads(X[0]), ValueError,
     r"x must have shape \(batch, len, 8\) \(3-D\), got a 2-D tensor of shape \(3, 8\)"),
    ("split-heads-d_model", lambda: MHA.split_heads(X[..., :6]), ValueError,
     r"x must have shape \(batch, len, 8\) \(size 8 in dimension 2\), got shape \(2, 3, 6\)"),
    ("split-heads-not-tensor", lambda: MHA.split_heads([[1.0]]), TypeError,
     r"x must be a torch.Tensor, got list"),
    ("merge-heads-heads", lambda: MHA.merge_heads(torch.zeros(2, 4, 3, 4)), ValueError,
     r"x must have shape \(batch, 2, len, 4\) \(size 2 in dimension 1\), got shape \(2, 4, 3, 4\)"),
    ("merge-heads-rank", lambda: MHA.merge_heads(X), ValueError,
     r"x must have shape \(batch, 2, len, 4\) \(4-D\), got a 3-D tensor of shape \(2, 3, 8\)"),
    ("fused-linear-empty", lambda: fused_linear(X, []), TypeError,
     r"projections must be a non-empty sequence of nn.Linear, got \[\]"),
    ("fused-linear-not-linear", lambda: fused_linear(X, [nn.Linear(8, 8), nn.ReLU()]), TypeError,
     r"projections\[1\] must be an nn.Linear, got ReLU"),
    ("fused-linear-in-features", lambda: fused_linear(X, [nn.Linear(8, 8), nn.Linear(6, 8)]),
     ValueError, r"projections must share one input size in_features, got \[8, 6\]"),
    ("fused-linear-bias", lambda: fused_linear(X, [nn.Linear(8, 8), nn.Linear(8, 8, bias=False)]),
     ValueError, r"projections must all have biases or all have none"),
    ("fused-linear-x-size", lambda: fused_linear(X[..., :6], [nn.Linear(8, 8)]), ValueError,
     r"x must have shape \(\.\.\., 8\) \(size 8 in dimension -1\), got shape \(2, 3, 6\)"),
    # --- masking
    ("causal-q_len-zero", lambda: causal_mask(0), ValueError, r"q_len must be >= 1, got 0"),
    ("padding-float-tokens", lambda: padding_mask(torch.zeros(2, 3), 0), TypeError,
     r"tokens must be an integer tensor \(e.g. torch.long\), got dtype torch.float32"),
    ("padding-tokens-rank", lambda: padding_mask(torch.zeros(3, dtype=torch.long), 0), ValueError,
     r"tokens must have shape \(batch, k_len\) \(2-D\), got a 1-D tensor of shape \(3,\)"),
    ("combine-incompatible", lambda: combine_masks(padding_mask(SRC, 0), causal_mask(3)),
     ValueError, r"masks must broadcast .* got shapes \(2, 1, 1, 4\), \(3, 3\)"),
    ("combine-not-bool", lambda: combine_masks(torch.ones(3, 3)), TypeError,
     r"masks\[0\] must be a boolean tensor, got dtype torch.float32"),
    ("additive-soft-bias", lambda: from_additive_mask(torch.tensor([0.0, -0.5])), ValueError,
     r"mask must contain only 0 \(may attend\) and -inf .* got -0.5"),
    ("additive-bool-input", lambda: from_additive_mask(torch.ones(2, dtype=torch.bool)),
     TypeError, r"mask must be a floating-point tensor .* got dtype torch.bool"),
    ("attn-mask-needs-heads", lambda: from_torch_attn_mask(torch.zeros(4, 3, 3, dtype=torch.bool)),
     ValueError, r"num_heads is required to convert a 3-D attn_mask of shape \(4, 3, 3\)"),
    ("key-padding-wrong-shape",
     lambda: to_torch_key_padding_mask(torch.ones(2, 1, 3, 4, dtype=torch.bool)), ValueError,
     r"mask must have shape \(batch, 1, 1, k_len\) to be a key padding mask, got shape \(2, 1, 3, 4\)"),
    # --- positional
    ("frequencies-odd-dim", lambda: sinusoidal_frequencies(7), ValueError,
     r"dim must be even \(dimensions come in sin/cos pairs\), got 7"),
    ("frequencies-dim-float", lambda: sinusoidal_frequencies(8.0), TypeError,
     r"dim must be an int, got float \(8.0\)"),
    ("frequencies-base-negative", lambda: sinusoidal_frequencies(8, base=-1.0), ValueError,
     r"base must be a positive finite number, got -1.0"),
    ("frequencies-base-tensor", lambda: sinusoidal_frequencies(8, base=torch.tensor(1e4)),
     TypeError, r"base must be a float, got Tensor"),
    ("table-odd-d_model", lambda: sinusoidal_table(10, 7), ValueError,
     r"d_model must be even \(dimensions come in sin/cos pairs\), got 7"),
    ("table-negative-max_len", lambda: sinusoidal_table(-1, 8), ValueError,
     r"max_len must be >= 1, got -1"),
    ("sinusoidal-wrong-d_model", lambda: SinusoidalPositionalEncoding(8)(torch.zeros(2, 3, 6)),
     ValueError, r"x must have shape \(\.\.\., seq_len, 8\) .* got shape \(2, 3, 6\)"),
    ("sinusoidal-negative-offset", lambda: SinusoidalPositionalEncoding(8)(X, offset=-1),
     ValueError, r"offset must be >= 0, got -1"),
    ("learned-too-long", lambda: LearnedPositionalEmbedding(2, 8)(X), ValueError,
     r"x has seq_len=3 at offset=0, so it needs positions up to 2, but .* max_len=2"),
    ("rope-odd-head_dim", lambda: RotaryEmbedding(5), ValueError,
     r"head_dim must be even .* got 5"),
    ("rope-length-mismatch", lambda: ROPE.apply(torch.zeros(1, 3, 4), torch.zeros(1, 5, 4)),
     ValueError, r"q and k must have the same seq_len .* got q \(1, 3, 4\) and k \(1, 5, 4\)"),
    ("rope-positions-length", lambda: ROPE.rotate(torch.zeros(3, 4), positions=torch.arange(4)),
     ValueError, r"positions must have one entry per position of x \(seq_len=3\), got shape \(4,\)"),
    ("rope-positions-float", lambda: ROPE.rotate(torch.zeros(3, 4), positions=torch.zeros(3)),
     TypeError, r"positions must be an integer tensor .* got dtype torch.float32"),
    # --- layers
    ("ff-activation", lambda: FeedForward(8, 16, activation="tanh"), ValueError,
     r"activation must be one of 'relu', 'gelu', got 'tanh'"),
    ("ff-d_ff-zero", lambda: FeedForward(8, 0), ValueError, r"d_ff must be >= 1, got 0"),
    ("encoder-layer-rank", lambda: ENCODER_LAYER(X[0]), ValueError,
     r"x must have shape \(batch, src_len, 8\) \(3-D\), got a 2-D tensor of shape \(3, 8\)"),
    ("encoder-layer-nan", lambda: ENCODER_LAYER(nan_at(X)), ValueError,
     r"x contains 1 NaN or infinite value\(s\)"),
    ("encoder-layer-norm_first-type", lambda: EncoderLayer(8, 2, 16, norm_first=1), TypeError,
     r"norm_first must be a bool, got int \(1\)"),
    ("decoder-layer-memory-batch", lambda: DECODER_LAYER(X, MEMORY[:1]), ValueError,
     r"memory must have the same batch size as x: .* must be \(2, src_len, 8\), got \(1, 4, 8\)"),
    ("decoder-layer-memory-mask",
     lambda: DECODER_LAYER(X, MEMORY, memory_mask=torch.ones(2, 1, 1, 3, dtype=torch.bool)),
     ValueError, r"memory_mask of shape \(2, 1, 1, 3\) does not broadcast to "
     r"\(batch, heads, tgt_len, src_len\) \(2, 2, 3, 4\)"),
    ("layer-load-mismatch",
     lambda: load_from_torch(ENCODER_LAYER, nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=True)),
     ValueError, r"layer does not match this layer \(norm_first: expected False, got True\)"),
    # --- model
    ("src-id-too-large", lambda: MODEL(SRC + 7, TGT), ValueError,
     r"src must hold ids in \[0, 9\] \(src_vocab=10\), got 12"),
    ("tgt-negative-id", lambda: MODEL(SRC, TGT - 2), ValueError,
     r"tgt must hold ids in \[0, 10\] \(tgt_vocab=11\), got -1 \(min -1, max 4\)"),
    ("src-float", lambda: MODEL(SRC.float(), TGT), TypeError,
     r"src must be an integer tensor \(e.g. torch.long\), got dtype torch.float32"),
    ("src-rank", lambda: MODEL(SRC[0], TGT), ValueError,
     r"src must have shape \(batch, src_len\) \(2-D\), got a 1-D tensor of shape \(4,\)"),
    ("src-tgt-batch", lambda: MODEL(SRC, TGT[:1]), ValueError,
     r"src and tgt must have the same batch size, got src \(2, 4\) and tgt \(1, 3\)"),
    ("src_mask-not-key-mask",
     lambda: MODEL(SRC, TGT, src_mask=torch.ones(2, 1, 4, 4, dtype=torch.bool)), ValueError,
     r"src_mask of shape \(2, 1, 4, 4\) does not broadcast to \(batch, heads, 1, src_len\) \(2, 2, 1, 4\)"),
    ("decode-memory-d_model", lambda: MODEL.decode(TGT, torch.zeros(2, 4, 6)), ValueError,
     r"memory must have shape \(batch, src_len, 8\) .* got shape \(2, 4, 6\)"),
    ("embedding-out-of-range", lambda: TokenEmbedding(5, 8)(torch.tensor([[0, 5]])), ValueError,
     r"tokens must hold ids in \[0, 4\] \(vocab_size=5\), got 5"),
    ("config-pad-id", lambda: TransformerConfig(10, 10, src_pad_id=10), ValueError,
     r"src_pad_id must be in \[0, 9\] \(src_vocab=10\), got 10"),
    ("config-heads", lambda: TransformerConfig(10, 10, d_model=10, num_heads=4), ValueError,
     r"d_model must be divisible by num_heads: got d_model=10 and num_heads=4"),
    ("config-positional", lambda: TransformerConfig(10, 10, positional="rotary"), ValueError,
     r"positional must be one of 'sinusoidal', 'learned', 'rope', 'alibi', 'none', got 'rotary'"),
    ("from-config-dict", lambda: Transformer({"src_vocab": 10}), TypeError,
     r"config must be a TransformerConfig, got dict"),
]  # fmt: skip


@pytest.mark.parametrize(
    "function, error, message", [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_bad_input_raises_clear_error(function, error, message):
    with pytest.raises(error, match=message):
        function()


def test_case_ids_are_distinct_and_numerous():
    ids = [case[0] for case in CASES]
    assert len(set(ids)) == len(ids)
    assert len(ids) >= 25


def test_a_mask_never_enlarges_the_batch():
    """A mask for 2 sequences must not silently broadcast a batch of 1 to 2 outputs."""
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 3, 3\) does not broadcast"):
        MHA(X[:1], X[:1], X[:1], mask)
