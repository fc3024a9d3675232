"""Chapter 5 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import pytest
import torch

from companion import masking
from companion.exercises import ch05

# --------------------------------------------------------------------------------------------
# padding_mask
# --------------------------------------------------------------------------------------------


def padding_correct(tokens, pad_id):
    return (tokens != pad_id).unsqueeze(1).unsqueeze(2)


def padding_inverted(tokens, pad_id):  # True = padding: PyTorch's key_padding_mask convention
    return (tokens == pad_id)[:, None, None, :]


def padding_flat(tokens, pad_id):  # (batch, k_len): does not broadcast over heads and queries
    return tokens != pad_id


def padding_over_queries(tokens, pad_id):  # (batch, 1, k_len, 1): masks queries, not keys
    return (tokens != pad_id)[:, None, :, None]


def padding_hard_coded_zero(tokens, pad_id):
    return (tokens != 0)[:, None, None, :]


def padding_as_integers(tokens, pad_id):  # 0/1 instead of False/True
    return (tokens != pad_id).long()[:, None, None, :]


def test_padding_mask_accepts_correct_and_companion():
    assert ch05.check_padding_mask(padding_correct, verbose=False)
    assert ch05.check_padding_mask(masking.padding_mask, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        padding_inverted,
        padding_flat,
        padding_over_queries,
        padding_hard_coded_zero,
        padding_as_integers,
    ],
)
def test_padding_mask_rejects_wrong(wrong):
    assert not ch05.check_padding_mask(wrong, verbose=False)


def test_padding_mask_explains_a_wrong_dtype():
    result = ch05.check_padding_mask(padding_as_integers, verbose=False)
    assert "boolean" in result.message and "torch.int64" in result.message


def test_padding_cases_cover_other_pad_ids_and_all_padding_rows():
    cases = ch05._padding_cases()
    assert any(c["pad_id"] != 0 for c in cases)
    assert any(bool((c["tokens"] == c["pad_id"]).all(dim=1).any()) for c in cases)
    assert any(not bool((c["tokens"] == c["pad_id"]).any()) for c in cases)
    assert all(c["tokens"].shape[0] != c["tokens"].shape[1] for c in cases)


# --------------------------------------------------------------------------------------------
# causal_mask
# --------------------------------------------------------------------------------------------


def causal_correct(q_len, k_len):
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len)


def causal_sees_next_token(q_len, k_len):  # off by one: the diagonal is one too high
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len + 1)


def causal_misses_itself(q_len, k_len):  # off by one the other way: cannot see itself
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len - 1)


def causal_top_left(q_len, k_len):  # right only when q_len == k_len
    return torch.ones(q_len, k_len, dtype=torch.bool).tril()


def causal_inverted(q_len, k_len):  # True = blocked (nn.Transformer's convention)
    return ~causal_correct(q_len, k_len)


def causal_transposed(q_len, k_len):  # upper triangle: every query sees the future only
    return torch.ones(q_len, k_len, dtype=torch.bool).triu(diagonal=k_len - q_len)


def causal_float(q_len, k_len):
    return causal_correct(q_len, k_len).float()


def test_causal_mask_accepts_correct_and_companion():
    assert ch05.check_causal_mask(causal_correct, verbose=False)
    assert ch05.check_causal_mask(masking.causal_mask, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        causal_sees_next_token,
        causal_misses_itself,
        causal_top_left,
        causal_inverted,
        causal_transposed,
        causal_float,
    ],
)
def test_causal_mask_rejects_wrong(wrong):
    assert not ch05.check_causal_mask(wrong, verbose=False)


def test_top_left_alignment_passes_the_square_cases_first():
    """Only a case with more keys than queries catches the top-left alignment."""
    result = ch05.check_causal_mask(causal_top_left, verbose=False)
    assert not result
    assert result.cases_run > 3


# --------------------------------------------------------------------------------------------
# decoder_mask
# --------------------------------------------------------------------------------------------


def decoder_correct(tgt, pad_id):
    return masking.combine_masks(
        masking.padding_mask(tgt, pad_id), masking.causal_mask(tgt.shape[1])
    )


def decoder_no_head_axis(tgt, pad_id):  # (batch, tgt_len, tgt_len): broadcasts wrongly
    return decoder_correct(tgt, pad_id)[:, 0]


def decoder_causal_only(tgt, pad_id):
    n = tgt.shape[1]
    return torch.ones(n, n, dtype=torch.bool).tril().expand(tgt.shape[0], 1, n, n)


def decoder_padding_only(tgt, pad_id):
    n = tgt.shape[1]
    return masking.padding_mask(tgt, pad_id).expand(tgt.shape[0], 1, n, n)


def decoder_or(tgt, pad_id):  # | instead of &: allowed if *either* mask allows
    n = tgt.shape[1]
    return masking.padding_mask(tgt, pad_id) | torch.ones(n, n, dtype=torch.bool).tril()


def decoder_inverted(tgt, pad_id):
    return ~decoder_correct(tgt, pad_id)


def decoder_off_by_one(tgt, pad_id):
    n = tgt.shape[1]
    return masking.padding_mask(tgt, pad_id) & torch.ones(n, n, dtype=torch.bool).tril(1)


def decoder_padding_on_queries(tgt, pad_id):  # pads the query axis instead of the key axis
    n = tgt.shape[1]
    return (tgt != pad_id)[:, None, :, None] & torch.ones(n, n, dtype=torch.bool).tril()


def test_decoder_mask_accepts_correct():
    assert ch05.check_decoder_mask(decoder_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        decoder_no_head_axis,
        decoder_causal_only,
        decoder_padding_only,
        decoder_or,
        decoder_inverted,
        decoder_off_by_one,
        decoder_padding_on_queries,
    ],
)
def test_decoder_mask_rejects_wrong(wrong):
    assert not ch05.check_decoder_mask(wrong, verbose=False)


def test_decoder_mask_reports_the_missing_head_axis():
    result = ch05.check_decoder_mask(decoder_no_head_axis, verbose=False)
    assert "wrong shape" in result.message


# --------------------------------------------------------------------------------------------
# additive_from_blocked
# --------------------------------------------------------------------------------------------


def additive_correct(blocked, dtype):
    return torch.where(blocked, float("-inf"), 0.0).to(dtype)


def additive_via_companion(blocked, dtype):
    return masking.to_additive_mask(~blocked, dtype)


def additive_inverted(blocked, dtype):  # -inf where attention is allowed
    return torch.where(blocked, 0.0, float("-inf")).to(dtype)


def additive_minus_1e9(blocked, dtype):  # finite in float32, so not PyTorch's -inf
    return torch.where(blocked, -1e9, 0.0).to(dtype)


def additive_ones_and_zeros(blocked, dtype):
    return blocked.to(dtype)


def additive_ignores_dtype(blocked, dtype):
    return torch.where(blocked, float("-inf"), 0.0)  # always float32


def additive_returns_bool(blocked, dtype):
    return ~blocked


def test_additive_from_blocked_accepts_correct():
    assert ch05.check_additive_from_blocked(additive_correct, verbose=False)
    assert ch05.check_additive_from_blocked(additive_via_companion, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        additive_inverted,
        additive_minus_1e9,
        additive_ones_and_zeros,
        additive_ignores_dtype,
        additive_returns_bool,
    ],
)
def test_additive_from_blocked_rejects_wrong(wrong):
    assert not ch05.check_additive_from_blocked(wrong, verbose=False)


def test_additive_from_blocked_explains_a_wrong_dtype():
    result = ch05.check_additive_from_blocked(additive_ignores_dtype, verbose=False)
    assert "requested dtype" in result.message


def test_additive_reference_round_trips_through_companion():
    blocked = torch.rand(3, 5, generator=torch.Generator().manual_seed(0)) < 0.5
    additive = ch05.reference_additive_from_blocked(blocked, torch.float32)
    assert torch.equal(masking.from_additive_mask(additive), ~blocked)


# --------------------------------------------------------------------------------------------
# future_leaks
# --------------------------------------------------------------------------------------------


def leaks_correct(attend, x):
    before = attend(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        if not torch.allclose(attend(changed)[:, : t + 1], before[:, : t + 1], atol=1e-5):
            return True
    return False


def leaks_by_gradient(attend, x):
    """A different correct method: the Jacobian of the past outputs w.r.t. future inputs."""
    for t in range(x.shape[1] - 1):
        x_grad = x.clone().requires_grad_()
        attend(x_grad)[:, t].sum().backward()
        if bool((x_grad.grad[:, t + 1 :].abs() > 1e-7).any()):
            return True
    return False


def leaks_last_token_only(attend, x):  # only perturbs the last position
    changed = x.clone()
    changed[:, -1] = torch.randn_like(changed[:, -1])
    return not torch.allclose(attend(changed)[:, :-1], attend(x)[:, :-1], atol=1e-5)


def leaks_whole_output(attend, x):  # compares the future outputs too: always "leaks"
    changed = x.clone()
    changed[:, 1:] = torch.randn_like(changed[:, 1:])
    return not torch.allclose(attend(changed), attend(x), atol=1e-5)


def leaks_constant_shift(attend, x):  # x + 1 is invisible after a layer norm
    before = attend(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1 :] += 1.0
        if not torch.allclose(attend(changed)[:, : t + 1], before[:, : t + 1], atol=1e-5):
            return True
    return False


def leaks_includes_current(attend, x):  # also changes position t itself: always "leaks"
    before = attend(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t:] = torch.randn_like(changed[:, t:])
        if not torch.allclose(attend(changed)[:, : t + 1], before[:, : t + 1], atol=1e-5):
            return True
    return False


def test_future_leaks_accepts_correct():
    torch.manual_seed(0)
    assert ch05.check_future_leaks(leaks_correct, verbose=False)
    assert ch05.check_future_leaks(leaks_by_gradient, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [leaks_last_token_only, leaks_whole_output, leaks_constant_shift, leaks_includes_current],
)
def test_future_leaks_rejects_wrong(wrong):
    torch.manual_seed(0)
    assert not ch05.check_future_leaks(wrong, verbose=False)


def test_future_leak_cases_have_both_answers():
    answers = [ch05.reference_future_leaks(**case) for case in ch05._future_leak_cases()]
    assert answers.count(True) >= 4 and answers.count(False) >= 4


def test_reference_leak_test_agrees_with_companion_attention():
    from companion.attention import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    assert not ch05.reference_future_leaks(lambda x: mha(x, x, x, is_causal=True)[0], x)
    assert ch05.reference_future_leaks(lambda x: mha(x, x, x)[0], x)


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, references, determinism
# --------------------------------------------------------------------------------------------


def test_references_agree_with_companion_masking():
    for case in ch05._padding_cases():
        assert torch.equal(ch05.reference_padding_mask(**case), masking.padding_mask(**case))
    for case in ch05._causal_cases():
        assert torch.equal(ch05.reference_causal_mask(**case), masking.causal_mask(**case))
    for case in ch05._decoder_cases():
        assert torch.equal(ch05.reference_decoder_mask(**case), decoder_correct(**case))


def test_cases_are_reproducible():
    first, second = ch05._padding_cases(), ch05._padding_cases()
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(first, second))
    first, second = ch05._future_leak_cases(), ch05._future_leak_cases()
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(first, second))
