"""Evaluation (chapter 8): translate raw sentences and score them with BLEU.

Two BLEU scores, both corpus-level BLEU-4 computed by sacreBLEU, differ in what they compare:

* :func:`corpus_bleu` - **the standard score**: the model's *detokenized* output (plain
  sentences, :meth:`~companion.data.WordTokenizer.detokenize`) against the *raw* reference
  sentences, tokenized by sacreBLEU itself (its ``13a`` tokenizer) and **case-sensitive**.
  This is the number to compare with published results (signature
  ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp``).
* :func:`tokenized_bleu` - **lower-cased tokenized BLEU**, the number older tutorials report
  (e.g. PyTorch seq2seq tutorials that score spaCy tokens with
  ``torchtext.data.metrics.bleu_score``): hypothesis and reference are both split by the
  course's :class:`~companion.data.WordTokenizer` and lower-cased, the tokens are joined with
  single spaces, and sacreBLEU scores them with ``tokenize="none"`` (no further splitting).
  Lower-casing forgives capitalisation errors, so it is usually a point or two higher than
  :func:`corpus_bleu`. It matches torchtext's ``bleu_score`` on the same tokens whenever every
  n-gram order has at least one match (always, on a real test set; torchtext does no
  smoothing).

How sure is a BLEU score? A test set is a sample of sentences, so a score has sampling error.
:func:`bleu_signature` is sacreBLEU's description of the settings (print it with every score);
:func:`bootstrap_bleu` gives a 95% confidence interval by resampling the test sentences
(Koehn, 2004), and :func:`paired_bootstrap` compares two systems on the *same* resamples,
which is far more sensitive than comparing two intervals. Both work on
:func:`bleu_statistics`, each sentence's n-gram counts; summed, they give :func:`corpus_bleu`
exactly. For two models scored item by item on the same test items (chapter 10),
:func:`clustered_se` is the standard error of the mean paired difference when items come in
groups (the words of one sentence), and :func:`verdict` turns that difference into a win, a tie
or a loss.

:class:`Translator` bundles a model with its tokenizer and vocabularies: ``translate(sentences)``
maps raw German strings to English strings (batched, greedy or beam search), and
:meth:`Translator.from_checkpoint` rebuilds one from a checkpoint file
(:mod:`companion.checkpoint`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import sacrebleu
import torch
from sacrebleu.metrics import BLEU

from companion._validation import (
    check_bool,
    check_instance,
    check_nonnegative_float,
    check_positive_int,
)
from companion.checkpoint import load_checkpoint, model_from_checkpoint
from companion.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    Vocab,
    WordTokenizer,
    collate_batch,
)
from companion.decode import beam_search, best_hypotheses, greedy_decode
from companion.model import Transformer

__all__ = [
    "length_penalty_sweep",
    "corpus_bleu",
    "tokenized_bleu",
    "BleuScores",
    "bleu_scores",
    "bleu_signature",
    "bleu_statistics",
    "length_ratio",
    "BleuInterval",
    "bootstrap_bleu",
    "PairedBootstrap",
    "paired_bootstrap",
    "clustered_se",
    "verdict",
    "Translator",
    "translate",
    "sequence_accuracy",
]


def _check_sentences(name: str, value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(value).__name__}")
    bad = [type(s).__name__ for s in value if not isinstance(s, str)]
    if bad:
        raise TypeError(f"{name} must contain only str, got {bad[0]}")
    return list(value)


def _check_pair(hypotheses: object, references: object) -> tuple[list[str], list[str]]:
    hyps = _check_sentences("hypotheses", hypotheses)
    refs = _check_sentences("references", references)
    if len(hyps) != len(refs):
        raise ValueError(
            f"hypotheses and references must have the same length (one reference per "
            f"hypothesis), got {len(hyps)} hypotheses and {len(refs)} references"
        )
    if not hyps:
        raise ValueError("hypotheses must hold at least one sentence, got none")
    return hyps, refs


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """SacreBLEU (0-100) of detokenized ``hypotheses`` against raw ``references``.

    Case-sensitive, sacreBLEU's default ``13a`` tokenization, one reference per sentence.
    """
    hyps, refs = _check_pair(hypotheses, references)
    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    tokenizer: Tokenizer | None = None,
) -> float:
    """Lower-cased tokenized BLEU (0-100), see the module docstring.

    Both sides are tokenized by ``tokenizer`` (default :class:`~companion.data.WordTokenizer`),
    lower-cased and joined with spaces; sacreBLEU then scores them with ``tokenize="none"``.
    """
    hyps, refs = _check_pair(hypotheses, references)
    tokenizer = WordTokenizer() if tokenizer is None else tokenizer

    def prepare(sentences: list[str]) -> list[str]:
        return [" ".join(tokenizer.tokenize(s)).lower() for s in sentences]

    # force=True: the text *is* tokenized on purpose (sacreBLEU would warn about it)
    score = sacrebleu.corpus_bleu(prepare(hyps), [prepare(refs)], tokenize="none", force=True)
    return float(score.score)


@dataclass(frozen=True)
class BleuScores:
    """Both BLEU scores of one set of translations (0-100)."""

    bleu: float  #: :func:`corpus_bleu`: detokenized, case-sensitive, sacreBLEU 13a
    tokenized_bleu: float  #: :func:`tokenized_bleu`: lower-cased, tokenized
    sentences: int  #: number of sentence pairs scored

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"BLEU {self.bleu:.2f} (sacreBLEU, cased, detokenized) | "
            f"{self.tokenized_bleu:.2f} (lower-cased, tokenized) on {self.sentences} sentences"
        )


def bleu_scores(
    hypotheses: Sequence[str], references: Sequence[str], tokenizer: Tokenizer | None = None
) -> BleuScores:
    """:func:`corpus_bleu` and :func:`tokenized_bleu` together."""
    hyps, refs = _check_pair(hypotheses, references)
    return BleuScores(
        bleu=corpus_bleu(hyps, refs),
        tokenized_bleu=tokenized_bleu(hyps, refs, tokenizer),
        sentences=len(hyps),
    )


def bleu_signature() -> str:
    """sacreBLEU's signature of :func:`corpus_bleu`'s settings, e.g.
    ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``: print it with the score."""
    bleu = BLEU()
    bleu.corpus_score(["a"], [["a"]])  # the signature records the number of references
    return str(bleu.get_signature())


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Each sentence's BLEU counts: ``(sentences, 10)`` integers.

    Columns: hypothesis length, reference length (tokens after sacreBLEU's ``13a``
    tokenization), then the matched (clipped) n-gram counts for n = 1…4, then the numbers of
    hypothesis n-grams for n = 1…4. Corpus BLEU depends only on the column sums: sacreBLEU's
    ``BLEU.compute_bleu`` on them gives :func:`corpus_bleu` exactly.
    """
    hyps, refs = _check_pair(hypotheses, references)
    bleu = BLEU(effective_order=True)  # changes only sentence scores, not the counts we keep
    rows = []
    for hyp, ref in zip(hyps, refs):
        s = bleu.sentence_score(hyp, [ref])
        rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
    return np.array(rows, dtype=np.int64)  # (sentences, 10)


