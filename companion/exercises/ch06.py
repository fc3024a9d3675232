"""Exercises of chapter 6, "Pre-LN vs Post-LN, reproduced by experiment".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several shapes, plus the edge cases that
separate a right answer from a nearly right one), and returns a
:class:`~companion.exercises._checker.CheckResult` that is truthy when every case matches.
The checks call your function with keyword arguments, so keep the parameter names of the
stub in the notebook.

===============================  ==================================================
exercise                         check
===============================  ==================================================
the gradient through LayerNorm   :func:`check_layer_norm_backward`
a Peri-LN (sandwich) block       :func:`check_peri_ln_block`
relative updates (6.6.3)         :func:`check_relative_updates`
a depth slope, measured          :func:`check_log_log_slope`,
                                 :func:`check_depth_slope` (the measuring function),
                                 :func:`verify_pre_ln_slope_without_final_norm`
===============================  ==================================================
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from companion._validation import check_callable as _check_callable
from companion.exercises._checker import (
    Case,
    CheckResult,
    report,
    run_check,
    seeded_generator,
)
from companion.exercises.ch02 import autograd_forbidden

__all__ = [
    "check_layer_norm_backward",
    "check_peri_ln_block",
    "check_relative_updates",
    "check_depth_slope",
    "check_log_log_slope",
    "verify_pre_ln_slope_without_final_norm",
    "PRE_LN_NO_FINAL_NORM_SLOPE_BAND",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: the gradient through a LayerNorm
# --------------------------------------------------------------------------------------------


def reference_layer_norm_backward(x: Tensor, gain: Tensor, grad_out: Tensor, eps: float) -> Tensor:
    r"""The gradient that LayerNorm passes down, :math:`\partial \mathcal{L} / \partial x`, given
    the gradient ``grad_out`` :math:`= \partial \mathcal{L} / \partial y` that arrives at its
    output :math:`y = \gamma \odot \hat{x} + \beta`, with :math:`\hat{x} = (x - \bar{x}) / D` and
    :math:`D = \sqrt{\operatorname{Var}(x) + \varepsilon}` (biased variance, as ``torch.nn.LayerNorm``):

    .. math:: \frac{\partial \mathcal{L}}{\partial x}
              = \frac{1}{D}\Bigl(\delta - \operatorname{mean}(\delta)
                - \hat{x} \odot \operatorname{mean}(\delta \odot \hat{x})\Bigr),
              \qquad \delta = \gamma \odot \frac{\partial \mathcal{L}}{\partial y},

    the means taken over the ``d`` features of each vector. The bias does not enter.

    Args:
        x: shape ``(..., d)``, the LayerNorm's input.
        gain: shape ``(d,)``.
        grad_out: shape ``(..., d)``, like ``x``.
        eps: a small positive number.

    Returns:
        Tensor of shape ``(..., d)``.
    """
    if not isinstance(x, Tensor) or not isinstance(grad_out, Tensor) or x.shape != grad_out.shape:
        raise ValueError(
            f"x and grad_out: expected two tensors of the same shape (..., d), got "
            f"{getattr(x, 'shape', type(x).__name__)} and "
            f"{getattr(grad_out, 'shape', type(grad_out).__name__)}"
        )
    mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
    s = torch.sqrt(((x - mean) ** 2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    x_hat = (x - mean) / s  # (..., d)
    delta = gain * grad_out  # (..., d): the gradient at x̂
    return (
        delta
        - delta.mean(dim=-1, keepdim=True)
        - x_hat * (delta * x_hat).mean(dim=-1, keepdim=True)
    ) / s  # (..., d)


def _layer_norm_backward_cases() -> list[Case]:
    g = seeded_generator(601)
    cases: list[Case] = []
    for shape, scale, eps, dtype in [
        ((8,), 3.0, 1e-5, torch.float32),  # one vector
        ((5, 16), 1.0, 1e-5, torch.float32),  # a sequence of 5 tokens
        ((2, 3, 32), 10.0, 1e-5, torch.float64),  # a batch of sequences, large values
        ((3, 4), 1.0, 1e-5, torch.float64),  # d = 4: dividing by d - 1 instead of d is 15 % off
        ((4, 8), 0.3, 0.1, torch.float64),  # a large eps: it must sit inside s
    ]:
        d = shape[-1]
        cases.append(
            {
                "x": (scale * torch.randn(shape, generator=g) + torch.randn(1, generator=g)).to(
                    dtype
                ),
                "gain": (1 + 0.5 * torch.randn(d, generator=g)).to(dtype),
                "grad_out": torch.randn(shape, generator=g).to(dtype),
                "eps": eps,
            }
        )
    # grad_out along x̂ itself (and a constant): the two directions the Jacobian removes, so
    # an answer that keeps either one is far off here
    x = torch.randn(3, 12, generator=g, dtype=torch.float64)
    x_hat = (x - x.mean(-1, keepdim=True)) / x.std(-1, correction=0, keepdim=True)
    cases.append({"x": x, "gain": torch.ones(12, dtype=torch.float64),
                  "grad_out": 2 * x_hat + 1.5, "eps": 1e-5})  # fmt: skip
    return cases


_LN_AUTOGRAD_REFUSED = (
    "layer_norm_backward must compute the gradient by the formula: during the check autograd"
    " (torch.autograd.grad, Tensor.backward, torch.func, enable_grad with requires_grad) is"
    " switched off"
)


def check_layer_norm_backward(
    layer_norm_backward: Callable[[Tensor, Tensor, Tensor, float], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``layer_norm_backward(x, gain, grad_out, eps)`` → ``∂L/∂x`` of shape ``(..., d)``
    for ``y = LayerNorm(x)`` with gain ``gain (d,)`` and ``grad_out = ∂L/∂y (..., d)``.

    Your function runs under ``torch.no_grad()`` with autograd switched off
    (:func:`companion.exercises.ch02.autograd_forbidden`): the exercise is the formula, so a
    function that asks autograd for the gradient, even inside ``torch.enable_grad()``, fails.
    """
    _check_callable("layer_norm_backward", layer_norm_backward)

    @functools.wraps(
        layer_norm_backward
    )  # keeps the signature, so a misnamed parameter is reported
    def user(**kwargs: object) -> object:
        try:
            with torch.no_grad(), autograd_forbidden():
                return layer_norm_backward(**kwargs)
        except RuntimeError as error:
            if "switched off" in str(error):  # the message names the exercise, not chapter 2's
                raise RuntimeError(_LN_AUTOGRAD_REFUSED) from None
            raise

    return run_check(
        "layer_norm_backward",
        user,
        reference_layer_norm_backward,
        _layer_norm_backward_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: a Peri-LN ("sandwich") residual block
# --------------------------------------------------------------------------------------------


def _seeded_linear(d_in: int, d_out: int, g: torch.Generator) -> nn.Linear:
    """An ``nn.Linear`` whose weights come from ``g`` (not from the global random state)."""
    linear = nn.utils.skip_init(nn.Linear, d_in, d_out)  # no draw from the global generator
    with torch.no_grad():
        linear.weight.copy_(torch.randn(d_out, d_in, generator=g) / math.sqrt(d_in))
        linear.bias.copy_(0.1 * torch.randn(d_out, generator=g))
    return linear


def _seeded_norm(d: int, g: torch.Generator) -> nn.LayerNorm:
    """A LayerNorm with a random gain and bias, so that it is not close to the identity."""
    norm = nn.LayerNorm(d)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(d, generator=g))
        norm.bias.copy_(0.5 * torch.randn(d, generator=g))
    return norm


