"""Chapter 6 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import fractions
import importlib
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


def ln_backward_gain_after_projection(x, gain, grad_out, eps):  # γ applied to the result, not to δ
    return gain * ln_backward_correct(x, torch.ones_like(gain), grad_out, eps)


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


def ln_backward_aten_kernels(x, gain, grad_out, eps):  # PyTorch's own backward kernel
    d = x.shape[-1]
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [d], gain, None, eps)
    return torch.ops.aten.native_layer_norm_backward(
        grad_out, x, [d], mean, rstd, gain, None, [True, False, False]
    )[0]


def ln_backward_aten_backward_only(x, gain, grad_out, eps):  # statistics by hand, kernel for ∂x
    d = x.shape[-1]
    mean = x.mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps)
    return torch.ops.aten.native_layer_norm_backward(
        grad_out, x, [d], mean, rstd, gain, None, [True, False, False]
    )[0]


@pytest.mark.parametrize("kernel", [ln_backward_aten_kernels, ln_backward_aten_backward_only])
def test_layer_norm_backward_refuses_the_aten_kernels(kernel):
    """Outside the check the kernels give the right gradient without autograd (so the test is
    not vacuous); inside it they are refused by name, and work again afterwards."""
    case = ch06._layer_norm_backward_cases()[1]
    torch.testing.assert_close(kernel(**case), ch06.reference_layer_norm_backward(**case))
    result = ch06.check_layer_norm_backward(kernel, verbose=False)
    assert not result
    assert "native_layer_norm" in result.message and "by the formula" in result.message
    torch.testing.assert_close(kernel(**case), ch06.reference_layer_norm_backward(**case))


def test_layer_norm_backward_accepts_the_formula():
    assert ch06.check_layer_norm_backward(ln_backward_correct, verbose=False)


def test_layer_norm_backward_accepts_renamed_parameters():
    """The check calls the function by position, in the stub's order (review rv06c)."""

    def renamed(inputs, g, go, epsilon):
        return ln_backward_correct(inputs, g, go, epsilon)

    assert ch06.check_layer_norm_backward(renamed, verbose=False)


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


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (ln_backward_constant_statistics, "constants"),
        (ln_backward_no_mean_term, "term from the mean"),
        (ln_backward_no_variance_term, "term from D"),
        (ln_backward_no_gain, "gain is missing"),
        (ln_backward_unbiased, "not d - 1"),
        (ln_backward_gain_after_projection, "after the projection"),
    ],
)
def test_layer_norm_backward_names_the_classic_slips(wrong, says):
    result = ch06.check_layer_norm_backward(wrong, verbose=False)
    assert not result
    assert says in result.message, result.message


def test_layer_norm_backward_hint_is_silent_on_other_mistakes():
    result = ch06.check_layer_norm_backward(ln_backward_eps_dropped, verbose=False)
    assert not result and "hint" not in result.message, result.message


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


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (relative_updates_ratio_of_means, "ratio of means"),
        (relative_updates_divides_by_next, "‖x_l‖"),
    ],
)
def test_relative_updates_names_the_classic_slips(wrong, says):
    result = ch06.check_relative_updates(wrong, verbose=False)
    assert not result
    assert says in result.message, result.message


def test_relative_updates_other_slips_get_no_hint():
    result = ch06.check_relative_updates(relative_updates_all_states, verbose=False)
    assert not result and "hint" not in result.message, result.message


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
# stream_size_slope: the measuring function, called on hidden configurations
# --------------------------------------------------------------------------------------------


def test_reference_slope_of_an_exact_power_law():
    depths = np.array([2.0, 4, 8, 16, 24])
    assert math.isclose(ch06.reference_log_log_slope(depths, 3 * depths**-0.5), -0.5)


def _stream(depth, norm_first, seed, final_norm=False, per_token=False, per_token_d=False):
    """Section 6.3's encoder output at initialisation, the reader's route (norm_study)."""
    from companion import norm_study

    encoder = norm_study.init_encoder(depth, norm_first, seed, final_norm=final_norm)
    x, _ = norm_study.init_inputs(seed)
    with torch.no_grad():
        y = encoder(x)  # (8, 16, 64)
    if per_token_d:  # mean over tokens of the LayerNorm divisor D (eps 1e-6: any small eps)
        return (y.var(dim=-1, unbiased=False) + 1e-6).sqrt().mean().item()
    if per_token:  # mean over tokens of ‖y‖ / √d
        return (y.norm(dim=-1) / math.sqrt(y.shape[-1])).mean().item()
    return y.pow(2).mean().sqrt().item()


def _measure(depths, norm_first, seeds=(0, 1, 2), swapped=False, **options):
    sizes = [float(np.mean([_stream(d, norm_first, s, **options) for s in seeds])) for d in depths]
    if swapped:  # log depth against log size
        return float(np.polyfit(np.log(sizes), np.log(depths), 1)[0]), sizes
    return float(np.polyfit(np.log(depths), np.log(sizes), 1)[0]), sizes


