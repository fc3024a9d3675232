"""Chapter 6 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.exercises import ch06

# --------------------------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------------------------


def layer_norm_correct(x, gain, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, correction=0)
    return gain * (x - mean) / torch.sqrt(var + eps) + bias


def layer_norm_builtin(x, gain, bias, eps):
    return F.layer_norm(x, x.shape[-1:], gain, bias, eps)


def layer_norm_unbiased(x, gain, bias, eps):
    mean = x.mean(-1, keepdim=True)
    return gain * (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) + bias  # ÷ (d - 1)


def layer_norm_eps_outside(x, gain, bias, eps):
    # the Annotated Transformer's old LayerNorm: unbiased std, eps added outside the root
    mean = x.mean(-1, keepdim=True)
    return gain * (x - mean) / (x.std(-1, keepdim=True) + eps) + bias


def layer_norm_biased_std_eps_outside(x, gain, bias, eps):
    mean = x.mean(-1, keepdim=True)
    return gain * (x - mean) / (x.std(-1, keepdim=True, correction=0) + eps) + bias


def layer_norm_wrong_axis(x, gain, bias, eps):
    mean = x.mean(0, keepdim=True)  # over the tokens, like BatchNorm
    var = x.var(0, keepdim=True, correction=0)
    return gain * (x - mean) / torch.sqrt(var + eps) + bias


def layer_norm_no_affine(x, gain, bias, eps):
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def layer_norm_affine_swapped(x, gain, bias, eps):
    return bias * F.layer_norm(x, x.shape[-1:], eps=eps) + gain


def test_layer_norm_accepts_correct_and_builtin():
    assert ch06.check_layer_norm(layer_norm_correct, verbose=False)
    assert ch06.check_layer_norm(layer_norm_builtin, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        layer_norm_unbiased,
        layer_norm_eps_outside,
        layer_norm_biased_std_eps_outside,
        layer_norm_wrong_axis,
        layer_norm_no_affine,
        layer_norm_affine_swapped,
    ],
)
def test_layer_norm_rejects_wrong(wrong):
    assert not ch06.check_layer_norm(wrong, verbose=False)


def test_eps_placement_is_caught_by_the_nearly_constant_case():
    """``std + eps`` with the biased std passes the unit-variance cases with a small eps; the
    large-eps and nearly constant cases are what reject it."""
    result = ch06.check_layer_norm(layer_norm_biased_std_eps_outside, verbose=False)
    assert not result
    assert result.cases_run >= 4


def test_reference_layer_norm_matches_torch_module():
    g = torch.Generator().manual_seed(0)
    module = nn.LayerNorm(10, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(torch.randn(10, generator=g))
        module.bias.copy_(torch.randn(10, generator=g))
    x = torch.randn(3, 7, 10, generator=g)
    got = ch06.reference_layer_norm(x, module.weight, module.bias, module.eps)
    torch.testing.assert_close(got, module(x))


# --------------------------------------------------------------------------------------------
# pre_ln_block
# --------------------------------------------------------------------------------------------


def test_pre_ln_block_accepts_correct():
    assert ch06.check_pre_ln_block(lambda x, sublayer, norm: x + sublayer(norm(x)), verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        ch06.post_ln_block,  # the Post-LN block itself
        lambda x, sublayer, norm: norm(x) + sublayer(norm(x)),  # residual from norm(x)
        lambda x, sublayer, norm: x + norm(sublayer(x)),  # norm on the branch's output
        lambda x, sublayer, norm: sublayer(norm(x)),  # no residual
        lambda x, sublayer, norm: x + sublayer(x),  # no norm at all
        lambda x, sublayer, norm: norm(x + sublayer(norm(x))),  # Pre-LN plus a Post-LN
    ],
)
def test_pre_ln_block_rejects_wrong(wrong):
    assert not ch06.check_pre_ln_block(wrong, verbose=False)


def test_pre_ln_cases_are_deterministic_and_leave_the_global_seed_alone():
    state = torch.get_rng_state()
    first, second = ch06._pre_ln_cases(), ch06._pre_ln_cases()
    assert torch.equal(torch.get_rng_state(), state)
    for a, b in zip(first, second):
        assert torch.equal(a["x"], b["x"])
        for pa, pb in zip(a["sublayer"].parameters(), b["sublayer"].parameters()):
            assert torch.equal(pa, pb)


# --------------------------------------------------------------------------------------------
# relative_updates
# --------------------------------------------------------------------------------------------


def relative_updates_correct(stream):
    ratios = (stream[1:] - stream[:-1]).norm(dim=-1) / stream[:-1].norm(dim=-1)
    return ratios.reshape(ratios.shape[0], -1).mean(-1)


def relative_updates_ratio_of_means(stream):
    update = (stream[1:] - stream[:-1]).norm(dim=-1).flatten(1).mean(1)
    return update / stream[:-1].norm(dim=-1).flatten(1).mean(1)


def relative_updates_divides_by_next(stream):
    ratios = (stream[1:] - stream[:-1]).norm(dim=-1) / stream[1:].norm(dim=-1)
    return ratios.flatten(1).mean(1)


def relative_updates_all_states(stream):
    ratios = stream.norm(dim=-1) / stream[0].norm(dim=-1)  # (S + 1, ...): vs the input
    return ratios.flatten(1).mean(1)


def relative_updates_wrong_axis(stream):
    ratios = (stream[1:] - stream[:-1]).norm(dim=0) / stream[:-1].norm(dim=0)
    return ratios.flatten().mean().expand(stream.shape[0] - 1)


def test_relative_updates_accepts_correct():
    assert ch06.check_relative_updates(relative_updates_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        relative_updates_ratio_of_means,
        relative_updates_divides_by_next,
        relative_updates_all_states,
        relative_updates_wrong_axis,
    ],
)
def test_relative_updates_rejects_wrong(wrong):
    assert not ch06.check_relative_updates(wrong, verbose=False)


def test_relative_updates_of_a_pre_ln_stack_shrink():
    """On a real Pre-LN encoder, the measured relative updates fall with depth."""
    from companion.model import Encoder, TransformerConfig

    torch.manual_seed(0)
    encoder = Encoder(
        TransformerConfig(
            num_layers=8, d_model=32, num_heads=4, d_ff=64, dropout=0.0, norm_first=True
        )
    ).eval()
    x = torch.randn(2, 6, 32)
    states = [x]
    with torch.no_grad():
        for layer in encoder.layers:
            states.append(layer(states[-1]))
    rho = ch06.reference_relative_updates(torch.stack(states))  # (8,) one per layer
    assert rho.shape == (8,)
    assert rho[-2:].mean() < rho[:2].mean()


# --------------------------------------------------------------------------------------------
# deepnorm_constants
# --------------------------------------------------------------------------------------------


def deepnorm_correct(num_encoder_layers, num_decoder_layers):
    n, m = num_encoder_layers, num_decoder_layers
    return (
        0.81 * (n**4 * m) ** 0.0625,
        0.87 * (n**4 * m) ** -0.0625,
        (3 * m) ** 0.25,
        (12 * m) ** -0.25,
    )


def deepnorm_encoder_only_formula(num_encoder_layers, num_decoder_layers):
    n, m = num_encoder_layers, num_decoder_layers
    return (2 * n) ** 0.25, (8 * n) ** -0.25, (2 * m) ** 0.25, (8 * m) ** -0.25


def deepnorm_swapped_n_m(num_encoder_layers, num_decoder_layers):
    return deepnorm_correct(num_decoder_layers, num_encoder_layers)


def deepnorm_quarter_power(num_encoder_layers, num_decoder_layers):
    n, m = num_encoder_layers, num_decoder_layers
    return 0.81 * (n**4 * m) ** 0.25, 0.87 * (n**4 * m) ** -0.25, (3 * m) ** 0.25, (12 * m) ** -0.25


def deepnorm_wrong_order(num_encoder_layers, num_decoder_layers):
    a, b, c, d = deepnorm_correct(num_encoder_layers, num_decoder_layers)
    return a, c, b, d  # (alphas, then betas)


def test_deepnorm_constants_accepts_correct():
    assert ch06.check_deepnorm_constants(deepnorm_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        deepnorm_encoder_only_formula,
        deepnorm_swapped_n_m,
        deepnorm_quarter_power,
        deepnorm_wrong_order,
    ],
)
def test_deepnorm_constants_rejects_wrong(wrong):
    assert not ch06.check_deepnorm_constants(wrong, verbose=False)


def test_deepnorm_constants_for_the_chapter_model():
    encoder_alpha, encoder_beta, decoder_alpha, decoder_beta = ch06.reference_deepnorm_constants(
        6, 6
    )
    assert math.isclose(encoder_alpha, 0.81 * 6 ** (5 / 16))
    assert 1.4 < encoder_alpha < 1.45 and 0.49 < encoder_beta < 0.51
    assert math.isclose(decoder_alpha, 18**0.25) and math.isclose(decoder_beta, 72**-0.25)
    # α grows and β shrinks with depth
    deeper = ch06.reference_deepnorm_constants(100, 100)
    assert deeper[0] > encoder_alpha and deeper[1] < encoder_beta
    assert deeper[2] > decoder_alpha and deeper[3] < decoder_beta


# --------------------------------------------------------------------------------------------
# fails_without_warmup
# --------------------------------------------------------------------------------------------


def test_fails_without_warmup_accepts_the_table():
    assert ch06.check_fails_without_warmup(
        lambda norm_first, learning_rate: ch06.FAILS_WITHOUT_WARMUP[norm_first, learning_rate],
        verbose=False,
    )


@pytest.mark.parametrize(
    "wrong",
    [
        lambda norm_first, learning_rate: not norm_first,  # "Post-LN always fails"
        lambda norm_first, learning_rate: False,  # "nothing fails"
        lambda norm_first, learning_rate: True,  # "everything fails"
        lambda norm_first, learning_rate: learning_rate >= 1e-3,  # "only the rate matters"
        lambda norm_first, learning_rate: norm_first and learning_rate >= 3e-3,  # swapped
        lambda norm_first, learning_rate: learning_rate >= 3e-3,  # ignores the placement
        lambda norm_first, learning_rate: not norm_first and learning_rate >= 1e-3,  # too early
    ],
)
def test_fails_without_warmup_rejects_wrong(wrong):
    assert not ch06.check_fails_without_warmup(wrong, verbose=False)


def test_truth_table_covers_both_placements():
    assert {nf for nf, _ in ch06.FAILS_WITHOUT_WARMUP} == {True, False}
    assert not any(fails for (nf, _), fails in ch06.FAILS_WITHOUT_WARMUP.items() if nf)
    assert any(fails for (nf, _), fails in ch06.FAILS_WITHOUT_WARMUP.items() if not nf)


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, references
# --------------------------------------------------------------------------------------------

CHECKS = [
    ch06.check_layer_norm,
    ch06.check_pre_ln_block,
    ch06.check_relative_updates,
    ch06.check_deepnorm_constants,
    ch06.check_fails_without_warmup,
]


@pytest.mark.parametrize("check", CHECKS)
def test_stub_is_reported_not_raised(check, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError  # your code here

    result = check(stub)
    assert not result
    assert result.cases_run == 1
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize("check", CHECKS)
def test_crashing_answer_is_reported_not_raised(check):
    def crashes(*args, **kwargs):
        raise RuntimeError("boom")

    result = check(crashes, verbose=False)
    assert not result
    assert "boom" in result.message


@pytest.mark.parametrize(
    ("check", "reference"),
    [
        (ch06.check_layer_norm, ch06.reference_layer_norm),
        (ch06.check_pre_ln_block, ch06.reference_pre_ln_block),
        (ch06.check_relative_updates, ch06.reference_relative_updates),
        (ch06.check_deepnorm_constants, ch06.reference_deepnorm_constants),
        (ch06.check_fails_without_warmup, ch06.reference_fails_without_warmup),
    ],
)
def test_reference_passes_its_own_check_on_several_cases(check, reference):
    result = check(reference, verbose=False)
    assert result
    assert result.cases_run >= 5
