"""Chapter 5 exercise checks: right answers pass, plausible wrong answers fail, stubs are
reported without raising."""

from __future__ import annotations

import pytest
import torch

from companion import interop, masking
from companion.exercises import ch05

# The answers below are written by hand: the checks refuse a call into companion.masking (the
# `*_via_companion` answers show that refusal), except exercise 3's, which allows the building
# blocks padding_mask, causal_mask and combine_masks and refuses prefix_lm_mask.


def _causal(n):  # (n, n): key j <= query i
    return torch.ones(n, n, dtype=torch.bool).tril()


def _keys_real(tokens, pad_id):  # (batch, 1, 1, n): True where the key is not padding
    return (tokens != pad_id)[:, None, None, :]


# --------------------------------------------------------------------------------------------
# lengths_padding_mask
# --------------------------------------------------------------------------------------------


def lengths_correct(lengths, k_len, left):
    positions = torch.arange(k_len)  # (k_len,)
    if left:
        real = positions[None, :] >= (k_len - lengths)[:, None]
    else:
        real = positions[None, :] < lengths[:, None]
    return real[:, None, None, :]


def lengths_via_companion(lengths, k_len, left):  # build the ids, then companion's padding_mask
    tokens = torch.ones(len(lengths), k_len, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        if left:
            tokens[row, : k_len - length] = 0
        else:
            tokens[row, length:] = 0
    return masking.padding_mask(tokens, 0)


def lengths_inverted(lengths, k_len, left):  # True = padding: PyTorch's key_padding_mask
    return ~lengths_correct(lengths, k_len, left)


def lengths_flat(lengths, k_len, left):  # (batch, k_len): does not broadcast over heads, queries
    return lengths_correct(lengths, k_len, left)[:, 0, 0, :]


def lengths_over_queries(lengths, k_len, left):  # (batch, 1, k_len, 1): masks queries
    return lengths_correct(lengths, k_len, left)[:, :, 0, :, None]


def lengths_ignores_left(lengths, k_len, left):  # always right padding
    return lengths_correct(lengths, k_len, False)


def lengths_left_mirrored_wrong(lengths, k_len, left):  # left: j < k_len - length (the pads)
    if not left:
        return lengths_correct(lengths, k_len, False)
    return (torch.arange(k_len)[None, :] < (k_len - lengths)[:, None])[:, None, None, :]


def lengths_off_by_one(lengths, k_len, left):  # j <= length: one pad too many is "real"
    if left:
        real = torch.arange(k_len)[None, :] >= (k_len - lengths - 1)[:, None]
    else:
        real = torch.arange(k_len)[None, :] <= lengths[:, None]
    return real[:, None, None, :]


def lengths_as_integers(lengths, k_len, left):  # 0/1 instead of False/True
    return lengths_correct(lengths, k_len, left).long()


def lengths_flipped(lengths, k_len, left):  # right padding, flipped for the left side
    real = torch.arange(k_len)[None, :] < lengths[:, None]  # (batch, k_len)
    return (real.flip(-1) if left else real)[:, None, None, :]


def test_lengths_padding_mask_accepts_correct():
    assert ch05.check_lengths_padding_mask(lengths_correct, verbose=False)
    assert ch05.check_lengths_padding_mask(lengths_flipped, verbose=False)


def test_lengths_padding_mask_refuses_companion_masking():
    result = ch05.check_lengths_padding_mask(lengths_via_companion, verbose=False)
    assert not result and "companion.masking" in result.message


@pytest.mark.parametrize(
    "wrong",
    [
        lengths_inverted,
        lengths_flat,
        lengths_over_queries,
        lengths_ignores_left,
        lengths_left_mirrored_wrong,
        lengths_off_by_one,
        lengths_as_integers,
    ],
)
def test_lengths_padding_mask_rejects_wrong(wrong):
    assert not ch05.check_lengths_padding_mask(wrong, verbose=False)


def test_lengths_padding_mask_shows_the_small_inputs_by_value():
    result = ch05.check_lengths_padding_mask(lengths_off_by_one, verbose=False)
    assert "lengths = [" in result.message and "left = " in result.message, result.message


def test_lengths_padding_mask_explains_a_wrong_dtype():
    result = ch05.check_lengths_padding_mask(lengths_as_integers, verbose=False)
    assert "boolean" in result.message and "torch.int64" in result.message
    assert "is wrong" in result.message and "raised" not in result.message, result.message


def test_lengths_cases_cover_both_sides_and_the_edges():
    cases = ch05._lengths_cases()
    assert {c["left"] for c in cases} == {True, False}
    assert any(bool((c["lengths"] == 0).any()) for c in cases)  # a row of padding only
    assert any(bool((c["lengths"] == c["k_len"]).all()) for c in cases)  # no padding at all
    assert all(len(c["lengths"]) != c["k_len"] for c in cases)


# --------------------------------------------------------------------------------------------
# causal_window_mask
# --------------------------------------------------------------------------------------------


def window_correct(q_len, k_len, window):
    ones = torch.ones(q_len, k_len, dtype=torch.bool)
    shift = k_len - q_len
    return ones.tril(diagonal=shift) & ones.triu(diagonal=shift - window + 1)


def window_one_too_wide(q_len, k_len, window):  # |i - j| <= window: window + 1 keys
    return window_correct(q_len, k_len, window + 1)


def window_top_left(q_len, k_len, window):  # right only when q_len == k_len
    ones = torch.ones(q_len, k_len, dtype=torch.bool)
    return ones.tril() & ones.triu(diagonal=-window + 1)


def window_not_causal(q_len, k_len, window):  # a symmetric band: sees window - 1 keys ahead
    distance = torch.arange(q_len)[:, None] + (k_len - q_len) - torch.arange(k_len)[None, :]
    return distance.abs() < window  # (q_len, k_len)


def window_ignored(q_len, k_len, window):  # the plain causal mask
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len)