def stream_correct(depths, norm_first):
    return _measure(depths, norm_first)


def stream_numpy_types(depths, norm_first):  # NumPy results are fine
    slope, sizes = _measure(depths, norm_first)
    return np.float64(slope), np.array(sizes)


def stream_final_norm_on(depths, norm_first):  # the package default: Pre-LN ends with a norm
    return _measure(depths, norm_first, final_norm=norm_first)


def stream_always_pre_ln(depths, norm_first):
    return _measure(depths, True)


def stream_other_seeds(depths, norm_first):
    return _measure(depths, norm_first, seeds=(1, 2, 3))


def stream_per_token(depths, norm_first):  # a mean of per-token sizes
    return _measure(depths, norm_first, per_token=True)


def stream_per_token_d(depths, norm_first):  # the mean of per-token divisors D
    return _measure(depths, norm_first, per_token_d=True)


def stream_swapped_axes(depths, norm_first):
    return _measure(depths, norm_first, swapped=True)


def stream_typed_half(depths, norm_first):  # the predicted slope, typed in
    _, sizes = _measure(depths, norm_first)
    return 0.5, sizes


def stream_frobenius(depths, norm_first):  # ‖x_2N‖_F, not divided by the number of entries
    slope, sizes = _measure(depths, norm_first)
    return slope, [s * math.sqrt(8 * 16 * 64) for s in sizes]


def stream_per_seed_slopes(depths, norm_first):  # the mean of three fits, not one fit of the mean
    slopes = [_measure(depths, norm_first, seeds=(s,))[0] for s in (0, 1, 2)]
    return float(np.mean(slopes)), _measure(depths, norm_first)[1]


def stream_rounded_slope(depths, norm_first):  # the right slope, typed back to two decimals
    slope, sizes = _measure(depths, norm_first)
    return round(slope, 2), sizes


def stream_chapter_depths_slope(depths, norm_first):  # the slope of the chapter's depths, reused
    return _measure([2, 4, 8, 16, 24], norm_first)[0], _measure(depths, norm_first)[1]


def stream_float64_norm(depths, norm_first):  # right, by another route: float64, ‖y‖_F / √numel
    from companion import norm_study

    sizes = []
    for depth in depths:
        per_seed = []
        for seed in (0, 1, 2):
            encoder = norm_study.init_encoder(depth, norm_first, seed, final_norm=False).double()
            with torch.no_grad():
                y = encoder(norm_study.init_inputs(seed)[0].double())
            per_seed.append((y.norm() / math.sqrt(y.numel())).item())
        sizes.append(sum(per_seed) / 3)
    log_d, log_s = np.log(depths), np.log(sizes)
    slope = ((log_d - log_d.mean()) * (log_s - log_s.mean())).sum() / (
        (log_d - log_d.mean()) ** 2
    ).sum()
    return float(slope), sizes


def test_stream_size_slope_accepts_correct():
    assert ch06.check_stream_size_slope(stream_correct, verbose=False)
    assert ch06.check_stream_size_slope(stream_numpy_types, verbose=False)
    assert ch06.check_stream_size_slope(stream_float64_norm, verbose=False)


@pytest.mark.parametrize(
    "equivalent",
    [
        stream_per_seed_slopes,  # the mean of three per-seed fits
        stream_rounded_slope,  # the measured slope, rounded to two decimals
        lambda depths, norm_first: _pooled_or_per_sequence(depths, norm_first, False),
        lambda depths, norm_first: _pooled_or_per_sequence(depths, norm_first, True),
        lambda depths, norm_first: _stream_seed_average(depths, norm_first, "geometric"),
    ],
)
def test_stream_size_slope_accepts_other_averages(equivalent):
    """The right measurement, averaged in another order, is the same science: it passes."""
    result = ch06.check_stream_size_slope(equivalent, verbose=False)
    assert result, result.message


def _largest_gap(answer, case):
    slope, sizes = ch06.reference_stream_size_slope(**case)
    other_slope, other_sizes = answer(**case)
    return max(abs(other_slope - slope), *(abs(g - e) for g, e in zip(other_sizes, sizes)))


def test_stream_size_tolerance_lies_between_rounding_and_the_nearest_slip():
    """Float rounding moves no number by 1 % of the tolerance; the other averages stay below
    0.85 of it in every case; each nearest slip exceeds 1.15 times it in some case."""
    cases = ch06._stream_size_cases()
    atol = ch06.STREAM_SIZE_ATOL
    for case in cases:
        assert _largest_gap(stream_float64_norm, case) < atol / 100, case
    equivalents = [
        stream_per_seed_slopes,
        lambda depths, norm_first: _pooled_or_per_sequence(depths, norm_first, False),
        lambda depths, norm_first: _pooled_or_per_sequence(depths, norm_first, True),
        lambda depths, norm_first: _stream_seed_average(depths, norm_first, "geometric"),
    ]
    for answer in equivalents:
        assert max(_largest_gap(answer, case) for case in cases) < 0.85 * atol
    slips = [
        stream_per_token,
        stream_std,
        stream_typed_half,
        stream_other_seeds,
        lambda depths, norm_first: _stream_seed_average(depths, norm_first, "median"),
    ]
    for answer in slips:
        assert max(_largest_gap(answer, case) for case in cases) > 1.15 * atol


