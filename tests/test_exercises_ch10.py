"""Chapter 10 exercise checks: right answers pass, plausible wrong answers fail (a batch of prefix
masks that leaks the future into the prefix or uses one row's prefix for every row, BERT
masking that touches padding or special tokens or gets the 15% / 80-10-10 proportions wrong, top-k without renormalising, temperature applied to
probabilities, patches cut by a plain reshape, an unpaired standard error that adds the two models' errors or
ignores the clusters, ...), stubs are reported without raising."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.data import masked_lm_example, prefix_lm_example
from companion.decode import sampling_distribution
from companion.exercises import ch10
from companion.masking import causal_mask, prefix_lm_mask
from companion.metrics import clustered_se

# --------------------------------------------------------------------------------------------
# prefix_lm_mask: a batch of prefix-LM masks, one prefix length per row
# --------------------------------------------------------------------------------------------


def per_row(single):
    """A batched answer built from a one-row rule (seq_len, prefix_len) -> (seq_len, seq_len)."""

    def batched(seq_len, prefix_lens):
        return torch.stack([single(seq_len, int(p)) for p in prefix_lens])

    batched.__name__ = single.__name__
    return batched


def prefix_loops(seq_len, prefix_len):
    mask = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    for i in range(seq_len):
        for j in range(seq_len):
            mask[i, j] = j <= i or j < prefix_len
    return mask


def prefix_causal_or_block(seq_len, prefix_len):
    block = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    block[:prefix_len, :prefix_len] = True
    return torch.ones(seq_len, seq_len, dtype=torch.bool).tril() | block


def prefix_causal_only(seq_len, prefix_len):
    return torch.ones(seq_len, seq_len, dtype=torch.bool).tril()


def prefix_everything(seq_len, prefix_len):
    return torch.ones(seq_len, seq_len, dtype=torch.bool)


def prefix_rows_see_all(seq_len, prefix_len):  # the prefix reads the future continuation
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j <= i) | (i < prefix_len)


def prefix_off_by_one(seq_len, prefix_len):
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j <= i) | (j <= prefix_len)


def prefix_counted_from_one(seq_len, prefix_len):
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j <= i) | (j < prefix_len - 1)


def prefix_block_diagonal(seq_len, prefix_len):  # the continuation does not see the prefix
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    in_prefix = (i < prefix_len) & (j < prefix_len)
    return in_prefix | ((i >= prefix_len) & (j >= prefix_len) & (j <= i))


def prefix_strictly_causal(seq_len, prefix_len):  # j < i: a query no longer sees itself
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j < i) | (j < prefix_len)


def prefix_first_row_for_all(seq_len, prefix_lens):  # one prefix for the whole batch
    return torch.stack([prefix_lm_mask(seq_len, int(prefix_lens[0]))] * len(prefix_lens))


def prefix_longest_for_all(seq_len, prefix_lens):
    return torch.stack([prefix_lm_mask(seq_len, int(prefix_lens.max()))] * len(prefix_lens))


def prefix_query_axis_broadcast(seq_len, prefix_lens):  # prefix lengths laid along the queries
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j <= i)[None] | (j[None] < prefix_lens[None, :, None])


def prefix_no_batch_axis(seq_len, prefix_lens):  # (batch, seq_len) | (seq_len, seq_len)
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j <= i) | (j < prefix_lens[:, None])


def test_prefix_mask_accepts_correct():
    for fn in [
        ch10.reference_prefix_lm_mask,
        per_row(prefix_loops),
        per_row(prefix_causal_or_block),
    ]:
        assert ch10.check_prefix_lm_mask(fn, verbose=False), fn.__name__


def prefix_example_masks(seq_len, prefix_lens):  # the objective's mask, row by row
    row = torch.arange(1, seq_len + 2)  # no pad id
    return torch.stack([prefix_lm_example(row, int(p)).mask for p in prefix_lens])


def prefix_causal_mask_or_block(seq_len, prefix_lens):  # broadcast, but calls causal_mask
    key = torch.arange(seq_len)[None, None, :]
    return causal_mask(seq_len)[None] | (key < prefix_lens[:, None, None])


@pytest.mark.parametrize(
    "via_package",
    [per_row(prefix_lm_mask), prefix_example_masks, prefix_causal_mask_or_block],
    ids=lambda fn: fn.__name__,
)
def test_prefix_mask_refuses_the_package(via_package):
    for case in ch10._prefix_cases()[:3]:  # the package's masks are right ...
        assert torch.equal(via_package(**case), ch10.reference_prefix_lm_mask(**case))
    result = ch10.check_prefix_lm_mask(via_package, verbose=False)
    assert not result, "... and refused"
    assert "build the masks yourself" in result.message, result.message


@pytest.mark.parametrize(
    "wrong",
    [
        per_row(prefix_causal_only),
        per_row(prefix_everything),
        per_row(prefix_rows_see_all),
        per_row(prefix_off_by_one),
        per_row(prefix_counted_from_one),
        per_row(prefix_block_diagonal),
        per_row(prefix_strictly_causal),
        prefix_first_row_for_all,
        prefix_longest_for_all,
        prefix_query_axis_broadcast,
        prefix_no_batch_axis,
    ],
    ids=lambda fn: fn.__name__,
)
def test_prefix_mask_rejects_wrong(wrong):
    assert not ch10.check_prefix_lm_mask(wrong, verbose=False)


def test_prefix_cases_hold_the_traps():
    cases = ch10._prefix_cases()
    assert any(len(set(c["prefix_lens"].tolist())) > 1 for c in cases), "rows that differ"
    assert any(len(c["prefix_lens"]) == c["seq_len"] for c in cases), "batch == seq_len"
    lens = [(int(p), c["seq_len"]) for c in cases for p in c["prefix_lens"]]
    assert any(p == 0 for p, _ in lens) and any(p == n for p, n in lens), "empty and full prefixes"


def test_prefix_transposed_is_rejected():
    def transposed(seq_len, prefix_lens):
        return ch10.reference_prefix_lm_mask(seq_len, prefix_lens).transpose(1, 2)

    assert not ch10.check_prefix_lm_mask(transposed, verbose=False)


def prefix_float(seq_len, prefix_lens):  # right values, float 0/1: blocks nothing in SDPA
    return ch10.reference_prefix_lm_mask(seq_len, prefix_lens).float()


def prefix_long(seq_len, prefix_lens):  # right values, integer 0/1
    return ch10.reference_prefix_lm_mask(seq_len, prefix_lens).long()


@pytest.mark.parametrize("wrong", [prefix_float, prefix_long])
def test_prefix_mask_rejects_a_non_boolean_mask_and_says_why(wrong):
    result = ch10.check_prefix_lm_mask(wrong, verbose=False)
    assert not result
    assert "must be a bool tensor" in result.message and "dtype torch." in result.message
    # the float answer is told why a float mask blocks nothing; the integer one is not
    assert ("adds a float mask to the scores" in result.message) == (wrong is prefix_float)


def test_prefix_reference_is_the_package_mask_row_by_row():
    for case in ch10._prefix_cases():
        got = ch10.reference_prefix_lm_mask(**case)
        for row, prefix_len in enumerate(case["prefix_lens"].tolist()):
            assert torch.equal(got[row], prefix_lm_mask(case["seq_len"], prefix_len))


# --------------------------------------------------------------------------------------------
# bert_mask
# --------------------------------------------------------------------------------------------


def ordinary_ids(vocab_size, special_ids):
    return torch.tensor([i for i in range(vocab_size) if i not in special_ids])


def bert_huggingface_style(tokens, mask_id, vocab_size, special_ids, generator):
    """Three Bernoulli draws, as Hugging Face's DataCollatorForLanguageModeling does."""
    ordinary = ordinary_ids(vocab_size, special_ids)
    real = ~torch.isin(tokens, torch.tensor(special_ids))
    chance = torch.full(tokens.shape, 0.15).masked_fill(~real, 0.0)
    selected = torch.bernoulli(chance, generator=generator).bool()
    masked = torch.bernoulli(torch.full(tokens.shape, 0.8), generator=generator).bool() & selected
    randomised = (
        torch.bernoulli(torch.full(tokens.shape, 0.5), generator=generator).bool()
        & selected
        & ~masked
    )
    drawn = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
    inputs = torch.where(masked, mask_id, tokens)
    inputs = torch.where(randomised, drawn, inputs)
    return inputs, torch.where(selected, tokens, 0)