def window_inverted(q_len, k_len, window):  # True = blocked
    return ~window_correct(q_len, k_len, window)


def window_float(q_len, k_len, window):
    return window_correct(q_len, k_len, window).float()


def test_causal_window_mask_accepts_correct():
    assert ch05.check_causal_window_mask(window_correct, verbose=False)


def test_causal_window_mask_refuses_companion_masking():
    def companion_window(q_len, k_len, window):
        return masking.sliding_window_mask(q_len, k_len, window=window, causal=True)

    cases = ch05._causal_window_cases()
    assert all(  # the package's mask is the right answer ...
        torch.equal(companion_window(**c), ch05.reference_causal_window_mask(**c)) for c in cases
    )
    result = ch05.check_causal_window_mask(companion_window, verbose=False)
    assert not result and "companion.masking" in result.message  # ... and it is refused


@pytest.mark.parametrize(
    "wrong",
    [
        window_one_too_wide,
        window_top_left,
        window_not_causal,
        window_ignored,
        window_inverted,
        window_float,
    ],
)
def test_causal_window_mask_rejects_wrong(wrong):
    assert not ch05.check_causal_window_mask(wrong, verbose=False)


def test_window_top_left_alignment_passes_the_square_cases_first():
    """Only a case with more keys than queries catches the top-left alignment."""
    result = ch05.check_causal_window_mask(window_top_left, verbose=False)
    assert not result
    assert result.cases_run > 3
    assert "Trap 1" in result.message, result.message  # the hint names the top-left slip


def test_window_hint_is_silent_for_other_mistakes():
    result = ch05.check_causal_window_mask(window_one_too_wide, verbose=False)
    assert "Trap 1" not in result.message, result.message


def test_window_cases_include_the_plain_causal_mask():
    cases = ch05._causal_window_cases()
    long = [c for c in cases if c["window"] >= c["k_len"]]
    assert long and all(
        torch.equal(
            ch05.reference_causal_window_mask(**c), masking.causal_mask(c["q_len"], c["k_len"])
        )
        for c in long
    )


# --------------------------------------------------------------------------------------------
# prefix_lm_mask
# --------------------------------------------------------------------------------------------


def prefix_correct(tokens, prefix_lens, pad_id):
    """By hand: the keys that are real, and causal OR inside the prefix."""
    n = tokens.shape[1]
    in_prefix = torch.arange(n)[None, :] < prefix_lens[:, None]  # (batch, n)
    return _keys_real(tokens, pad_id) & (_causal(n) | in_prefix[:, None, None, :])


def prefix_via_companion(tokens, prefix_lens, pad_id):  # the package's masks, one row at a time
    n = tokens.shape[1]
    rows = [masking.prefix_lm_mask(n, int(length)) for length in prefix_lens]  # (n, n) each
    return masking.padding_mask(tokens, pad_id) & torch.stack(rows)[:, None]


def prefix_causal_only(tokens, prefix_lens, pad_id):  # ignores the prefix: a decoder mask
    return _keys_real(tokens, pad_id) & _causal(tokens.shape[1])


def prefix_on_queries(tokens, prefix_lens, pad_id):  # prefix queries see the whole future
    n = tokens.shape[1]
    query_in_prefix = torch.arange(n)[None, :] < prefix_lens[:, None]  # (batch, n)
    return _keys_real(tokens, pad_id) & (_causal(n) | query_in_prefix[:, None, :, None])


def prefix_off_by_one(tokens, prefix_lens, pad_id):  # j <= prefix: one answer token too many
    return prefix_correct(tokens, prefix_lens + 1, pad_id)


def prefix_first_row_for_all(tokens, prefix_lens, pad_id):  # one prefix for the whole batch
    return prefix_correct(tokens, prefix_lens[:1].expand_as(prefix_lens), pad_id)


def prefix_no_padding(tokens, prefix_lens, pad_id):  # the padded keys stay visible
    return prefix_correct(tokens, prefix_lens, pad_id - 1)


def prefix_or_padding(tokens, prefix_lens, pad_id):  # | instead of &: padding allows keys
    n = tokens.shape[1]
    in_prefix = torch.arange(n)[None, :] < prefix_lens[:, None]  # (batch, n)
    return _keys_real(tokens, pad_id) | (_causal(n) | in_prefix[:, None, None, :])


def prefix_no_head_axis(tokens, prefix_lens, pad_id):  # (batch, n, n): broadcasts wrongly
    return prefix_correct(tokens, prefix_lens, pad_id)[:, 0]


def prefix_inverted(tokens, prefix_lens, pad_id):  # True = blocked
    return ~prefix_correct(tokens, prefix_lens, pad_id)


def prefix_transposed(tokens, prefix_lens, pad_id):  # queries and keys swapped
    return prefix_correct(tokens, prefix_lens, pad_id).transpose(-2, -1)


def prefix_pads_queries(
    tokens, prefix_lens, pad_id
):  # padding applied to the queries, not the keys
    n = tokens.shape[1]
    in_prefix = torch.arange(n)[None, :] < prefix_lens[:, None]  # (batch, n)
    real_query = (tokens != pad_id)[:, None, :, None]  # (batch, 1, n, 1)
    return (_causal(n) | in_prefix[:, None, None, :]) & real_query


def test_prefix_lm_mask_accepts_correct():
    assert ch05.check_prefix_lm_mask(prefix_correct, verbose=False)


def test_prefix_lm_mask_refuses_companion_masking():
    cases = ch05._prefix_lm_cases()
    assert all(  # the wrapper around the package is the right answer ...
        torch.equal(prefix_via_companion(**c), ch05.reference_prefix_lm_mask(**c)) for c in cases
    )
    result = ch05.check_prefix_lm_mask(prefix_via_companion, verbose=False)
    assert not result and "companion.masking" in result.message  # ... and it is refused


