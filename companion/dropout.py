"""Dropout whose random numbers cost what they should on a CPU.

Dropout zeroes each element with probability ``p`` and scales the survivors by
``1 / (1 - p)``, so the expected output equals the input. The arithmetic is one
multiplication; the cost is the random numbers. On a CPU, ``torch.nn.functional.dropout``
draws them with ``bernoulli_``, one generator call per element: on the course's 2-core
machine that made dropout about 30 % of a training step, more than the matrix products it
sits between (see ``benchmarks/README.md``).

:func:`keep_mask` draws the same decisions from raw 64-bit random words instead: each word
gives four 16-bit lanes, and a lane keeps its element when it is at least a threshold. One
generator call then serves four elements, and the comparison is a single vectorised pass
that writes the float factor (0 or 1) directly. The drop probability is realised in steps of
1/65,536 (``p = 0.1`` becomes 0.100006); the survivors are scaled by
``1 / (1 - realised p)``, so the expected output is still exactly the input.

On a CPU the words come from numpy's SFC64 generator (about twice as fast per word as
``Tensor.random_``, which runs on one core): each call seeds a fresh SFC64 with one 63-bit
number drawn from torch's default generator, so ``torch.manual_seed`` (or
``companion.utils.set_seed``) still makes runs reproduce. Where the fused kernels are already
fast, :func:`dropout` uses them: on a GPU, and under ``torch.compile`` (which fuses dropout
into the surrounding element-wise code).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Dropout",
    "dropout",
    "dropout_factor",
    "keep_mask",
    "realised_probability",
    "survivor_scale",
]

#: Lanes of 16 bits per 64-bit random word.
_LANES = 4
#: Resolution of the drop probability: a 16-bit lane takes 2**16 values.
_STEPS = 2**16


def _check_probability(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be a number in [0, 1], got {p!r}")
    return float(p)


def realised_probability(p: float) -> float:
    """The drop probability :func:`keep_mask` realises for ``p``: ``p`` rounded to 1/65,536."""
    return round(_check_probability(p) * _STEPS) / _STEPS


def survivor_scale(p: float) -> float:
    """The factor ``1 / (1 - realised_probability(p))`` of the kept elements (0 when ``p``
    rounds to 1: nothing survives to be scaled)."""
    kept = 1.0 - realised_probability(p)
    return 1.0 / kept if kept else 0.0


def _random_lanes(numel: int, device: torch.device | str) -> Tensor:
    """``(numel,)`` int16, uniform over all 65,536 values: 64-bit random words cut in four."""
    words = -(-numel // _LANES)
    if words == 0:
        return torch.empty(0, dtype=torch.int16, device=device)  # (0,)
    if torch.device(device).type == "cpu":
        seed = int(torch.empty((), dtype=torch.int64).random_())  # torch's default generator
        raw = np.random.SFC64(seed).random_raw(words)  # (words,) uint64, every bit random
        bits = torch.from_numpy(raw.view(np.int64))  # (words,) shares the memory
    else:
        full_range = {"from": -(2**63), "to": None}  # every one of the 64 bits random
        bits = torch.empty(words, dtype=torch.int64, device=device).random_(**full_range)
    return bits.view(torch.int16)[:numel]  # (numel,)


def _keep_into(out: Tensor, p: float) -> Tensor:
    """Fill ``out`` (bool or float, any shape) with keep decisions, True / 1 with probability
    ``1 - realised_probability(p)``, straight from the lanes (no boolean in between)."""
    dropped = round(_check_probability(p) * _STEPS)  # lane values that drop: 0 .. 2**16
    if dropped == _STEPS:  # p rounds to 1: no lane keeps (the threshold 2**15 is no int16)
        return out.zero_()
    lanes = _random_lanes(out.numel(), out.device).view(out.shape)  # (*out.shape) uniform
    return torch.ge(lanes, -(2**15) + dropped, out=out)  # (*out.shape): keep where ≥ threshold


def keep_mask(
    shape: tuple[int, ...] | torch.Size,
    p: float,
    device: torch.device | str = "cpu",
    *,
    dtype: torch.dtype = torch.bool,
) -> Tensor:
    """Mask of the given shape, each element kept (``True``, or 1) with probability ``1 - p``.

    Each random 64-bit word (numpy's SFC64 on a CPU, ``Tensor.random_`` elsewhere) is read as
    four 16-bit lanes, each uniform over the 65,536 int16 values; a lane keeps its element when it is
    ≥ a threshold, so every element keeps with probability ``1 - realised_probability(p)``.

    Args:
        shape: shape of the mask.
        p: drop probability in ``[0, 1]``.
        device: where to make the mask.
        dtype: ``torch.bool`` (default), or a floating dtype for a mask of 0s and 1s that
            multiplies directly (the comparison writes it, no boolean in between).

    Returns:
        Tensor of shape ``shape`` and dtype ``dtype``.
    """
    if dtype != torch.bool and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be torch.bool or a floating dtype, got {dtype!r}")
    keep = torch.empty(tuple(shape), dtype=dtype, device=device)  # (*shape,)
    return _keep_into(keep, p)  # (*shape,) True / 1 = keep


def _use_fused(x: Tensor) -> bool:
    return x.device.type != "cpu" or not x.is_floating_point() or torch.compiler.is_compiling()


def dropout_factor(x: Tensor, p: float) -> Tensor:
    """What dropout multiplies ``x`` by: each element ``1 / (1 - realised p)`` (kept) with
    probability ``1 - realised_probability(p)``, else 0 - all zeros when ``p`` rounds to 1.

    ``x * dropout_factor(x, p)`` is :func:`dropout` on a CPU; the factor is useful on its own
    where the same decisions are needed again (the hand-written backward pass of the CPU
    attention with dropout in :mod:`companion.attention`).

    Args:
        x: floating-point tensor whose shape, dtype and device the factor takes.
        p: drop probability in ``[0, 1]``.

    Returns:
        Tensor like ``x``.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point tensor, got {got}")
    factor = _keep_into(torch.empty_like(x, memory_format=torch.contiguous_format), p)  # 0 or 1
    return factor.mul_(survivor_scale(p))  # (*x.shape): 0 or the scale


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of ``x`` with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Same contract as ``torch.nn.functional.dropout`` (identity when ``training`` is false or
    ``p == 0``; all zeros when ``p == 1``), with the cheaper random numbers of
    :func:`keep_mask` on a CPU and torch's fused kernel elsewhere.

    Args:
        x: any shape ``(*)``.
        p: drop probability in ``[0, 1]``.
        training: apply dropout only when true.

    Returns:
        Tensor of the shape of ``x``.
    """
    p = _check_probability(p)
    if not training or p == 0.0:
        return x
    if _use_fused(x):
        return F.dropout(x, p, training=True)
    return x * dropout_factor(x, p)  # (*x.shape); backward multiplies by the same factor


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` with :func:`dropout`'s cheaper random numbers on a CPU.

    A subclass, so code that looks for ``nn.Dropout`` modules (to change ``p``, or to skip
    them in a shape trace) still finds it; ``inplace=True`` uses torch's own kernel.
    """

    def forward(self, x: Tensor) -> Tensor:
        """``x``: any shape ``(*)`` → same shape."""
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
