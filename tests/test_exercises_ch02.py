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
# median_gradient_gap (a measurement at settings the chapter does not print)
# ---------------------------------------------------------------------------------------------


def _brute_norms(d_k, n_keys, scale, n_queries, gen, at_query=True, upstream=True):
    """‖∂L/∂q‖ (or ‖∂L/∂z‖ at the softmax input) per query by autograd, in chunks."""
    norms = []
    for _ in range(n_queries // 2000):
        q = torch.randn(2000, 1, d_k, generator=gen, dtype=torch.float64).requires_grad_()
        k = torch.randn(2000, n_keys, d_k, generator=gen, dtype=torch.float64)
        t = torch.randn(2000, n_keys, generator=gen, dtype=torch.float64)
        z = scale * (q @ k.transpose(-2, -1)).squeeze(-2)  # (2000, n_keys) softmax input
        z.retain_grad()
        p = torch.softmax(z, dim=-1)
        (p * t if upstream else p).sum().backward()
        grad = q.grad.squeeze(-2) if at_query else z.grad
        norms.append(grad.norm(dim=-1))
    return torch.cat(norms)


def _gap(d_k, n_keys, statistic="median", at_query=True, upstream=True, root=True, n=10_000):
    gen = torch.Generator().manual_seed(5)
    factor = 1 / math.sqrt(d_k) if root else 1 / d_k
    if at_query and upstream and statistic != "median":  # the shortcut, for speed
        scaled = ch02.sampled_query_gradient_norms(d_k, n_keys, factor, n, gen)
        unscaled = ch02.sampled_query_gradient_norms(d_k, n_keys, 1.0, n, gen)
    else:
        kwargs = {"at_query": at_query, "upstream": upstream}
        scaled = _brute_norms(d_k, n_keys, factor, n, gen, **kwargs)
        unscaled = _brute_norms(d_k, n_keys, 1.0, n, gen, **kwargs)
    return (getattr(scaled, statistic)() / getattr(unscaled, statistic)()).item()


def gap_correct(d_k, n_keys):
    return _gap(d_k, n_keys)


def gap_at_softmax_input(d_k, n_keys):  # the chain rule's 1/√d_k left out
    return _gap(d_k, n_keys, at_query=False, n=4000)


def gap_of_means(d_k, n_keys):  # the mean is carried by the few queries that still learn
    return _gap(d_k, n_keys, statistic="mean")


def gap_inverted(d_k, n_keys):
    return 1 / _gap(d_k, n_keys, n=4000)


def gap_divides_by_d_k(d_k, n_keys):
    return _gap(d_k, n_keys, root=False, n=4000)


def gap_no_upstream(d_k, n_keys):  # L = Σ p = 1 has no gradient: 0 / 0
    return _gap(d_k, n_keys, upstream=False, n=2000)


def gap_ignores_n_keys(d_k, n_keys):
    return _gap(d_k, 16, n=4000)


#: Chapter 2's table, 16 keys per query at d_k = 4, 8, ..., 1024 (median gap): a reader who
#: reads the nearest row off the table instead of measuring.
CHAPTER_TABLE = {64: 0.59, 128: 1.32, 256: 5.1, 512: 41.3, 1024: 900.0}


def gap_read_off_the_table(d_k, n_keys):
    nearest = min(CHAPTER_TABLE, key=lambda d: abs(math.log(d / d_k)))
    return CHAPTER_TABLE[nearest]


def gap_copied_number(d_k, n_keys):  # the chapter's headline number, whatever the setting
    return 900.0


def test_gradient_gap_accepts_a_measurement(capsys):
    assert ch02.check_gradient_gap(gap_correct)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong",
    [
        gap_at_softmax_input,
        gap_of_means,
        gap_inverted,
        gap_divides_by_d_k,
        gap_no_upstream,
        gap_ignores_n_keys,
        gap_read_off_the_table,
        gap_copied_number,
        lambda d_k, n_keys: "about 6",  # a string
        lambda d_k, n_keys: -1.0,
    ],
)
def test_gradient_gap_rejects_wrong(wrong):
    result = ch02.check_gradient_gap(wrong, verbose=False)
    assert not result
    assert "❌" in result.message
    d_k, n_keys = ch02.GAP_SETTINGS[result.cases_run - 1]
    assert f"{ch02.reference_gradient_gap(d_k, n_keys):.3g}" not in result.message  # no spoiler