def bert_loops(tokens, mask_id, vocab_size, special_ids, generator):
    ordinary = ordinary_ids(vocab_size, special_ids).tolist()
    inputs, targets = tokens.clone(), torch.zeros_like(tokens)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            token = int(tokens[b, t])
            if token in special_ids or float(torch.rand(1, generator=generator)) >= 0.15:
                continue
            targets[b, t] = token
            r = float(torch.rand(1, generator=generator))
            if r < 0.8:
                inputs[b, t] = mask_id
            elif r < 0.9:
                inputs[b, t] = ordinary[
                    int(torch.randint(len(ordinary), (1,), generator=generator))
                ]
    return inputs, targets


def bert_via_companion(tokens, mask_id, vocab_size, special_ids, generator):
    example = masked_lm_example(
        tokens, mask_id=mask_id, vocab_size=vocab_size, special_ids=special_ids, generator=generator
    )
    return example.inputs, example.targets


def bert_never_the_original(tokens, mask_id, vocab_size, special_ids, generator):
    """Random replacements that always differ from the original token: also correct."""
    ordinary = ordinary_ids(vocab_size, special_ids)
    inputs, targets = bert_huggingface_style(tokens, mask_id, vocab_size, special_ids, generator)
    same = (inputs == tokens) & (targets != 0)
    redraw = torch.rand(tokens.shape, generator=generator) < 1 / 9  # the share of a 10% draw
    others = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
    swap = same & redraw & (others != tokens)
    return torch.where(swap, others, inputs), targets


def bert_redraws_until_different(tokens, mask_id, vocab_size, special_ids, generator):
    """The reference, but a random draw equal to the original token is drawn again: the 10%
    'random' share then never looks kept, so too many positions change."""
    ordinary = ordinary_ids(vocab_size, special_ids)
    real = ~torch.isin(tokens, torch.tensor(list(special_ids)))
    selected = real & (torch.rand(tokens.shape, generator=generator) < 0.15)
    split = torch.rand(tokens.shape, generator=generator)
    to_mask, to_random = selected & (split < 0.8), selected & (split >= 0.8) & (split < 0.9)
    drawn = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
    while (clash := to_random & (drawn == tokens)).any():
        again = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
        drawn = torch.where(clash, again, drawn)
    inputs = torch.where(to_random, drawn, tokens.masked_fill(to_mask, mask_id))
    return inputs, tokens.masked_fill(~selected, 0)


def _with(name, **changes):
    """A masking function like the reference, with some of its rules changed."""

    def masking(tokens, mask_id, vocab_size, special_ids, generator):
        rules = {
            "select": 0.15,
            "mask": 0.8,
            "random": 0.1,
            "eligible": ~torch.isin(tokens, torch.tensor(special_ids)),
            "ordinary": ordinary_ids(vocab_size, special_ids),
        }
        rules |= {
            k: (v(tokens, vocab_size, special_ids) if callable(v) else v)
            for k, v in changes.items()
        }
        selected = rules["eligible"] & (
            torch.rand(tokens.shape, generator=generator) < rules["select"]
        )
        split = torch.rand(tokens.shape, generator=generator)
        to_mask = selected & (split < rules["mask"])
        to_random = selected & (split >= rules["mask"]) & (split < rules["mask"] + rules["random"])
        ordinary = rules["ordinary"]
        drawn = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
        inputs = torch.where(to_random, drawn, tokens.masked_fill(to_mask, mask_id))
        return inputs, tokens.masked_fill(~selected, 0)

    masking.__name__ = name
    return masking


bert_masks_padding = _with(
    "bert_masks_padding", eligible=lambda tokens, v, s: torch.ones_like(tokens, dtype=torch.bool)
)
# only padding left alone: <bos>, <eos> and <unk> may be selected
bert_masks_specials = _with("bert_masks_specials", eligible=lambda tokens, v, s: tokens != 0)
bert_random_from_whole_vocab = _with(
    "bert_random_from_whole_vocab", ordinary=lambda tokens, v, s: torch.arange(v)
)
bert_random_after_specials = _with(
    "bert_random_after_specials", ordinary=lambda tokens, v, s: torch.arange(len(s), v)
)
bert_selects_12_percent = _with("bert_selects_12_percent", select=0.12)
bert_selects_20_percent = _with("bert_selects_20_percent", select=0.20)
bert_80_20_0 = _with("bert_80_20_0", random=0.2)
bert_90_5_5 = _with("bert_90_5_5", mask=0.9, random=0.05)
bert_85_10_5 = _with("bert_85_10_5", mask=0.85)
# special_ids ignored: <pad> <bos> <eos> <unk> and mask_id hard-coded, or "token > 3"; the
# fourth layout's sentinels (ids 21 to 23, in special_ids) are then selected and drawn
# (special_ids[4] is mask_id in every layout)
bert_hard_coded_specials = _with(
    "bert_hard_coded_specials",
    eligible=lambda tokens, v, s: ~torch.isin(tokens, torch.tensor([0, 1, 2, 3, s[4]])),
    ordinary=lambda tokens, v, s: ordinary_ids(v, [0, 1, 2, 3, s[4]]),
)
bert_above_three = _with(
    "bert_above_three",
    eligible=lambda tokens, v, s: tokens > 3,
    ordinary=lambda tokens, v, s: torch.tensor([i for i in range(4, v) if i not in s[4:5]]),
)
bert_hard_coded_selection_only = _with(
    "bert_hard_coded_selection_only",
    eligible=lambda tokens, v, s: ~torch.isin(tokens, torch.tensor([0, 1, 2, 3, s[4]])),
)
bert_hard_coded_draws_only = _with(
    "bert_hard_coded_draws_only",
    ordinary=lambda tokens, v, s: ordinary_ids(v, [0, 1, 2, 3, s[4]]),
)


def bert_random_from_four_up(tokens, mask_id, vocab_size, special_ids, generator):
    """Random ids from 4 .. vocab_size - 1 ("skip <pad> <bos> <eos> <unk>"): forgets that
    [MASK] is special too, so some random replacements are [MASK]."""
    real = ~torch.isin(tokens, torch.tensor(special_ids))
    selected = real & (torch.rand(tokens.shape, generator=generator) < 0.15)
    split = torch.rand(tokens.shape, generator=generator)
    drawn = torch.randint(4, vocab_size, tokens.shape, generator=generator)
    inputs = torch.where(selected & (split >= 0.8) & (split < 0.9), drawn, tokens)
    inputs = inputs.masked_fill(selected & (split < 0.8), mask_id)
    return inputs, tokens.masked_fill(~selected, 0)


def bert_independent_draws(tokens, mask_id, vocab_size, special_ids, generator):
    """[MASK] for 80% and a random token for 10% of the selected, drawn independently: the
    random draw overwrites some masks (72% masked, 10% random, 18% unchanged)."""
    ordinary = ordinary_ids(vocab_size, special_ids)
    real = ~torch.isin(tokens, torch.tensor(special_ids))
    selected = real & (torch.rand(tokens.shape, generator=generator) < 0.15)
    to_mask = selected & (torch.rand(tokens.shape, generator=generator) < 0.8)
    to_random = selected & (torch.rand(tokens.shape, generator=generator) < 0.1)
    drawn = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
    inputs = torch.where(to_random, drawn, tokens.masked_fill(to_mask, mask_id))
    return inputs, tokens.masked_fill(~selected, 0)


