"""Chapter 1 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import math

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


def test_row_softmax_accepts_correct_and_builtin():
    assert ch01.check_row_softmax(softmax_correct, verbose=False)
    assert ch01.check_row_softmax(lambda scores: torch.softmax(scores, dim=-1), verbose=False)


@pytest.mark.parametrize(
    "wrong", [softmax_wrong_axis, softmax_naive, softmax_global_max, softmax_global_sum]
)
def test_row_softmax_rejects_wrong(wrong):
    assert not ch01.check_row_softmax(wrong, verbose=False)


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
    ],
)
def test_relevance_scores_rejects_wrong(wrong):
    assert not ch01.check_relevance_scores(wrong, verbose=False)


def test_missing_transpose_fails_even_when_shapes_allow_it():
    """A square case with d_k == length makes ``q @ k`` run: it must still be rejected."""
    result = ch01.check_relevance_scores(lambda q, k: q @ k, verbose=False)
    assert not result
    assert "raised" in result.message or "differ" in result.message


# --------------------------------------------------------------------------------------------
# self_attention
# --------------------------------------------------------------------------------------------


def attention_correct(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ v, weights


def attention_via_companion(x, w_q, w_k, w_v):
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, scale=1.0)


def attention_wrong_axis(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-2)
    return weights @ v, weights


def attention_returns_scores(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.transpose(-2, -1)
    return torch.softmax(scores, dim=-1) @ v, scores


def attention_scaled(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


def attention_mixes_inputs(x, w_q, w_k, w_v):
    q, k = x @ w_q, x @ w_k
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ x, weights  # forgot the value projection


def attention_output_only(x, w_q, w_k, w_v):
    return attention_correct(x, w_q, w_k, w_v)[0]


def test_self_attention_accepts_correct():
    assert ch01.check_self_attention(attention_correct, verbose=False)
    assert ch01.check_self_attention(attention_via_companion, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        attention_wrong_axis,
        attention_returns_scores,
        attention_scaled,
        attention_mixes_inputs,
        attention_output_only,
    ],
)
def test_self_attention_rejects_wrong(wrong):
    assert not ch01.check_self_attention(wrong, verbose=False)


def test_reference_self_attention_matches_companion():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 4, generator=g)
    w_q, w_k, w_v = (torch.randn(4, 3, generator=g) for _ in range(3))
    out, weights = ch01.reference_self_attention(x, w_q, w_k, w_v)
    out_c, weights_c = scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, scale=1.0)
    torch.testing.assert_close(out, out_c)
    torch.testing.assert_close(weights, weights_c)


# --------------------------------------------------------------------------------------------
# additive_scores
# --------------------------------------------------------------------------------------------


def additive_correct(q, k, w_q, w_k, w):
    hidden = torch.tanh((q @ w_q)[..., :, None, :] + (k @ w_k)[..., None, :, :])
    return (hidden * w).sum(-1)


def additive_tanh_separately(q, k, w_q, w_k, w):
    hidden = torch.tanh(q @ w_q)[..., :, None, :] + torch.tanh(k @ w_k)[..., None, :, :]
    return hidden @ w


def additive_no_broadcast(q, k, w_q, w_k, w):
    return torch.tanh(q @ w_q + k @ w_k) @ w  # pairs q_i with k_i only


def additive_no_tanh(q, k, w_q, w_k, w):
    return ((q @ w_q)[..., :, None, :] + (k @ w_k)[..., None, :, :]) @ w


def additive_swapped(q, k, w_q, w_k, w):
    return additive_correct(q, k, w_q, w_k, w).transpose(-2, -1)


def test_additive_scores_accepts_correct():
    assert ch01.check_additive_scores(additive_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [additive_tanh_separately, additive_no_broadcast, additive_no_tanh, additive_swapped],
)
def test_additive_scores_rejects_wrong(wrong):
    assert not ch01.check_additive_scores(wrong, verbose=False)


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


def equivariance_test_correct(layer, x):
    n = x.shape[0]
    out = layer(x)
    for _ in range(10):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(_))
        if not torch.allclose(layer(x[perm]), out[perm], atol=1e-5):
            return False
    return True


def equivariance_test_all_permutations(layer, x):
    import itertools

    n = x.shape[0]
    out = layer(x)
    perms = itertools.islice(itertools.permutations(range(n)), 1, 200)
    return all(torch.allclose(layer(x[list(p)]), out[list(p)], atol=1e-5) for p in perms)


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


def equivariance_test_loose(layer, x):  # a tolerance of 0.1 hides small position codes
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[perm]), layer(x)[perm], atol=0.1)


def equivariance_test_features(layer, x):  # shuffles the features, not the tokens
    perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(0))
    return torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5)


def test_equivariance_test_accepts_correct():
    assert ch01.check_is_permutation_equivariant(equivariance_test_correct, verbose=False)
    assert ch01.check_is_permutation_equivariant(equivariance_test_all_permutations, verbose=False)
    assert ch01.check_is_permutation_equivariant(
        ch01.reference_is_permutation_equivariant, verbose=False
    )


@pytest.mark.parametrize(
    "wrong",
    [
        equivariance_test_exact,
        equivariance_test_output_not_permuted,
        equivariance_test_inverse,
        equivariance_test_reversal_only,
        equivariance_test_shifts_only,
        equivariance_test_loose,
        equivariance_test_features,
        lambda layer, x: True,  # a test that cannot fail
        lambda layer, x: False,
    ],
)
def test_equivariance_test_rejects_wrong(wrong):
    assert not ch01.check_is_permutation_equivariant(wrong, verbose=False)


def test_equivariance_layers_are_what_their_names_say():
    """Each layer of the check is (or is not) equivariant, and attention's reordered output
    differs in its last bits, so an exact comparison is not enough."""
    layers = ch01.equivariance_test_layers()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    equivariant = {"self-attention", "per-token linear layer", "attention plus the mean token"}
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
