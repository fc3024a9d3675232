"""From examples to padded batches: datasets, collation and batching by token count (chapter 8).

In reading order:

1. :class:`TranslationDataset`: sentence pairs, tokenized and turned into ids once.
2. :func:`collate_batch` pads a list of ``(src_ids, tgt_ids)`` examples into
   ``src (batch, src_len)`` and ``tgt (batch, tgt_len)`` tensors, the target wrapped in
   ``<bos> … <eos>``. Chapters 3 to 7 use it with the toy task
   (:class:`~companion.data.toy.CopyReverseDataset`), chapter 8 with Multi30k.
3. :class:`TokenBatchSampler` groups examples of similar length into batches of at most
   ``max_tokens`` tokens (padding included), and :func:`padding_waste` measures how much of
   a batch is padding; chapter 8 compares bucketed and random batches with it.

Conventions: a source sequence carries no special tokens; a target sequence gets ``<bos>`` in
front and ``<eos>`` at the end when it is collated, so a model reads ``tgt[:, :-1]`` and
predicts ``tgt[:, 1:]``. Padding is always :data:`~companion.data.vocab.PAD_ID` (0).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from companion._validation import check_bool, check_positive_int
from companion.data.vocab import BOS_ID, EOS_ID, PAD_ID, Tokenizer, Vocab, check_id_sequence

__all__ = ["TranslationDataset", "collate_batch", "TokenBatchSampler", "padding_waste"]

# ---------------------------------------------------------------------------------------------
# 1. Datasets and collation
# ---------------------------------------------------------------------------------------------


class TranslationDataset(Dataset):
    """Sentence pairs, tokenized and turned into ids once, up front.

    An item is ``(src_ids, tgt_ids)``, two lists of ints without special tokens (as for
    :class:`~companion.data.toy.CopyReverseDataset`), ready for :func:`collate_batch`. The raw text stays available
    as :attr:`pairs` (the references for BLEU).

    Args:
        pairs: ``(source sentence, target sentence)`` pairs.
        tokenizer: a :class:`~companion.data.vocab.Tokenizer` used for both languages.
        src_vocab: vocabulary of the source language.
        tgt_vocab: vocabulary of the target language.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        tokenizer: Tokenizer,
        src_vocab: Vocab,
        tgt_vocab: Vocab,
    ) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                "tokenizer must have tokenize() and detokenize() methods (the Tokenizer "
                f"protocol), got {type(tokenizer).__name__}"
            )
        for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
            if not isinstance(vocab, Vocab):
                raise TypeError(f"{name} must be a Vocab, got {type(vocab).__name__}")
        self.pairs = list(pairs)
        self.tokenizer, self.src_vocab, self.tgt_vocab = tokenizer, src_vocab, tgt_vocab
        self.examples: list[tuple[list[int], list[int]]] = [
            (src_vocab.encode(tokenizer.tokenize(src)), tgt_vocab.encode(tokenizer.tokenize(tgt)))
            for src, tgt in self.pairs
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.examples[index]

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """Collated length of every example: ``(src_len, tgt_len + 2)`` (``<bos>``, ``<eos>``)."""
        return [(len(src), len(tgt) + 2) for src, tgt in self.examples]


def collate_batch(
    examples: Sequence[tuple[Sequence[int] | Tensor, Sequence[int] | Tensor]],
    *,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> tuple[Tensor, Tensor]:
    """Pad a list of ``(src_ids, tgt_ids)`` examples into two LongTensors.

    Returns:
        ``src`` of shape ``(batch, src_len)`` and ``tgt`` of shape ``(batch, tgt_len)``, where
        ``src_len`` is the longest source and ``tgt_len`` the longest target plus 2: each
        target row is ``<bos> ids <eos>`` followed by ``pad_id``; sources get no special
        tokens. Use it as a ``DataLoader``'s ``collate_fn``.
    """
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise TypeError(
            f"examples must be a list of (src_ids, tgt_ids) pairs, got {type(examples).__name__}"
        )
    if len(examples) == 0:
        raise ValueError("examples must hold at least one (src_ids, tgt_ids) pair, got none")
    sources, targets = [], []
    for position, example in enumerate(examples):
        if not isinstance(example, (tuple, list)) or len(example) != 2:
            raise TypeError(
                f"examples[{position}] must be a (src_ids, tgt_ids) pair, got {example!r:.80}"
            )
        sources.append(check_id_sequence(f"examples[{position}][0]", example[0]))
        targets.append([bos_id, *check_id_sequence(f"examples[{position}][1]", example[1]), eos_id])
    batch = len(examples)
    src_len = max(len(ids) for ids in sources)
    tgt_len = max(len(ids) for ids in targets)
    src = torch.full((batch, src_len), pad_id, dtype=torch.long)  # (batch, src_len)
    tgt = torch.full((batch, tgt_len), pad_id, dtype=torch.long)  # (batch, tgt_len)
    for row, (src_ids, tgt_ids) in enumerate(zip(sources, targets)):
        src[row, : len(src_ids)] = torch.tensor(src_ids, dtype=torch.long)  # (len(src_ids),)
        tgt[row, : len(tgt_ids)] = torch.tensor(tgt_ids, dtype=torch.long)  # (len(tgt_ids),)
    return src, tgt


# ---------------------------------------------------------------------------------------------
# 2. Batching by token count
# ---------------------------------------------------------------------------------------------


def _check_lengths(lengths: object) -> list[tuple[int, int]]:
    """Return ``lengths`` as a list of ``(src_len, tgt_len)`` pairs of non-negative ints."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError(
            f"lengths must be a sequence of (src_len, tgt_len) pairs, got {type(lengths).__name__}"
        )
    checked = []
    for position, pair in enumerate(lengths):
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2
        ok = ok and all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in pair)
        if not ok or min(pair) < 0:
            raise ValueError(
                f"lengths[{position}] must be a pair of non-negative ints (src_len, tgt_len), "
                f"got {pair!r}"
            )
        checked.append((int(pair[0]), int(pair[1])))
    return checked


def _batch_cost(max_src: int, max_tgt: int, size: int) -> int:
    """Tokens in a padded batch: ``size`` rows of ``max_src + max_tgt``."""
    return size * (max_src + max_tgt)


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of example indices holding at most ``max_tokens`` tokens, padding included.

    A batch of ``n`` examples whose longest source has ``S`` tokens and longest (collated)
    target ``T`` becomes tensors of ``n·S + n·T`` tokens; the sampler keeps that at or below
    ``max_tokens``. The one exception: an example that alone exceeds ``max_tokens`` is not
    dropped but gets a batch of its own.

    Each epoch, with ``bucketing`` (the default):

    1. the indices are shuffled (``shuffle=True``), then stably sorted by
       ``(src_len, tgt_len)``, so examples of similar length sit next to each other (equal
       lengths in a new random order each epoch);
    2. consecutive examples are packed greedily into batches;
    3. the order of the batches is shuffled (``shuffle=True``).

    ``bucketing=False`` packs the (shuffled) examples as they come: the plain random batching
    that :func:`padding_waste` compares against. ``shuffle=False, bucketing=False`` keeps the
    dataset's order, so that translations line up with the references.

    The randomness of epoch ``e`` comes from ``numpy.random.default_rng([seed, e])``: the same
    seed gives the same batches. The epoch counter starts at 0 and advances after every full
    pass of ``iter()``, so each pass of a ``DataLoader`` gets a new shuffle; :meth:`set_epoch`
    sets it explicitly.

    Args:
        lengths: ``(src_len, tgt_len)`` of each example *as collated* (targets with
            ``<bos>``/``<eos>``); a dataset's ``.lengths``.
        max_tokens: the token budget of a batch (source + target, padding included).
        shuffle: shuffle examples and batches each epoch.
        bucketing: sort by length before packing.
        seed: seed of the shuffles.
    """

    def __init__(
        self,
        lengths: Sequence[tuple[int, int]],
        max_tokens: int,
        *,
        shuffle: bool = True,
        bucketing: bool = True,
        seed: int = 0,
    ) -> None:
        self.lengths = _check_lengths(lengths)
        self.max_tokens = check_positive_int("max_tokens", max_tokens)
        self.shuffle = check_bool("shuffle", shuffle)
        self.bucketing = check_bool("bucketing", bucketing)
        self.seed = check_positive_int("seed", seed, minimum=0)
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of epoch ``epoch`` for the next pass."""
        self.epoch = check_positive_int("epoch", epoch, minimum=0)

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """The batches of epoch ``epoch`` (default: the current one) as lists of indices."""
        epoch = self.epoch if epoch is None else check_positive_int("epoch", epoch, minimum=0)
        if self._cache is not None and self._cache[0] == epoch:
            return [list(batch) for batch in self._cache[1]]
        rng = np.random.default_rng([self.seed, epoch])
        order = np.arange(len(self.lengths))  # (num_examples,) example indices
        if self.shuffle:
            order = rng.permutation(order)
        if self.bucketing and len(order):
            src_lens = np.array([self.lengths[i][0] for i in order])  # (num_examples,)
            tgt_lens = np.array([self.lengths[i][1] for i in order])  # (num_examples,)
            order = order[np.lexsort((tgt_lens, src_lens))]  # stable: by src_len, then tgt_len
        batches: list[list[int]] = []
        current: list[int] = []
        max_src = max_tgt = 0
        for index in order.tolist():
            src_len, tgt_len = self.lengths[index]
            new_src, new_tgt = max(max_src, src_len), max(max_tgt, tgt_len)
            if current and _batch_cost(new_src, new_tgt, len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, new_src, new_tgt = [], src_len, tgt_len
            current.append(index)
            max_src, max_tgt = new_src, new_tgt
        if current:
            batches.append(current)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return [list(batch) for batch in batches]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        self.epoch += 1
        yield from batches

    def __len__(self) -> int:
        """Number of batches in the current epoch (it can vary slightly between epochs)."""
        return len(self.batches())


def padding_waste(batches: Iterable[Sequence[int]], lengths: Sequence[tuple[int, int]]) -> float:
    """Fraction of the tokens in padded batches that are padding (source and target together).

    ``batches`` holds lists of example indices (e.g. :meth:`TokenBatchSampler.batches`) and
    ``lengths[i]`` the collated ``(src_len, tgt_len)`` of example ``i``. A batch of ``n``
    examples costs ``n · (max src_len + max tgt_len)`` tokens; the waste is
    ``1 - real tokens / padded tokens``, 0 when no padding is needed.
    """
    lengths = _check_lengths(lengths)
    real = padded = 0
    for position, batch in enumerate(batches):
        indices = check_id_sequence(f"batches[{position}]", batch)
        if not indices:
            continue
        bad = [i for i in indices if not 0 <= i < len(lengths)]
        if bad:
            raise ValueError(
                f"batches[{position}] holds index {bad[0]}, outside [0, {len(lengths)})"
            )
        src_lens = [lengths[i][0] for i in indices]
        tgt_lens = [lengths[i][1] for i in indices]
        real += sum(src_lens) + sum(tgt_lens)
        padded += _batch_cost(max(src_lens), max(tgt_lens), len(indices))
    return 1.0 - real / padded if padded else 0.0