def test_gradient_gap_settings_are_not_on_the_chapters_grid():
    assert all(n_keys != 16 for _, n_keys in ch02.GAP_SETTINGS)  # the chapter uses 16 keys
    # the table's nearest row misses at least one setting by more than the tolerance
    assert not ch02.check_gradient_gap(gap_read_off_the_table, verbose=False)


def test_sampled_norms_follow_the_brute_force_distribution():
    """The reference's shortcut has the distribution of the autograd measurement."""
    for d_k, n_keys in [(24, 5), (200, 8)]:
        for scale in (1 / math.sqrt(d_k), 1.0):
            fast = ch02.sampled_query_gradient_norms(
                d_k, n_keys, scale, 20_000, torch.Generator().manual_seed(1)
            )
            brute = _brute_norms(d_k, n_keys, scale, 20_000, torch.Generator().manual_seed(2))
            for level in (0.25, 0.5, 0.75):
                a, b = fast.quantile(level).item(), brute.quantile(level).item()
                assert abs(math.log(a / b)) < 0.12, (d_k, n_keys, scale, level, a, b)


# ---------------------------------------------------------------------------------------------
# attention_backward (the chain rule by hand)
# ---------------------------------------------------------------------------------------------


def _forward(q, k, v, root=True):
    scale = 1 / math.sqrt(q.shape[-1]) if root else 1.0
    weights = torch.softmax(scale * q @ k.transpose(-2, -1), dim=-1)
    return scale, weights


def backward_correct(q, k, v, grad_output):
    scale, weights = _forward(q, k, v)
    grad_v = weights.transpose(-2, -1) @ grad_output
    grad_weights = grad_output @ v.transpose(-2, -1)
    grad_z = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
    return scale * grad_z @ k, scale * grad_z.transpose(-2, -1) @ q, grad_v


def backward_without_scale(q, k, v, grad_output):  # the chain rule's 1/√d_k forgotten
    scale, weights = _forward(q, k, v)
    grad_v = weights.transpose(-2, -1) @ grad_output
    grad_weights = grad_output @ v.transpose(-2, -1)
    grad_z = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
    return grad_z @ k, grad_z.transpose(-2, -1) @ q, grad_v


def backward_diagonal_jacobian(q, k, v, grad_output):  # p (1 - p), as if elementwise
    scale, weights = _forward(q, k, v)
    grad_v = weights.transpose(-2, -1) @ grad_output
    grad_z = weights * (1 - weights) * (grad_output @ v.transpose(-2, -1))
    return scale * grad_z @ k, scale * grad_z.transpose(-2, -1) @ q, grad_v


def backward_grad_k_untransposed(q, k, v, grad_output):
    grad_q, _, grad_v = backward_correct(q, k, v, grad_output)
    scale, weights = _forward(q, k, v)
    grad_weights = grad_output @ v.transpose(-2, -1)
    grad_z = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
    return grad_q, scale * (grad_z @ q.transpose(-2, -1)).transpose(-2, -1), grad_v


def backward_grad_v_weights(q, k, v, grad_output):  # weights @ grad_output: wrong shape
    grad_q, grad_k, _ = backward_correct(q, k, v, grad_output)
    _, weights = _forward(q, k, v)
    return grad_q, grad_k, weights[..., : v.shape[-2]] @ grad_output[..., : v.shape[-2], :]


def backward_with_autograd(q, k, v, grad_output):  # correct, but the check forbids autograd
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    output, _ = scaled_dot_product_attention(*leaves)
    return torch.autograd.grad(output, leaves, grad_output)


def test_attention_backward_accepts_correct(capsys):
    assert ch02.check_attention_backward(backward_correct)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong",
    [
        backward_without_scale,
        backward_diagonal_jacobian,
        backward_grad_k_untransposed,
        backward_grad_v_weights,
        backward_with_autograd,
    ],
)
def test_attention_backward_rejects_wrong(wrong):
    result = ch02.check_attention_backward(wrong, verbose=False)
    assert not result
    assert "❌" in result.message


def test_attention_backward_explains_the_autograd_refusal():
    result = ch02.check_attention_backward(backward_with_autograd, verbose=False)
    assert "chain rule itself" in result.message
