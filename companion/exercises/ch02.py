"""Exercises of chapter 2, "The math: scaled dot-product attention, and why √d_k".

Each ``check_*`` runs your function next to the reference solution on random cases drawn
from a seeded generator (so every run checks the same cases) and reports the first
difference. It never raises on a wrong answer; it returns a truthy/falsy
:class:`~companion.exercises.CheckResult`::

    from companion.exercises import ch02
    ch02.check_scaled_attention(my_scaled_attention)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from companion.exercises._checker import (
    Case,
    CheckResult,
    causal_bool_mask,
    lengths_mask,
    random_bool_mask,
    run_check,
    seeded_generator,
)

__all__ = [
    "check_scaled_attention",
    "check_masked_softmax",
    "check_weight_entropy",
    "check_dot_product_variance",
    "reference_scaled_attention",
    "reference_masked_softmax",
    "reference_weight_entropy",
    "reference_dot_product_variance",
]

# ---------------------------------------------------------------------------------------------
# Exercise 1 - scaled dot-product attention over any leading dimensions
# ---------------------------------------------------------------------------------------------


def reference_scaled_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Reference: ``softmax(q kᵀ / √d_k) v`` with any number of leading (batch) dimensions.

    Args:
        q: queries ``(..., q_len, d_k)``.
        k: keys ``(..., k_len, d_k)``.
        v: values ``(..., k_len, d_v)``.

    Returns:
        ``(output, weights)`` of shapes ``(..., q_len, d_v)`` and ``(..., q_len, k_len)``.
    """
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., q_len, k_len)
    weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)
    return weights @ v, weights  # (..., q_len, d_v), (..., q_len, k_len)


def _scaled_attention_cases(seed: int = 0) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # (leading dims, q_len, k_len, d_k, d_v): 2-D, batched, batch × heads; q_len ≠ k_len, d_v ≠ d_k
    shapes = [
        ((), 3, 5, 4, 2),
        ((2,), 4, 4, 8, 8),
        ((3,), 2, 6, 16, 5),
        ((2, 3), 5, 7, 8, 3),
        ((1, 2, 2), 3, 4, 6, 6),
        ((4,), 1, 9, 64, 7),
    ]
    for lead, q_len, k_len, d_k, d_v in shapes:
        yield {
            "q": torch.randn(*lead, q_len, d_k, generator=gen),
            "k": torch.randn(*lead, k_len, d_k, generator=gen),
            "v": torch.randn(*lead, k_len, d_v, generator=gen),
        }


def check_scaled_attention(
    scaled_attention: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
    verbose: bool = True,
) -> CheckResult:
    """Check ``scaled_attention(q, k, v) -> (output, weights)``.

    ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``, ``v (..., k_len, d_v)`` with any number of
    leading dimensions (none, batch, batch × heads, ...); ``output (..., q_len, d_v)``,
    ``weights (..., q_len, k_len)``.
    """
    return run_check(
        "scaled_attention",
        scaled_attention,
        reference_scaled_attention,
        _scaled_attention_cases(),
        verbose=verbose,
    )


# ---------------------------------------------------------------------------------------------
# Exercise 2 - a boolean mask applied before the softmax
# ---------------------------------------------------------------------------------------------


def reference_masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Reference: softmax over the last axis of ``scores`` restricted to the allowed keys.

    Args:
        scores: ``(..., q_len, k_len)`` (already scaled).
        mask: boolean, ``True`` where a query **may attend** to a key; broadcasts to
            ``scores`` (e.g. ``(q_len, k_len)`` causal or ``(batch, 1, k_len)`` padding).

    Returns:
        weights ``(..., q_len, k_len)``: 0 on blocked keys, each row sums to 1 over its
        allowed keys; a row with no allowed key at all is all zeros (never NaN).
    """
    very_negative = torch.finfo(scores.dtype).min
    filled = scores.masked_fill(~mask, very_negative)  # (..., q_len, k_len)
    weights = torch.softmax(filled, dim=-1)  # (..., q_len, k_len)
    return weights.masked_fill(~mask, 0.0)  # (..., q_len, k_len)


def _masked_softmax_cases(seed: int = 0) -> Iterator[Case]:
    gen = seeded_generator(seed)

    def rand_mask(*shape: int) -> Tensor:
        return random_bool_mask(shape, 0.6, gen)

    # 1. a full-shape random mask whose first row is entirely blocked
    scores = 3 * torch.randn(4, 6, generator=gen)
    mask = rand_mask(4, 6)
    mask[0] = False
    mask[1] = True
    yield {"scores": scores, "mask": mask}
    # 2. causal mask (q_len, k_len) broadcast over a batch
    yield {
        "scores": torch.randn(3, 5, 5, generator=gen),
        "mask": causal_bool_mask(5),
    }
    # 3. padding mask (batch, 1, k_len): the last keys of each sequence are padding
    padding = lengths_mask([7, 4, 1], 7)[:, None, :]  # (3, 1, 7)
    yield {"scores": 2 * torch.randn(3, 4, 7, generator=gen), "mask": padding}
    # 4. batch × heads with a full-shape random mask, some rows fully blocked by chance
    yield {"scores": torch.randn(2, 3, 4, 5, generator=gen), "mask": rand_mask(2, 3, 4, 5)}
    # 5. large scores (a saturated softmax) and a mask that allows everything
    yield {"scores": 20 * torch.randn(2, 3, 8, generator=gen), "mask": torch.ones(3, 8).bool()}


def check_masked_softmax(
    masked_softmax: Callable[[Tensor, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``masked_softmax(scores, mask) -> weights``.

    ``scores (..., q_len, k_len)``; boolean ``mask`` broadcasting to it, ``True`` = may attend;
    blocked keys get weight 0 and a row with no allowed key is all zeros, never NaN.
    """
    return run_check(
        "masked_softmax",
        masked_softmax,
        reference_masked_softmax,
        _masked_softmax_cases(),
        verbose=verbose,
    )


