"""Count baselines for chapter 10's Transformers: the models an expert compares them with.

1. :class:`KneserNeyTrigram`: an interpolated Kneser-Ney trigram language model
   (Kneser and Ney, 1995; the interpolated form of Chen and Goodman, 1999), the standard
   n-gram baseline for perplexity. It predicts exactly the tokens that
   :func:`companion.data.ngram_perplexity` predicts (each word and the ``<eos>`` of every
   sentence, never ``<bos>``), so the perplexities compare.
2. :class:`NeighbourGuesser`: a count model that guesses a hidden word from its left and right
   neighbours, the baseline for a masked language model's accuracy.

Both count on training sentences given as lists of word ids (no ``<bos>``/``<eos>``); the
ids ``<pad>`` = 0 and ``<bos>`` = 1 are never predicted, so the number of possible outcomes is
``vocab_size - 2``, as in :func:`companion.data.ngram_perplexity`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from companion._validation import check_nonnegative_float, check_positive_int
from companion.data.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, check_sentences

__all__ = ["KneserNey", "KneserNeyTrigram", "NeighbourGuesser"]


class KneserNeyTrigram:
    """Interpolated Kneser-Ney trigram model counted on ``train``.

    Each sentence is read as ``<bos> w1 … wm <eos>``. The word after ``<bos>`` is predicted
    from the bigram level with context ``<bos>``; every later token ``w`` from the two before
    it, ``(u, v)``. With one absolute discount ``D`` at every order:

    .. math::

        P_3(w \\mid u, v) &= \\frac{\\max(c(uvw) - D, 0)}{c(uv\\cdot)}
            + \\frac{D\\, N_{1+}(uv\\cdot)}{c(uv\\cdot)}\\, P_2(w \\mid v) \\\\
        P_2(w \\mid v) &= \\frac{\\max(n(vw) - D, 0)}{\\sum_x n(vx)}
            + \\frac{D\\, N_{1+}(v\\cdot)}{\\sum_x n(vx)}\\, P_1(w) \\\\
        P_1(w) &= \\frac{\\max(N_{1+}(\\cdot w) - D, 0)}{N_{1+}(\\cdot\\cdot)}
            + \\frac{D\\, N_{1+}(\\text{types})}{N_{1+}(\\cdot\\cdot)}\\, \\frac{1}{V}

    ``c`` counts n-grams, ``N_{1+}(uv·)`` the distinct words seen after ``uv``; the lower
    orders use *continuation* counts: ``n(vw) = N_{1+}(·vw)``, the number of distinct words
    seen before ``vw``, except after ``<bos>``, which nothing precedes (there ``n`` is the
    plain count, as KenLM does); ``N_{1+}(·w)`` is the number of distinct words seen before
    ``w``. ``V = vocab_size - 2`` outcomes; a context never seen falls to the order below.

    Args:
        train: training sentences, lists of ids in ``[0, vocab_size)``, no ``<pad>``/``<bos>``.
        vocab_size: size of the vocabulary (specials included).
    """

    def __init__(self, train: Sequence[Sequence[int]], vocab_size: int) -> None:
        self.vocab_size = check_positive_int("vocab_size", vocab_size, minimum=len(SPECIAL_TOKENS))
        self.outcomes = vocab_size - 2  # every id but <pad> and <bos>
        sentences = check_sentences("train", train, vocab_size)
        self.trigram: Counter[tuple[int, int, int]] = Counter()
        bigram_plain: Counter[tuple[int, int]] = Counter()
        for sentence in sentences:
            framed = [BOS_ID, *sentence, EOS_ID]
            bigram_plain.update(zip(framed[:-1], framed[1:]))
            self.trigram.update(zip(framed[:-2], framed[1:-1], framed[2:]))
        self.trigram_context: Counter[tuple[int, int]] = Counter()
        self.trigram_types: Counter[tuple[int, int]] = Counter()
        continuation: Counter[tuple[int, int]] = Counter()
        for (u, v, w), count in self.trigram.items():
            self.trigram_context[(u, v)] += count
            self.trigram_types[(u, v)] += 1
            continuation[(v, w)] += 1  # one more distinct u before (v, w)
        for (v, w), count in bigram_plain.items():
            if v == BOS_ID:
                continuation[(v, w)] = count  # nothing precedes <bos>: plain counts
        self.bigram = continuation
        self.bigram_context: Counter[int] = Counter()
        self.bigram_types: Counter[int] = Counter()
        self.unigram: Counter[int] = Counter()  # N1+(. w): distinct words before w
        for (v, _w), count in self.bigram.items():
            self.bigram_context[v] += count
            self.bigram_types[v] += 1
        for _v, w in bigram_plain:
            self.unigram[w] += 1
        self.unigram_total = sum(self.unigram.values())
        self.unigram_types = len(self.unigram)

    def probability(self, word: int, context: Sequence[int], discount: float = 0.75) -> float:
        """``P(word | context)``; ``context`` is ``(u, v)``, the two tokens before, or
        ``(<bos>,)`` for a sentence's first word. ``discount``: ``D`` in ``[0, 1]``."""
        discount = check_nonnegative_float("discount", discount)
        if discount > 1:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        context = tuple(int(t) for t in context)
        if len(context) not in (1, 2):
            raise ValueError(f"context must hold 1 or 2 ids (the tokens before), got {context}")
        if word in (PAD_ID, BOS_ID) or not 0 <= word < self.vocab_size:
            raise ValueError(
                f"word must be an id in [0, {self.vocab_size - 1}] other than <pad> and <bos>, "
                f"got {word}"
            )
        uniform = 1.0 / self.outcomes
        p = max(self.unigram[word] - discount, 0) / self.unigram_total
        p += discount * self.unigram_types / self.unigram_total * uniform
        v = context[-1]
        total = self.bigram_context[v]
        if total:
            p = (
                max(self.bigram[(v, word)] - discount, 0) + discount * self.bigram_types[v] * p
            ) / total
        if len(context) == 2:
            total = self.trigram_context[context]
            if total:
                seen = self.trigram[(*context, word)]
                p = (max(seen - discount, 0) + discount * self.trigram_types[context] * p) / total
        return p

    def log_probabilities(self, sentence: Sequence[int], discount: float = 0.75) -> list[float]:
        """``log P`` of each of the ``m + 1`` predictions of one sentence (``w1 … wm <eos>``)."""
        framed = [BOS_ID, *sentence, EOS_ID]
        return [
            math.log(self.probability(framed[t], framed[max(0, t - 2) : t], discount))
            for t in range(1, len(framed))
        ]

    def perplexity(self, sentences: Sequence[Sequence[int]], discount: float = 0.75) -> float:
        """``exp`` of the mean negative log-probability over every prediction of ``sentences``."""
        checked = check_sentences("sentences", sentences, self.vocab_size)
        total, count = 0.0, 0
        for sentence in checked:
            logs = self.log_probabilities(sentence, discount)
            total -= sum(logs)
            count += len(logs)
        if count == 0:
            raise ValueError("sentences must hold at least one sentence, got none")
        return math.exp(total / count)


