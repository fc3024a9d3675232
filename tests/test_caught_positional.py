"""Tests the bug museum showed were missing (issue #18): learned positions must learn.

Mutant ``learned_positions_detached`` (the position table read through ``.data``, which
cuts it out of the autograd graph) survived every other test: they check the values added,
never that the table receives a gradient.
"""

import torch

from companion.model import Transformer, TransformerConfig
from companion.positional import LearnedPositionalEmbedding


def test_learned_positions_receive_a_gradient_for_the_positions_used():
    """``x + P[offset : offset + seq_len]``: the gradient of the sum reaches exactly the rows
    used, once per sequence of the batch, and no other row."""
    embedding = LearnedPositionalEmbedding(8, 4)
    x = torch.zeros(3, 5, 4)  # (batch, seq_len, d_model)
    embedding(x, offset=2).sum().backward()
    grad = embedding.embedding.weight.grad  # (max_len, d_model)
    assert grad is not None, "the position table gets no gradient"
    expected = torch.zeros(8, 4)  # (max_len, d_model)
    expected[2:7] = 3.0  # positions 2..6, batch of 3
    assert torch.equal(grad, expected)


def test_a_transformer_with_learned_positions_trains_its_position_tables():
    """One backward pass through a whole model reaches both position tables."""
    torch.manual_seed(0)
    config = TransformerConfig(
        d_model=8,
        num_heads=2,
        d_ff=16,
        num_layers=1,
        dropout=0.0,
        src_vocab=11,
        tgt_vocab=13,
        positional="learned",
        max_len=16,
    )
    model = Transformer(config)
    src = torch.randint(4, 11, (2, 6))  # (batch, src_len)
    tgt = torch.randint(4, 13, (2, 5))  # (batch, tgt_len)
    model(src, tgt).square().mean().backward()
    for table in (model.src_positions, model.tgt_positions):
        grad = table.embedding.weight.grad  # (max_len, d_model)
        assert grad is not None and grad[:5].abs().sum() > 0