#: the shapes and sub-layers the block check runs: (input shape, sub-layer kind)
_BLOCK_CASES = [((6, 8), "linear"), ((2, 5, 8), "tanh"), ((3, 4, 16), "mlp"), ((7, 12), "mlp"),
                ((1, 1, 4), "tanh")]  # fmt: skip


def _seeded_sublayer(d: int, kind: str, g: torch.Generator) -> nn.Module:
    """A seeded sub-layer of width ``d``: a linear map, linear + tanh, or a two-layer MLP."""
    first = _seeded_linear(d, d if kind != "mlp" else 2 * d, g)
    if kind == "linear":
        return first
    if kind == "tanh":
        return nn.Sequential(first, nn.Tanh())
    return nn.Sequential(first, nn.ReLU(), _seeded_linear(2 * d, d, g))


def reference_peri_ln_block(
    x: Tensor,
    sublayer: Callable[[Tensor], Tensor],
    input_norm: nn.Module,
    output_norm: nn.Module,
) -> Tensor:
    """The Peri-LN block (Kim et al., 2025): a norm before *and* after the sub-layer, both
    inside the branch, then the residual sum: ``x + output_norm(sublayer(input_norm(x)))``.

    Args:
        x: shape ``(..., d_model)``.
        sublayer: maps ``(..., d_model)`` to ``(..., d_model)``.
        input_norm: the norm applied to what enters the branch, over ``d_model``.
        output_norm: the norm applied to what the branch returns, over ``d_model``.

    Returns:
        Tensor of shape ``(..., d_model)``.
    """
    return x + output_norm(sublayer(input_norm(x)))  # (..., d_model)


