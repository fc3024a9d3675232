"""companion.data.prepare: Multi30k ready for training (vocabularies, datasets, loaders).

The tests read the shared local copy (the ``multi30k`` fixture of conftest.py) and are
skipped when it is absent; nothing is downloaded.
"""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import SHARED_MULTI30K as SHARED

from companion.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Multi30kData,
    TokenBatchSampler,
    TranslationDataset,
    Vocab,
    prepare_multi30k,
)


def test_multi30k_splits_and_encoding(multi30k: Multi30kData) -> None:
    sizes = {split: len(dataset) for split, dataset in multi30k.datasets.items()}
    assert sizes == {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
    dataset = multi30k.datasets["val"]
    de, en = dataset.pairs[0]
    src_ids, tgt_ids = dataset[0]
    assert src_ids == multi30k.encode_source(de)
    assert multi30k.decode_target([BOS_ID, *tgt_ids, EOS_ID, PAD_ID]) == en
    assert dataset.lengths[0] == (len(src_ids), len(tgt_ids) + 2)
    assert isinstance(dataset, TranslationDataset)


def test_vocab_comes_from_train_only(multi30k: Multi30kData) -> None:
    tokenizer = multi30k.tokenizer
    train = multi30k.datasets["train"].pairs
    expected_de = Vocab.build((tokenizer.tokenize(de) for de, _ in train), min_freq=2)
    expected_en = Vocab.build((tokenizer.tokenize(en) for _, en in train), min_freq=2)
    assert multi30k.src_vocab == expected_de
    assert multi30k.tgt_vocab == expected_en
    # At min_freq=2: 8,011 German and 6,270 English tokens (specials included).
    assert (len(multi30k.src_vocab), len(multi30k.tgt_vocab)) == (8011, 6270)
    # A word that occurs in validation/test but never in train is unknown.
    train_words = {t for _, en in train for t in tokenizer.tokenize(en)}
    held_out = [
        t
        for split in ("val", "test_2016_flickr")
        for _, en in multi30k.datasets[split].pairs
        for t in tokenizer.tokenize(en)
        if t not in train_words
    ]
    assert held_out, "validation and test should contain words unseen in training"
    assert all(t not in multi30k.tgt_vocab for t in held_out)
    assert multi30k.tgt_vocab.encode(held_out[:5]) == [UNK_ID] * 5


def test_multi30k_loader_batches(multi30k: Multi30kData) -> None:
    loader = multi30k.loader("train", max_tokens=4096, seed=0)
    seen: Counter[int] = Counter()
    sampler = loader.batch_sampler
    assert isinstance(sampler, TokenBatchSampler)
    batches = sampler.batches()  # the batches the loader is about to produce
    for (src, tgt), indices in zip(loader, batches):
        assert src.shape[0] == tgt.shape[0] == len(indices)
        assert src.numel() + tgt.numel() <= 4096
        assert bool((tgt[:, 0] == BOS_ID).all())
        assert int((tgt == EOS_ID).sum()) == len(indices)  # one <eos> per row
        seen.update(indices)
    assert seen == Counter(range(29_000))
    # Evaluation order: val batches follow the dataset, so outputs line up with references.
    val = multi30k.datasets["val"]
    decoded = [
        multi30k.decode_target(row)
        for _, tgt in multi30k.loader("val", max_tokens=2000)
        for row in tgt
    ]
    tokenizer = multi30k.tokenizer
    expected = [tokenizer.detokenize(multi30k.tgt_vocab.decode(ids)) for _, ids in val.examples]
    assert decoded == expected


def test_prepare_multi30k_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_freq must be >= 1, got 0"):
        prepare_multi30k(SHARED, min_freq=0)
    with pytest.raises(TypeError, match="tokenizer must have tokenize"):
        prepare_multi30k(SHARED, tokenizer=str.split)  # type: ignore[arg-type]
