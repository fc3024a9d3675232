"""Language-model data (companion.data.lm): the vocabulary comes from the training split only,
batches round-trip to the sentences, and the n-gram baselines count the tokens a language
model's perplexity counts, checked by hand on a tiny corpus and on Multi30k's English side."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SHARED_MULTI30K

from companion.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    LanguageModelData,
    causal_lm_example,
    english_sentences,
    load_multi30k,
    ngram_perplexity,
)
from companion.train import sequence_loss

TINY = {
    "train": [
        "A dog runs.",
        "A dog sleeps.",
        "A cat runs.",
        "Two dogs run in the park.",
        "A cat sleeps in the sun.",
    ],
    "val": ["A cat runs in the park.", "A horse sleeps."],  # "horse" never seen in training
}


@pytest.fixture
def tiny() -> LanguageModelData:
    return LanguageModelData.from_texts(TINY, extra_special_tokens=("<mask>",))


# --------------------------------------------------------------------------------------------
# vocabulary and encoding
# --------------------------------------------------------------------------------------------


def test_vocabulary_comes_from_the_training_split(tiny):
    assert tiny.vocab.tokens[:5] == ["<pad>", "<bos>", "<eos>", "<unk>", "<mask>"]
    assert tiny.special_ids == (0, 1, 2, 3, 4) and tiny.token_id("<mask>") == 4
    # min_freq=2: "A" (4x), "." (5x), "cat", "dog", "in", "runs", "sleeps", "the" (2x)
    assert sorted(tiny.vocab.tokens[5:]) == sorted(
        ["A", ".", "cat", "dog", "in", "runs", "sleeps", "the"]
    )
    assert tiny.vocab.tokens[5:7] == [".", "A"]  # by decreasing count
    horse = tiny.ids["val"][1]
    assert horse[1] == UNK_ID and tiny.decode(horse) == "A <unk> sleeps."
    assert tiny.encode("A cat sleeps.") == tiny.ids["train"][4][:2] + tiny.ids["train"][1][2:]
    assert tiny.vocab_size == 13 and tiny.texts["val"] == TINY["val"]


def test_max_size_counts_the_extra_special_tokens():
    data = LanguageModelData.from_texts(TINY, max_size=8, extra_special_tokens=("<mask>",))
    assert data.vocab.tokens == ["<pad>", "<bos>", "<eos>", "<unk>", "<mask>", ".", "A", "cat"]


@pytest.mark.parametrize(
    ("texts", "changes", "error", "match"),
    [
        ({"val": ["a"]}, {}, ValueError, "holding 'train'"),
        ({"train": "a b"}, {}, TypeError, r"texts\['train'\] must be a list of sentences"),
        (TINY, {"extra_special_tokens": ("dog",)}, ValueError, "must not occur in the text"),
        (TINY, {"extra_special_tokens": (4,)}, TypeError, "extra_special_tokens must hold str"),
        (TINY, {"tokenizer": "words"}, TypeError, "tokenizer must have tokenize"),
        (TINY, {"max_size": 4, "extra_special_tokens": ("<m>",)}, ValueError, "max_size"),
    ],
)
def test_from_texts_rejects_bad_input(texts, changes, error, match):
    with pytest.raises(error, match=match):
        LanguageModelData.from_texts(texts, **changes)


# --------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------


def test_batches_round_trip_to_the_sentences(tiny):
    for split in ("train", "val"):
        groups = tiny.index_batches(split, max_tokens=24, shuffle=False)
        batches = tiny.batches(split, max_tokens=24, shuffle=False)
        assert sorted(i for group in groups for i in group) == list(range(len(TINY[split])))
        for group, batch in zip(groups, batches):
            assert batch.dtype == torch.long and batch.shape[0] == len(group)
            assert batch.numel() <= 24 or len(group) == 1
            for row, index in zip(batch.tolist(), group):
                words = tiny.ids[split][index]
                assert row[: len(words) + 2] == [BOS_ID, *words, EOS_ID]
                assert set(row[len(words) + 2 :]) <= {PAD_ID}
                assert tiny.decode(row) == tiny.decode(words)
        lengths = [len(tiny.ids[split][i]) for group in groups for i in group]
        assert lengths == sorted(lengths)  # without shuffling: shortest first


def test_batches_of_the_training_split_are_shuffled_reproducibly():
    texts = {"train": [" ".join(["w"] * (i % 7 + 1)) + f" n{i}" for i in range(200)]}
    data = LanguageModelData.from_texts(texts, min_freq=1)
    first = data.index_batches("train", max_tokens=64)
    assert first == data.index_batches("train", max_tokens=64, seed=0, epoch=0)
    assert first != data.index_batches("train", max_tokens=64, epoch=1)
    assert first != data.index_batches("train", max_tokens=64, seed=1)
    for group in first:  # bucketed: every batch holds sentences of nearly one length
        lengths = {len(data.ids["train"][i]) for i in group}
        assert max(lengths) - min(lengths) <= 1
    padded = sum(b.numel() for b in data.batches("train", max_tokens=64))
    real = sum(int((b != PAD_ID).sum()) for b in data.batches("train", max_tokens=64))
    assert real / padded > 0.9


def test_batches_feed_the_causal_objective(tiny):
    (batch,) = tiny.batches("val", max_tokens=1000)
    inputs, targets, mask = causal_lm_example(batch)
    assert int((targets != PAD_ID).sum()) == tiny.num_predictions("val") == 7 + 1 + 4 + 1
    assert bool((inputs[:, 0] == BOS_ID).all()) and BOS_ID not in targets.tolist()


def test_batches_reject_an_unknown_split(tiny):
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'val'\], got 'test'"):
        tiny.batches("test")
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        tiny.batches("val", max_tokens=0)


# --------------------------------------------------------------------------------------------
# n-gram perplexity
# --------------------------------------------------------------------------------------------

# ids: <eos> = 2, <unk> = 3, "a" = 4, "b" = 5; vocab_size 6, so V = 4 predictable ids
A, B = 4, 5
TRAIN, VALID = [[A, B], [A]], [[A, B]]


def test_unigram_perplexity_by_hand():
    # train predicts a, b, <eos>, a, <eos>: c(a) = 2, c(b) = 1, c(<eos>) = 2, 5 in all
    # add-1: P(a) = 3/9, P(b) = 2/9, P(<eos>) = 3/9; valid predicts a, b, <eos>
    expected = (1 / ((3 / 9) * (2 / 9) * (3 / 9))) ** (1 / 3)
    assert math.isclose(ngram_perplexity(TRAIN, VALID, 1, 1.0, vocab_size=6), expected)


def test_bigram_perplexity_by_hand():
    # pairs: <bos> a (2), a b (1), b <eos> (1), a <eos> (1); c(<bos>) = 2, c(a) = 2, c(b) = 1
    # add-1: P(a|<bos>) = 3/6, P(b|a) = 2/6, P(<eos>|b) = 2/5
    expected = (1 / ((3 / 6) * (2 / 6) * (2 / 5))) ** (1 / 3)
    assert math.isclose(ngram_perplexity(TRAIN, VALID, 2, 1.0, vocab_size=6), expected)
    # add-0.5: (2.5/4) (1.5/4) (1.5/3)
    half = (1 / ((2.5 / 4) * (1.5 / 4) * (1.5 / 3))) ** (1 / 3)
    assert math.isclose(ngram_perplexity(TRAIN, VALID, 2, 0.5, vocab_size=6), half)


def test_unsmoothed_models_and_unseen_contexts():
    assert ngram_perplexity(TRAIN, [[B, A]], 2, 0.0, vocab_size=6) == math.inf  # b a unseen
    exact = (1 / (1.0 * 0.5 * 1.0)) ** (1 / 3)  # P(a|<bos>) = 1, P(b|a) = 1/2, P(<eos>|b) = 1
    assert math.isclose(ngram_perplexity(TRAIN, VALID, 2, 0.0, vocab_size=6), exact)
    # context "<unk>" never seen: uniform over the 4 predictable ids, smoothed or not
    # (P(<unk>|<bos>) = 0 unsmoothed, 1/6 with add-1; then P(<eos>|<unk>) = 1/4)
    assert ngram_perplexity(TRAIN, [[UNK_ID]], 2, 0.0, vocab_size=6) == math.inf
    unseen = ngram_perplexity(TRAIN, [[UNK_ID]], 2, 1.0, vocab_size=6)
    assert math.isclose(unseen, (1 / ((1 / 6) * (1 / 4))) ** 0.5)


def test_a_perfect_fit_has_perplexity_one():
    assert math.isclose(ngram_perplexity([[A, A]], [[A, A]], 3, 0.0, vocab_size=6), 1.0)


def test_the_perplexity_of_a_model_that_uses_the_bigram_table(tiny):
    """The baseline counts what the language model's loss counts: a 'model' whose logits are
    the bigram's log-probabilities has exp(sequence_loss) equal to the bigram's perplexity
    over the batches and causal targets of the same split."""
    vocab = tiny.vocab_size
    k = 0.3
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for sentence in tiny.ids["train"]:
        framed = [BOS_ID, *sentence, EOS_ID]
        for previous, token in zip(framed, framed[1:]):
            counts[previous, token] += 1
    predictable = torch.ones(vocab, dtype=torch.bool)
    predictable[[PAD_ID, BOS_ID]] = False
    probs = (counts + k) / (counts.sum(1, keepdim=True) + k * (vocab - 2))
    log_probs = probs.log().masked_fill(~predictable, -1e9)  # (vocab, vocab) rows: previous
    total, predictions = 0.0, 0
    for batch in tiny.batches("val", max_tokens=16):
        inputs, targets, _ = causal_lm_example(batch)
        logits = log_probs[inputs]  # (batch, len, vocab)
        count = int((targets != PAD_ID).sum())
        total += float(sequence_loss(logits, targets, PAD_ID)) * count
        predictions += count
    assert predictions == tiny.num_predictions("val")
    expected = tiny.ngram_perplexity(2, k)
    assert math.isclose(math.exp(total / predictions), expected, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"n": 0}, ValueError, "n must be >= 1"),
        ({"k": -0.1}, ValueError, "k must be a finite number >= 0"),
        ({"vocab_size": 3}, ValueError, "vocab_size must be >= 4"),
        ({"valid": [[A, BOS_ID]]}, ValueError, r"valid\[0\] must hold ids .* other than <pad>"),
        ({"train": [[A, 9]]}, ValueError, r"train\[0\] must hold ids in \[0, 5\]"),
        ({"train": "ab"}, TypeError, "train must be a list of sentences"),
        ({"valid": [[A, 1.5]]}, TypeError, "must contain only ints"),
        ({"valid": []}, ValueError, "valid must hold at least one sentence"),
    ],
)
def test_ngram_perplexity_rejects_bad_input(arguments, error, match):
    settings = {"train": TRAIN, "valid": VALID, "n": 2, "k": 1.0, "vocab_size": 6} | arguments
    with pytest.raises(error, match=match):
        ngram_perplexity(**settings)


# --------------------------------------------------------------------------------------------
# Multi30k's English side (the shared local copy, never downloaded)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi30k_english() -> LanguageModelData:
    if not SHARED_MULTI30K.is_dir():
        pytest.skip(f"the shared Multi30k copy is not at {SHARED_MULTI30K}")
    return LanguageModelData.from_multi30k(SHARED_MULTI30K, progress=False, download=False)


def test_english_sentences_are_the_english_side():
    if not SHARED_MULTI30K.is_dir():
        pytest.skip(f"the shared Multi30k copy is not at {SHARED_MULTI30K}")
    val = english_sentences("val", SHARED_MULTI30K, download=False)
    assert len(val) == 1014
    assert val == [en for _, en in load_multi30k("val", SHARED_MULTI30K, download=False)]
    assert val[0] == "A group of men are loading cotton onto a truck"


def test_multi30k_language_model_data(multi30k_english):
    data = multi30k_english
    assert sorted(data.ids) == ["train", "val"]
    assert len(data.ids["train"]) == 29_000 and len(data.ids["val"]) == 1014
    assert 6_000 < data.vocab_size < 6_600  # words seen at least twice in training
    assert data.num_predictions("val") == sum(len(s) + 1 for s in data.ids["val"])
    batches = data.batches("val", max_tokens=2048)
    assert sum(b.shape[0] for b in batches) == 1014
    assert all(b.numel() <= 2048 for b in batches)
    assert sum(int((b[:, 1:] != PAD_ID).sum()) for b in batches) == data.num_predictions("val")


def test_multi30k_baselines(multi30k_english):
    """The measured baselines of chapter 10 (validation split, add-0.01): unigram about 232,
    bigram about 49; Laplace's add-1 smoothing ruins the bigram model (about 146)."""
    unigram = multi30k_english.ngram_perplexity(1)
    bigram = multi30k_english.ngram_perplexity(2)
    assert 220 < unigram < 245
    assert 45 < bigram < 53
    assert 135 < multi30k_english.ngram_perplexity(2, 1.0) < 160
