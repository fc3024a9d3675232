"""Exercises of chapter 2, "The math: scaled dot-product attention, and why √d_k".

Each ``check_*`` runs your function next to the reference solution on random cases drawn
from a seeded generator (so every run checks the same cases) and reports the first
difference. It never raises on a wrong answer; it returns a truthy/falsy
:class:`~companion.exercises.CheckResult`::

    from companion.exercises import ch02
    ch02.check_scaled_attention(my_scaled_attention)

The chapter's exercises use :func:`check_blockwise_attention`, :func:`check_masked_softmax`,
:func:`check_weight_entropy`, :func:`check_gradient_gap` and
:func:`check_attention_backward`; the other checks are kept for readers who want to write
the plain function or the variance experiment themselves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from companion.exercises._checker import (
    Case,
    CheckResult,
    call_reader,
    causal_bool_mask,
    lengths_mask,
    random_bool_mask,
    run_check,
    seeded_generator,
)

__all__ = [
    "GAP_FACTOR",
    "GAP_SETTINGS",
    "check_attention_backward",
    "check_blockwise_attention",
    "check_gradient_gap",
    "sampled_query_gradient_norms",
    "check_scaled_attention",
    "check_masked_softmax",
    "check_weight_entropy",
    "check_dot_product_variance",
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


# ---------------------------------------------------------------------------------------------
# Exercise - attention one block of keys at a time (the online softmax)
# ---------------------------------------------------------------------------------------------


def reference_blockwise_attention(q: Tensor, k: Tensor, v: Tensor, block_size: int) -> Tensor:
    """Reference: ``softmax(q kᵀ / √d_k) v`` one block of keys at a time (the online softmax).

    Args:
        q: queries ``(..., q_len, d_k)``.
        k: keys ``(..., k_len, d_k)``.
        v: values ``(..., k_len, d_v)``.
        block_size: keys per block; the last block may be shorter.

    Returns:
        the output ``(..., q_len, d_v)``; only ``(..., q_len, block_size)`` scores exist at once.
    """
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"))  # (..., q_len, 1)
    running_sum = torch.zeros(*q.shape[:-1], 1)  # (..., q_len, 1): Σ exp(s - running_max)
    mixed = torch.zeros(*q.shape[:-1], v.shape[-1])  # (..., q_len, d_v): Σ exp(s - max) v
    for start in range(0, k.shape[-2], block_size):
        k_block = k[..., start : start + block_size, :]  # (..., block, d_k)
        v_block = v[..., start : start + block_size, :]  # (..., block, d_v)
        scores = q @ k_block.transpose(-2, -1) * scale  # (..., q_len, block)
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))  # (..., q_len, 1)
        rescale = torch.exp(running_max - new_max)  # (..., q_len, 1), 0 on the first block
        exp_scores = torch.exp(scores - new_max)  # (..., q_len, block), all ≤ 1
        running_sum = running_sum * rescale + exp_scores.sum(dim=-1, keepdim=True)
        mixed = mixed * rescale + exp_scores @ v_block  # (..., q_len, d_v)
        running_max = new_max
    return mixed / running_sum  # (..., q_len, d_v)


def _blockwise_cases(seed: int = 20) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # (leading dims, q_len, k_len, d_k, d_v, block_size, score size)
    settings = [
        ((), 3, 8, 4, 2, 4, 1.0),  # two full blocks
        ((), 4, 7, 4, 3, 3, 1.0),  # the last block is shorter
        ((2,), 3, 5, 8, 4, 1, 1.0),  # one key per block
        ((2,), 2, 5, 4, 4, 16, 1.0),  # one block holds every key
        ((2, 3), 5, 9, 8, 3, 4, 1.0),  # batch × heads
        ((), 3, 10, 4, 2, 3, 30.0),  # scores in the thousands: exp overflows without a max
    ]
    for lead, q_len, k_len, d_k, d_v, block_size, size in settings:
        yield {
            "q": size * torch.randn(*lead, q_len, d_k, generator=gen),
            "k": size * torch.randn(*lead, k_len, d_k, generator=gen),
            "v": torch.randn(*lead, k_len, d_v, generator=gen),
            "block_size": block_size,
        }
    # keys sorted by rising score: every new block raises the running maximum
    q = torch.randn(2, 4, generator=gen)  # (2, 4)
    k = torch.randn(12, 4, generator=gen)  # (12, 4)
    k = k[(q[0] @ k.T).argsort()] * 4  # (12, 4)
    yield {"q": q, "k": k, "v": torch.randn(12, 3, generator=gen), "block_size": 4}


def check_blockwise_attention(
    blockwise_attention: Callable[[Tensor, Tensor, Tensor, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``blockwise_attention(q, k, v, block_size) -> output``.

    ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``, ``v (..., k_len, d_v)``; the output
    ``(..., q_len, d_v)`` must equal ``softmax(q kᵀ / √d_k) v``. The cases include a short
    last block, blocks of one key, one block for all keys, scores in the thousands and keys
    whose scores rise from block to block. (The check compares results: it cannot see whether
    you kept to one block of keys at a time.)
    """
    return run_check(
        "blockwise_attention",
        blockwise_attention,
        lambda q, k, v, block_size: reference_scaled_attention(q, k, v)[0],
        _blockwise_cases(),
        verbose=verbose,
    )