@pytest.mark.parametrize(
    "wrong",
    [
        prefix_causal_only,
        prefix_on_queries,
        prefix_off_by_one,
        prefix_first_row_for_all,
        prefix_no_padding,
        prefix_or_padding,
        prefix_no_head_axis,
        prefix_inverted,
        prefix_transposed,
        prefix_pads_queries,
    ],
)
def test_prefix_lm_mask_rejects_wrong(wrong):
    assert not ch05.check_prefix_lm_mask(wrong, verbose=False)


def prefix_blanks_padded_queries(tokens, prefix_lens, pad_id):  # padded queries see nothing
    real = tokens != pad_id  # (batch, n)
    return prefix_correct(tokens, prefix_lens, pad_id) & real[:, None, :, None]


def prefix_padded_queries_see_padding(tokens, prefix_lens, pad_id):  # only padded rows wrong
    real = tokens != pad_id  # (batch, n)
    padded_rows = ~real[:, None, :, None] & ~real[:, None, None, :]  # pad query, pad key
    return prefix_correct(tokens, prefix_lens, pad_id) | padded_rows


def test_prefix_lm_mask_accepts_blanked_padded_queries():
    """An empty row for each padded query is harmless (its output is never read): accepted."""
    cases = ch05._prefix_lm_cases()
    assert any(
        not torch.equal(prefix_blanks_padded_queries(**c), ch05.reference_prefix_lm_mask(**c))
        for c in cases
    )  # the variant really differs from the reference on some case
    assert ch05.check_prefix_lm_mask(prefix_blanks_padded_queries, verbose=False)


def test_prefix_lm_mask_rejects_padded_queries_that_see_padding():
    assert not ch05.check_prefix_lm_mask(prefix_padded_queries_see_padding, verbose=False)


def prefix_padded_queries_see_prefix(tokens, prefix_lens, pad_id):  # a padded query: prefix only
    n = tokens.shape[1]
    real_query = (tokens != pad_id)[:, None, :, None]  # (batch, 1, n, 1)
    in_prefix = torch.arange(n)[None, :] < prefix_lens[:, None]  # (batch, n)
    prefix_key = in_prefix[:, None, None, :]  # (batch, 1, 1, n)
    return ((real_query & _causal(n)) | prefix_key) & _keys_real(tokens, pad_id)


def prefix_from_package_blocks(tokens, prefix_lens, pad_id):  # 5.4's building blocks, allowed
    n = tokens.shape[1]
    in_prefix = torch.arange(n)[None, :] < prefix_lens[:, None]  # (batch, n)
    allowed = masking.causal_mask(n) | in_prefix[:, None, None, :]  # (batch, 1, n, n)
    return masking.combine_masks(masking.padding_mask(tokens, pad_id), allowed)


def test_prefix_lm_mask_allows_the_building_blocks_of_5_4():
    """padding_mask, causal_mask and combine_masks are what 5.4 taught: allowed in exercise 3."""
    assert ch05.check_prefix_lm_mask(prefix_from_package_blocks, verbose=False)


def test_prefix_lm_mask_names_the_missing_key_padding_mask():
    result = ch05.check_prefix_lm_mask(prefix_no_padding, verbose=False)
    assert not result and "a pad. Mask the keys with tokens != pad_id" in result.message, (
        result.message
    )
    assert "is padding" not in result.message, result.message
    # a mistake that keeps the key padding mask gets no such hint
    result = ch05.check_prefix_lm_mask(prefix_on_queries, verbose=False)
    assert not result and "a pad. Mask the keys" not in result.message, result.message


def test_prefix_lm_mask_names_the_padded_query():
    """Harmless but outside the spec ("a real query's row or nothing"): rejected, and the message
    says that only padded queries' rows differ."""
    result = ch05.check_prefix_lm_mask(prefix_padded_queries_see_prefix, verbose=False)
    assert not result and "is padding" in result.message, result.message
    # a real mistake gets no such hint
    result = ch05.check_prefix_lm_mask(prefix_on_queries, verbose=False)
    assert not result and "is padding" not in result.message, result.message


def test_prefix_lm_mask_names_the_prefix_tested_on_the_query():
    result = ch05.check_prefix_lm_mask(prefix_on_queries, verbose=False)
    assert not result and "Test the key against the prefix" in result.message, result.message
    # other mistakes get no such hint
    for wrong in (prefix_off_by_one, prefix_causal_only, prefix_or_padding):
        result = ch05.check_prefix_lm_mask(wrong, verbose=False)
        assert not result and "Test the key" not in result.message, (wrong.__name__, result.message)


def test_prefix_lm_mask_reports_the_missing_head_axis():
    result = ch05.check_prefix_lm_mask(prefix_no_head_axis, verbose=False)
    assert "wrong shape" in result.message


def test_prefix_cases_cover_the_edges():
    cases = ch05._prefix_lm_cases()
    prefixes = torch.cat([c["prefix_lens"] for c in cases])
    assert bool((prefixes == 0).any())  # a prefix of 0: the plain decoder mask
    assert any(len(set(c["prefix_lens"].tolist())) > 1 for c in cases)  # prefixes differ
    assert any(c["pad_id"] != 0 for c in cases)
    # a row of padding only, whose queries see nothing
    assert any(bool((c["tokens"] == c["pad_id"]).all(-1).any()) for c in cases)
    # a prefix that runs into the padding: the only case where padding the queries instead of
    # the keys shows (a real query's prefix then reaches padded keys)
    assert any(
        bool(
            (
                (c["prefix_lens"] > (c["tokens"] != c["pad_id"]).sum(-1))
                & (c["tokens"] != c["pad_id"]).any(-1)
            ).any()
        )
        for c in cases
    )


# --------------------------------------------------------------------------------------------
# mha_attn_mask
# --------------------------------------------------------------------------------------------


