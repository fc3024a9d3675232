"""Chapter 6 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.exercises import ch06

# --------------------------------------------------------------------------------------------
# layer_norm_backward
# --------------------------------------------------------------------------------------------


def _ln_parts(x, eps, correction=0):
    mean = x.mean(-1, keepdim=True)
    s = torch.sqrt(x.var(-1, keepdim=True, correction=correction) + eps)
    return (x - mean) / s, s


def ln_backward_correct(x, gain, grad_out, eps):
    x_hat, s = _ln_parts(x, eps)
    g = gain * grad_out
    return (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) / s


def ln_backward_autograd(x, gain, grad_out, eps):  # deliberately switches autograd back on
    with torch.enable_grad():
        x = x.clone().requires_grad_(True)
        y = F.layer_norm(x, x.shape[-1:], gain, None, eps)
        return torch.autograd.grad(y, x, grad_out)[0]


def ln_backward_tensor_backward(x, gain, grad_out, eps):  # enable_grad and Tensor.backward
    with torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)
        F.layer_norm(x, x.shape[-1:], gain, None, eps).backward(grad_out)
        return x.grad


def ln_backward_plain_autograd(x, gain, grad_out, eps):  # autograd without enable_grad
    x = x.clone().requires_grad_(True)
    return torch.autograd.grad(F.layer_norm(x, x.shape[-1:], gain, None, eps), x, grad_out)[0]


def ln_backward_constant_statistics(x, gain, grad_out, eps):  # μ and s treated as constants
    _, s = _ln_parts(x, eps)
    return gain * grad_out / s


def ln_backward_no_mean_term(x, gain, grad_out, eps):
    x_hat, s = _ln_parts(x, eps)
    g = gain * grad_out
    return (g - x_hat * (g * x_hat).mean(-1, keepdim=True)) / s


def ln_backward_no_variance_term(x, gain, grad_out, eps):
    _, s = _ln_parts(x, eps)
    g = gain * grad_out
    return (g - g.mean(-1, keepdim=True)) / s


def ln_backward_no_gain(x, gain, grad_out, eps):
    return ln_backward_correct(x, torch.ones_like(gain), grad_out, eps)


def ln_backward_unbiased(x, gain, grad_out, eps):  # ÷ (d - 1) in the variance
    x_hat, s = _ln_parts(x, eps, correction=1)
    g = gain * grad_out
    return (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) / s


def ln_backward_eps_dropped(x, gain, grad_out, eps):  # s = σ, as if eps were 0
    return ln_backward_correct(x, gain, grad_out, 0.0)


def ln_backward_x_hat_without_eps(x, gain, grad_out, eps):  # x̂ = (x - μ)/σ, but ÷ s outside
    x_hat, _ = _ln_parts(x, 0.0)
    _, s = _ln_parts(x, eps)
    g = gain * grad_out
    return (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) / s


def test_layer_norm_backward_accepts_the_formula():
    assert ch06.check_layer_norm_backward(ln_backward_correct, verbose=False)


@pytest.mark.parametrize("autograd", [ln_backward_autograd, ln_backward_tensor_backward])
def test_layer_norm_backward_refuses_autograd_even_under_enable_grad(autograd):
    """Autograd gives the right numbers, but the exercise is the formula: the check switches
    autograd off and says so, and leaves it working afterwards."""
    result = ch06.check_layer_norm_backward(autograd, verbose=False)
    assert not result
    assert "by the formula" in result.message and "switched off" in result.message
    x = torch.randn(3, 4, requires_grad=True)
    x.pow(2).sum().backward()  # autograd is back on
    torch.testing.assert_close(x.grad, 2 * x.detach())


@pytest.mark.parametrize(
    "wrong",
    [
        ln_backward_constant_statistics,
        ln_backward_no_mean_term,
        ln_backward_no_variance_term,
        ln_backward_no_gain,
        ln_backward_unbiased,
        ln_backward_eps_dropped,
        ln_backward_x_hat_without_eps,
        ln_backward_plain_autograd,  # the check runs under no_grad: the exercise is the formula
        ln_backward_autograd,  # enable_grad does not get round it
    ],
)
def test_layer_norm_backward_rejects_wrong(wrong):
    assert not ch06.check_layer_norm_backward(wrong, verbose=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_layer_norm_backward_matches_autograd(dtype):
    g = torch.Generator().manual_seed(0)
    module = nn.LayerNorm(10, eps=1e-3).to(dtype)
    with torch.no_grad():
        module.weight.copy_(torch.randn(10, generator=g))
        module.bias.copy_(torch.randn(10, generator=g))
    x = (3 * torch.randn(3, 7, 10, generator=g)).to(dtype).requires_grad_(True)
    grad_out = torch.randn(3, 7, 10, generator=g).to(dtype)
    module(x).backward(grad_out)
    got = ch06.reference_layer_norm_backward(
        x.detach(), module.weight.detach(), grad_out, module.eps
    )
    torch.testing.assert_close(got, x.grad)


def test_reference_layer_norm_backward_removes_the_mean_and_the_x_hat_direction():
    """With eps → 0 the gradient sums to 0 over the features and is orthogonal to x̂."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64)
    grad = ch06.reference_layer_norm_backward(
        x,
        torch.ones(9, dtype=torch.float64),
        torch.randn(4, 9, generator=g, dtype=torch.float64),
        1e-12,
    )
    x_hat, _ = _ln_parts(x, 0.0)
    assert grad.sum(-1).abs().max() < 1e-10
    assert (grad * x_hat).sum(-1).abs().max() < 1e-10


