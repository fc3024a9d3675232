"""Chapter 1 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from companion.attention import AdditiveScore, scaled_dot_product_attention
from companion.exercises import ch01

# --------------------------------------------------------------------------------------------
# row_softmax
# --------------------------------------------------------------------------------------------


def softmax_correct(scores):
    shifted = scores - scores.max(dim=-1, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_wrong_axis(scores):
    return torch.softmax(scores, dim=0)


def softmax_naive(scores):
    # no max-subtraction: exp(1000) = inf and exp(-1000) = 0 give NaN
    return scores.exp() / scores.exp().sum(dim=-1, keepdim=True)


def softmax_global_max(scores):
    # subtracts the maximum of the whole tensor, not of each row: far-below rows underflow
    shifted = scores - scores.max()
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_global_sum(scores):
    shifted = scores - scores.max(dim=-1, keepdim=True).values
    return shifted.exp() / shifted.exp().sum()


def test_row_softmax_accepts_correct():
    assert ch01.check_row_softmax(softmax_correct, verbose=False)
    assert ch01.check_row_softmax(ch01.reference_row_softmax, verbose=False)


@pytest.mark.parametrize(
    ("builtin", "named"),
    [
        (lambda scores: torch.softmax(scores, dim=-1), "torch.softmax"),
        (lambda scores: torch.nn.functional.softmax(scores, dim=-1), "torch.nn.functional.softmax"),
        (lambda scores: scores.softmax(dim=-1), "Tensor.softmax"),
        (lambda scores: torch.log_softmax(scores, dim=-1).exp(), "torch.log_softmax"),
        (lambda scores: torch.special.softmax(scores, dim=-1), "torch.special.softmax"),
        # logsumexp does the max-subtraction the exercise asks for: exp(s - logsumexp(s))
        (
            lambda scores: (scores - torch.logsumexp(scores, dim=-1, keepdim=True)).exp(),
            "torch.logsumexp",
        ),
        (
            lambda scores: (scores - scores.logsumexp(dim=-1, keepdim=True)).exp(),
            "Tensor.logsumexp",
        ),
        (
            lambda scores: (scores - torch.special.logsumexp(scores, dim=-1, keepdim=True)).exp(),
            "torch.special.logsumexp",
        ),
        (
            lambda scores: torch.nn.functional.softmin(-scores, dim=-1),
            "torch.nn.functional.softmin",
        ),
        # the last column of logcumsumexp is the log-sum-exp (review s11rv01d found it passed)
        (
            lambda scores: (scores - torch.logcumsumexp(scores, -1)[..., -1:]).exp(),
            "torch.logcumsumexp",
        ),
        (
            lambda scores: (scores - scores.logcumsumexp(-1)[..., -1:]).exp(),
            "Tensor.logcumsumexp",
        ),
        # the private op and the raw operators: the same kernel by other names
        (lambda scores: torch._softmax(scores, -1, False), "torch._softmax"),
        (lambda scores: torch._log_softmax(scores, -1, False).exp(), "torch._log_softmax"),
        (lambda scores: torch.ops.aten._softmax(scores, -1, False), "torch.ops.aten._softmax"),
        (
            lambda scores: torch.ops.aten._softmax.default(scores, -1, False),
            "torch.ops.aten._softmax.default",
        ),
        (lambda scores: torch.ops.aten.softmax.int(scores, -1), "torch.ops.aten.softmax.int"),
        # the sparse kernels, and the C namespace behind torch.* (review s9rv01c found both passed)
        (
            lambda scores: torch.sparse.softmax(scores.to_sparse(), -1).to_dense(),
            "torch.sparse.softmax",
        ),
        (
            lambda scores: torch._C._VariableFunctions.softmax(scores, -1),
            "torch._C._VariableFunctions.softmax",
        ),
        (
            lambda scores: torch._C._VariableFunctions.logsumexp(scores, [-1], True),
            "torch._C._VariableFunctions.logsumexp",
        ),
    ],
)
def test_row_softmax_rejects_the_builtin_softmax_and_restores_it(builtin, named):
    """The exercise says 'without calling torch.softmax': the check enforces it, names the
    function that was called, and leaves PyTorch's softmax working afterwards."""
    result = ch01.check_row_softmax(builtin, verbose=False)
    assert not result
    assert f"{named} was called" in result.message, result.message
    scores = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    half = torch.full((2, 2), 0.5)
    assert torch.equal(torch.softmax(scores, dim=-1), half)
    assert torch.equal(torch.nn.functional.softmax(scores, dim=-1), half)
    assert torch.equal(scores.softmax(dim=-1), half)
    assert torch.equal(torch.log_softmax(scores, dim=-1).exp(), half)
    assert torch.equal(torch.logsumexp(scores, dim=-1), scores.logsumexp(dim=-1))
    assert torch.equal(torch.nn.functional.softmin(-scores, dim=-1), half)
    assert torch.equal(torch._softmax(scores, -1, False), half)
    assert torch.equal(torch.ops.aten._softmax.default(scores, -1, False), half)
    assert torch.equal(torch.ops.aten.softmax.int(scores, -1), half)
    # (sparse: a 0 entry is absent, so shift the scores by 1, which changes no weight)
    assert torch.equal(torch.sparse.softmax((scores + 1).to_sparse(), -1).to_dense(), half)
    assert torch.equal(torch._C._VariableFunctions.softmax(scores, -1), half)
    assert torch._C._VariableFunctions is torch._VF.vf, "the C namespace itself is restored"
    assert "softmax" not in torch.Tensor.__dict__, "Tensor.softmax restored to the inherited one"
    assert "logsumexp" not in torch.Tensor.__dict__, (
        "Tensor.logsumexp restored to the inherited one"
    )
    assert "logcumsumexp" not in torch.Tensor.__dict__, "Tensor.logcumsumexp restored"
    assert torch.equal(torch.logcumsumexp(scores, -1), scores.logcumsumexp(-1))


def softmax_minus_mean(scores):
    # the row mean is not the row maximum: a score far above the mean still overflows
    shifted = scores - scores.mean(dim=-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_minus_min(scores):
    shifted = scores - scores.amin(dim=-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_max_without_keepdim(scores):
    # (..., k_len) - (...,): the maxima broadcast along the wrong axis (or not at all)
    shifted = scores - scores.amax(dim=-1)
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_sum_without_keepdim(scores):
    shifted = scores - scores.amax(dim=-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(dim=-1)


def softmax_second_axis(scores):  # written for (rows, k_len) only
    shifted = scores - scores.amax(dim=1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(dim=1, keepdim=True)


@pytest.mark.parametrize(
    "wrong",
    [
        softmax_wrong_axis,
        softmax_naive,
        softmax_global_max,
        softmax_global_sum,
        softmax_minus_mean,
        softmax_minus_min,
        softmax_max_without_keepdim,
        softmax_sum_without_keepdim,
        softmax_second_axis,
        lambda scores: torch.log_softmax(scores, dim=-1),  # log-weights, not weights
    ],
)
def test_row_softmax_rejects_wrong(wrong):
    assert not ch01.check_row_softmax(wrong, verbose=False)


@pytest.mark.parametrize("cast", ["double", "half"])
def test_row_softmax_rejects_another_dtype_and_says_so(cast):
    """Right weights in float64 (or float16) for float32 scores: the dtype is part of the
    answer, and the message names both dtypes."""

    def recast(scores):
        return getattr(softmax_correct(scores), cast)()

    result = ch01.check_row_softmax(recast, verbose=False)
    assert not result
    assert "DtypeChanged" in result.message and "torch.float32 scores" in result.message, (
        result.message
    )


def test_row_softmax_rejects_a_cast_to_float32():
    """Casting the scores with .float() first passes every float32 case; the float64 case
    catches it and names both dtypes."""

    def cast_first(scores):
        return softmax_correct(scores.float())

    result = ch01.check_row_softmax(cast_first, verbose=False)
    assert not result
    assert "DtypeChanged" in result.message and "torch.float64 scores" in result.message, (
        result.message
    )


def test_row_softmax_max_without_values_gets_a_hint():
    """scores.max(dim=-1) is a (values, indices) pair: the bare TypeError gets a hint."""

    def softmax_max_pair(scores):
        shifted = scores - scores.max(dim=-1)
        return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)

    result = ch01.check_row_softmax(softmax_max_pair, verbose=False)
    assert not result
    assert "use .values, or torch.amax" in result.message, result.message


def test_row_softmax_nan_gets_a_hint():
    """A global maximum leaves a row far below it at 0 / 0: the NaN gets a hint, a finite
    wrong answer does not."""

    def softmax_global_max(scores):
        shifted = scores - scores.max()
        return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)

    result = ch01.check_row_softmax(softmax_global_max, verbose=False)
    assert not result
    assert "Subtract each row's own maximum" in result.message, result.message
    result = ch01.check_row_softmax(lambda scores: scores.exp() / scores.exp().sum(), verbose=False)
    assert not result
    assert "own maximum" not in result.message, result.message


def test_naive_softmax_fails_only_on_large_inputs():
    """The edge cases are what catch a missing max-subtraction: the first cases pass."""
    result = ch01.check_row_softmax(softmax_naive, verbose=False)
    assert not result
    assert result.cases_run > 1
    assert "nan" in result.message.lower()


# --------------------------------------------------------------------------------------------
# relevance_scores
# --------------------------------------------------------------------------------------------


def test_relevance_scores_accepts_correct():
    assert ch01.check_relevance_scores(lambda q, k: q @ k.transpose(-2, -1), verbose=False)
    assert ch01.check_relevance_scores(lambda q, k: q @ k.mT, verbose=False)
    assert ch01.check_relevance_scores(
        lambda q, k: torch.einsum("...id,...jd->...ij", q, k), verbose=False
    )


@pytest.mark.parametrize(
    "wrong",
    [
        lambda q, k: q @ k,  # forgot the transpose
        lambda q, k: k @ q.transpose(-2, -1),  # keys × queries: the transposed matrix
        lambda q, k: (q * k).sum(-1),  # pairs q_i with k_i only
        lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]),  # scaled: chapter 2
        lambda q, k: q @ k.T,  # the chapter's 2-D form: reverses every dimension of a batch
        lambda q, k: q @ k.permute(0, 2, 1),  # right in three dimensions only
        lambda q, k: q @ k.transpose(1, 2),  # counted from the front: fails in 2-D and 4-D
    ],
)
def test_relevance_scores_rejects_wrong(wrong):
    assert not ch01.check_relevance_scores(wrong, verbose=False)