@pytest.mark.parametrize(
    "wrong",
    [
        stream_final_norm_on,
        stream_always_pre_ln,
        stream_other_seeds,
        stream_per_token,
        stream_swapped_axes,
        stream_typed_half,
        stream_frobenius,
        stream_chapter_depths_slope,
    ],
)
def test_stream_size_slope_rejects_wrong(wrong):
    assert not ch06.check_stream_size_slope(wrong, verbose=False)


@pytest.mark.parametrize("value", [0.5, (0.5, [1.0, 2.0, 3.0]), None])
def test_stream_size_slope_rejects_a_number_instead_of_a_function(value, capsys):
    result = ch06.check_stream_size_slope(value)
    assert not result
    assert "expected a function" in capsys.readouterr().out


def test_stream_size_slope_stub_and_misnamed_parameter_are_reported(capsys):
    def stub(depths, norm_first):
        raise NotImplementedError  # your code here

    assert not ch06.check_stream_size_slope(stub)
    assert "not attempted yet" in capsys.readouterr().out

    def misnamed(depth, norm_first):
        return stream_correct(depth, norm_first)

    assert not ch06.check_stream_size_slope(misnamed, verbose=False)


def stream_std(depths, norm_first):  # the standard deviation of all entries, not their rms
    sizes = []
    for depth in depths:
        per_seed = []
        for seed in (0, 1, 2):
            from companion import norm_study

            encoder = norm_study.init_encoder(depth, norm_first, seed, final_norm=False)
            with torch.no_grad():
                per_seed.append(encoder(norm_study.init_inputs(seed)[0]).std().item())
        sizes.append(float(np.mean(per_seed)))
    return float(np.polyfit(np.log(depths), np.log(sizes), 1)[0]), sizes


def stream_mixed_logs(depths, norm_first):  # log10 of the sizes against ln of the depths
    _, sizes = _measure(depths, norm_first)
    return float(np.polyfit(np.log(depths), np.log10(sizes), 1)[0]), sizes


def test_stream_size_slope_rejects_mixed_logarithms_and_names_it():
    result = ch06.check_stream_size_slope(stream_mixed_logs, verbose=False)
    assert not result
    assert "same logarithm on both axes" in result.message, result.message


def test_stream_size_slope_rejects_std_and_names_it():
    result = ch06.check_stream_size_slope(stream_std, verbose=False)
    assert not result
    assert "standard deviation" in result.message, result.message


def test_stream_size_slope_per_token_hint_is_not_the_std_one():
    """Section 6.7.3's stream size (a mean of per-token ‖x‖/√d) is refused: the exercise asks
    for the root mean square of all entries, and the hint says the answer is right in spirit
    and points there."""
    result = ch06.check_stream_size_slope(stream_per_token, verbose=False)
    assert not result
    assert "standard deviation" not in result.message, result.message
    assert "right in spirit" in result.message, result.message
    assert "root mean square of" in result.message, result.message
    assert "6.7.3" in result.message, result.message


def test_stream_size_slope_per_token_divisor_is_named_right_in_spirit():
    """The mean of the tokens' LayerNorm divisors D, what the final norm divides each token by,
    is refused (the statement names one size per model), with a hint that says why."""
    result = ch06.check_stream_size_slope(stream_per_token_d, verbose=False)
    assert not result
    assert "right in spirit" in result.message and "divisor D" in result.message, result.message


def _pooled_or_per_sequence(depths, norm_first, per_sequence=False):
    """Right measurement, averaged in another order (about 1e-3 from the reference)."""
    from companion import norm_study

    sizes = []
    for depth in depths:
        values = []
        for seed in (0, 1, 2):
            encoder = norm_study.init_encoder(depth, norm_first, seed, final_norm=False)
            with torch.no_grad():
                y = encoder(norm_study.init_inputs(seed)[0])
            values.append(
                y.pow(2).mean(dim=(1, 2)).sqrt().mean().item()
                if per_sequence
                else y.pow(2).mean().item()
            )
        sizes.append(float(np.mean(values)) if per_sequence else float(np.sqrt(np.mean(values))))
    return float(np.polyfit(np.log(depths), np.log(sizes), 1)[0]), sizes


def test_stream_size_prediction_accepts_plus_a_half():
    for value in (0.5, 0.53, 0.57, 0.44, np.float64(0.45), 1 / 2):
        assert ch06.check_stream_size_prediction(value, verbose=False), value


