"""Chapter 2 exercise checks accept correct answers and reject plausible wrong ones."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.autograd import grad as _grad_imported_at_module_level
from torch.func import vjp as _vjp_imported_at_module_level

from companion.attention import scaled_dot_product_attention
from companion.exercises import ch02

# ---------------------------------------------------------------------------------------------
# blockwise_attention (the online softmax)
# ---------------------------------------------------------------------------------------------


def _blockwise(q, k, v, block_size, first_max):
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), first_max)
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


def blockwise_correct(q, k, v, block_size):
    return _blockwise(q, k, v, block_size, float("-inf"))


def blockwise_max_from_zero(q, k, v, block_size):  # the running maximum starts at 0, not -inf
    return _blockwise(q, k, v, block_size, 0.0)


def test_blockwise_rejects_a_running_maximum_started_at_zero():
    """Right whenever some score of a query is positive; the case whose query scores all
    its keys below about -200 turns exp(score - 0) into 0 and the output into 0/0."""
    result = ch02.check_blockwise_attention(blockwise_max_from_zero, verbose=False)
    assert not result and "❌" in result.message, result.message
    easy = next(iter(ch02._blockwise_cases()))
    torch.testing.assert_close(
        blockwise_max_from_zero(**easy),
        ch02.reference_scaled_attention(easy["q"], easy["k"], easy["v"])[0],
    )


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


def blockwise_float32_output(q, k, v, block_size):  # hard-codes float32: float64 in, float32 out
    return blockwise_correct(q.float(), k.float(), v.float(), block_size)


def blockwise_float32_cast_back(q, k, v, block_size):  # float32 inside, then cast back
    return blockwise_float32_output(q, k, v, block_size).to(q.dtype)


@pytest.mark.parametrize("wrong", [blockwise_float32_output, blockwise_float32_cast_back])
def test_blockwise_rejects_a_hard_coded_float32(wrong):
    result = ch02.check_blockwise_attention(wrong, verbose=False)
    assert not result.passed
    assert "PrecisionLost" in result.message and "float64" in result.message, result.message
    # ... and only the float64 case catches it: every float32 case passes
    float32_cases = [c for c in ch02._blockwise_cases() if c["q"].dtype == torch.float32]
    assert len(float32_cases) < len(list(ch02._blockwise_cases()))
    for case in float32_cases:
        assert torch.allclose(wrong(**case), blockwise_correct(**case), atol=1e-6)


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


def blockwise_own_block_max(q, k, v, block_size):  # each block's own maximum, not max(old, block)
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"))
    total = torch.zeros(*q.shape[:-1], 1)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1])
    for start in range(0, k.shape[-2], block_size):
        scores = q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale
        block_max = scores.amax(-1, keepdim=True)
        correction = torch.exp(running_max - block_max)  # above 1 when the block's max is lower
        p = torch.exp(scores - block_max)
        total = total * correction + p.sum(-1, keepdim=True)
        acc = acc * correction + p @ v[..., start : start + block_size, :]
        running_max = block_max
    return acc / total


def test_blockwise_hint_names_the_running_maximum():
    """Algebraically right, but exp(old - block) overflows on the large-score case; the hint
    must point to max(old, block), not only to the start at -inf."""
    easy = next(iter(ch02._blockwise_cases()))
    torch.testing.assert_close(  # right on small scores: only the overflow gives it away
        blockwise_own_block_max(**easy),
        ch02.reference_scaled_attention(easy["q"], easy["k"], easy["v"])[0],
    )
    result = ch02.check_blockwise_attention(blockwise_own_block_max, verbose=False)
    assert not result and "max(old, block)" in result.message, result.message


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


def blockwise_kt_first(q, k, v, block_size):  # transposes all keys first, then slices
    kt = k.transpose(-2, -1)  # (..., d_k, k_len): not a score matrix, must be allowed
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"))
    total = torch.zeros(*q.shape[:-1], 1)
    out = torch.zeros(*q.shape[:-1], v.shape[-1])
    for start in range(0, k.shape[-2], block_size):
        scores = q @ kt[..., start : start + block_size] * scale
        new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        correction = torch.exp(running_max - new_max)
        p = torch.exp(scores - new_max)
        total = total * correction + p.sum(-1, keepdim=True)
        out = out * correction + p @ v[..., start : start + block_size, :]
        running_max = new_max
    return out / total


def blockwise_full_companion(q, k, v, block_size):  # ignores the blocks
    return scaled_dot_product_attention(q, k, v)[0]


def blockwise_full_softmax(q, k, v, block_size):  # the four lines, blocks ignored
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v


def blockwise_fused(q, k, v, block_size):  # PyTorch's fused kernel on all keys
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def blockwise_scores_by_broadcast(q, k, v, block_size):  # all scores without a matmul
    scores = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) / math.sqrt(q.shape[-1])
    exp_scores = torch.exp(scores - scores.amax(-1, keepdim=True))  # softmax by hand
    return exp_scores / exp_scores.sum(-1, keepdim=True) @ v


def blockwise_scores_keepdim(q, k, v, block_size):  # all scores, kept as (..., q_len, k_len, 1)
    scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1, keepdim=True) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-2)  # over the keys, axis -2 here
    return (weights * v.unsqueeze(-3)).sum(-2)  # (..., q_len, d_v)


def blockwise_concatenated_scores(q, k, v, block_size):  # blocks, then all scores glued
    scale = 1 / math.sqrt(q.shape[-1])
    blocks = [
        q @ k[..., s : s + block_size, :].transpose(-2, -1) * scale
        for s in range(0, k.shape[-2], block_size)
    ]
    return torch.softmax(torch.cat(blocks, dim=-1), dim=-1) @ v


def blockwise_every_block_kept(q, k, v, block_size):  # one global maximum, no running rescale
    scale = 1 / math.sqrt(q.shape[-1])
    starts = range(0, k.shape[-2], block_size)
    blocks = [q @ k[..., s : s + block_size, :].transpose(-2, -1) * scale for s in starts]
    top = blocks[0].amax(-1, keepdim=True)
    for block in blocks[1:]:
        top = torch.maximum(top, block.amax(-1, keepdim=True))
    total, acc = 0.0, 0.0
    for block, s in zip(blocks, starts):
        p = torch.exp(block - top)
        total = total + p.sum(-1, keepdim=True)
        acc = acc + p @ v[..., s : s + block_size, :]
    return acc / total


def blockwise_one_query_at_a_time(q, k, v, block_size):  # every key's score, query by query
    rows = [
        torch.softmax(q[..., i : i + 1, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v
        for i in range(q.shape[-2])
    ]
    return torch.cat(rows, dim=-2)


def blockwise_one_query_vector(q, k, v, block_size):  # 1-D scores of one query over all keys
    q2, k2, v2 = (
        q.reshape(-1, *q.shape[-2:]),
        k.reshape(-1, *k.shape[-2:]),
        v.reshape(-1, *v.shape[-2:]),
    )
    out = torch.stack([
        torch.stack([torch.softmax(k2[b] @ q2[b, i] / math.sqrt(q.shape[-1]), -1) @ v2[b]
                     for i in range(q2.shape[1])])
        for b in range(q2.shape[0])
    ])  # fmt: skip
    return out.reshape(*q.shape[:-1], v.shape[-1])


def blockwise_split_k_columns(q, k, v, block_size):  # split-K, per-block columns without keepdim
    scale = 1 / math.sqrt(q.shape[-1])
    parts = []  # every block's maximum and sum, (..., q_len) each, kept until the end
    for s in range(0, k.shape[-2], block_size):
        scores = q @ k[..., s : s + block_size, :].transpose(-2, -1) * scale
        block_max = scores.amax(-1)  # (..., q_len): with one key per block, that key's score
        p = torch.exp(scores - block_max.unsqueeze(-1))
        parts.append((block_max, p.sum(-1), p @ v[..., s : s + block_size, :]))
    top = parts[0][0]
    for block_max, _, _ in parts[1:]:
        top = torch.maximum(top, block_max)
    total, acc = 0.0, 0.0
    for block_max, block_sum, block_out in parts:
        weight = torch.exp(block_max - top)
        total = total + weight * block_sum
        acc = acc + weight.unsqueeze(-1) * block_out
    return acc / total.unsqueeze(-1)


def blockwise_transposed_blocks_kept(q, k, v, block_size):  # every block's scores, (block, q_len)
    scale = 1 / math.sqrt(q.shape[-1])
    starts = range(0, k.shape[-2], block_size)
    blocks = [k[..., s : s + block_size, :] @ q.transpose(-2, -1) * scale for s in starts]
    top = blocks[0].amax(-2)  # (..., q_len)
    for block in blocks[1:]:
        top = torch.maximum(top, block.amax(-2))
    total, acc = 0.0, 0.0
    for block, s in zip(blocks, starts):
        p = torch.exp(block - top.unsqueeze(-2))  # (..., block, q_len)
        total = total + p.sum(-2)
        acc = acc + p.transpose(-2, -1) @ v[..., s : s + block_size, :]
    return acc / total.unsqueeze(-1)


def blockwise_columns_without_keepdim(q, k, v, block_size):  # the online softmax, 1-D columns
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)  # (..., q_len)
    total = torch.zeros(q.shape[:-1], dtype=q.dtype)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for s in range(0, k.shape[-2], block_size):
        scores_t = k[..., s : s + block_size, :] @ q.transpose(-2, -1) * scale  # (..., block, q)
        new_max = torch.maximum(running_max, scores_t.amax(-2))
        correction = torch.exp(running_max - new_max)
        p_t = torch.exp(scores_t - new_max.unsqueeze(-2))
        total = total * correction + p_t.sum(-2)
        acc = acc * correction.unsqueeze(-1) + p_t.transpose(-2, -1) @ v[..., s : s + block_size, :]
        running_max = new_max
    return acc / total.unsqueeze(-1)


def test_blockwise_accepts_columns_without_keepdim_and_transposed_blocks():
    """The watcher counts (..., q_len) columns and (..., block, q_len) blocks; a running
    answer written that way keeps a few of them alive and passes."""
    result = ch02.check_blockwise_attention(blockwise_columns_without_keepdim, verbose=False)
    assert result, result.message


@pytest.mark.parametrize(
    "cheat",
    [
        blockwise_every_block_kept,
        blockwise_one_query_at_a_time,
        blockwise_one_query_vector,
        blockwise_split_k_columns,
        blockwise_transposed_blocks_kept,
    ],
)
def test_blockwise_rejects_holding_all_scores_by_other_routes(cheat):
    # right numbers outside the check ...
    for case in ch02._blockwise_cases():
        expected = ch02.reference_scaled_attention(case["q"], case["k"], case["v"])[0]
        assert torch.allclose(cheat(**case), expected, atol=1e-4)
    # ... but all k_len scores exist at once, which the exercise forbids
    result = ch02.check_blockwise_attention(cheat, verbose=False)
    assert not result
    assert "BlockRuleBroken" in result.message, result.message


def blockwise_transposed_scores(q, k, v, block_size):  # the full softmax, keys first
    scores_t = k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., k_len, q_len)
    weights_t = torch.softmax(scores_t, dim=-2)  # over the keys, now axis -2
    return (v.transpose(-2, -1) @ weights_t).transpose(-2, -1)  # (..., q_len, d_v)


def test_blockwise_rejects_transposed_scores():
    # right numbers outside the check ...
    for case in ch02._blockwise_cases():
        expected = ch02.reference_scaled_attention(case["q"], case["k"], case["v"])[0]
        got = blockwise_transposed_scores(**case)
        assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    # ... but all the scores exist at once, only transposed
    result = ch02.check_blockwise_attention(blockwise_transposed_scores, verbose=False)
    assert not result
    assert "BlockRuleBroken" in result.message, result.message
    assert "a few blocks of keys at a time (at most six" in result.message, result.message
    # the reference still passes the sharper watcher
    assert ch02.check_blockwise_attention(ch02.reference_blockwise_attention, verbose=False)


def test_blockwise_accepts_correct():
    assert ch02.check_blockwise_attention(blockwise_correct, verbose=False)
    assert ch02.check_blockwise_attention(blockwise_logsumexp, verbose=False)
    assert ch02.check_blockwise_attention(blockwise_kt_first, verbose=False)
    assert ch02.check_blockwise_attention(ch02.reference_blockwise_attention, verbose=False)


@pytest.mark.parametrize(
    "full",
    [
        blockwise_full_companion,
        blockwise_full_softmax,
        blockwise_fused,
        blockwise_scores_by_broadcast,
        blockwise_scores_keepdim,
        blockwise_concatenated_scores,
    ],
)
def test_blockwise_rejects_all_keys_at_once(full):
    # each computes the right numbers outside the check ...
    for case in ch02._blockwise_cases():
        expected = ch02.reference_scaled_attention(case["q"], case["k"], case["v"])[0]
        assert torch.allclose(full(**case), expected, atol=1e-4)
    # ... but holds every key's score at once
    result = ch02.check_blockwise_attention(full, verbose=False)
    assert not result
    assert "BlockRuleBroken" in result.message, result.message
    assert "a few blocks of keys at a time (at most six" in result.message, result.message


def blockwise_per_key_columns(q, k, v, block_size):  # ignores the blocks: one column per key
    scale = 1 / math.sqrt(q.shape[-1])
    columns = [(q * k[..., j : j + 1, :]).sum(-1, keepdim=True) * scale for j in range(k.shape[-2])]
    top = columns[0]  # (..., q_len, 1) each; all k_len of them kept for one global maximum
    for column in columns[1:]:
        top = torch.maximum(top, column)
    total = sum(torch.exp(column - top) for column in columns)
    mixed = sum(torch.exp(c - top) * v[..., j : j + 1, :] for j, c in enumerate(columns))
    return mixed / total


def blockwise_two_pass(q, k, v, block_size):  # global maximum first, then one block at a time
    scale = 1 / math.sqrt(q.shape[-1])
    top = torch.full((*q.shape[:-1], 1), float("-inf"))
    for start in range(0, k.shape[-2], block_size):
        scores = q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale
        top = torch.maximum(top, scores.amax(-1, keepdim=True))
    total, mixed = 0, 0
    for start in range(0, k.shape[-2], block_size):
        p = torch.exp(q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale - top)
        total, mixed = (
            total + p.sum(-1, keepdim=True),
            mixed + p @ v[..., start : start + block_size, :],
        )
    return mixed / total


def test_blockwise_counts_width_one_score_columns():
    # right numbers outside the check ...
    for case in ch02._blockwise_cases():
        expected = ch02.reference_scaled_attention(case["q"], case["k"], case["v"])[0]
        assert torch.allclose(blockwise_per_key_columns(**case), expected, atol=1e-4)
    # ... but every key's (..., q_len, 1) score column is alive at once: refused
    result = ch02.check_blockwise_attention(blockwise_per_key_columns, verbose=False)
    assert not result
    assert "BlockRuleBroken" in result.message, result.message
    # the running (..., q_len, 1) columns of the reference and of a two-pass answer stay under it
    assert ch02.check_blockwise_attention(ch02.reference_blockwise_attention, verbose=False)
    assert ch02.check_blockwise_attention(blockwise_two_pass, verbose=False)


def test_blockwise_rule_is_lifted_after_the_check():
    ch02.check_blockwise_attention(blockwise_full_softmax, verbose=False)
    q, k = torch.randn(3, 4), torch.randn(8, 4)
    assert (q @ k.T).shape == (3, 8)  # no mode left on the stack


def test_blockwise_cases_tell_scores_from_transposed_keys():
    for case in ch02._blockwise_cases():
        q_len, d_k, d_v = case["q"].shape[-2], case["q"].shape[-1], case["v"].shape[-1]
        assert q_len not in (d_k, d_v), (q_len, d_k, d_v)
        # and k_len differs from q_len, so transposed scores end in (k_len, q_len) alone
        assert case["k"].shape[-2] != q_len, (case["k"].shape, q_len)


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
# the measurement behind gradient_crossover, by autograd and by the package's shortcut
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
    grad_scaled = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
    return scale * grad_scaled @ k, scale * grad_scaled.transpose(-2, -1) @ q, grad_v


def backward_without_scale(q, k, v, grad_output):  # the chain rule's 1/√d_k forgotten
    scale, weights = _forward(q, k, v)
    grad_v = weights.transpose(-2, -1) @ grad_output
    grad_weights = grad_output @ v.transpose(-2, -1)
    grad_scaled = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
    return grad_scaled @ k, grad_scaled.transpose(-2, -1) @ q, grad_v


def backward_diagonal_jacobian(q, k, v, grad_output):  # p (1 - p), as if elementwise
    scale, weights = _forward(q, k, v)
    grad_v = weights.transpose(-2, -1) @ grad_output
    grad_scaled = weights * (1 - weights) * (grad_output @ v.transpose(-2, -1))
    return scale * grad_scaled @ k, scale * grad_scaled.transpose(-2, -1) @ q, grad_v


def backward_no_subtraction(q, k, v, grad_output):  # α ⊙ u: the whole coupling dropped
    scale, weights = _forward(q, k, v)
    grad_v = weights.transpose(-2, -1) @ grad_output
    grad_scaled = weights * (grad_output @ v.transpose(-2, -1))
    return scale * grad_scaled @ k, scale * grad_scaled.transpose(-2, -1) @ q, grad_v


def backward_grad_k_untransposed(q, k, v, grad_output):
    grad_q, _, grad_v = backward_correct(q, k, v, grad_output)
    scale, weights = _forward(q, k, v)
    grad_weights = grad_output @ v.transpose(-2, -1)
    grad_scaled = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
    return grad_q, scale * (grad_scaled @ q.transpose(-2, -1)).transpose(-2, -1), grad_v


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
        backward_no_subtraction,
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


def backward_with_enable_grad(q, k, v, grad_output):  # autograd switched back on by hand
    with torch.enable_grad():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        output, _ = scaled_dot_product_attention(*leaves)
        return torch.autograd.grad(output, leaves, grad_output)


def backward_with_tensor_backward(q, k, v, grad_output):
    with torch.enable_grad():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        output, _ = scaled_dot_product_attention(*leaves)
        output.backward(grad_output)
        return tuple(leaf.grad for leaf in leaves)


def backward_with_torch_func(q, k, v, grad_output):
    with torch.enable_grad():
        _, vjp = torch.func.vjp(lambda *t: scaled_dot_product_attention(*t)[0], q, k, v)
        return vjp(grad_output)


def backward_with_grad_imported_earlier(q, k, v, grad_output):  # escapes the patched names
    with torch.enable_grad():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        output, _ = scaled_dot_product_attention(*leaves)
        return _grad_imported_at_module_level(output, leaves, grad_output)


def backward_with_vjp_imported_earlier(q, k, v, grad_output):
    _, vjp = _vjp_imported_at_module_level(lambda *t: scaled_dot_product_attention(*t)[0], q, k, v)
    return vjp(grad_output)


@pytest.mark.parametrize(
    "cheat",
    [
        backward_with_enable_grad,
        backward_with_tensor_backward,
        backward_with_torch_func,
        backward_with_grad_imported_earlier,
        backward_with_vjp_imported_earlier,
    ],
)
def test_attention_backward_blocks_autograd_even_under_enable_grad(cheat):
    # the cheat is right: outside the check it matches the reference ...
    case = next(ch02._attention_backward_cases())
    expected = ch02.reference_attention_backward(**case)
    got = cheat(**case)
    assert all(torch.allclose(g, e, atol=1e-5) for g, e in zip(got, expected))
    # ... but inside the check autograd is switched off
    result = ch02.check_attention_backward(cheat, verbose=False)
    assert not result
    assert "chain rule itself" in result.message


def test_autograd_forbidden_restores_autograd():
    originals = (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward)
    with pytest.raises(RuntimeError, match="chain rule"):
        with ch02.autograd_forbidden():
            x = torch.ones(2, requires_grad=True)
            (x * x).sum().backward()
    assert (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward) == originals
    x = torch.ones(2, requires_grad=True)
    (x * x).sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 2.0))


# ---------------------------------------------------------------------------------------------
# is_scaled_attention (a test of your own that catches a wrong scale)
# ---------------------------------------------------------------------------------------------


def _formula(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def _compare_on(attention, shapes, close):
    gen = torch.Generator().manual_seed(0)
    for lead, q_len, k_len, d_k, d_v in shapes:
        q = torch.randn(*lead, q_len, d_k, generator=gen)
        k = torch.randn(*lead, k_len, d_k, generator=gen)
        v = torch.randn(*lead, k_len, d_v, generator=gen)
        got = attention(q, k, v)
        if got.shape != (*lead, q_len, d_v) or not close(got, _formula(q, k, v)):
            return False
    return True


GOOD_SHAPES = [((), 3, 5, 4, 2), ((2,), 4, 6, 16, 3), ((2, 3), 2, 7, 9, 5)]


def scale_test_correct(attention):
    return _compare_on(attention, GOOD_SHAPES, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_pytest_style(attention):  # asserts instead of returning False
    assert scale_test_correct(attention), "not softmax(q kᵀ/√d_k) v"
    return True


def scale_test_float64_tight(attention):  # float64 inputs, atol=1e-9: stricter, and right
    gen = torch.Generator().manual_seed(2)
    for lead, q_len, k_len, d_k, d_v in GOOD_SHAPES:
        q = torch.randn(*lead, q_len, d_k, generator=gen, dtype=torch.float64)
        k = torch.randn(*lead, k_len, d_k, generator=gen, dtype=torch.float64)
        v = torch.randn(*lead, k_len, d_v, generator=gen, dtype=torch.float64)
        expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), -1) @ v
        got = attention(q, k, v)
        if got.shape != expected.shape or not torch.allclose(got.double(), expected, atol=1e-9):
            return False
    return True


def scale_test_weights_through_identity(attention):  # v = I reads the weights off the output
    gen = torch.Generator().manual_seed(1)
    for lead, q_len, k_len, d_k in [((), 3, 5, 4), ((2, 2), 2, 6, 25)]:
        q = torch.randn(*lead, q_len, d_k, generator=gen)
        k = torch.randn(*lead, k_len, d_k, generator=gen)
        eye = torch.eye(k_len).expand(*lead, k_len, k_len)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
        if not torch.allclose(attention(q, k, eye), torch.softmax(scores, -1), atol=1e-5):
            return False
    return True


def scale_test_shape_only(attention):
    return _compare_on(attention, GOOD_SHAPES, lambda a, b: a.shape == b.shape)


def scale_test_rows_sum_to_one(attention):  # v = ones: every convex combination gives 1
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    return torch.allclose(attention(q, k, torch.ones(2, 5, 1)), torch.ones(2, 3, 1))


def scale_test_only_d_k_64(attention):  # the paper's width, square shapes
    shapes = [((2,), 8, 8, 64, 64)]
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_d_v_equals_d_k(attention):
    shapes = [((2,), 3, 5, 4, 4), ((2,), 4, 6, 16, 16)]
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_k_len_equals_d_k(attention):
    shapes = [((2,), 3, 4, 4, 2), ((2,), 5, 16, 16, 3)]
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_q_len_equals_d_k(attention):  # every shape square in q: q_len = d_k
    shapes = [((), 4, 5, 4, 2), ((2,), 16, 6, 16, 3), ((2, 3), 9, 7, 9, 5)]
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_heads_equal_d_k(attention):  # q_len ≠ d_k, but as many heads as d_k
    shapes = [((), 3, 5, 4, 2), ((2, 9), 2, 7, 9, 5)]  # 2-D and 4-D: √q_len and axes caught
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_tiny_inputs(attention):  # scores near 0: every scale gives uniform weights
    gen = torch.Generator().manual_seed(0)
    for lead, q_len, k_len, d_k, d_v in GOOD_SHAPES:
        q = 1e-3 * torch.randn(*lead, q_len, d_k, generator=gen)
        k = 1e-3 * torch.randn(*lead, k_len, d_k, generator=gen)
        v = torch.randn(*lead, k_len, d_v, generator=gen)
        if not torch.allclose(
            attention(q, k, v).double(), _formula(q.double(), k.double(), v.double()), atol=1e-5
        ):
            return False
    return True


def scale_test_saturated_inputs(attention):  # scores in the hundreds: one-hot at any scale
    gen = torch.Generator().manual_seed(0)
    for lead, q_len, k_len, d_k, d_v in GOOD_SHAPES:
        q = 30 * torch.randn(*lead, q_len, d_k, generator=gen)
        k = 30 * torch.randn(*lead, k_len, d_k, generator=gen)
        v = torch.randn(*lead, k_len, d_v, generator=gen)
        if not torch.allclose(
            attention(q, k, v).double(), _formula(q.double(), k.double(), v.double()), atol=1e-5
        ):
            return False
    return True


def scale_test_d_k_one(attention):  # d_k = 1: √d_k = d_k = 1, every scale agrees
    shapes = [((), 3, 5, 1, 2), ((2,), 4, 6, 1, 3)]
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_2d_only(attention):
    shapes = [((), 3, 5, 4, 2), ((), 4, 6, 16, 3)]
    return _compare_on(attention, shapes, lambda a, b: torch.allclose(a, b, atol=1e-5))


def scale_test_exact(attention):  # torch.equal: float32 rounding rejects correct functions
    return _compare_on(attention, GOOD_SHAPES, torch.equal)


def scale_test_default_allclose(attention):  # atol=1e-8 is below float32 rounding
    shapes = [((4,), 16, 32, 48, 24), ((3, 2), 8, 40, 96, 7)]
    return _compare_on(attention, shapes, torch.allclose)


def scale_test_default_allclose_small(attention):  # rtol=1e-5, atol=1e-8: too tight near 0
    return _compare_on(attention, GOOD_SHAPES, torch.allclose)


def scale_test_ranking(attention):  # "scaling keeps the order of the keys"
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    eye = torch.eye(5).expand(2, 5, 5)
    expected = torch.softmax(q @ k.transpose(-2, -1), -1).argsort(-1)
    return torch.equal(attention(q, k, eye).argsort(-1), expected)


def scale_test_never_calls(attention):
    return True


@pytest.mark.parametrize(
    "good",
    [
        ch02.reference_is_scaled_attention,
        scale_test_correct,
        scale_test_pytest_style,
        scale_test_float64_tight,
        scale_test_weights_through_identity,
    ],
)
def test_scale_test_accepts_correct(good, capsys):
    assert ch02.check_scale_test(good)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong,says",
    [
        (scale_test_shape_only, "which is wrong"),
        (scale_test_rows_sum_to_one, "which is wrong"),
        (scale_test_only_d_k_64, "other than 64"),
        (scale_test_d_v_equals_d_k, "d_v ≠ d_k"),
        (scale_test_k_len_equals_d_k, "k_len ≠ d_k"),
        (scale_test_q_len_equals_d_k, "q_len ≠ d_k"),
        (scale_test_heads_equal_d_k, "number of heads"),
        (scale_test_tiny_inputs, "unit size"),
        (scale_test_saturated_inputs, "one-hot at any scale"),
        (scale_test_d_k_one, "d_k = 1 makes"),
        (scale_test_2d_only, "batched inputs"),
        (scale_test_ranking, "which is wrong"),
        (scale_test_never_calls, "without calling it"),
        (lambda attention: "yes", "True or False"),
    ],
)
def test_scale_test_rejects_wrong(wrong, says):
    result = ch02.check_scale_test(wrong, verbose=False)
    assert not result
    assert "❌" in result.message
    assert says in result.message, result.message


@pytest.mark.parametrize(
    "strict", [scale_test_exact, scale_test_default_allclose, scale_test_default_allclose_small]
)
def test_scale_test_explains_a_too_strict_comparison(strict):
    result = ch02.check_scale_test(strict, verbose=False)
    assert not result
    assert "IS correct" in result.message and "float32 rounding" in result.message
    assert "atol=1e-5" in result.message
    assert "shrinks to nothing near zero" in result.message, result.message
    # default allclose can pass on inputs without an output entry near 0: the message must
    # not call it wrong on every input
    assert "passes or fails with the inputs it happens to draw" in result.message, result.message
    # the message states the size of the rounding it saw: a small number, not the formula's gap
    size = float(result.message.split("by at most ")[1].split(" ")[0])
    assert 0 < size < 1e-5, result.message


def test_scale_test_candidates_are_what_they_claim():
    gen = torch.Generator().manual_seed(3)
    # (batch, heads, len, width): on these, every slip shows (axis 1 and axis 2 included)
    q, k = torch.randn(2, 2, 3, 9, generator=gen), torch.randn(2, 2, 5, 9, generator=gen)
    v = torch.randn(2, 2, 5, 4, generator=gen)
    for what, fn, correct, _ in ch02.SCALE_TEST_CANDIDATES:
        close = torch.allclose(fn(q, k, v), _formula(q, k, v), atol=1e-5)
        assert close == correct, what
        assert ch02.reference_is_scaled_attention(fn) == correct, what


def test_scale_test_hides_the_candidates_names():
    seen = []
    ch02.check_scale_test(lambda attention: seen.append(repr(attention)) or True, verbose=False)
    assert seen and all(s.startswith("attention #") for s in seen)


def test_scale_test_tolerance_separates_rounding_from_slips():
    """The solution's claim: on its inputs, rounding stays below a few 1e-6 (under
    atol=1e-5), each slip moves > 1e-4."""
    recorded = ch02._Recorded(ch02.SCALE_TEST_CANDIDATES[0][1], 1)
    assert ch02.reference_is_scaled_attention(recorded)
    assert len(recorded.calls) == 3
    for what, fn, correct, _ in ch02.SCALE_TEST_CANDIDATES:
        gap = max(
            (fn(q, k, v).double() - _formula(q.double(), k.double(), v.double())).abs().max().item()
            for q, k, v in recorded.calls
        )
        assert gap < 5e-6 if correct else gap > 1e-4, (what, gap)
        if correct and fn is not ch02._correct_off_by_rounding:  # the prompt: under 1e-6
            assert gap < 1e-6, (what, gap)


# ---------------------------------------------------------------------------------------------
# gradient_crossover (a composition: the measurement at entries of std σ, then a search)
# ---------------------------------------------------------------------------------------------


def _fast_gap(d_k, sigma, statistic="median", power=2, root=True, seed=11, n=10_000):
    """The gap by the package's sampler: σ on queries and keys puts σ² (``power``) on the
    softmax input; the σ on the gradient cancels in the ratio."""
    gen = torch.Generator().manual_seed(seed)
    factor = sigma**power
    scaled = ch02.sampled_query_gradient_norms(
        d_k, 16, factor / (math.sqrt(d_k) if root else d_k), n, gen
    )
    unscaled = ch02.sampled_query_gradient_norms(d_k, 16, factor, n, gen)
    return (getattr(scaled, statistic)() / getattr(unscaled, statistic)()).item()


def _brute_sigma_gap(d_k, sigma, at_query=True, n=10_000, chunk=500):
    """The solution's measurement: autograd on q, k of std σ, paired draws for both scales."""
    gen = torch.Generator().manual_seed(0)
    norms = {True: [], False: []}
    for _ in range(n // chunk):
        q = sigma * torch.randn(chunk, 1, d_k, generator=gen, dtype=torch.float64)
        k = sigma * torch.randn(chunk, 16, d_k, generator=gen, dtype=torch.float64)
        u = torch.randn(chunk, 16, generator=gen, dtype=torch.float64)
        for scaled in (True, False):
            q_leaf = q.clone().requires_grad_()
            z = (q_leaf @ k.transpose(-2, -1)).squeeze(-2) * (d_k**-0.5 if scaled else 1.0)
            z.retain_grad()
            (torch.softmax(z, dim=-1) * u).sum().backward()
            grad = q_leaf.grad.squeeze(-2) if at_query else z.grad
            norms[scaled].append(grad.norm(dim=-1))
    medians = {s: torch.cat(v).median().item() for s, v in norms.items()}
    return medians[True] / medians[False]


def _scan(gap):
    for d_k in ch02.CROSSOVER_D_KS:
        if gap(d_k) > 1:
            return d_k
    return None


@functools.cache
def crossover_correct(sigma):  # the prompt's sample size (remembered: several tests ask)
    return _scan(lambda d: _fast_gap(d, sigma, n=ch02.CROSSOVER_QUERIES))


def crossover_as_float(sigma):
    return float(crossover_correct(sigma))


def crossover_by_autograd(sigma):  # the solution's way, no sampler (small widths only: time)
    if sigma < 1:
        return crossover_correct(sigma)
    return _scan(lambda d: _brute_sigma_gap(d, sigma))


def crossover_at_softmax_input(sigma):  # the chain rule's λ left out
    return _scan(lambda d: _brute_sigma_gap(d, sigma, at_query=False, n=4000))


def crossover_sigma_on_queries_only(sigma):  # σ, not σ², on the softmax input
    return _scan(lambda d: _fast_gap(d, sigma, power=1))


def crossover_sigma_ignored(sigma):  # standard normal entries whatever σ
    return _scan(lambda d: _fast_gap(d, 1.0))


def crossover_of_means(sigma):  # the mean never crosses: the few near ties carry it
    return _scan(lambda d: _fast_gap(d, sigma, statistic="mean"))


def crossover_last_below(sigma):  # off by one: the last width where the gap is below 1
    return crossover_correct(sigma) // 2


def crossover_inverted(sigma):
    return _scan(lambda d: 1 / _fast_gap(d, sigma))


def crossover_divides_by_d_k(sigma):
    return _scan(lambda d: _fast_gap(d, sigma, root=False))


def crossover_copied(sigma):  # the chapter's width for σ = 1
    return 128


def crossover_raw_spread_rule(sigma):
    """Hold the raw scores' spread √d_k σ² at its σ = 1 crossover: d_k = 128/σ⁴, to the
    nearest power of two. It forgets that σ sharpens the scaled softmax too."""
    return 2 ** round(math.log2(128 / sigma**4))


def crossover_raw_spread_rule_up(sigma):  # the same, rounded up: right at 3 of 5
    return 2 ** math.ceil(math.log2(128 / sigma**4))


def crossover_sigma_squared_rule(sigma):  # the σ² slip of section 2.2 in the rule
    return 2 ** round(math.log2(128 / sigma**2))


def test_gradient_crossover_accepts_a_measurement(capsys):
    assert ch02.check_gradient_crossover(crossover_correct)
    assert "✅ gradient_crossover: the right width at all 5" in capsys.readouterr().out
    assert ch02.check_gradient_crossover(crossover_as_float, verbose=False)


def test_gradient_crossover_accepts_the_solutions_autograd_measurement():
    """The hidden solution's method (autograd, paired queries, no sampler; 10 000 here, the
    solution uses the prompt's 100 000), at the values of σ whose crossover lies at small
    widths, far from 1 (at large ones it takes minutes here)."""
    result = ch02.check_gradient_crossover(crossover_by_autograd, verbose=False)
    assert result, result.message


@pytest.mark.parametrize(
    "lucky",
    [
        crossover_copied,
        crossover_raw_spread_rule,
        crossover_raw_spread_rule_up,
        crossover_sigma_squared_rule,
    ],
)
def test_gradient_crossover_rejects_a_rule_of_thumb(lucky):
    """Every σ is asked at every run: a rule right at some settings only never passes. The
    classic one holds the raw scores' spread √d_k σ² fixed; it is right at 3 of the 5 values
    at best, because σ also sharpens the scaled softmax."""
    right = sum(lucky(s) == crossover_correct(s) for s in ch02.CROSSOVER_SIGMAS)
    assert right < len(ch02.CROSSOVER_SIGMAS)
    result = ch02.check_gradient_crossover(lucky, verbose=False)
    assert not result and "❌" in result.message, result.message
    if lucky is crossover_raw_spread_rule_up:
        assert right == 3  # wrong at σ = 1.25 and 1.5
    if lucky is crossover_raw_spread_rule:  # the solution: "rounded to the nearest, at none"
        assert right == 0


@pytest.mark.parametrize(
    "wrong",
    [
        crossover_sigma_on_queries_only,
        crossover_sigma_ignored,
        crossover_at_softmax_input,
        crossover_of_means,
        crossover_last_below,
        crossover_inverted,
        crossover_divides_by_d_k,
        lambda sigma: "32",
        lambda sigma: 100,  # not a power of two
    ],
)
def test_gradient_crossover_rejects_wrong(wrong):
    result = ch02.check_gradient_crossover(wrong, verbose=False)
    assert not result, result.message
    assert "❌" in result.message


def test_gradient_crossover_refuses_the_reference():
    result = ch02.check_gradient_crossover(
        lambda sigma: _scan(lambda d: ch02.crossover_gap(d, sigma)), verbose=False
    )
    assert not result, result.message


def test_gradient_crossover_accepts_the_prompts_sample_on_other_seeds():
    """Independent draws for the two scales, noisier than the solution's paired ones, with the
    prompt's sample size: right on another seed too (the next tests say how reliably)."""
    for seed in (1,):
        answer = lambda sigma, seed=seed: _scan(  # noqa: E731
            lambda d: _fast_gap(d, sigma, seed=seed, n=ch02.CROSSOVER_QUERIES)
        )
        result = ch02.check_gradient_crossover(answer, verbose=False)
        assert result, (seed, result.message)


def _relative_sd_of_median(norms, n_queries, delta=0.02):
    """Relative standard deviation of the median of ``n_queries`` draws, read off a large
    sample ``norms``: 1 / (2 √n f(m) m), with the density f at the median m estimated from the
    quantiles m ± δ (the asymptotic variance of a sample median, 1 / (4 n f²))."""
    probs = torch.tensor([0.5 - delta, 0.5, 0.5 + delta], dtype=norms.dtype)
    low, median, high = torch.quantile(norms, probs).tolist()
    density = 2 * delta / (high - low)
    return 1 / (2 * math.sqrt(n_queries) * density * median)


def test_gradient_crossover_passes_a_correct_measurement_reliably():
    """A correct measurement with the prompt's sample size lands on the check's side of 1 at
    every width its search visits (all widths up to the answer), at all five σ, with
    probability above 99.9 %. Per width: the gap from an independent, larger sample, moved
    three of its own standard deviations towards 1, then the normal tail beyond 1 for a median
    gap of ``CROSSOVER_QUERIES`` queries per scale; the failure probabilities are summed (a
    union bound). The formula's standard deviation matches 300 seeds at 10 000 queries within
    about 6 % (0.090 against 0.085 at σ² = 1/3, d_k = 2048; 0.043 against 0.041 at σ = 1.25,
    d_k = 32), on the conservative side."""
    n_learner = ch02.CROSSOVER_QUERIES
    assert n_learner >= 100_000, n_learner
    failure = 0.0
    for sigma in ch02.CROSSOVER_SIGMAS:
        answer = next(d for d in ch02.CROSSOVER_D_KS if ch02.crossover_gap(d, sigma) > 1)
        for d_k in ch02.CROSSOVER_D_KS[: ch02.CROSSOVER_D_KS.index(answer) + 1]:
            reference = ch02.crossover_gap(d_k, sigma)
            near = abs(reference - 1) < 0.3  # only these need a large sample
            n_sample = 200_000 if near else 20_000
            gen = torch.Generator().manual_seed(2026)
            factor = sigma**2
            scaled = ch02.sampled_query_gradient_norms(
                d_k, 16, factor / math.sqrt(d_k), n_sample, gen
            )
            unscaled = ch02.sampled_query_gradient_norms(d_k, 16, factor, n_sample, gen)
            gap = (scaled.median() / unscaled.median()).item()
            assert (gap > 1) == (reference > 1), (sigma, d_k, gap, reference)

            def sd(n, scaled=scaled, unscaled=unscaled, gap=gap):
                return gap * math.hypot(
                    _relative_sd_of_median(scaled, n), _relative_sd_of_median(unscaled, n)
                )

            z = (abs(gap - 1) - 3 * sd(n_sample)) / sd(n_learner)
            assert z > 0, (sigma, d_k, gap)
            failure += 0.5 * math.erfc(z / math.sqrt(2))
    assert failure < 1e-3, f"a correct measurement fails with probability up to {failure:.1e}"


def test_gradient_crossover_fewer_queries_would_be_flaky():
    """The reason for the prompt's sample size: with 10 000 queries per scale, the median gap
    at σ² = 1/3, d_k = 2048 (the answer, gap about 1.1-1.2) lands below 1 with a probability of
    about a percent or more, so a correct learner would be told "None" now and then."""
    sigma, d_k = ch02.CROSSOVER_SIGMAS[0], 2048
    gen = torch.Generator().manual_seed(2026)
    scaled = ch02.sampled_query_gradient_norms(d_k, 16, sigma**2 / math.sqrt(d_k), 200_000, gen)
    unscaled = ch02.sampled_query_gradient_norms(d_k, 16, sigma**2, 200_000, gen)
    gap = (scaled.median() / unscaled.median()).item()
    sd = gap * math.hypot(
        _relative_sd_of_median(scaled, 10_000), _relative_sd_of_median(unscaled, 10_000)
    )
    assert 0.5 * math.erfc((gap - 1) / sd / math.sqrt(2)) > 1e-3, (gap, sd)


def test_gradient_crossover_settings_are_clear_cut():
    """At each checked σ one width is right, with the gap at least 10 % from 1 on both sides
    (how rarely a correct measurement lands on the wrong side: the test above); σ = 1 (the
    chapter's) is not asked."""
    assert 1.0 not in ch02.CROSSOVER_SIGMAS
    answers = [crossover_correct(s) for s in ch02.CROSSOVER_SIGMAS]
    assert answers == [2048, 1024, 512, 32, 16], answers  # kept out of the module
    for sigma, answer in zip(ch02.CROSSOVER_SIGMAS, answers):
        assert ch02.crossover_gap(answer, sigma) > 1.1
        assert ch02.crossover_gap(answer // 2, sigma) < 1 / 1.1


def test_the_chain_rule_reference_equals_autograd():
    """The check's reference applies the chain rule by hand (so that it passes its own
    autograd-free check); on every case it equals autograd in float64."""
    from companion.attention import scaled_dot_product_attention

    for case in ch02._attention_backward_cases():
        leaves = [case[n].double().requires_grad_() for n in ("q", "k", "v")]
        output = scaled_dot_product_attention(*leaves)[0]  # (..., q_len, d_v)
        expected = torch.autograd.grad(output, leaves, case["grad_output"].double())
        got = ch02.reference_attention_backward(**case)
        for g, e in zip(got, expected):
            assert torch.allclose(g.double(), e, rtol=1e-5, atol=1e-6), (g - e).abs().max()


def scale_test_loose_atol(attention):  # atol=0.3 accepts small slips
    return _compare_on(attention, GOOD_SHAPES, lambda a, b: torch.allclose(a, b, atol=0.3))


def scale_test_loose_rtol(attention):  # rtol alone, loose: accepts float16 weights
    return _compare_on(attention, GOOD_SHAPES, lambda a, b: torch.allclose(a, b, rtol=0.1, atol=0))


def scale_test_atol_5e_4(attention):  # the solution's inputs at atol=5e-4: float16 passes
    return _compare_on(attention, GOOD_SHAPES, lambda a, b: torch.allclose(a, b, atol=5e-4))


@pytest.mark.parametrize(
    "loose,says",
    [
        (scale_test_loose_atol, "√(d_k + 1)"),
        (scale_test_loose_rtol, "float16"),
        (scale_test_atol_5e_4, "float16"),
    ],
)
def test_scale_test_rejects_a_loose_tolerance(loose, says):
    result = ch02.check_scale_test(loose, verbose=False)
    assert not result
    assert "which is wrong" in result.message and says in result.message, result.message
    assert "tighten the tolerance" in result.message, result.message


def test_scale_test_a_correct_candidate_fails_default_allclose_on_random_inputs():
    """The rounding candidate is correct (atol=1e-5 accepts it) but 4e-6 off in every entry:
    on random inputs with an output entry near 0, default allclose rejects it."""
    off = ch02._correct_off_by_rounding
    assert ch02.reference_is_scaled_attention(off)
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        q, k = torch.randn(2, 8, 16, generator=gen), torch.randn(2, 6, 16, generator=gen)
        v = torch.randn(2, 6, 8, generator=gen)  # 128 output entries: some land near 0
        exact = _formula(q.double(), k.double(), v.double())
        assert torch.allclose(off(q, k, v).double(), exact, atol=1e-5), seed
        assert not torch.allclose(off(q, k, v), exact.float()), seed


def test_gradient_crossover_explains_a_search_that_finds_nothing():
    """The mean never crosses 1, so a search on it returns None: the message says no
    crossover was found and points at the statistic, not at the return type."""
    assert crossover_of_means(ch02.CROSSOVER_SIGMAS[0]) is None
    result = ch02.check_gradient_crossover(crossover_of_means, verbose=False)
    assert not result
    assert "no crossover found" in result.message and "median" in result.message, result.message
    assert "16 keys" in result.message, result.message


def _scale_test_on_seed(attention, seed, shapes, **tolerance):  # the solution, other inputs
    gen = torch.Generator().manual_seed(seed)
    for lead, q_len, k_len, d_k, d_v in shapes:
        q = torch.randn(*lead, q_len, d_k, generator=gen)
        k = torch.randn(*lead, k_len, d_k, generator=gen)
        v = torch.randn(*lead, k_len, d_v, generator=gen)
        exact = _formula(q.double(), k.double(), v.double())
        got = attention(q, k, v)
        if got.shape != exact.shape or not torch.allclose(got.double(), exact, **tolerance):
            return False
    return True


# the solution's shapes, and one 4-D case with every size distinct (the reviewers' own test)
SEED_SHAPES = [GOOD_SHAPES, [((2, 3), 4, 6, 16, 5)]]


@pytest.mark.parametrize("shapes", SEED_SHAPES)
@pytest.mark.parametrize(
    "tolerance",
    [
        {"rtol": 1e-4, "atol": 0.0},  # a relative tolerance alone
        {"atol": 1e-6},  # below the "few 1e-6" of rounding the prompt quotes
        {},  # torch.allclose's default, atol=1e-8
    ],
)
def test_scale_test_rejects_a_too_tight_tolerance_whatever_the_seed(tolerance, shapes):
    """Before, the only trap for these tolerances rounded by about 1e-6 on some entries, so
    rtol alone passed on about half the seeds of the test's own inputs. The rounding candidate
    is 4e-6 off everywhere: such a test is rejected on every seed tried, with the message for
    a correct function rejected."""
    for seed in range(12):
        result = ch02.check_scale_test(
            lambda a, seed=seed: _scale_test_on_seed(a, seed, shapes, **tolerance), verbose=False
        )
        assert not result, (tolerance, seed)
        assert "IS correct" in result.message, result.message
        assert "atol=1e-5" in result.message, result.message


@pytest.mark.parametrize("shapes", SEED_SHAPES)
def test_scale_test_accepts_atol_1e_5_whatever_the_seed(shapes):
    for seed in range(12):
        result = ch02.check_scale_test(
            lambda a, seed=seed: _scale_test_on_seed(a, seed, shapes, atol=1e-5), verbose=False
        )
        assert result, (seed, result.message)


@pytest.mark.parametrize("rtol", [1e-3, 1e-2])
@pytest.mark.parametrize("offset", [0.0, 5.0])
def test_scale_test_rejects_a_relative_tolerance_alone_whatever_the_inputs(rtol, offset):
    """rtol ≥ 1e-3 with atol=0 is refused on every seed, even on values shifted by 5, where no
    output entry lies near 0 and the rounding candidate alone would let it pass: the guard
    slip's relative error stays below 1e-3 on any inputs."""

    def relative_only(attention, seed):
        gen = torch.Generator().manual_seed(seed)
        for lead, q_len, k_len, d_k, d_v in GOOD_SHAPES:
            q = torch.randn(*lead, q_len, d_k, generator=gen)
            k = torch.randn(*lead, k_len, d_k, generator=gen)
            v = torch.randn(*lead, k_len, d_v, generator=gen) + offset
            exact = _formula(q.double(), k.double(), v.double())
            if not torch.allclose(attention(q, k, v).double(), exact, rtol=rtol, atol=0.0):
                return False
        return True

    for seed in range(8):
        result = ch02.check_scale_test(lambda a, seed=seed: relative_only(a, seed), verbose=False)
        assert not result, (rtol, offset, seed)
        if offset:  # no entry near 0: a small slip (float16 or the guard) is what refuses it
            assert "your test accepted" in result.message, result.message
        # the guard slip alone refuses it, on any inputs: the relative test accepts it
        assert relative_only(ch02._softmax_with_a_guard, seed), (rtol, offset, seed)


def test_the_guard_slip_stays_within_its_relative_bound():
    gen = torch.Generator().manual_seed(5)
    for size in (0.1, 1.0, 30.0):  # near-uniform, typical and one-hot scores
        q, k = size * torch.randn(3, 4, 8, generator=gen), torch.randn(3, 6, 8, generator=gen)
        v = torch.randn(3, 6, 5, generator=gen).double()
        got = ch02._softmax_with_a_guard(q.double(), k.double(), v)
        exact = _formula(q.double(), k.double(), v)
        relative = ((got - exact).abs() / exact.abs()).max().item()
        assert 0 < relative < ch02._GUARD_EPSILON, (size, relative)


def test_scale_test_docstring_states_the_rejected_tolerances():
    doc = " ".join(ch02.check_scale_test.__doc__.split())
    assert "rtol=1e-4, atol=0`` rejects whenever an output entry lies within 0.04 of 0" in doc
    assert "``atol=1e-6`` whenever one lies within 0.3" in doc
    assert "fourteen with a slip" in doc
    slips = sum(not correct for _, _, correct, _ in ch02.SCALE_TEST_CANDIDATES)
    assert slips == 14, slips


def test_the_rounding_candidate_margins():
    """The docstring's 0.04 and 0.3: 4e-6 exceeds rtol=1e-4 below |x| = 0.04 and
    atol=1e-6 + rtol=1e-5 |x| below |x| = 0.3; it stays within atol=1e-5 + float32 rounding."""
    offset = ch02._ROUNDING_OFFSET
    assert math.isclose(offset / 1e-4, 0.04) and math.isclose((offset - 1e-6) / 1e-5, 0.3)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(3, 4, 9, generator=gen),
        torch.randn(3, 7, 9, generator=gen),
        torch.randn(3, 7, 5, generator=gen),
    )
    gap = (
        ch02._correct_off_by_rounding(q, k, v).double()
        - _formula(q.double(), k.double(), v.double())
    ).abs()
    assert gap.min() > 3.5e-6 and gap.max() < 5e-6, (gap.min(), gap.max())


def test_blockwise_check_refuses_the_packages_blockwise_attention():
    """The package's own blockwise_attention is the answer, so calling it is refused (a
    reviewer found it passing)."""
    from companion.efficient_attention import blockwise_attention as package_blockwise

    def answer(q, k, v, block_size):
        return package_blockwise(q, k, v, block_size=block_size)

    result = ch02.check_blockwise_attention(answer, verbose=False)
    assert not result.passed, "calling companion.efficient_attention should be refused"
    assert "efficient_attention" in result.message, result.message


# ---------------------------------------------------------------------------------------------
# the module's own answers are refused when a reader's function calls them
# ---------------------------------------------------------------------------------------------


def test_blockwise_refuses_a_call_to_the_reference():
    def calls_reference(q, k, v, block_size):
        return ch02.reference_blockwise_attention(q, k, v, block_size)

    result = ch02.check_blockwise_attention(calls_reference, verbose=False)
    assert not result
    assert "reference_blockwise_attention" in result.message, result.message
    assert "one block of keys at a time yourself" in result.message, result.message


def test_scale_test_refuses_a_call_to_the_reference():
    def calls_reference(attention):
        return ch02.reference_is_scaled_attention(attention)

    result = ch02.check_scale_test(calls_reference, verbose=False)
    assert not result
    assert "reference_is_scaled_attention" in result.message, result.message
    # the reference handed in as is still passes (tests/test_exercises.py relies on it)
    assert ch02.check_scale_test(ch02.reference_is_scaled_attention, verbose=False)


def test_attention_backward_refuses_a_call_to_the_reference():
    def calls_reference(q, k, v, grad_output):
        return ch02.reference_attention_backward(q, k, v, grad_output)

    result = ch02.check_attention_backward(calls_reference, verbose=False)
    assert not result
    assert "reference_attention_backward" in result.message, result.message
    assert ch02.check_attention_backward(ch02.reference_attention_backward, verbose=False)


def test_gradient_crossover_refuses_the_modules_gap():
    """crossover_gap measures the gap the exercise asks for; an answer that calls it is
    refused, even when the remembered gap makes the call cost nothing."""
    ch02.crossover_gap(2, 1.5)  # the check's cache now holds this setting

    def calls_gap(sigma):
        ch02.crossover_gap(2, 1.5)
        return crossover_correct(sigma)

    result = ch02.check_gradient_crossover(calls_gap, verbose=False)
    assert not result
    assert "crossover_gap" in result.message, result.message
    assert "measure the gradient gap yourself" in result.message, result.message


def test_gradient_crossover_refuses_the_private_gap():
    """The same through the private, remembered helper behind crossover_gap."""
    ch02._crossover_gap(2, 1.5)

    def calls_private_gap(sigma):
        ch02._crossover_gap(2, 1.5)  # remembered: the call costs nothing, and is still seen
        return crossover_correct(sigma)

    result = ch02.check_gradient_crossover(calls_private_gap, verbose=False)
    assert not result
    assert "_crossover_gap" in result.message, result.message


def backward_scale_twice(q, k, v, grad_output):  # the chain rule's 1/√d_k applied twice
    scale = 1 / math.sqrt(q.shape[-1])
    grad_q, grad_k, grad_v = backward_correct(q, k, v, grad_output)
    return scale * grad_q, scale * grad_k, grad_v


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (backward_without_scale, "a factor √d_k: the 1/√d_k missing"),
        (backward_scale_twice, "applied twice"),
    ],
)
def test_attention_backward_names_a_scale_slip(wrong, says):
    result = ch02.check_attention_backward(wrong, verbose=False)
    assert not result and says in result.message, result.message