def bert_floor_count(tokens, mask_id, vocab_size, special_ids, generator):
    """int(15% of each sentence's real tokens) positions: short sentences get none."""
    inputs, targets = tokens.clone(), torch.zeros_like(tokens)
    real = ~torch.isin(tokens, torch.tensor(special_ids))
    for row in range(tokens.shape[0]):
        positions = real[row].nonzero().flatten()
        count = int(0.15 * len(positions))
        chosen = positions[torch.randperm(len(positions), generator=generator)[:count]]
        targets[row, chosen] = tokens[row, chosen]
        inputs[row, chosen] = mask_id  # and all of them masked
    return inputs, targets


def _bert_fixed_count(name, minimum):
    """BERT's own rule: round(15% of each row's real tokens) positions (at least `minimum`),
    then the 80/10/10 split; the selection rate is right, the per-row spread is not."""

    def masking(tokens, mask_id, vocab_size, special_ids, generator):
        ordinary = ordinary_ids(vocab_size, special_ids)
        real = ~torch.isin(tokens, torch.tensor(special_ids))
        selected = torch.zeros_like(real)
        for row in range(tokens.shape[0]):
            positions = real[row].nonzero().flatten()
            count = min(len(positions), max(minimum, round(0.15 * len(positions))))
            selected[
                row, positions[torch.randperm(len(positions), generator=generator)[:count]]
            ] = True
        split = torch.rand(tokens.shape, generator=generator)
        drawn = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
        inputs = torch.where(selected & (split >= 0.8) & (split < 0.9), drawn, tokens)
        inputs = inputs.masked_fill(selected & (split < 0.8), mask_id)
        return inputs, tokens.masked_fill(~selected, 0)

    masking.__name__ = name
    return masking


bert_round_count = _bert_fixed_count("bert_round_count", 0)
bert_round_count_at_least_one = _bert_fixed_count("bert_round_count_at_least_one", 1)


def bert_loss_everywhere(tokens, mask_id, vocab_size, special_ids, generator):
    inputs, _ = ch10.reference_bert_masking(tokens, mask_id, vocab_size, special_ids, generator)
    return inputs, tokens.clone()  # a target at every position, padding included


def bert_loss_on_every_real_token(tokens, mask_id, vocab_size, special_ids, generator):
    inputs, _ = ch10.reference_bert_masking(tokens, mask_id, vocab_size, special_ids, generator)
    real = ~torch.isin(tokens, torch.tensor(special_ids))
    return inputs, tokens.masked_fill(~real, 0)


def bert_targets_are_inputs(tokens, mask_id, vocab_size, special_ids, generator):
    inputs, targets = ch10.reference_bert_masking(
        tokens, mask_id, vocab_size, special_ids, generator
    )
    return inputs, torch.where(targets != 0, inputs, 0)  # [MASK] as the target


def bert_global_generator(tokens, mask_id, vocab_size, special_ids, generator):
    """Right proportions, but the random numbers come from the global generator."""
    return ch10.reference_bert_masking(tokens, mask_id, vocab_size, special_ids, None)


def bert_one_tensor(tokens, mask_id, vocab_size, special_ids, generator):
    return ch10.reference_bert_masking(tokens, mask_id, vocab_size, special_ids, generator)[0]


def _bert_random_from(name, source):
    """HF-style masking, but each random replacement comes from `source(tokens, real,
    selected, generator)` instead of a uniform draw over the ordinary ids."""

    def masking(tokens, mask_id, vocab_size, special_ids, generator):
        real = ~torch.isin(tokens, torch.tensor(special_ids))
        selected = real & (torch.rand(tokens.shape, generator=generator) < 0.15)
        split = torch.rand(tokens.shape, generator=generator)
        drawn = source(tokens, real, selected, generator)
        inputs = torch.where(selected & (split >= 0.8) & (split < 0.9), drawn, tokens)
        inputs = inputs.masked_fill(selected & (split < 0.8), mask_id)
        return inputs, tokens.masked_fill(~selected, 0)

    masking.__name__ = name
    return masking


def _from_the_batch(tokens, real, selected, generator):
    pool = tokens[real]  # every real token of the batch
    return pool[torch.randint(len(pool), tokens.shape, generator=generator)]


def _from_the_row(tokens, real, selected, generator):
    drawn = tokens.clone()
    for row in range(tokens.shape[0]):
        pool = tokens[row][real[row]]
        drawn[row] = pool[torch.randint(len(pool), (tokens.shape[1],), generator=generator)]
    return drawn


def _shuffle_the_selected(tokens, real, selected, generator):
    drawn = tokens.clone()
    chosen = tokens[selected]
    drawn[selected] = chosen[torch.randperm(len(chosen), generator=generator)]
    return drawn


bert_random_from_the_batch = _bert_random_from("bert_random_from_the_batch", _from_the_batch)
bert_random_from_the_row = _bert_random_from("bert_random_from_the_row", _from_the_row)
bert_shuffles_the_selected = _bert_random_from("bert_shuffles_the_selected", _shuffle_the_selected)


@pytest.mark.parametrize(
    "wrong", [bert_random_from_the_batch, bert_random_from_the_row, bert_shuffles_the_selected]
)
def test_bert_masking_rejects_replacements_from_the_batchs_tokens(wrong):
    """The batch's tokens look like plausible noise words, but on skewed word frequencies
    they are far from uniform: the fifth layout's chi-square test refuses them."""
    result = ch10.check_bert_masking(wrong, verbose=False)
    assert not result
    assert "not uniform over the ordinary ids" in result.message, result.message


def test_uniformity_test_has_a_skewed_layout():
    """One layout's most frequent ordinary id is about half of its words."""
    setting = ch10._masking_settings()[4]
    words = torch.cat([t[t > 4] for t in setting.batches])
    assert torch.bincount(words).max() / len(words) > 0.4


def test_bert_masking_accepts_correct():
    for fn in [
        ch10.reference_bert_masking,
        bert_huggingface_style,
        bert_loops,
        bert_never_the_original,
        _with("bert_rules_unchanged"),
    ]:
        assert ch10.check_bert_masking(fn, verbose=False), fn.__name__


def test_bert_masking_refuses_the_package():
    tokens = torch.tensor([[2, 5, 6, 7, 3, 0]])
    inputs, targets = bert_via_companion(tokens, 4, 12, [0, 1, 2, 3, 4], torch.Generator())
    assert inputs.shape == targets.shape == tokens.shape  # the package answers ...
    result = ch10.check_bert_masking(bert_via_companion, verbose=False)
    assert not result, "... and is refused"
    assert "masked_lm_example" in result.message, result.message


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (bert_masks_padding, "holds padding"),
        (bert_masks_specials, "holds a special token"),
        (bert_random_from_whole_vocab, "a special id, as a random replacement"),
        (bert_random_after_specials, "never used the ordinary id(s) [4]"),
        (bert_random_from_four_up, "can a random draw be mask_id?"),
        (bert_selects_12_percent, "selected / real tokens"),
        (bert_selects_20_percent, "selected / real tokens"),
        (bert_80_20_0, "are 10% of the selected tokens kept unchanged?"),
        (bert_redraws_until_different, "do not redraw until it differs"),
        (bert_90_5_5, "[MASK] / selected"),
        (bert_85_10_5, "[MASK] / selected"),
        (bert_hard_coded_specials, "take the special ids from special_ids"),
        (bert_above_three, "take the special ids from special_ids"),
        (bert_hard_coded_selection_only, "take the special ids from special_ids"),
        (bert_hard_coded_draws_only, "a special id, as a random replacement"),
        (bert_independent_draws, "[MASK] / selected"),
        (bert_floor_count, "selected / real tokens"),
        (bert_round_count, "per row spreads too little"),
        (bert_round_count_at_least_one, "per row spreads too little"),
        (bert_loss_everywhere, "holds a special token"),
        (bert_loss_on_every_real_token, "selected / real tokens"),
        (bert_targets_are_inputs, "a selected position's target is its original token"),
        (bert_global_generator, "seeded alike"),
        (bert_one_tensor, "return a pair"),
    ],
)
def test_bert_masking_rejects_wrong(wrong, message):
    result = ch10.check_bert_masking(wrong, verbose=False)
    assert not result
    assert message in result.message, result.message