# Exercise - a measurement: how much gradient reaches the queries, with and without √d_k
# ---------------------------------------------------------------------------------------------

#: The settings ``(d_k, n_keys)`` at which :func:`check_gradient_gap` calls the reader's
#: measurement: none is a power of two with 16 keys, the grid that chapter 2 prints.
GAP_SETTINGS = ((160, 32), (128, 6), (360, 6))

#: How far a measurement may land from the reference: within a factor 1.25 either way. With
#: 10 000 queries per setting the median's sampling noise stays within about 15 %.
GAP_FACTOR = 1.25


def sampled_query_gradient_norms(
    d_k: int,
    n_keys: int,
    scale: float,
    n_queries: int,
    generator: torch.Generator,
) -> Tensor:
    """``‖∂L/∂q‖`` for ``n_queries`` random queries, sampled without the key tensor.

    The protocol of chapter 2, section 2.5: ``q`` and its ``n_keys`` keys have independent
    standard normal entries, the softmax input is ``z_j = scale · q·k_j``, ``p = softmax(z)``
    and ``L = Σ_j p_j t_j`` with ``t`` standard normal. With ``g = ∂L/∂z = p ⊙ (t − pᵀt)``
    the gradient is ``∂L/∂q = scale · Σ_j g_j k_j``. Writing each key as ``a_j q/‖q‖`` plus a
    part orthogonal to ``q``, ``q·k_j = ‖q‖ a_j`` with ``a_j`` standard normal, and the
    orthogonal parts sum to ``‖g‖`` times a standard normal vector of ``d_k − 1`` entries, so

        ``‖∂L/∂q‖² = scale² ((Σ_j g_j a_j)² + ‖g‖² χ²(d_k − 1))``, ``‖q‖² ~ χ²(d_k)``:

    the same distribution as the brute-force measurement, without the
    ``(n_queries, n_keys, d_k)`` tensor (``tests/test_exercises_ch02.py`` compares the two).

    Args:
        d_k: width of a query and a key (at least 2).
        n_keys: keys per query.
        scale: the factor applied to the raw scores (``1/√d_k`` or ``1``).
        n_queries: number of queries sampled.
        generator: the random source (numpy's draws are seeded from it).

    Returns:
        ``(n_queries,)`` float64, one gradient norm per query.
    """
    seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
    rng = np.random.default_rng(seed)
    q_norm = torch.from_numpy(rng.chisquare(d_k, size=(n_queries, 1))).sqrt()  # (N, 1) ‖q‖
    orthogonal = torch.from_numpy(rng.chisquare(d_k - 1, size=n_queries))  # (N,) χ²(d_k − 1)
    a = torch.randn(n_queries, n_keys, generator=generator, dtype=torch.float64)  # (N, n_keys)
    upstream = torch.randn(n_queries, n_keys, generator=generator, dtype=torch.float64)  # t
    probs = torch.softmax(scale * q_norm * a, dim=-1)  # (N, n_keys)
    g = probs * (upstream - (probs * upstream).sum(-1, keepdim=True))  # (N, n_keys) ∂L/∂z
    squared = scale**2 * ((g * a).sum(-1) ** 2 + (g * g).sum(-1) * orthogonal)  # (N,)
    return squared.sqrt()  # (N,)


@functools.cache
def reference_gradient_gap(d_k: int, n_keys: int) -> float:
    """Reference: median ``‖∂L/∂q‖`` with ``1/√d_k`` divided by the median without it.

    Measured on 200 000 queries per scale (sampling noise about 1 %) with
    :func:`sampled_query_gradient_norms`; above 1 the unscaled query gets less gradient.
    """
    generator = seeded_generator(2)
    scaled = sampled_query_gradient_norms(d_k, n_keys, 1 / math.sqrt(d_k), 200_000, generator)
    unscaled = sampled_query_gradient_norms(d_k, n_keys, 1.0, 200_000, generator)
    return scaled.median().item() / unscaled.median().item()