def test_attention_backward_names_the_diagonal_jacobian_slip():
    result = ch02.check_attention_backward(backward_diagonal_jacobian, verbose=False)
    assert not result and "the softmax Jacobian's diagonal only" in result.message, result.message


def test_attention_backward_names_the_missing_subtraction():
    result = ch02.check_attention_backward(backward_no_subtraction, verbose=False)
    assert not result and "without the softmax's normalising sum" in result.message, result.message
    assert "diagonal only" not in result.message, result.message


def test_attention_backward_hint_is_silent_for_other_slips():
    result = ch02.check_attention_backward(backward_grad_k_untransposed, verbose=False)
    assert not result and "Hint" not in result.message, result.message


@pytest.mark.parametrize("wrong", [blockwise_naive_exp, blockwise_max_from_zero])
def test_blockwise_names_the_missing_maximum(wrong):
    result = ch02.check_blockwise_attention(wrong, verbose=False)
    assert not result and "Is a maximum per query subtracted" in result.message, result.message


def test_blockwise_hint_is_silent_for_a_finite_slip():
    result = ch02.check_blockwise_attention(blockwise_no_rescale, verbose=False)
    assert not result and "Hint" not in result.message, result.message


# ---------------------------------------------------------------------------------------------
# score_moments (section 2.2's derivation, with unequal spreads and correlated coordinates)
# ---------------------------------------------------------------------------------------------