def mha_correct(mask, num_heads):  # expand + reshape: batch-major rows
    batch, _, q_len, k_len = mask.shape
    return ~mask.expand(batch, num_heads, q_len, k_len).reshape(batch * num_heads, q_len, k_len)


def mha_repeat_interleave(mask, num_heads):  # the other right answer
    if mask.shape[1] == 1:
        return ~mask[:, 0].repeat_interleave(num_heads, dim=0)
    return ~mask.flatten(0, 1)


def mha_via_companion(mask, num_heads):
    return interop.to_torch_attn_mask(mask, num_heads=num_heads)


def mha_repeat(mask, num_heads):  # head-major: the whole batch once per head
    if mask.shape[1] == 1:
        return ~mask[:, 0].repeat(num_heads, 1, 1)
    return ~mask.flatten(0, 1)


def mha_not_inverted(mask, num_heads):  # keeps the package's True = may attend
    return ~mha_correct(mask, num_heads)


def mha_as_float(mask, num_heads):
    return mha_correct(mask, num_heads).float()


def mha_first_head_only(mask, num_heads):  # a per-head mask loses its other heads
    return ~mask[:, 0].repeat_interleave(num_heads, dim=0)


def mha_heads_first(mask, num_heads):  # per-head masks flattened head-major
    batch, _, q_len, k_len = mask.shape
    per_head = mask.expand(batch, num_heads, q_len, k_len).transpose(0, 1)
    return ~per_head.reshape(batch * num_heads, q_len, k_len)


def mha_transposed(mask, num_heads):  # (.., k_len, q_len)
    return mha_correct(mask, num_heads).transpose(1, 2)


def mha_no_heads(mask, num_heads):  # (batch, q_len, k_len): one row per sequence
    return ~mask[:, 0]


def test_mha_attn_mask_accepts_correct():
    assert ch05.check_mha_attn_mask(mha_correct, verbose=False)
    assert ch05.check_mha_attn_mask(mha_repeat_interleave, verbose=False)
    assert ch05.check_mha_attn_mask(ch05.reference_mha_attn_mask, verbose=False)


def test_mha_attn_mask_refuses_companion_interop():
    result = ch05.check_mha_attn_mask(mha_via_companion, verbose=False)
    assert not result and "companion.interop" in result.message


@pytest.mark.parametrize(
    "wrong",
    [
        mha_repeat,
        mha_not_inverted,
        mha_as_float,
        mha_first_head_only,
        mha_heads_first,
        mha_transposed,
        mha_no_heads,
    ],
)
def test_mha_attn_mask_rejects_wrong(wrong):
    assert not ch05.check_mha_attn_mask(wrong, verbose=False)


def test_mha_attn_mask_names_the_two_silent_mistakes():
    result = ch05.check_mha_attn_mask(mha_repeat, verbose=False)
    assert "head-major" in result.message and "other order" in result.message, result.message
    # a discovery exercise: the hint names the learner's order, not the answer's formula
    for answer in ("b * num_heads", "repeat_interleave"):
        assert answer not in result.message, result.message
    result = ch05.check_mha_attn_mask(mha_not_inverted, verbose=False)
    assert "True = blocked" in result.message and "inverted" in result.message, result.message


def test_mha_attn_mask_reports_a_wrong_dtype_as_a_wrong_answer():
    result = ch05.check_mha_attn_mask(mha_as_float, verbose=False)
    assert "is wrong: mha_attn_mask returned dtype torch.float32" in result.message, result.message
    assert "raised" not in result.message, result.message


def test_mha_cases_separate_batch_major_from_head_major():
    for case in ch05._mha_cases()[:-1]:  # every case but the one-head one
        assert case["mask"].shape[0] >= 2 and case["num_heads"] >= 2
        assert not torch.equal(
            mha_correct(**case),
            mha_repeat(**case) if case["mask"].shape[1] == 1 else mha_heads_first(**case),
        )


def test_reference_mha_attn_mask_is_what_pytorch_reads():
    # nn.MultiheadAttention with the 3-D mask gives each sequence what it gives alone with its
    # own 2-D mask: the rows are batch-major
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(3, 5, 8)
    keys_real = torch.arange(5)[None, :] < torch.tensor([5, 3, 4])[:, None]  # (3, 5)
    mask = keys_real[:, None, None, :] & _causal(5)  # (3, 1, 5, 5)
    with torch.no_grad():
        together, _ = mha(
            x, x, x, attn_mask=ch05.reference_mha_attn_mask(mask, 2), need_weights=False
        )
        for b in range(3):
            alone, _ = mha(
                x[b : b + 1], x[b : b + 1], x[b : b + 1], attn_mask=~mask[b, 0], need_weights=False
            )
            assert torch.allclose(together[b], alone[0], atol=1e-6), b
        wrong, _ = mha(x, x, x, attn_mask=mha_repeat(mask, 2), need_weights=False)
    assert not torch.allclose(wrong, together, atol=1e-3)
    for case in ch05._mha_cases():
        assert torch.equal(ch05.reference_mha_attn_mask(**case), mha_via_companion(**case))


# --------------------------------------------------------------------------------------------
# first_leak
# --------------------------------------------------------------------------------------------


def _pairs(attend, x, perturb, outputs=None, inputs=None):
    """All (i, j), i < j, where ``perturb`` applied to input j alone changes output i."""
    before = attend(x)
    found = []
    for j in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, j] = perturb(changed[:, j])
        after = attend(changed)
        for i in range(j):
            if outputs is not None and i not in outputs(x.shape[1]):
                continue
            if inputs is not None and j not in inputs(i, x.shape[1]):
                continue
            if not torch.allclose(after[:, i], before[:, i], atol=1e-5, rtol=0):
                found.append((i, j))
    return min(found) if found else None


def first_leak_correct(attend, x):
    return _pairs(attend, x, torch.randn_like)


