"""companion.data.toy: the copy/reverse toy task."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from companion.data import BOS_ID, EOS_ID, PAD_ID, CopyReverseDataset, collate_batch


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_toy_targets(task: str) -> None:
    dataset = CopyReverseDataset(task, num_examples=500, min_len=2, max_len=7, seed=3)
    assert len(dataset) == 500
    assert dataset.vocab_size == 4 + 10
    for src, tgt in dataset:
        assert 2 <= len(src) <= 7
        assert tgt == (src if task == "copy" else src[::-1])
        assert all(4 <= i < 14 for i in src)  # symbols only, no special tokens
    assert {len(src) for src, _ in dataset} == set(range(2, 8))  # every length occurs
    src, tgt = dataset[0]
    assert "".join(dataset.vocab.decode(src)) == "".join(str(i - 4) for i in src)
    assert dataset.lengths[0] == (len(src), len(tgt) + 2)


def test_toy_is_deterministic_per_seed() -> None:
    first = CopyReverseDataset("reverse", num_examples=200, seed=0)
    again = CopyReverseDataset("reverse", num_examples=200, seed=0)
    other = CopyReverseDataset("reverse", num_examples=200, seed=1)
    assert list(first) == list(again)
    assert list(first) != list(other)


def test_toy_batches_through_a_dataloader() -> None:
    dataset = CopyReverseDataset("reverse", num_examples=64, seed=0)
    loader = DataLoader(dataset, batch_size=16, shuffle=True, collate_fn=collate_batch)
    src, tgt = next(iter(loader))
    assert src.dtype == tgt.dtype == torch.long
    assert src.shape[0] == tgt.shape[0] == 16
    assert tgt.shape[1] == src.shape[1] + 2  # <bos> … <eos> around the longest target
    assert bool((tgt[:, 0] == BOS_ID).all())
    for src_row, tgt_row in zip(src, tgt):
        symbols = src_row[src_row != PAD_ID]  # (length,)
        length = len(symbols)
        assert torch.equal(tgt_row[1 : length + 1], symbols.flip(0))
        assert tgt_row[length + 1] == EOS_ID
        assert bool((tgt_row[length + 2 :] == PAD_ID).all())


def test_toy_bad_arguments() -> None:
    with pytest.raises(ValueError, match="task must be one of .*got 'rotate'"):
        CopyReverseDataset("rotate")
    with pytest.raises(ValueError, match="max_len must be >= min_len = 5, got 3"):
        CopyReverseDataset(min_len=5, max_len=3)
    with pytest.raises(ValueError, match="num_examples must be >= 1"):
        CopyReverseDataset(num_examples=0)
    with pytest.raises(TypeError, match="num_symbols must be an int"):
        CopyReverseDataset(num_symbols=10.0)  # type: ignore[arg-type]