def test_bert_masking_cases_are_large_enough_for_the_bounds():
    """With at least 33,000 real tokens per layout the 5-standard-deviation band of the
    selection rate is ±0.010 and that of the [MASK] share about ±0.029: a 12% or 20%
    selection, or an 85/10/5 split, falls outside; every ordinary id is expected about 20
    times among the random replacements."""
    for setting in ch10._masking_settings():
        special = torch.tensor(setting.special_ids)
        real = sum(int((~torch.isin(t, special)).sum()) for t in setting.batches)
        assert 30_000 < real < 110_000
        assert ch10.Z_BOUND * math.sqrt(0.15 * 0.85 / real) < 0.011
        selected = 0.15 * real
        assert ch10.Z_BOUND * math.sqrt(0.8 * 0.2 / selected) < 0.03
        ordinary = setting.vocab_size - len(setting.special_ids)
        assert 0.1 * selected / ordinary > 18
        assert all(t.min() >= 0 and (t[:, 0] == 1).all() for t in setting.batches)
        assert any(bool((t == 3).any()) for t in setting.batches)  # some <unk> to leave alone
        assert any(bool((t == 0).any()) for t in setting.batches)  # and padding
        for sentinel in set(setting.special_ids) - {0, 1, 2, 3, setting.mask_id}:
            assert any(bool((t == sentinel).any()) for t in setting.batches)  # in the text


def test_bert_masking_has_a_layout_with_sentinels():
    """special_ids is not always <pad> <bos> <eos> <unk> and mask_id: one layout adds
    sentinels, and its batches hold them (a hard-coded list would select them)."""
    layouts = [(s.special_ids, s.mask_id) for s in ch10._masking_settings()]
    assert any(set(ids) - {0, 1, 2, 3, mask_id} for ids, mask_id in layouts), layouts


def test_reference_masking_sits_well_inside_the_bounds():
    for setting in ch10._masking_settings():
        results = [
            ch10.reference_bert_masking(
                tokens, setting.mask_id, setting.vocab_size, setting.special_ids, generator
            )
            for tokens, generator in zip(setting.batches, map(ch10.seeded_generator, setting.seeds))
        ]
        assert ch10._masking_statistics(setting, results) is None
        special = torch.tensor(setting.special_ids)
        real = sum(int((~torch.isin(t, special)).sum()) for t in setting.batches)
        selected = sum(int((targets != 0).sum()) for _, targets in results)
        z = (selected / real - 0.15) / math.sqrt(0.15 * 0.85 / real)
        assert abs(z) < 3


def test_fixed_counts_pass_the_selection_rate_and_fail_only_the_spread():
    """BERT's per-row rule is caught by the dispersion test alone: its selection rate is
    within the bounds, so without that test the check would accept it."""
    for setting in ch10._masking_settings():
        for wrong in (bert_round_count, bert_round_count_at_least_one):
            results = [
                wrong(tokens, setting.mask_id, setting.vocab_size, setting.special_ids, generator)
                for tokens, generator in zip(
                    setting.batches, map(ch10.seeded_generator, setting.seeds)
                )
            ]
            special = torch.tensor(setting.special_ids)
            real = sum(int((~torch.isin(t, special)).sum()) for t in setting.batches)
            selected = sum(int((targets != 0).sum()) for _, targets in results)
            assert ch10._proportion_problem("selected", selected, real, 0.15) is None
            assert "spreads too little" in ch10._dispersion_problem(setting, results)


@pytest.mark.parametrize("correct", [ch10.reference_bert_masking, bert_huggingface_style])
def test_dispersion_accepts_independent_draws_across_seeds(correct):
    """The dispersion bound is 5 standard deviations: 30 other seed sets all pass, and their
    statistics sit near the mean (|z| < 4 for every one)."""
    for setting in ch10._masking_settings():
        special = torch.tensor(setting.special_ids)
        p, q = 0.15, 0.85
        for offset in range(1, 16):
            results = [
                correct(tokens, setting.mask_id, setting.vocab_size, setting.special_ids,
                        ch10.seeded_generator(seed + 100_003 * offset))
                for tokens, seed in zip(setting.batches, setting.seeds)
            ]  # fmt: skip
            assert ch10._dispersion_problem(setting, results) is None, offset
            statistic = mean = variance = 0.0
            for tokens, (_, targets) in zip(setting.batches, results):
                n = (~torch.isin(tokens, special)).sum(dim=1).double()
                c = (targets != 0).sum(dim=1).double()
                statistic += float(((c - n * p) ** 2 / (n * p * q)).sum())
                mean += len(n)
                variance += float((2 + (1 - 6 * p * q) / (n * p * q)).sum())
            assert abs(statistic - mean) < 4 * math.sqrt(variance), (offset, statistic, mean)


def test_small_layout_separates_mask_from_random_draws_across_seeds():
    """In the 7-id layout (two ordinary ids, [MASK] the last id) drawing random ids from
    4 .. vocab_size - 1 puts the [MASK] share near 0.833, outside the band around 0.8, for
    every one of 10 seed sets; the reference and Hugging Face's three Bernoulli draws pass
    all of them."""
    setting = ch10._masking_settings()[2]
    assert (setting.vocab_size, setting.special_ids, setting.mask_id) == (7, (0, 1, 2, 3, 6), 6)
    for offset in range(10):
        seeds = [seed + 100_003 * offset for seed in setting.seeds]
        for fn in (ch10.reference_bert_masking, bert_huggingface_style, bert_random_from_four_up):
            results = [
                fn(tokens, setting.mask_id, setting.vocab_size, setting.special_ids,
                   ch10.seeded_generator(seed))
                for tokens, seed in zip(setting.batches, seeds)
            ]  # fmt: skip
            problem = ch10._masking_statistics(setting, results)
            if fn is bert_random_from_four_up:
                assert problem is not None and "[MASK] / selected" in problem, (offset, problem)
            else:
                assert problem is None, (fn.__name__, offset, problem)


def test_dispersion_rejects_too_much_spread():
    """Half the rows selected at 5%, half at 25%: the overall rate is 15% but the counts
    spread more than binomial ones."""
    setting = ch10._masking_settings()[0]
    results = []
    for tokens, seed in zip(setting.batches, setting.seeds):
        g = ch10.seeded_generator(seed)
        rate = torch.where(torch.arange(tokens.shape[0]) % 2 == 0, 0.05, 0.25)[:, None]
        real = ~torch.isin(tokens, torch.tensor(setting.special_ids))
        selected = real & (torch.rand(tokens.shape, generator=g) < rate)
        results.append(
            (tokens.masked_fill(selected, setting.mask_id), tokens.masked_fill(~selected, 0))
        )
    assert "spreads too much" in ch10._dispersion_problem(setting, results)


# --------------------------------------------------------------------------------------------
# sample_next_token
# --------------------------------------------------------------------------------------------


