"""companion.data.batching: datasets, collation, batching by token count, padding waste."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from companion.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    CopyReverseDataset,
    Multi30kData,
    TokenBatchSampler,
    collate_batch,
    padding_waste,
)

# ---------------------------------------------------------------------------------------------
# Collate
# ---------------------------------------------------------------------------------------------


def test_collate_pads_and_wraps_targets() -> None:
    src, tgt = collate_batch([([5, 6, 7], [8]), ([9], torch.tensor([10, 11, 12]))])
    assert src.tolist() == [[5, 6, 7], [9, PAD_ID, PAD_ID]]
    assert tgt.tolist() == [
        [BOS_ID, 8, EOS_ID, PAD_ID, PAD_ID],
        [BOS_ID, 10, 11, 12, EOS_ID],
    ]
    assert src.dtype == tgt.dtype == torch.long


def test_collate_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        collate_batch([])
    with pytest.raises(TypeError, match=r"examples\[0\] must be a \(src_ids, tgt_ids\) pair"):
        collate_batch([[1, 2, 3]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"examples\[1\]\[1\] must contain only ints"):
        collate_batch([([1], [2]), ([1], [2.5])])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="1-D integer tensor"):
        collate_batch([(torch.tensor([1.0]), [2])])


# ---------------------------------------------------------------------------------------------
# Batching by token count
# ---------------------------------------------------------------------------------------------


def batch_tokens(indices: list[int], lengths: list[tuple[int, int]]) -> int:
    """Tokens of the padded batch: rows × (longest source + longest target)."""
    return len(indices) * (
        max(lengths[i][0] for i in indices) + max(lengths[i][1] for i in indices)
    )


def check_epoch(batches: list[list[int]], lengths: list[tuple[int, int]], max_tokens: int) -> None:
    """Every example exactly once; a batch over budget only if it is one oversized example."""
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in batches:
        assert batch
        if batch_tokens(batch, lengths) > max_tokens:
            assert len(batch) == 1 and sum(lengths[batch[0]]) > max_tokens


@given(
    lengths=st.lists(st.tuples(st.integers(0, 60), st.integers(2, 60)), min_size=0, max_size=200),
    max_tokens=st.integers(1, 500),
    shuffle=st.booleans(),
    bucketing=st.booleans(),
    seed=st.integers(0, 10),
)
def test_sampler_invariants(
    lengths: list[tuple[int, int]], max_tokens: int, shuffle: bool, bucketing: bool, seed: int
) -> None:
    sampler = TokenBatchSampler(
        lengths, max_tokens, shuffle=shuffle, bucketing=bucketing, seed=seed
    )
    for _ in range(2):  # two epochs
        expected_len = len(sampler)
        batches = list(sampler)
        assert len(batches) == expected_len
        check_epoch(batches, lengths, max_tokens)


def test_oversized_example_gets_a_batch_of_its_own() -> None:
    lengths = [(3, 4), (50, 60), (3, 5), (2, 4)]
    sampler = TokenBatchSampler(lengths, max_tokens=20, shuffle=False)
    batches = sampler.batches()
    assert [1] in batches  # 110 tokens alone, over the budget of 20, but not dropped
    check_epoch(batches, lengths, 20)
    assert max(batch_tokens(b, lengths) for b in batches if b != [1]) <= 20


def test_sampler_is_deterministic_and_reshuffles_each_epoch() -> None:
    lengths = CopyReverseDataset(num_examples=300, max_len=20, seed=0).lengths
    first = TokenBatchSampler(lengths, 200, seed=7)
    second = TokenBatchSampler(lengths, 200, seed=7)
    epochs_first = [list(first) for _ in range(3)]
    epochs_second = [list(second) for _ in range(3)]
    assert epochs_first == epochs_second  # same seed, same batches, epoch after epoch
    assert epochs_first[0] != epochs_first[1]  # a new shuffle each epoch
    assert first.epoch == 3
    first.set_epoch(1)
    assert list(first) == epochs_first[1]  # set_epoch replays an epoch
    assert TokenBatchSampler(lengths, 200, seed=8).batches() != epochs_first[0]
    ordered = TokenBatchSampler(lengths, 200, shuffle=False, bucketing=False)
    assert [i for b in ordered.batches() for i in b] == list(range(300))  # dataset order


def test_padding_waste_by_hand() -> None:
    lengths = [(2, 3), (4, 3), (4, 5)]
    # batch [0, 1]: 2 rows × (4 + 3) = 14 tokens, 12 real; batch [2]: 9 tokens, all real
    assert padding_waste([[0, 1], [2]], lengths) == pytest.approx(1 - 21 / 23)
    assert padding_waste([[0], [1], [2]], lengths) == 0.0
    assert padding_waste([], lengths) == 0.0
    with pytest.raises(ValueError, match=r"batches\[0\] holds index 3, outside \[0, 3\)"):
        padding_waste([[3]], lengths)


def test_bucketing_reduces_padding_on_multi30k(multi30k: Multi30kData) -> None:
    """At 4096 tokens: about 4% padding with bucketing, about 49% with random batches."""
    lengths = multi30k.datasets["train"].lengths
    bucketed = TokenBatchSampler(lengths, 4096, seed=0).batches()
    random_batches = TokenBatchSampler(lengths, 4096, seed=0, bucketing=False).batches()
    check_epoch(bucketed, lengths, 4096)
    check_epoch(random_batches, lengths, 4096)
    waste_bucketed = padding_waste(bucketed, lengths)
    waste_random = padding_waste(random_batches, lengths)
    assert waste_bucketed == pytest.approx(0.04, abs=0.01)
    assert waste_random == pytest.approx(0.49, abs=0.03)
    assert len(bucketed) < 0.6 * len(random_batches)  # fewer, fuller batches


def test_sampler_bad_arguments() -> None:
    lengths = [(3, 4)]
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        TokenBatchSampler(lengths, 0)
    with pytest.raises(TypeError, match="max_tokens must be an int, got str"):
        TokenBatchSampler(lengths, "4096")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_tokens must be an int, got float"):
        TokenBatchSampler(lengths, 4096.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"lengths\[1\] must be a pair of non-negative ints"):
        TokenBatchSampler([(3, 4), (3, -1)], 100)
    with pytest.raises(TypeError, match="shuffle must be a bool"):
        TokenBatchSampler(lengths, 100, shuffle=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be >= 0"):
        TokenBatchSampler(lengths, 100, seed=-1)


def test_many_epochs_cover_every_order() -> None:
    """Small sanity check that shuffling is not stuck: 3 examples, 1 per batch."""
    sampler = TokenBatchSampler([(1, 2)] * 3, max_tokens=3)
    orders = {tuple(itertools.chain.from_iterable(sampler)) for _ in range(40)}
    assert len(orders) == 6
