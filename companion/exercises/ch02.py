"""Exercises of chapter 2, "The math: scaled dot-product attention, and why √d_k".

Each ``check_*`` runs your function next to the reference solution on random cases drawn
from a seeded generator (so every run checks the same cases) and reports the first
difference. It never raises on a wrong answer; it returns a truthy/falsy
:class:`~companion.exercises.CheckResult`::

    from companion.exercises import ch02
    ch02.check_blockwise_attention(my_blockwise_attention)

The chapter's exercises use :func:`check_score_moments`, :func:`check_blockwise_attention`,
:func:`check_scale_test`, :func:`check_gradient_crossover` and :func:`check_attention_backward`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from companion import efficient_attention
from companion._validation import check_callable as _check_callable
from companion.exercises._checker import (
    Case,
    CheckResult,
    as_verdict,
    call_reader,
    refusing_calls,
    report,
    run_check,
    seeded_generator,
)

__all__ = [
    "autograd_forbidden",
    "BlockRuleBroken",
    "check_attention_backward",
    "check_blockwise_attention",
    "check_gradient_crossover",
    "check_score_moments",
    "crossover_gap",
    "CROSSOVER_N_KEYS",
    "CROSSOVER_SIGMAS",
    "CROSSOVER_D_KS",
    "CROSSOVER_QUERIES",
    "reference_score_moments",
    "sampled_query_gradient_norms",
    "check_scale_test",
    "reference_is_scaled_attention",
    "SCALE_TEST_CANDIDATES",
]

# ---------------------------------------------------------------------------------------------
# The reference of scaled dot-product attention, over any leading dimensions
# ---------------------------------------------------------------------------------------------


def _refusing_reference(
    fn: Callable[..., Any], task: str, references: tuple[Callable[..., Any], ...]
) -> Callable[..., Any]:
    """``fn`` wrapped by :func:`~companion.exercises._checker.refusing_calls` so that a call to
    one of ``references``, this module's own answers, is refused (a lambda around a reference
    would otherwise pass its check). A reference handed to its check as is passes: the
    generic tests of ``tests/test_exercises.py`` run every check on it."""
    if fn in references:
        return fn
    return refusing_calls(fn, task, (), functions=references)


def reference_scaled_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Reference: ``softmax(q kᵀ / √d_k) v`` with any number of leading (batch) dimensions.

    Args:
        q: queries ``(..., q_len, d_k)``.
        k: keys ``(..., k_len, d_k)``.
        v: values ``(..., k_len, d_v)``.

    Returns:
        ``(output, weights)`` of shapes ``(..., q_len, d_v)`` and ``(..., q_len, k_len)``.
    """
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., q_len, k_len)
    weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)
    return weights @ v, weights  # (..., q_len, d_v), (..., q_len, k_len)


# ---------------------------------------------------------------------------------------------
# Exercise 1 - the variance of a score, with unequal spreads and correlated coordinates
# ---------------------------------------------------------------------------------------------


def reference_score_moments(
    d_k: int, sigma_q: float, sigma_k: float, rho: float
) -> tuple[float, float]:
    """Mean and variance of ``q·k`` over ``d_k`` independent coordinates, each pair
    ``(q_c, k_c)`` jointly normal with mean 0, standard deviations ``sigma_q`` and ``sigma_k``
    and correlation ``rho``.

    With ``q_c = σ_q z`` and ``k_c = σ_k (ρ z + √(1 − ρ²) w)``, ``z`` and ``w`` independent
    standard normal: ``E[q_c k_c] = ρ σ_q σ_k`` and ``E[(q_c k_c)²] = σ_q² σ_k² (3ρ² + 1 − ρ²)``
    (``E[z⁴] = 3``), so ``Var(q_c k_c) = σ_q² σ_k² (1 + ρ²)``; the coordinates are independent,
    so the means and the variances add.
    """
    mean = rho * sigma_q * sigma_k * d_k
    variance = d_k * sigma_q**2 * sigma_k**2 * (1 + rho**2)
    return mean, variance


#: (d_k, σ_q, σ_k, ρ) of the check's cases, in order. The first has σ_q ≠ σ_k, σ_q σ_k ≠ 1 and
#: ρ < 0, so every slip of :func:`_moment_slips` (and 1 + |ρ|, (1 + ρ)², |ρ| in the mean) already
#: misses it, each with values of its own: a wrong answer fails there and the hint names the one
#: slip it matches. Then the chapter's setting (σ = 1, ρ = 0), unequal spreads, and correlated
#: coordinates. Every slip misses the first case by more than 10 %.
_MOMENT_CASES = (
    (16, 1.5, 0.8, -0.6),
    (64, 1.0, 1.0, 0.0),
    (16, 1.5, 1.5, 0.0),
    (32, 0.5, 2.0, 0.0),
    (32, 1.2, 0.8, 0.5),
    (128, 0.5, 1.3, 0.9),
)


def _moment_slips(d_k: int, s_q: float, s_k: float, rho: float) -> dict[str, tuple[float, float]]:
    """The classic wrong answers at one setting, each with what it forgets."""
    mean, variance = reference_score_moments(d_k, s_q, s_k, rho)
    product = s_q**2 * s_k**2
    return {
        "the variance grows like √d_k (or is it the standard deviation?): the d_k terms'"
        " variances add, so the variance grows like d_k and its square root like √d_k": (
            mean,
            math.sqrt(d_k) * product * (1 + rho**2),
        ),
        "the variance grows like d_k²: the d_k terms are independent, so their variances add"
        " (d_k times one term's), not their standard deviations": (
            mean,
            d_k**2 * product * (1 + rho**2),
        ),
        "σ_q σ_k where σ_q² σ_k² belongs: Var(q_c k_c) = E[q_c²] E[k_c²] = σ_q² σ_k² at ρ = 0,"
        " the product of two variances": (mean, d_k * s_q * s_k * (1 + rho**2)),
        "no ρ in the variance: E[q_c² k_c²] = E[q_c²] E[k_c²] holds only for independent q_c, k_c;"
        " with correlation ρ, write k_c = σ_k (ρ z + √(1 − ρ²) w) and use E[z⁴] = 3": (
            mean,
            d_k * product,
        ),
        "(1 − ρ²): E[q_c² k_c²] = E[q_c²] E[k_c²] holds only for independent q_c, k_c; with"
        " correlation ρ it is σ_q² σ_k² (1 + 2ρ²), since E[z⁴] = 3": (
            mean,
            d_k * product * (1 - rho**2),
        ),
        "E[(q·k)²]-like: the squared mean of each term, (ρ σ_q σ_k)², is not subtracted": (
            mean,
            d_k * product * (1 + 2 * rho**2),
        ),
        "the mean misses σ_q σ_k: E[q_c k_c] = ρ σ_q σ_k, a covariance": (rho * d_k, variance),
        "the mean has σ_q² σ_k²: E[q_c k_c] = ρ σ_q σ_k, a covariance": (
            rho * product * d_k,
            variance,
        ),
        "the mean grows like √d_k: the d_k means add": (rho * s_q * s_k * math.sqrt(d_k), variance),
        "(variance, mean) in the wrong order: return (mean, variance)": (variance, mean),
        "the standard deviation, not the variance: return d_k σ_q² σ_k² (1 + ρ²) itself, not its"
        " square root": (mean, math.sqrt(variance)),
        "|ρ| in the mean: E[q_c k_c] = ρ σ_q σ_k keeps ρ's sign, so a negative correlation gives a"
        " negative mean": (abs(rho) * s_q * s_k * d_k, variance),
    }


def _score_moments_cases() -> list[Case]:
    return [
        {"d_k": d_k, "sigma_q": s_q, "sigma_k": s_k, "rho": rho}
        for d_k, s_q, s_k, rho in _MOMENT_CASES
    ]


def _as_pair(got: Any) -> Any:
    """A NumPy array or tensor of two numbers as the tuple ``(mean, variance)``; else ``got``."""
    if isinstance(got, (np.ndarray, Tensor)) and tuple(got.shape) == (2,):
        return tuple(float(x) for x in got.tolist())
    return got


