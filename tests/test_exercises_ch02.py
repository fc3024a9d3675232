"""Chapter 2 exercise checks accept correct answers and reject plausible wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from companion.attention import scaled_dot_product_attention
from companion.exercises import ch02

# ---------------------------------------------------------------------------------------------
# scaled_attention
# ---------------------------------------------------------------------------------------------


def scaled_attention_with_companion(q, k, v):
    return scaled_dot_product_attention(q, k, v)


def scaled_attention_divides_by_d_k(q, k, v):
    weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], dim=-1)
    return weights @ v, weights


def scaled_attention_unscaled(q, k, v):
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ v, weights


def scaled_attention_softmax_over_queries(q, k, v):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
    return weights @ v, weights


def scaled_attention_2d_transpose(q, k, v):
    scores = q @ k.transpose(0, 1) / math.sqrt(q.shape[-1])  # only right for 2-D inputs
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


# ---------------------------------------------------------------------------------------------
# masked_softmax
# ---------------------------------------------------------------------------------------------


def masked_softmax_with_nan_to_num(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0)


def masked_softmax_minus_inf(scores, mask):  # NaN for a fully blocked row
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def masked_softmax_inverted(scores, mask):  # True taken as "blocked"
    return ch02.reference_masked_softmax(scores, ~mask)


def masked_softmax_zeroed_after(scores, mask):  # rows no longer sum to 1
    return torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)


def masked_softmax_blocked_row_uniform(scores, mask):  # fully blocked row: 1/k_len, not 0
    return torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)


# ---------------------------------------------------------------------------------------------
# weight_entropy
# ---------------------------------------------------------------------------------------------


def weight_entropy_xlogy(weights):
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def weight_entropy_base_2(weights):
    return ch02.reference_weight_entropy(weights) / math.log(2)


def weight_entropy_naive(weights):  # 0 · log 0 = 0 · (-inf) = NaN
    return -(weights * torch.log(weights)).sum(dim=-1)


def weight_entropy_wrong_axis(weights):
    safe = torch.where(weights > 0, weights, torch.ones_like(weights))
    return -(weights * torch.log(safe)).sum(dim=-2)


# ---------------------------------------------------------------------------------------------
# dot_product_variance
# ---------------------------------------------------------------------------------------------


def dot_product_variance_explicit(q, k, scaled):
    dots = torch.einsum("nd,nd->n", q.double(), k.double())
    if scaled:
        dots = dots / q.shape[-1] ** 0.5
    mean = dots.mean()
    return ((dots - mean) ** 2).sum() / (dots.numel() - 1)  # a 0-d tensor is accepted too


def dot_product_variance_divides_by_d_k(q, k, scaled):
    dots = (q * k).sum(-1)
    return float((dots / q.shape[-1] if scaled else dots).var())


def dot_product_variance_biased(q, k, scaled):
    dots = (q * k).sum(-1)
    dots = dots / math.sqrt(q.shape[-1]) if scaled else dots
    return float(dots.var(correction=0))


def dot_product_variance_all_pairs(q, k, scaled):  # every q[i] with every k[j]
    dots = q @ k.T
    dots = dots / math.sqrt(q.shape[-1]) if scaled else dots
    return float(dots.var())


def dot_product_variance_ignores_scaled(q, k, scaled):
    return float((q * k).sum(-1).var())


# ---------------------------------------------------------------------------------------------


def _stub(*args, **kwargs):
    raise NotImplementedError  # your code here


CHECKS = {
    "scaled_attention": (
        ch02.check_scaled_attention,
        [ch02.reference_scaled_attention, scaled_attention_with_companion],
        [
            scaled_attention_divides_by_d_k,
            scaled_attention_unscaled,
            scaled_attention_softmax_over_queries,
            scaled_attention_2d_transpose,
        ],
    ),
    "masked_softmax": (
        ch02.check_masked_softmax,
        [ch02.reference_masked_softmax, masked_softmax_with_nan_to_num],
        [
            masked_softmax_minus_inf,
            masked_softmax_inverted,
            masked_softmax_zeroed_after,
            masked_softmax_blocked_row_uniform,
        ],
    ),
    "weight_entropy": (
        ch02.check_weight_entropy,
        [ch02.reference_weight_entropy, weight_entropy_xlogy],
        [weight_entropy_base_2, weight_entropy_naive, weight_entropy_wrong_axis],
    ),
    "dot_product_variance": (
        ch02.check_dot_product_variance,
        [ch02.reference_dot_product_variance, dot_product_variance_explicit],
        [
            dot_product_variance_divides_by_d_k,
            dot_product_variance_biased,
            dot_product_variance_all_pairs,
            dot_product_variance_ignores_scaled,
        ],
    ),
}

CORRECT = [(name, fn) for name, (_, good, _) in CHECKS.items() for fn in good]
WRONG = [(name, fn) for name, (_, _, bad) in CHECKS.items() for fn in bad]


@pytest.mark.parametrize("name,fn", CORRECT, ids=[fn.__name__ for _, fn in CORRECT])
def test_correct_implementation_passes(name, fn, capsys):
    result = CHECKS[name][0](fn)
    assert result, result.message
    assert result.cases_run >= 4
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("name,fn", WRONG, ids=[fn.__name__ for _, fn in WRONG])
def test_plausible_wrong_implementation_fails(name, fn):
    result = CHECKS[name][0](fn, verbose=False)
    assert not result
    assert "❌" in result.message


@pytest.mark.parametrize("name", list(CHECKS))
def test_cases_are_reproducible(name):
    first = CHECKS[name][0](CHECKS[name][1][0], verbose=False)
    second = CHECKS[name][0](CHECKS[name][1][0], verbose=False)
    assert first.cases_run == second.cases_run and first and second


def test_masked_softmax_cases_cover_a_fully_blocked_row():
    cases = list(ch02._masked_softmax_cases())
    assert any((~c["mask"].expand_as(c["scores"])).all(-1).any() for c in cases)
    for case in cases:
        weights = ch02.reference_masked_softmax(**case)
        assert torch.isfinite(weights).all()
        sums = weights.sum(-1)
        assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0))