def _peri_ln_cases() -> list[Case]:
    g = seeded_generator(606)
    cases: list[Case] = []
    for shape, kind in _BLOCK_CASES:
        d = shape[-1]
        sublayer = _seeded_sublayer(d, kind, g)
        cases.append(
            {
                "x": 2 * torch.randn(shape, generator=g) + 1,  # mean 1, std 2: far from normalised
                "sublayer": sublayer,
                # two different norms (random gains and biases), so that swapping them shows
                "input_norm": _seeded_norm(d, g),
                "output_norm": _seeded_norm(d, g),
            }
        )
    return cases


def check_peri_ln_block(
    peri_ln_block: Callable[[Tensor, Callable[[Tensor], Tensor], nn.Module, nn.Module], Tensor],
    verbose: bool = True,
) -> CheckResult:
    """Check ``peri_ln_block(x, sublayer, input_norm, output_norm)``: ``x (..., d_model)`` →
    ``(..., d_model)``, a norm on the branch's input and one on its output, before the
    residual sum."""
    with torch.no_grad():
        return run_check(
            "peri_ln_block",
            peri_ln_block,
            reference_peri_ln_block,
            _peri_ln_cases(),
            verbose=verbose,
        )


# --------------------------------------------------------------------------------------------
# Section 6.6.3's exercise: the relative size of each sub-layer's update
# --------------------------------------------------------------------------------------------


def reference_relative_updates(stream: Tensor) -> Tensor:
    r"""Mean over tokens of :math:`\lVert x_{l+1} - x_l \rVert / \lVert x_l \rVert`.

    Args:
        stream: the residual stream before and after each of ``S`` sub-layers, shape
            ``(S + 1, ..., d)`` (one or more token axes in the middle).

    Returns:
        Tensor of shape ``(S,)``: entry ``l`` is the mean over every token of the norm of
        the ``l``-th update divided by the norm of the stream it was added to.
    """
    update = stream[1:] - stream[:-1]  # (S, ..., d)
    ratio = update.norm(dim=-1) / stream[:-1].norm(dim=-1)  # (S, ...)
    return ratio.flatten(1).mean(dim=1)  # (S,)


def _relative_updates_cases() -> list[Case]:
    g = seeded_generator(603)
    cases: list[Case] = []
    for sublayers, tokens, d in [(4, (6,), 8), (6, (2, 5), 16), (3, (3, 4), 4), (8, (1,), 32)]:
        # tokens of very different sizes, so that a mean of ratios differs from a ratio of means
        x0 = torch.randn(*tokens, d, generator=g) * torch.exp(
            2 * torch.randn(*tokens, 1, generator=g)
        )
        updates = torch.randn(sublayers, *tokens, d, generator=g)  # (S, ..., d)
        stream = torch.cat([x0[None], x0[None] + updates.cumsum(0)])  # (S + 1, ..., d)
        cases.append({"stream": stream})
    # one sub-layer, a single token
    cases.append({"stream": torch.randn(2, 1, 5, generator=g)})
    return cases


