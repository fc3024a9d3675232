"""Language-model data: the English side of Multi30k as sentences to continue (chapter 10).

In reading order:

1. :func:`english_sentences`: the English sentences of one Multi30k split, through
   :func:`~companion.data.multi30k.load_multi30k` (a local copy with ``root=`` or
   ``$MULTI30K_ROOT``, otherwise the checked download).
2. :class:`LanguageModelData`: a word vocabulary built from the *training* sentences, every
   split encoded, and batches ``(batch, len)`` of ``<bos> words <eos> <pad>…`` rows, similar
   lengths together (a :class:`~companion.data.batching.TokenBatchSampler`), so that a small
   GPT trains on a CPU without wasting its time on padding.
3. :func:`ngram_perplexity`: the unigram and bigram baselines, add-``k`` smoothed, that a
   trained model must beat.

**What a perplexity counts** (the model and the baselines alike): a sentence of ``n`` words
is read as ``<bos> w1 … wn <eos>`` and contributes ``n + 1`` predictions, ``w1 … wn`` and
``<eos>`` (knowing where a sentence ends is part of the task); ``<bos>`` is given, never
predicted. A word outside the vocabulary is predicted as ``<unk>``, like any other token.
Perplexity is ``exp`` of the mean negative log-probability over those predictions, the same
as ``exp(sequence_loss(...))`` over :func:`~companion.data.objectives.causal_lm_example`'s
targets of these batches.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from companion._validation import (
    check_bool,
    check_nonnegative_float,
    check_positive_int,
)
from companion.data.batching import TokenBatchSampler, collate_batch
from companion.data.multi30k import check_split, load_multi30k
from companion.data.vocab import (
    BOS_ID,
    EOS_ID,
    SPECIAL_TOKENS,
    Tokenizer,
    Vocab,
    WordTokenizer,
    check_id_sequence,
    check_sentences,
)

__all__ = [
    "english_sentences",
    "LanguageModelData",
    "ngram_perplexity",
]

# ---------------------------------------------------------------------------------------------
# 1. Sentences
# ---------------------------------------------------------------------------------------------


def english_sentences(
    split: str,
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    progress: bool = True,
) -> list[str]:
    """The English sentences of one Multi30k split, raw text, in the files' order.

    ``split`` is ``"train"`` (29,000 sentences), ``"val"`` (1,014) or ``"test_2016_flickr"``
    (1,000; ``"test"`` also works). ``root``, ``download`` and ``progress`` are passed to
    :func:`~companion.data.multi30k.load_multi30k`: ``root`` (or ``$MULTI30K_ROOT``) names a
    folder with a local copy, otherwise the files are downloaded once and checked.
    """
    return [
        english for _, english in load_multi30k(split, root, download=download, progress=progress)
    ]


# ---------------------------------------------------------------------------------------------
# 2. Vocabulary, encoded splits and batches
# ---------------------------------------------------------------------------------------------


@dataclass
class LanguageModelData:
    """Sentences encoded for a language model, with the vocabulary of the training split.

    Build it with :meth:`from_multi30k` (the English side of Multi30k) or :meth:`from_texts`
    (any sentences, e.g. a tiny corpus in a test). Each split is kept as lists of word ids
    without special tokens (:attr:`ids`); :meth:`batches` pads them into ``(batch, len)``
    tensors whose rows are ``<bos> w1 … wn <eos>`` followed by ``<pad>``, ready for
    :func:`~companion.data.objectives.causal_lm_example` (GPT) or
    :func:`~companion.data.objectives.masked_lm_example` (BERT; ``<bos>`` plays ``[CLS]``).

    Attributes:
        tokenizer: turns a sentence into tokens and back.
        vocab: built from the training split only; its ids 0-3 are ``<pad> <bos> <eos>
            <unk>``, then the extra special tokens, then the words by decreasing count.
        texts: the raw sentences of each split, ``{"train": [...], "val": [...], ...}``.
        ids: each split's sentences as lists of word ids (no ``<bos>``, ``<eos>``).
        extra_special_tokens: tokens added after the four specials (``"<mask>"`` for a BERT,
            sentinels for span corruption); they never occur in the text.
    """

    tokenizer: Tokenizer
    vocab: Vocab
    texts: dict[str, list[str]]
    ids: dict[str, list[list[int]]]
    extra_special_tokens: tuple[str, ...] = ()

    @classmethod
    def from_texts(
        cls,
        texts: Mapping[str, Sequence[str]],
        *,
        tokenizer: Tokenizer | None = None,
        min_freq: int = 2,
        max_size: int | None = None,
        extra_special_tokens: Sequence[str] = (),
    ) -> LanguageModelData:
        """Encode every split of ``texts``, with a vocabulary built from ``texts["train"]``.

        Args:
            texts: ``{split: sentences}``, raw text; must hold ``"train"``.
            tokenizer: default :class:`~companion.data.vocab.WordTokenizer` (case kept).
            min_freq: keep the training tokens seen at least this often (others → ``<unk>``).
            max_size: at most this many ids in all (specials included): the most frequent
                words are kept.
            extra_special_tokens: tokens placed right after ``<pad> <bos> <eos> <unk>``
                (ids 4, 5, …), e.g. ``("<mask>",)``.
        """
        if not isinstance(texts, Mapping) or "train" not in texts:
            raise ValueError(
                "texts must be a mapping {split: sentences} holding 'train' (the vocabulary "
                f"is built from it), got {type(texts).__name__}"
                + (f" with splits {sorted(texts)}" if isinstance(texts, Mapping) else "")
            )
        for split, sentences in texts.items():
            if isinstance(sentences, str) or not isinstance(sentences, Sequence):
                raise TypeError(
                    f"texts[{split!r}] must be a list of sentences (str), "
                    f"got {type(sentences).__name__}"
                )
        if tokenizer is None:
            tokenizer = WordTokenizer()
        elif not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                "tokenizer must have tokenize() and detokenize() methods (the Tokenizer "
                f"protocol), got {type(tokenizer).__name__}"
            )
        extras = tuple(extra_special_tokens)
        bad = [t for t in extras if not isinstance(t, str)]
        if bad:
            raise TypeError(f"extra_special_tokens must hold str, got {type(bad[0]).__name__}")
        if max_size is not None:
            check_positive_int("max_size", max_size, minimum=len(SPECIAL_TOKENS) + len(extras))
        tokenized = {
            split: [tokenizer.tokenize(s) for s in sentences] for split, sentences in texts.items()
        }
        words = Vocab.build(
            tokenized["train"],
            min_freq=min_freq,
            max_size=None if max_size is None else max_size - len(extras),
        )
        special = set(extras) & set(words.tokens)
        if special:
            raise ValueError(
                f"extra_special_tokens must not occur in the text, got {sorted(special)} "
                "among the training tokens"
            )
        vocab = Vocab([*SPECIAL_TOKENS, *extras, *words.tokens[len(SPECIAL_TOKENS) :]])
        ids = {
            split: [vocab.encode(tokens) for tokens in sentences]
            for split, sentences in tokenized.items()
        }
        plain_texts = {split: list(sentences) for split, sentences in texts.items()}
        return cls(tokenizer, vocab, plain_texts, ids, extras)

    @classmethod
    def from_multi30k(
        cls,
        root: str | os.PathLike[str] | None = None,
        *,
        splits: Sequence[str] = ("train", "val"),
        lowercase: bool = False,
        min_freq: int = 2,
        max_size: int | None = None,
        extra_special_tokens: Sequence[str] = (),
        download: bool = True,
        progress: bool = True,
    ) -> LanguageModelData:
        """The English side of Multi30k: ``splits`` loaded with :func:`english_sentences`.

        Args:
            root, download, progress: as in :func:`english_sentences`.
            splits: which splits to load; ``"train"`` is always loaded (for the vocabulary).
            lowercase: lowercase the text (a smaller vocabulary; ``"A"`` and ``"a"`` merge).
            min_freq, max_size, extra_special_tokens: as in :meth:`from_texts`.

        Example::

            data = LanguageModelData.from_multi30k("../shared/data/multi30k")
            for batch in data.batches("train", max_tokens=2048):
                inputs, targets, mask = causal_lm_example(batch)  # (batch, len - 1) ...
        """
        check_bool("lowercase", lowercase)
        names = ["train", *(check_split(s) for s in splits if check_split(s) != "train")]
        texts = {
            name: english_sentences(name, root, download=download, progress=progress)
            for name in dict.fromkeys(names)
        }
        return cls.from_texts(
            texts,
            tokenizer=WordTokenizer(lowercase=lowercase),
            min_freq=min_freq,
            max_size=max_size,
            extra_special_tokens=extra_special_tokens,
        )

    # --- ids and text ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return len(self.vocab)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of ``<pad> <bos> <eos> <unk>`` and of the extra special tokens."""
        return tuple(range(len(SPECIAL_TOKENS) + len(self.extra_special_tokens)))

    def token_id(self, token: str) -> int:
        """The id of ``token`` (e.g. ``"<mask>"``), ``<unk>``'s id when it is unknown."""
        return self.vocab.token_to_id(token)

    def encode(self, sentence: str) -> list[int]:
        """Word ids of a sentence, without ``<bos>`` or ``<eos>``."""
        return self.vocab.encode(self.tokenizer.tokenize(sentence))

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Text of ``ids`` ``(len,)``: ``<pad>`` and ``<bos>`` dropped, stops at ``<eos>``."""
        return self.tokenizer.detokenize(self.vocab.decode(ids))

    def _split_ids(self, split: str) -> list[list[int]]:
        if not isinstance(split, str) or split not in self.ids:
            raise ValueError(f"split must be one of {sorted(self.ids)}, got {split!r}")
        return self.ids[split]

    def num_predictions(self, split: str) -> int:
        """How many tokens a perplexity on ``split`` averages over: words plus one ``<eos>``
        per sentence (``<bos>`` is never predicted)."""
        return sum(len(sentence) + 1 for sentence in self._split_ids(split))

    # --- batches -----------------------------------------------------------------------------

    def index_batches(
        self,
        split: str,
        max_tokens: int = 2048,
        *,
        shuffle: bool | None = None,
        seed: int = 0,
        epoch: int = 0,
    ) -> list[list[int]]:
        """The sentence indices of each batch of :meth:`batches` (same arguments)."""
        sentences = self._split_ids(split)
        check_positive_int("max_tokens", max_tokens)
        shuffle = split == "train" if shuffle is None else check_bool("shuffle", shuffle)
        lengths = [(0, len(sentence) + 2) for sentence in sentences]  # rows with <bos>, <eos>
        sampler = TokenBatchSampler(lengths, max_tokens, shuffle=shuffle, bucketing=True, seed=seed)
        return sampler.batches(check_positive_int("epoch", epoch, minimum=0))

    def batches(
        self,
        split: str,
        max_tokens: int = 2048,
        *,
        shuffle: bool | None = None,
        seed: int = 0,
        epoch: int = 0,
    ) -> list[Tensor]:
        """One epoch of ``split`` as padded batches, similar lengths together.

        Each batch is a LongTensor ``(batch, len)``: row ``i`` is ``<bos> w1 … wn <eos>``
        then ``<pad>`` up to the batch's longest row, and ``batch · len <= max_tokens``
        (padding included; a sentence longer than ``max_tokens`` alone gets a batch of its
        own). The sentences are sorted by length before packing (bucketing), so rows of a
        batch are nearly the same length and little is padding.

        With ``shuffle`` (default: only for ``"train"``) sentences of equal length are
        shuffled before packing and the batches come in a random order, different for each
        ``epoch`` and reproducible from ``seed``; without it, the batches go from the
        shortest sentences to the longest, and every sentence is in exactly one batch either
        way (:meth:`index_batches` tells which).

        Args:
            split: a split of :attr:`ids`, e.g. ``"train"`` or ``"val"``.
            max_tokens: the token budget of a batch.
            shuffle: shuffle as above (default ``split == "train"``).
            seed: seed of the shuffles.
            epoch: which epoch's shuffle.

        Returns:
            A list of ``(batch, len)`` LongTensors.
        """
        sentences = self._split_ids(split)
        groups = self.index_batches(split, max_tokens, shuffle=shuffle, seed=seed, epoch=epoch)
        return [  # each (batch, len)
            collate_batch([((), sentences[i]) for i in group])[1] for group in groups
        ]

    def ngram_perplexity(self, n: int, k: float = 0.01, *, split: str = "val") -> float:
        """:func:`ngram_perplexity` of an ``n``-gram model trained on ``"train"``, on ``split``."""
        return ngram_perplexity(
            self.ids["train"], self._split_ids(split), n, k, vocab_size=self.vocab_size
        )


# ---------------------------------------------------------------------------------------------
# 3. The n-gram baselines
# ---------------------------------------------------------------------------------------------


def _framed(sentence: Sequence[int], n: int) -> list[int]:
    """``<bos>`` × (n - 1), the words, ``<eos>``: the first prediction has a full context."""
    return [BOS_ID] * (n - 1) + list(sentence) + [EOS_ID]


def ngram_perplexity(
    train: Sequence[Sequence[int]],
    valid: Sequence[Sequence[int]],
    n: int,
    k: float = 0.01,
    *,
    vocab_size: int,
) -> float:
    """Perplexity on ``valid`` of an add-``k`` smoothed ``n``-gram model counted on ``train``.

    Each sentence (word ids, no special tokens) is read as ``<bos>``×(n-1) ``w1 … wm
    <eos>``; its ``m + 1`` predictions are ``w1 … wm`` and ``<eos>``, each from the ``n - 1``
    tokens before it (``n = 1``: from nothing; ``n = 2``: the previous token, ``<bos>`` for
    the first word). The probability of token ``w`` after context ``h`` is add-``k``
    (Lidstone) smoothed:

    .. math:: P(w \\mid h) = \\frac{c(h, w) + k}{c(h) + k V}

    where ``c(h, w)`` counts ``w`` after ``h`` in ``train``, ``c(h)`` counts the predictions
    made from ``h`` and ``V = vocab_size - 2`` is the number of tokens that can be predicted
    (every id but ``<pad>`` and ``<bos>``). ``k = 1`` is Laplace's rule, which gives far too
    much probability to unseen pairs when ``V`` is in the thousands: on Multi30k's English
    (about 6,300 ids) a bigram model's validation perplexity is about 146 with ``k = 1``, 66
    with ``0.1``, 49 with ``0.01`` (the default) and 50 with ``0.001``; a unigram model's is
    about 232 for all of them. A context never seen in training gets the uniform ``1 / V``.
    The perplexity is ``exp(-(1/N) Σ log P(w | h))`` over the ``N`` predictions of ``valid``.

    Args:
        train: sentences to count on, lists of ids in ``[0, vocab_size)``.
        valid: sentences to measure on.
        n: order of the model, ``>= 1`` (1 = unigram, 2 = bigram).
        k: the added count, ``>= 0``; ``0`` is the unsmoothed model (an unseen pair then
            makes the perplexity infinite).
        vocab_size: size of the vocabulary (specials included, as the model's output).

    Returns:
        The perplexity (a float ``>= 1``, ``inf`` when a prediction has probability 0).
    """
    check_positive_int("n", n)
    k = check_nonnegative_float("k", k)
    check_positive_int("vocab_size", vocab_size, minimum=len(SPECIAL_TOKENS))
    outcomes = vocab_size - 2  # every id but <pad> and <bos>
    for name, sentences in (("train", train), ("valid", valid)):
        check_sentences(name, sentences, vocab_size)
    pair_counts: Counter[tuple[int, ...]] = Counter()
    context_counts: Counter[tuple[int, ...]] = Counter()
    for sentence in train:
        framed = _framed(check_id_sequence("train", sentence), n)
        for end in range(n - 1, len(framed)):
            context = tuple(framed[end - n + 1 : end])
            pair_counts[(*context, framed[end])] += 1
            context_counts[context] += 1
    total_log_prob, predictions = 0.0, 0
    for sentence in valid:
        framed = _framed(check_id_sequence("valid", sentence), n)
        for end in range(n - 1, len(framed)):
            context = tuple(framed[end - n + 1 : end])
            numerator = pair_counts[(*context, framed[end])] + k
            denominator = context_counts[context] + k * outcomes
            if denominator == 0:  # context never seen and k = 0: nothing to go on, uniform
                numerator, denominator = 1.0, outcomes
            if numerator == 0:
                return math.inf
            total_log_prob += math.log(numerator / denominator)
            predictions += 1
    if predictions == 0:
        raise ValueError("valid must hold at least one sentence, got none")
    return math.exp(-total_log_prob / predictions)
