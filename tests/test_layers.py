"""Layers: parity of EncoderLayer/DecoderLayer with torch's (both norm_first), feed-forward,
attention weights for plots, weight copying."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import max_abs_diff, randomize_
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import companion.kernels as kernels_module
from companion.dropout import dropout
from companion.interop import (
    from_torch,
    load_from_torch,
    to_torch,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from companion.layers import DecoderLayer, EncoderLayer, FeedForward, _RMSNorm, make_norm
from companion.masking import causal_mask, combine_masks
from companion.model import Transformer, TransformerConfig

TOL = 1e-5


def rows_with_a_key(mask, batch, q_len, k_len):
    """(batch, q_len): True where the (head-shared) mask lets the query attend somewhere."""
    if mask is None:
        return torch.ones(batch, q_len, dtype=torch.bool)
    return mask.expand(batch, 1, q_len, k_len).any(-1)[:, 0]


@st.composite
def layer_cases(draw):
    heads = draw(st.integers(1, 3))
    return {
        "batch": draw(st.integers(1, 3)),
        "heads": heads,
        "d_model": heads * draw(st.integers(1, 4)),
        "d_ff": draw(st.integers(1, 12)),
        "tgt_len": draw(st.integers(1, 6)),
        "src_len": draw(st.integers(1, 6)),
        "norm_first": draw(st.booleans()),
        "activation": draw(st.sampled_from(["relu", "gelu"])),
        "bias": draw(st.booleans()),
        "mask_kind": draw(st.sampled_from(["none", "padding", "random", "padding+random"])),
        "causal": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def random_masks(kind, batch, q_len, k_len, gen):
    """(padding (batch, 1, 1, k_len) or None, random (batch, 1, q_len, k_len) or None)."""
    padding = torch.rand(batch, 1, 1, k_len, generator=gen) > 0.3 if "padding" in kind else None
    random = torch.rand(batch, 1, q_len, k_len, generator=gen) > 0.4 if "random" in kind else None
    return padding, random


def torch_mask_kwargs(padding, attn, prefix):
    kwargs = {}
    if padding is not None:
        kwargs[f"{prefix}_key_padding_mask"] = to_torch_key_padding_mask(padding)
    if attn is not None:
        kwargs[f"{prefix}_mask"] = to_torch_attn_mask(attn[:, 0] if attn.dim() == 4 else attn)
    return kwargs


def repeat_per_head(mask, heads):
    """torch wants a 3-D attn_mask as (batch * heads, q, k)."""
    return mask.repeat_interleave(heads, dim=0)


@settings(max_examples=60, deadline=None)
@given(layer_cases())
def test_encoder_layer_parity_with_torch(case):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, length, d_model, heads = case["batch"], case["src_len"], case["d_model"], case["heads"]
    reference = nn.TransformerEncoderLayer(
        d_model, heads, case["d_ff"], dropout=0.1, activation=case["activation"],
        batch_first=True, norm_first=case["norm_first"], bias=case["bias"],
    )  # fmt: skip
    randomize_(reference, gen).eval()
    ours = from_torch(reference).eval()
    assert ours.norm_first == case["norm_first"]

    x = torch.randn(batch, length, d_model, generator=gen)
    padding, random = random_masks(case["mask_kind"], batch, length, length, gen)
    causal = causal_mask(length) if case["causal"] else None
    mask = combine_masks(padding, random, causal)
    attn = combine_masks(random, causal)
    kwargs = {}
    if padding is not None:
        kwargs["src_key_padding_mask"] = to_torch_key_padding_mask(padding)
    if attn is not None:
        kwargs["src_mask"] = ~attn if attn.dim() == 2 else repeat_per_head(~attn[:, 0], heads)

    out = ours(x, mask)
    expected = reference(x, **kwargs)
    valid = rows_with_a_key(mask, batch, length, length)
    assert torch.isfinite(out).all()
    assert max_abs_diff(out[valid], expected[valid]) <= TOL


@settings(max_examples=60, deadline=None)
@given(layer_cases())
def test_decoder_layer_parity_with_torch(case):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, d_model, heads = case["batch"], case["d_model"], case["heads"]
    tgt_len, src_len = case["tgt_len"], case["src_len"]
    reference = nn.TransformerDecoderLayer(
        d_model, heads, case["d_ff"], dropout=0.1, activation=case["activation"],
        batch_first=True, norm_first=case["norm_first"], bias=case["bias"],
    )  # fmt: skip
    randomize_(reference, gen).eval()
    ours = from_torch(reference).eval()

    x = torch.randn(batch, tgt_len, d_model, generator=gen)
    memory = torch.randn(batch, src_len, d_model, generator=gen)
    tgt_padding, tgt_random = random_masks(case["mask_kind"], batch, tgt_len, tgt_len, gen)
    src_padding, src_random = random_masks(case["mask_kind"], batch, tgt_len, src_len, gen)
    tgt_mask = combine_masks(tgt_padding, tgt_random)
    memory_mask = combine_masks(src_padding, src_random)
    causal = causal_mask(tgt_len) if case["causal"] else None
    self_attn = combine_masks(tgt_random, causal)

    kwargs = {}
    if tgt_padding is not None:
        kwargs["tgt_key_padding_mask"] = to_torch_key_padding_mask(tgt_padding)
    if src_padding is not None:
        kwargs["memory_key_padding_mask"] = to_torch_key_padding_mask(src_padding)
    if self_attn is not None:
        kwargs["tgt_mask"] = (
            ~self_attn if self_attn.dim() == 2 else repeat_per_head(~self_attn[:, 0], heads)
        )
    if src_random is not None:
        kwargs["memory_mask"] = repeat_per_head(~src_random[:, 0], heads)

    out = ours(x, memory, tgt_mask, memory_mask, is_causal=case["causal"])
    expected = reference(x, memory, **kwargs)
    full_self = combine_masks(tgt_mask, causal)
    valid = rows_with_a_key(full_self, batch, tgt_len, tgt_len) & rows_with_a_key(
        memory_mask, batch, tgt_len, src_len
    )
    assert torch.isfinite(out).all()
    assert max_abs_diff(out[valid], expected[valid]) <= TOL


@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_round_trip_through_torch(norm_first):
    torch.manual_seed(0)
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    encoder = EncoderLayer(8, 2, 16, norm_first=norm_first, activation="gelu").eval()
    theirs = to_torch(encoder).eval()
    assert max_abs_diff(encoder(x), theirs(x)) <= TOL
    decoder = DecoderLayer(8, 2, 16, norm_first=norm_first).eval()
    theirs = to_torch(decoder).eval()
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    assert max_abs_diff(decoder(x, memory), theirs(x, memory, tgt_mask=causal)) <= TOL


def test_decoder_layer_is_causal_by_default():
    torch.manual_seed(0)
    layer = DecoderLayer(8, 2, 16).eval()
    x, memory = torch.randn(1, 5, 8), torch.randn(1, 3, 8)
    changed = x.clone()
    changed[:, 3:] = torch.randn(1, 2, 8)
    assert max_abs_diff(layer(x, memory)[:, :3], layer(changed, memory)[:, :3]) <= TOL
    assert (
        max_abs_diff(
            layer(x, memory, is_causal=False)[:, :3], layer(changed, memory, is_causal=False)[:, :3]
        )
        > 1e-3
    )


def test_layers_store_attention_weights_for_plots():
    torch.manual_seed(0)
    encoder = EncoderLayer(8, 2, 16).eval()
    x = torch.randn(3, 4, 8)
    out_plain = encoder(x)
    assert encoder.self_attention_weights is None
    out = encoder(x, need_weights=True)
    assert encoder.self_attention_weights.shape == (3, 2, 4, 4)
    assert max_abs_diff(out, out_plain) <= TOL

    decoder = DecoderLayer(8, 2, 16).eval()
    memory = torch.randn(3, 6, 8)
    decoder(x, memory, need_weights=True)
    assert decoder.self_attention_weights.shape == (3, 2, 4, 4)
    assert decoder.cross_attention_weights.shape == (3, 2, 4, 6)
    # causal: no weight above the diagonal
    assert decoder.self_attention_weights.triu(1).abs().max() == 0
    decoder(x, memory)
    assert decoder.cross_attention_weights is None


@pytest.mark.parametrize("activation, function", [("relu", F.relu), ("gelu", F.gelu)])
def test_feed_forward_is_position_wise(activation, function):
    torch.manual_seed(0)
    ff = FeedForward(6, 24, activation=activation).eval()
    x = torch.randn(2, 5, 6)
    expected = ff.output_proj(function(ff.hidden_proj(x)))
    assert max_abs_diff(ff(x), expected) <= TOL
    # each position on its own gives the same result
    assert max_abs_diff(ff(x[:, 2]), ff(x)[:, 2]) <= TOL


def test_pre_and_post_ln_differ():
    torch.manual_seed(0)
    post = EncoderLayer(8, 2, 16, norm_first=False).eval()
    pre = EncoderLayer(8, 2, 16, norm_first=True).eval()
    pre.load_state_dict(post.state_dict())
    x = torch.randn(2, 3, 8)
    assert max_abs_diff(post(x), pre(x)) > 1e-3
    # Post-LN output is normalised (mean 0, variance 1 per position with the default affine)
    out = post(x)
    assert out.mean(-1).abs().max() < 1e-5


# ---------------------------------------------------------------------- ``residual_scale`` (DeepNorm's α) on the Post-LN encoder and


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


# ---------------------------------------------------------------------------------------------
# RMSNorm (norm="rms")
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_make_norm_rms_matches_torch_rms_norm(dtype, eps):
    """The package's RMSNorm (``torch.nn.RMSNorm``, or the fallback for torch < 2.4) and
    ``torch.nn.RMSNorm`` with the same weight agree to 1e-5."""
    g = torch.Generator().manual_seed(0)
    ours = make_norm("rms", 16, eps=eps).to(dtype)
    fallback = _RMSNorm(16, eps).to(dtype)
    reference = nn.RMSNorm(16, eps=eps, dtype=dtype)
    weight = 1 + 0.5 * torch.randn(16, generator=g, dtype=dtype)
    with torch.no_grad():
        for module in (ours, fallback, reference):
            module.weight.copy_(weight)
    x = 3 * torch.randn(4, 7, 16, generator=g, dtype=dtype) + 1  # (batch, len, d), mean ≠ 0
    expected = reference(x)
    for module in (ours, fallback):
        assert [name for name, _ in module.named_parameters()] == ["weight"]  # no bias
        assert module(x).dtype == dtype
        torch.testing.assert_close(module(x), expected, atol=1e-5, rtol=0)
    by_hand = weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # (4, 7, 16)
    torch.testing.assert_close(ours(x), by_hand, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_rms_layer_uses_rms_norm_and_matches_a_replay(cls, norm_first):
    """Every norm of an ``norm="rms"`` layer is an RMSNorm (one weight, no bias), and the
    layer computes the residual formula with ``torch.nn.RMSNorm``."""
    torch.manual_seed(0)
    layer = cls(D_MODEL, HEADS, D_FF, dropout=0.0, norm_first=norm_first, norm="rms").eval()
    norms = [m for m in layer.modules() if isinstance(m, (nn.RMSNorm, _RMSNorm))]
    assert len(norms) == (2 if cls is EncoderLayer else 3)
    assert not any(isinstance(m, nn.LayerNorm) for m in layer.modules())
    assert layer.norm == "rms"
    x = torch.randn(2, 5, D_MODEL)
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(1 + 0.3 * torch.randn(D_MODEL))
        if cls is EncoderLayer:
            out = layer(x)
            sa = layer.self_attention
            norm_sa, norm_ff = layer.self_attention_norm, layer.feed_forward_norm
            if norm_first:
                h = x + sa(norm_sa(x), norm_sa(x), norm_sa(x))[0]
                replay = h + layer.feed_forward(norm_ff(h))
            else:
                h = norm_sa(x + sa(x, x, x)[0])
                replay = norm_ff(h + layer.feed_forward(h))
            torch.testing.assert_close(out, replay, atol=1e-5, rtol=0)
        else:
            memory = torch.randn(2, 4, D_MODEL)
            assert torch.isfinite(layer(x, memory)).all()


def test_rms_and_layer_norm_layers_differ():
    torch.manual_seed(0)
    layer = EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0).eval()
    rms = EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, norm="rms").eval()
    rms.load_state_dict(
        {k: v for k, v in layer.state_dict().items() if not k.endswith("norm.bias")}
    )
    x = torch.randn(2, 5, D_MODEL) + 2  # a mean per token: LayerNorm removes it, RMSNorm not
    with torch.no_grad():
        assert (layer(x) - rms(x)).abs().max() > 1e-2


@pytest.mark.parametrize("bad", ["batch", "RMS", "rmsnorm", None, 1])
@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_unknown_norm_is_a_clear_error(cls, bad):
    with pytest.raises(ValueError, match=r"norm must be one of 'layer', 'rms', got"):
        cls(D_MODEL, HEADS, D_FF, norm=bad)


@pytest.mark.parametrize("bad", ["batch", "", "Layer"])
def test_unknown_norm_in_config_or_make_norm_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="norm must be one of 'layer', 'rms'"):
        TransformerConfig(norm=bad)
    with pytest.raises(ValueError, match="norm must be one of 'layer', 'rms'"):
        make_norm(bad, 8)


@pytest.mark.parametrize("norm_first", [False, True])
def test_rms_config_builds_rms_norms_everywhere_and_round_trips(norm_first):
    config = TransformerConfig(
        12, 12, d_model=D_MODEL, num_heads=HEADS, num_layers=2, d_ff=D_FF, dropout=0.0,
        norm_first=norm_first, final_norm=True, norm="rms",
    )  # fmt: skip
    assert config.layer_options["norm"] == "rms"
    assert TransformerConfig(**dataclasses.asdict(config)) == config  # as a checkpoint stores it
    torch.manual_seed(0)
    model = Transformer(config).eval()
    norms = [m for m in model.modules() if isinstance(m, (nn.RMSNorm, _RMSNorm))]
    assert len(norms) == 2 * 2 + 2 * 3 + 2  # encoder layers, decoder layers, final norms
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    src, tgt = torch.randint(0, 12, (2, 6)), torch.randint(0, 12, (2, 5))
    logits = model(src, tgt)  # (2, 5, 12)
    logits.sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert TransformerConfig().norm == "layer"  # the paper's LayerNorm stays the default


def test_interop_refuses_rms_models_clearly():
    torch.manual_seed(0)
    layer = EncoderLayer(D_MODEL, HEADS, D_FF, norm="rms")
    with pytest.raises(ValueError, match="norm='rms'.*LayerNorm only"):
        to_torch(layer)
    config = TransformerConfig(12, 12, d_model=D_MODEL, num_heads=HEADS, num_layers=1, d_ff=D_FF)
    rms_config = dataclasses.replace(config, norm="rms")
    with pytest.raises(ValueError, match="norm='rms'.*LayerNorm only"):
        to_torch(Transformer(rms_config))
    with pytest.raises(ValueError, match="norm: expected 'rms', got 'layer'"):
        load_from_torch(layer, to_torch(EncoderLayer(D_MODEL, HEADS, D_FF)))
    assert from_torch(to_torch(EncoderLayer(D_MODEL, HEADS, D_FF))).norm == "layer"


@pytest.mark.parametrize("p", [0.1, 0.5, 1 - 1e-6])  # the last realised as 1: all dropped
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_training_path_is_relu_then_dropout(p, bias):
    """On a CPU in training mode, ReLU + dropout run as one node with the scale moved onto
    output_proj's weight: the same output and gradients as the layers composed by hand, from
    the same random decisions (float64)."""
    torch.manual_seed(0)
    ff = FeedForward(16, 64, dropout=p, bias=bias).double().train()
    x = torch.randn(4, 5, 16, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(1)
    got = ff(x)
    torch.manual_seed(1)
    expected = ff.output_proj(dropout(torch.relu(ff.hidden_proj(x)), p))
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)
    grad = torch.randn_like(got)
    inputs = (x, *ff.parameters())
    for mine, theirs in zip(
        torch.autograd.grad(got, inputs, grad), torch.autograd.grad(expected, inputs, grad)
    ):
        torch.testing.assert_close(mine, theirs, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    ("activation", "training", "p", "taken"),
    [("relu", True, 0.1, True), ("gelu", True, 0.1, False), ("relu", False, 0.1, False),
     ("relu", True, 0.0, False)],
)  # fmt: skip
def test_feed_forward_takes_the_one_node_path_only_for_relu_dropout_in_training(
    activation, training, p, taken, monkeypatch
):
    calls = []
    original = kernels_module.KeptReLU.apply
    monkeypatch.setattr(
        kernels_module.KeptReLU, "apply", lambda *args: calls.append(1) or original(*args)
    )
    ff = FeedForward(8, 16, dropout=p, activation=activation).train(training)
    ff(torch.randn(2, 3, 8))
    assert bool(calls) == taken


def test_kept_relu_of_minus_infinity_is_zero_not_nan():
    """relu(-inf) = 0 whether the element is kept or dropped (0 · -inf would be NaN)."""
    hidden = torch.full((1000,), float("-inf"), requires_grad=True)
    out = kernels_module.KeptReLU.apply(hidden, 0.5)
    assert torch.equal(out, torch.zeros(1000))
    out.sum().backward()
    assert torch.equal(hidden.grad, torch.zeros(1000))