def check_relative_updates(
    relative_updates: Callable[[Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``relative_updates(stream)``: ``(S + 1, ..., d)`` → ``(S,)``."""
    return run_check(
        "relative_updates",
        relative_updates,
        reference_relative_updates,
        _relative_updates_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: measure a depth slope (Pre-LN without its final LayerNorm)
# --------------------------------------------------------------------------------------------


def reference_log_log_slope(depths: Sequence[float], values: Sequence[float]) -> float:
    r"""Least-squares slope :math:`a` of :math:`\log v = a \log N + c`.

    Args:
        depths: the depths (numbers of layers) :math:`N`, shape ``(k,)`` (positive, at
            least two distinct).
        values: the measured values :math:`v` at those depths, shape ``(k,)`` (positive).

    Returns:
        The fitted exponent :math:`a`: :math:`v \propto N^a`.
    """
    log_depths = np.log(np.asarray(depths, dtype=float))  # (k,)
    log_values = np.log(np.asarray(values, dtype=float))  # (k,)
    return float(np.polyfit(log_depths, log_values, 1)[0])


def _slope_cases() -> list[Case]:
    rng = np.random.default_rng(604)
    cases: list[Case] = []
    for depths, exponent, noise in [
        ([2, 4, 8, 16, 24], -0.5, 0.0),  # an exact power law
        ([2, 4, 8, 16, 24], 0.0, 0.05),  # flat, with noise
        ([1, 3, 10, 30], 0.3, 0.1),  # noisy: least squares differs from the end points
        ([2, 5, 6, 7, 50], -1.0, 0.2),  # unevenly spaced depths
        ([3, 12], 2.0, 0.0),  # two points
    ]:
        log_noise = noise * rng.standard_normal(len(depths))
        values = 1.7 * np.asarray(depths, dtype=float) ** exponent * np.exp(log_noise)
        cases.append({"depths": list(depths), "values": values.tolist()})
    return cases


def check_log_log_slope(
    log_log_slope: Callable[[Sequence[float], Sequence[float]], float], verbose: bool = True
) -> CheckResult:
    """Check ``log_log_slope(depths, values)`` → the least-squares slope of log values against
    log depths (a float)."""
    return run_check(
        "log_log_slope",
        log_log_slope,
        reference_log_log_slope,
        _slope_cases(),
        atol=1e-6,
        rtol=1e-6,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3 (continued): the measuring function, checked on hidden configurations
# --------------------------------------------------------------------------------------------

#: the seeds the reader's function averages over, as the reference does
DEPTH_SLOPE_SEEDS: tuple[int, ...] = (0, 1, 2)
#: relative tolerance on each averaged gradient (and on the slope). The same seeds and the same
#: setup give the same numbers up to float rounding; measuring W₁ instead of W₂ is off by
#: 1 % to 5 % at some depth of every case, the whole last layer by 75 % or more.
DEPTH_GRADIENT_RTOL: float = 1e-3


def _encoder_after_backward(
    num_layers: int, norm_first: bool, final_norm: bool, seed: int
) -> nn.Module:
    """Section 6.3's encoder at initialisation, after one backward pass of the read-out loss
    (its parameters hold their ``.grad``). The same setup as ``companion.norm_study``'s
    ``init_encoder`` and ``init_inputs`` (tests/test_norm_study.py checks it), written out here
    because this module sits below ``norm_study`` in the package's layers."""
    from companion.model import Encoder, TransformerConfig  # the model, only when measured

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=num_layers, d_model=64, num_heads=4, d_ff=256, dropout=0.0,
        norm_first=norm_first, final_norm=final_norm,
    )  # fmt: skip
    encoder = Encoder(config)
    for name, parameter in encoder.named_parameters():
        if parameter.dim() > 1:
            nn.init.xavier_normal_(parameter)
        elif name.endswith("bias"):
            nn.init.zeros_(parameter)
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(8, 16, 64, generator=gen)  # (batch, seq_len, d_model)
    readout = torch.randn(8, 16, 64, generator=gen)  # one random direction per token
    ((readout * encoder(x)).sum() / math.sqrt(8 * 16)).backward()
    return encoder


def last_layer_w2_gradient(num_layers: int, norm_first: bool, final_norm: bool, seed: int) -> float:
    """Chapter 6's section 6.3 setup: ``‖∂L/∂W₂‖_F`` of the last layer's second feed-forward
    matrix, at initialisation.

    An encoder of ``num_layers`` layers (``d_model`` 64, 4 heads, ``d_ff`` 256, no dropout),
    Xavier-normal matrices and zero biases, inputs ``(8, 16, 64)`` with unit-variance entries
    and the random read-out loss ``sum(r * y) / sqrt(8 * 16)``.
    """
    encoder = _encoder_after_backward(num_layers, norm_first, final_norm, seed)
    return encoder.layers[-1].feed_forward.output_proj.weight.grad.norm().item()


_depth_slope_cache: dict[tuple, tuple[float, list[float]]] = {}


def reference_depth_slope(
    depths: Sequence[int], norm_first: bool, final_norm: bool
) -> tuple[float, list[float]]:
    """The last layer's ``‖∂L/∂W₂‖_F`` at each depth (:func:`last_layer_w2_gradient`,
    averaged over :data:`DEPTH_SLOPE_SEEDS`) and its log-log slope against the depth.

    Args:
        depths: numbers of layers, shape ``(k,)``, at least two distinct.
        norm_first: Pre-LN (``True``) or Post-LN (``False``).
        final_norm: whether the stack ends with a LayerNorm.

    Returns:
        ``(slope, gradients)``: the fitted exponent and the ``k`` averaged gradient norms.
    """
    key = (tuple(int(d) for d in depths), bool(norm_first), bool(final_norm))
    if key not in _depth_slope_cache:  # the check compares several answers with one reference
        gradients = [
            float(
                np.mean(
                    [
                        last_layer_w2_gradient(d, norm_first, final_norm, s)
                        for s in DEPTH_SLOPE_SEEDS
                    ]
                )
            )
            for d in key[0]
        ]
        _depth_slope_cache[key] = (reference_log_log_slope(key[0], gradients), gradients)
    slope, gradients = _depth_slope_cache[key]
    return slope, list(gradients)


def _depth_slope_cases() -> list[Case]:
    # not the chapter's depths; Pre-LN with and without its final norm, Post-LN with an extra
    # final norm (a function that always builds Pre-LN gets -0.5 there instead of about 0)
    return [
        {"depths": [2, 4, 8, 16], "norm_first": True, "final_norm": False},
        {"depths": [2, 4, 8, 16], "norm_first": True, "final_norm": True},
        {"depths": [3, 6, 12], "norm_first": False, "final_norm": True},
        {"depths": [3, 6, 12], "norm_first": True, "final_norm": True},
    ]


def _depth_slope_hint(case: dict, got: object) -> str:
    """Name the classic mistake when the gradients are near the reference's but not equal."""
    slope, gradients = reference_depth_slope(**case)
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not isinstance(got[1], list):
        return ""
    ratios = [g / e for g, e in zip(got[1], gradients) if isinstance(g, float) and e > 0]
    if len(ratios) == len(gradients) and all(abs(r - 1) < DEPTH_GRADIENT_RTOL for r in ratios):
        return "\n   hint: the gradients match; fit the slope to them with log_log_slope."
    if len(ratios) == len(gradients) and all(abs(r - 1) < 0.1 for r in ratios):
        return (
            "\n   hint: the gradients are close but not equal: use seeds 0, 1 and 2, section 6.3's"
            " setup (norm_study.init_encoder, init_inputs), and W₂ = feed_forward.output_proj"
            " (W₁, hidden_proj, gets a gradient of about the same size)."
        )
    return ""


def check_depth_slope(
    depth_slope: Callable[[Sequence[int], bool, bool], tuple[float, Sequence[float]]],
    verbose: bool = True,
) -> CheckResult:
    """Check ``depth_slope(depths, norm_first, final_norm)`` → ``(slope, gradients)``: the
    last layer's ``‖∂L/∂W₂‖_F`` at each depth, averaged over seeds 0, 1 and 2 (section 6.3's
    setup), and the log-log slope fitted to them.

    The check *calls your function* on configurations the chapter did not print and accepts
    gradients and slope within a relative :data:`DEPTH_GRADIENT_RTOL` of the reference's: a
    typed number, a function that ignores ``norm_first`` or ``final_norm``, or one that
    measures ``W₁`` or the whole last layer fails.
    """
    name = "depth_slope"

    def as_float(value: object) -> object:  # a NumPy or 0-d tensor result is fine
        if isinstance(value, (np.floating, np.integer)):
            return float(value)
        if isinstance(value, Tensor) and value.numel() == 1:
            return float(value.item())
        return value

    def as_result(value: object) -> object:  # (slope, gradients) with plain floats
        if isinstance(value, (tuple, list)) and len(value) == 2:
            slope, gradients = value
            if isinstance(gradients, (np.ndarray, Tensor)):
                gradients = gradients.tolist()
            if isinstance(gradients, (tuple, list)):
                return as_float(slope), [as_float(g) for g in gradients]
        return value

    if not callable(depth_slope):
        message = (
            f"❌ {name}: expected a function depth_slope(depths, norm_first, final_norm), "
            f"got {type(depth_slope).__name__} (the check measures by calling it)"
        )
        result = CheckResult(name, False, 0, message)
        if verbose:
            report(result)
        return result

    @functools.wraps(depth_slope)  # keeps the signature, so a misnamed parameter is reported
    def user(**kwargs: object) -> object:
        return as_result(depth_slope(**kwargs))

    return run_check(
        name,
        user,
        reference_depth_slope,
        _depth_slope_cases(),
        atol=DEPTH_GRADIENT_RTOL,  # on the slope (about 0 or -0.5)
        rtol=DEPTH_GRADIENT_RTOL,  # on the gradients (about 10 to 50)
        verbose=verbose,
        hint=_depth_slope_hint,
    )


#: The band for the slope of the last layer's ‖∂L/∂W²‖_F against depth in a Pre-LN encoder
#: *without* its final LayerNorm (chapter 6's setup, depths 2-24, seeds 0-2). Measured: about
#: 0.00 (per seed between -0.03 and +0.03); the same stack *with* the final norm gives about
#: -0.53, Post-LN about -0.02.
PRE_LN_NO_FINAL_NORM_SLOPE_BAND: tuple[float, float] = (-0.15, 0.15)


def verify_pre_ln_slope_without_final_norm(slope: float, verbose: bool = True) -> CheckResult:
    """Check a *measured value* (not a function, hence not a ``check_*``): the depth slope of
    the last ``W²`` gradient of a Pre-LN encoder built with ``final_norm=False`` must lie in
    :data:`PRE_LN_NO_FINAL_NORM_SLOPE_BAND`.

    A slope near -1/2 is the stack *with* its final LayerNorm (the chapter's measurement); a
    slope near +1/2 or -1 usually means swapped axes or a fit of the values instead of their
    logarithms.
    """
    low, high = PRE_LN_NO_FINAL_NORM_SLOPE_BAND
    name = "pre_ln_slope_without_final_norm"
    if slope is None:
        message = f"⏳ {name}: not attempted yet (the measurement is still None)."
        passed = False
    elif isinstance(slope, bool) or not isinstance(slope, (int, float, np.floating)):
        message = f"❌ {name}: expected a number (the fitted slope), got {type(slope).__name__}"
        passed = False
    elif not math.isfinite(float(slope)):
        message = f"❌ {name}: expected a finite number, got {slope}"
        passed = False
    else:
        passed = low <= float(slope) <= high
        if passed:
            message = f"✅ {name}: {float(slope):+.3f} lies in [{low}, {high}]."
        else:
            hint = (
                " (that is the stack *with* its final LayerNorm: build it with final_norm=False)"
                if -0.7 < float(slope) < -0.35
                else ""
            )
            message = f"❌ {name}: {float(slope):+.3f} is outside [{low}, {high}]{hint}."
    result = CheckResult(name, passed, 1, message)
    if verbose:
        report(result)
    return result