@pytest.mark.parametrize("wrong", [-0.5, -0.52, 0, 0.0, 1, 1.0, 0.25, 2, 0.38, 0.35, 0.65, 0.7])
def test_stream_size_prediction_rejects_classic_slips(wrong):
    result = ch06.check_stream_size_prediction(wrong, verbose=False)
    assert not result
    if wrong < 0:
        assert "opposite signs" in result.message, result.message


@pytest.mark.parametrize("value", [None, "0.5", True, [0.5]])
def test_stream_size_prediction_needs_a_number(value, capsys):
    result = ch06.check_stream_size_prediction(value)
    assert not result
    out = capsys.readouterr().out
    assert ("not attempted yet" in out) == (value is None), out


def test_stream_size_slope_names_a_norm_over_all_entries():
    """‖x‖_F instead of the RMS: the slope is the same, so the hint must name the constant factor."""
    result = ch06.check_stream_size_slope(stream_frobenius, verbose=False)
    assert not result
    assert "√numel" in result.message and "final_norm=False" not in result.message, result.message


def test_stream_size_slope_hints_at_the_final_norm():
    result = ch06.check_stream_size_slope(stream_final_norm_on, verbose=False)
    assert "final_norm=False" in result.message


def test_stream_size_slope_hints_at_an_ignored_norm_first():
    result = ch06.check_stream_size_slope(stream_always_pre_ln, verbose=False)
    assert not result
    assert "norm_first the check passes" in result.message, result.message


def stream_typed_constants(depths, norm_first):  # numbers typed in, not measured
    return (0.5 if norm_first else 0.0), [1.0] * len(depths)


def test_stream_size_slope_rejects_typed_numbers_with_their_own_hint():
    result = ch06.check_stream_size_slope(stream_typed_constants, verbose=False)
    assert not result
    assert "measure" in result.message and "final_norm=False" not in result.message


def test_stream_size_reference_values():
    """Pre-LN's stream grows about like the square root of the depth; Post-LN's stays at 1;
    and over the chapter's depths the two slopes, stream size and last-layer gradient, cancel."""
    depths = [2, 4, 8, 16, 24]
    size_slope, sizes = ch06.reference_stream_size_slope(depths, True)
    assert 0.4 < size_slope < 0.6 and sizes[-1] > 3 * sizes[0], (size_slope, sizes)
    post_slope, post_sizes = ch06.reference_stream_size_slope([3, 6, 12], False)
    assert abs(post_slope) < 1e-3 and all(abs(s - 1) < 1e-3 for s in post_sizes)
    gradients = [
        np.mean([ch06.last_layer_w2_gradient(d, True, True, s) for s in range(3)]) for d in depths
    ]
    gradient_slope = ch06.reference_log_log_slope(depths, gradients)
    assert abs(size_slope + gradient_slope) < 0.1, (size_slope, gradient_slope)


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, references
# --------------------------------------------------------------------------------------------

CHECKS = [
    ch06.check_layer_norm_backward,
    ch06.check_peri_ln_block,
    ch06.check_relative_updates,
    ch06.check_stream_size_slope,
    ch06.check_adam_second_step,
    ch06.check_input_change_by_layer,
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
        (ch06.check_adam_second_step, ch06.reference_adam_second_step),
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


def _peri_in_place(x, sublayer, input_norm, output_norm):
    x += output_norm(sublayer(input_norm(x)))
    return x


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        # the right values, but the residual path cut out of autograd
        (
            lambda x, sublayer, input_norm, output_norm: (
                x.detach() + output_norm(sublayer(input_norm(x)))
            ),
            "x of `x + ...` detached",
        ),
        # the right values, but the branch cut out of autograd: the hint names the branch
        (
            lambda x, sublayer, input_norm, output_norm: (
                x + output_norm(sublayer(input_norm(x))).detach()
            ),
            "Is the branch detached",
        ),
        # the right values, but the caller's x overwritten
        (_peri_in_place, "in place"),
    ],
)
def test_peri_ln_block_rejects_forward_equivalent_slips(wrong, says):
    """Forward-only checks accept these (review rv06c); the gradient and input checks do not."""
    result = ch06.check_peri_ln_block(wrong, verbose=False)
    assert not result and says in result.message, result.message


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


def _stream_seed_average(depths, norm_first, how):
    """Right measurement, but the three seeds' RMS averaged by ``how`` (not the plain mean)."""
    from companion import norm_study

    sizes = []
    for depth in depths:
        rms = []
        for seed in (0, 1, 2):
            encoder = norm_study.init_encoder(depth, norm_first, seed, final_norm=False)
            with torch.no_grad():
                rms.append(encoder(norm_study.init_inputs(seed)[0]).pow(2).mean().sqrt().item())
        sizes.append(float(np.exp(np.mean(np.log(rms))) if how == "geometric" else np.median(rms)))
    return float(np.polyfit(np.log(depths), np.log(sizes), 1)[0]), sizes


