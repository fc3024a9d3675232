"""companion.metrics: the two BLEU scores, Translator, sequence accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sacrebleu
import torch
from sacrebleu.metrics import BLEU

from companion.data import CopyReverseDataset, Vocab, WordTokenizer
from companion.metrics import (
    BleuScores,
    Translator,
    bleu_scores,
    bleu_signature,
    bleu_statistics,
    bootstrap_bleu,
    corpus_bleu,
    length_penalty_sweep,
    length_ratio,
    paired_bootstrap,
    sequence_accuracy,
    tokenized_bleu,
    translate,
)
from companion.model import Transformer, TransformerConfig

REFERENCES = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    'A girl holds a sign reading "Free hugs".',
]


def test_references_against_themselves_score_100():
    assert corpus_bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)
    assert tokenized_bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)
    scores = bleu_scores(REFERENCES, REFERENCES)
    assert isinstance(scores, BleuScores) and scores.sentences == 3
    assert scores.to_dict()["bleu"] == pytest.approx(100.0)


def test_a_small_example_by_hand():
    """One word of six is wrong: n-gram precisions 5/6, 4/5, 3/4, 2/3, equal lengths (BP = 1),
    so BLEU = 100 · (5/6 · 4/5 · 3/4 · 2/3)^(1/4) = 100 · (1/3)^(1/4) ≈ 75.98."""
    expected = 100 * (1 / 3) ** 0.25
    hypothesis, reference = ["a man is riding a horse"], ["a man is riding a bike"]
    assert corpus_bleu(hypothesis, reference) == pytest.approx(expected)
    assert tokenized_bleu(hypothesis, reference) == pytest.approx(expected)
    assert expected == pytest.approx(75.98, abs=0.01)


def test_brevity_penalty():
    """A correct but short output is penalised by exp(1 - ref_len / hyp_len)."""
    hypothesis, reference = ["a man is riding"], ["a man is riding a horse"]
    expected = 100 * math.exp(1 - 6 / 4)
    assert corpus_bleu(hypothesis, reference) == pytest.approx(expected)


def test_tokenized_bleu_ignores_case_and_spacing():
    hypothesis = ['a girl holds a sign reading " free hugs " .']
    reference = ['A girl holds a sign reading "Free hugs".']
    assert tokenized_bleu(hypothesis, reference) == pytest.approx(100.0)
    assert corpus_bleu(hypothesis, reference) < 70  # case-sensitive: "A", "Free" are wrong


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: corpus_bleu(["a"], ["a", "b"]), ValueError, r"same length .* got 1 hypotheses and 2 references"),
        (lambda: corpus_bleu([], []), ValueError, r"at least one sentence"),
        (lambda: corpus_bleu("a cat", ["a cat"]), TypeError, r"hypotheses must be a list of str, got str"),
        (lambda: tokenized_bleu(["a"], [3]), TypeError, r"references must contain only str, got int"),
    ],
)  # fmt: skip
def test_bleu_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ------------------------------------------------------------------------- Translator


def small_translator(**kwargs) -> Translator:
    torch.manual_seed(0)
    vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>", "ein", "hund", "a", "dog", "."])
    model = Transformer(
        TransformerConfig(
            9, 9, d_model=16, num_heads=2, num_layers=1, d_ff=16, src_pad_id=0, tgt_pad_id=0
        )
    )
    return Translator(model, WordTokenizer(), vocab, vocab, **kwargs)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translator_keeps_order_and_count(beam_size):
    translator = small_translator(beam_size=beam_size, batch_size=2)
    sentences = ["ein hund .", "", "hund", "ein ein ein hund hund ."]
    out = translator.translate(sentences)
    assert len(out) == 4 and out[1] == "" and all(isinstance(s, str) for s in out)
    # the same sentence alone and in a batch: the same translation
    assert translator.translate([sentences[3]]) == [out[3]]
    assert translate(translator.model, sentences, WordTokenizer(), translator.src_vocab,
                     translator.tgt_vocab, beam_size=beam_size) == out  # fmt: skip
    # at most ceil(1.5 n) + 10 output tokens for n source tokens
    assert len(WordTokenizer().tokenize(out[2])) <= math.ceil(1.5 * 1) + 10


def test_translator_errors():
    translator = small_translator()
    with pytest.raises(TypeError, match="sentences must be a list of str, got str"):
        translator.translate("ein hund")
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        small_translator(beam_size=0)
    with pytest.raises(ValueError, match="length_penalty must be a finite number >= 0, got -1"):
        small_translator(length_penalty=-1)
    small_vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>"])
    with pytest.raises(ValueError, match=r"vocabularies must match the model.*len\(src_vocab\)=4"):
        Translator(translator.model, WordTokenizer(), small_vocab, translator.tgt_vocab)


def test_sequence_accuracy_of_a_random_model():
    data = CopyReverseDataset("copy", 20, max_len=4, seed=3)
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(
            14, 14, d_model=16, num_heads=2, num_layers=1, d_ff=16, src_pad_id=0, tgt_pad_id=0
        )
    )
    assert 0.0 <= sequence_accuracy(model, data, batch_size=7) <= 0.2


# ---------------------------------------------------------------- confidence and significance


def _noisy_corpus(seed: int, sentences: int = 200) -> tuple[list[str], list[str], list[str]]:
    """References and two systems: ``worse`` drops one word per sentence, ``better`` keeps
    every word in half the sentences and drops one in the others."""
    rng = np.random.default_rng(seed)
    words = "a man woman dog runs sits on the grass in park with red ball child plays".split()
    refs, worse, better = [], [], []
    for i in range(sentences):
        sentence = list(rng.choice(words, size=int(rng.integers(6, 12))))
        refs.append(" ".join(sentence) + ".")
        cut = sentence[:]
        del cut[int(rng.integers(0, len(cut)))]
        worse.append(" ".join(cut) + ".")
        better.append(refs[-1] if i % 2 else worse[-1])
    return refs, worse, better


def test_bleu_statistics_sum_to_the_corpus_score():
    refs, worse, _ = _noisy_corpus(0)
    stats = bleu_statistics(worse, refs)
    assert stats.shape == (200, 10) and stats.dtype == np.int64
    totals = stats.sum(0)
    rebuilt = BLEU.compute_bleu(totals[2:6].tolist(), totals[6:].tolist(), totals[0], totals[1])
    assert rebuilt.score == pytest.approx(corpus_bleu(worse, refs), abs=1e-9)
    # hypothesis length = number of unigrams; a dropped word makes every row one shorter
    assert (stats[:, 0] == stats[:, 6]).all() and (stats[:, 0] == stats[:, 1] - 1).all()


def test_bleu_signature_names_the_settings():
    signature = bleu_signature()
    for part in (
        "nrefs:1",
        "case:mixed",
        "tok:13a",
        "smooth:exp",
        f"version:{sacrebleu.__version__}",
    ):
        assert part in signature


def test_bootstrap_interval_contains_the_score_and_is_reproducible():
    refs, worse, _ = _noisy_corpus(1)
    interval = bootstrap_bleu(worse, refs, samples=500, seed=3)
    assert interval.score == pytest.approx(corpus_bleu(worse, refs))
    assert interval.low < interval.score < interval.high
    assert interval == bootstrap_bleu(worse, refs, samples=500, seed=3)
    assert interval != bootstrap_bleu(worse, refs, samples=500, seed=4)
    assert "95% CI" in str(interval)
    # the same resampling as sacreBLEU's own: its half-width agrees within sampling noise
    theirs = BLEU().corpus_score(worse, [refs], n_bootstrap=1000)
    half_width = (interval.high - interval.low) / 2
    assert half_width == pytest.approx(theirs._ci, rel=0.25)


def test_a_perfect_system_has_a_degenerate_interval():
    refs, _, _ = _noisy_corpus(2)
    interval = bootstrap_bleu(refs, refs, samples=100)
    assert interval.low == interval.score == interval.high == pytest.approx(100.0)


def test_paired_bootstrap_finds_a_real_improvement_and_not_a_fake_one():
    refs, worse, better = _noisy_corpus(5)
    result = paired_bootstrap(worse, better, refs, samples=500)
    assert result.system > result.baseline and result.difference > 0
    assert 0 < result.low < result.difference < result.high
    assert result.p_value < 0.01
    # the other way round: never better
    reverse = paired_bootstrap(better, worse, refs, samples=500)
    assert reverse.p_value > 0.99 and reverse.high < 0
    # a system against itself is never better: p = 1, difference exactly 0
    same = paired_bootstrap(worse, worse, refs, samples=200)
    assert same.difference == 0 and same.low == same.high == 0 and same.p_value == 1.0
    assert "p = " in str(result)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda r: bootstrap_bleu(r, r, samples=10), ValueError, "samples must be >= 100"),
        (lambda r: bootstrap_bleu(r, r, samples=1.5), TypeError, "samples"),
        (lambda r: bootstrap_bleu(r[:2], r), ValueError, "same length"),
        (lambda r: paired_bootstrap(r, r[:2], r), ValueError, "same length"),
        (lambda r: paired_bootstrap(r, [1] * len(r), r), TypeError, "only str"),
        (lambda r: bleu_statistics("a b", r), TypeError, "list of str"),
    ],
)
def test_significance_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(REFERENCES)


def test_unknown_words_are_left_out_of_the_text_unless_asked_for():
    """``<unk>`` would score as three wrong tokens under 13a (``< unk >``); by default the
    translated text leaves it out, ``keep_unk=True`` keeps it; the ids always have it."""
    ids = [[3, 6, 3, 7, 8]]  # <unk> a <unk> dog .
    dropped, kept = small_translator(), small_translator(keep_unk=True)
    for translator in (dropped, kept):
        # the decoder's output ids, for every length penalty asked for
        translator._translate_ids = lambda sources, alphas: [[list(i) for i in ids] for _ in alphas]
    assert dropped.translate(["ein hund ."]) == ["a dog."]
    assert kept.translate(["ein hund ."]) == ["<unk> a <unk> dog."]
    stats = bleu_statistics(kept.translate(["x"]), ["a dog."])
    assert stats[0, 0] == 9  # 2 × 3 tokens for the two <unk>, plus "a", "dog", "."
    with pytest.raises(TypeError, match="keep_unk must be a bool, got int"):
        small_translator(keep_unk=1)


def test_unknown_words_written_as_one_word_keep_the_length_and_cost_one_token():
    """``unk_text="UNK"``: each ``<unk>`` becomes one token under 13a, so the output keeps the
    kept version's length but one unknown word counts as one wrong token, not three."""
    ids = [[3, 6, 3, 7, 8]]  # <unk> a <unk> dog .
    word = small_translator(unk_text="UNK")
    word._translate_ids = lambda sources, alphas: [[list(i) for i in ids] for _ in alphas]
    assert word.translate(["ein hund ."]) == ["UNK a UNK dog."]
    stats = bleu_statistics(word.translate(["x"]), ["a dog."])
    assert stats[0, 0] == 5  # UNK, a, UNK, dog, .: one token per unknown word
    assert stats[0, 2] == 3  # a, dog, . match; the two UNK do not
    for bad in ("<unk>", "two words", "", "ünk"):
        with pytest.raises(ValueError, match="unk_text must be one word of ASCII letters"):
            small_translator(unk_text=bad)
    with pytest.raises(ValueError, match="choose one"):
        small_translator(keep_unk=True, unk_text="UNK")