def first_leak_by_gradient(attend, x):
    """The Jacobian of output i w.r.t. each later input j, at the sample x only: blind to a
    leak whose derivative is zero there (a gate closed at the sample)."""
    for i in range(x.shape[1] - 1):
        x_grad = x.clone().requires_grad_()
        output = attend(x_grad)[:, i]  # (batch, d_out)
        # a random direction: a plain sum is blind to outputs with zero mean
        (output * torch.randn_like(output)).sum().backward()
        later = (x_grad.grad[:, i + 1 :].abs() > 1e-7).flatten(2).any(-1).any(0)  # (n - i - 1,)
        if bool(later.any()):
            return (i, i + 1 + int(later.nonzero()[0]))
    return None


def first_leak_output_zero_only(attend, x):  # checks t = 0 only: misses late leaks
    return _pairs(attend, x, torch.randn_like, outputs=lambda n: {0})


def first_leak_adjacent_only(attend, x):  # checks j = i + 1 only: misses longer jumps
    return _pairs(attend, x, torch.randn_like, inputs=lambda i, n: {i + 1})


def first_leak_rescaled(attend, x):  # a deterministic change, 2 * x: blind to direction-only
    return _pairs(attend, x, lambda v: 2.0 * v)


def first_leak_zeroed(attend, x):  # zeros instead of random vectors: blind to a closed gate
    return _pairs(attend, x, torch.zeros_like)


def first_leak_constant_shift(attend, x):  # x + 1 is invisible after a layer norm
    return _pairs(attend, x, lambda v: v + 1.0)


def first_leak_whole_future(attend, x):  # changes all of x[t+1:] at once: always j = t + 1
    before = attend(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        after = attend(changed)
        for i in range(t + 1):
            if not torch.allclose(after[:, i], before[:, i], atol=1e-5):
                return (i, t + 1)
    return None


def first_leak_last_token_only(attend, x):  # only perturbs the last position
    return _pairs(attend, x, torch.randn_like, inputs=lambda i, n: {n - 1})


def first_leak_swapped(attend, x):  # (input, output) instead of (output, input)
    pair = first_leak_correct(attend, x)
    return None if pair is None else (pair[1], pair[0])


def first_leak_boolean(attend, x):  # the yes/no answer of a plain leak test
    return first_leak_correct(attend, x) is not None


def first_leak_negated(attend, x):  # -x: blind to an even function of the input
    return _pairs(attend, x, lambda v: -v)


def first_leak_smallest_j_first(attend, x):  # j outer loop, first leak met: smallest j wins
    before = attend(x)
    for j in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, j] = torch.randn_like(changed[:, j])
        after = attend(changed)
        for i in range(j):
            if not torch.allclose(after[:, i], before[:, i], atol=1e-5, rtol=0):
                return (i, j)
    return None


def first_leak_first_sequence_only(attend, x):  # compares batch element 0 only
    def first_sequence(x_batch):
        return attend(x_batch)[:1]  # (1, seq_len, d_out)

    return first_leak_correct(first_sequence, x)


def first_leak_loose(attend, x):  # atol=1e-2 instead of 1e-5: misses a small leak
    return _pairs_compared(attend, x, lambda a, b: not torch.allclose(a, b, atol=1e-2))


def first_leak_default_allclose(attend, x):  # default allclose: 1e-8 + 1e-5 * |b|, not a fixed 1e-5
    return _pairs_compared(attend, x, lambda a, b: not torch.allclose(a, b))


def first_leak_exact(attend, x):  # torch.equal: any change at all, even below 1e-5
    return _pairs_compared(attend, x, lambda a, b: not torch.equal(a, b))


def _pairs_compared(attend, x, changed_by):
    """All (i, j), i < j, where ``changed_by(after_i, before_i)`` says output i moved."""
    before = attend(x)
    found = []
    for j in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, j] = torch.randn_like(changed[:, j])
        after = attend(changed)
        found += [(i, j) for i in range(j) if changed_by(after[:, i], before[:, i])]
    return min(found) if found else None


def first_leak_feature_zero_only(attend, x):  # compares output feature 0 alone
    return _pairs_compared(attend, x, lambda a, b: (a[..., 0] - b[..., 0]).abs().max() > 1e-5)


def first_leak_mean_change(attend, x):  # the mean change over batch and features, not any entry
    return _pairs_compared(attend, x, lambda a, b: (a - b).abs().mean() > 1e-5)


def first_leak_batch_summed(attend, x):  # compares the outputs summed over the batch
    return _pairs_compared(attend, x, lambda a, b: (a.sum(0) - b.sum(0)).abs().max() > 1e-5)


def first_leak_max_abs(attend, x):  # right: the largest change of any entry
    return _pairs_compared(attend, x, lambda a, b: (a - b).abs().max() > 1e-5)


def first_leak_allclose_default_rtol(attend, x):  # atol=1e-5 plus the default rtol=1e-5 * |b|
    return _pairs_compared(attend, x, lambda a, b: not torch.allclose(a, b, atol=1e-5))


def first_leak_uniform(attend, x):  # torch.rand_like: uniform in [0, 1), never negative
    return _pairs(attend, x, torch.rand_like)


def first_leak_l2_norm(attend, x):  # the L2 norm of output i's whole change, not any entry
    return _pairs_compared(attend, x, lambda a, b: (a - b).norm() > 1e-5)


def first_leak_l2_norm_per_sequence(attend, x):  # the L2 norm over one sequence's features
    return _pairs_compared(attend, x, lambda a, b: (a - b).norm(dim=-1).max() > 1e-5)


def first_leak_shared_vector(attend, x):  # one random vector for every sequence of the batch
    return _pairs(attend, x, lambda v: torch.randn(v.shape[-1]).expand_as(v))