def test_stream_size_slope_names_the_median():
    """Averaging the seeds by their median is refused (the exercise asks for the plain mean),
    with a hint that names what was done instead of pointing at the setup."""
    result = ch06.check_stream_size_slope(
        lambda depths, norm_first: _stream_seed_average(depths, norm_first, "median"),
        verbose=False,
    )
    assert not result
    assert "another order" in result.message and "median" in result.message, result.message
    assert "use seeds 0, 1 and 2" not in result.message, result.message


def peri_ln_as_pre_ln(x, sublayer, input_norm, output_norm):  # output norm forgotten: Pre-LN
    return x + sublayer(input_norm(x))


@pytest.mark.parametrize(
    "value", [0.01, np.float64(0.0099), 0.0105, 1e-2, fractions.Fraction(1, 100), np.float32(0.01)]
)
def test_peri_ln_gradient_scale_accepts_one_hundredth(value):
    assert ch06.check_peri_ln_gradient_scale(value, verbose=False), value
    assert ch06.check_peri_ln_gradient_scale(value, ch06.reference_peri_ln_block, verbose=False), (
        value
    )


@pytest.mark.parametrize(
    ("wrong", "says"),
    [(1, "how far must a weight move"), (1.0, "how far"), (100, "Pre-LN"), (0.1, "√"),
     (0.0, "d(output)/dW"), (1e-4, "d(output)/dW"), (-0.01, "d(output)/dW"),
     (1 / 64, "d(output)/dW"), (0.0125, "d(output)/dW")],
)  # fmt: skip
def test_peri_ln_gradient_scale_rejects_classic_slips(wrong, says):
    result = ch06.check_peri_ln_gradient_scale(wrong, verbose=False)
    assert not result
    assert says in result.message, result.message


@pytest.mark.parametrize("value", [None, "1", True, [1.0]])
def test_peri_ln_gradient_scale_needs_a_number(value, capsys):
    result = ch06.check_peri_ln_gradient_scale(value)
    assert not result
    out = capsys.readouterr().out
    assert ("not attempted yet" in out) == (value is None), out


def test_peri_ln_gradient_scale_measures_the_readers_block():
    """Given the block, the check measures the weight gradient's ratio: 0.0100 for Peri-LN;
    a block without the output norm (Pre-LN) gives 1 and fails."""
    good = ch06.check_peri_ln_gradient_scale(0.01, ch06.reference_peri_ln_block, verbose=False)
    assert good and "is 0.0100 times" in good.message, good.message
    bad = ch06.check_peri_ln_gradient_scale(0.01, peri_ln_as_pre_ln, verbose=False)
    assert not bad and "check your block" in bad.message, bad.message


@pytest.mark.parametrize(
    "wrong",
    [
        # the residual path detached: the weight gradient still scales by 1/100
        lambda x, sublayer, input_norm, output_norm: (
            x.detach() + output_norm(sublayer(input_norm(x)))
        ),
        # the two norms swapped: fresh norms are identical, so the measure alone cannot tell
        lambda x, sublayer, input_norm, output_norm: x + input_norm(sublayer(output_norm(x))),
    ],
)
def test_peri_ln_gradient_scale_runs_the_block_check(wrong):
    """A wrong block whose weight gradient scales right gets no ✅ (review s10rv06 (c))."""
    result = ch06.check_peri_ln_gradient_scale(0.01, wrong, verbose=False)
    assert not result and "fails exercise 2's check" in result.message, result.message


@pytest.mark.parametrize("value", [None, "0.01"])
def test_peri_ln_gradient_scale_does_not_measure_before_a_prediction(value):
    """Without a predicted number the check must not print the measured ratio (the answer)."""
    result = ch06.check_peri_ln_gradient_scale(value, ch06.reference_peri_ln_block, verbose=False)
    assert not result
    assert "Measured" not in result.message and "0.0100" not in result.message, result.message


def test_peri_ln_gradient_scale_with_an_unwritten_block():
    def stub(x, sublayer, input_norm, output_norm):
        raise NotImplementedError

    result = ch06.check_peri_ln_gradient_scale(0.01, stub, verbose=False)
    assert result and "not written yet" in result.message, result.message


def test_stream_size_slope_rejects_the_end_point_slope():
    """Two end points instead of a least-squares fit: equal for evenly spaced log depths, about
    0.017 off on the check's unevenly spaced case, which names the slip."""

    def end_points(depths, norm_first):
        _, sizes = ch06.reference_stream_size_slope(depths, norm_first)
        slope = math.log(sizes[-1] / sizes[0]) / math.log(depths[-1] / depths[0])
        return slope, sizes

    result = ch06.check_stream_size_slope(end_points, verbose=False)
    assert not result
    assert "first and the last point" in result.message, result.message


# --------------------------------------------------------------------------------------------
# adam_second_step (exercise 5)
# --------------------------------------------------------------------------------------------


