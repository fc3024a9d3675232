"""companion.metrics: the two BLEU scores, Translator, sequence accuracy."""

from __future__ import annotations

import math

import pytest
import torch

from companion.data import CopyReverseDataset, Vocab, WordTokenizer
from companion.metrics import (
    BleuScores,
    Translator,
    bleu_scores,
    corpus_bleu,
    sequence_accuracy,
    tokenized_bleu,
    translate,
)
from companion.model import Transformer

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
        9, 9, d_model=16, num_heads=2, num_layers=1, d_ff=16, src_pad_id=0, tgt_pad_id=0
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
    with pytest.raises(ValueError, match="length_penalty must be >= 0, got -1"):
        small_translator(length_penalty=-1)
    small_vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>"])
    with pytest.raises(ValueError, match=r"vocabularies must match the model.*len\(src_vocab\)=4"):
        Translator(translator.model, WordTokenizer(), small_vocab, translator.tgt_vocab)


def test_sequence_accuracy_of_a_random_model():
    data = CopyReverseDataset("copy", 20, max_len=4, seed=3)
    torch.manual_seed(0)
    model = Transformer(
        14, 14, d_model=16, num_heads=2, num_layers=1, d_ff=16, src_pad_id=0, tgt_pad_id=0
    )
    assert 0.0 <= sequence_accuracy(model, data, batch_size=7) <= 0.2