@pytest.mark.parametrize(
    "cast", [lambda t: t.float(), lambda t: t.double()], ids=["float32", "float64"]
)
def test_relevance_scores_rejects_a_changed_dtype(cast):
    """A cast passes every float32 case (or every float64 one): the float64 case catches it."""
    result = ch01.check_relevance_scores(lambda q, k: cast(q) @ cast(k).mT, verbose=False)
    assert not result
    assert "dtype" in result.message


def test_missing_transpose_fails_even_when_shapes_allow_it():
    """A square case with d_k == length makes ``q @ k`` run: it must still be rejected."""
    result = ch01.check_relevance_scores(lambda q, k: q @ k, verbose=False)
    assert not result
    assert "raised" in result.message or "differ" in result.message


# --------------------------------------------------------------------------------------------
# additive_scores
# --------------------------------------------------------------------------------------------


def additive_correct(x_q, x_k, w_q, w_k, w_a):
    hidden = torch.tanh((x_q @ w_q)[..., :, None, :] + (x_k @ w_k)[..., None, :, :])
    return (hidden * w_a).sum(-1)


def additive_tanh_separately(x_q, x_k, w_q, w_k, w_a):
    hidden = torch.tanh(x_q @ w_q)[..., :, None, :] + torch.tanh(x_k @ w_k)[..., None, :, :]
    return hidden @ w_a


def additive_no_broadcast(x_q, x_k, w_q, w_k, w_a):
    return torch.tanh(x_q @ w_q + x_k @ w_k) @ w_a  # pairs q_i with k_i only


def additive_no_tanh(x_q, x_k, w_q, w_k, w_a):
    return ((x_q @ w_q)[..., :, None, :] + (x_k @ w_k)[..., None, :, :]) @ w_a


def additive_swapped(x_q, x_k, w_q, w_k, w_a):
    return additive_correct(x_q, x_k, w_q, w_k, w_a).transpose(-2, -1)


def test_additive_scores_accepts_correct():
    assert ch01.check_additive_scores(additive_correct, verbose=False)


def additive_w_before_tanh(x_q, x_k, w_q, w_k, w_a):
    return torch.tanh(((x_q @ w_q)[..., :, None, :] + (x_k @ w_k)[..., None, :, :]) @ w_a)


def additive_product(x_q, x_k, w_q, w_k, w_a):  # multiplies the projections instead of adding them
    return torch.tanh((x_q @ w_q)[..., :, None, :] * (x_k @ w_k)[..., None, :, :]) @ w_a


def additive_softmaxed(x_q, x_k, w_q, w_k, w_a):  # weights, not scores
    return torch.softmax(additive_correct(x_q, x_k, w_q, w_k, w_a), dim=-1)


@pytest.mark.parametrize(
    "wrong",
    [
        additive_tanh_separately,
        additive_no_broadcast,
        additive_no_tanh,
        additive_swapped,
        additive_w_before_tanh,
        additive_product,
        additive_softmaxed,
    ],
)
def test_additive_scores_rejects_wrong(wrong):
    assert not ch01.check_additive_scores(wrong, verbose=False)


def additive_through_the_package(x_q, x_k, w_q, w_k, w_a):
    """Right numbers and a live graph, but AdditiveScore.forward (the withheld answer) does the
    pairing: the reader's weights are swapped into the package's module."""
    module = AdditiveScore(d_query=x_q.shape[-1], d_key=x_k.shape[-1], d_hidden=w_a.shape[0])
    weights = {"query_proj.weight": w_q.T, "key_proj.weight": w_k.T, "score_proj.weight": w_a[None]}
    return torch.func.functional_call(module, weights, (x_q, x_k))


def test_additive_scores_refuses_the_package_forward_and_says_so():
    case = ch01._additive_cases()[-1]
    torch.testing.assert_close(
        additive_through_the_package(**case), ch01.reference_additive_scores(**case)
    )
    result = ch01.check_additive_scores(additive_through_the_package, verbose=False)
    assert not result and "AdditiveScore.forward" in result.message, result.message
    assert ch01.check_additive_scores(additive_correct, verbose=False), "the reference passes"


def test_additive_scores_old_parameter_name_is_named_in_the_message():
    def old_names(x_q, x_k, w_q, w_k, w):
        return additive_correct(x_q, x_k, w_q, w_k, w)

    result = ch01.check_additive_scores(old_names, verbose=False)
    assert not result and "keep the parameter names" in result.message


def additive_loop_over_pairs(x_q, x_k, w_q, w_k, w_a):  # right numbers, one pair at a time
    scores = torch.empty(*x_q.shape[:-1], x_k.shape[-2])
    for i in range(x_q.shape[-2]):
        for j in range(x_k.shape[-2]):
            scores[..., i, j] = torch.tanh(x_q[..., i, :] @ w_q + x_k[..., j, :] @ w_k) @ w_a
    return scores


def additive_loop_over_queries(x_q, x_k, w_q, w_k, w_a):  # right numbers, one query at a time
    rows = [torch.tanh(x_q[..., i, None, :] @ w_q + x_k @ w_k) @ w_a for i in range(x_q.shape[-2])]
    return torch.stack(rows, dim=-2)  # (..., q_len, k_len)


def additive_loop_over_hidden_units(x_q, x_k, w_q, w_k, w_a):  # right numbers, one unit at a time
    hq, hk = x_q @ w_q, x_k @ w_k  # (..., q_len, d_a), (..., k_len, d_a)
    total = 0.0
    for c in range(w_a.shape[0]):
        total = total + torch.tanh(hq[..., :, None, c] + hk[..., None, :, c]) * w_a[c]
    return total  # (..., q_len, k_len)


def additive_loop_one_call_per_query(x_q, x_k, w_q, w_k, w_a):  # review rv01d: was accepted
    hq, hk = (x_q @ w_q).unsqueeze(-2), x_k @ w_k  # hq: (..., q_len, 1, d_a)
    pairs = torch.stack([hk + h for h in hq.unbind(-3)], -3)  # one addition per query
    return torch.tanh(pairs) @ w_a


def additive_loop_two_calls_per_query(x_q, x_k, w_q, w_k, w_a):  # review rv01d: was accepted
    hq, hk = (x_q @ w_q).unsqueeze(-2), x_k @ w_k
    return torch.stack([torch.tanh(h + hk) for h in hq.unbind(-3)], -3) @ w_a


@pytest.mark.parametrize(
    "loop",
    [
        additive_loop_over_pairs,
        additive_loop_over_queries,
        additive_loop_over_hidden_units,
        additive_loop_one_call_per_query,
        additive_loop_two_calls_per_query,
    ],
)
def test_additive_scores_rejects_a_python_loop_and_says_so(loop):
    """The prompt says 'without a Python loop': the check enforces it (the 64-query case
    catches even one call per query), although the loop's numbers are right."""
    case = ch01._additive_cases()[-1]
    torch.testing.assert_close(loop(**case), ch01.reference_additive_scores(**case))
    result = ch01.check_additive_scores(loop, verbose=False)
    assert not result
    assert "PythonLoopSuspected" in result.message and "loops in Python" in result.message


def test_additive_scores_broadcast_answers_stay_under_the_call_budget():
    def einsum_answer(x_q, x_k, w_q, w_k, w_a):
        hidden = torch.tanh(
            torch.einsum("...id,da->...ia", x_q, w_q)[..., :, None, :]
            + torch.einsum("...jd,da->...ja", x_k, w_k)[..., None, :, :]
        )
        return torch.einsum("...ija,a->...ij", hidden, w_a)

    assert ch01.check_additive_scores(einsum_answer, verbose=False)
    assert ch01.check_additive_scores(additive_correct, verbose=False)
    assert ch01.check_additive_scores(ch01.reference_additive_scores, verbose=False)


def test_reference_additive_matches_companion_module():
    torch.manual_seed(0)
    module = AdditiveScore(d_query=3, d_key=5, d_hidden=4)
    q, k = torch.randn(2, 6, 3), torch.randn(2, 4, 5)
    expected = module(q, k)
    got = ch01.reference_additive_scores(
        q,
        k,
        module.query_proj.weight.T,  # nn.Linear stores (out, in)
        module.key_proj.weight.T,
        module.score_proj.weight[0],
    )
    torch.testing.assert_close(got, expected)


# --------------------------------------------------------------------------------------------
# every check: stubs, determinism
# --------------------------------------------------------------------------------------------


def test_cases_are_reproducible():
    first = ch01._row_softmax_cases()
    second = ch01._row_softmax_cases()
    assert all(torch.equal(a["scores"], b["scores"]) for a, b in zip(first, second))


def test_softmax_cases_include_large_magnitudes():
    assert max(float(c["scores"].abs().max()) for c in ch01._row_softmax_cases()) >= 1000


# --------------------------------------------------------------------------------------------
# is_permutation_equivariant: the reader writes the test, the check grades its verdicts
# --------------------------------------------------------------------------------------------


def equivariance_test_correct(layer, x):  # the swap of the ends, then 20 fresh draws
    n = x.shape[0]
    out = layer(x)
    swap = torch.arange(n)
    swap[[0, -1]] = swap[[-1, 0]]
    for perm in [swap] + [torch.randperm(n) for _ in range(20)]:
        if not torch.allclose(layer(x[perm]), out[perm], atol=1e-5):
            return False
    return True