def adam_by_the_box(grad1, grad2, lr, betas, eps):
    beta1, beta2 = betas
    m = v = 0
    for t, grad in enumerate((grad1, grad2), start=1):
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad**2
        step = -lr * (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
    return step


def adam_gradient_descent(grad1, grad2, lr, betas, eps):
    return -lr * grad2


def adam_first_step_formula(grad1, grad2, lr, betas, eps):  # forgets g1: scale-free step
    return -lr * grad2 / (grad2.abs() + eps)


def _moments(grad1, grad2, betas):
    beta1, beta2 = betas
    m2 = beta1 * (1 - beta1) * grad1 + (1 - beta1) * grad2
    v2 = beta2 * (1 - beta2) * grad1**2 + (1 - beta2) * grad2**2
    return m2, v2


def adam_step1_correction(grad1, grad2, lr, betas, eps):
    m2, v2 = _moments(grad1, grad2, betas)
    return -lr * (m2 / (1 - betas[0])) / ((v2 / (1 - betas[1])).sqrt() + eps)


def adam_no_bias_correction(grad1, grad2, lr, betas, eps):
    m2, v2 = _moments(grad1, grad2, betas)
    return -lr * m2 / (v2.sqrt() + eps)


def adam_wrong_sign(grad1, grad2, lr, betas, eps):
    return -adam_by_the_box(grad1, grad2, lr, betas, eps)


def adam_betas_swapped(grad1, grad2, lr, betas, eps):  # passed at step 1, where betas cancel
    return adam_by_the_box(grad1, grad2, lr, betas[::-1], eps)


def adam_eps_inside(grad1, grad2, lr, betas, eps):
    m2, v2 = _moments(grad1, grad2, betas)
    return -lr * (m2 / (1 - betas[0] ** 2)) / (v2 / (1 - betas[1] ** 2) + eps).sqrt()


def adam_eps_left_out(grad1, grad2, lr, betas, eps):
    m2, v2 = _moments(grad1, grad2, betas)
    return -lr * (m2 / (1 - betas[0] ** 2)) / (v2 / (1 - betas[1] ** 2)).sqrt()


def adam_by_torch_optim(grad1, grad2, lr, betas, eps, optimizer=torch.optim.Adam):
    weight = torch.nn.Parameter(torch.zeros_like(grad1))
    opt = optimizer([weight], lr=lr, betas=betas, eps=eps)
    weight.grad = grad1.clone()
    opt.step()
    before = weight.detach().clone()
    weight.grad = grad2.clone()
    opt.step()
    return weight.detach() - before


def adam_by_adamax(grad1, grad2, lr, betas, eps):
    return adam_by_torch_optim(grad1, grad2, lr, betas, eps, torch.optim.Adamax)


def adam_by_functional(grad1, grad2, lr, betas, eps):
    import torch.optim._functional as functional

    param, m, v = torch.zeros_like(grad1), torch.zeros_like(grad1), torch.zeros_like(grad1)
    steps = [torch.tensor(0.0)]
    out = None
    for grad in (grad1, grad2):
        before = param.clone()
        functional.adam([param], [grad], [m], [v], [], steps, amsgrad=False, beta1=betas[0],
               beta2=betas[1], lr=lr, weight_decay=0.0, eps=eps, maximize=False)  # fmt: skip
        out = param - before
    return out


def adam_kingma_ba_efficient(grad1, grad2, lr, betas, eps):
    """Kingma & Ba's "efficient" form of Algorithm 1: the bias corrections folded into the
    step size, ε added to √v (not √v̂): a legitimate Adam, but not the box's formulas."""
    (b1, b2), m, v = betas, torch.zeros_like(grad1), torch.zeros_like(grad1)
    for t, grad in enumerate((grad1, grad2), start=1):
        m, v = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad**2
        step = -lr * math.sqrt(1 - b2**t) / (1 - b1**t) * m / (v.sqrt() + eps)
    return step


def test_adam_reference_is_torch_optim_adam():
    for case in ch06._adam_second_step_cases():
        expected = adam_by_torch_optim(**case)
        assert torch.allclose(
            ch06.reference_adam_second_step(**case), expected, atol=1e-9, rtol=1e-5
        )


def test_adam_second_step_accepts_correct():
    result = ch06.check_adam_second_step(adam_by_the_box, verbose=False)
    assert result, result.message
    assert "for g then g: 1.000; for g then g/10: 0.744" in result.message, result.message


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (adam_gradient_descent, "gradient descent"),
        (adam_first_step_formula, "first step's formula"),
        (adam_step1_correction, "1 - β₁²"),
        (adam_no_bias_correction, "bias correction is missing"),
        (adam_wrong_sign, "wrong sign"),
        (adam_betas_swapped, "swapped"),
        (adam_eps_inside, "after the square root"),
        (adam_eps_left_out, "ε_Adam is missing"),
        (adam_kingma_ba_efficient, "efficient form"),
        (adam_by_torch_optim, "switched off"),
        (adam_by_adamax, "switched off"),
        (adam_by_functional, "switched off"),
    ],
)
def test_adam_second_step_rejects_wrong(wrong, says):
    result = ch06.check_adam_second_step(wrong, verbose=False)
    assert not result
    assert says in result.message, result.message