def _score_statistics(totals: np.ndarray) -> float:
    """Corpus BLEU (0-100) of summed statistics ``(10,)``, by sacreBLEU's own formula."""
    sys_len, ref_len = int(totals[0]), int(totals[1])
    return float(
        BLEU.compute_bleu(
            totals[2:6].tolist(), totals[6:10].tolist(), sys_len, ref_len, smooth_method="exp"
        ).score
    )


def _resample_scores(stats: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """BLEU of each resample: ``stats (sentences, 10)``, ``indices (samples, sentences)``."""
    sums = stats[indices].sum(axis=1)  # (samples, 10)
    return np.array([_score_statistics(row) for row in sums])  # (samples,)


def _resample_indices(sentences: int, samples: object, seed: int) -> np.ndarray:
    """``(samples, sentences)`` sentence indices drawn with replacement (at least 100 rows,
    so that the 2.5th and 97.5th percentiles mean something)."""
    check_positive_int("samples", samples, minimum=100)
    rng = np.random.default_rng(seed)
    return rng.integers(0, sentences, size=(samples, sentences))  # (samples, sentences)


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Total hypothesis length / total reference length, in sacreBLEU's ``13a`` tokens: the
    ratio BLEU's brevity penalty reads (below 1: the translations are too short)."""
    totals = bleu_statistics(hypotheses, references).sum(0)  # (10,)
    return float(totals[0] / totals[1])


@dataclass(frozen=True)
class BleuInterval:
    """A BLEU score with its 95% bootstrap confidence interval (:func:`bootstrap_bleu`)."""

    score: float  #: corpus BLEU of the whole test set
    low: float  #: 2.5th percentile of the resampled scores
    high: float  #: 97.5th percentile
    samples: int  #: number of bootstrap resamples

    def __str__(self) -> str:
        return (
            f"BLEU {self.score:.1f} (95% CI {self.low:.1f}-{self.high:.1f}, "
            f"{self.samples} bootstrap resamples)"
        )


def bootstrap_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
) -> BleuInterval:
    """Corpus BLEU with a 95% confidence interval from bootstrap resampling (Koehn, 2004).

    Draws ``samples`` test sets of the same size from the sentences, with replacement, scores
    each, and reports the 2.5th and 97.5th percentiles: the range the score would likely
    fall in on another test set of the same kind.
    """
    stats = bleu_statistics(hypotheses, references)  # (sentences, 10)
    indices = _resample_indices(len(stats), samples, seed)  # (samples, sentences)
    scores = _resample_scores(stats, indices)  # (samples,)
    low, high = np.percentile(scores, [2.5, 97.5])
    return BleuInterval(_score_statistics(stats.sum(0)), float(low), float(high), samples)