def equivariance_test_all_permutations(layer, x):  # all n! up to 6 tokens, fresh draws beyond
    import itertools

    n = x.shape[0]
    out = layer(x)
    if n <= 6:
        perms = [list(p) for p in itertools.permutations(range(n))]
    else:
        swap = list(range(n))
        swap[0], swap[-1] = swap[-1], swap[0]
        perms = [swap] + [torch.randperm(n) for _ in range(30)]
    return all(torch.allclose(layer(x[p]), out[p], atol=1e-5) for p in perms)


def equivariance_test_exact(layer, x):  # torch.equal: a reordered float sum differs in its last bit
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    return torch.equal(layer(x[perm]), layer(x)[perm])


def equivariance_test_output_not_permuted(layer, x):  # compares with the unshuffled output
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[perm]), layer(x), atol=1e-5)


def equivariance_test_inverse(layer, x):  # shuffles the output with the inverse permutation
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[perm]), layer(x)[perm.argsort()], atol=1e-5)


def equivariance_test_reversal_only(layer, x):
    perm = torch.arange(x.shape[0] - 1, -1, -1)
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


def equivariance_test_shifts_only(layer, x):
    n = x.shape[0]
    return all(
        torch.allclose(layer(x.roll(s, 0)), layer(x).roll(s, 0), atol=1e-5) for s in range(1, n)
    )


def equivariance_test_swap_first_two(layer, x):  # one transposition, always the same one
    perm = torch.arange(x.shape[0])
    perm[[0, 1]] = perm[[1, 0]]
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


def equivariance_test_reversal_and_shift(layer, x):  # the two "structured" reorderings only
    out = layer(x)
    reversal = torch.arange(x.shape[0] - 1, -1, -1)
    shift = torch.roll(torch.arange(x.shape[0]), 1)
    return all(torch.allclose(layer(x[p]), out[p], atol=1e-5) for p in (reversal, shift))


def equivariance_test_loose(layer, x):  # a tolerance of 0.1 hides small position codes
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=0.1)


def equivariance_test_one_random_draw(layer, x):  # one unseeded permutation: may be the identity
    perm = torch.randperm(x.shape[0])
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_equivariance_test_with_one_random_draw_is_rejected(seed):
    """Short sequences (two tokens, three) make a single random permutation the identity
    often: the check has over a hundred of them. The check seeds the global generator itself,
    so the caller's seed does not change the verdict."""
    torch.manual_seed(seed)
    result = ch01.check_is_permutation_equivariant(equivariance_test_one_random_draw, verbose=False)
    assert not result, f"seed {seed}: {result.message}"


def equivariance_test_random_draws(count):  # `count` unseeded permutations, a right comparison
    def test(layer, x):
        output = layer(x)
        perms = [torch.randperm(x.shape[0]) for _ in range(count)]
        return all(torch.allclose(layer(x[p]), output[p], atol=1e-5, rtol=1e-5) for p in perms)

    return test


def test_equivariance_verdict_is_the_same_on_every_call():
    """A test drawing 10 unseeded permutations passed under 34 of 40 global seeds before the
    check seeded the global generator itself: the same cell flipped its verdict on re-runs.
    Now the verdict is the same whatever the caller's generator state, and that state is
    given back untouched."""
    verdicts = []
    for seed in (0, 1, 2, 12345):
        torch.manual_seed(seed)
        result = ch01.check_is_permutation_equivariant(
            equivariance_test_random_draws(10), verbose=False
        )
        verdicts.append((bool(result), result.message))
        after_check = torch.rand(3)
        torch.manual_seed(seed)
        assert torch.equal(after_check, torch.rand(3)), "the check must restore the caller's RNG"
    assert len(set(verdicts)) == 1, f"verdicts differ between calls: {verdicts}"


def equivariance_test_one_seeded_draw(seed):  # one permutation, from a generator seeded inside
    def test(layer, x):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5, rtol=1e-5)

    return test


@pytest.mark.parametrize("seed", range(40))
def test_equivariance_test_with_one_seeded_draw_is_rejected(seed):
    """A seeded draw gives the same permutation on every call of the same length: the parity
    layer, at 37 lengths, is missed only when all 37 draws are even (2^-37)."""
    result = ch01.check_is_permutation_equivariant(
        equivariance_test_one_seeded_draw(seed), verbose=False
    )
    assert not result, f"seed {seed}: {result.message}"


def test_equivariance_parity_layer_changes_under_odd_reorderings_only():
    layer = ch01.equivariance_test_layers()["attention plus the parity of the tokens' order"]
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(5))
    out = layer(x)
    three_cycle = torch.tensor([1, 2, 0, 3, 4, 5])  # even: two swaps
    assert torch.allclose(layer(x[three_cycle]), out[three_cycle], atol=1e-5)
    swap = _swap(6, 2, 4)  # odd: one swap
    assert (layer(x[swap]) - out[swap]).abs().min() > 0.99, "an odd reordering moves it by 1"
    cases = ch01._equivariance_cases()
    lengths = [case["x"].shape[0] for case in cases if repr(case["layer"]) == repr(layer)]
    assert sorted(lengths) == list(range(4, ch01.EQUIVARIANCE_PARITY_LONGEST + 1)), lengths
    assert ch01.EQUIVARIANCE_PARITY_LONGEST == 40


def equivariance_test_seeded_draws(count, seed):  # `count` draws repeated on every call
    def test(layer, x):
        g = torch.Generator().manual_seed(seed)
        perms = [torch.randperm(x.shape[0], generator=g) for _ in range(count)]
        return all(torch.allclose(layer(x[p]), layer(x)[p], atol=1e-5, rtol=1e-5) for p in perms)

    return test


def test_equivariance_three_seeded_draws_are_rejected_for_almost_every_seed():
    """Three draws from a generator seeded inside the test repeat on every case of one length,
    so the two-token cases count as one trial. With the parity layer at 9 lengths, 23 of 100
    such seeds passed (review rv01b); at 37 lengths each passes only if one of its 3 draws is
    odd at every length, (7/8)^37 < 1% (measured: 2 of seeds 0 to 99, neither below 20)."""
    accepted = [
        seed
        for seed in range(20)
        if ch01.check_is_permutation_equivariant(
            equivariance_test_seeded_draws(3, seed), verbose=False
        )
    ]
    assert accepted == [], f"3 seeded draws accepted under seeds {accepted}"


def equivariance_test_swap_ends_and_one_global_draw(layer, x):
    swap = torch.arange(x.shape[0])
    swap[[0, -1]] = swap[[-1, 0]]
    perms = [swap, torch.randperm(x.shape[0])]  # the second from PyTorch's global generator
    return all(torch.allclose(layer(x[p]), layer(x)[p], atol=1e-5) for p in perms)


@pytest.mark.parametrize("seed", range(10))
def test_equivariance_swap_of_the_ends_and_one_draw_is_rejected(seed, monkeypatch):
    """The swap of the ends leaves the middle of three tokens in place, and so does one draw in
    3: with one three-token case of the middle-token layer, this test passed at 26 of 40 global
    seeds (review s9rv01c); with 21 it passes with probability (2/3)^21, about 2e-4."""
    monkeypatch.setattr(ch01, "EQUIVARIANCE_GLOBAL_SEEDS", (seed,))
    result = ch01.check_is_permutation_equivariant(
        equivariance_test_swap_ends_and_one_global_draw, verbose=False
    )
    assert not result, f"global seed {seed}: {result.message}"


def test_equivariance_cases_include_short_sequences():
    short = [case for case in ch01._equivariance_cases() if case["x"].shape[0] <= 3]
    # + 1: the three sorted tokens of the layer that reacts only to rotations
    expected = 5 + ch01.EQUIVARIANCE_TWO_TOKEN_CASES + 3 + ch01.EQUIVARIANCE_MIDDLE_TOKEN_CASES + 1
    assert len(short) == expected, [c["x"].shape for c in short]
    for case in short:  # each short case is a layer that is NOT equivariant at its length
        assert not ch01.reference_is_permutation_equivariant(case["layer"], case["x"]), case


def equivariance_test_features(layer, x):  # shuffles the features, not the tokens
    perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5)


def test_equivariance_test_accepts_correct():
    assert ch01.check_is_permutation_equivariant(equivariance_test_correct, verbose=False)
    assert ch01.check_is_permutation_equivariant(equivariance_test_all_permutations, verbose=False)
    assert ch01.check_is_permutation_equivariant(
        ch01.reference_is_permutation_equivariant, verbose=False
    )


def _swap_ends(n):
    perm = torch.arange(n)
    perm[[0, -1]] = perm[[-1, 0]]
    return perm


def _commutes(layer, x, perms):
    out = layer(x)
    return all(torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms)


def equivariance_test_private_generator(layer, x):  # swap + 10 draws, seeded inside the test
    g = torch.Generator().manual_seed(3)  # the chapter's own idiom: the same draws every call
    n = x.shape[0]
    return _commutes(
        layer, x, [_swap_ends(n)] + [torch.randperm(n, generator=g) for _ in range(10)]
    )


def equivariance_test_global_seed_inside(layer, x):  # swap + 20, after torch.manual_seed(0)
    torch.manual_seed(0)
    n = x.shape[0]
    return _commutes(layer, x, [_swap_ends(n)] + [torch.randperm(n) for _ in range(20)])


def equivariance_test_union_of_fixed_sets(layer, x):  # every swap, every shift, the reversal
    n = x.shape[0]
    perms = [_swap(n, i, j) for i in range(n) for j in range(i + 1, n)]
    perms += [torch.roll(torch.arange(n), k) for k in range(1, n)] + [torch.arange(n - 1, -1, -1)]
    return _commutes(layer, x, perms)


@pytest.mark.parametrize(
    "fixed",
    [
        equivariance_test_private_generator,
        equivariance_test_global_seed_inside,
        equivariance_test_union_of_fixed_sets,
    ],
)
def test_equivariance_fixed_lists_are_rejected_by_the_adaptive_case(fixed):
    """Review s11rv01d: these passed every fixed case (the first for 9 of 10 seeds). The adaptive
    case builds a layer that commutes with exactly the reorderings of the test's first call, and
    a fixed list tries them again on the second."""
    problem = ch01.adaptive_case_problem(fixed)
    assert problem is not None and "fixed list" in problem, problem
    result = ch01.check_is_permutation_equivariant(fixed, verbose=False)
    assert not result and "fixed list" in result.message, result.message


