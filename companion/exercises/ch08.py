"""Exercises of chapter 8, "A real translator: training on Multi30k".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (including the cases where a plausible wrong
answer gives itself away), and returns a :class:`~companion.exercises._checker.CheckResult`
that is truthy when every case matches. The checks call your function with keyword arguments,
so keep the parameter names of the stub in the notebook.

==========================================  ==================================
exercise                                    check
==========================================  ==================================
the warm-up learning-rate schedule          :func:`check_noam_lr`
the label-smoothed target distribution      :func:`check_smoothed_targets`
the GNMT length penalty                     :func:`check_length_penalty`
BLEU's modified (clipped) n-gram precision  :func:`check_modified_precision`
corpus BLEU with the brevity penalty        :func:`check_corpus_bleu`
==========================================  ==================================
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
from torch import Tensor

from companion.exercises._checker import (
    Case,
    CheckResult,
    ngram_counts,
    run_check,
    seeded_generator,
)

__all__ = [
    "check_noam_lr",
    "check_smoothed_targets",
    "check_length_penalty",
    "check_modified_precision",
    "check_corpus_bleu",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: the warm-up schedule
# --------------------------------------------------------------------------------------------


def reference_noam_lr(step: int, d_model: int, warmup: int) -> float:
    """The learning rate of "Attention Is All You Need" at optimiser step ``step``:
    ``d_model^-0.5 · min(s^-0.5, s · warmup^-1.5)`` with ``s = max(step, 1)`` (step 0, before
    the first update, counts as step 1)."""
    s = max(step, 1)
    return d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)


def _noam_cases() -> list[Case]:
    rng = random.Random(701)
    cases: list[Case] = [
        {"step": 0, "d_model": 512, "warmup": 4000},  # step 0: needs max(step, 1)
        {"step": 1, "d_model": 256, "warmup": 300},
        {"step": 300, "d_model": 256, "warmup": 300},  # the peak
        {"step": 4000, "d_model": 512, "warmup": 4000},
        {"step": 10_000, "d_model": 512, "warmup": 4000},  # decay side
    ]
    for _ in range(5):
        warmup = rng.randint(10, 5000)
        cases.append(
            {
                "step": rng.randint(1, 3 * warmup),
                "d_model": rng.choice([64, 128, 256, 512, 1024]),
                "warmup": warmup,
            }
        )
    return cases


def check_noam_lr(noam_lr: Callable[..., float], verbose: bool = True) -> CheckResult:
    """Check ``noam_lr(step, d_model, warmup)`` against the paper's schedule."""
    return run_check(
        "noam_lr", noam_lr, reference_noam_lr, _noam_cases(), atol=1e-12, rtol=1e-6, verbose=verbose
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: the label-smoothed target distribution
# --------------------------------------------------------------------------------------------


def reference_smoothed_targets(labels: Tensor, vocab_size: int, epsilon: float) -> Tensor:
    """The target distribution that label smoothing trains towards (PyTorch's convention).

    Args:
        labels: ``(n,)`` token ids.
        vocab_size: ``V``.
        epsilon: ε of label smoothing.

    Returns:
        ``(n, V)``: ``1 - ε + ε/V`` on the right token, ``ε/V`` on every other token; each row
        sums to 1.
    """
    targets = torch.full((labels.shape[0], vocab_size), epsilon / vocab_size)  # (n, V)
    rows = torch.arange(labels.shape[0])  # (n,)
    targets[rows, labels] += 1.0 - epsilon  # (n, V)
    return targets


def _smoothing_cases() -> list[Case]:
    g = seeded_generator(702)
    cases: list[Case] = []
    for n, vocab, eps in [(4, 5, 0.1), (3, 10, 0.2), (6, 7, 0.0), (2, 3, 0.5), (5, 50, 0.1)]:
        labels = torch.randint(0, vocab, (n,), generator=g)  # (n,)
        cases.append({"labels": labels, "vocab_size": vocab, "epsilon": eps})
    return cases


def check_smoothed_targets(
    smoothed_targets: Callable[..., Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``smoothed_targets(labels, vocab_size, epsilon)`` → ``(n, vocab_size)``."""
    return run_check(
        "smoothed_targets",
        smoothed_targets,
        reference_smoothed_targets,
        _smoothing_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: the GNMT length penalty
# --------------------------------------------------------------------------------------------


def reference_length_penalty(length: int, alpha: float) -> float:
    """``((5 + length) / 6) ** alpha`` (Wu et al., 2016); beam search ranks a finished
    hypothesis by ``log P / length_penalty``."""
    return ((5.0 + length) / 6.0) ** alpha


def _penalty_cases() -> list[Case]:
    rng = random.Random(703)
    cases: list[Case] = [
        {"length": 1, "alpha": 0.6},  # lp(1) = 1 for every alpha
        {"length": 10, "alpha": 0.0},
        {"length": 10, "alpha": 1.0},
        {"length": 20, "alpha": 0.6},
    ]
    for _ in range(6):
        cases.append({"length": rng.randint(1, 60), "alpha": round(rng.uniform(0.0, 1.5), 3)})
    return cases


def check_length_penalty(length_penalty: Callable[..., float], verbose: bool = True) -> CheckResult:
    """Check ``length_penalty(length, alpha)``."""
    return run_check(
        "length_penalty",
        length_penalty,
        reference_length_penalty,
        _penalty_cases(),
        atol=1e-9,
        rtol=1e-6,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: BLEU's modified n-gram precision
# --------------------------------------------------------------------------------------------


def reference_modified_precision(hypothesis: list[str], reference: list[str], n: int) -> float:
    """Clipped n-gram precision of one hypothesis against one reference (Papineni et al.).

    Each n-gram of the hypothesis counts at most as often as it occurs in the reference;
    the sum of these clipped counts is divided by the number of n-grams in the hypothesis
    (0.0 when the hypothesis has fewer than ``n`` tokens).
    """
    hyp, ref = ngram_counts(hypothesis, n), ngram_counts(reference, n)
    total = sum(hyp.values())
    if total == 0:
        return 0.0
    clipped = sum(min(count, ref[gram]) for gram, count in hyp.items())
    return clipped / total


def _precision_cases() -> list[Case]:
    rng = random.Random(704)
    cases: list[Case] = [
        # Papineni et al.'s example: unclipped precision would be 7/7
        {
            "hypothesis": "the the the the the the the".split(),
            "reference": "the cat is on the mat".split(),
            "n": 1,
        },
        {
            "hypothesis": "a man rides a bike".split(),
            "reference": "a man is riding a bike".split(),
            "n": 1,
        },
        {
            "hypothesis": "a man rides a bike".split(),
            "reference": "a man is riding a bike".split(),
            "n": 2,
        },
        {"hypothesis": "a dog".split(), "reference": "a dog runs".split(), "n": 3},  # no trigram
        {"hypothesis": "two two dogs dogs".split(), "reference": "two dogs".split(), "n": 1},
    ]
    words = ["a", "the", "dog", "man", "runs", "in", "park"]
    for _ in range(6):
        hyp = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        ref = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        cases.append({"hypothesis": hyp, "reference": ref, "n": rng.randint(1, 3)})
    return cases


def check_modified_precision(
    modified_precision: Callable[..., float], verbose: bool = True
) -> CheckResult:
    """Check ``modified_precision(hypothesis, reference, n)`` (token lists, n-gram order)."""
    return run_check(
        "modified_precision",
        modified_precision,
        reference_modified_precision,
        _precision_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 5: corpus BLEU from its parts, with the brevity penalty
# --------------------------------------------------------------------------------------------


def reference_corpus_bleu(hypotheses: list[list[str]], references: list[list[str]]) -> float:
    """Corpus BLEU-4 (0-100) of tokenized sentences, one reference each (Papineni et al.).

    For n = 1…4 the clipped n-gram matches and the hypothesis n-grams are **summed over the
    corpus** before dividing; BLEU is the geometric mean of the four precisions times the
    brevity penalty ``exp(1 - r / c)`` when the total hypothesis length ``c`` is at most the
    total reference length ``r`` (1 when longer). 0.0 when some order has no match at all.
    """
    matches, totals = [0] * 4, [0] * 4
    for hyp, ref in zip(hypotheses, references):
        for n in range(1, 5):
            hyp_counts, ref_counts = ngram_counts(hyp, n), ngram_counts(ref, n)
            matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in hyp_counts.items())
            totals[n - 1] += sum(hyp_counts.values())
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    c = sum(len(h) for h in hypotheses)
    r = sum(len(ref) for ref in references)
    brevity = 1.0 if c > r else math.exp(1 - r / c)
    return 100 * brevity * math.exp(log_precision)


def _corpus_cases() -> list[Case]:
    rng = random.Random(705)
    words = "a man woman dog runs sits on the grass in park with red ball".split()
    cases: list[Case] = [
        # one short hypothesis: only the brevity penalty is below 1 (c = 6, r = 8)
        {
            "hypotheses": ["a man sits on the grass".split()],
            "references": ["a man sits on the grass in park".split()],
        },
        # longer than the reference: no penalty, precision pays instead
        {
            "hypotheses": ["a man sits on the green grass in the park".split()],
            "references": ["a man sits on the grass in park".split()],
        },
        # one sentence too short, one too long: the corpus lengths cancel (BP = 1), while
        # per-sentence penalties would punish the short one
        {
            "hypotheses": ["a dog runs".split(), "a woman with a red ball sits on grass".split()],
            "references": [
                "a dog runs in park".split(),
                "a woman with a ball sits on grass".split(),
            ],
        },
    ]
    for _ in range(5):  # corpora of 3-6 sentences, every hypothesis a noisy copy
        hyps, refs = [], []
        for _ in range(rng.randint(3, 6)):
            ref = [rng.choice(words) for _ in range(rng.randint(5, 12))]
            hyp = [w for w in ref if rng.random() > 0.2]  # drops words: shorter
            if rng.random() < 0.3:
                hyp += [rng.choice(words) for _ in range(rng.randint(1, 4))]  # or longer
            hyps.append(hyp if len(hyp) >= 4 else ref[:4])
            refs.append(ref)
        cases.append({"hypotheses": hyps, "references": refs})
    return [case for case in cases if reference_corpus_bleu(**case) > 0]


def check_corpus_bleu(corpus_bleu: Callable[..., float], verbose: bool = True) -> CheckResult:
    """Check ``corpus_bleu(hypotheses, references)`` (lists of token lists) → BLEU 0-100."""
    return run_check(
        "corpus_bleu",
        corpus_bleu,
        reference_corpus_bleu,
        _corpus_cases(),
        atol=1e-6,
        rtol=1e-6,
        verbose=verbose,
    )