def test_leak_case_alike_in_every_sequence_fails_a_shared_vector():
    """Input 3 alike in every sequence, leaking through batch statistics: one random vector
    shared by the batch keeps it alike and misses the leak whatever the seed."""
    alike = {case["attend"].name: case for case in ch05._future_leak_cases()}[
        "batch-centred x[3] into 1, x[3] alike"
    ]
    assert ch05.reference_first_leak(**alike) == (1, 3)
    for seed in range(200):
        torch.manual_seed(seed)
        assert first_leak_shared_vector(**alike) is None, seed
        for solution in (first_leak_correct, first_leak_max_abs):
            assert solution(**alike) == (1, 3), (solution.__name__, seed)
    torch.manual_seed(0)
    result = ch05.check_first_leak(first_leak_shared_vector, verbose=False)
    assert not result and "anew for each sequence" in result.message, result.message


def _pairs_replaced(attend, x, replace):
    """As ``_pairs``, but input j becomes ``replace(x, j)``, computed from the whole input."""
    before = attend(x)
    found = []
    for j in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, j] = replace(x, j)
        after = attend(changed)
        found += [(i, j) for i in range(j) if (after[:, i] - before[:, i]).abs().max() > 1e-5]
    return min(found) if found else None


def first_leak_copied_neighbour(attend, x):  # input j := input j - 1: a copy, not a new vector
    return _pairs_replaced(attend, x, lambda x, j: x[:, j - 1])


def first_leak_positions_mean(attend, x):  # input j := the mean over positions
    return _pairs_replaced(attend, x, lambda x, j: x.mean(1))


def test_leak_case_with_one_repeated_vector_fails_a_copied_input():
    """One vector at every position and one leak, (0, 3): copying another position's input into
    j, or the mean over positions, changes nothing there, so such a test answers None; a new
    random vector finds the leak whatever the seed, and the check's message says why."""
    repeated = {case["attend"].name: case for case in ch05._future_leak_cases()}[
        "0 peeks at 3, one vector at every position"
    ]
    assert ch05.reference_first_leak(**repeated) == (0, 3)
    assert first_leak_copied_neighbour(**repeated) is None
    assert first_leak_positions_mean(**repeated) is None
    for seed in range(100):
        torch.manual_seed(seed)
        for solution in (first_leak_correct, first_leak_max_abs):
            assert solution(**repeated) == (0, 3), (solution.__name__, seed)
    for wrong in (first_leak_copied_neighbour, first_leak_positions_mean):
        torch.manual_seed(0)
        result = ch05.check_first_leak(wrong, verbose=False)
        assert not result and "repeated token" in result.message, (wrong.__name__, result.message)


def first_leak_affine(attend, x):  # a fixed change, -3x + 1: input 3 stays alike in every sequence
    return _pairs(attend, x, lambda v: -3 * v + 1)


def test_leak_case_alike_in_every_sequence_names_a_fixed_change():
    """A deterministic change keeps an input alike across the batch, as a shared vector does:
    the hint names both."""
    torch.manual_seed(0)
    result = ch05.check_first_leak(first_leak_affine, verbose=False)
    assert (
        not result
        and "fixed change" in result.message
        and "anew for each sequence" in result.message
    ), result.message


def first_leak_in_place(attend, x):  # no clone: x itself changes, so input j - 1 stays changed
    leaks = []
    with torch.no_grad():
        before = attend(x)
        for j in range(1, x.shape[1]):
            changed = x
            changed[:, j] = torch.randn_like(changed[:, j])
            after = attend(changed)
            leaks += [(i, j) for i in range(j) if (after[:, i] - before[:, i]).abs().max() > 1e-5]
    return min(leaks) if leaks else None


def test_first_leak_hints_name_the_pair_order_and_the_missing_clone():
    """The two slips the messages used to leave bare: the first leak met in a loop over j
    (case 16 answers (1, 2)), and a test that changes x in place (the causal case answers (1, 2))."""
    torch.manual_seed(0)
    result = ch05.check_first_leak(first_leak_smallest_j_first, verbose=False)
    assert not result and "smallest i first" in result.message, result.message
    torch.manual_seed(0)
    result = ch05.check_first_leak(first_leak_in_place, verbose=False)
    assert not result and "x.clone()" in result.message, result.message
    torch.manual_seed(0)
    # a real mistake gets neither hint
    result = ch05.check_first_leak(first_leak_whole_future, verbose=False)
    assert not result, result.message
    assert "x.clone()" not in result.message and "smallest i first" not in result.message


def test_leak_case_below_the_tolerance_in_every_entry_fails_an_l2_norm():
    """About 8e-6 in every entry of output 0: no entry moves by 1e-5, so no leak; the L2 norm
    of the change, over the whole output or one sequence, is above 1e-5 whatever the seed."""
    spread = {case["attend"].name: case for case in ch05._future_leak_cases()}[
        "8e-6 in every entry, x[3] into 0"
    ]
    assert ch05.reference_first_leak(**spread) is None
    for seed in range(50):
        torch.manual_seed(seed)
        changed = spread["x"].clone()
        changed[:, 3] = torch.randn_like(changed[:, 3])
        move = (spread["attend"](changed) - spread["attend"](spread["x"]))[:, 0]  # (batch, d)
        assert 5e-6 < move.abs().min() and move.abs().max() < 9e-6, (seed, move)
        assert move.norm() > 2e-5, (seed, move.norm())
        assert first_leak_l2_norm(**spread) == (0, 3), seed
        assert first_leak_l2_norm_per_sequence(**spread) == (0, 3), seed
        for solution in (first_leak_correct, first_leak_max_abs):
            assert solution(**spread) is None, (solution.__name__, seed)