def test_layer_norm_backward_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="grad_out"):
        ch06.reference_layer_norm_backward(
            torch.zeros(2, 4), torch.ones(4), torch.zeros(2, 5), 1e-5
        )


def test_peri_ln_cases_are_deterministic_and_leave_the_global_seed_alone():
    state = torch.get_rng_state()
    first, second = ch06._peri_ln_cases(), ch06._peri_ln_cases()
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
# log_log_slope and the measured slope of Pre-LN without its final LayerNorm
# --------------------------------------------------------------------------------------------


def slope_correct(depths, values):
    return float(np.polyfit(np.log(depths), np.log(values), 1)[0])


def slope_log10(depths, values):  # another base for both logarithms: the same slope
    return float(np.polyfit(np.log10(depths), np.log10(values), 1)[0])


def slope_end_points(depths, values):  # only the first and the last point
    return math.log(values[-1] / values[0]) / math.log(depths[-1] / depths[0])


def slope_swapped_axes(depths, values):  # log L against log v: about 1 / slope
    return float(np.polyfit(np.log(values), np.log(depths), 1)[0])


def slope_no_logs(depths, values):  # a straight line through the raw values
    return float(np.polyfit(depths, values, 1)[0])


def slope_log_values_only(depths, values):  # semi-log: log v against L
    return float(np.polyfit(depths, np.log(values), 1)[0])


def test_log_log_slope_accepts_correct():
    assert ch06.check_log_log_slope(slope_correct, verbose=False)
    assert ch06.check_log_log_slope(slope_log10, verbose=False)


@pytest.mark.parametrize(
    "wrong", [slope_end_points, slope_swapped_axes, slope_no_logs, slope_log_values_only]
)
def test_log_log_slope_rejects_wrong(wrong):
    assert not ch06.check_log_log_slope(wrong, verbose=False)


def test_reference_slope_of_an_exact_power_law():
    depths = np.array([2.0, 4, 8, 16, 24])
    assert math.isclose(ch06.reference_log_log_slope(depths, 3 * depths**-0.5), -0.5)


@pytest.mark.parametrize("slope", [0.0, -0.03, 0.02, np.float64(0.1), -0.15])
def test_slope_band_accepts_a_flat_slope(slope):
    assert ch06.verify_pre_ln_slope_without_final_norm(slope, verbose=False)