def _top_k_keep_ties(logits, top_k):
    if top_k is None:
        return logits
    kth = logits.topk(top_k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def _inverse_cdf(probs, uniform):
    cumulative = probs.cumsum(dim=-1)
    return torch.searchsorted(cumulative, uniform[:, None].to(cumulative.dtype), right=True)[:, 0]


def sample_float32(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k) / temperature, dim=-1)
    return _inverse_cdf(probs, uniform).clamp(max=logits.shape[-1] - 1)


def sample_from_companion(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = sampling_distribution(logits.double(), temperature, top_k)
    return _inverse_cdf(probs, uniform)


def sample_cumsum_at_least(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k) / temperature, dim=-1)
    return (probs.cumsum(-1) < uniform[:, None]).sum(-1)  # first t with cumsum >= u: wrong at u = 0


def sample_power_of_probabilities(logits, temperature, top_k, uniform):
    """p ** (1 / T), renormalised, is softmax(logits / T): also correct."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits.double(), top_k), dim=-1) ** (1 / temperature)
    return _inverse_cdf(probs / probs.sum(-1, keepdim=True), uniform)


def sample_top_k_after_softmax_not_renormalised(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k is not None:
        probs = probs.masked_fill(_top_k_keep_ties(logits, top_k) == -math.inf, 0.0)
    return _inverse_cdf(probs, uniform).clamp(max=logits.shape[-1] - 1)


def sample_temperature_on_probabilities(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k), dim=-1) / temperature
    return _inverse_cdf(probs / probs.sum(-1, keepdim=True), uniform)  # T cancels out


def sample_temperature_on_probabilities_unnormalised(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k), dim=-1) / temperature
    return _inverse_cdf(probs, uniform).clamp(max=logits.shape[-1] - 1)


def sample_temperature_multiplied(logits, temperature, top_k, uniform):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k) * temperature, dim=-1)
    return _inverse_cdf(probs, uniform).clamp(max=logits.shape[-1] - 1)


def sample_strict_top_k(logits, temperature, top_k, uniform):
    """Keeps the logits *above* the k-th largest: only k - 1 tokens."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits <= kth, -math.inf)
    return _inverse_cdf(torch.softmax(logits / temperature, dim=-1), uniform).clamp(
        max=logits.shape[-1] - 1
    )


def sample_sorted_position(logits, temperature, top_k, uniform):
    """Sorts the probabilities and returns the position in the sorted order, not the id."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k) / temperature, dim=-1)
    ordered = probs.sort(dim=-1, descending=True).values
    return _inverse_cdf(ordered, uniform).clamp(max=logits.shape[-1] - 1)


def sample_sorted_order(logits, temperature, top_k, uniform):
    """A valid sampler, but it walks the tokens from most to least likely, not in id order."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_top_k_keep_ties(logits, top_k) / temperature, dim=-1)
    ordered, order = probs.sort(dim=-1, descending=True)
    position = _inverse_cdf(ordered, uniform).clamp(max=logits.shape[-1] - 1)
    return order.gather(-1, position[:, None])[:, 0]


def sample_top_k_exactly_k(logits, temperature, top_k, uniform):
    """torch.topk + scatter keeps exactly k tokens, dropping some of those tied with the k-th."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if top_k is not None:
        values, indices = logits.topk(top_k, dim=-1)
        logits = torch.full_like(logits, -math.inf).scatter(-1, indices, values)
    return _inverse_cdf(torch.softmax(logits / temperature, dim=-1), uniform).clamp(
        max=logits.shape[-1] - 1
    )


def sample_tiny_temperature_for_greedy(logits, temperature, top_k, uniform):
    """Temperature 0 replaced by 1e-6: a tie for the maximum is split, not broken."""
    temperature = max(temperature, 1e-6)
    probs = torch.softmax(_top_k_keep_ties(logits.double(), top_k) / temperature, dim=-1)
    return _inverse_cdf(probs, uniform).clamp(max=logits.shape[-1] - 1)


def sample_greedy_last_maximum(logits, temperature, top_k, uniform):
    if temperature == 0:
        flipped = logits.flip(-1).argmax(dim=-1)
        return logits.shape[-1] - 1 - flipped
    return sample_float32(logits, temperature, top_k, uniform)


def sample_divides_by_zero(logits, temperature, top_k, uniform):
    probs = torch.softmax(_top_k_keep_ties(logits, top_k) / temperature, dim=-1)  # NaN at T = 0
    return _inverse_cdf(probs, uniform).clamp(max=logits.shape[-1] - 1)


def sample_last_id_at_most_u(logits, temperature, top_k, uniform):
    """Off by one: the last id whose cumulative probability is at most u."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = sampling_distribution(logits.double(), temperature, top_k)
    return ((probs.cumsum(-1) <= uniform.double()[:, None]).sum(-1) - 1).clamp(min=0)