@dataclass(frozen=True)
class PairedBootstrap:
    """Two systems compared on the same bootstrap resamples (:func:`paired_bootstrap`)."""

    baseline: float  #: corpus BLEU of the baseline
    system: float  #: corpus BLEU of the system
    low: float  #: 2.5th percentile of the resampled differences system - baseline
    high: float  #: 97.5th percentile
    p_value: float  #: fraction of resamples where the system does not beat the baseline
    samples: int  #: number of bootstrap resamples

    @property
    def difference(self) -> float:
        """``system - baseline`` on the whole test set."""
        return self.system - self.baseline

    def __str__(self) -> str:
        return (
            f"{self.system:.1f} vs {self.baseline:.1f}: difference {self.difference:+.1f} "
            f"(95% CI {self.low:+.1f} to {self.high:+.1f}), p = {self.p_value:.3f} "
            f"({self.samples} paired resamples)"
        )


def paired_bootstrap(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
) -> PairedBootstrap:
    """Paired bootstrap test (Koehn, 2004): is ``system`` better than ``baseline``?

    Both systems translated the same sentences. Every resample draws one set of sentence
    indices and scores *both* systems on it, so the difference is measured on identical
    test sets. ``p_value`` is the fraction of resamples in which the system's BLEU is not
    higher than the baseline's (one-sided); below 0.05 the improvement is significant at
    the 5% level.
    """
    base_stats = bleu_statistics(baseline, references)  # (sentences, 10)
    sys_stats = bleu_statistics(system, references)  # (sentences, 10)
    indices = _resample_indices(len(base_stats), samples, seed)  # (samples, sentences)
    differences = _resample_scores(sys_stats, indices) - _resample_scores(base_stats, indices)
    low, high = np.percentile(differences, [2.5, 97.5])
    return PairedBootstrap(
        baseline=_score_statistics(base_stats.sum(0)),
        system=_score_statistics(sys_stats.sum(0)),
        low=float(low),
        high=float(high),
        p_value=float(np.mean(differences <= 0)),
        samples=samples,
    )


def clustered_se(
    values: Sequence[float] | np.ndarray, clusters: Sequence[int] | np.ndarray
) -> float:
    """Standard error of the mean of ``values``, each cluster of items counted as one draw.

    ``values`` (items,) are per-item scores, typically a paired difference (model A's loss minus
    model B's on the same test item); ``clusters`` (items,) labels the group each item belongs
    to (any hashable numbers, e.g. the test sentence of each predicted token). Items of one
    cluster may be correlated; clusters are treated as independent. The estimate is the
    cluster-robust ("sandwich") standard error without a small-sample correction::

        sqrt( sum over clusters c of ( sum over items i in c of (values[i] - mean) )**2 ) / items

    With one item per cluster it is ``values.std(ddof=0) / sqrt(items)``.

    Raises:
        ValueError: ``values`` or ``clusters`` is not one-dimensional, their lengths differ,
            there are fewer than 2 items or fewer than 2 clusters, or a value is not finite.
    """
    values = np.asarray(values, dtype=float)
    clusters = np.asarray(clusters)
    if values.ndim != 1 or clusters.ndim != 1:
        raise ValueError(
            f"values and clusters must be 1-D, got shapes {values.shape} and {clusters.shape}"
        )
    if len(values) != len(clusters):
        raise ValueError(f"one cluster per value: {len(values)} values, {len(clusters)} clusters")
    if len(values) < 2:
        raise ValueError(f"need at least 2 values, got {len(values)}")
    if not np.isfinite(values).all():
        raise ValueError("values must be finite")
    _, index = np.unique(clusters, return_inverse=True)
    if index.max() < 1:
        raise ValueError("need at least 2 clusters, got 1")
    sums = np.bincount(index.ravel(), weights=values - values.mean())  # (clusters,)
    return math.sqrt(float((sums**2).sum())) / len(values)