@pytest.mark.parametrize(
    "slope",
    [
        -0.53,  # the stack *with* its final LayerNorm (what the chapter printed)
        -0.5,
        0.5,  # a sign error
        -1.0,
        2.0,  # swapped axes of a shallow slope
        float("nan"),
        float("inf"),
    ],
)
def test_slope_band_rejects_the_classic_wrong_values(slope):
    assert not ch06.verify_pre_ln_slope_without_final_norm(slope, verbose=False)


def test_slope_band_hints_at_the_final_norm(capsys):
    assert not ch06.verify_pre_ln_slope_without_final_norm(-0.52)
    assert "final_norm=False" in capsys.readouterr().out


@pytest.mark.parametrize("value", [None, "0.0", True, [0.0], torch.tensor([0.0, 1.0])])
def test_slope_band_reports_non_numbers_without_raising(value, capsys):
    result = ch06.verify_pre_ln_slope_without_final_norm(value)
    assert not result
    out = capsys.readouterr().out
    assert ("not attempted yet" in out) == (value is None)


def test_the_band_holds_for_the_real_measurement():
    """Measure what the exercise asks (3 seeds, depths 2-24): inside the band without the
    final norm, far outside with it."""

    def last_grad(depth, final_norm, seed):
        return ch06.last_layer_w2_gradient(depth, True, final_norm, seed)

    depths = [2, 4, 8, 16, 24]
    slopes = {
        final_norm: ch06.reference_log_log_slope(
            depths, [np.mean([last_grad(d, final_norm, s) for s in range(3)]) for d in depths]
        )
        for final_norm in (False, True)
    }
    assert ch06.verify_pre_ln_slope_without_final_norm(slopes[False], verbose=False)
    assert not ch06.verify_pre_ln_slope_without_final_norm(slopes[True], verbose=False)


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, references
# --------------------------------------------------------------------------------------------

CHECKS = [
    ch06.check_layer_norm_backward,
    ch06.check_peri_ln_block,
    ch06.check_relative_updates,
    ch06.check_log_log_slope,
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
        (ch06.check_layer_norm_backward, ch06.reference_layer_norm_backward),
        (ch06.check_peri_ln_block, ch06.reference_peri_ln_block),
        (ch06.check_relative_updates, ch06.reference_relative_updates),
        (ch06.check_log_log_slope, ch06.reference_log_log_slope),
    ],
)
def test_reference_passes_its_own_check_on_several_cases(check, reference):
    result = check(reference, verbose=False)
    assert result
    assert result.cases_run >= 5


# --------------------------------------------------------------------------------------------
# peri_ln_block
# --------------------------------------------------------------------------------------------


def test_peri_ln_block_accepts_correct():
    assert ch06.check_peri_ln_block(
        lambda x, sublayer, input_norm, output_norm: x + output_norm(sublayer(input_norm(x))),
        verbose=False,
    )


@pytest.mark.parametrize(
    "wrong",
    [
        # Pre-LN: no norm on the branch's output
        lambda x, sublayer, input_norm, output_norm: x + sublayer(input_norm(x)),
        # Post-LN: the norm after the residual sum, none on the branch's input
        lambda x, sublayer, input_norm, output_norm: output_norm(x + sublayer(x)),
        # the second norm after the add (Pre-LN followed by a Post-LN norm)
        lambda x, sublayer, input_norm, output_norm: output_norm(x + sublayer(input_norm(x))),
        # the two norms swapped
        lambda x, sublayer, input_norm, output_norm: x + input_norm(sublayer(output_norm(x))),
        # only the output norm
        lambda x, sublayer, input_norm, output_norm: x + output_norm(sublayer(x)),
        # the residual taken from the normalised input
        lambda x, sublayer, input_norm, output_norm: (
            input_norm(x) + output_norm(sublayer(input_norm(x)))
        ),
    ],
)
def test_peri_ln_block_rejects_wrong(wrong):
    assert not ch06.check_peri_ln_block(wrong, verbose=False)


