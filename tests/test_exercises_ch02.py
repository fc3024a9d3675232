"""Chapter 2 exercise checks accept correct answers and reject plausible wrong ones."""

from __future__ import annotations

import math

import numpy as np
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


# ---------------------------------------------------------------------------------------------
# blockwise_attention (the online softmax)
# ---------------------------------------------------------------------------------------------


def blockwise_correct(q, k, v, block_size):
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"))
    total = torch.zeros(*q.shape[:-1], 1)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1])
    for start in range(0, k.shape[-2], block_size):
        scores = q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale
        new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        correction = torch.exp(running_max - new_max)
        p = torch.exp(scores - new_max)
        total = total * correction + p.sum(-1, keepdim=True)
        acc = acc * correction + p @ v[..., start : start + block_size, :]
        running_max = new_max
    return acc / total


def blockwise_logsumexp(q, k, v, block_size):  # merges blocks through log-sum-exp
    scale = 1 / math.sqrt(q.shape[-1])
    lse, out = None, None
    for start in range(0, k.shape[-2], block_size):
        s = q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale
        block_lse = torch.logsumexp(s, -1, keepdim=True)
        block_out = torch.softmax(s, -1) @ v[..., start : start + block_size, :]
        if lse is None:
            lse, out = block_lse, block_out
        else:
            new = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - new) + block_out * torch.exp(block_lse - new)
            lse = new
    return out


def blockwise_no_rescale(q, k, v, block_size):  # keeps the first block's maximum forever
    scale = 1 / math.sqrt(q.shape[-1])
    running_max, total, acc = None, 0.0, 0.0
    for start in range(0, k.shape[-2], block_size):
        scores = q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale
        new_max = scores.amax(-1, keepdim=True)
        running_max = new_max if running_max is None else torch.maximum(running_max, new_max)
        p = torch.exp(scores - running_max)  # earlier blocks are never corrected
        total = total + p.sum(-1, keepdim=True)
        acc = acc + p @ v[..., start : start + block_size, :]
    return acc / total


def blockwise_mean_of_blocks(q, k, v, block_size):  # softmax per block, then the average
    scale = 1 / math.sqrt(q.shape[-1])
    outs = [
        torch.softmax(q @ k[..., s : s + block_size, :].transpose(-2, -1) * scale, -1)
        @ v[..., s : s + block_size, :]
        for s in range(0, k.shape[-2], block_size)
    ]
    return sum(outs) / len(outs)


def blockwise_naive_exp(q, k, v, block_size):  # no maximum: exp overflows for large scores
    scale = 1 / math.sqrt(q.shape[-1])
    total, acc = 0.0, 0.0
    for start in range(0, k.shape[-2], block_size):
        p = torch.exp(q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale)
        total = total + p.sum(-1, keepdim=True)
        acc = acc + p @ v[..., start : start + block_size, :]
    return acc / total


def blockwise_drops_last_block(q, k, v, block_size):
    full = (k.shape[-2] // block_size) * block_size
    return blockwise_correct(q, k[..., :full, :], v[..., :full, :], block_size)


def blockwise_unscaled(q, k, v, block_size):
    return blockwise_correct(q * math.sqrt(q.shape[-1]), k, v, block_size)


def test_blockwise_accepts_correct():
    assert ch02.check_blockwise_attention(blockwise_correct, verbose=False)
    assert ch02.check_blockwise_attention(blockwise_logsumexp, verbose=False)
    full = lambda q, k, v, block_size: scaled_dot_product_attention(q, k, v)[0]  # noqa: E731
    assert ch02.check_blockwise_attention(full, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        blockwise_no_rescale,
        blockwise_mean_of_blocks,
        blockwise_naive_exp,
        blockwise_drops_last_block,
        blockwise_unscaled,
    ],
)
def test_blockwise_rejects_wrong(wrong):
    result = ch02.check_blockwise_attention(wrong, verbose=False)
    assert not result
    assert "❌" in result.message


# ---------------------------------------------------------------------------------------------
# gradient_threshold (a measurement)
# ---------------------------------------------------------------------------------------------


def _scan(n_keys, statistic="median", scaled=False, upstream=True, d_ks=range(64, 1040, 16)):
    """The chapter's protocol; the first d_k whose statistic falls below 1e-3, else None.

    Scores are drawn as ‖q‖ z with ‖q‖² ~ χ²(d_k), the distribution of q·k given q, which
    keeps the scan fast."""
    gen = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(3)
    for d_k in d_ks:
        norms = torch.from_numpy(rng.chisquare(d_k, size=(20_000, 1))).sqrt()
        scores = norms * torch.randn(20_000, n_keys, generator=gen, dtype=torch.float64)
        if scaled:
            scores = scores / math.sqrt(d_k)
        scores.requires_grad_()
        t = torch.randn(20_000, n_keys, generator=gen, dtype=torch.float64)
        probs = torch.softmax(scores, -1)
        (probs * t if upstream else probs).sum().backward()
        grad_norms = scores.grad.norm(dim=-1)
        if getattr(grad_norms, statistic)() < 1e-3:
            return d_k
    return None


def threshold_correct(n_keys):
    return _scan(n_keys)


def threshold_powers_of_two(n_keys):  # the chapter's grid: brackets the crossing only
    return _scan(n_keys, d_ks=[4 * 2**i for i in range(9)])


def threshold_mean(n_keys):  # the mean is carried by rare near-ties: never below 1e-3 here
    return _scan(n_keys, statistic="mean")


def threshold_scaled(n_keys):  # scaled scores keep their gradient
    return _scan(n_keys, scaled=True)


def threshold_no_upstream(n_keys):  # L = Σ p = 1: the gradient is exactly 0 at once
    return _scan(n_keys, upstream=False)


def threshold_ignores_n_keys(n_keys):
    return _scan(16)


def test_gradient_threshold_accepts_correct(capsys):
    assert ch02.check_gradient_threshold(threshold_correct)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong",
    [
        threshold_powers_of_two,
        threshold_mean,
        threshold_scaled,
        threshold_no_upstream,
        threshold_ignores_n_keys,
        lambda n_keys: "about 370",  # a string
    ],
)
def test_gradient_threshold_rejects_wrong(wrong):
    result = ch02.check_gradient_threshold(wrong, verbose=False)
    assert not result
    assert "❌" in result.message
    assert str(ch02.GRADIENT_THRESHOLDS[n_keys_of(result)]) not in result.message  # no spoiler


def n_keys_of(result):
    return {1: 16, 2: 8, 3: 32}[result.cases_run]


def test_gradient_thresholds_are_where_the_median_crosses():
    """Each stored threshold is where an independent measurement crosses 1e-3."""
    gen = torch.Generator().manual_seed(2)
    for n_keys, threshold in ch02.GRADIENT_THRESHOLDS.items():
        before = ch02.median_score_gradient(round(threshold * 0.95), n_keys, 200_000, gen)
        after = ch02.median_score_gradient(round(threshold * 1.05), n_keys, 200_000, gen)
        assert before > 1e-3 > after, (n_keys, before, after)