def verdict(advantage: float, se: float, *, threshold: float = 2.0) -> str:
    """``"win"``, ``"tie"`` or ``"loss"`` for a model's mean ``advantage`` over a baseline.

    ``advantage`` is positive when the model is better; ``se`` is its standard error (e.g.
    :func:`clustered_se` of the paired differences). A win needs ``advantage > threshold * se``,
    a loss ``advantage < -threshold * se``; anything in between is a tie. The rule covers the
    sampling of the test items only, not the training run's seed.

    Raises:
        ValueError: ``advantage`` is not finite, ``se`` is negative or not finite, or
            ``threshold`` is not positive.
    """
    if not math.isfinite(advantage):
        raise ValueError(f"advantage must be finite, got {advantage!r}")
    if not (math.isfinite(se) and se >= 0):
        raise ValueError(f"se must be a finite number >= 0, got {se!r}")
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
    if advantage > threshold * se:
        return "win"
    if advantage < -threshold * se:
        return "loss"
    return "tie"


def _strip_special(ids: list[int]) -> list[int]:
    """Ids up to the first ``<eos>``, without ``<pad>`` and ``<bos>``."""
    kept = []
    for i in ids:
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            kept.append(i)
    return kept


class Translator:
    """A trained model with its tokenizer and vocabularies: raw sentences in, sentences out.

    Args:
        model: the trained :class:`~companion.model.Transformer` (source = ``src_vocab``).
        tokenizer: splits the source and detokenizes the output.
        src_vocab, tgt_vocab: the vocabularies the model was trained with.
        beam_size: 1 = :func:`~companion.decode.greedy_decode`, more =
            :func:`~companion.decode.beam_search`.
        length_penalty: α of the GNMT length penalty (beam search only).
        max_len_a, max_len_b: a sentence of ``n`` source tokens gets at most
            ``ceil(max_len_a · n) + max_len_b`` output tokens.
        batch_size: sentences decoded together (sorted by length to waste little padding).
        keep_unk: keep the ``<unk>`` tokens the model outputs in the translated text. By default
            they are left out: a literal ``<unk>`` can never match a reference word, and
            sacreBLEU's ``13a`` tokenizer even splits it into three wrong tokens (``< unk >``),
            so keeping it scores one unknown word as three errors. :meth:`translate_ids`
            always returns the raw ids, ``<unk>`` included.
        unk_text: write each ``<unk>`` as this one word instead (letters and digits only, so
            that BLEU's tokenizer keeps it one token, e.g. ``"UNK"``): the output keeps its
            length, and an unknown word costs one wrong token, not three. Needs
            ``keep_unk=False`` (the default); ``keep_unk=True`` writes the literal ``<unk>``.

    Example::

        translator = Translator.from_checkpoint("runs/cpu/checkpoint.pt")
        translator.translate(["Ein Hund läuft über eine Wiese."])  # ['A dog runs ...']
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        src_vocab: Vocab,
        tgt_vocab: Vocab,
        *,
        beam_size: int = 1,
        length_penalty: float = 0.6,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        batch_size: int = 128,
        keep_unk: bool = False,
        unk_text: str | None = None,
    ) -> None:
        check_instance("model", model, Transformer, "a companion.model.Transformer")
        check_instance(
            "tokenizer", tokenizer, Tokenizer, "an object with tokenize() and detokenize() methods"
        )
        for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
            check_instance(name, vocab, Vocab)
        if len(src_vocab) != model.config.src_vocab or len(tgt_vocab) != model.config.tgt_vocab:
            raise ValueError(
                f"the vocabularies must match the model: model has src_vocab="
                f"{model.config.src_vocab}, tgt_vocab={model.config.tgt_vocab}, got "
                f"len(src_vocab)={len(src_vocab)}, len(tgt_vocab)={len(tgt_vocab)}"
            )
        self.model, self.tokenizer = model, tokenizer
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.beam_size = check_positive_int("beam_size", beam_size)
        self.length_penalty = check_nonnegative_float("length_penalty", length_penalty)
        self.max_len_a = check_nonnegative_float("max_len_a", max_len_a)
        self.max_len_b = check_positive_int("max_len_b", max_len_b)
        self.batch_size = check_positive_int("batch_size", batch_size)
        check_bool("keep_unk", keep_unk)
        self.keep_unk = keep_unk
        if unk_text is not None:
            if not isinstance(unk_text, str) or not unk_text.isascii() or not unk_text.isalnum():
                raise ValueError(
                    "unk_text must be one word of ASCII letters and digits (BLEU's tokenizer "
                    f"would split anything else into several tokens), got {unk_text!r:.40}"
                )
            if keep_unk:
                raise ValueError(
                    "keep_unk=True writes the literal <unk>, unk_text writes a word in its place: "
                    f"choose one, got keep_unk=True and unk_text={unk_text!r}"
                )
        self.unk_text = unk_text

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        *,
        map_location: str | torch.device = "cpu",
        **kwargs: Any,
    ) -> Translator:
        """Rebuild model, tokenizer and vocabularies from a checkpoint
        (:func:`companion.checkpoint.load_checkpoint`).

        ``kwargs`` go to the constructor; ``beam_size`` and ``length_penalty`` default to the
        checkpoint's training configuration.
        """
        checkpoint = load_checkpoint(path, map_location=map_location)
        model = model_from_checkpoint(checkpoint)
        config = checkpoint["config"]
        kwargs.setdefault("beam_size", config["beam_size"])
        kwargs.setdefault("length_penalty", config["length_penalty"])
        tokenizer = WordTokenizer.from_dict(checkpoint["tokenizer"])
        src_vocab = Vocab.from_dict(checkpoint["vocab"]["src"])
        tgt_vocab = Vocab.from_dict(checkpoint["vocab"]["tgt"])
        return cls(model, tokenizer, src_vocab, tgt_vocab, **kwargs)

    def translate_ids(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
        """Decode lists of source ids (no special tokens) → lists of output ids (no specials).

        Sentences are sorted by length and decoded ``batch_size`` at a time; the result is in
        the input order. An empty source gives an empty output.
        """
        return self._translate_ids(sources, [self.length_penalty])[0]

    def _translate_ids(
        self, sources: Sequence[Sequence[int]], alphas: Sequence[float]
    ) -> list[list[list[int]]]:
        """:meth:`translate_ids` under each length penalty of ``alphas`` (one list each), from
        one beam search per batch (:func:`~companion.decode.best_hypotheses`)."""
        pad_id = PAD_ID if self.model.config.src_pad_id is None else self.model.config.src_pad_id
        outputs: list[list[list[int]]] = [[[] for _ in sources] for _ in alphas]
        order = sorted((i for i, s in enumerate(sources) if len(s)), key=lambda i: len(sources[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            longest = max(len(sources[i]) for i in chunk)
            src = torch.full((len(chunk), longest), pad_id, dtype=torch.long)  # (batch, src_len)
            for row, index in enumerate(chunk):
                src[row, : len(sources[index])] = torch.tensor(sources[index])  # (len,)
            # each sentence's own limit, so that a translation does not depend on its batch
            max_len = [math.ceil(self.max_len_a * len(sources[i])) + self.max_len_b for i in chunk]
            if self.beam_size == 1:
                ids = greedy_decode(self.model, src, max_len=max_len)  # (batch, out_len)
                per_alpha = [ids] * len(alphas)
            else:
                finished: list = []  # each sentence's finished hypotheses
                ids = beam_search(
                    self.model,
                    src,
                    beam_size=self.beam_size,
                    max_len=max_len,
                    length_penalty_alpha=alphas[0],
                    hypotheses=finished,
                )  # (batch, out_len)
                per_alpha = [ids] + [best_hypotheses(finished, a) for a in alphas[1:]]
            for output, chosen in zip(outputs, per_alpha):
                for row, index in enumerate(chunk):
                    output[index] = _strip_special(chosen[row].tolist())
        return outputs

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """Raw source sentences → detokenized translations (same order, same number)."""
        return self.translate_with_penalties(sentences, [self.length_penalty])[self.length_penalty]

    def translate_with_penalties(
        self, sentences: Sequence[str], alphas: Sequence[float]
    ) -> dict[float, list[str]]:
        """:meth:`translate` under each length penalty α of ``alphas`` (beam search), for the
        price of one search: ``{α: translations}``. The search never looks at α, only the
        choice among its finished hypotheses does, so each list is exactly what a
        translator with ``length_penalty=α`` returns."""
        sentences = _check_sentences("sentences", sentences)
        if isinstance(alphas, (str, bytes)) or not isinstance(alphas, Sequence) or not alphas:
            raise ValueError(f"alphas must be a non-empty list of numbers >= 0, got {alphas!r:.80}")
        alphas = [check_nonnegative_float(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
        sources = [self.src_vocab.encode(self.tokenizer.tokenize(s)) for s in sentences]
        translations = {}
        for alpha, outputs in zip(alphas, self._translate_ids(sources, alphas)):
            if not self.keep_unk and self.unk_text is None:
                outputs = [[i for i in ids if i != UNK_ID] for ids in outputs]
            translations[alpha] = [self._text(ids) for ids in outputs]
        return translations

    def _text(self, ids: list[int]) -> str:
        """Output ids (no specials) → detokenized text, ``<unk>`` written as ``unk_text``."""
        tokens = self.tgt_vocab.decode(ids)
        if self.unk_text is not None:
            unk = self.tgt_vocab.decode([UNK_ID])[0]
            tokens = [self.unk_text if token == unk else token for token in tokens]
        return self.tokenizer.detokenize(tokens)

    __call__ = translate

    def evaluate(self, pairs: Sequence[tuple[str, str]]) -> tuple[BleuScores, list[str]]:
        """Translate the sources of ``(source, reference)`` pairs and score them.

        Returns:
            ``(scores, translations)``.
        """
        if isinstance(pairs, str) or not isinstance(pairs, Sequence):
            raise TypeError(
                f"pairs must be a list of (source, reference), got {type(pairs).__name__}"
            )
        sources = [pair[0] for pair in pairs]
        references = [pair[1] for pair in pairs]
        translations = self.translate(sources)
        return bleu_scores(translations, references, self.tokenizer), translations


def translate(
    model: Transformer,
    sentences: Sequence[str],
    tokenizer: Tokenizer,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    **kwargs: Any,
) -> list[str]:
    """``Translator(model, tokenizer, src_vocab, tgt_vocab, **kwargs).translate(sentences)``."""
    return Translator(model, tokenizer, src_vocab, tgt_vocab, **kwargs).translate(sentences)


def sequence_accuracy(
    model: Transformer,
    dataset: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = 256,
    extra_len: int = 5,
) -> float:
    """Fraction of the examples of ``dataset`` (``(src_ids, tgt_ids)`` pairs, e.g. a
    :class:`~companion.data.CopyReverseDataset`) whose greedy output equals the target exactly.

    Each batch may generate up to its longest target plus ``extra_len`` tokens.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("extra_len", extra_len)
    correct = 0
    for start in range(0, len(dataset), batch_size):
        examples = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        src, _ = collate_batch(examples)  # (batch, src_len)
        longest = max(len(tgt) for _, tgt in examples)
        ids = greedy_decode(model, src, max_len=longest + 1 + extra_len)  # moved to its device
        for row, (_, tgt) in enumerate(examples):
            correct += _strip_special(ids[row].tolist()) == list(tgt)
    return correct / len(dataset)