def equivariance_test_extra_draw_first(k):  # swap + k fresh draws, after one draw thrown away
    def test(layer, x):
        n = x.shape[0]
        torch.randperm(n)
        return _commutes(layer, x, [_swap_ends(n)] + [torch.randperm(n) for _ in range(k)])

    return test


@pytest.mark.parametrize("k", [3, 10, 20])
def test_equivariance_adaptive_case_accepts_fresh_draws(k):
    """Fresh draws leave the first call's reorderings, so the adaptive case never blames them
    (whether 10 draws pass the fixed cases is the 4-token case's luck, not this case's)."""
    assert ch01.adaptive_case_problem(equivariance_test_extra_draw_first(k)) is None
    assert ch01.adaptive_case_problem(equivariance_test_all_permutations) is None  # all 720
    assert ch01.adaptive_case_problem(equivariance_test_random_draws(k)) is None


def test_equivariance_adaptive_case_false_reject_rate_is_tiny():
    """A right test of k fresh draws is rejected only if all k land among the first call's
    reorderings. For the solution (the swap + 20 draws: at most 22 tried, identity included) that
    is below 1e-3 by far, and so it is for 3 draws without the swap."""
    assert ch01.EQUIVARIANCE_ADAPTIVE_TOKENS >= 5
    assert ch01.adaptive_false_reject_probability(tried=22, draws=20) < 1e-3
    assert ch01.adaptive_false_reject_probability(tried=4, draws=3) < 1e-3
    assert ch01.adaptive_false_reject_probability(tried=3, draws=2, seq_len=3) == 0.25
    seeds = ch01.EQUIVARIANCE_ADAPTIVE_SEEDS
    assert len(set(seeds)) == 2 and not set(seeds) & set(ch01.EQUIVARIANCE_GLOBAL_SEEDS)


def test_equivariance_adaptive_layer_commutes_with_exactly_the_allowed_reorderings():
    import itertools

    x = ch01._adaptive_input()
    n = x.shape[0]
    assert len({tuple(row.tolist()) for row in x}) == n, "the tokens must differ"
    allowed = [torch.arange(n), _swap_ends(n), torch.roll(torch.arange(n), 2)]
    layer = ch01._adaptive_layer(x, allowed)
    keys = {tuple(p.tolist()) for p in allowed}
    out = layer(x)
    for p in itertools.islice(itertools.permutations(range(n)), 0, 720, 7):
        p = torch.tensor(p)
        change = (layer(x[p]) - out[p]).abs().max().item()
        assert (change < 1e-5) == (tuple(p.tolist()) in keys), (p, change)
        assert tuple(p.tolist()) in keys or change >= 0.99
    for p in allowed:
        assert (layer(x[p]) - out[p]).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "wrong",
    [
        equivariance_test_exact,
        equivariance_test_output_not_permuted,
        equivariance_test_inverse,
        equivariance_test_reversal_only,
        equivariance_test_shifts_only,
        equivariance_test_swap_first_two,
        equivariance_test_reversal_and_shift,
        equivariance_test_loose,
        equivariance_test_features,
        lambda layer, x: True,  # a test that cannot fail
        lambda layer, x: False,
    ],
)
def test_equivariance_test_rejects_wrong(wrong):
    assert not ch01.check_is_permutation_equivariant(wrong, verbose=False)


def equivariance_test_sorted_outputs(layer, x):  # equal as multisets of rows, not row by row
    gen = torch.Generator().manual_seed(5)
    out = layer(x).sort(0).values
    for _ in range(20):
        perm = torch.randperm(x.shape[0], generator=gen)
        if not torch.allclose(layer(x[perm]).sort(0).values, out, atol=1e-5):
            return False
    return True


def test_equivariance_multiset_comparison_is_rejected_by_the_wrongly_ordered_layers():
    """Comparing sorted outputs accepts a layer whose rows come out in a wrong order: the check
    must reject that test, and say which of those layers it accepted."""
    layers = ch01.equivariance_test_layers()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    for name in (
        "attention, then the output rows reversed",
        "attention, then the output rows shifted by one",
        "attention, then each output column sorted",
    ):
        assert not ch01.reference_is_permutation_equivariant(layers[name], x), name
        assert equivariance_test_sorted_outputs(layers[name], x), name  # the trap works
    result = ch01.check_is_permutation_equivariant(equivariance_test_sorted_outputs, verbose=False)
    assert not result
    # the first layer it accepts: the marked signs (a sorted column loses which row the mark
    # was on) or one of the layers whose rows come out in a wrong order
    assert "NOT permutation-equivariant" in result.message, result.message
    # the fault is the comparison, not the number of reorderings tried
    assert "ignores which output row is which" in result.message, result.message
    assert "Try more reorderings" not in result.message, result.message


def test_equivariance_fixed_generating_reorderings_are_not_enough():
    """The swap of the ends and a cyclic shift generate every reordering, yet checked at one input
    they do not compose: the layer that bumps row 0 when token 0 is the largest slips past them
    (its largest token at index 2 of 4), and the check says why."""

    def swap_and_shift(layer, x):
        n = x.shape[0]
        output = layer(x)
        swap = torch.arange(n)
        swap[[0, -1]] = swap[[-1, 0]]
        perms = [swap, torch.roll(torch.arange(n), 1)]
        return all(torch.allclose(layer(x[p]), output[p], atol=1e-5, rtol=1e-5) for p in perms)

    ((layer, x),) = [  # the largest-first layer, 4 tokens
        case for case in ch01.equivariance_check_inputs() if case[0].name.endswith("is the largest")
    ]
    assert swap_and_shift(layer, x), "the trap: both fixed reorderings commute at this input"
    assert not ch01.reference_is_permutation_equivariant(layer, x)
    result = ch01.check_is_permutation_equivariant(swap_and_shift, verbose=False)
    assert not result
    assert "do not compose" in result.message, result.message


def test_equivariance_all_swaps_of_two_tokens_are_rejected():
    """Every swap of two tokens, tried at one input, still misses the layer that reacts only to
    rotations of its sorted tokens (review s10rvF01)."""
    swaps = _equivariant_under(
        lambda n: [_swap(n, i, j) for i in range(n) for j in range(i + 1, n)]
    )
    ((layer, x),) = [  # the layer that reacts only to rotations of its sorted tokens, 3 tokens
        case for case in ch01.equivariance_check_inputs() if case[0].name.endswith("are rotated")
    ]
    assert swaps(layer, x), "the trap: every swap commutes at this input"
    assert not ch01.reference_is_permutation_equivariant(layer, x)
    result = ch01.check_is_permutation_equivariant(swaps, verbose=False)
    assert not result
    assert "do not compose" in result.message, result.message


def test_equivariance_summed_comparison_is_named_invariance():
    """Comparing the outputs summed over the tokens tests invariance, not equivariance: the
    check rejects it and says that the comparison ignores which row is which."""

    def summed_outputs(layer, x):
        gen = torch.Generator().manual_seed(5)
        perms = [torch.arange(x.shape[0]).flip(0)]
        perms += [torch.randperm(x.shape[0], generator=gen) for _ in range(20)]
        total = layer(x).sum(0)  # (d_out,)
        return all(torch.allclose(layer(x[p]).sum(0), total, atol=1e-5, rtol=1e-5) for p in perms)

    result = ch01.check_is_permutation_equivariant(summed_outputs, verbose=False)
    assert not result
    assert "ignores which output row is which" in result.message, result.message
    assert "invariance, not equivariance" in result.message, result.message
    assert "all, not any" not in result.message, result.message


def test_equivariance_too_few_reorderings_are_not_blamed_on_the_comparison():
    """A test that tries only the reversal compares row by row: it gets the hint to try more
    reorderings, not the sorted-comparison hint."""

    def reversal_only(layer, x):
        perm = torch.arange(x.shape[0] - 1, -1, -1)
        return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)

    result = ch01.check_is_permutation_equivariant(reversal_only, verbose=False)
    assert not result
    assert "Try more reorderings" in result.message, result.message
    assert "ignores which output row" not in result.message, result.message


def equivariance_test_default_allclose(layer, x):  # atol=1e-8: rejects float32 rounding
    return _equivariance_test_with_atol(1e-8)(layer, x)  # torch.allclose's defaults


def test_equivariance_default_allclose_is_rejected_and_the_message_says_why():
    """A test with torch.allclose's default tolerances rejects a layer that IS equivariant:
    the message says so, gives the size of the float32 rounding and the tolerance to use."""
    for strict in (equivariance_test_default_allclose, equivariance_test_exact):
        result = ch01.check_is_permutation_equivariant(strict, verbose=False)
        assert not result
        message = result.message
        assert "your test rejected NamedLayer(" in message, message
        assert "IS permutation-equivariant" in message, message
        assert "float32 rounding" in message and "atol=1e-5" in message, message
        gap = float(message.split("by at most ")[1].split(" ")[0])
        assert 0 < gap < 1e-5, gap


def test_equivariance_too_loose_test_is_rejected_and_the_message_says_why():
    result = ch01.check_is_permutation_equivariant(equivariance_test_loose, verbose=False)
    assert not result
    assert "your test accepted NamedLayer('attention with small position codes')" in result.message
    assert "NOT permutation-equivariant" in result.message and "stricter" in result.message


def equivariance_test_max_diff_below_1e_4(layer, x):  # review s11rv01f: the rule read literally
    out = layer(x)
    perms = [torch.randperm(x.shape[0]) for _ in range(50)]
    return all((layer(x[p]) - out[p]).abs().max().item() < 1e-4 for p in perms)