# ---------------------------------------------------------------------------------------------
# Exercise 3 - the entropy of each row of attention weights
# ---------------------------------------------------------------------------------------------


def reference_weight_entropy(weights: Tensor) -> Tensor:
    """Reference: entropy in nats (natural log) of each row, ``-Σ_j p_j ln p_j``.

    Args:
        weights: ``(..., q_len, k_len)``, non-negative rows (summing to 1, or all zero for a
            fully masked query).

    Returns:
        ``(..., q_len)``; terms with ``p_j = 0`` contribute 0 (the limit of ``p ln p``).
    """
    safe = torch.where(weights > 0, weights, torch.ones_like(weights))  # (..., q_len, k_len)
    return -(weights * torch.log(safe)).sum(dim=-1)  # (..., q_len)


def _weight_entropy_cases(seed: int = 0) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # 1. ordinary softmax rows, q_len ≠ k_len so summing over the wrong axis changes the shape
    yield {"weights": torch.softmax(torch.randn(3, 5, generator=gen), dim=-1)}
    # 2. batched, with masked (exactly zero) weights and one fully masked row
    scores = 2 * torch.randn(2, 4, 6, generator=gen)
    mask = random_bool_mask((2, 4, 6), 0.5, gen)
    mask[:, :, 0] = True
    mask[1, 2] = False
    yield {"weights": reference_masked_softmax(scores, mask)}
    # 3. special rows: one-hot (entropy 0), uniform (entropy ln k_len), half-half (ln 2)
    special = torch.zeros(3, 4)
    special[0, 2] = 1.0
    special[1] = 0.25
    special[2, :2] = 0.5
    yield {"weights": special}
    # 4. batch × heads, a sharp (nearly saturated) softmax
    yield {"weights": torch.softmax(8 * torch.randn(2, 3, 4, 7, generator=gen), dim=-1)}


def check_weight_entropy(
    weight_entropy: Callable[[Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``weight_entropy(weights) -> entropy``, in nats, one number per row.

    ``weights (..., q_len, k_len)`` → ``(..., q_len)``; zero weights contribute 0, never NaN.
    """
    return run_check(
        "weight_entropy",
        weight_entropy,
        reference_weight_entropy,
        _weight_entropy_cases(),
        verbose=verbose,
    )


# ---------------------------------------------------------------------------------------------
# Exercise 4 - the variance experiment, on samples passed in
# ---------------------------------------------------------------------------------------------


def reference_dot_product_variance(q: Tensor, k: Tensor, scaled: bool) -> float:
    """Reference: unbiased sample variance of the row-wise dot products ``q[i] · k[i]``.

    Args:
        q: ``(n_samples, d_k)`` sampled queries.
        k: ``(n_samples, d_k)`` sampled keys (sample ``i`` pairs ``q[i]`` with ``k[i]``).
        scaled: divide each dot product by ``√d_k`` before taking the variance.

    Returns:
        the variance (``torch.var``'s default, dividing by ``n_samples - 1``) as a float.
    """
    dots = (q * k).sum(dim=-1)  # (n_samples,)
    if scaled:
        dots = dots / math.sqrt(q.shape[-1])  # (n_samples,)
    return float(dots.var())


def _dot_product_variance_cases(seed: int = 0) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # (n_samples, d_k, sigma, scaled): small n_samples, so a biased variance is visibly off
    settings = [
        (20, 4, 1.0, False),
        (50, 16, 1.5, True),
        (30, 64, 0.5, False),
        (100, 8, 2.0, True),
        (40, 1, 1.5, False),
        (25, 32, 1.2, True),
    ]
    for n_samples, d_k, sigma, scaled in settings:
        yield {
            "q": sigma * torch.randn(n_samples, d_k, generator=gen),
            "k": sigma * torch.randn(n_samples, d_k, generator=gen),
            "scaled": scaled,
        }


def check_dot_product_variance(
    dot_product_variance: Callable[[Tensor, Tensor, bool], float], verbose: bool = True
) -> CheckResult:
    """Check ``dot_product_variance(q, k, scaled) -> float``.

    ``q, k (n_samples, d_k)``; the unbiased variance of the ``n_samples`` dot products
    ``q[i] · k[i]`` (divided by ``√d_k`` first when ``scaled``).
    """
    return run_check(
        "dot_product_variance",
        dot_product_variance,
        reference_dot_product_variance,
        _dot_product_variance_cases(),
        verbose=verbose,
    )