def check_gradient_gap(
    median_gradient_gap: Callable[[int, int], float], verbose: bool = True
) -> CheckResult:
    """Check a measurement ``median_gradient_gap(d_k, n_keys) -> float``.

    The ratio of the median ``‖∂L/∂q‖`` over queries with scaled scores to the median with
    unscaled scores, chapter 2's protocol. Called at the settings of :data:`GAP_SETTINGS`;
    each answer is accepted within a factor :data:`GAP_FACTOR` of a reference measurement
    made when the check runs. A message on a wrong answer does not give the value.
    """
    name = "median_gradient_gap"
    result = None
    count = 0
    for count, (d_k, n_keys) in enumerate(GAP_SETTINGS, start=1):
        got, result = call_reader(name, count, median_gradient_gap, {"d_k": d_k, "n_keys": n_keys})
        if result is not None:
            break
        setting = f"case {count} (d_k={d_k}, n_keys={n_keys})"
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float, np.floating)) or isinstance(got, bool):
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: {setting}: expected a number (a ratio of two medians), "
                f"got {type(got).__name__} {got!r}"[:300],
            )
            break
        reference = reference_gradient_gap(d_k, n_keys)
        if not (math.isfinite(got) and got > 0) or abs(math.log(got / reference)) > math.log(
            GAP_FACTOR
        ):
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: {setting}: {got:.4g} is more than a factor {GAP_FACTOR} away from"
                " the reference measurement.\n   Check the protocol: the gradient with respect"
                " to the query q (not the softmax input), one norm per query, the median over"
                " at least 10 000 queries, scaled divided by unscaled.",
            )
            break
    if result is None:
        result = CheckResult(
            name,
            True,
            count,
            f"✅ {name}: all {count} settings agree with the reference measurement "
            f"(within a factor {GAP_FACTOR}).",
        )
    if verbose:
        print(result.message)
    return result


# ---------------------------------------------------------------------------------------------
# Exercise - the backward pass of attention, by hand
# ---------------------------------------------------------------------------------------------


def reference_attention_backward(
    q: Tensor, k: Tensor, v: Tensor, grad_output: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: ``(∂L/∂q, ∂L/∂k, ∂L/∂v)`` of ``softmax(q kᵀ/√d_k) v``, by autograd.

    Args:
        q: queries ``(..., q_len, d_k)``.
        k: keys ``(..., k_len, d_k)``.
        v: values ``(..., k_len, d_v)``.
        grad_output: ``∂L/∂output``, ``(..., q_len, d_v)``.

    Returns:
        gradients shaped like ``q``, ``k`` and ``v``.
    """
    with torch.enable_grad():
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        output, _ = reference_scaled_attention(*leaves)  # (..., q_len, d_v)
        grads = torch.autograd.grad(output, leaves, grad_output.double())
    return tuple(g.to(q.dtype) for g in grads)  # type: ignore[return-value]


def _attention_backward_cases(seed: int = 30) -> Iterator[Case]:
    gen = seeded_generator(seed)
    # (leading dims, q_len, k_len, d_k, d_v, score size): q_len ≠ k_len and d_k ≠ d_v, so a
    # transposed product has the wrong shape; large scores for a nearly saturated softmax
    settings = [
        ((), 3, 5, 4, 2, 1.0),
        ((2,), 4, 6, 8, 3, 1.0),
        ((2, 3), 5, 4, 16, 6, 1.0),
        ((), 6, 6, 64, 5, 1.0),
        ((3,), 2, 7, 4, 4, 3.0),
    ]
    for lead, q_len, k_len, d_k, d_v, size in settings:
        yield {
            "q": size * torch.randn(*lead, q_len, d_k, generator=gen),
            "k": size * torch.randn(*lead, k_len, d_k, generator=gen),
            "v": torch.randn(*lead, k_len, d_v, generator=gen),
            "grad_output": torch.randn(*lead, q_len, d_v, generator=gen),
        }


def check_attention_backward(
    attention_backward: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]],
    verbose: bool = True,
) -> CheckResult:
    """Check ``attention_backward(q, k, v, grad_output) -> (grad_q, grad_k, grad_v)``.

    ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)``, ``v (..., k_len, d_v)``,
    ``grad_output (..., q_len, d_v)``; the three gradients of ``L`` (with
    ``∂L/∂output = grad_output``) through ``softmax(q kᵀ/√d_k) v``, shaped like ``q``, ``k``
    and ``v``. Your function runs under ``torch.no_grad()``: it must apply the chain rule
    itself, not call autograd.
    """
    name = "attention_backward"

    def without_autograd(q: Tensor, k: Tensor, v: Tensor, grad_output: Tensor) -> Any:
        with torch.no_grad():
            try:
                return attention_backward(q, k, v, grad_output)
            except RuntimeError as exc:
                if "does not require grad" in str(exc) or "grad_fn" in str(exc):
                    raise RuntimeError(
                        "attention_backward must apply the chain rule itself: the check runs"
                        " it under torch.no_grad(), where autograd records nothing"
                    ) from None
                raise

    return run_check(
        name,
        without_autograd,
        reference_attention_backward,
        _attention_backward_cases(),
        verbose=verbose,
    )
