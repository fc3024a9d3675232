"""Chapter 8 exercise checks: right answers pass, plausible wrong answers (the schedule
without ``max(step, 1)`` or with ``d_model^-1``, ε spread over the wrong tokens, unclipped
n-gram counts, ...) fail, stubs are reported without raising."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import sacrebleu
import torch

from companion.decode import length_penalty as companion_length_penalty
from companion.exercises import ch08
from companion.train import inverse_sqrt_warmup

# --------------------------------------------------------------------------------------------
# noam_lr
# --------------------------------------------------------------------------------------------


def noam_correct(step, d_model, warmup):
    return inverse_sqrt_warmup(d_model, warmup)(step)


def noam_no_max(step, d_model, warmup):
    # step 0 raises ZeroDivisionError (0 ** -0.5)
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_wrong_power(step, d_model, warmup):
    s = max(step, 1)
    return d_model**-1 * min(s**-0.5, s * warmup**-1.5)


def noam_linear_decay(step, d_model, warmup):
    s = max(step, 1)
    return d_model**-0.5 * min(1 / s, s * warmup**-1.5)


def test_noam_accepts_correct():
    assert ch08.check_noam_lr(noam_correct, verbose=False)
    assert ch08.check_noam_lr(ch08.reference_noam_lr, verbose=False)


@pytest.mark.parametrize("wrong", [noam_no_max, noam_wrong_power, noam_linear_decay])
def test_noam_rejects_wrong(wrong):
    assert not ch08.check_noam_lr(wrong, verbose=False)


# --------------------------------------------------------------------------------------------
# smoothed_targets
# --------------------------------------------------------------------------------------------


def smoothing_correct(labels, vocab_size, epsilon):
    one_hot = torch.nn.functional.one_hot(labels, vocab_size).float()
    return (1 - epsilon) * one_hot + epsilon / vocab_size


def smoothing_over_others(labels, vocab_size, epsilon):
    # ε spread over the V - 1 wrong tokens only (another convention, not PyTorch's)
    one_hot = torch.nn.functional.one_hot(labels, vocab_size).float()
    return (1 - epsilon) * one_hot + epsilon / (vocab_size - 1) * (1 - one_hot)


def smoothing_not_spread(labels, vocab_size, epsilon):
    # ε added to every token instead of ε / V: rows no longer sum to 1
    one_hot = torch.nn.functional.one_hot(labels, vocab_size).float()
    return (1 - epsilon) * one_hot + epsilon


def smoothing_forgets_one_minus(labels, vocab_size, epsilon):
    one_hot = torch.nn.functional.one_hot(labels, vocab_size).float()
    return one_hot + epsilon / vocab_size


def test_smoothing_accepts_correct():
    assert ch08.check_smoothed_targets(smoothing_correct, verbose=False)


def test_smoothing_matches_cross_entropy():
    # the reference is the distribution F.cross_entropy(label_smoothing=ε) trains towards
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 9, generator=g)
    labels = torch.randint(0, 9, (6,), generator=g)
    targets = ch08.reference_smoothed_targets(labels, 9, 0.1)
    manual = -(targets * logits.log_softmax(-1)).sum(-1).mean()
    builtin = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    assert torch.allclose(manual, builtin, atol=1e-6)


@pytest.mark.parametrize(
    "wrong", [smoothing_over_others, smoothing_not_spread, smoothing_forgets_one_minus]
)
def test_smoothing_rejects_wrong(wrong):
    assert not ch08.check_smoothed_targets(wrong, verbose=False)


# --------------------------------------------------------------------------------------------
# length_penalty
# --------------------------------------------------------------------------------------------


def penalty_divide_by_length(length, alpha):
    return length**alpha


def penalty_wrong_constants(length, alpha):
    return ((1 + length) / 6) ** alpha


def test_penalty_accepts_correct():
    assert ch08.check_length_penalty(companion_length_penalty, verbose=False)


@pytest.mark.parametrize("wrong", [penalty_divide_by_length, penalty_wrong_constants])
def test_penalty_rejects_wrong(wrong):
    assert not ch08.check_length_penalty(wrong, verbose=False)


# --------------------------------------------------------------------------------------------
# modified_precision
# --------------------------------------------------------------------------------------------


def _ngrams(tokens, n):
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def precision_correct(hypothesis, reference, n):
    hyp, ref = _ngrams(hypothesis, n), _ngrams(reference, n)
    total = sum(hyp.values())
    return sum((hyp & ref).values()) / total if total else 0.0


def precision_unclipped(hypothesis, reference, n):
    hyp, ref = _ngrams(hypothesis, n), _ngrams(reference, n)
    total = sum(hyp.values())
    return sum(c for g, c in hyp.items() if g in ref) / total if total else 0.0


def precision_recall(hypothesis, reference, n):
    # divides by the reference's n-grams: a recall, not a precision
    hyp, ref = _ngrams(hypothesis, n), _ngrams(reference, n)
    total = sum(ref.values())
    return sum((hyp & ref).values()) / total if total else 0.0


def precision_unigrams_only(hypothesis, reference, n):
    return precision_correct(hypothesis, reference, 1)


def test_precision_accepts_correct():
    assert ch08.check_modified_precision(precision_correct, verbose=False)


@pytest.mark.parametrize("wrong", [precision_unclipped, precision_recall, precision_unigrams_only])
def test_precision_rejects_wrong(wrong):
    assert not ch08.check_modified_precision(wrong, verbose=False)


# --------------------------------------------------------------------------------------------
# stubs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [
        ch08.check_noam_lr,
        ch08.check_smoothed_targets,
        ch08.check_length_penalty,
        ch08.check_modified_precision,
    ],
)
def test_stub_reported_not_raised(check, capsys):
    def stub(**kwargs):
        raise NotImplementedError

    result = check(stub)
    assert not result
    assert "not attempted yet" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# corpus_bleu
# --------------------------------------------------------------------------------------------


def _clipped(hyp, ref, n):
    h = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
    r = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
    return sum(min(c, r[g]) for g, c in h.items()), sum(h.values())


def _bleu(
    hypotheses, references, *, brevity="corpus", mean="geometric", per_sentence_precision=False
):
    """A configurable BLEU for the wrong answers below (right with the defaults)."""
    hyps, refs = hypotheses, references
    stats = [[_clipped(h, r, n) for n in range(1, 5)] for h, r in zip(hyps, refs)]
    if per_sentence_precision:  # average the sentences' precisions instead of pooling counts
        precisions = [sum(s[n][0] / max(s[n][1], 1) for s in stats) / len(stats) for n in range(4)]
    else:
        precisions = [sum(s[n][0] for s in stats) / sum(s[n][1] for s in stats) for n in range(4)]
    if min(precisions) == 0:
        return 0.0
    if mean == "geometric":
        combined = math.exp(sum(math.log(p) for p in precisions) / 4)
    else:
        combined = sum(precisions) / 4
    c, r = sum(map(len, hyps)), sum(map(len, refs))
    if brevity == "corpus":
        bp = 1.0 if c > r else math.exp(1 - r / c)
    elif brevity == "inverted":
        bp = 1.0 if c > r else math.exp(1 - c / r)
    elif brevity == "none":
        bp = 1.0
    else:  # "per sentence": the mean of the sentences' penalties
        bp = sum(
            1.0 if len(h) > len(ref) else math.exp(1 - len(ref) / len(h))
            for h, ref in zip(hyps, refs)
        ) / len(hyps)
    return 100 * bp * combined


def corpus_bleu_by_sacrebleu(hypotheses, references):
    hyps = [" ".join(h) for h in hypotheses]
    refs = [" ".join(r) for r in references]
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none").score


def corpus_bleu_mean_of_sentences(hypotheses, references):
    return sum(_bleu([h], [r]) for h, r in zip(hypotheses, references)) / len(hypotheses)


WRONG_CORPUS_BLEU = [
    corpus_bleu_mean_of_sentences,
    lambda hypotheses, references: _bleu(hypotheses, references, brevity="inverted"),
    lambda hypotheses, references: _bleu(hypotheses, references, brevity="none"),
    lambda hypotheses, references: _bleu(hypotheses, references, brevity="per sentence"),
    lambda hypotheses, references: _bleu(hypotheses, references, mean="arithmetic"),
    lambda hypotheses, references: _bleu(hypotheses, references, per_sentence_precision=True),
]


def test_corpus_bleu_accepts_correct():
    assert ch08.check_corpus_bleu(ch08.reference_corpus_bleu, verbose=False)
    assert ch08.check_corpus_bleu(corpus_bleu_by_sacrebleu, verbose=False)  # the real thing
    assert ch08.check_corpus_bleu(_bleu, verbose=False)


@pytest.mark.parametrize("wrong", WRONG_CORPUS_BLEU)
def test_corpus_bleu_rejects_wrong(wrong):
    assert not ch08.check_corpus_bleu(wrong, verbose=False)


def test_corpus_bleu_cases_exercise_the_brevity_penalty():
    cases = ch08._corpus_cases()
    assert len(cases) >= 6
    short = [c for c in cases if sum(map(len, c["hypotheses"])) < sum(map(len, c["references"]))]
    long = [c for c in cases if sum(map(len, c["hypotheses"])) > sum(map(len, c["references"]))]
    assert short and long