def test_peri_ln_reference_passes_on_several_cases():
    result = ch06.check_peri_ln_block(ch06.reference_peri_ln_block, verbose=False)
    assert result and result.cases_run >= 5


def test_peri_ln_output_norm_bounds_the_branch():
    """With gain 1 and bias 0, what the Peri-LN branch adds has rms 1, whatever the sub-layer."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    big = nn.Linear(16, 16)
    with torch.no_grad():
        big.weight.mul_(100)
    added = ch06.reference_peri_ln_block(x, big, nn.LayerNorm(16), nn.LayerNorm(16)) - x
    torch.testing.assert_close(added.pow(2).mean(-1).sqrt(), torch.ones(4), atol=1e-3, rtol=0)


# --------------------------------------------------------------------------------------------
# depth_slope: the measuring function, called on hidden configurations
# --------------------------------------------------------------------------------------------


def _last_layer_gradient(num_layers, norm_first, final_norm, seed, which="W2"):
    """The last layer's ‖∂L/∂W₂‖ (or W₁'s, or the whole layer's) in section 6.3's setup."""
    encoder = ch06._encoder_after_backward(num_layers, norm_first, final_norm, seed)
    layer = encoder.layers[-1]
    if which == "W2":
        return layer.feed_forward.output_proj.weight.grad.norm().item()
    if which == "W1":
        return layer.feed_forward.hidden_proj.weight.grad.norm().item()
    return torch.stack([p.grad.norm() for p in layer.parameters()]).norm().item()  # "layer"


def _measure(depths, norm_first, final_norm, seeds=(0, 1, 2), which="W2"):
    gradients = [
        float(np.mean([_last_layer_gradient(d, norm_first, final_norm, s, which) for s in seeds]))
        for d in depths
    ]
    return float(np.polyfit(np.log(depths), np.log(gradients), 1)[0]), gradients


def depth_slope_correct(depths, norm_first, final_norm):
    return _measure(depths, norm_first, final_norm)


def depth_slope_numpy_types(depths, norm_first, final_norm):  # NumPy results are fine
    slope, gradients = _measure(depths, norm_first, final_norm)
    return np.float64(slope), np.array(gradients)


def depth_slope_other_seeds(depths, norm_first, final_norm):  # not the seeds asked for
    return _measure(depths, norm_first, final_norm, seeds=(7, 8, 9))


def depth_slope_w1(depths, norm_first, final_norm):  # the first feed-forward matrix
    return _measure(depths, norm_first, final_norm, which="W1")


def depth_slope_whole_layer(depths, norm_first, final_norm):  # every parameter of the layer
    return _measure(depths, norm_first, final_norm, which="layer")


def depth_slope_typed_zero(depths, norm_first, final_norm):  # the measured number, typed in
    return 0.0


def depth_slope_typed_post_ln(depths, norm_first, final_norm):  # the chapter's Post-LN slope
    return -0.02


def depth_slope_slope_only(depths, norm_first, final_norm):  # the slope without the gradients
    return _measure(depths, norm_first, final_norm)[0]


def depth_slope_ignores_final_norm(depths, norm_first, final_norm):
    return depth_slope_correct(depths, norm_first, final_norm=norm_first)  # the default


def depth_slope_always_pre_ln(depths, norm_first, final_norm):
    return depth_slope_correct(depths, True, final_norm)


def depth_slope_swapped_axes(depths, norm_first, final_norm):
    _, gradients = _measure(depths, norm_first, final_norm)
    return float(np.polyfit(np.log(gradients), np.log(depths), 1)[0]), gradients


def test_depth_slope_accepts_correct():
    assert ch06.check_depth_slope(depth_slope_correct, verbose=False)
    assert ch06.check_depth_slope(depth_slope_numpy_types, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        depth_slope_typed_zero,
        depth_slope_typed_post_ln,
        depth_slope_slope_only,
        depth_slope_ignores_final_norm,
        depth_slope_always_pre_ln,
        depth_slope_swapped_axes,
        depth_slope_other_seeds,
        depth_slope_w1,
        depth_slope_whole_layer,
    ],
)
def test_depth_slope_rejects_wrong(wrong):
    assert not ch06.check_depth_slope(wrong, verbose=False)


@pytest.mark.parametrize("value", [0.0, -0.53, None])
def test_depth_slope_rejects_a_number_instead_of_a_function(value, capsys):
    result = ch06.check_depth_slope(value)
    assert not result
    assert "expected a function" in capsys.readouterr().out


def test_depth_slope_stub_and_misnamed_parameter_are_reported(capsys):
    def stub(depths, norm_first, final_norm):
        raise NotImplementedError

    assert not ch06.check_depth_slope(stub)
    assert "not attempted yet" in capsys.readouterr().out

    def misnamed(depths, pre_ln, final_norm):
        return 0.0

    assert not ch06.check_depth_slope(misnamed, verbose=False)


def test_depth_slope_reference_values():
    """What the hidden cases expect: Pre-LN about 0 without its final norm, about -1/2 with it,
    Post-LN about 0."""
    assert abs(ch06.reference_depth_slope([2, 4, 8, 16], True, False)[0]) < 0.15
    assert -0.7 < ch06.reference_depth_slope([2, 4, 8, 16], True, True)[0] < -0.3
    assert abs(ch06.reference_depth_slope([3, 6, 12], False, True)[0]) < 0.15
    slope, gradients = ch06.reference_depth_slope([3, 6, 12], True, True)
    assert len(gradients) == 3 and math.isclose(
        slope, ch06.reference_log_log_slope([3, 6, 12], gradients)
    )


def test_w1_and_w2_are_close_so_the_check_compares_gradients_at_fixed_seeds():
    """W₁ and W₂ of the last layer get gradients of about the same size (within 10 %), so a
    slope alone could not tell them apart; at the same seeds the averaged gradients differ by
    more than the check's tolerance at some depth of every case it runs."""
    for case in ch06._depth_slope_cases():
        _, w2 = depth_slope_correct(**case)
        _, w1 = depth_slope_w1(**case)
        gaps = [abs(a / b - 1) for a, b in zip(w1, w2)]
        assert max(gaps) < 0.1, (case, gaps)
        assert max(gaps) > 5 * ch06.DEPTH_GRADIENT_RTOL, (case, gaps)