def test_equivariance_max_diff_below_1e_4_is_rejected_as_the_statement_says():
    """The statement says a change just under 1e-4 is real and `max|diff| < 1e-4` is too loose:
    the planted change is under 1e-4, so the check rejects that test, and says why."""
    assert ch01._MARK < ch01.EQUIVARIANCE_SMALLEST_CHANGE
    torch.manual_seed(0)
    result = ch01.check_is_permutation_equivariant(
        equivariance_test_max_diff_below_1e_4, verbose=False
    )
    assert not result
    assert "stricter" in result.message and "max|diff| < 1e-4" in result.message


def equivariance_test_numpy_bool(layer, x):  # np.all returns numpy.bool_, not bool
    n = x.shape[0]
    out = layer(x).numpy()
    perms = [torch.randperm(n, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    perms.append(torch.arange(n).flip(0))
    return np.all(
        [np.allclose(layer(x[p]).numpy(), out[p.numpy()], atol=1e-5, rtol=0) for p in perms]
    )


def test_equivariance_accepts_a_numpy_bool():
    result = ch01.check_is_permutation_equivariant(equivariance_test_numpy_bool, verbose=False)
    assert "True or False" not in result.message, result.message


def test_equivariance_verdict_must_be_a_bool():
    result = ch01.check_is_permutation_equivariant(lambda layer, x: 1, verbose=False)
    assert not result and "True or False" in result.message
    stub_result = ch01.check_is_permutation_equivariant(_equivariance_stub, verbose=False)
    assert not stub_result and "not attempted yet" in stub_result.message


def _equivariance_stub(layer, x):
    raise NotImplementedError


def test_equivariance_layers_are_what_their_names_say():
    """Each layer of the check is (or is not) equivariant, and attention's reordered output
    differs in its last bits, so an exact comparison is not enough."""
    layers = ch01.equivariance_test_layers()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    equivariant = {
        "self-attention",
        "per-token linear layer",
        "attention plus the mean token",
        "the tokens summed forwards minus backwards",
    }
    for name, layer in layers.items():
        assert ch01.reference_is_permutation_equivariant(layer, x) == (name in equivariant), name
        assert repr(layer) == f"NamedLayer({name!r})"
    # the reference agrees with the chapter's attention from companion
    w_q, w_k, w_v = (
        torch.randn(4, 3, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3)
    )
    layer = ch01.NamedLayer(
        "companion", lambda x: scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, scale=1.0)[0]
    )
    assert ch01.reference_is_permutation_equivariant(layer, x)
    attention = layers["self-attention"]
    perms = [torch.randperm(6, generator=torch.Generator().manual_seed(s)) for s in range(5)]
    assert any(not torch.equal(attention(x[p]), attention(x)[p]) for p in perms)


def test_default_allclose_fails_on_the_rounding_layer_by_design():
    """The forwards-minus-backwards layer is 0 up to float32 rounding that moves with the tokens:
    plain float32 additions, so the rounding (and the default-allclose verdict the check relies
    on) is the same on every machine; atol=1e-5 accepts it."""
    layer = ch01.equivariance_test_layers()["the tokens summed forwards minus backwards"]
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    out = layer(x)
    assert out.abs().max() < 1e-5 and out.abs().max() > 0  # rounding noise, not exactly 0
    perms = [torch.randperm(6, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    assert not all(torch.allclose(layer(x[p]), out[p]) for p in perms)
    assert all(torch.allclose(layer(x[p]), out[p], atol=1e-5) for p in perms)
    assert ch01.reference_is_permutation_equivariant(layer, x)


def test_equivariance_traps_fool_only_their_wrong_test():
    """The symmetric circular convolution commutes with the reversal and every cyclic shift,
    and the codes alike at positions 0 and 1 with the swap of those two tokens: each one is
    what defeats the matching wrong test, and each fails the reference."""
    layers = ch01.equivariance_test_layers()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(4))
    conv = layers["circular convolution with a symmetric kernel"]
    alike = layers["attention with codes alike at positions 0 and 1"]
    assert equivariance_test_reversal_and_shift(conv, x)
    assert equivariance_test_swap_first_two(alike, x)
    assert not ch01.reference_is_permutation_equivariant(conv, x)
    assert not ch01.reference_is_permutation_equivariant(alike, x)


# --------------------------------------------------------------------------------------------
# offset_head: graded by what the head does, so every right construction passes
# --------------------------------------------------------------------------------------------


def _turn(angle):
    """(2, 2): the row vector (cos φ, sin φ) times it is (cos(φ + angle), sin(φ + angle))."""
    return torch.tensor([[math.cos(angle), math.sin(angle)], [-math.sin(angle), math.cos(angle)]])


def make_head(stretch, query_turn, key_turn=0.0, word_rows=0.0, d_k=2):
    """An offset_head built from a rule: stretch(θ), the query's and the key's turn(θ, offset)."""

    def offset_head(d_content, step_angle, offset):
        w_q = torch.zeros(d_content + 2, d_k)
        w_k = torch.zeros(d_content + 2, d_k)
        w_q[d_content:, :2] = stretch(step_angle) * _turn(query_turn(step_angle, offset))
        w_k[d_content:, :2] = _turn(key_turn(step_angle, offset) if callable(key_turn) else 0.0)
        w_q[:d_content, 0] = word_rows
        w_k[:d_content, 0] = word_rows
        return w_q, w_k

    return offset_head


def enough(step_angle):
    return 8 / (1 - math.cos(step_angle))


def forward(step_angle, offset):
    return offset * step_angle


def test_offset_head_accepts_right_heads():
    assert ch01.check_offset_head(ch01.reference_offset_head, verbose=False)
    assert ch01.check_offset_head(make_head(enough, forward), verbose=False)
    # turn the key back instead of the query forward, a huge stretch, d_k = 3
    assert ch01.check_offset_head(
        make_head(enough, lambda t, o: 0.0, key_turn=lambda t, o: -o * t), verbose=False
    )
    assert ch01.check_offset_head(make_head(lambda t: 1e4, forward), verbose=False)
    assert ch01.check_offset_head(make_head(enough, forward, d_k=3), verbose=False)
    # the same head in float64 and with requires_grad
    assert ch01.check_offset_head(
        lambda **kw: tuple(w.double().requires_grad_() for w in ch01.reference_offset_head(**kw)),
        verbose=False,
    )


@pytest.mark.parametrize(
    "wrong, why",
    [
        (make_head(lambda t: 30.0, forward), "larger stretch"),  # section 1.6's κ = 30, every θ
        (make_head(lambda t: 1.0, forward), "larger stretch"),  # no stretch at all
        (make_head(lambda t: 100.0, forward), "larger stretch"),  # fixed: fails at 10°, 5°
        (make_head(lambda t: 1000.0, forward), "larger stretch"),  # fixed: fails at 2°
        (make_head(enough, lambda t, o: -o * t), "other way"),  # turned the wrong way
        (make_head(enough, lambda t, o: -t), "most"),  # the chapter's previous-token head
        (make_head(enough, lambda t, o: math.copysign(t, o) if o else 0.0), "most"),  # θ, not Δθ
        (make_head(enough, forward, key_turn=forward), "itself"),  # both turned: cancels
        (make_head(enough, forward, word_rows=1.0), "word"),  # reads the random words
        # step_angle taken for degrees: the turn is converted once more
        (make_head(enough, lambda t, o: math.radians(o * t)), "math.radians(offset"),
        (make_head(enough, lambda t, o: math.degrees(o * t)), "math.degrees(offset"),
        (lambda d_content, step_angle, offset: tuple(  # (d_k, d_content + 2): transposed
            w.T for w in ch01.reference_offset_head(d_content, step_angle, offset)
        ), "rows"),
        (lambda d_content, step_angle, offset: ch01.reference_offset_head(
            d_content, step_angle, offset
        )[0], "pair"),  # only w_q
    ],
)  # fmt: skip
def test_offset_head_rejects_wrong_heads_and_says_why(wrong, why):
    result = ch01.check_offset_head(wrong, verbose=False)
    assert not result
    assert why in result.message, result.message


def test_offset_head_word_rows_in_w_q_when_the_target_is_on_top_but_under_90_percent():
    """The reference plus word rows of 3.0 in W_Q only: at 22.5° with large word vectors some
    query's target is still its top key, with 0.88 of the weight. The message says so and
    names the word rows, without the old garbled "0.88 on key 4 and most (0.88) on key 4"."""

    def word_rows_in_query(d_content, step_angle, offset):
        query_weight, key_weight = ch01.reference_offset_head(d_content, step_angle, offset)
        query_weight[:d_content] = 3.0
        return query_weight, key_weight

    result = ch01.check_offset_head(word_rows_in_query, verbose=False)
    assert not result
    assert "case 6 " in result.message, result.message
    assert "its largest weight, but under 0.9; your matrices read the word's numbers" in (
        result.message
    ), result.message
    assert "and most" not in result.message, result.message


def test_offset_head_word_rows_named_when_every_target_is_on_top_but_some_under_90_percent():
    """Random word rows (N(0, 1) times 5, seed 0) in W_Q only: in case 1 every query's target is
    its top key, query 5's with 0.75 of the weight. The message asks for a larger stretch and
    also names the word rows, the real fault."""

    def random_word_rows_in_query(d_content, step_angle, offset):
        query_weight, key_weight = ch01.reference_offset_head(d_content, step_angle, offset)
        generator = torch.Generator().manual_seed(0)
        query_weight[:d_content] = 5 * torch.randn(d_content, 2, generator=generator)
        return query_weight, key_weight

    result = ch01.check_offset_head(random_word_rows_in_query, verbose=False)
    assert not result
    assert "case 1 " in result.message and "The scores are too close" in result.message, (
        result.message
    )
    assert "your matrices read the word's numbers" in result.message, result.message


def test_offset_head_units_hint_only_for_a_unit_mix_up():
    """The units hint names radians; a head with the right turn but too small a stretch, or one
    that turns both matrices, is not told about units."""
    wrong_units = ch01.check_offset_head(
        make_head(enough, lambda t, o: math.radians(o * t)), verbose=False
    )
    assert "already in radians" in wrong_units.message, wrong_units.message
    assert "step_angle = 0.524 rad (30°)" in wrong_units.message, wrong_units.message
    for wrong in (make_head(lambda t: 30.0, forward), make_head(enough, forward, key_turn=forward)):
        message = ch01.check_offset_head(wrong, verbose=False).message
        assert "radians" not in message.split("):", 1)[1], message


def test_offset_head_message_for_a_stub_and_a_crash():
    def stub(d_content, step_angle, offset):
        raise NotImplementedError

    assert "not attempted" in ch01.check_offset_head(stub, verbose=False).message
    crash = ch01.check_offset_head(lambda d_content, step_angle, offset: 1 / 0, verbose=False)
    assert not crash and "ZeroDivisionError" in crash.message


def test_offset_head_cases_see_every_angle_once_and_cover_the_offsets():
    """θ·(seq_len - 1) <= 180°, so cos((j - target)θ) has its maximum only at the target; the
    offsets include 0 and both signs; a small θ where λ = 30 falls short."""
    cases = ch01._offset_head_cases()
    offsets = {case["offset"] for case in cases}
    assert {-2, -1, 0, 1, 2, 3} <= offsets
    for case in cases:
        seq_len = case["content"].shape[0]
        assert case["step_angle"] * (seq_len - 1) <= math.pi + 1e-9
    assert min(case["step_angle"] for case in cases) <= math.radians(2)
    assert sum(case["step_angle"] <= math.radians(10) for case in cases) >= 3  # fine steps
    assert max(case["content"].abs().max().item() for case in cases) > 5  # large words


def test_offset_head_weights_match_the_chapter_layout():
    """The check's inputs are laid out as section 1.6 lays them out: the word, then the angle."""
    content = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    step_angle = math.pi / 6
    query_weight, key_weight = ch01.reference_offset_head(
        d_content=4, step_angle=step_angle, offset=-1
    )
    weights = ch01.offset_head_weights(query_weight, key_weight, content, step_angle)
    assert torch.equal(weights[1:].argmax(dim=-1), torch.arange(6))  # the previous token
    positions = ch01.angle_positions(7, step_angle)  # positions 1..7, as in section 1.6
    assert torch.allclose(positions[2], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-12)


# --------------------------------------------------------------------------------------------
# additive_scores: loops the first call budget let through, and scores built in Python
# --------------------------------------------------------------------------------------------


def additive_loop_over_keys_unbind(x_q, x_k, w_q, w_k, w_a):  # one key at a time, few calls each
    hq = x_q @ w_q  # (..., q_len, d_a)
    columns = [torch.tanh(hq + hk_j[..., None, :]) @ w_a for hk_j in (x_k @ w_k).unbind(-2)]
    return torch.stack(columns, dim=-1)  # (..., q_len, k_len)


def additive_loop_over_hidden_units_unbind(x_q, x_k, w_q, w_k, w_a):  # Python floats for w_a
    hq, hk = (
        (x_q @ w_q).unsqueeze(-2),
        (x_k @ w_k).unsqueeze(-3),
    )  # (..., q_len, 1, d_a), (..., 1, k_len, d_a)
    total = 0.0
    for hq_c, hk_c, w_c in zip(hq.unbind(-1), hk.unbind(-1), w_a.tolist()):
        total = total + torch.tanh(hq_c + hk_c) * w_c
    return total  # (..., q_len, k_len)


def additive_python_floats(x_q, x_k, w_q, w_k, w_a):  # every pair in pure Python, after .tolist()
    import math as _math

    hq, hk, wa = (x_q @ w_q).tolist(), (x_k @ w_k).tolist(), w_a.tolist()

    def table(rows_q, rows_k):
        if isinstance(rows_q[0][0], list):  # a leading batch dimension
            return [table(a, b) for a, b in zip(rows_q, rows_k)]
        return [
            [sum(_math.tanh(x + y) * w for x, y, w in zip(row_q, row_k, wa)) for row_k in rows_k]
            for row_q in rows_q
        ]

    return torch.tensor(table(hq, hk))


@pytest.mark.parametrize(
    "loop", [additive_loop_over_keys_unbind, additive_loop_over_hidden_units_unbind]
)
def test_additive_scores_rejects_unbind_loops_on_the_wide_case(loop):
    """A loop over keys or hidden units with unbind makes about three calls a turn: under the
    budget on 10 keys and 3 hidden units, over it on the case with 64 keys and 32 units."""
    cases = ch01._additive_cases()
    wide = next(case for case in cases if case["x_k"].shape[-2] == 64)  # 64 keys, 32 units
    assert wide["x_k"].shape[-2] == 64 and wide["w_a"].shape[0] == 32, wide["x_k"].shape
    for case in cases:  # the numbers are right
        torch.testing.assert_close(loop(**case), ch01.reference_additive_scores(**case))
    result = ch01.check_additive_scores(loop, verbose=False)
    assert not result
    # w_a.tolist() also cuts w_a out of autograd: that is reported first, on the first case
    assert "PythonLoopSuspected" in result.message or "ComputedOutsidePyTorch" in result.message
    with ch01._TorchCallCounter() as counter:  # on the wide case alone: far over the budget
        loop(**wide)
    assert counter.calls >= 96 > ch01.ADDITIVE_MAX_TORCH_CALLS, counter.calls


def test_additive_scores_rejects_scores_computed_from_python_floats():
    case = ch01._additive_cases()[0]
    torch.testing.assert_close(
        additive_python_floats(**case), ch01.reference_additive_scores(**case)
    )
    result = ch01.check_additive_scores(additive_python_floats, verbose=False)
    assert not result
    assert "ComputedOutsidePyTorch" in result.message and ".tolist()" in result.message

    def detached(x_q, x_k, w_q, w_k, w_a):
        return additive_correct(x_q, x_k, w_q, w_k, w_a).detach()

    assert not ch01.check_additive_scores(detached, verbose=False)


def test_additive_scores_allows_in_place_operations_on_its_inputs():
    def in_place(x_q, x_k, w_q, w_k, w_a):
        x_q.mul_(1.0)
        return additive_correct(x_q, x_k, w_q, w_k, w_a)

    assert ch01.check_additive_scores(in_place, verbose=False)


def test_equivariance_unshuffled_comparison_is_told_to_compare_with_the_shuffled_output():
    """Comparing layer(x[perm]) with layer(x) (or with the inverse reordering) rejects
    self-attention: the message must point at the comparison, not at the tolerance."""
    for wrong in (equivariance_test_output_not_permuted, equivariance_test_inverse):
        result = ch01.check_is_permutation_equivariant(wrong, verbose=False)
        assert not result
        message = result.message
        assert "IS permutation-equivariant" in message, message
        assert "even rejects the identity layer" in message, message
        assert "layer(x)[perm]" in message and "the comparison is" in message, message
        assert "atol=1e-5" not in message, message
    # a test that compares correctly but too strictly still gets the tolerance hint
    result = ch01.check_is_permutation_equivariant(equivariance_test_exact, verbose=False)
    assert "identity" not in result.message and "atol=1e-5" in result.message, result.message


def _equivariant_under(perms_of):
    """A test that tries only the permutations ``perms_of(seq_len)``."""

    def test(layer, x):
        out = layer(x)
        return all(
            torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms_of(x.shape[0])
        )

    return test


def _swap(n, i, j):
    perm = torch.arange(n)
    perm[[i, j]] = perm[[j, i]]
    return perm


@pytest.mark.parametrize(
    "perms_of",
    [
        lambda n: [torch.arange(n - 1, -1, -1), _swap(n, 0, 1)],  # reversal + first swap
        lambda n: [_swap(n, 0, n - 1), _swap(n, 0, 1)],  # swap the ends + first swap
    ],
    ids=["reversal and swap(0, 1)", "swap of the ends and swap(0, 1)"],
)
def test_equivariance_check_rejects_two_permutations_that_do_not_generate_all(perms_of):
    layer = ch01.equivariance_test_layers()["attention with codes on the middle positions only"]
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    assert not ch01.reference_is_permutation_equivariant(layer, x), "the reference sees it"
    assert not ch01.check_is_permutation_equivariant(_equivariant_under(perms_of), verbose=False)


# --------------------------------------------------------------------------------------------
# is_permutation_equivariant: a few random draws, adjacent swaps, the one-token layers
# --------------------------------------------------------------------------------------------


def _k_random_draws(k):
    """A weak test: k unseeded random permutations (the global generator)."""

    def test(layer, x):
        out = layer(x)
        perms = [torch.randperm(x.shape[0]) for _ in range(k)]
        return all(torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms)

    return test


@pytest.mark.parametrize(("k", "most_accepted"), [(2, 0), (3, 0), (5, 4)])
def test_equivariance_few_random_draws_are_rejected_for_most_seeds(k, most_accepted, monkeypatch):
    """Over 100 two-token cases each miss k draws with probability 2^-k: k = 5 catches all of
    them, and can pass, about 5% of the time, under 20 fixed seeds at most a few times. The
    check seeds the global generator itself, so the seed varied is the check's."""
    accepted = []
    for seed in range(20):
        monkeypatch.setattr(ch01, "EQUIVARIANCE_GLOBAL_SEEDS", (seed,))
        if ch01.check_is_permutation_equivariant(_k_random_draws(k), verbose=False):
            accepted.append(seed)
    assert len(accepted) <= most_accepted, f"k = {k}: accepted under seeds {accepted}"


@pytest.mark.parametrize("k", [7, 10])
def test_equivariance_seed_luck_is_rejected(k, monkeypatch):
    """k unseeded draws pass the check's first seed alone (review s9rvF01: 7 draws were accepted
    at seed 0 but rejected under 24 of 40 other seeds); the check runs every seed of
    EQUIVARIANCE_GLOBAL_SEEDS and rejects them, saying the verdict depends on the draws."""
    with monkeypatch.context() as patch:
        patch.setattr(ch01, "EQUIVARIANCE_GLOBAL_SEEDS", ch01.EQUIVARIANCE_GLOBAL_SEEDS[:1])
        assert ch01.check_is_permutation_equivariant(_k_random_draws(k), verbose=False), (
            f"k = {k} should pass at the first seed alone, or this test proves nothing"
        )
    result = ch01.check_is_permutation_equivariant(_k_random_draws(k), verbose=False)
    assert not result, f"k = {k}: accepted under all seeds {ch01.EQUIVARIANCE_GLOBAL_SEEDS}"
    assert "depends on its random draws" in result.message, result.message
    assert len(ch01.EQUIVARIANCE_GLOBAL_SEEDS) >= 5, ch01.EQUIVARIANCE_GLOBAL_SEEDS


def test_equivariance_swap_of_the_ends_and_twenty_global_draws_are_accepted():
    """The exercise's solution with its draws from the global generator instead: right under
    every seed (a two-token case is missed with probability 2^-20 per seed)."""

    def test(layer, x):
        swap = torch.arange(x.shape[0])
        swap[[0, -1]] = swap[[-1, 0]]
        out = layer(x)
        perms = [swap] + [torch.randperm(x.shape[0]) for _ in range(20)]
        return all(torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms)

    result = ch01.check_is_permutation_equivariant(test, verbose=False)
    assert result, result.message
    assert f"each of {len(ch01.EQUIVARIANCE_GLOBAL_SEEDS)} seeds" in result.message, result.message


def test_equivariance_all_adjacent_swaps_are_rejected():
    """Adjacent swaps generate every reordering, but a test checks them at one input only
    (review s10rv01b): the largest-first layer commutes with each of them at its case."""
    adjacent = _equivariant_under(lambda n: [_swap(n, i, i + 1) for i in range(n - 1)])
    result = ch01.check_is_permutation_equivariant(adjacent, verbose=False)
    assert not result
    assert "do not compose" in result.message, result.message


def test_equivariance_one_token_layer_breaks_only_when_its_token_moves():
    layer = ch01._one_token_layer(1)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
    out = layer(x)
    keeps = torch.tensor([2, 1, 0, 3])  # token 1 stays at row 1
    assert torch.allclose(layer(x[keeps]), out[keeps], atol=1e-5)
    moves = _swap(4, 1, 3)
    assert not torch.allclose(layer(x[moves]), out[moves], atol=1e-2)


# --------------------------------------------------------------------------------------------
# shape errors in the reader's function come back with a one-line hint
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
@pytest.mark.parametrize(
    ("check", "wrong", "received", "returns"),
    [
        # ex 2: k.T reverses every dimension of a batched tensor
        (
            ch01.check_relevance_scores,
            lambda q, k: q @ k.T,
            "q (2, 4, 3), k (2, 5, 3)",
            "(..., q_len, k_len)",
        ),
        # ex 2: no transpose; the first case is not square, so the product cannot run
        (
            ch01.check_relevance_scores,
            lambda q, k: q @ k,
            "q (4, 3), k (6, 3)",
            "(..., q_len, k_len)",
        ),
        # ex 2: permute(0, 2, 1) fits only three dimensions
        (
            ch01.check_relevance_scores,
            lambda q, k: q @ k.permute(0, 2, 1),
            "q (4, 3), k (6, 3)",
            "(..., q_len, k_len)",
        ),
        # ex 1: softmax over the first axis with a sum that drops the batch dimension
        (
            ch01.check_row_softmax,
            lambda scores: scores.exp() / scores.exp().sum(dim=-1),
            "scores (",
            "(..., k_len)",
        ),
        # ex 5: no new axes; query and key lengths differ in the first case
        (ch01.check_additive_scores, additive_no_broadcast, "x_q (", "(..., q_len, k_len)"),
    ],
)
def test_shape_errors_get_a_hint_naming_the_shapes(check, wrong, received, returns):
    result = check(wrong, verbose=False)
    assert not result, "a shape error must fail the check"
    assert "ShapeMismatch" in result.message, result.message
    assert received in result.message and returns in result.message, result.message


def test_the_shape_hint_drops_pytorchs_layout_tag():
    """PyTorch names permute's error "permute(sparse_coo)"; the hint shows plain "permute"."""
    result = ch01.check_relevance_scores(lambda q, k: q @ k.permute(0, 2, 1), verbose=False)
    assert not result and "permute: number of dimensions" in result.message, result.message
    assert "sparse" not in result.message, result.message


def test_the_checks_own_errors_are_not_turned_into_shape_hints():
    """A forbidden built-in softmax is still reported by name, not as a shape problem."""
    result = ch01.check_row_softmax(lambda scores: torch.softmax(scores, dim=-1), verbose=False)
    assert not result and "ShapeMismatch" not in result.message, result.message


def test_a_refused_call_keeps_its_own_class_and_message():
    """Exercise 5's refusal of companion.attention is reported as a refused call (its own
    RuntimeError subclass), never relabelled as a shape problem."""
    from companion.exercises._checker import CallRefused

    assert issubclass(CallRefused, RuntimeError), (
        "older `except RuntimeError` clauses still catch it"
    )
    result = ch01.check_additive_scores(additive_through_the_package, verbose=False)
    assert not result, "the package's forward must be refused"
    assert "CallRefused" in result.message and "ShapeMismatch" not in result.message, result.message
    assert "check which dimensions each product pairs" not in result.message, result.message


def test_the_softmax_shape_hint_speaks_of_reductions_not_products():
    result = ch01.check_row_softmax(
        lambda scores: scores.exp() / scores.exp().sum(dim=-1), verbose=False
    )
    assert not result and "ShapeMismatch" in result.message, result.message
    assert "keepdim" in result.message and "product" not in result.message, result.message
    relevance = ch01.check_relevance_scores(lambda q, k: q @ k, verbose=False)
    assert "each product pairs" in relevance.message, relevance.message


def equivariance_test_swap_ends(layer, x):  # one transposition: the first and last tokens
    perm = torch.arange(x.shape[0])
    perm[[0, -1]] = perm[[-1, 0]]
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


@pytest.mark.parametrize(
    "swap_only", [equivariance_test_swap_first_two, equivariance_test_swap_ends]
)
def test_equivariance_test_that_swaps_is_not_told_to_try_a_swap(swap_only):
    result = ch01.check_is_permutation_equivariant(swap_only, verbose=False)
    assert not result
    assert "just two tokens" in result.message, result.message
    assert "torch.randperm" in result.message, result.message
    assert "the swap of two tokens" not in result.message, result.message


def test_equivariance_random_swaps_only_are_told_to_draw_whole_permutations():
    """A test that draws 20 random swaps of two tokens (never a bigger reordering) misses the
    three-token layer that ignores every swap at its input: the message says its reorderings were
    all swaps and that a reordering of three or more tokens changes the outputs, not to draw
    'more' of the same kind."""

    def random_swaps(layer, x):
        n = x.shape[0]
        out = layer(x)
        perms = []
        for _ in range(20):
            i, j = torch.randperm(n)[:2].tolist()
            perms.append(_swap(n, i, j))
        return all(torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms)

    result = ch01.check_is_permutation_equivariant(random_swaps, verbose=False)
    assert not result
    message = result.message
    assert "each of them swaps just two tokens" in message, message
    assert "no swap of two tokens changes the outputs" in message, message
    assert "torch.randperm" in message and "already swaps" not in message, message


def test_equivariance_test_that_reorders_only_the_first_rows_is_rejected():
    """A test that shuffles only the first min(n, d) rows never moves a late token: the check's
    seven-token layer that breaks only when the last token moves catches it, and the message
    names the token it never moved."""

    def prefix_only(layer, x):
        n = x.shape[0]
        out = layer(x)
        m = min(n, x.shape[1])
        perms = []
        for _ in range(20):
            p = torch.arange(n)
            p[:m] = torch.randperm(m)
            perms.append(p)
        return all(torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms)

    result = ch01.check_is_permutation_equivariant(prefix_only, verbose=False)
    assert not result
    message = result.message
    assert "the last output row" in message and "(7 tokens)" in message, message
    assert "None of them moves tokens 4, 5, 6 (counting from 0)" in message, message
    assert "torch.randperm(x.shape[0])" in message, message
    layer = ch01._one_token_layer(-1)
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    assert ch01.equivariance_gap(layer, x) > 0.1
    moved_last = torch.tensor([6, 1, 2, 3, 4, 5, 0])
    assert not torch.allclose(layer(x[moved_last]), layer(x)[moved_last], atol=1e-5)
    kept_last = torch.tensor([1, 0, 3, 2, 5, 4, 6])
    assert torch.allclose(layer(x[kept_last]), layer(x)[kept_last], atol=1e-5)


def test_equivariance_test_without_a_swap_is_told_to_try_one():
    result = ch01.check_is_permutation_equivariant(equivariance_test_reversal_only, verbose=False)
    assert not result
    assert "the swap of two tokens" in result.message, result.message


# --------------------------------------------------------------------------------------------
# is_permutation_equivariant: the message says what the test's own reorderings missed
# --------------------------------------------------------------------------------------------


def _three_cycle(n):
    """An even reordering of n >= 3 tokens: the first three turn by one place."""
    perm = torch.arange(n)
    perm[:3] = torch.roll(perm[:3], 1)
    return perm


def test_equivariance_identity_only_on_two_tokens_is_told_so():
    """A test whose reorderings of a two-token case are all the identity (what k random draws
    do with probability 2^-k) is told exactly that, not to try a swap it may already try."""
    test = _equivariant_under(
        lambda n: [torch.arange(n)] if n == 2 else [_swap(n, i, i + 1) for i in range(n - 1)]
    )
    result = ch01.check_is_permutation_equivariant(test, verbose=False)
    assert not result and "(2 tokens)" in result.message, result.message
    assert "all your permutations were the identity" in result.message, result.message
    assert "2 tokens is the identity half the time" in result.message, result.message
    assert "moves something" in result.message, result.message
    assert "already swaps" not in result.message, result.message


def test_equivariance_random_draws_that_miss_are_told_why():
    """Whichever case a test of k unseeded draws misses, the message names what its own draws
    did there: all the identity, or none of them changed that layer (the parity layer: all
    even). A random-only test is never told it 'already swaps two tokens' on an even miss."""
    failed = 0
    for k in range(1, 9):
        result = ch01.check_is_permutation_equivariant(_k_random_draws(k), verbose=False)
        if result:
            continue
        failed += 1
        message = result.message
        if "(2 tokens)" in message:
            assert "2 tokens is the identity half the time" in message, (k, message)
        else:
            assert "were the identity" in message or "outputs" in message, (k, message)
        if "all of them even" in message:
            assert "already swaps" not in message, (k, message)
    assert failed >= 4, f"expected most of k = 1..8 to fail, {failed} did"


def test_equivariance_even_reorderings_only_are_told_so():
    test = _equivariant_under(lambda n: [_three_cycle(n)] if n > 2 else [_swap(2, 0, 1)])
    result = ch01.check_is_permutation_equivariant(test, verbose=False)
    assert not result
    assert "does not change this layer's outputs (an even one)" in result.message, result.message
    assert "already swaps" not in result.message, result.message


def test_equivariance_any_instead_of_all_is_told_so():
    """A test that returns True when one comparison holds (any, not all) sees a reordering that
    changes the outputs and still accepts: the message says so."""

    def any_test(layer, x):
        out = layer(x)
        perms = [_swap(x.shape[0], 0, x.shape[0] - 1), torch.arange(x.shape[0])]
        return any(torch.allclose(layer(x[p]), out[p], atol=1e-5) for p in perms)

    result = ch01.check_is_permutation_equivariant(any_test, verbose=False)
    assert not result and "yet it returned True" in result.message, result.message
    assert "all, not any" in result.message, result.message


def _equivariance_test_with_atol(atol):
    def test(layer, x):
        n = x.shape[0]
        out = layer(x)
        swap = torch.arange(n)
        swap[[0, -1]] = swap[[-1, 0]]
        perms = [swap] + [torch.randperm(n) for _ in range(20)]  # fresh draws: no fixed list
        return all(torch.allclose(layer(x[p]), out[p], atol=atol) for p in perms)

    return test


def _equivariance_test_with_tolerance(atol, rtol, draws=20, spent=0):
    """The solution's form (the swap of the ends, then fresh draws) with another tolerance;
    `spent` randperm calls first move every later draw."""

    def test(layer, x):
        for _ in range(spent):
            torch.randperm(5)
        n = x.shape[0]
        out = layer(x)
        perms = [_swap(n, 0, n - 1)] + [torch.randperm(n) for _ in range(draws)]
        return all(torch.allclose(layer(x[p]), out[p], atol=atol, rtol=rtol) for p in perms)

    return test


@pytest.mark.parametrize(
    ("atol", "rtol", "draws", "spent"),
    [
        (2e-4, 0.0, 20, 0),
        (1e-4, 0.0, 20, 0),
        (1e-4, 0.0, 100, 3),
        (1e-4, 1e-4, 20, 0),
        (1e-4, 1e-4, 100, 0),
        (1e-5, 1e-4, 20, 5),
        (1e-5, 1e-3, 20, 0),
        (1e-2, 1e-5, 20, 0),
    ],
)
def test_equivariance_tolerance_of_1e4_or_more_is_rejected_whatever_the_draws(
    atol, rtol, draws, spent
):
    """review s11rv01e (b)2: the rule is "catch a change of 1e-4 on outputs of size 1". The
    marked-signs layer changes an output of size 1 by just under 1e-4 under EVERY reordering that
    moves a token, so a tolerance of 1e-4 or more there (atol + rtol >= 1e-4) is rejected on it
    whatever the number or order of the draws, with the tolerance advice."""
    result = ch01.check_is_permutation_equivariant(
        _equivariance_test_with_tolerance(atol, rtol, draws, spent), verbose=False
    )
    assert not result
    message = result.message
    assert f"your test accepted NamedLayer({ch01._MARKED_SIGNS_NAME!r})" in message, message
    assert "stricter tolerance" in message and "1e-4 on outputs of size 1" in message, message


@pytest.mark.parametrize(
    ("atol", "rtol", "draws", "spent"),
    [(1e-5, 1e-5, 20, 0), (1e-5, 1e-5, 20, 7), (5e-5, 0.0, 20, 0), (1e-5, 0.0, 30, 2)],
)
def test_equivariance_tolerance_under_1e4_passes(atol, rtol, draws, spent):
    """A tolerance between float32 rounding (under 1e-5) and 1e-4 at outputs of size 1 passes."""
    assert ch01.check_is_permutation_equivariant(
        _equivariance_test_with_tolerance(atol, rtol, draws, spent), verbose=False
    )


def test_equivariance_marked_signs_change_is_the_same_under_every_reordering():
    """Every non-identity reordering of the check's marked-signs case changes an output of size 1
    by the same amount, just under EQUIVARIANCE_SMALLEST_CHANGE (exact in float32)."""
    (case,) = [c for c in ch01._equivariance_cases() if c["layer"].name == ch01._MARKED_SIGNS_NAME]
    layer, x = case["layer"], case["x"]
    out = layer(x)
    assert torch.equal(out.abs().max(), torch.tensor(1.0))
    identity = tuple(range(x.shape[0]))
    for perm in itertools.permutations(identity):
        change = (layer(x[list(perm)]) - out[list(perm)]).abs().max().item()
        if perm == identity:
            assert change == 0.0
        else:
            assert change == ch01._MARK < ch01.EQUIVARIANCE_SMALLEST_CHANGE, (perm, change)
    assert ch01.EQUIVARIANCE_SMALLEST_CHANGE - ch01._MARK < 1e-7


def equivariance_test_wrong_axis(layer, x):  # a permutation of the features used on the tokens
    perm = torch.randperm(x.shape[-1], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


@pytest.mark.parametrize("wrong", [equivariance_test_features, equivariance_test_wrong_axis])
def test_equivariance_wrong_axis_is_told_so_not_to_loosen_the_tolerance(wrong):
    """A test that reorders the features (or uses a permutation of the wrong length) already
    has atol=1e-5: the message must say its inputs are not x with its rows reordered."""
    result = ch01.check_is_permutation_equivariant(wrong, verbose=False)
    assert not result
    message = result.message
    assert "not x with its rows (tokens) reordered" in message, message
    assert "atol=1e-5" not in message and "rounding" not in message, message


def test_equivariance_check_inputs_are_the_checks_cases():
    """The public (layer, x) pairs chapter 1 measures its hint's sizes on are the check's own."""
    pairs = ch01.equivariance_check_inputs()
    cases = ch01._equivariance_cases()
    assert len(pairs) == len(cases) > 20
    for (layer, x), case in zip(pairs, cases, strict=True):
        assert layer.name == case["layer"].name and torch.equal(x, case["x"])
        assert x.ndim == 2 and x.shape[1] == 4


def equivariance_test_swap_ends_and_draws(count):  # the solution's form with `count` draws
    def test(layer, x):
        swap = torch.arange(x.shape[0])
        swap[[0, -1]] = swap[[-1, 0]]
        perms = [swap] + [torch.randperm(x.shape[0]) for _ in range(count)]
        return all(torch.allclose(layer(x[p]), layer(x)[p], atol=1e-5, rtol=1e-5) for p in perms)

    return test


def test_equivariance_swap_and_ten_draws_is_rejected_and_twenty_pass():
    """Chapter 1's solution: with the swap of the ends, 10 draws still fail (on the 4-token layer
    that reacts when token 0 is the largest, caught by one reordering in 4), 20 pass."""
    result = ch01.check_is_permutation_equivariant(
        equivariance_test_swap_ends_and_draws(10), verbose=False
    )
    assert not result, "swap + 10 draws should be rejected"
    assert "token 0 is the largest" in result.message, result.message
    assert "already swaps two tokens" in result.message, result.message
    assert ch01.check_is_permutation_equivariant(
        equivariance_test_swap_ends_and_draws(20), verbose=False
    ), "swap + 20 draws should pass"


def test_equivariance_any_that_stops_at_the_first_passing_comparison_is_told_so():
    """review s11rv01c: a test written with any() that tries the swap of the ends first stops
    there when the swap does not change the outputs, so the failing case alone shows one swap
    tried. The check probes the test and names the slip (all, not any), not the swap."""

    def any_test(layer, x):
        n = x.shape[0]
        out = layer(x)
        perms = [_swap(n, 0, n - 1)] + [torch.randperm(n) for _ in range(20)]
        return any(torch.allclose(layer(x[p]), out[p], atol=1e-5, rtol=1e-5) for p in perms)

    result = ch01.check_is_permutation_equivariant(any_test, verbose=False)
    assert not result
    assert "all, not any" in result.message, result.message
    assert "not only swaps" not in result.message, result.message


def test_equivariance_loose_tolerance_gets_one_piece_of_advice():
    """review s11rv01c: a loose tolerance whose verdict depends on the draws (right at seed 0,
    wrong at a later seed) is told to tighten the tolerance, not to try more reorderings."""

    def loose(layer, x):
        n = x.shape[0]
        out = layer(x)
        perms = [_swap(n, 0, n - 1)] + [torch.randperm(n) for _ in range(20)]
        return all(torch.allclose(layer(x[p]), out[p], atol=1e-4, rtol=1e-4) for p in perms)

    result = ch01.check_is_permutation_equivariant(loose, verbose=False)
    assert not result
    assert "stricter tolerance" in result.message, result.message
    assert "try more reorderings" not in result.message, result.message


def test_row_softmax_rejects_an_answer_that_leaves_pytorch():
    """SciPy's softmax through NumPy gives the right numbers but no gradient: rejected, named."""
    import scipy.special

    def via_scipy(scores):
        weights = scipy.special.softmax(scores.detach().numpy(), axis=-1)
        return torch.from_numpy(weights).to(scores.dtype)

    result = ch01.check_row_softmax(via_scipy, verbose=False)
    assert not result and "carry no gradient" in result.message, result.message