def sample_cumulated_from_the_last_id(logits, temperature, top_k, uniform):
    """A valid sampler, but it accumulates from the highest id down."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = sampling_distribution(logits.double(), temperature, top_k).flip(-1)
    position = (probs.cumsum(-1) <= uniform.double()[:, None]).sum(-1)
    return (logits.shape[-1] - 1 - position).clamp(min=0)


def sample_greedy_reads_the_uniform(logits, temperature, top_k, uniform):
    """Temperature 0 treated as a draw from the top-1 token set, but with u: the tie rule lost."""
    if temperature == 0:
        largest = logits == logits.max(dim=-1, keepdim=True).values  # (batch, vocab)
        weights = largest.double() / largest.sum(-1, keepdim=True)
        return (weights.cumsum(-1) <= uniform.double()[:, None]).sum(-1)
    return ch10.reference_sample_next_token(logits, temperature, top_k, uniform)


def test_sampling_accepts_correct():
    for fn in [
        ch10.reference_sample_next_token,
        sample_float32,
        sample_from_companion,
        sample_power_of_probabilities,
    ]:
        assert ch10.check_sample_next_token(fn, verbose=False), fn.__name__


@pytest.mark.parametrize(
    "wrong",
    [
        sample_top_k_after_softmax_not_renormalised,
        sample_temperature_on_probabilities,
        sample_temperature_on_probabilities_unnormalised,
        sample_temperature_multiplied,
        sample_strict_top_k,
        sample_sorted_position,
        sample_sorted_order,
        sample_top_k_exactly_k,
        sample_tiny_temperature_for_greedy,
        sample_greedy_last_maximum,
        sample_divides_by_zero,
        sample_last_id_at_most_u,
        sample_cumulated_from_the_last_id,
        sample_greedy_reads_the_uniform,
    ],
)
def test_sampling_rejects_wrong(wrong):
    assert not ch10.check_sample_next_token(wrong, verbose=False)


def test_sampling_reference_draws_from_sampling_distribution():
    """Over many uniform numbers, the reference's tokens follow companion.decode's
    distribution: inverse-CDF sampling is sampling."""
    g = torch.Generator().manual_seed(5)
    logits = 2.0 * torch.randn(1, 7, generator=g).expand(40_000, 7)
    uniform = torch.rand(40_000, generator=g)
    tokens = ch10.reference_sample_next_token(logits, 0.8, 4, uniform)
    frequencies = torch.bincount(tokens, minlength=7).double() / 40_000
    expected = sampling_distribution(logits[0].double(), 0.8, 4)
    assert float((frequencies - expected).abs().max()) < 0.01
    assert bool((frequencies[expected == 0] == 0).all())


def test_sampling_cases_hold_the_traps():
    cases = ch10._sampling_cases()
    greedy_ties = [
        c
        for c in cases
        if c["temperature"] == 0
        and bool((c["logits"] == c["logits"].max(-1, keepdim=True).values).sum(-1).gt(1).any())
    ]
    assert greedy_ties  # rows where the first maximum must win
    boundary_ties = [
        c
        for c in cases
        if c["top_k"] is not None
        and c["temperature"] > 0
        and bool(
            (c["logits"] == c["logits"].topk(c["top_k"], -1).values[:, -1:]).sum(-1).gt(1).any()
        )
    ]
    assert boundary_ties  # rows where tokens tied with the k-th are kept
    assert any(bool(torch.isinf(c["logits"]).any()) for c in cases)
    for case in cases:  # the uniform numbers stay clear of every cumulative probability
        if case["temperature"] == 0:
            continue
        probs = sampling_distribution(case["logits"].double(), case["temperature"], case["top_k"])
        edges = torch.cat([torch.zeros(len(probs), 1, dtype=torch.float64), probs.cumsum(-1)], -1)
        distance = (edges - case["uniform"].double()[:, None]).abs().min(-1).values
        # the one exception: u = 0 exactly on a row whose first id is blocked (the ">= u" trap)
        on_purpose = (case["uniform"] == 0) & torch.isinf(case["logits"][:, 0])
        assert float(distance[~on_purpose].min()) >= ch10.UNIFORM_MARGIN
    assert any(bool(((c["uniform"] == 0) & torch.isinf(c["logits"][:, 0])).any()) for c in cases)


# --------------------------------------------------------------------------------------------
# patchify
# --------------------------------------------------------------------------------------------


def patchify_unfold(images, patch_size):
    return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


def patchify_tensor_unfold(images, patch_size):
    p = patch_size
    patches = images.unfold(2, p, p).unfold(3, p, p)  # (b, c, rows, cols, p, p)
    return patches.permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)


def patchify_plain_reshape(images, patch_size):
    batch, channels = images.shape[:2]
    return images.reshape(batch, -1, channels * patch_size * patch_size)


def patchify_view_without_permute(images, patch_size):
    b, c, h, w = images.shape
    p = patch_size
    return images.reshape(b, c, h // p, p, w // p, p).reshape(b, -1, c * p * p)


def patchify_column_major(images, patch_size):  # patches column by column
    b, c, h, w = images.shape
    p = patch_size
    grid = images.reshape(b, c, h // p, p, w // p, p).permute(0, 4, 2, 1, 3, 5)
    return grid.reshape(b, -1, c * p * p)


def patchify_transposed_patch(images, patch_size):  # each patch flattened column by column
    b, c, h, w = images.shape
    p = patch_size
    grid = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 5, 3)
    return grid.reshape(b, -1, c * p * p)


def patchify_channels_last(images, patch_size):  # (p, p, channels) inside a patch
    b, c, h, w = images.shape
    p = patch_size
    grid = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return grid.reshape(b, -1, c * p * p)


def patchify_unfold_not_transposed(images, patch_size):
    return F.unfold(images, kernel_size=patch_size, stride=patch_size)


def patchify_channels_not_moved(images, patch_size):  # right for one channel only
    b, c = images.shape[:2]
    p = patch_size
    return images.unfold(2, p, p).unfold(3, p, p).reshape(b, -1, c * p * p)


def patchify_as_strided(images, patch_size):  # reads the memory as if contiguous
    b, c, h, w = images.shape
    p = patch_size
    grid = images.as_strided((b, h // p, w // p, c, p, p), (c * h * w, p * w, p, h * w, w, 1))
    return grid.reshape(b, -1, c * p * p)


def patchify_view_split(images, patch_size):  # .view for the split: fine on any strides
    b, c, h, w = images.shape
    p = patch_size
    grid = images.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return grid.reshape(b, -1, c * p * p)


def test_patchify_accepts_correct():
    for fn in [ch10.reference_patchify, patchify_tensor_unfold, patchify_view_split]:
        assert ch10.check_patchify(fn, verbose=False), fn.__name__


def test_patchify_rejects_reading_the_memory_of_a_non_contiguous_image():
    # right on every contiguous case, wrong on the transposed ones, and told why
    contiguous = [c for c in ch10._patch_cases() if c["images"].is_contiguous()]
    assert len(contiguous) < len(ch10._patch_cases())
    for case in contiguous:
        assert torch.equal(patchify_as_strided(**case), ch10.reference_patchify(**case))
    result = ch10.check_patchify(patchify_as_strided, verbose=False)
    assert not result and "not contiguous" in result.message, result.message


def test_patchify_refuses_f_unfold():
    # the chapter shows F.unfold's one-liner; the exercise asks for what is behind it
    result = ch10.check_patchify(patchify_unfold, verbose=False)
    assert not result
    assert "F.unfold" in result.message, result.message
    assert F.unfold(torch.ones(1, 1, 2, 2), 1).shape == (1, 1, 4), "the check puts F.unfold back"


def test_patchify_refuses_unfold_imported_by_name_and_the_module():
    from torch.nn.functional import unfold  # bound before the check swaps the attribute

    def imported(images, patch_size):
        return unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)

    def module(images, patch_size):
        return torch.nn.Unfold(patch_size, stride=patch_size)(images).transpose(1, 2)

    for answer in (imported, module):
        result = ch10.check_patchify(answer, verbose=False)
        assert not result and "F.unfold" in result.message, result.message
    assert unfold(torch.ones(1, 1, 2, 2), 1).shape == (1, 1, 4), "the check puts im2col back"


@pytest.mark.parametrize(
    "wrong",
    [
        patchify_plain_reshape,
        patchify_view_without_permute,
        patchify_column_major,
        patchify_transposed_patch,
        patchify_channels_last,
        patchify_unfold_not_transposed,
        patchify_channels_not_moved,
    ],
)
def test_patchify_rejects_wrong(wrong):
    assert not ch10.check_patchify(wrong, verbose=False)


def test_patches_then_linear_is_a_strided_convolution():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, kernel_size=2, stride=2)
    images = torch.randn(2, 3, 8, 8)
    patches = ch10.reference_patchify(images, 2)  # (2, 16, 12)
    linear = patches @ conv.weight.flatten(1).T + conv.bias  # (2, 16, 5)
    expected = conv(images).flatten(2).transpose(1, 2)  # (2, 16, 5)
    torch.testing.assert_close(linear, expected)


def test_patch_order_by_hand():
    image = torch.arange(16.0).reshape(1, 1, 4, 4)  # pixel values = their reading order
    patches = ch10.reference_patchify(image, 2)
    assert patches[0].tolist() == [
        [0, 1, 4, 5],  # top-left
        [2, 3, 6, 7],  # top-right
        [8, 9, 12, 13],  # bottom-left
        [10, 11, 14, 15],  # bottom-right
    ]


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, the references
# --------------------------------------------------------------------------------------------

CHECKS = [
    (ch10.check_prefix_lm_mask, ch10.reference_prefix_lm_mask),
    (ch10.check_bert_masking, ch10.reference_bert_masking),
    (ch10.check_sample_next_token, ch10.reference_sample_next_token),
    (ch10.check_patchify, ch10.reference_patchify),
    (ch10.check_standard_errors, ch10.reference_standard_errors),
    (ch10.check_induction_score, ch10.reference_induction_score),
]


# Stubs and crashing answers are tested for every chapter's checks in tests/test_exercises.py.


@pytest.mark.parametrize(("check", "reference"), CHECKS)
def test_reference_passes_its_own_check(check, reference, capsys):
    result = check(reference)
    assert result and result.cases_run >= 7
    assert "✅" in capsys.readouterr().out
    assert repr(result).startswith("✓")


def test_only_the_checks_are_exported():
    assert sorted(ch10.__all__) == sorted(name for name in dir(ch10) if name.startswith("check_"))
    assert all(name.startswith("check_") for name in ch10.__all__)


def test_sampling_check_rejects_the_greater_or_equal_rule():
    """``searchsorted`` with its default side finds the first cumulative probability >= u, so at
    u = 0 it draws a blocked token of probability 0; the spec says "exceeds u"."""

    def greater_or_equal(logits, temperature, top_k, uniform):
        if temperature == 0:
            return logits.argmax(dim=-1)
        logits = logits.double()
        if top_k is not None:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        cumulative = torch.softmax(logits / temperature, dim=-1).cumsum(dim=-1)
        ids = torch.searchsorted(cumulative, uniform.double()[:, None].contiguous())[:, 0]
        return ids.clamp(max=logits.shape[-1] - 1)

    assert not ch10.check_sample_next_token(greater_or_equal, verbose=False)
    assert not ch10.check_sample_next_token(sample_cumsum_at_least, verbose=False)
    assert ch10.check_sample_next_token(ch10.reference_sample_next_token, verbose=False)


# --------------------------------------------------------------------------------------------
# standard_errors: paired / every item its own draw / unpaired (exercise 3)
# --------------------------------------------------------------------------------------------


def se_right(baseline_losses, model_losses, clusters):
    gap = baseline_losses - model_losses
    paired = clustered_se(gap, clusters)
    independent = clustered_se(gap, np.arange(len(gap)))
    unpaired = math.sqrt(
        clustered_se(baseline_losses, clusters) ** 2 + clustered_se(model_losses, clusters) ** 2
    )
    return paired, independent, unpaired


def se_by_hand(baseline_losses, model_losses, clusters):
    """The formula written out, without clustered_se: the same numbers."""

    def se(values, groups):
        centred = values - values.mean()
        sums = {}
        for v, g in zip(centred, groups):
            sums[g] = sums.get(g, 0.0) + v
        return math.sqrt(sum(x * x for x in sums.values())) / len(values)

    gap = baseline_losses - model_losses
    items = range(len(gap))
    return (
        se(gap, clusters),
        se(gap, items),
        math.sqrt(se(baseline_losses, clusters) ** 2 + se(model_losses, clusters) ** 2),
    )


def se_unpaired_added(baseline_losses, model_losses, clusters):  # errors added, not in quadrature
    paired, independent, _ = se_right(baseline_losses, model_losses, clusters)
    return (
        paired,
        independent,
        clustered_se(baseline_losses, clusters) + clustered_se(model_losses, clusters),
    )


def se_unpaired_is_paired(baseline_losses, model_losses, clusters):  # "the means are the same"
    paired, independent, _ = se_right(baseline_losses, model_losses, clusters)
    return paired, independent, paired


def se_unpaired_without_clusters(baseline_losses, model_losses, clusters):
    paired, independent, _ = se_right(baseline_losses, model_losses, clusters)
    items = np.arange(len(clusters))
    return (
        paired,
        independent,
        math.sqrt(
            clustered_se(baseline_losses, items) ** 2 + clustered_se(model_losses, items) ** 2
        ),
    )


def se_independent_with_clusters(baseline_losses, model_losses, clusters):
    paired, _, unpaired = se_right(baseline_losses, model_losses, clusters)
    return paired, paired, unpaired


def se_paired_without_clusters(baseline_losses, model_losses, clusters):
    _, independent, unpaired = se_right(baseline_losses, model_losses, clusters)
    return independent, independent, unpaired


def se_sample_std(baseline_losses, model_losses, clusters):  # ddof=1 for the independent one
    paired, _, unpaired = se_right(baseline_losses, model_losses, clusters)
    gap = baseline_losses - model_losses
    return paired, gap.std(ddof=1) / math.sqrt(len(gap)), unpaired


def se_textbook(baseline_losses, model_losses, clusters):  # every number with ddof=1 / G/(G-1)
    paired, _, unpaired = se_right(baseline_losses, model_losses, clusters)
    groups = len(set(clusters.tolist()))
    gap = baseline_losses - model_losses
    correction = math.sqrt(groups / (groups - 1))
    return paired * correction, gap.std(ddof=1) / math.sqrt(len(gap)), unpaired * correction


def se_textbook_added(baseline_losses, model_losses, clusters):  # ddof=1, errors added
    paired, independent, _ = se_textbook(baseline_losses, model_losses, clusters)
    correction = math.sqrt(len(set(clusters.tolist())) / (len(set(clusters.tolist())) - 1))
    added = clustered_se(baseline_losses, clusters) + clustered_se(model_losses, clusters)
    return paired, independent, added * correction


def se_textbook_paired_without_clusters(baseline_losses, model_losses, clusters):
    _, independent, unpaired = se_textbook(baseline_losses, model_losses, clusters)
    return independent, independent, unpaired


def se_unpaired_variance(baseline_losses, model_losses, clusters):  # a variance, not an error
    paired, independent, unpaired = se_right(baseline_losses, model_losses, clusters)
    return paired, independent, unpaired**2


def test_standard_errors_right_answers_pass():
    assert ch10.check_standard_errors(se_right, verbose=False)
    assert ch10.check_standard_errors(se_by_hand, verbose=False)
    # the textbook ddof=1 convention, for the independent number alone or for all three
    assert ch10.check_standard_errors(se_sample_std, verbose=False)
    assert ch10.check_standard_errors(se_textbook, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (se_unpaired_added, "add in quadrature"),
        (se_unpaired_is_paired, "still paired"),
        (se_unpaired_without_clusters, "ignores the clusters"),
        (se_independent_with_clusters, "uses the clusters"),
        (se_paired_without_clusters, "ignores the clusters"),
        (se_textbook_added, "add in quadrature"),
        (se_textbook_paired_without_clusters, "ignores the clusters"),
        (se_unpaired_variance, None),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_standard_errors_rejects_the_classic_slips(wrong, hint):
    result = ch10.check_standard_errors(wrong, verbose=False)
    assert not result
    if hint:
        assert hint in result.message, result.message


def test_standard_errors_cases_make_the_classic_prediction_wrong():
    """Exercise 3's point holds on the check's own cases: unpaired is larger than paired (often
    several times), and with correlated items one draw per item is smaller than one per cluster."""
    ratios = []
    for case in ch10._comparison_cases():
        paired, independent, unpaired = ch10.reference_standard_errors(**case)
        ratios.append(unpaired / paired)
        if len(set(case["clusters"].tolist())) < len(case["clusters"]):
            assert independent < paired
        else:
            assert math.isclose(independent, paired, rel_tol=1e-12)
    assert min(ratios) > 1 and max(ratios) > 4


def test_standard_errors_does_not_let_the_reader_change_the_cases():
    def mutates(baseline_losses, model_losses, clusters):
        result = se_right(baseline_losses, model_losses, clusters)
        baseline_losses[:] = 0
        clusters[:] = 0
        return result

    assert ch10.check_standard_errors(mutates, verbose=False)


def test_bert_masking_rejects_changing_the_callers_tokens():
    def in_place(tokens, mask_id, vocab_size, special_ids, generator):
        inputs, targets = ch10.reference_bert_masking(
            tokens, mask_id, vocab_size, special_ids, generator
        )
        tokens.copy_(inputs)  # inputs = tokens; inputs[...] = mask_id: the caller's batch changes
        return tokens, targets

    result = ch10.check_bert_masking(in_place, verbose=False)
    assert not result and "in place" in result.message, result.message


# Exercise 6: an induction score ----------------------------------------------------------


def induction_by_loops(weights, rep_len):
    total, pairs = torch.zeros(weights.shape[1], dtype=torch.float64), 0
    for b in range(weights.shape[0]):
        n = int(rep_len[b])
        for q in range(n, 2 * n - 1):
            total += weights[b, :, q, q - n + 1].double()
            pairs += 1
    return (total / pairs).float()


def induction_by_mask(weights, rep_len):
    seq_len = weights.shape[-1]
    q = torch.arange(seq_len)[None, :, None]  # (1, seq_len, 1)
    k = torch.arange(seq_len)[None, None, :]  # (1, 1, seq_len)
    n = rep_len[:, None, None]  # (batch, 1, 1)
    picked = (q >= n) & (q <= 2 * n - 2) & (k == q - n + 1)  # (batch, seq_len, seq_len)
    return (weights * picked[:, None]).sum(dim=(0, 2, 3)) / picked.sum()


def induction_same_token(weights, rep_len):  # the duplicate-token head's key, q - n_rep
    return ch10._induction_variant(weights, rep_len, key_shift=0)


def induction_one_query_too_many(weights, rep_len):
    return ch10._induction_variant(weights, rep_len, last_extra=1)


def induction_mean_of_row_means(weights, rep_len):
    return ch10._induction_variant(weights, rep_len, per_row=True)


def induction_transposed(weights, rep_len):
    return ch10._induction_variant(weights, rep_len, transposed=True)


def induction_previous_token(weights, rep_len):  # the previous-token score instead
    return weights[
        :, :, torch.arange(1, weights.shape[-1]), torch.arange(weights.shape[-1] - 1)
    ].mean(dim=(0, 2))


def test_induction_score_accepts_correct():
    assert ch10.check_induction_score(induction_by_loops, verbose=False)
    assert ch10.check_induction_score(induction_by_mask, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (induction_same_token, "FOLLOWED"),
        (induction_one_query_too_many, "2 n_rep - 2"),
        (induction_mean_of_row_means, "pairs at once"),
        (induction_transposed, "[key, query]"),
        (induction_previous_token, None),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_induction_score_rejects_the_classic_slips(wrong, hint):
    result = ch10.check_induction_score(wrong, verbose=False)
    assert not result
    if hint:
        assert hint in result.message, result.message


def test_induction_cases_score_the_ideal_heads_and_uniform_attention():
    *_, ideal, uniform = ch10._induction_cases()
    assert torch.allclose(ch10.reference_induction_score(**ideal), torch.tensor([1.0, 0.0]))
    expected = sum(1 / (q + 1) for n in (4, 9, 16) for q in range(n, 2 * n - 1)) / sum(
        n - 1 for n in (4, 9, 16)
    )
    assert torch.allclose(ch10.reference_induction_score(**uniform), torch.tensor([expected] * 2))


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (sample_cumsum_at_least, "EXCEEDS u"),
        (sample_temperature_on_probabilities_unnormalised, "divide the logits"),
        (sample_sorted_position, "id order"),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_sampling_check_names_the_classic_slips(wrong, hint):
    result = ch10.check_sample_next_token(wrong, verbose=False)
    assert not result and hint in result.message, result.message


# Exercise 2: the mask at test time, the objective in training ---------------------------------


def fill_by_loop(model, rows, blank, mask_id, is_causal):
    hits = 0
    for b in range(len(rows)):
        row = rows[b : b + 1].clone()
        row[0, blank[b]] = mask_id
        logits = model(row, is_causal=is_causal)
        hits += int(logits[0, blank[b]].argmax() == rows[b, blank[b]])
    return hits / len(rows)


def fill_by_scatter(model, rows, blank, mask_id, is_causal):  # a 0-dim tensor is accepted
    inputs = rows.scatter(1, blank[:, None], mask_id)
    guess = model(inputs, is_causal=is_causal).argmax(dim=-1).gather(1, blank[:, None])
    return (guess == rows.gather(1, blank[:, None])).float().mean()


def fill_slip(slip):
    def wrong(model, rows, blank, mask_id, is_causal):
        case = {"model": model, "rows": rows, "blank": blank, "mask_id": mask_id}
        return ch10._fill_variant({**case, "is_causal": is_causal}, slip)

    wrong.__name__ = f"fill_{slip.replace(' ', '_')}"
    return wrong


def fill_always_bidirectional(model, rows, blank, mask_id, is_causal):
    return ch10.reference_fill_rate(model, rows, blank, mask_id, is_causal=False)


def fill_mask_positional(model, rows, blank, mask_id, is_causal):
    every = torch.arange(len(rows))
    inputs = rows.clone()
    inputs[every, blank] = mask_id
    guess = model(inputs, is_causal).argmax(dim=-1)  # is_causal lands on the mask parameter
    return (guess[every, blank] == rows[every, blank]).float().mean().item()


def fill_in_place(model, rows, blank, mask_id, is_causal):
    hidden = rows[torch.arange(len(rows)), blank].clone()
    rows[torch.arange(len(rows)), blank] = mask_id
    guess = model(rows, is_causal=is_causal).argmax(dim=-1)[torch.arange(len(rows)), blank]
    return (guess == hidden).float().mean().item()


def test_fill_rate_accepts_correct():
    assert ch10.check_fill_rate(ch10.reference_fill_rate, verbose=False)
    assert ch10.check_fill_rate(fill_by_loop, verbose=False)
    assert ch10.check_fill_rate(fill_by_scatter, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (fill_slip("visible"), "never hidden"),
        (fill_slip("columns"), "EVERY row"),
        (fill_slip("before"), "blank - 1"),
        (fill_slip("default mask"), "is_causal=is_causal"),
        (fill_slip("inputs"), "after hiding"),
        (fill_slip("count"), "count of rows"),
        (fill_always_bidirectional, None),
        (fill_mask_positional, "by name"),
        (fill_in_place, "in place"),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_fill_rate_rejects_the_classic_slips(wrong, hint):
    result = ch10.check_fill_rate(wrong, verbose=False)
    assert not result
    if hint:
        assert hint in result.message, result.message


def test_fill_rate_rule_model_fills_as_the_rows_allow():
    """On many rows the check's model fills about 1 in 2 from the left, 3 in 4 from both sides."""
    rows, blank = ch10._fill_rows(4000, torch.Generator().manual_seed(0))
    model = ch10._RuleModel()
    left = ch10.reference_fill_rate(model, rows, blank, ch10._FILL_MASK, is_causal=True)
    both = ch10.reference_fill_rate(model, rows, blank, ch10._FILL_MASK, is_causal=False)
    assert abs(left - 0.5) < 0.04 and abs(both - 0.75) < 0.04, (left, both)


