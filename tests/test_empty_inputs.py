"""Zero-sized dimensions (issue 11, item 1): an empty batch or an empty query sequence gives an
empty result of the right shape, as ``torch.nn`` does; an empty key sequence follows the "no
key to attend to → zero output" rule; token ids with no position are a clear ``ValueError``.
Never a raw reshape error."""

from __future__ import annotations

import pytest
import torch
from helpers import randomize_, tiny_transformer
from torch import nn

from companion.attention import MultiHeadAttention, scaled_dot_product_attention
from companion.cache import KeyValueCache
from companion.interop import copy_to_torch
from companion.layers import DecoderLayer, EncoderLayer, FeedForward
from companion.model import Decoder, Encoder, TransformerConfig
from companion.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

D, HEADS = 8, 2
#: (batch, q_len, k_len) of every empty case
CASES = {"empty batch": (0, 3, 4), "empty queries": (2, 0, 4), "empty keys": (2, 3, 0)}


def attention_module(dropout: float = 0.0) -> MultiHeadAttention:
    torch.manual_seed(0)
    module = MultiHeadAttention(D, HEADS, dropout=dropout)
    return randomize_(module, torch.Generator().manual_seed(1))  # non-zero out_proj bias


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_multi_head_attention_empty_dimensions(case, need_weights, with_mask, training):
    batch, q_len, k_len = CASES[case]
    module = attention_module(dropout=0.1).train(training)
    query = torch.randn(batch, q_len, D, requires_grad=True)
    key = torch.randn(batch, k_len, D, requires_grad=True)
    mask = torch.ones(batch, 1, 1, k_len, dtype=torch.bool) if with_mask else None
    output, weights = module(query, key, key, mask, need_weights=need_weights)
    assert output.shape == (batch, q_len, D)
    if need_weights:
        assert weights.shape == (batch, HEADS, q_len, k_len)
    # no key at all: the "no key to attend to" rule, zeros (not out_proj's bias) on both paths
    assert torch.equal(output, torch.zeros_like(output))
    output.sum().backward()  # gradients flow through the empty tensors without errors
    assert query.grad.shape == query.shape and key.grad.shape == key.shape


@pytest.mark.parametrize("case", ["empty batch", "empty queries"])
def test_empty_batch_and_queries_match_torch(case):
    batch, q_len, k_len = CASES[case]
    ours = attention_module().eval()
    theirs = nn.MultiheadAttention(D, HEADS, batch_first=True).eval()
    copy_to_torch(ours, theirs)
    query, key = torch.randn(batch, q_len, D), torch.randn(batch, k_len, D)
    expected, _ = theirs(query, key, key)
    got, _ = ours(query, key, key)
    assert got.shape == expected.shape == (batch, q_len, D)


def test_empty_keys_give_zeros_where_torch_gives_the_bias():
    """The documented difference from ``nn.MultiheadAttention``: with no keys it returns
    ``out_proj``'s bias for every query; we return zeros, like a fully masked query."""
    ours = attention_module().eval()
    theirs = nn.MultiheadAttention(D, HEADS, batch_first=True).eval()
    copy_to_torch(ours, theirs)
    query, key = torch.randn(2, 3, D), torch.randn(2, 0, D)
    expected, _ = theirs(query, key, key)
    assert torch.allclose(expected, ours.out_proj.bias.expand(2, 3, D))
    got, _ = ours(query, key, key)
    assert torch.equal(got, torch.zeros(2, 3, D))
    fully_masked, _ = ours(query, torch.randn(2, 4, D), torch.randn(2, 4, D),
                           torch.zeros(2, 1, 1, 4, dtype=torch.bool))  # fmt: skip
    assert torch.equal(got, fully_masked)


def test_scaled_dot_product_attention_empty_dimensions():
    for batch, q_len, k_len in CASES.values():
        q, k, v = (
            torch.randn(batch, q_len, 4),
            torch.randn(batch, k_len, 4),
            torch.randn(batch, k_len, 5),
        )
        output, weights = scaled_dot_product_attention(q, k, v)
        assert output.shape == (batch, q_len, 5) and weights.shape == (batch, q_len, k_len)
        assert torch.equal(output, torch.zeros_like(output))


def test_cached_attention_with_empty_batch():
    module = attention_module().eval()
    cache = KeyValueCache()
    for _ in range(2):
        x = torch.randn(0, 1, D)
        output, _ = module(x, x, x, cache=cache)
        assert output.shape == (0, 1, D)
    assert cache.keys.shape == (0, HEADS, 2, D // HEADS)


@pytest.mark.parametrize("case", CASES)
def test_layers_and_stacks_with_empty_dimensions(case):
    batch, q_len, k_len = CASES[case]
    torch.manual_seed(0)
    x, memory = torch.randn(batch, q_len, D), torch.randn(batch, k_len, D)
    config = TransformerConfig(d_model=D, num_heads=HEADS, num_layers=1, d_ff=16, dropout=0.0)
    for module, args in (
        (FeedForward(D, 16), (x,)),
        (EncoderLayer(D, HEADS, 16), (x,)),
        (EncoderLayer(D, HEADS, 16, norm_first=True), (x,)),
        (DecoderLayer(D, HEADS, 16), (x, memory)),
        (Encoder(config), (x,)),
        (Decoder(config), (x, memory)),
        (SinusoidalPositionalEncoding(D), (x,)),
        (LearnedPositionalEmbedding(10, D), (x,)),
    ):
        assert module.eval()(*args).shape == (batch, q_len, D), type(module).__name__


def test_decoder_layer_with_empty_memory_matches_a_fully_masked_memory():
    torch.manual_seed(0)
    layer = randomize_(DecoderLayer(D, HEADS, 16), torch.Generator().manual_seed(2)).eval()
    x = torch.randn(2, 3, D)
    empty = layer(x, torch.randn(2, 0, D))
    blocked = layer(x, torch.randn(2, 4, D), memory_mask=torch.zeros(2, 1, 1, 4, dtype=torch.bool))
    torch.testing.assert_close(empty, blocked, rtol=0, atol=1e-6)


def test_transformer_with_empty_batch():
    model = tiny_transformer(11).eval()
    src, tgt = torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)
    assert model(src, tgt).shape == (0, 4, 11)
    assert model.encode(src).shape == (0, 5, 32)


@pytest.mark.parametrize("name", ["src", "tgt"])
def test_transformer_rejects_sequences_without_positions(name):
    model = tiny_transformer(11).eval()
    ids = {"src": torch.ones(2, 5, dtype=torch.long), "tgt": torch.ones(2, 4, dtype=torch.long)}
    ids[name] = torch.ones(2, 0, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"^{name} must have at least one position"):
        model(ids["src"], ids["tgt"])