def test_adam_check_leaves_torch_optim_working():
    ch06.check_adam_second_step(adam_by_torch_optim, verbose=False)
    grad = torch.tensor([2.0, -0.5])
    assert torch.allclose(
        adam_by_torch_optim(grad, grad, 0.1, (0.9, 0.98), 1e-9), torch.tensor([-0.1, 0.1])
    )
    adam_module = importlib.import_module("torch.optim.adam")
    assert torch.optim._functional.adam is adam_module.adam  # restored, not left refusing


@pytest.mark.parametrize(
    "value", [0.744, 0.74, np.float64(0.72), 0.77, fractions.Fraction(3, 4), np.float32(0.75)]
)
def test_adam_step_prediction_accepts_the_ratio(value):
    assert ch06.check_adam_step_prediction(value, verbose=False), value


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (0.1, "gradient descent"),
        (1, "scale-free only"),
        (1.0, "scale-free only"),
        (0.316, "√|g| instead of √(g²)"),
        (0.53, "write m₂"),
        (0.711, "bias correction is missing"),  # review s11rv06c: named, not generic
        (0.71, "bias correction is missing"),
        (0.707, "denominator alone"),  # review s12rv06: √v̂₂/|g₁|, not the missing correction
        (1.005, "not 1 - β"),  # bias correction by 1 - β, not 1 - β²
        (0.788, "swapped"),
        (10, "write m₂"),
        (0, "write m₂"),
    ],
)
def test_adam_step_prediction_rejects_classic_slips(wrong, says):
    result = ch06.check_adam_step_prediction(wrong, verbose=False)
    assert not result
    assert says in result.message, result.message


@pytest.mark.parametrize("value", [None, "1", True, [1.0]])
def test_adam_step_prediction_needs_a_number(value, capsys):
    result = ch06.check_adam_step_prediction(value)
    assert not result
    out = capsys.readouterr().out
    assert ("not attempted yet" in out) == (value is None), out


def test_peri_ln_gradient_scale_reports_a_crashing_block():
    def crashes(x, sublayer, input_norm, output_norm):
        raise RuntimeError("boom")

    result = ch06.check_peri_ln_gradient_scale(0.01, crashes, verbose=False)
    assert not result and "boom" in result.message and "is right, but" in result.message, (
        result.message
    )


def test_peri_ln_prediction_hint_for_100_agrees_with_the_solution():
    """A prediction of 100 is told what grows 100-fold in a Pre-LN branch (the input gradient),
    not that it is the Pre-LN answer: the Pre-LN weight gradient does not change (solution)."""
    result = ch06.check_peri_ln_gradient_scale(100.0, verbose=False)
    assert not result
    assert "with respect to its input" in result.message
    assert "weight gradient does not change" in result.message


def test_per_token_sizes_give_nearly_the_same_slope():
    """The solution says a mean of per-token sizes gives nearly the same slope (it is refused
    for its sizes, which sit slightly below the root mean square of all entries)."""
    for case in ch06._stream_size_cases():
        slope, sizes = ch06.reference_stream_size_slope(**case)
        for answer in (stream_per_token, stream_per_token_d):
            other_slope, other_sizes = answer(**case)
            assert abs(other_slope - slope) < 0.005, (case, other_slope, slope)
            if case["norm_first"]:  # Post-LN's sizes are all 1 either way
                assert all(o < s for o, s in zip(other_sizes, sizes)), (case, other_sizes, sizes)


# --------------------------------------------------------------------------------------------
# answers that edit their inputs in place, or return NumPy values
# --------------------------------------------------------------------------------------------


def ln_backward_in_place(x, gain, grad_out, eps):  # overwrites x and grad_out as it goes
    x.sub_(x.mean(dim=-1, keepdim=True))
    scale = torch.sqrt((x**2).mean(dim=-1, keepdim=True) + eps)
    x.div_(scale)  # x is now x̂
    grad_out.mul_(gain)  # grad_out is now δ
    return (
        grad_out - grad_out.mean(-1, keepdim=True) - x * (grad_out * x).mean(-1, keepdim=True)
    ) / scale


def test_layer_norm_backward_accepts_an_answer_that_edits_its_inputs_in_place():
    assert ch06.check_layer_norm_backward(ln_backward_in_place, verbose=False)


def test_relative_updates_accepts_a_numpy_answer():
    def numpy_answer(stream):
        s = stream.numpy()
        ratio = np.linalg.norm(s[1:] - s[:-1], axis=-1) / np.linalg.norm(s[:-1], axis=-1)
        return ratio.reshape(ratio.shape[0], -1).mean(1)

    assert ch06.check_relative_updates(numpy_answer, verbose=False)


def test_relative_updates_hint_also_names_a_numpy_slip():
    result = ch06.check_relative_updates(
        lambda stream: relative_updates_ratio_of_means(stream).numpy(), verbose=False
    )
    assert not result and "ratio of means" in result.message, result.message