def moments_formula(d_k, sigma_q, sigma_k, rho):
    return rho * sigma_q * sigma_k * d_k, d_k * (sigma_q * sigma_k) ** 2 * (1 + rho**2)


def moments_as_tensors(d_k, sigma_q, sigma_k, rho):  # float32 tensors, a list instead of a tuple
    mean, variance = moments_formula(d_k, sigma_q, sigma_k, rho)
    return [torch.tensor(mean), torch.tensor(variance, dtype=torch.float32)]


def moments_expanded(d_k, sigma_q, sigma_k, rho):  # E[(qk)²] − E[qk]², term by term, then × d_k
    second = sigma_q**2 * sigma_k**2 * (3 * rho**2 + (1 - rho**2))
    first = rho * sigma_q * sigma_k
    return d_k * first, d_k * (second - first**2)


@pytest.mark.parametrize("right", [moments_formula, moments_as_tensors, moments_expanded])
def test_score_moments_accepts_correct(right):
    result = ch02.check_score_moments(right, verbose=False)
    assert result, result.message


def _slip(name):
    def slip(d_k, sigma_q, sigma_k, rho):
        return ch02._moment_slips(d_k, sigma_q, sigma_k, rho)[name]

    return slip


@pytest.mark.parametrize(
    ("start", "says"),
    [
        ("the variance grows like √d_k", "grows like √d_k"),
        ("the variance grows like d_k²", "grows like d_k²"),
        ("σ_q σ_k where", "σ_q σ_k where σ_q² σ_k² belongs"),
        ("no ρ in the variance", "holds only for independent"),
        ("(1 − ρ²)", "holds only for independent"),
        ("E[(q·k)²]-like", "is not subtracted"),
        ("the mean misses", "a covariance"),
        ("the mean has", "a covariance"),
        ("the mean grows like √d_k", "the d_k means add"),
        ("(variance, mean)", "wrong order"),
        ("the standard deviation", "not its square root"),
        ("|ρ| in the mean", "keeps ρ's sign"),
    ],
)
def test_score_moments_rejects_and_names_each_slip(start, says):
    (name,) = [n for n in ch02._moment_slips(64, 1.0, 1.0, 0.0) if n.startswith(start)]
    result = ch02.check_score_moments(_slip(name), verbose=False)
    assert not result and says in result.message, result.message


