"""``residual_scale`` (DeepNorm's α) on the Post-LN encoder and decoder layers."""

from __future__ import annotations

import math

import pytest
import torch

from companion.interop import to_torch
from companion.layers import DecoderLayer, EncoderLayer
from companion.model import Transformer, TransformerConfig

D_MODEL, HEADS, D_FF = 16, 4, 32


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, D_MODEL, generator=g)
    memory = torch.randn(2, 7, D_MODEL, generator=g)
    return x, memory


def _pair(cls, alpha: float):
    """Two layers with the same weights: one plain Post-LN, one with residual_scale=alpha."""
    torch.manual_seed(0)
    plain = cls(D_MODEL, HEADS, D_FF, dropout=0.0)
    scaled = cls(D_MODEL, HEADS, D_FF, dropout=0.0, residual_scale=alpha)
    scaled.load_state_dict(plain.state_dict())
    return plain.eval(), scaled.eval()


def test_default_is_one_and_changes_nothing():
    for cls in (EncoderLayer, DecoderLayer):
        layer = cls(D_MODEL, HEADS, D_FF)
        assert layer.residual_scale == 1.0
    x, memory = _inputs()
    plain, scaled = _pair(EncoderLayer, 1.0)
    assert torch.equal(plain(x), scaled(x))
    plain, scaled = _pair(DecoderLayer, 1.0)
    assert torch.equal(plain(x, memory), scaled(x, memory))


@pytest.mark.parametrize("alpha", [0.5, 1.7, 3.0])
def test_encoder_layer_computes_scaled_post_ln(alpha):
    _, layer = _pair(EncoderLayer, alpha)
    x, _ = _inputs(1)
    with torch.no_grad():
        h = layer.self_attention(x, x, x)[0]
        y = layer.self_attention_norm(alpha * x + h)
        expected = layer.feed_forward_norm(alpha * y + layer.feed_forward(y))
        torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("alpha", [0.5, 2.06])
def test_decoder_layer_computes_scaled_post_ln(alpha):
    _, layer = _pair(DecoderLayer, alpha)
    x, memory = _inputs(2)
    with torch.no_grad():
        y = layer.self_attention_norm(alpha * x + layer.self_attention(x, x, x, is_causal=True)[0])
        y = layer.cross_attention_norm(alpha * y + layer.cross_attention(y, memory, memory)[0])
        expected = layer.feed_forward_norm(alpha * y + layer.feed_forward(y))
        torch.testing.assert_close(layer(x, memory), expected)


def test_scaled_layer_differs_from_plain_one():
    plain, scaled = _pair(EncoderLayer, 2.0)
    x, _ = _inputs(3)
    with torch.no_grad():
        assert (plain(x) - scaled(x)).abs().max() > 1e-2


def test_large_alpha_makes_the_layer_a_normalisation_of_its_input():
    """As α grows, LN(α·x + F(x)) → LN(x): the sub-layer starts close to the identity."""
    x, _ = _inputs(4)
    distances = []
    for alpha in (1.0, 4.0, 16.0, 64.0):
        _, layer = _pair(EncoderLayer, alpha)
        with torch.no_grad():
            target = torch.nn.functional.layer_norm(x, (D_MODEL,))
            distances.append((layer(x) - target).norm().item())
    assert all(a > b for a, b in zip(distances, distances[1:]))
    assert distances[-1] < 0.1 * distances[0]


def test_settable_after_construction_with_checks():
    layer = EncoderLayer(D_MODEL, HEADS, D_FF)
    layer.residual_scale = 2
    assert layer.residual_scale == 2.0 and isinstance(layer.residual_scale, float)
    with pytest.raises(ValueError, match="positive finite"):
        layer.residual_scale = 0.0
    with pytest.raises(ValueError, match="positive finite"):
        layer.residual_scale = math.inf
    with pytest.raises(ValueError, match="positive finite"):
        layer.residual_scale = math.nan
    with pytest.raises(TypeError, match="residual_scale"):
        layer.residual_scale = "2"
    with pytest.raises(TypeError, match="residual_scale"):
        layer.residual_scale = True
    assert layer.residual_scale == 2.0  # a refused value leaves the old one


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_constructor_checks(cls):
    with pytest.raises(ValueError, match="residual_scale"):
        cls(D_MODEL, HEADS, D_FF, residual_scale=-1.0)
    with pytest.raises(ValueError, match="Pre-LN"):
        cls(D_MODEL, HEADS, D_FF, norm_first=True, residual_scale=2.0)
    pre = cls(D_MODEL, HEADS, D_FF, norm_first=True, residual_scale=1.0)
    with pytest.raises(ValueError, match="Pre-LN"):
        pre.residual_scale = 1.5


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_to_torch_refuses_a_scaled_layer(cls):
    layer = cls(D_MODEL, HEADS, D_FF, residual_scale=1.5)
    with pytest.raises(ValueError, match="residual_scale"):
        to_torch(layer)
    layer.residual_scale = 1.0
    assert to_torch(layer) is not None


def test_scale_set_on_a_transformer_is_used_and_trains():
    """Setting α on the layers of a whole model (as chapter 6 does) changes its output, and
    the model still trains (finite loss and gradients)."""
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(
            12, 12, d_model=D_MODEL, num_heads=HEADS, num_layers=2, d_ff=D_FF, dropout=0.0
        )
    ).eval()
    src = torch.randint(0, 12, (2, 6))
    tgt = torch.randint(0, 12, (2, 5))
    with torch.no_grad():
        before = model(src, tgt)
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.residual_scale = 1.8
    logits = model(src, tgt)
    assert (logits - before).abs().max() > 1e-3
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