def length_penalty_sweep(
    translator: Translator, pairs: Sequence[tuple[str, str]], alphas: Sequence[float]
) -> dict[float, float]:
    """Corpus BLEU (:func:`corpus_bleu`) of ``pairs`` translated with beam search under each
    length penalty ``α`` of ``alphas``: ``{α: BLEU}``, in the order given.

    Choose α on a validation set, never on the test set it will be reported on. The sources
    are searched once (:meth:`Translator.translate_with_penalties`); ``translator`` is not
    changed.

    Raises:
        ValueError: ``translator.beam_size`` is 1 (greedy decoding has no length penalty),
            ``alphas`` is empty or holds a negative number, or ``pairs`` is empty.
    """
    check_instance("translator", translator, Translator, "a Translator")
    if translator.beam_size == 1:
        raise ValueError("length_penalty_sweep needs beam search: translator.beam_size is 1")
    if isinstance(alphas, (str, bytes)) or not isinstance(alphas, Sequence) or not alphas:
        raise ValueError(f"alphas must be a non-empty list of numbers >= 0, got {alphas!r:.80}")
    alphas = [check_nonnegative_float(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
    if isinstance(pairs, str) or not isinstance(pairs, Sequence) or not pairs:
        raise ValueError("pairs must be a non-empty list of (source, reference)")
    sources = [pair[0] for pair in pairs]
    references = [pair[1] for pair in pairs]
    by_alpha = translator.translate_with_penalties(sources, alphas)  # one beam search
    return {alpha: corpus_bleu(by_alpha[alpha], references) for alpha in alphas}