def test_score_moments_slips_are_far_from_the_answer():
    """Every slip misses some case by more than 10 %: rounding can never pass one."""
    for name in ch02._moment_slips(64, 1.0, 1.0, 0.0):
        worst = 0.0
        for case in ch02._MOMENT_CASES:
            got, want = _slip(name)(*case), ch02.reference_score_moments(*case)
            worst = max(worst, *(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want)))
        assert worst > 0.1, (name, worst)


def test_score_moments_hint_is_silent_for_other_answers():
    def off(d_k, sigma_q, sigma_k, rho):
        mean, variance = moments_formula(d_k, sigma_q, sigma_k, rho)
        return mean, 1.5 * variance

    result = ch02.check_score_moments(off, verbose=False)
    assert not result and "Hint" not in result.message, result.message


def moments_as_numpy(d_k, sigma_q, sigma_k, rho):  # one NumPy array of the two values
    import numpy as np

    return np.array(moments_formula(d_k, sigma_q, sigma_k, rho))


def moments_as_tensor(d_k, sigma_q, sigma_k, rho):  # one float64 tensor of the two values
    return torch.tensor(moments_formula(d_k, sigma_q, sigma_k, rho), dtype=torch.float64)


@pytest.mark.parametrize("right", [moments_as_numpy, moments_as_tensor])
def test_score_moments_accepts_an_array_of_two(right):
    result = ch02.check_score_moments(right, verbose=False)
    assert result, result.message