def test_leak_cases_in_one_feature_of_one_sequence_and_through_the_batch():
    """The 5e-5 leak into the last feature of sequence 1, and the batch-centred leak: each
    wrong comparison misses its case whatever the seed, and the right ones never do."""
    cases = {case["attend"].name: case for case in ch05._future_leak_cases()}
    one_entry = cases["sequence 1: 5e-5 into the last feature of 1"]
    centred = cases["batch-centred x[2] into 0"]
    assert ch05.reference_first_leak(**one_entry) == (1, 3)
    assert ch05.reference_first_leak(**centred) == (0, 2)
    right = (first_leak_correct, first_leak_max_abs)
    for seed in range(200):
        torch.manual_seed(seed)
        assert first_leak_feature_zero_only(**one_entry) is None, seed
        assert first_leak_mean_change(**one_entry) is None, seed
        assert first_leak_batch_summed(**centred) is None, seed
        for solution in right:
            assert solution(**one_entry) == (1, 3), (solution.__name__, seed)
            assert solution(**centred) == (0, 2), (solution.__name__, seed)


def test_first_leak_right_answers_pass_whatever_the_seed():
    for seed in range(10):
        for solution in (first_leak_correct, first_leak_max_abs):
            torch.manual_seed(seed)
            assert ch05.check_first_leak(solution, verbose=False), (solution.__name__, seed)


def test_leak_case_below_the_tolerance_fails_an_exact_comparison():
    tiny = {case["attend"].name: case for case in ch05._future_leak_cases()}[
        "1e-6 tanh(x[3]) into 0"
    ]
    assert ch05.reference_first_leak(**tiny) is None
    for seed in range(20):
        torch.manual_seed(seed)
        assert first_leak_exact(**tiny) == (0, 3), seed
        assert first_leak_correct(**tiny) is None, seed


def test_leak_cases_missed_by_the_default_rtol_and_by_uniform_noise():
    """The 1.5e-5 step on entries of size >= 1.5, and the leak through negative entries only:
    each wrong answer misses its case whatever the seed, and the right ones never do."""
    cases = {case["attend"].name: case for case in ch05._future_leak_cases()}
    step = cases["1.5e-5 step of x[4] into 2"]
    negative = cases["negative part of x[3] into 0"]
    assert ch05.reference_first_leak(**step) == (2, 4)
    assert ch05.reference_first_leak(**negative) == (0, 3)
    assert step["attend"](step["x"])[:, 2].abs().min() > 1.5  # rtol * |b| >= 1.5e-5 there
    for seed in range(200):
        torch.manual_seed(seed)
        assert first_leak_allclose_default_rtol(**step) is None, seed
        assert first_leak_uniform(**negative) is None, seed
        for solution in (first_leak_correct, first_leak_max_abs):
            assert solution(**step) == (2, 4), (solution.__name__, seed)
            assert solution(**negative) == (0, 3), (solution.__name__, seed)


def test_leak_case_missed_by_a_loose_tolerance():
    small = {case["attend"].name: case for case in ch05._future_leak_cases()}["1e-3 x[3] into 0"]
    assert ch05.reference_first_leak(**small) == (0, 3)
    for seed in range(20):
        torch.manual_seed(seed)
        assert first_leak_loose(**small) is None, seed
        assert first_leak_correct(**small) == (0, 3), seed


def test_first_leak_accepts_correct():
    torch.manual_seed(0)
    assert ch05.check_first_leak(first_leak_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        first_leak_output_zero_only,
        first_leak_adjacent_only,
        first_leak_rescaled,
        first_leak_constant_shift,
        first_leak_whole_future,
        first_leak_last_token_only,
        first_leak_swapped,
        first_leak_boolean,
        first_leak_smallest_j_first,
        first_leak_first_sequence_only,
        first_leak_negated,
        first_leak_zeroed,
        first_leak_by_gradient,
        first_leak_loose,
        first_leak_exact,
        first_leak_default_allclose,
        first_leak_shared_vector,
        first_leak_feature_zero_only,
        first_leak_mean_change,
        first_leak_batch_summed,
        first_leak_allclose_default_rtol,
        first_leak_uniform,
        first_leak_l2_norm,
        first_leak_l2_norm_per_sequence,
    ],
)
def test_first_leak_rejects_wrong(wrong):
    torch.manual_seed(0)
    assert not ch05.check_first_leak(wrong, verbose=False)


@pytest.mark.parametrize(
    "wrong, case_name",
    [
        (first_leak_exact, "1e-6 tanh(x[3]) into 0"),
        (first_leak_allclose_default_rtol, "1.5e-5 step of x[4] into 2"),
        (first_leak_l2_norm, "8e-6 in every entry, x[3] into 0"),
    ],
)
def test_first_leak_flags_the_tolerance_cases_as_spec_cases(wrong, case_name):
    """A sound test that reads the tolerance another way fails a case that says so."""
    names = [case["attend"].name for case in ch05._future_leak_cases()]
    assert set(ch05._TOLERANCE_SPEC_CASES) <= set(names)
    torch.manual_seed(0)
    result = ch05.check_first_leak(wrong, verbose=False)
    assert not result
    assert f"case {names.index(case_name) + 1} is wrong" in result.message
    assert "tests the stated tolerance" in result.message


def test_first_leak_gives_a_conceptual_mistake_no_tolerance_hint():
    for wrong in (first_leak_whole_future, first_leak_smallest_j_first, first_leak_uniform):
        torch.manual_seed(0)
        result = ch05.check_first_leak(wrong, verbose=False)
        assert not result and "tolerance" not in result.message, wrong.__name__


def test_leak_cases_have_both_answers_and_the_hard_leaks():
    answers = [ch05.reference_first_leak(**case) for case in ch05._future_leak_cases()]
    assert answers.count(None) >= 4 and len(answers) - answers.count(None) >= 6
    # a leak two steps ahead, one into a late position, and two blind to deterministic changes
    assert {(0, 2), (4, 5), (1, 3), (2, 4), (0, 3), (1, 4)} <= set(answers)


def test_leak_case_blind_to_negation():
    even = {case["attend"].name: case for case in ch05._future_leak_cases()}[
        "square of x[4] into 1"
    ]
    assert first_leak_negated(**even) is None
    assert ch05.reference_first_leak(**even) == (1, 4)