class KneserNey:
    """Interpolated Kneser-Ney of any ``order`` with one discount ``D``: :class:`KneserNeyTrigram`'s
    rule with ``order - 1`` tokens of context (equal to it at ``order = 3``, tested).

    The top order counts n-grams; every lower order counts how many distinct tokens precede an
    n-gram (its continuation count), except n-grams that start with ``<bos>``, which nothing
    precedes (their plain count). A context never seen falls to the order below; below the
    unigram, the uniform ``1/V`` over ``V = vocab_size - 2`` outcomes.

    With ``modified=True`` it is Chen and Goodman's *modified* Kneser-Ney (1999), the method
    KenLM estimates (SRILM with ``-kndiscount``): each order ``m`` subtracts one of three
    discounts, ``D_m1``, ``D_m2`` or ``D_m3+``, by whether the n-gram's count is 1, 2, or 3 and more, and the context's back-off
    weight is ``(D_m1 N_1(h·) + D_m2 N_2(h·) + D_m3+ N_3+(h·)) / c(h·)``. The discounts are
    Chen and Goodman's closed-form estimates from the order's count-of-counts ``n_1 … n_4``
    (:attr:`discounts`): ``Y = n_1 / (n_1 + 2 n_2)``, ``D_mk = k - (k + 1) Y n_{k+1} / n_k``,
    each clipped to ``[0, k]``. The ``discount`` argument of the methods then *scales* all
    of them (1: the estimates as they are), so that it can be tuned on validation like ``D``.

    Args:
        train: training sentences, lists of ids in ``[0, vocab_size)``, no ``<pad>``/``<bos>``.
        vocab_size: size of the vocabulary (specials included).
        order: n of the n-gram, at least 1.
        modified: three closed-form discounts per order instead of one ``D`` (default: one).
    """

    def __init__(
        self, train: Sequence[Sequence[int]], vocab_size: int, order: int, modified: bool = False
    ) -> None:
        self.vocab_size = check_positive_int("vocab_size", vocab_size, minimum=len(SPECIAL_TOKENS))
        self.order = check_positive_int("order", order)
        if not isinstance(modified, bool):
            raise TypeError(f"modified must be True or False, got {modified!r}")
        self.modified = modified
        self._scale_checked: float | None = None
        self.outcomes = vocab_size - 2  # every id but <pad> and <bos>
        sentences = check_sentences("train", train, vocab_size)
        raw: list[Counter[tuple[int, ...]]] = [Counter() for _ in range(order + 1)]
        for sentence in sentences:
            framed = (BOS_ID, *sentence, EOS_ID)
            for m in range(1, order + 1):
                raw[m].update(framed[i : i + m] for i in range(len(framed) - m + 1))
        # count[m]: the top order's plain counts, the lower orders' continuation counts
        self.count: list[Counter[tuple[int, ...]]] = [Counter() for _ in range(order + 1)]
        self.count[order] = raw[order]
        for m in range(1, order):
            for gram in raw[m + 1]:
                self.count[m][gram[1:]] += 1  # one more distinct token before gram[1:]
            for gram, c in raw[m].items():
                if gram[0] == BOS_ID:  # nothing precedes <bos>: its plain count
                    self.count[m][gram] = c
        # per context of each order: the counts' sum and the number of distinct next tokens
        self.total: list[Counter[tuple[int, ...]]] = [Counter() for _ in range(order + 1)]
        self.types: list[Counter[tuple[int, ...]]] = [Counter() for _ in range(order + 1)]
        # per context, how many distinct next tokens were seen once, twice, 3+ times (modified)
        self.types_by_count: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(order + 1)]
        # per order, the closed-form discounts (D_m1, D_m2, D_m3+) of modified Kneser-Ney
        self.discounts: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)]
        for m in range(1, order + 1):
            count_of_counts: Counter[int] = Counter()
            for gram, c in self.count[m].items():
                if gram[-1] != BOS_ID:
                    self.total[m][gram[:-1]] += c
                    self.types[m][gram[:-1]] += 1
                    if c <= 4:
                        count_of_counts[c] += 1
                    if modified:
                        by_count = self.types_by_count[m].setdefault(gram[:-1], [0, 0, 0])
                        by_count[min(c, 3) - 1] += 1
            self.discounts.append(_closed_form_discounts(count_of_counts))

    def _discount(self, discount: float | None) -> float:
        """The checked ``discount``: ``D`` in ``[0, 1]``, or, when modified, a scale ``>= 0``."""
        if discount is None:
            return 1.0 if self.modified else 0.75
        discount = check_nonnegative_float("discount", discount)
        if self.modified and discount != self._scale_checked:
            for m in range(1, self.order + 1):
                for k, d in enumerate(self.discounts[m], start=1):
                    if discount * d > k:
                        raise ValueError(
                            f"discount (a scale, modified) {discount} makes D_{m}{k} = "
                            f"{discount * d:.3f} exceed the count {k} it is taken from"
                        )
            self._scale_checked = discount  # checked once, not at every probability
        elif not self.modified and discount > 1:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        return discount

    def probability(
        self, word: int, context: Sequence[int], discount: float | None = None
    ) -> float:
        """``P(word | the last order - 1 tokens of context)``; ``discount``: ``D`` in ``[0, 1]``
        (default 0.75), or, when ``modified``, the scale of the closed-form discounts (default 1)."""
        discount = self._discount(discount)
        if word in (PAD_ID, BOS_ID) or not 0 <= word < self.vocab_size:
            raise ValueError(
                f"word must be an id in [0, {self.vocab_size - 1}] other than <pad> and <bos>, "
                f"got {word}"
            )
        context = tuple(int(t) for t in context)[max(0, len(context) - self.order + 1) :]
        p = 1.0 / self.outcomes  # below the unigram: uniform
        for m in range(1, len(context) + 2):  # from the unigram up to the longest context
            history = context[len(context) - m + 1 :] if m > 1 else ()
            total = self.total[m].get(history, 0)
            if not total:  # a context never seen keeps the order below
                continue
            c = self.count[m].get((*history, word), 0)
            if self.modified:
                d1, d2, d3 = (discount * d for d in self.discounts[m])
                n1, n2, n3 = self.types_by_count[m][history]
                seen = max(c - (d1, d2, d3)[min(c, 3) - 1], 0) / total if c else 0.0
                p = seen + (d1 * n1 + d2 * n2 + d3 * n3) / total * p
            else:
                seen = max(c - discount, 0) / total
                p = seen + discount * self.types[m][history] / total * p
        return p

    def log_probabilities(
        self, sentence: Sequence[int], discount: float | None = None
    ) -> list[float]:
        """``log P`` of each of the ``m + 1`` predictions of one sentence (``w1 … wm <eos>``)."""
        framed = [BOS_ID, *sentence, EOS_ID]
        return [
            math.log(self.probability(framed[t], framed[max(0, t - self.order + 1) : t], discount))
            for t in range(1, len(framed))
        ]

    def perplexity(
        self, sentences: Sequence[Sequence[int]], discount: float | None = None
    ) -> float:
        """``exp`` of the mean negative log-probability over every prediction of ``sentences``."""
        checked = check_sentences("sentences", sentences, self.vocab_size)
        logs = [lp for sentence in checked for lp in self.log_probabilities(sentence, discount)]
        if not logs:
            raise ValueError("sentences must hold at least one sentence, got none")
        return math.exp(-sum(logs) / len(logs))