def _other_wrong_moments():
    """Wrong answers that are none of the named slips, each (mean, variance) at one setting."""

    def variance_with(factor):
        def wrong(d_k, sigma_q, sigma_k, rho):
            mean, _ = moments_formula(d_k, sigma_q, sigma_k, rho)
            return mean, d_k * (sigma_q * sigma_k) ** 2 * factor(rho)

        return wrong

    return {
        "1 + |ρ|": variance_with(lambda rho: 1 + abs(rho)),
        "(1 + ρ)²": variance_with(lambda rho: (1 + rho) ** 2),
    }


def test_score_moments_first_case_tells_every_slip_apart():
    """At the first case every slip, every other wrong answer above and the right answer differ
    pairwise by more than 5 %: a wrong answer fails there, and at most one slip matches it."""
    case = ch02._MOMENT_CASES[0]
    answers = dict(ch02._moment_slips(*case))
    answers.update({name: fn(*case) for name, fn in _other_wrong_moments().items()})
    answers["right"] = ch02.reference_score_moments(*case)
    names = list(answers)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            gap = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(answers[a], answers[b]))
            assert gap > 0.05, (a, b, gap)
    for name in ch02._moment_slips(*case):  # and every named slip misses it by more than 10 %
        gap = max(abs(x - y) / abs(y) for x, y in zip(answers[name], answers["right"]))
        assert gap > 0.1, (name, gap)


