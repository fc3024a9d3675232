"""Multi30k ready for training, in one call: :func:`prepare_multi30k` (chapter 8).

The whole built from the parts: the three splits of :mod:`companion.data.multi30k`, tokenized
with a :class:`~companion.data.vocab.Tokenizer`, vocabularies built from the training split
only (:class:`~companion.data.vocab.Vocab`), and one
:class:`~companion.data.batching.TranslationDataset` per split. The :class:`Multi30kData` it
returns gives batches of at most ``max_tokens`` tokens (:meth:`Multi30kData.loader`) and
turns sentences into ids and back.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor
from torch.utils.data import DataLoader

from companion._validation import check_positive_int
from companion.data.batching import TokenBatchSampler, TranslationDataset, collate_batch
from companion.data.multi30k import MULTI30K_SPLITS, check_split, load_multi30k
from companion.data.vocab import Tokenizer, Vocab, WordTokenizer

__all__ = ["Multi30kData", "prepare_multi30k"]


@dataclass
class Multi30kData:
    """Multi30k ready for training: tokenizer, vocabularies (from train only) and datasets.

    Attributes:
        tokenizer: the :class:`~companion.data.vocab.Tokenizer` of both languages.
        src_vocab: German vocabulary, built from the training split.
        tgt_vocab: English vocabulary, built from the training split.
        datasets: ``{"train": …, "val": …, "test_2016_flickr": …}``
            :class:`~companion.data.batching.TranslationDataset` objects (German → English).
    """

    tokenizer: Tokenizer
    src_vocab: Vocab
    tgt_vocab: Vocab
    datasets: dict[str, TranslationDataset]

    def loader(
        self,
        split: str,
        max_tokens: int = 4096,
        *,
        shuffle: bool | None = None,
        bucketing: bool | None = None,
        seed: int = 0,
        num_workers: int = 0,
    ) -> DataLoader:
        """A ``DataLoader`` of ``(src (batch, src_len), tgt (batch, tgt_len))`` batches.

        Batches come from a :class:`~companion.data.batching.TokenBatchSampler` with ``max_tokens``. For ``"train"``
        the defaults are ``shuffle=True, bucketing=True``; for the other splits
        ``shuffle=False, bucketing=False``, which keeps the dataset order so translations
        line up with ``datasets[split].pairs``.
        """
        split = check_split(split)
        is_train = split == "train"
        sampler = TokenBatchSampler(
            self.datasets[split].lengths,
            max_tokens,
            shuffle=is_train if shuffle is None else shuffle,
            bucketing=is_train if bucketing is None else bucketing,
            seed=seed,
        )
        return DataLoader(
            self.datasets[split],
            batch_sampler=sampler,
            collate_fn=collate_batch,
            num_workers=num_workers,
        )

    def encode_source(self, sentence: str) -> list[int]:
        """Ids of a German sentence (no special tokens), e.g. to translate a new sentence."""
        return self.src_vocab.encode(self.tokenizer.tokenize(sentence))

    def decode_target(self, ids: Sequence[int] | Tensor) -> str:
        """English sentence of target ids ``(tgt_len,)``: stops at ``<eos>``, detokenized."""
        return self.tokenizer.detokenize(self.tgt_vocab.decode(ids))


def prepare_multi30k(
    root: str | os.PathLike[str] | None = None,
    *,
    min_freq: int = 2,
    lowercase: bool = False,
    tokenizer: Tokenizer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    base_url: str | None = None,
    progress: bool = True,
) -> Multi30kData:
    """Load the three Multi30k splits, build the vocabularies from train, encode everything.

    Args:
        root: folder with a local copy of the raw files (see :func:`~companion.data.multi30k.multi30k_files`).
        min_freq: keep the tokens seen at least this often in the training split.
        lowercase: lowercase all text (only with the default tokenizer).
        tokenizer: any :class:`~companion.data.vocab.Tokenizer`; default ``WordTokenizer(lowercase=lowercase)``.
        cache_dir, download, base_url, progress: as in :func:`~companion.data.multi30k.multi30k_files`.

    Example::

        data = prepare_multi30k()
        for src, tgt in data.loader("train", max_tokens=4096):
            ...  # src (batch, src_len), tgt (batch, tgt_len)
    """
    if tokenizer is None:
        tokenizer = WordTokenizer(lowercase=lowercase)
    elif not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            "tokenizer must have tokenize() and detokenize() methods (the Tokenizer protocol), "
            f"got {type(tokenizer).__name__}"
        )
    check_positive_int("min_freq", min_freq)
    pairs = {
        split: load_multi30k(
            split,
            root,
            cache_dir=cache_dir,
            download=download,
            base_url=base_url,
            progress=progress,
        )
        for split in MULTI30K_SPLITS
    }
    train = pairs["train"]
    src_vocab = Vocab.build((tokenizer.tokenize(de) for de, _ in train), min_freq=min_freq)
    tgt_vocab = Vocab.build((tokenizer.tokenize(en) for _, en in train), min_freq=min_freq)
    datasets = {
        split: TranslationDataset(split_pairs, tokenizer, src_vocab, tgt_vocab)
        for split, split_pairs in pairs.items()
    }
    return Multi30kData(tokenizer, src_vocab, tgt_vocab, datasets)