def test_leak_case_blind_to_zeros_and_to_the_gradient():
    """The gated leak: zeros, 2 * x, -x and the derivative at the sample all see nothing."""
    gated = {case["attend"].name: case for case in ch05._future_leak_cases()}["gated x[3] into 1"]
    assert ch05.reference_first_leak(**gated) == (1, 3)
    assert first_leak_zeroed(**gated) is None
    assert first_leak_by_gradient(**gated) is None
    assert first_leak_rescaled(**gated) is None and first_leak_negated(**gated) is None
    for seed in range(20):  # random replacements open the gate whatever the seed
        torch.manual_seed(seed)
        assert first_leak_correct(**gated) == (1, 3), seed


def test_first_leak_names_the_closed_gate():
    """A derivative at the sample misses the gated leak: the check says why."""
    result = ch05.check_first_leak(first_leak_by_gradient, verbose=False)
    assert not result and "closed gate" in result.message, result.message


def test_leak_cases_separate_smallest_i_from_smallest_j_and_later_sequences():
    """The two leaks (1, 2) and (0, 3): only a search by smallest i answers (0, 3); a leak in
    the second sequence only: sequence 0 alone shows no leak at all."""
    cases = {case["attend"].name: case for case in ch05._future_leak_cases()}
    two = cases["1 peeks at 2, 0 peeks at 3"]
    assert ch05.reference_first_leak(**two) == (0, 3)
    assert first_leak_smallest_j_first(**two) == (1, 2)
    second = cases["sequence 1: 1 peeks at 3"]
    assert ch05.reference_first_leak(**second) == (1, 3)
    assert first_leak_first_sequence_only(**second) is None


def test_reference_leak_test_agrees_with_companion_attention():
    from companion.attention import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    assert ch05.reference_first_leak(lambda x: mha(x, x, x, is_causal=True)[0], x) is None
    assert ch05.reference_first_leak(lambda x: mha(x, x, x)[0], x) == (0, 1)


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, references, determinism
# --------------------------------------------------------------------------------------------


def test_references_agree_with_companion_masking():
    for case in ch05._lengths_cases():
        expected = lengths_via_companion(**case)
        assert torch.equal(ch05.reference_lengths_padding_mask(**case), expected)
    for case in ch05._causal_window_cases():
        expected = masking.sliding_window_mask(
            case["q_len"], case["k_len"], window=case["window"], causal=True
        )
        assert torch.equal(ch05.reference_causal_window_mask(**case), expected)
    for case in ch05._prefix_lm_cases():
        assert torch.equal(ch05.reference_prefix_lm_mask(**case), prefix_correct(**case))


def test_cases_are_reproducible():
    first, second = ch05._prefix_lm_cases(), ch05._prefix_lm_cases()
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(first, second))
    first, second = ch05._future_leak_cases(), ch05._future_leak_cases()
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(first, second))


def first_leak_tolerance_1e4(attend, x):  # a sound test with a looser tolerance than stated
    return _pairs_compared(attend, x, lambda a, b: (a - b).abs().max() > 1e-4)


def first_leak_small_perturbation(attend, x):  # x + 1e-3 noise: too small to open a gate
    return _pairs(attend, x, lambda v: v + 1e-3 * torch.randn_like(v))


def test_leak_two_steps_ahead_names_the_whole_future_slip():
    """The 'Think first' slip (the whole future at once) and adjacent pairs only both fail on the
    leak two steps ahead, and the message says what to change."""
    for wrong in (first_leak_whole_future, first_leak_adjacent_only):
        result = ch05.check_first_leak(wrong, verbose=False)
        assert not result, wrong.__name__
        assert "one input j at a time" in result.message, (wrong.__name__, result.message)
    assert ch05.check_first_leak(first_leak_correct, verbose=False)


def test_leak_of_5e5_names_the_tolerance_for_a_looser_test():
    """A test sound in idea but with tolerance 1e-4 misses the 5e-5 leak and is told the rule."""
    result = ch05.check_first_leak(first_leak_tolerance_1e4, verbose=False)
    assert not result and "more than 1e-5, absolute" in result.message, result.message


def test_small_perturbation_gets_the_gate_hint():
    result = ch05.check_first_leak(first_leak_small_perturbation, verbose=False)
    assert not result and "small perturbation" in result.message, result.message


def test_window_exercise_refusal_says_how_to_build_it():
    from companion.masking import causal_mask

    def via_causal_mask(q_len, k_len, window):
        return causal_mask(q_len, k_len)

    result = ch05.check_causal_window_mask(via_causal_mask, verbose=False)
    assert not result and "torch.arange" in result.message, result.message


def test_lengths_mask_hints_name_the_inverted_mask_and_the_off_by_one():
    def inverted(lengths, k_len, left):
        return ~ch05.reference_lengths_padding_mask(lengths, k_len, left)

    def one_too_many(lengths, k_len, left):  # positions <= lengths, right padding
        positions = torch.arange(k_len)
        if left:
            return (positions >= k_len - lengths[:, None] - 1)[:, None, None, :]
        return (positions <= lengths[:, None])[:, None, None, :]

    result = ch05.check_lengths_padding_mask(inverted, verbose=False)
    assert not result and "inverted" in result.message, result.message
    result = ch05.check_lengths_padding_mask(one_too_many, verbose=False)
    assert not result and "<, not <=" in result.message, result.message


def test_lengths_mask_hint_names_a_query_mask():
    def query_mask(lengths, k_len, left):  # the lengths on the query axis: (batch, 1, k_len, 1)
        return ch05.reference_lengths_padding_mask(lengths, k_len, left).transpose(-1, -2)

    result = ch05.check_lengths_padding_mask(query_mask, verbose=False)
    assert not result and "query axis" in result.message, result.message