def _closed_form_discounts(count_of_counts: Counter[int]) -> tuple[float, float, float]:
    """Chen and Goodman's (1999) estimates ``D_k = k - (k + 1) Y n_{k+1} / n_k``, ``k = 1, 2, 3``,
    with ``Y = n_1 / (n_1 + 2 n_2)`` and ``n_k`` the number of n-grams seen exactly ``k`` times;
    an estimate that is undefined (some ``n_k = 0``) is ``Y``; each is clipped to ``[0, k]``."""
    n = [count_of_counts.get(k, 0) for k in range(5)]
    y = n[1] / (n[1] + 2 * n[2]) if n[1] + 2 * n[2] else 0.5
    return tuple(  # type: ignore[return-value]
        min(max(k - (k + 1) * y * n[k + 1] / n[k] if n[k] else y, 0.0), float(k)) for k in (1, 2, 3)
    )


class NeighbourGuesser:
    """Guess a hidden word from the word on its left and the word on its right, by counting.

    Counted on ``train`` read as ``<bos> w1 … wm <eos>``. For a hidden word ``w`` between
    ``left`` and ``right``:

    - if the triple ``(left, w, right)`` occurs in training for some ``w``, the guess is the
      ``w`` seen most often there (ties go to the higher bigram score below);
    - otherwise the guess maximises the bigram model's posterior
      ``P(w | left) · P(right | w)``, each factor add-``k`` smoothed as in
      :func:`companion.data.ngram_perplexity`. A neighbour that is itself hidden (in
      ``unknown_ids``, e.g. ``[MASK]``) drops its factor (``P(w | left)`` becomes the unigram
      ``P(w)``).

    Only ids that are not in ``special_ids`` are ever guessed.

    Args:
        train: training sentences, lists of ids in ``[0, vocab_size)``.
        vocab_size: size of the vocabulary (specials included).
        special_ids: ids never guessed (``<pad> <bos> <eos> <unk>``, ``[MASK]``, …).
    """

    def __init__(
        self, train: Sequence[Sequence[int]], vocab_size: int, special_ids: Iterable[int]
    ) -> None:
        self.vocab_size = check_positive_int("vocab_size", vocab_size, minimum=len(SPECIAL_TOKENS))
        sentences = check_sentences("train", train, vocab_size)
        self.special_ids = tuple(sorted({int(i) for i in special_ids}))
        if any(not 0 <= i < vocab_size for i in self.special_ids):
            raise ValueError(
                f"special_ids must be ids in [0, {vocab_size - 1}], got {self.special_ids}"
            )
        pairs: Counter[tuple[int, int]] = Counter()
        self.between: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
        for sentence in sentences:
            framed = [BOS_ID, *sentence, EOS_ID]
            pairs.update(zip(framed[:-1], framed[1:]))
            for left, w, right in zip(framed[:-2], framed[1:-1], framed[2:]):
                self.between[(left, right)][w] += 1
        after: dict[int, dict[int, int]] = defaultdict(dict)  # after[v][w] = c(v, w)
        before: dict[int, dict[int, int]] = defaultdict(dict)  # before[w][v] = c(v, w)
        self.predicted = torch.zeros(vocab_size, dtype=torch.float64)  # (V,): c(w) as a target
        self.followed = torch.zeros(vocab_size, dtype=torch.float64)  # (V,): c(v) as a context
        for (v, w), count in pairs.items():
            after[v][w] = count
            before[w][v] = count
            self.predicted[w] += count
            self.followed[v] += count
        self.after = {v: self._sparse(row) for v, row in after.items()}
        self.before = {w: self._sparse(column) for w, column in before.items()}
        self.candidates = torch.ones(vocab_size, dtype=torch.bool)  # (V,): ids that may be guessed
        self.candidates[list(self.special_ids)] = False

    @staticmethod
    def _sparse(counts: dict[int, int]) -> tuple[Tensor, Tensor]:
        ids = torch.tensor(list(counts), dtype=torch.long)  # (nonzero,)
        return ids, torch.tensor(list(counts.values()), dtype=torch.float64)  # (nonzero,)

    def _dense(self, table: dict[int, tuple[Tensor, Tensor]], key: int) -> Tensor:
        dense = torch.zeros(self.vocab_size, dtype=torch.float64)  # (V,)
        if key in table:
            ids, counts = table[key]
            dense[ids] = counts
        return dense

    def scores(self, left: int, right: int, k: float = 0.01) -> Tensor:
        """The bigram posterior ``P(w | left) · P(right | w)`` (unnormalised) of every id:
        ``(vocab_size,)``, 0 for the ids never guessed."""
        k = check_nonnegative_float("k", k)
        outcomes = self.vocab_size - 2
        unknown = set(self.special_ids) - {BOS_ID, EOS_ID}
        if left in unknown:  # a hidden neighbour: the unigram P(w) instead of P(w | left)
            counts = self.predicted  # (V,): how often each id is predicted
        else:
            counts = self._dense(self.after, left)  # (V,): c(left, w)
        score = (counts + k) / (counts.sum() + k * outcomes)  # (V,)
        if right not in unknown:
            before = self._dense(self.before, right)  # (V,): c(w, right)
            score = score * (before + k) / (self.followed + k * outcomes)  # (V,)
        return torch.where(self.candidates, score, torch.zeros_like(score))

    def guess(self, left: int, right: int, k: float = 0.01) -> int:
        """The guessed id of the word between ``left`` and ``right``."""
        for name, value in (("left", left), ("right", right)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int id, got {type(value).__name__}")
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be an id in [0, {self.vocab_size - 1}], got {value}")
        score = self.scores(left, right, k)  # (V,)
        seen = {w: c for w, c in self.between.get((left, right), {}).items() if self.candidates[w]}
        if seen:
            most = max(seen.values())
            tied = [w for w, c in seen.items() if c == most]
            return max(tied, key=lambda w: (float(score[w]), -w))
        return int(score.argmax())