def _score_moments_hint(case: Case, got: Any) -> str:
    """Names the classic slip that ``got`` matches at this case, or ``""``. A slip whose values
    equal the right ones at this case (σ = 1 or ρ = 0 hide several) is never named: an answer
    that matches it there is wrong for another reason."""
    try:
        got_mean, got_variance = (float(x) for x in _as_pair(got))
    except (TypeError, ValueError):
        return ""

    def same(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return math.isclose(a[0], b[0], rel_tol=1e-3, abs_tol=1e-9) and math.isclose(
            a[1], b[1], rel_tol=1e-3, abs_tol=1e-9
        )

    right = reference_score_moments(case["d_k"], case["sigma_q"], case["sigma_k"], case["rho"])
    slips = _moment_slips(case["d_k"], case["sigma_q"], case["sigma_k"], case["rho"])
    for slip, values in slips.items():
        if not same(values, right) and same((got_mean, got_variance), values):
            return f"\n   Hint: your answer matches a classic slip, {slip}."
    return ""


def check_score_moments(
    score_moments: Callable[..., tuple[float, float]], verbose: bool = True
) -> CheckResult:
    """Check ``score_moments(d_k, sigma_q, sigma_k, rho) -> (mean, variance)`` of ``q·k`` against
    the exact moments (within 0.1 %), at six settings: one where every classic slip gives values
    of its own, the chapter's (σ = 1, ρ = 0), unequal spreads, and correlated coordinates. The
    pair may be a tuple, a list, or a NumPy array or tensor of two numbers. A wrong answer that
    matches a classic slip (variance growing like √d_k or d_k², σ in place of σ², no ρ or
    (1 − ρ²), the squared mean not subtracted, a mean without σ_q σ_k or with |ρ|, the standard
    deviation returned, the two swapped) is named in the message."""

    @functools.wraps(score_moments)
    def as_pair(**kwargs: Any) -> Any:
        return _as_pair(score_moments(**kwargs))

    return run_check(
        "score_moments",
        as_pair,
        reference_score_moments,
        _score_moments_cases(),
        atol=1e-9,
        rtol=1e-3,
        verbose=verbose,
        hint=_score_moments_hint,
    )


# ---------------------------------------------------------------------------------------------
# Exercise 3 - a test of your own that catches a wrong scale
# ---------------------------------------------------------------------------------------------


def _correct_four_lines(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v  # (..., q_len, d_v)


def _correct_torch(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)  # (..., q_len, d_v)


def _correct_float64(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _correct_four_lines(q.double(), k.double(), v.double()).to(q.dtype)


def _correct_split_scale(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    quarter = q.shape[-1] ** -0.25  # d_k^(-1/4) on each side: the same product, other rounding
    weights = torch.softmax((q * quarter) @ (k * quarter).transpose(-2, -1), dim=-1)
    return weights @ v  # (..., q_len, d_v)


#: How far :func:`_correct_off_by_rounding` moves every float32 output entry, on purpose: "a few
#: 1e-6", the error float32 attention can reach on larger inputs than a test needs (the prompt
#: says so), well inside the solution's atol=1e-5. Other dtypes get the same offset in units of
#: their own rounding (float64: about 7e-15), so a float64 test with a tight atol accepts it.
_ROUNDING_OFFSET = 4e-6


def _rounding_offset(dtype: torch.dtype) -> float:
    """:data:`_ROUNDING_OFFSET` in units of ``dtype``'s machine epsilon (float32's for ints)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    return _ROUNDING_OFFSET * eps / torch.finfo(torch.float32).eps


def _correct_off_by_rounding(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # the formula, every output entry then 4e-6 too large (float32): a correct function whose
    # error is as large as the prompt allows, on every entry rather than on the few that happen
    # to round badly. A test that compares with a relative tolerance alone (rtol=1e-4, atol=0)
    # rejects it whenever an output entry lies within 0.04 of 0, one with atol=1e-6 (rtol=1e-5)
    # whenever one lies within 0.3: random normal inputs of a few dozen output entries always
    # have such entries (tests/test_exercises_ch02.py tries many seeds)
    return _correct_four_lines(q, k, v) + _rounding_offset(q.dtype)  # (..., q_len, d_v)


def _with_factor(factor: Callable[[Tensor, Tensor, Tensor], float]) -> Callable[..., Tensor]:
    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        weights = torch.softmax(q @ k.transpose(-2, -1) * factor(q, k, v), dim=-1)
        return weights @ v  # (..., q_len, d_v)

    return attention


def _softmax_over_axis_1(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # axis 1 is the keys' axis of a 2-D score matrix, but not of a batched one
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=1)
    return weights @ v  # (..., q_len, d_v)


def _softmax_over_axis_2(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # axis 2 is the keys' axis of (batch, q_len, k_len) scores, but not of (batch, heads, ...);
    # 2-D scores have no axis 2, so there the code falls back on the last one
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., q_len, k_len)
    weights = torch.softmax(scores, dim=min(2, scores.dim() - 1))  # (..., q_len, k_len)
    return weights @ v  # (..., q_len, d_v)


def _scaled_after_softmax(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1) / math.sqrt(q.shape[-1])
    return weights @ v  # (..., q_len, d_v)


def _softmax_in_float16(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # the right formula, but the weights rounded to float16 (3 decimal digits): a small error
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., q_len, k_len)
    weights = torch.softmax(scores.half(), dim=-1).to(v.dtype)  # (..., q_len, k_len)
    return weights @ v  # (..., q_len, d_v)


_GUARD_EPSILON = 1e-3


def _softmax_with_a_guard(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # a hand-rolled softmax with a guard against 0/0 in its denominator: after subtracting the
    # row's maximum the denominator Z is at least 1, so every output row is Z/(Z + ε) times the
    # right one, a relative error below ε = 1e-3 whatever the inputs. Any purely relative
    # tolerance with rtol ≥ 1e-3 accepts it; an absolute one catches it (3e-4 on outputs near 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., q_len, k_len)
    exp_scores = torch.exp(scores - scores.amax(dim=-1, keepdim=True))  # (..., q_len, k_len)
    weights = exp_scores / (exp_scores.sum(dim=-1, keepdim=True) + _GUARD_EPSILON)
    return weights @ v  # (..., q_len, d_v)


#: The attention functions :func:`check_scale_test` hands to the reader's test:
#: (what it does, the function, whether it computes softmax(q kᵀ/√d_k) v, a hint when a test
#: accepts it). Correct and wrong ones alternate, so a test that always answers the same
#: fails early.
SCALE_TEST_CANDIDATES: tuple[tuple[str, Callable[..., Tensor], bool, str], ...] = (
    ("the four lines of section 2.1", _correct_four_lines, True, ""),
    ("no scale at all", _with_factor(lambda q, k, v: 1.0), False, "compare with the formula"),
    (
        "a division by d_k instead of √d_k",
        _with_factor(lambda q, k, v: 1 / q.shape[-1]),
        False,
        "compare the output itself, not only its shape or its rows' sums",
    ),
    (
        "torch.nn.functional.scaled_dot_product_attention",
        _correct_torch,
        True,
        "",
    ),
    (
        "a division by √64 = 8, the paper's d_k, whatever the width",
        _with_factor(lambda q, k, v: 1 / 8),
        False,
        "test a width d_k other than 64",
    ),
    (
        "a division by √d_v, the width of a value, instead of √d_k",
        _with_factor(lambda q, k, v: 1 / math.sqrt(v.shape[-1])),
        False,
        "test with d_v ≠ d_k",
    ),
    ("the formula computed in float64, rounded to float32", _correct_float64, True, ""),
    (
        "a division by √k_len, the number of keys, instead of √d_k",
        _with_factor(lambda q, k, v: 1 / math.sqrt(k.shape[-2])),
        False,
        "test with k_len ≠ d_k",
    ),
    (
        "a division by √q_len, the number of queries, instead of √d_k",
        _with_factor(lambda q, k, v: 1 / math.sqrt(q.shape[-2])),
        False,
        "test with q_len ≠ d_k",
    ),
    (
        "a softmax over axis 1, right for 2-D scores but over the queries of a batch",
        _softmax_over_axis_1,
        False,
        "test batched inputs, (batch, q_len, d_k)",
    ),
    (
        "d_k read as q.size(1): the width of a 2-D q, but the number of queries once batched"
        " (or of heads, with two leading axes)",
        _with_factor(lambda q, k, v: 1 / math.sqrt(q.shape[1])),
        False,
        "test batched inputs whose q_len (and number of heads) differ from d_k",
    ),
    (
        "a softmax over axis 2, right for (batch, q_len, k_len) scores but over the queries"
        " once a heads axis is added",
        _softmax_over_axis_2,
        False,
        "test inputs with two leading axes, (batch, heads, q_len, d_k), as chapter 3 uses",
    ),
    (
        "q and k each multiplied by d_k^(-1/4): the same scores, rounded differently",
        _correct_split_scale,
        True,
        "",
    ),
    (
        "a multiplication by √d_k instead of a division",
        _with_factor(lambda q, k, v: math.sqrt(q.shape[-1])),
        False,
        "compare with the formula",
    ),
    (
        "the division by √d_k applied after the softmax, to the weights",
        _scaled_after_softmax,
        False,
        "compare the output itself, not only the ranking of the keys",
    ),
    (
        "a division by √(d_k + 1), a small error (3 % at d_k = 16)",
        _with_factor(lambda q, k, v: 1 / math.sqrt(q.shape[-1] + 1)),
        False,
        "tighten the tolerance: float32 rounding moves these outputs by under 1e-6, so"
        " atol=1e-5 has room enough",
    ),
    (
        "the formula with every output entry 4e-6 too large (float32 inputs; about 7e-15 for"
        " float64 ones), a deliberate offset of the size float32 rounding reaches on larger"
        " inputs, which the prompt says a tolerance must allow",
        _correct_off_by_rounding,
        True,
        "",
    ),
    (
        "the weights computed in float16, a few 1e-4 off",
        _softmax_in_float16,
        False,
        "tighten the tolerance: float32 rounding moves these outputs by under 1e-6, so"
        " atol=1e-5 has room enough",
    ),
    (
        "a softmax with a guard ε = 1e-3 in its denominator, exp(s − max)/(Σ exp(s − max) + ε),"
        " which shrinks every output row by a relative amount below 1e-3",
        _softmax_with_a_guard,
        False,
        "a relative tolerance alone (rtol ≥ 1e-3, atol=0) accepts this slip on any inputs,"
        " since its relative error stays below 1e-3 everywhere; compare with an absolute"
        " tolerance such as atol=1e-5",
    ),
)


class _Recorded:
    """An attention function that remembers its inputs; shown to the reader's test as
    ``attention #n`` so that its name gives nothing away."""

    def __init__(self, fn: Callable[..., Tensor], number: int) -> None:
        self.fn = fn
        self.number = number
        self.calls: list[tuple[Tensor, Tensor, Tensor]] = []

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.calls.append((q.detach().clone(), k.detach().clone(), v.detach().clone()))
        return self.fn(q, k, v)

    def __repr__(self) -> str:
        return f"attention #{self.number}"


def _largest_error(recorded: _Recorded) -> tuple[float, float]:
    """(largest |output − exact|, largest |exact|) over the inputs the reader's test used,
    the exact output computed in float64."""
    error, size = 0.0, 0.0
    for q, k, v in recorded.calls:
        try:
            got = recorded.fn(q, k, v).double()  # (..., q_len, d_v)
            exact = _correct_four_lines(q.double(), k.double(), v.double())  # (..., q_len, d_v)
            error = max(error, (got - exact).abs().max().item())
            size = max(size, exact.abs().max().item())
        except (RuntimeError, ValueError, IndexError):  # inputs the formula cannot take
            continue
    return error, size


def _largest_score(recorded: _Recorded) -> float:
    """The largest |q · k| / √d_k over the inputs the reader's test used."""
    largest = 0.0
    for q, k, _ in recorded.calls:
        try:
            scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
            largest = max(largest, scores.abs().max().item())
        except (RuntimeError, ValueError, IndexError):  # inputs the formula cannot take
            continue
    return largest


def reference_is_scaled_attention(attention: Callable[[Tensor, Tensor, Tensor], Tensor]) -> bool:
    """Reference test: does ``attention(q, k, v)`` compute ``softmax(q kᵀ/√d_k) v``?

    Compares the output with the formula, computed in float64, on inputs whose shapes tell
    the widths apart (``d_k ≠ 64``, ``d_v ≠ d_k``, ``k_len ≠ d_k``, ``q_len ≠ d_k``,
    ``q_len ≠ k_len``, ``heads ≠ d_k``) and carry zero, one and two batch axes; the tolerance ``atol=1e-5`` is far above float32
    rounding and far below what a wrong scale changes.

    Args:
        attention: maps ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``,
            ``v (..., k_len, d_v)`` to the output ``(..., q_len, d_v)``.
    """
    gen = seeded_generator(40)
    shapes = [((), 3, 5, 4, 2), ((2,), 4, 6, 16, 3), ((2, 3), 2, 7, 9, 5)]
    for lead, q_len, k_len, d_k, d_v in shapes:  # (leading dims, q_len, k_len, d_k, d_v)
        q = torch.randn(*lead, q_len, d_k, generator=gen)
        k = torch.randn(*lead, k_len, d_k, generator=gen)
        v = torch.randn(*lead, k_len, d_v, generator=gen)
        exact = _correct_four_lines(q.double(), k.double(), v.double())  # (..., q_len, d_v)
        got = attention(q, k, v)
        if got.shape != exact.shape or not torch.allclose(got.double(), exact, atol=1e-5):
            return False
    return True


def _scale_verdict_problem(
    got: object, correct: bool, what: str, hint: str, recorded: _Recorded
) -> str | None:
    """Why the reader's verdict on one candidate is wrong, or ``None`` when it is right."""
    got = as_verdict(got)  # a bool tensor or NumPy's bool (np.all's) is a right answer too
    if not isinstance(got, bool):
        return f"your test must return True or False, got {type(got).__name__} {got!r}"[:200]
    if got == correct:
        return None
    if not recorded.calls:
        return (
            f"your test {'rejected' if correct else 'accepted'} {recorded!r} without calling it:"
            " call it on inputs you choose and compare its output with the formula"
        )
    error, size = _largest_error(recorded)
    shapes = ", ".join(
        "q " + str(tuple(q.shape)) + " k " + str(tuple(k.shape)) + " v " + str(tuple(v.shape))
        for q, k, v in recorded.calls[:3]
    )
    if correct:
        dtypes = sorted({str(q.dtype).removeprefix("torch.") for q, _, _ in recorded.calls})
        return (
            f"your test rejected {recorded!r}, {what}, an attention that IS correct; on the"
            f" inputs your test used ({shapes}) its outputs differ from the exact values by at"
            f" most {error:.1e} (on outputs up to {size:.1e}), within what {'/'.join(dtypes)}"
            " rounding allows. Exact equality"
            " always rejects rounding; a tolerance that shrinks to nothing near zero"
            " (torch.allclose's default atol=1e-8, or rtol alone), or an atol below a few 1e-6,"
            " rejects it whenever an output entry lands close to 0, so such a test passes or"
            " fails with the inputs it happens to draw: compare with an absolute tolerance such"
            " as atol=1e-5"
        )
    if error < 1e-5 and _largest_score(recorded) < 0.1:
        # every scale gives nearly uniform weights when the scores are tiny
        hint = "use q and k of unit size (torch.randn): tiny scores make every scale look uniform"
    elif error < 1e-5 and all(q.shape[-1] == 1 for q, _, _ in recorded.calls):
        # with d_k = 1, √d_k = 1: every scale built from d_k is 1
        hint = (
            "d_k = 1 makes √d_k = d_k = 1: use a d_k other than 1 and other than every other size"
        )
    elif error < 1e-5 and _largest_score(recorded) > 10:
        # scores this large make the softmax one-hot at any scale, so every scale agrees
        hint = (
            "your scores are so large that the softmax is one-hot at any scale:"
            " use q and k of unit size (torch.randn)"
        )
    return (
        f"your test accepted {recorded!r}, which is wrong: {what}. On the inputs your test used"
        f" ({shapes}) its outputs differ from the formula by at most {error:.1e}"
        + (" (rounding only: those inputs cannot tell it apart)" if error < 1e-5 else "")
        + f". Hint: {hint}"
    )


#: checks that tests/test_exercises.py's generic tests cannot run, with the reason
GENERIC_TEST_EXEMPT = {
    "check_gradient_crossover": "it measures five settings (not three cases) and its reference "
    "is the measurement itself; tests/test_exercises_ch02.py checks right and wrong answers",
}

#: the name the generic tests look for (``reference_`` + the check's name)
reference_scale_test = reference_is_scaled_attention


def check_scale_test(
    is_scaled_attention: Callable[[Callable[[Tensor, Tensor, Tensor], Tensor]], bool],
    verbose: bool = True,
) -> CheckResult:
    """Check the reader's test ``is_scaled_attention(attention) -> bool``.

    The test gets an attention function ``attention(q, k, v) -> output`` (the shapes of
    :func:`reference_scaled_attention`, the output only, as PyTorch's function returns it)
    and must say whether it computes ``softmax(q kᵀ/√d_k) v``. The check hands it the
    functions of :data:`SCALE_TEST_CANDIDATES`, five correct ones (with different float32
    rounding, one of them 4e-6 off in every entry on purpose (float32 inputs; float64 ones get
    the same offset in float64's units, about 7e-15), which a purely relative tolerance such as
    ``rtol=1e-4, atol=0`` rejects whenever an output entry lies within 0.04 of 0 and
    ``atol=1e-6`` whenever one lies within 0.3: on random normal inputs with a few dozen
    output entries, always) and fourteen with a slip (no scale,
    ``d_k``, a fixed ``√64``, ``√d_v``, ``√k_len``, ``√q_len``, ``√q.size(1)``, the softmax
    over axis 1 or axis 2, a multiplication, the scale after the softmax, and three small ones
    that only a tight tolerance catches: ``√(d_k + 1)``, float16 weights, and a guard
    ``ε = 1e-3`` in the softmax's denominator, whose relative error stays below 1e-3 on any
    inputs, so that every purely relative tolerance with ``rtol ≥ 1e-3`` accepts it). A
    wrong verdict is explained with the inputs the test used: a rejected correct function
    with its float32 rounding (the trap of exact equality), an accepted wrong one with the
    largest difference the test's inputs produced and what to vary. An ``AssertionError``
    raised by the test counts as the verdict ``False``. A test that calls
    :func:`reference_is_scaled_attention` is refused.
    """
    name = "is_scaled_attention"
    _check_callable("the function to check", is_scaled_attention)
    own_test = _refusing_reference(
        is_scaled_attention, "write the test", (reference_is_scaled_attention,)
    )
    result: CheckResult | None = None
    count = 0
    for count, (what, fn, correct, hint) in enumerate(SCALE_TEST_CANDIDATES, start=1):
        recorded = _Recorded(fn, count)

        def verdict(attention: _Recorded) -> object:
            try:
                return own_test(attention)
            except AssertionError:  # a pytest-style test: a failed assert is the verdict False
                return False

        got, result = call_reader(name, count, verdict, {"attention": recorded})
        if result is not None:
            break
        problem = _scale_verdict_problem(got, correct, what, hint, recorded)
        if problem:
            result = CheckResult(name, False, count, f"❌ {name}: case {count}: {problem}.")
            break
    if result is None:
        result = CheckResult(
            name,
            True,
            count,
            f"✅ {name}: the right verdict on all {count} attention functions "
            f"({sum(c for _, _, c, _ in SCALE_TEST_CANDIDATES)} correct, "
            f"{sum(not c for _, _, c, _ in SCALE_TEST_CANDIDATES)} with a slip).",
        )
    if verbose:
        report(result)
    return result


# ---------------------------------------------------------------------------------------------
# Exercise 2 - attention one block of keys at a time (the online softmax)
# ---------------------------------------------------------------------------------------------


def reference_blockwise_attention(q: Tensor, k: Tensor, v: Tensor, block_size: int) -> Tensor:
    """Reference: ``softmax(q kᵀ / √d_k) v`` one block of keys at a time (the online softmax).

    Args:
        q: queries ``(..., q_len, d_k)``.
        k: keys ``(..., k_len, d_k)``.
        v: values ``(..., k_len, d_v)``.
        block_size: keys per block; the last block may be shorter.

    Returns:
        the output ``(..., q_len, d_v)``; only ``(..., q_len, block_size)`` scores exist at once.
    """
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"))  # (..., q_len, 1)
    running_sum = torch.zeros(*q.shape[:-1], 1)  # (..., q_len, 1): Σ exp(s - running_max)
    mixed = torch.zeros(*q.shape[:-1], v.shape[-1])  # (..., q_len, d_v): Σ exp(s - max) v
    for start in range(0, k.shape[-2], block_size):
        k_block = k[..., start : start + block_size, :]  # (..., block, d_k)
        v_block = v[..., start : start + block_size, :]  # (..., block, d_v)
        scores = q @ k_block.transpose(-2, -1) * scale  # (..., q_len, block)
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))  # (..., q_len, 1)
        rescale = torch.exp(running_max - new_max)  # (..., q_len, 1), 0 on the first block
        exp_scores = torch.exp(scores - new_max)  # (..., q_len, block), all ≤ 1
        running_sum = running_sum * rescale + exp_scores.sum(dim=-1, keepdim=True)
        mixed = mixed * rescale + exp_scores @ v_block  # (..., q_len, d_v)
        running_max = new_max
    return mixed / running_sum  # (..., q_len, d_v)


def _blockwise_cases(seed: int = 20) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # (leading dims, q_len, k_len, d_k, d_v, block_size, score size); q_len differs from d_k
    # and d_v, so that only a score matrix ends in (q_len, k_len) (see _BlockRule)
    settings = [
        ((), 3, 8, 4, 2, 4, 1.0),  # two full blocks
        ((), 5, 7, 4, 3, 3, 1.0),  # the last block is shorter
        # one key per block, 16 blocks: a maximum and a sum kept per block (split-K) make 32
        # columns per query, over the 6 blocks' worth plus 8 running columns allowed
        ((2,), 3, 16, 8, 4, 1, 1.0),
        ((2,), 2, 5, 4, 4, 16, 1.0),  # one block holds every key
        ((2, 3), 5, 9, 8, 3, 4, 1.0),  # batch × heads
        ((), 3, 10, 4, 2, 3, 30.0),  # scores in the thousands: exp overflows without a max
    ]
    for lead, q_len, k_len, d_k, d_v, block_size, size in settings:
        yield {
            "q": size * torch.randn(*lead, q_len, d_k, generator=gen),
            "k": size * torch.randn(*lead, k_len, d_k, generator=gen),
            "v": torch.randn(*lead, k_len, d_v, generator=gen),
            "block_size": block_size,
        }
    # keys sorted by rising score: every new block raises the running maximum
    q = torch.randn(2, 4, generator=gen)  # (2, 4)
    k = torch.randn(12, 4, generator=gen)  # (12, 4)
    k = k[(q[0] @ k.T).argsort()] * 4  # (12, 4)
    yield {"q": q, "k": k, "v": torch.randn(12, 3, generator=gen), "block_size": 4}
    # one query whose scaled scores all lie below about -200: a running maximum started at 0
    # instead of -inf turns every exp(score - max) into 0 and the output into 0/0
    direction = torch.tensor([1.0, 0.0, 0.0, 0.0])  # (4,)
    k = 20 * direction + 0.5 * torch.randn(10, 4, generator=gen)  # (10, 4), all along +x
    q = torch.randn(2, 4, generator=gen)  # (2, 4)
    q[0] = -25 * direction + 0.5 * torch.randn(4, generator=gen)  # scores near -250
    yield {"q": q, "k": k, "v": torch.randn(10, 3, generator=gen), "block_size": 3}
    # float64 inputs: the output must keep float64 and its accuracy (no hard-coded float32)
    yield {
        "q": torch.randn(2, 3, 4, generator=gen, dtype=torch.float64),
        "k": torch.randn(2, 11, 4, generator=gen, dtype=torch.float64),
        "v": torch.randn(2, 11, 2, generator=gen, dtype=torch.float64),
        "block_size": 4,
    }
    # many blocks (12 of 5 keys, 5 ∉ {d_k, d_v}): keeping every block's scores until the end
    # holds 12 blocks' worth, over the 6 that _BlockRule allows at once
    yield {
        "q": torch.randn(3, 4, generator=gen),
        "k": torch.randn(60, 4, generator=gen),
        "v": torch.randn(60, 2, generator=gen),
        "block_size": 5,
    }


class BlockRuleBroken(RuntimeError):
    """Raised when the reader's ``blockwise_attention`` holds all the keys' scores, or more than
    six blocks' scores, at once."""


def _tensors(value: object) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


#: How many blocks' worth of scores :class:`_BlockRule` lets be alive at once.
_LIVE_BLOCKS = 6
#: How many width-1 columns ``(..., q_len, 1)`` (running quantities) it allows besides.
_RUNNING_COLUMNS = 8


class _BlockRule(TorchFunctionMode):
    """Watches every PyTorch call while the reader's ``blockwise_attention`` runs.

    A call is refused (:class:`BlockRuleBroken`) when it returns a tensor ending in
    ``(q_len, k_len)`` or ``(k_len, q_len)``, a score or weight matrix over all the keys,
    transposed or not, also with a width-1 axis among its last three (``(..., q_len, k_len, 1)``
    from ``sum(-1, keepdim=True)``) (``q @ k.transpose``, ``k @ q.transpose``,
    ``torch.softmax`` of it, ``torch.cat`` of the blocks' scores, ...), or when it is
    PyTorch's fused ``scaled_dot_product_attention`` on more than ``block_size`` keys, or
    when it returns a float tensor ending in ``k_len`` (one query's scores over all the
    keys; transposed keys ``(d_k, k_len)`` and values are allowed), or when more than
    :data:`_LIVE_BLOCKS` blocks' worth of score-shaped tensors (``(..., q_len, n)`` or
    ``(..., n, q_len)`` with ``n`` not ``d_k`` or ``d_v``, width-1 columns included, and
    per-query columns ``q.shape[:-1]`` kept without ``keepdim``) are alive at once. Only active when ``block_size < k_len``; the check's cases have ``q_len`` different from
    ``d_k`` and ``d_v``, so no transposed key or value matrix ends in ``(q_len, k_len)``.
    """

    def __init__(
        self,
        q_len: int,
        k_len: int,
        block_size: int,
        d_k: int = 0,
        d_v: int = 0,
        rows: int = 0,
        rows_shape: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        #: the shape of a per-query column kept without keepdim, ``q.shape[:-1]``
        self.rows_shape = tuple(rows_shape) or (q_len,)
        self.q_len, self.k_len, self.block_size = q_len, k_len, block_size
        self.d_k, self.d_v = d_k, d_v
        #: at most this many score-shaped numbers may be alive at once: six blocks' worth,
        #: plus a few width-1 running columns (a maximum, a sum, their updates) per query
        self.budget = max(rows, q_len) * (_LIVE_BLOCKS * block_size + _RUNNING_COLUMNS)
        self.live: dict[int, tuple[weakref.ref, int]] = {}  # storage address -> (tensor, numel)

    def _refuse(self, what: str) -> None:
        raise BlockRuleBroken(
            f"{what}, with block_size={self.block_size} and {self.k_len} keys: the exercise"
            " allows the scores of a few blocks of keys at a time (at most six blocks' worth,"
            " never all the keys')."
            " Slice the keys and values"
            " first, k[..., start:start + block_size, :], and keep only running quantities"
            " (a maximum, a sum, a weighted sum of values) between blocks"
        )

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            key = kwargs.get("key", args[1] if len(args) > 1 else None)
            if isinstance(key, Tensor) and key.dim() >= 2 and key.shape[-2] > self.block_size:
                self._refuse(
                    f"torch.nn.functional.scaled_dot_product_attention was called on"
                    f" {key.shape[-2]} keys at once"
                )
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", repr(func))
        for tensor in _tensors(result):
            if self._all_scores(tuple(tensor.shape)):
                self._refuse(
                    f"{name} returned a tensor of shape {tuple(tensor.shape)}, the scores of"
                    f" all {self.k_len} keys for each of the {self.q_len} queries"
                )
            if not tensor.is_floating_point() or tensor.dim() == 0:
                continue
            transposed = tensor.dim() >= 2 and tensor.shape[-2] in (self.d_k, self.d_v)
            if tensor.shape[-1] == self.k_len and not transposed:
                self._refuse(
                    f"{name} returned a tensor of shape {tuple(tensor.shape)}: a score for"
                    f" each of the {self.k_len} keys (one query at a time still scores all"
                    " keys at once)"
                )
            if self._score_shaped(tuple(tensor.shape)):
                self._count(tensor, name)
        return result

    def _score_shaped(self, shape: tuple[int, ...]) -> bool:
        """Does a tensor of this shape hold scores, or per-query maxima or sums, of some keys?

        ``(..., q_len, n)`` (a block's scores; width-1 columns count too: one key's scores kept
        per key add up), its transpose ``(..., n, q_len)`` (``k_block @ q.mT``), and the
        per-query columns without ``keepdim``, ``q.shape[:-1]`` (``scores.amax(-1)``); ``n``
        not ``d_k`` or ``d_v``, so that queries, keys and values are not counted.
        """
        if shape == self.rows_shape:
            return True
        if len(shape) < 2:
            return False
        return (shape[-2] == self.q_len and shape[-1] not in (self.d_k, self.d_v)) or (
            shape[-1] == self.q_len and shape[-2] not in (self.d_k, self.d_v)
        )

    def _all_scores(self, shape: tuple[int, ...]) -> bool:
        """Does a tensor of this shape hold the scores of all the keys for every query?"""
        pairs = ((self.q_len, self.k_len), (self.k_len, self.q_len))  # k @ q.mT: transposed
        if shape[-2:] in pairs:
            return True
        # the broadcasting form with keepdim=True, (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(
        # -1, keepdim=True): (..., q_len, k_len, 1), or a width-1 axis elsewhere in the last three
        last = shape[-3:]
        return len(last) == 3 and any(
            last[i] == 1 and last[:i] + last[i + 1 :] in pairs for i in range(3)
        )

    def _count(self, tensor: Tensor, name: str) -> None:
        """Adds a score-shaped tensor to the live ones; refuses when too many are alive."""
        address = tensor.untyped_storage().data_ptr()
        self.live[address] = (weakref.ref(tensor), tensor.numel())
        self.live = {a: (r, n) for a, (r, n) in self.live.items() if r() is not None}
        alive = sum(n for _, n in self.live.values())
        if alive > self.budget:
            self._refuse(
                f"after {name}, {alive} score-shaped numbers (scores, and per-query maxima"
                f" and sums) are alive at once, more than {_LIVE_BLOCKS} blocks' worth plus a"
                " few running columns (a list of every block's scores, or of every key's score"
                " column, kept for one global maximum, holds all of them)"
            )


def check_blockwise_attention(
    blockwise_attention: Callable[[Tensor, Tensor, Tensor, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``blockwise_attention(q, k, v, block_size) -> output``.

    ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``, ``v (..., k_len, d_v)``; the output
    ``(..., q_len, d_v)`` must equal ``softmax(q kᵀ / √d_k) v``. The cases include a short
    last block, blocks of one key, one block for all keys, scores in the thousands, keys
    whose scores rise from block to block, and ``float64`` inputs, whose output must stay
    ``float64`` and ``float64``-accurate (:class:`PrecisionLost` otherwise). While the reader's function runs, a
    :class:`~torch.overrides.TorchFunctionMode` refuses any PyTorch call that returns a
    tensor ending in ``(q_len, k_len)`` or ``(k_len, q_len)``, or in ``(q_len, k_len, 1)``
    (the scores or weights of all keys at once, transposed or not, or kept with
    ``keepdim=True``) or runs
    PyTorch's fused attention on more than ``block_size`` keys, so the plain full softmax is
    reported, not passed. (Work done outside PyTorch, in NumPy say, is not watched.) A call
    into :mod:`companion.efficient_attention`, whose ``blockwise_attention`` is the answer, is
    refused, and so is a call to :func:`reference_blockwise_attention`.
    """

    @functools.wraps(blockwise_attention)
    def one_block_at_a_time(q: Tensor, k: Tensor, v: Tensor, block_size: int) -> Tensor:
        q_len, k_len = q.shape[-2], k.shape[-2]
        if block_size >= k_len:  # one block holds every key: nothing to watch
            got = blockwise_attention(q, k, v, block_size)
        else:
            rows = q.shape[:-1].numel()  # every query of every batch and head
            rule = _BlockRule(
                q_len, k_len, block_size, q.shape[-1], v.shape[-1], rows, tuple(q.shape[:-1])
            )
            with rule:
                got = blockwise_attention(q, k, v, block_size)
        _check_float64(q, k, v, got)
        return got

    refused = refusing_calls(
        one_block_at_a_time,
        "compute attention one block of keys at a time",
        (efficient_attention,),
        why=": companion.efficient_attention.blockwise_attention and this module's"
        " reference_blockwise_attention hold the answer",
        functions=()
        if blockwise_attention is reference_blockwise_attention
        else (reference_blockwise_attention,),
    )
    return run_check(
        "blockwise_attention",
        refused,
        lambda q, k, v, block_size: reference_scaled_attention(q, k, v)[0],
        _blockwise_cases(),
        verbose=verbose,
        hint=_blockwise_hint,
    )


class PrecisionLost(RuntimeError):
    """Raised when ``float64`` inputs get a ``float32`` result, or one only ``float32``-accurate."""


def _check_float64(q: Tensor, k: Tensor, v: Tensor, got: Any) -> None:
    """For ``float64`` inputs, the output must be ``float64`` and accurate to ``float64``: an
    answer that hard-codes ``float32`` (its result, or its running quantities before a cast back)
    is off by about 1e-7, inside the check's usual tolerance but not inside 1e-10."""
    if q.dtype != torch.float64 or not isinstance(got, Tensor):
        return
    if got.dtype != torch.float64:
        raise PrecisionLost(
            f"float64 inputs gave a {got.dtype} output: create the running quantities with the"
            " inputs' dtype (e.g. torch.zeros(..., dtype=q.dtype)), not the default float32"
        )
    want = reference_scaled_attention(q, k, v)[0]  # (..., q_len, d_v)
    if got.shape == want.shape and torch.isfinite(got).all():
        gap = (got - want).abs().max().item()
        if 1e-10 < gap < 1e-3:
            raise PrecisionLost(
                f"float64 inputs, but the output is off by {gap:.1e}, float32 rounding: compute"
                " in the inputs' dtype, without casting to float32 on the way"
            )


def _blockwise_hint(case: Case, got: Any) -> str:
    """Names the classic slips behind a NaN or inf in the output: no maximum subtracted
    (exp overflows), each block's own maximum instead of the running one (the rescale
    exp(old − block) overflows when a later block's maximum is far lower), or a running maximum
    started at 0 (every exp underflows: 0/0)."""
    if isinstance(got, Tensor) and got.is_floating_point() and not torch.isfinite(got).all():
        return (
            "\n   Hint: NaN or inf: exp overflowed, or 0/0. Is a maximum per query subtracted"
            " before exp? Is the new maximum max(old, block), never the block's own, so that"
            " every exp(·) stays ≤ 1? Does the running maximum start at −inf?"
        )
    return ""


# ---------------------------------------------------------------------------------------------
# The measurement of exercise 4: how much gradient reaches the queries, with and without √d_k
# ---------------------------------------------------------------------------------------------


def sampled_query_gradient_norms(
    d_k: int,
    n_keys: int,
    scale: float,
    n_queries: int,
    generator: torch.Generator,
) -> Tensor:
    """``‖∂L/∂q‖`` for ``n_queries`` random queries, sampled without the key tensor.

    The protocol of chapter 2, section 2.7: ``q`` and its ``n_keys`` keys have independent
    standard normal entries, the softmax input is ``s̃_j = scale · q·k_j``, the weights
    ``α = softmax(s̃)`` and ``L = Σ_j α_j u_j`` with ``u`` standard normal. With
    ``g = ∂L/∂s̃ = α ⊙ (u − αᵀu)`` the gradient is ``∂L/∂q = scale · Σ_j g_j k_j``. Writing each key as ``a_j q/‖q‖`` plus a
    part orthogonal to ``q``, ``q·k_j = ‖q‖ a_j`` with ``a_j`` standard normal, and the
    orthogonal parts sum to ``‖g‖`` times a standard normal vector of ``d_k − 1`` entries, so

        ``‖∂L/∂q‖² = scale² ((Σ_j g_j a_j)² + ‖g‖² χ²(d_k − 1))``, ``‖q‖² ~ χ²(d_k)``:

    the same distribution as the brute-force measurement, without the
    ``(n_queries, n_keys, d_k)`` tensor (``tests/test_exercises_ch02.py`` compares the two).

    Args:
        d_k: width of a query and a key (at least 2).
        n_keys: keys per query.
        scale: the factor applied to the raw scores (``1/√d_k`` or ``1``).
        n_queries: number of queries sampled.
        generator: the random source (numpy's draws are seeded from it).

    Returns:
        ``(n_queries,)`` float64, one gradient norm per query.
    """
    seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
    rng = np.random.default_rng(seed)
    q_norm = torch.from_numpy(rng.chisquare(d_k, size=(n_queries, 1))).sqrt()  # (N, 1) ‖q‖
    orthogonal = torch.from_numpy(rng.chisquare(d_k - 1, size=n_queries))  # (N,) χ²(d_k − 1)
    a = torch.randn(n_queries, n_keys, generator=generator, dtype=torch.float64)  # (N, n_keys)
    upstream = torch.randn(n_queries, n_keys, generator=generator, dtype=torch.float64)  # u
    probs = torch.softmax(scale * q_norm * a, dim=-1)  # (N, n_keys) α
    g = probs * (upstream - (probs * upstream).sum(-1, keepdim=True))  # (N, n_keys) ∂L/∂s̃
    squared = scale**2 * ((g * a).sum(-1) ** 2 + (g * g).sum(-1) * orthogonal)  # (N,)
    return squared.sqrt()  # (N,)


# ---------------------------------------------------------------------------------------------
# Exercise 4 - a composition: the width from which the √d_k helps, at another initialisation
# ---------------------------------------------------------------------------------------------

#: The standard deviations σ of the query and key entries at which
#: :func:`check_gradient_crossover` asks for the crossover (16 keys per query), every one of
#: them at each run. Chapter 2 measures σ = 1 only; 1/√3 is PyTorch's default ``nn.Linear``
#: on inputs of variance 1 (chapter 2, section 2.3's box). The right width differs from
#: setting to setting, so neither the chapter's 128 nor a rule of thumb passes: "128/σ⁴
#: rounded to a power of two" (the raw scores' spread, √d_k σ², held at its σ = 1 value)
#: fails, because σ also sharpens the scaled softmax; putting σ on the softmax input instead
#: of σ² (σ on the queries only) fails at every setting. At each setting the crossover is
#: clear-cut (the gap at least 10 % away from 1 on both sides), and no setting needs widths
#: beyond 2048.
CROSSOVER_SIGMAS = (3**-0.5, 0.7, 0.8, 1.25, 1.5)

#: Keys per query, as in chapter 2, section 2.7.
CROSSOVER_N_KEYS = 16

#: The widths the crossover is looked for among: 2, 4, ..., 2048.
CROSSOVER_D_KS = tuple(2**e for e in range(1, 12))

#: The queries per width (and per scale) the exercise asks a measurement to use. At σ² = 1/3
#: the gap at the crossover is only about 1.1-1.2, and a median over 10 000 queries has a
#: standard deviation of about 0.09 there: 1 correct measurement in 40 or so lands below 1.
#: With 100 000 queries (about 0.03) a correct measurement passes the check at every σ with
#: probability above 99.9 % (``tests/test_exercises_ch02.py`` computes it).
CROSSOVER_QUERIES = 100_000


def crossover_gap(d_k: int, sigma: float) -> float:
    """The median gradient gap at entries of std ``sigma``: median ``‖∂L/∂q‖`` with
    ``1/√d_k`` over the median without it, 16 keys per query.

    With ``q = σ q₀`` and ``k = σ k₀`` the softmax input is ``λ σ² q₀·k₀`` and
    ``∂L/∂q = (1/σ) · (the gradient for q₀ at the factor λσ²)``, so the gap is the standard-normal
    gap at the factors ``σ²/√d_k`` and ``σ²``. Measured with
    :func:`sampled_query_gradient_norms` on 50 000 queries per scale (about 2 % sampling
    noise); :func:`check_gradient_crossover` uses it only at settings where the gap is at
    least 10 % away from 1. Above 1 the typical unscaled query gets less gradient. The check
    refuses an answer that calls it.
    """
    return _crossover_gap(d_k, float(sigma))


#: :func:`_crossover_gap`'s measurements, by ``(d_k, sigma)``.
_CROSSOVER_GAPS: dict[tuple[int, float], float] = {}


def _crossover_gap(d_k: int, sigma: float) -> float:
    """:func:`crossover_gap`, remembered (the check asks for the same settings again). A plain
    function, not ``functools.cache``: a call that finds its value remembered still runs Python
    code, so that the check sees (and refuses) an answer that calls it."""
    if (d_k, sigma) not in _CROSSOVER_GAPS:
        _CROSSOVER_GAPS[d_k, sigma] = _measure_crossover_gap(d_k, sigma)
    return _CROSSOVER_GAPS[d_k, sigma]


def _measure_crossover_gap(d_k: int, sigma: float) -> float:
    """:func:`crossover_gap`, measured."""
    generator = seeded_generator(3)
    factor = sigma**2
    n_keys = CROSSOVER_N_KEYS
    scaled = sampled_query_gradient_norms(d_k, n_keys, factor / math.sqrt(d_k), 50_000, generator)
    unscaled = sampled_query_gradient_norms(d_k, n_keys, factor, 50_000, generator)
    return scaled.median().item() / unscaled.median().item()


def check_gradient_crossover(
    gradient_crossover: Callable[[float], int], verbose: bool = True
) -> CheckResult:
    """Check ``gradient_crossover(sigma) -> d_k``.

    The answer is the smallest ``d_k`` of :data:`CROSSOVER_D_KS` at which the median
    ``‖∂L/∂q‖`` with scaled scores exceeds the median with unscaled scores (chapter 2's
    protocol, 16 keys per query, but query and key entries of standard deviation ``sigma``):
    from that width on, the typical query gets less gradient without the ``√d_k``. Called at
    every ``sigma`` of :data:`CROSSOVER_SIGMAS`, so that only a measurement or a right
    argument passes; an answer ``d`` is right when the gap measured by :func:`crossover_gap`
    is above 1 at ``d`` and not above 1 at ``d / 2``. A message on a wrong answer says on
    which side the crossover lies, not where. An answer that calls :func:`crossover_gap`, or
    its private helpers, is refused; :func:`sampled_query_gradient_norms` (standard normal entries) is allowed.
    """
    name = "gradient_crossover"
    _check_callable("the function to check", gradient_crossover)
    gradient_crossover = _refusing_reference(
        gradient_crossover,
        "measure the gradient gap",
        (crossover_gap, _crossover_gap, _measure_crossover_gap),
    )
    result = None
    count = 0
    for count, sigma in enumerate(CROSSOVER_SIGMAS, start=1):
        got, result = call_reader(name, count, gradient_crossover, {"sigma": sigma})
        if result is not None:
            break
        setting = f"case {count} (sigma={sigma:.3g})"
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        if got is None:
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: {setting}: got None, no crossover found among the widths"
                f" {CROSSOVER_D_KS[0]} to {CROSSOVER_D_KS[-1]}; yet at every sigma the check"
                " uses the crossover lies inside that range. Check how sigma enters the"
                " softmax input of both layers (q and k each carry sigma, so the scores carry"
                " sigma squared, not a higher power); the statistic: the median over the"
                " queries, not the mean, which a few near ties carry;"
                " and the protocol: 16 keys per query (more keys move the crossover to larger"
                f" widths) and {CROSSOVER_QUERIES:,} queries per width (with far fewer, a"
                " median gap just above 1 can come out below it).",
            )
            break
        if (
            not isinstance(got, (int, np.integer))
            or isinstance(got, bool)
            or got not in (CROSSOVER_D_KS)
        ):
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: {setting}: expected one of the widths {CROSSOVER_D_KS[0]}, "
                f"{CROSSOVER_D_KS[1]}, ..., {CROSSOVER_D_KS[-1]} (an int), got "
                f"{type(got).__name__} {got!r}"[:300],
            )
            break
        d_k = int(got)
        problem = None
        if _crossover_gap(d_k, sigma) <= 1:
            problem = (
                f"at d_k = {d_k} the typical unscaled query still gets at least as much gradient"
                " as the scaled one: the crossover lies at a larger width"
            )
        elif d_k > CROSSOVER_D_KS[0] and _crossover_gap(d_k // 2, sigma) > 1:
            problem = (
                f"already at d_k = {d_k // 2} the typical unscaled query gets less gradient than"
                " the scaled one: the crossover lies at a smaller width"
            )
        if problem:
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: {setting}: {problem}.\n   Check the protocol: queries AND keys"
                " with entries of std sigma, the gradient with respect to the query q (not the"
                " softmax input), one norm per query, the median over"
                f" {CROSSOVER_QUERIES:,} queries per width (fewer can land on the wrong side"
                " of 1 near the crossover),"
                " scaled divided by unscaled, and every width from 2 up.",
            )
            break
    if result is None:
        result = CheckResult(
            name,
            True,
            count,
            f"✅ {name}: the right width at all {count} values of sigma.",
        )
    if verbose:
        report(result)
    return result


# ---------------------------------------------------------------------------------------------
# Exercise 5 - the backward pass of attention, by hand
# ---------------------------------------------------------------------------------------------


def reference_attention_backward(
    q: Tensor, k: Tensor, v: Tensor, grad_output: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: ``(∂L/∂q, ∂L/∂k, ∂L/∂v)`` of ``softmax(q kᵀ/√d_k) v``, by the chain rule
    in float64 (``tests/test_exercises_ch02.py`` checks it against autograd).

    Args:
        q: queries ``(..., q_len, d_k)``.
        k: keys ``(..., k_len, d_k)``.
        v: values ``(..., k_len, d_v)``.
        grad_output: ``∂L/∂output``, ``(..., q_len, d_v)``.

    Returns:
        gradients shaped like ``q``, ``k`` and ``v``.
    """
    q64, k64, v64, g64 = (t.double() for t in (q, k, v, grad_output))
    scale = 1 / math.sqrt(q.shape[-1])
    weights = torch.softmax(scale * q64 @ k64.transpose(-2, -1), dim=-1)  # (..., q_len, k_len)
    grad_v = weights.transpose(-2, -1) @ g64  # (..., k_len, d_v)
    grad_weights = g64 @ v64.transpose(-2, -1)  # (..., q_len, k_len)
    # the softmax's Jacobian, row by row: p ⊙ (g − Σ_j p_j g_j)
    grad_scores = weights * (grad_weights - (weights * grad_weights).sum(-1, keepdim=True))
    grad_q = scale * grad_scores @ k64  # (..., q_len, d_k)
    grad_k = scale * grad_scores.transpose(-2, -1) @ q64  # (..., k_len, d_k)
    return tuple(g.to(q.dtype) for g in (grad_q, grad_k, grad_v))  # type: ignore[return-value]


def _attention_backward_cases(seed: int = 30) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # (leading dims, q_len, k_len, d_k, d_v, score size): q_len ≠ k_len and d_k ≠ d_v, so a
    # transposed product has the wrong shape; large scores for a nearly saturated softmax
    settings = [
        ((), 3, 5, 4, 2, 1.0),
        ((2,), 4, 6, 8, 3, 1.0),
        ((2, 3), 5, 4, 16, 6, 1.0),
        ((), 6, 6, 64, 5, 1.0),
        ((3,), 2, 7, 4, 4, 3.0),
    ]
    for lead, q_len, k_len, d_k, d_v, size in settings:
        yield {
            "q": size * torch.randn(*lead, q_len, d_k, generator=gen),
            "k": size * torch.randn(*lead, k_len, d_k, generator=gen),
            "v": torch.randn(*lead, k_len, d_v, generator=gen),
            "grad_output": torch.randn(*lead, q_len, d_v, generator=gen),
        }


#: What :func:`autograd_forbidden` switches off: ``(module, attribute)`` pairs.
_AUTOGRAD_ENTRY_POINTS = (
    (torch.autograd, "grad"),
    (torch.autograd, "backward"),
    (torch.Tensor, "backward"),
    (torch.func, "grad"),
    (torch.func, "grad_and_value"),
    (torch.func, "vjp"),
    (torch.func, "jacrev"),
    (torch.func, "jacfwd"),
    (torch.autograd.functional, "vjp"),
    (torch.autograd.functional, "jacobian"),
)


_AUTOGRAD_REFUSED = (
    "attention_backward must apply the chain rule itself: during the check autograd"
    " (torch.autograd.grad, Tensor.backward, torch.func, requires_grad) is switched off"
)


class _NoGradGraph(TorchFunctionMode):
    """Refuses any PyTorch call that returns a tensor autograd tracks (``requires_grad``):
    under ``torch.no_grad()`` none does unless the reader's code switches gradients back on."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        result = func(*args, **(kwargs or {}))
        if any(t.requires_grad for t in _tensors(result)):
            raise RuntimeError(_AUTOGRAD_REFUSED)
        return result


@contextlib.contextmanager
def autograd_forbidden() -> Iterator[None]:
    """Inside the block, every way to ask autograd for a gradient raises a ``RuntimeError``.

    ``torch.autograd.grad``, ``torch.autograd.backward``, ``Tensor.backward`` and the
    gradient transforms of ``torch.func`` and ``torch.autograd.functional`` are replaced for
    the duration of the block and restored afterwards, even when the block raises; names
    imported earlier are caught too: any call that returns a tensor with ``requires_grad``
    and any tensor autograd saves for a backward pass raise.
    :func:`check_attention_backward` runs the reader's function inside it.
    """
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in _AUTOGRAD_ENTRY_POINTS]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(_AUTOGRAD_REFUSED)

    def refuse_saved(tensor: Tensor) -> Any:
        refuse()

    try:
        for owner, attr, _ in saved:
            setattr(owner, attr, refuse)
        # names imported before the block (``from torch.autograd import grad``) escape the
        # patches above; no gradient exists without a graph, so building one is refused too
        try:
            with _NoGradGraph(), torch.autograd.graph.saved_tensors_hooks(refuse_saved, refuse):
                yield
        except RuntimeError as error:  # torch.func refuses to run under the hooks above
            if "saved tensor hooks" in str(error):
                raise RuntimeError(_AUTOGRAD_REFUSED) from error
            raise
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


#: phrases of torch's errors for a matrix product of mismatched shapes
_SHAPE_ERRORS = (
    "cannot be multiplied",
    "Expected size for first two dimensions",
    "must match the size",
)


def check_attention_backward(
    attention_backward: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]],
    verbose: bool = True,
) -> CheckResult:
    """Check ``attention_backward(q, k, v, grad_output) -> (grad_q, grad_k, grad_v)``.

    ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``, ``v (..., k_len, d_v)``,
    ``grad_output (..., q_len, d_v)``; the three gradients of ``L`` (with
    ``∂L/∂output = grad_output``) through ``softmax(q kᵀ/√d_k) v``, shaped like ``q``, ``k``
    and ``v``. Your function runs under ``torch.no_grad()`` and :func:`autograd_forbidden`: it
    must apply the chain rule itself, not call autograd or
    :func:`reference_attention_backward`.
    """
    name = "attention_backward"
    by_hand = _refusing_reference(
        attention_backward, "apply the chain rule", (reference_attention_backward,)
    )

    def without_autograd(q: Tensor, k: Tensor, v: Tensor, grad_output: Tensor) -> Any:
        with torch.no_grad(), autograd_forbidden():
            try:
                return by_hand(q, k, v, grad_output)
            except RuntimeError as error:  # a product of mismatched shapes: name the usual slip
                if not any(phrase in str(error) for phrase in _SHAPE_ERRORS):
                    raise
                raise RuntimeError(
                    f"{error} (hint: check each product's shape; grad_v = weightsᵀ @ grad_output"
                    " is (..., k_len, d_v) and grad_k = (∂L/∂s̃)ᵀ @ q is (..., k_len, d_k))"
                ) from None

    return run_check(
        name,
        without_autograd,
        reference_attention_backward,
        _attention_backward_cases(),
        verbose=verbose,
        hint=_attention_backward_hint,
    )


def _attention_backward_hint(case: Case, got: Any) -> str:
    """Names a slip of the scale: ∂L/∂q and ∂L/∂k off by exactly √d_k or 1/√d_k."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        return ""
    expected = reference_attention_backward(**case)
    root = math.sqrt(case["q"].shape[-1])
    for factor, slip in (
        (root, "the 1/√d_k missing on the way back"),
        (1 / root, "it applied twice"),
    ):
        if all(
            isinstance(g, Tensor)
            and g.shape == e.shape
            and torch.allclose(g.double(), factor * e.double(), atol=1e-5, rtol=1e-4)
            for g, e in zip(got[:2], expected[:2])
        ):
            return f"\n   Hint: ∂L/∂q and ∂L/∂k are off by a factor √d_k{'' if factor > 1 else ' (too small)'}: {slip}?"
    q, k, v = (case[name].double() for name in ("q", "k", "v"))
    scale = 1 / root
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # (..., q_len, k_len)
    upstream = case["grad_output"].double() @ v.transpose(-2, -1)  # u: (..., q_len, k_len)
    slips = (  # (a wrong ∂L/∂s̃, its hint)
        (  # the diagonal-Jacobian slip: α (1 − α) u, without the coupling −Σ_l α_l u_l
            weights * (1 - weights) * upstream,
            "\n   Hint: this is α ⊙ (1 − α) ⊙ u, the softmax Jacobian's diagonal only: raising one"
            " score also lowers every other weight of its row, so ∂L/∂s̃ = α ⊙ (u − Σ_l α_l u_l)",
        ),
        (  # no subtraction at all: α u, as if the weights were exp(s̃) without the normalising sum
            weights * upstream,
            "\n   Hint: this is α ⊙ u, the gradient of exp(s̃) without the softmax's normalising sum:"
            " the weights sum to 1, so ∂L/∂s̃ = α ⊙ (u − Σ_l α_l u_l)",
        ),
    )
    for grad_scores, hint in slips:  # (..., q_len, k_len) each
        slipped = (scale * grad_scores @ k, scale * grad_scores.transpose(-2, -1) @ q)
        if all(
            isinstance(g, Tensor)
            and g.shape == e.shape
            and torch.allclose(g.double(), e, atol=1e-5, rtol=1e-4)
            for g, e in zip(got[:2], slipped)
        ):
            return hint
    return ""