# --------------------------------------------------------------------------------------------
# input_change_by_layer (exercise 6)
# --------------------------------------------------------------------------------------------


def _layer_pairs(model, src, tgt_input, shuffled, pre=False):
    """A learner's hooks: each decoder layer's output (``pre``: its input), for both inputs."""
    outputs = []
    for tokens in (tgt_input, shuffled):
        seen = []
        hooks = [
            layer.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0]))
            if pre
            else layer.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o))
            for layer in model.decoder.layers
        ]
        with torch.no_grad():
            model(src, tokens)
        for hook in hooks:
            hook.remove()
        outputs.append(seen)
    return list(zip(*outputs))


def _layer_input_pairs(model, src, tgt_input, shuffled):
    return _layer_pairs(model, src, tgt_input, shuffled, pre=True)


def input_change_of_inputs(model, src, tgt_input, shuffled, real):  # off by one layer
    return torch.stack(
        [
            (h - s)[real].norm() / h[real].norm()
            for h, s in _layer_input_pairs(model, src, tgt_input, shuffled)
        ]
    )


def input_change_correct(model, src, tgt_input, shuffled, real):
    return torch.stack(
        [
            (h - s)[real].norm() / h[real].norm()
            for h, s in _layer_pairs(model, src, tgt_input, shuffled)
        ]
    )


def input_change_absolute(model, src, tgt_input, shuffled, real):
    return torch.stack(
        [(h - s)[real].norm() for h, s in _layer_pairs(model, src, tgt_input, shuffled)]
    )


def input_change_with_padding(model, src, tgt_input, shuffled, real):
    return torch.stack(
        [(h - s).norm() / h.norm() for h, s in _layer_pairs(model, src, tgt_input, shuffled)]
    )


def input_change_by_shuffled(model, src, tgt_input, shuffled, real):
    return torch.stack(
        [
            (h - s)[real].norm() / s[real].norm()
            for h, s in _layer_pairs(model, src, tgt_input, shuffled)
        ]
    )


def input_change_per_token(model, src, tgt_input, shuffled, real):
    pairs = _layer_pairs(model, src, tgt_input, shuffled)
    return torch.stack(
        [((h - s)[real].norm(dim=-1) / h[real].norm(dim=-1)).mean() for h, s in pairs]
    )


def input_change_with_embeddings(model, src, tgt_input, shuffled, real):
    first = (tgt_input != shuffled)[real].float().mean()  # any extra leading entry
    return torch.cat([first[None], input_change_correct(model, src, tgt_input, shuffled, real)])


@pytest.mark.parametrize(
    "answer",
    [
        input_change_correct,
        lambda model, src, tgt_input, shuffled, real: input_change_correct(
            model, src, tgt_input, shuffled, real
        ).numpy(),
        lambda model, src, tgt_input, shuffled, real: input_change_correct(
            model, src, tgt_input, shuffled, real
        ).tolist(),
        lambda model, src, tgt_input, shuffled, real: list(
            input_change_correct(model, src, tgt_input, shuffled, real)
        ),
        ch06.reference_input_change_by_layer,
    ],
)
def test_input_change_by_layer_accepts_correct(answer):
    assert ch06.check_input_change_by_layer(answer, verbose=False)


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (input_change_absolute, "divide the change"),
        (input_change_with_padding, "padding"),
        (input_change_by_shuffled, "not the shuffled"),
        (input_change_per_token, "per-token ratios"),
        (input_change_with_embeddings, "leave out the embeddings"),
        (input_change_of_inputs, "off by one layer"),  # review s12rv06: a forward pre-hook
    ],
)
def test_input_change_by_layer_rejects_and_names_the_classic_slips(wrong, says):
    result = ch06.check_input_change_by_layer(wrong, verbose=False)
    assert not result
    assert says in result.message, result.message


def test_input_change_cases_leave_the_global_seed_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    ch06.check_input_change_by_layer(ch06.reference_input_change_by_layer, verbose=False)
    assert torch.equal(torch.rand(3), before)


def test_input_change_post_ln_falls_with_depth_and_pre_ln_keeps_it():
    """The chapter's point: at initialisation a Post-LN decoder dilutes its input layer by layer."""
    from companion import norm_study

    src, tgt_input, _, real = norm_study.probe_batch()
    shuffled = ch06.shuffled_digits(tgt_input, real)
    changes = {}
    for norm_first in (False, True):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = norm_study.build_model(6, norm_first)
        changes[norm_first] = ch06.reference_input_change_by_layer(
            model, src, tgt_input, shuffled, real
        )
    assert torch.all(changes[False][1:] < changes[False][:-1]), changes
    assert changes[False][-1] < 0.1 < 0.3 < changes[True][-1], changes


def test_input_change_message_names_the_model_in_one_line():
    result = ch06.check_input_change_by_layer(input_change_absolute, verbose=False)
    assert "model: Transformer module with" in result.message, result.message
    assert "(src_embedding)" not in result.message, result.message