def test_length_ratio_reads_the_statistics():
    refs, worse, _ = _noisy_corpus(0)
    stats = bleu_statistics(worse, refs).sum(0)
    assert length_ratio(worse, refs) == pytest.approx(stats[0] / stats[1])
    assert length_ratio(refs, refs) == 1.0 and length_ratio(worse, refs) < 1.0
    # the brevity penalty sacreBLEU applies is exp(1 - 1 / ratio) for a short output
    bp = BLEU().corpus_score(worse, [refs]).bp
    assert bp == pytest.approx(math.exp(1 - 1 / length_ratio(worse, refs)), rel=1e-6)


def test_length_penalty_sweep_scores_each_alpha_and_restores_the_translator():
    # Catches: a sweep that leaves the translator on the last α tried, that scores every α
    # with the translator's own α (all scores equal to a plain evaluate), or that reorders α.
    translator = small_translator(beam_size=3, length_penalty=0.6)
    pairs = [("ein hund .", "a dog ."), ("ein ein hund", "a a dog"), ("hund .", "dog .")]
    scores = length_penalty_sweep(translator, pairs, [0.0, 5.0, 0.6])
    assert list(scores) == [0.0, 5.0, 0.6]
    assert translator.length_penalty == 0.6
    for alpha, bleu in scores.items():
        translator.length_penalty = alpha
        hypotheses = translator.translate([p[0] for p in pairs])
        assert bleu == corpus_bleu(hypotheses, [p[1] for p in pairs])
    translator.length_penalty = 0.6
    with pytest.raises(ValueError, match="needs beam search"):
        length_penalty_sweep(small_translator(beam_size=1), pairs, [0.6])
    with pytest.raises(ValueError, match="alphas must be a non-empty list"):
        length_penalty_sweep(translator, pairs, [])
    with pytest.raises(ValueError, match=r"alphas\[1\] must be"):
        length_penalty_sweep(translator, pairs, [0.6, -1.0])
    with pytest.raises(ValueError, match="pairs must be a non-empty list"):
        length_penalty_sweep(translator, [], [0.6])