def test_depth_slope_hints_at_w1_and_at_the_seeds():
    result = ch06.check_depth_slope(depth_slope_w1, verbose=False)
    assert "hint" in result.message and "output_proj" in result.message


def _measure_with_norm_study(depths, norm_first, final_norm, loss_kind="random readout"):
    """The reader's route: companion.norm_study's setup, as the exercise suggests."""
    from companion import norm_study

    gradients = []
    for depth in depths:
        per_seed = []
        for seed in (0, 1, 2):
            encoder = norm_study.init_encoder(depth, norm_first, seed, final_norm=final_norm)
            x, loss_fn = norm_study.init_inputs(seed, loss_kind)
            loss_fn(encoder(x)).backward()
            per_seed.append(encoder.layers[-1].feed_forward.output_proj.weight.grad.norm().item())
        gradients.append(float(np.mean(per_seed)))
    return float(np.polyfit(np.log(depths), np.log(gradients), 1)[0]), gradients


def test_depth_slope_accepts_the_norm_study_route():
    assert ch06.check_depth_slope(_measure_with_norm_study, verbose=False)


def test_depth_slope_rejects_the_cross_entropy_loss():
    """Section 6.6.1's other loss (init_inputs(seed, "cross-entropy")) is not section 6.3's."""

    def cross_entropy(depths, norm_first, final_norm):
        return _measure_with_norm_study(depths, norm_first, final_norm, "cross-entropy")

    assert not ch06.check_depth_slope(cross_entropy, verbose=False)
