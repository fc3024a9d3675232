"""The training objectives of companion.data.objectives: exact examples written by hand, the
statistics of BERT's masking over many draws, span corruption's round trip, and no target
ever visible to the position that predicts it."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from companion.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    ObjectiveExample,
    causal_lm_example,
    corrupt_spans,
    masked_lm_example,
    prefix_lm_example,
    random_spans,
    span_corruption_example,
)
from companion.masking import causal_mask

T, F = True, False

BATCH = torch.tensor(
    [
        [1, 5, 6, 7, 2, 0],  # <bos> a b c <eos> <pad>
        [1, 8, 2, 0, 0, 0],  # <bos> d <eos> <pad> <pad> <pad>
    ]
)


def no_target_is_visible(example: ObjectiveExample, pad_id: int = PAD_ID) -> bool:
    """Input position ``i + 1`` holds the token that position ``i`` predicts: no query with
    a target may attend to the key holding it."""
    inputs, targets, mask = example
    if inputs.dim() == 1:
        inputs, targets, mask = inputs[None], targets[None], mask[None, None]
    for b, i in (targets != pad_id).nonzero().tolist():
        if i + 1 < inputs.shape[1] and bool(mask[b, 0, i, i + 1 :].any()):
            return False
    return True


# --------------------------------------------------------------------------------------------
# causal LM
# --------------------------------------------------------------------------------------------


def test_causal_lm_by_hand():
    inputs, targets, mask = causal_lm_example(BATCH)
    assert inputs.tolist() == [[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]]
    assert targets.tolist() == [[5, 6, 7, 2, 0], [8, 2, 0, 0, 0]]  # <eos> predicted, <pad> not
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.bool
    assert mask[0, 0].tolist() == causal_mask(5).tolist()
    assert mask[1, 0].tolist() == [
        [T, F, F, F, F],
        [T, T, F, F, F],
        [T, T, T, F, F],
        [T, T, T, F, F],  # padding queries still see the real keys before them
        [T, T, T, F, F],
    ]


def test_causal_lm_of_one_sentence_has_no_batch_dimension():
    inputs, targets, mask = causal_lm_example(torch.tensor([1, 5, 6, 2]))
    assert inputs.tolist() == [1, 5, 6] and targets.tolist() == [5, 6, 2]
    assert torch.equal(mask, causal_mask(3))
    single = causal_lm_example(BATCH[:1])
    assert single.inputs.shape == (1, 5) and single.mask.shape == (1, 1, 5, 5)


def test_causal_lm_never_shows_a_target():
    assert no_target_is_visible(causal_lm_example(BATCH))
    everything = ObjectiveExample(*causal_lm_example(BATCH)[:2], torch.ones(2, 1, 5, 5) > 0)
    assert not no_target_is_visible(everything)  # the test itself can fail


@pytest.mark.parametrize(
    ("tokens", "error", "match"),
    [
        (BATCH.float(), TypeError, "tokens must be an integer tensor"),
        (BATCH[None], ValueError, r"tokens must have shape \(len,\) or \(batch, len\)"),
        (torch.tensor([1]), ValueError, "at least 2 positions"),
        ([1, 2, 3], TypeError, "tokens must be a torch.Tensor"),
    ],
)
def test_causal_lm_rejects_bad_tokens(tokens, error, match):
    with pytest.raises(error, match=match):
        causal_lm_example(tokens)


def test_causal_lm_rejects_a_bad_pad_id():
    with pytest.raises(ValueError, match="pad_id must be >= 0, got -1"):
        causal_lm_example(BATCH, pad_id=-1)


# --------------------------------------------------------------------------------------------
# masked LM
# --------------------------------------------------------------------------------------------

VOCAB, MASK, SPECIALS = 24, 4, (0, 1, 2, 3, 4)  # <pad> <bos> <eos> <unk> [MASK], words 5..23


def test_masked_lm_follows_its_documented_draws():
    """The result written out by hand from the three documented draws of the generator."""
    tokens = torch.tensor([[1, 5, 3, 9, 10, 11, 12, 2, 0], [1, 13, 14, 15, 16, 17, 18, 19, 2]])
    inputs, targets, mask = masked_lm_example(
        tokens,
        mask_id=MASK,
        vocab_size=VOCAB,
        special_ids=SPECIALS,
        probability=0.5,
        generator=torch.Generator().manual_seed(3),
    )
    g = torch.Generator().manual_seed(3)
    select, split = torch.rand(2, 9, generator=g), torch.rand(2, 9, generator=g)
    random_word = torch.randint(19, (2, 9), generator=g) + 5  # the ordinary ids are 5 .. 23
    expected_inputs, expected_targets = tokens.clone(), torch.zeros_like(tokens)
    for b in range(2):
        for t in range(9):
            if int(tokens[b, t]) in SPECIALS or select[b, t] >= 0.5:
                continue
            expected_targets[b, t] = tokens[b, t]
            if split[b, t] < 0.8:
                expected_inputs[b, t] = MASK
            elif split[b, t] < 0.9:
                expected_inputs[b, t] = random_word[b, t]
    assert torch.equal(inputs, expected_inputs) and torch.equal(targets, expected_targets)
    assert 0 < int((targets != 0).sum()) < 14  # some selected, not all
    assert mask.shape == (2, 1, 9, 9)
    assert mask[0, 0].tolist() == [[T] * 8 + [F]] * 9  # every query sees every real key
    assert bool(mask[1].all())


def test_masked_lm_with_probability_one_selects_every_word_and_nothing_else():
    tokens = torch.tensor([1, 5, 6, 3, 7, 2, 0, 0])  # <unk> (3) is special: never selected
    inputs, targets, mask = masked_lm_example(
        tokens, mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, probability=1.0
    )
    assert targets.tolist() == [0, 5, 6, 0, 7, 0, 0, 0]
    kept = [0, 3, 5, 6, 7]
    assert inputs[kept].tolist() == tokens[kept].tolist()
    assert mask.shape == (8, 8) and mask[:, :6].all() and not mask[:, 6:].any()


def _many_draws(draws: int = 400):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 30, (draws, 8), generator=g)
    results = []
    for index in range(draws):
        tokens = torch.zeros(8, 32, dtype=torch.long)
        for row, n in enumerate(lengths[index].tolist()):
            words = torch.randint(5, VOCAB, (n,), generator=g)
            words[torch.rand(n, generator=g) < 0.05] = 3  # a few <unk>
            tokens[row, : n + 2] = torch.cat([torch.tensor([1]), words, torch.tensor([2])])
        example = masked_lm_example(
            tokens, mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, generator=g
        )
        results.append((tokens, example.inputs, example.targets))
    return results


def test_masked_lm_proportions_over_many_draws():
    """About 48,000 real tokens: the selection rate is within 5 standard deviations
    (±0.008) of 15%, the split within 5 standard deviations of 80/10/10 (a random draw
    equal to the original token, 1 in 19, counts as unchanged)."""
    real = selected = masked = kept = 0
    drawn = Counter()
    for tokens, inputs, targets in _many_draws():
        is_special = torch.isin(tokens, torch.tensor(SPECIALS))
        chosen = targets != PAD_ID
        assert not (chosen & is_special).any()  # never padding or special tokens
        assert torch.equal(inputs[is_special], tokens[is_special])
        assert torch.equal(targets[chosen], tokens[chosen])
        assert torch.equal(inputs[~chosen], tokens[~chosen])
        real += int((~is_special).sum())
        selected += int(chosen.sum())
        masked += int((chosen & (inputs == MASK)).sum())
        kept += int((chosen & (inputs == tokens)).sum())
        replaced = inputs[chosen & (inputs != tokens) & (inputs != MASK)]
        drawn.update(replaced.tolist())
    assert real > 45_000

    def within(count, total, expected):
        return abs(count / total - expected) <= 5 * math.sqrt(expected * (1 - expected) / total)

    same = 1 / 19
    assert within(selected, real, 0.15)
    assert within(masked, selected, 0.8)
    assert within(selected - masked - kept, selected, 0.1 * (1 - same))
    assert within(kept, selected, 0.1 + 0.1 * same)
    assert set(drawn) == set(range(5, VOCAB))  # every ordinary id, never a special one
    assert not within(selected, real, 0.12) and not within(masked, selected, 0.85)


def test_masked_lm_random_tokens_skip_special_ids_anywhere_in_the_vocabulary():
    specials = (0, 1, 2, 3, 10, 23)  # [MASK] = 23 and a special in the middle
    tokens = torch.tensor([1] + [5, 6, 7, 8, 9, 11, 12] * 30 + [2])
    drawn = set()
    for seed in range(60):
        inputs, targets, _ = masked_lm_example(
            tokens,
            mask_id=23,
            vocab_size=24,
            special_ids=specials,
            generator=torch.Generator().manual_seed(seed),
        )
        chosen = targets != 0
        drawn |= set(inputs[chosen & (inputs != tokens) & (inputs != 23)].tolist())
    assert drawn == set(range(4, 23)) - {10}


def test_masked_lm_is_reproducible_with_a_generator():
    def draw(seed):
        return masked_lm_example(
            BATCH.repeat(4, 3),
            mask_id=MASK,
            vocab_size=VOCAB,
            special_ids=SPECIALS,
            probability=0.5,
            generator=torch.Generator().manual_seed(seed),
        )

    first, again, other = draw(7), draw(7), draw(8)
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)
    assert not torch.equal(first.targets, other.targets)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"mask_id": 24}, ValueError, r"mask_id must be an id in \[0, 23\], got 24"),
        ({"special_ids": (0, 1, 30)}, ValueError, r"special_ids\[2\] must be an id in \[0, 23\]"),
        ({"special_ids": 0}, TypeError, "special_ids must be a sequence of ids"),
        ({"probability": 0.0}, ValueError, r"probability must be in \(0, 1\], got 0.0"),
        ({"probability": 1.5}, ValueError, r"probability must be in \(0, 1\], got 1.5"),
        ({"vocab_size": 8}, ValueError, r"tokens must hold ids in \[0, 7\] \(vocab_size=8\)"),
        ({"vocab_size": 0}, ValueError, "vocab_size must be >= 1, got 0"),
        ({"generator": 3}, TypeError, "generator must be a torch.Generator or None"),
    ],
)
def test_masked_lm_rejects_bad_arguments(changes, error, match):
    arguments = {"mask_id": MASK, "vocab_size": VOCAB, "special_ids": SPECIALS} | changes
    with pytest.raises(error, match=match):
        masked_lm_example(BATCH, **arguments)


def test_masked_lm_needs_an_ordinary_token():
    with pytest.raises(ValueError, match="no ordinary token"):
        masked_lm_example(
            torch.tensor([1, 2, 0]), mask_id=4, vocab_size=5, special_ids=(0, 1, 2, 3)
        )


# --------------------------------------------------------------------------------------------
# span corruption
# --------------------------------------------------------------------------------------------

# "Thank you for inviting me to your party last week ." as ids 10 .. 20; sentinels 100, 101, ...
FIGURE_2 = list(range(10, 21))
SENTINELS = list(range(100, 110))


def test_corrupt_spans_reproduces_figure_2_of_the_t5_paper():
    inputs, targets = corrupt_spans(FIGURE_2, [(2, 4), (8, 9)], sentinel_ids=SENTINELS)
    # Thank you <X> me to your party <Y> week . <eos>
    assert inputs == [10, 11, 100, 14, 15, 16, 17, 101, 19, 20, EOS_ID]
    # <X> for inviting <Y> last <Z> <eos>
    assert targets == [100, 12, 13, 101, 18, 102, EOS_ID]


def test_corrupt_spans_at_both_ends_and_without_eos():
    inputs, targets = corrupt_spans(
        torch.tensor([5, 6, 7, 8, 9]), [(0, 1), (3, 5)], sentinel_ids=[50, 51, 52], eos_id=None
    )
    assert inputs == [50, 6, 7, 51]
    assert targets == [50, 5, 51, 8, 9, 52]


@pytest.mark.parametrize(
    ("spans", "match"),
    [
        ([(2, 4), (4, 6)], r"spans\[1\] must be a \(start, stop\) pair"),  # touching
        ([(2, 4), (3, 6)], r"spans\[1\]"),  # overlapping
        ([(3, 3)], r"spans\[0\]"),  # empty
        ([(9, 12)], r"spans\[0\]"),  # past the end
        ([(4, 6), (1, 2)], r"spans\[1\]"),  # out of order
        ([(0, 1), (2, 3), (4, 5)], "3 spans need 4 sentinel ids"),
    ],
)
def test_corrupt_spans_rejects_bad_spans(spans, match):
    with pytest.raises(ValueError, match=match):
        corrupt_spans(FIGURE_2, spans, sentinel_ids=[100, 101, 102])


@pytest.mark.parametrize(
    ("length", "num_noise", "num_spans"),
    [
        (2, 1, 1),  # at least one token dropped and one kept
        (5, 1, 1),  # round(0.75) = 1
        (12, 2, 1),  # round(1.8) = 2, round(2 / 3) = 1
        (30, 4, 1),  # round(4.5) = 4 (halves to even), round(4 / 3) = 1
        (40, 6, 2),  # round(6.0) = 6, round(6 / 3) = 2
        (100, 15, 5),
    ],
)
def test_random_spans_count_as_documented(length, num_noise, num_spans):
    g = torch.Generator().manual_seed(length)
    for _ in range(20):
        spans = random_spans(length, generator=g)
        assert len(spans) == num_spans
        assert sum(stop - start for start, stop in spans) == num_noise
        assert all(0 <= start < stop <= length for start, stop in spans)
        assert all(spans[i][1] < spans[i + 1][0] for i in range(len(spans) - 1))  # never touch


def test_random_spans_reach_every_place():
    g = torch.Generator().manual_seed(0)
    assert {tuple(random_spans(2, generator=g)) for _ in range(40)} == {((0, 1),), ((1, 2),)}
    starts = Counter(random_spans(5, generator=g)[0][0] for _ in range(2000))
    assert sorted(starts) == [0, 1, 2, 3, 4]  # the first and the last token too
    assert max(starts.values()) - min(starts.values()) < 150  # about 400 each
    layouts = {
        tuple(random_spans(7, noise_density=0.5, mean_span_length=1.5, generator=g))
        for _ in range(600)
    }
    assert len(layouts) == 12  # 3 ways to cut 4 noise tokens in 3 spans x 4 ways to place them


def reassemble(inputs: list[int], targets: list[int], eos_id: int | None = EOS_ID) -> list[int]:
    """Put each span of the targets back in place of its sentinel in the inputs."""
    if eos_id is not None:
        assert inputs[-1] == eos_id and targets[-1] == eos_id
        inputs, targets = inputs[:-1], targets[:-1]
    spans, current = {}, None
    for token in targets:
        if token in SENTINELS:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    assert list(spans)[-1] == SENTINELS[len(spans) - 1] and spans[list(spans)[-1]] == []
    sentence = []
    for token in inputs:
        sentence += spans[token] if token in SENTINELS else [token]
    return sentence


def test_span_corruption_round_trip_on_a_batch():
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 40, (64,), generator=g).tolist()
    tokens = torch.zeros(64, max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(4, 90, (n,), generator=g)
    inputs, targets, mask = span_corruption_example(tokens, sentinel_ids=SENTINELS, generator=g)
    assert mask.shape == (64, 1, inputs.shape[1], inputs.shape[1])
    dropped = 0
    for row, n in enumerate(lengths):
        real_in = [t for t in inputs[row].tolist() if t != PAD_ID]
        real_out = [t for t in targets[row].tolist() if t != PAD_ID]
        assert inputs[row, : len(real_in)].tolist() == real_in  # padding only at the end
        assert reassemble(real_in, real_out) == tokens[row, :n].tolist()
        assert mask[row, 0, :, : len(real_in)].all() and not mask[row, 0, :, len(real_in) :].any()
        dropped += len(real_out) - 2 - sum(t in SENTINELS for t in real_out) + 1
    assert 0.12 < dropped / sum(lengths) < 0.2  # about noise_density of the tokens


def test_span_corruption_of_one_sentence_and_reproducibility():
    sentence = torch.tensor(FIGURE_2 + [0, 0])
    first = span_corruption_example(
        sentence, sentinel_ids=SENTINELS, generator=torch.Generator().manual_seed(4)
    )
    again = span_corruption_example(
        sentence, sentinel_ids=SENTINELS, generator=torch.Generator().manual_seed(4)
    )
    assert first.inputs.dim() == 1 and first.mask.shape == (len(first.inputs),) * 2
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)
    assert reassemble(first.inputs.tolist(), first.targets.tolist()) == FIGURE_2
    no_eos = span_corruption_example(sentence, sentinel_ids=SENTINELS, eos_id=None)
    assert EOS_ID not in no_eos.inputs.tolist() + no_eos.targets.tolist()


@pytest.mark.parametrize(
    ("tokens", "changes", "error", "match"),
    [
        (torch.tensor([10, 100, 12]), {}, ValueError, "tokens must not contain a sentinel id"),
        (
            torch.tensor([[10, 0, 0]]),
            {},
            ValueError,
            "needs at least 2 real tokens .*, row 0 has 1",
        ),
        (torch.tensor(FIGURE_2 * 4), {"sentinel_ids": [100, 101]}, ValueError, "need"),
        (torch.tensor(FIGURE_2), {"sentinel_ids": [100, 100]}, ValueError, "distinct"),
        (torch.tensor(FIGURE_2), {"sentinel_ids": [0, 100]}, ValueError, "pad_id"),
        (torch.tensor(FIGURE_2), {"noise_density": 1.0}, ValueError, r"noise_density must be"),
        (torch.tensor(FIGURE_2), {"mean_span_length": 0}, ValueError, "mean_span_length"),
        (torch.zeros(0, 4, dtype=torch.long), {}, ValueError, "at least one sentence"),
    ],
)
def test_span_corruption_rejects_bad_input(tokens, changes, error, match):
    with pytest.raises(error, match=match):
        span_corruption_example(tokens, **({"sentinel_ids": SENTINELS} | changes))


# --------------------------------------------------------------------------------------------
# prefix LM
# --------------------------------------------------------------------------------------------


def test_prefix_lm_by_hand():
    tokens = torch.tensor([BOS_ID, 10, 11, 12, 13, EOS_ID])  # prefix <bos> 10 11, then 12 13
    inputs, targets, mask = prefix_lm_example(tokens, 3)
    assert inputs.tolist() == [1, 10, 11, 12, 13]
    assert targets.tolist() == [0, 0, 12, 13, 2]  # tokens inside the prefix are not targets
    assert mask.tolist() == [
        [T, T, T, F, F],
        [T, T, T, F, F],
        [T, T, T, F, F],
        [T, T, T, T, F],
        [T, T, T, T, T],
    ]


def test_prefix_lm_with_one_length_per_sentence():
    inputs, targets, mask = prefix_lm_example(BATCH, torch.tensor([2, 3]))
    assert targets.tolist() == [[0, 6, 7, 2, 0], [0, 0, 0, 0, 0]]
    assert mask[1, 0].tolist() == [
        [T, T, T, F, F],
        [T, T, T, F, F],
        [T, T, T, F, F],
        [T, T, T, F, F],  # padding keys stay blocked
        [T, T, T, F, F],
    ]
    for row, length in enumerate([2, 3]):
        alone = prefix_lm_example(BATCH[row], length)
        assert torch.equal(mask[row, 0], alone.mask) and torch.equal(targets[row], alone.targets)


def test_prefix_lm_without_prefix_is_the_causal_lm():
    for length in (0, 1):
        example, causal = prefix_lm_example(BATCH, length), causal_lm_example(BATCH)
        assert all(torch.equal(a, b) for a, b in zip(example, causal))


def test_prefix_lm_never_shows_a_target():
    for length in range(6):
        assert no_target_is_visible(prefix_lm_example(BATCH, length))
    inputs, targets, mask = prefix_lm_example(BATCH, 3)
    leaky = ObjectiveExample(inputs, causal_lm_example(BATCH).targets, mask)
    assert not no_target_is_visible(leaky)  # keeping the prefix's targets would leak them


@pytest.mark.parametrize(
    ("prefix_len", "error", "match"),
    [
        (6, ValueError, "prefix_len must be <= the input length len - 1 = 5, got 6"),
        (-1, ValueError, "prefix_len must be >= 0"),
        (2.0, TypeError, "prefix_len must be a sequence of ids"),
        ([1, 2, 3], ValueError, r"one length per sentence \(2\), got 3"),
        (torch.tensor([1, 9]), ValueError, r"prefix_len\[1\] must be <= the input length"),
    ],
)
def test_prefix_lm_rejects_bad_prefix_lengths(prefix_len, error, match):
    with pytest.raises(error, match=match):
        prefix_lm_example(BATCH, prefix_len)