@pytest.mark.parametrize("name", list(ch02._moment_slips(64, 1.0, 1.0, 0.0)))
def test_score_moments_names_each_slip_at_the_first_case(name):
    result = ch02.check_score_moments(_slip(name), verbose=False)
    assert not result and "case 1 is wrong" in result.message, result.message
    assert f"classic slip, {name}." in result.message, result.message


@pytest.mark.parametrize("name", list(_other_wrong_moments()))
def test_score_moments_other_wrong_answers_fail_without_a_wrong_name(name):
    result = ch02.check_score_moments(_other_wrong_moments()[name], verbose=False)
    assert not result and "case 1 is wrong" in result.message, result.message
    assert "Hint" not in result.message, result.message


def test_score_moments_hint_never_names_a_slip_that_equals_the_answer():
    """At σ = 1 and ρ = 0 several slips give the right values; an answer rejected there (here a
    right answer in a shape the check refuses) must not be told it matches one of them."""
    case = {"d_k": 64, "sigma_q": 1.0, "sigma_k": 1.0, "rho": 0.0}
    assert ch02._score_moments_hint(case, moments_formula(64, 1.0, 1.0, 0.0)) == ""


def backward_grad_v_unshaped(q, k, v, grad_output):  # weights @ grad_output, no slicing: raises
    grad_q, grad_k, _ = backward_correct(q, k, v, grad_output)
    _, weights = _forward(q, k, v)
    return grad_q, grad_k, weights @ grad_output


def test_attention_backward_hints_a_shape_error():
    result = ch02.check_attention_backward(backward_grad_v_unshaped, verbose=False)
    assert not result
    assert "hint: check each product's shape" in result.message, result.message