def test_fill_rate_stub_is_reported_not_raised():
    def stub(model, rows, blank, mask_id, is_causal):
        raise NotImplementedError

    result = ch10.check_fill_rate(stub, verbose=False)
    assert not result and "not attempted" in result.message


# Hints for the slips a reviewer found unnamed (s11rv10b) ------------------------------------


def se_std_not_se(baseline_losses, model_losses, clusters):  # the spread, not the SE of the mean
    paired, _, unpaired = se_right(baseline_losses, model_losses, clusters)
    return paired, (baseline_losses - model_losses).std(ddof=1), unpaired


def induction_starts_one_late(weights, rep_len):
    return ch10._induction_variant(weights, rep_len, first_late=1)


@pytest.mark.parametrize(
    "check, wrong, hint",
    [
        (ch10.check_patchify, patchify_plain_reshape, "plain reshape"),
        (ch10.check_patchify, patchify_column_major, "column by column"),
        (ch10.check_patchify, patchify_channels_last, "channels last"),
        (ch10.check_standard_errors, se_std_not_se, "spread of the differences"),
        (ch10.check_induction_score, induction_starts_one_late, "start at n_rep"),
        (ch10.check_sample_next_token, sample_top_k_after_softmax_not_renormalised, "renormalised"),
        (ch10.check_sample_next_token, sample_top_k_exactly_k, "tied with the k-th"),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_checks_name_more_slips(check, wrong, hint):
    result = check(wrong, verbose=False)
    assert not result and hint in result.message, result.message
