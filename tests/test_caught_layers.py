"""Tests the bug museum showed were missing (issue #18): where dropout sits in a layer.

Mutant ``post_ln_dropout_after_norm`` (dropout applied after the LayerNorm of a Post-LN layer
instead of to the sub-layer output) survived every other test: they compare with
``torch.nn`` in evaluation mode, where dropout does nothing.
"""

import pytest
import torch

from companion.layers import DecoderLayer, EncoderLayer

D_MODEL, HEADS, D_FF = 16, 2, 32


@pytest.mark.parametrize("layer_class", [EncoderLayer, DecoderLayer])
def test_post_ln_output_is_normalised_in_training_mode(layer_class):
    """Post-LN ends every sub-layer with ``norm(x + dropout(sublayer(x)))``: in training mode
    too, each output vector has mean 0 and variance 1 (default LayerNorm affine), however much
    dropout zeroes inside the residual branch. Dropout after the norm would zero entries and
    scale the rest by ``1 / (1 - p)``, so the variance would be about 2 for ``p = 0.5``."""
    torch.manual_seed(0)
    layer = layer_class(D_MODEL, HEADS, D_FF, dropout=0.5, norm_first=False).train()
    x = torch.randn(3, 7, D_MODEL)  # (batch, len, d_model)
    if layer_class is DecoderLayer:
        out = layer(x, torch.randn(3, 5, D_MODEL))  # (batch, len, d_model)
    else:
        out = layer(x)  # (batch, len, d_model)
    mean = out.mean(dim=-1)  # (batch, len)
    variance = out.var(dim=-1, unbiased=False)  # (batch, len)
    assert mean.abs().max() < 1e-5
    assert (variance - 1).abs().max() < 1e-3
