"""Exercises of chapter 4, "Positional encoding".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several sizes, plus edge cases), and returns
a :class:`~companion.exercises._checker.CheckResult` that is truthy when every case matches.
The checks call your function with keyword arguments, so keep the parameter names of the
stub in the notebook.

===============================================  ==================================
exercise                                         check
===============================================  ==================================
the sinusoidal table, by hand                    :func:`check_sinusoidal_table`
the shift matrix ``M_k``                         :func:`check_shift_matrix`
the similarity ``PE[p] · PE[p + k]``, in closed form  :func:`check_pe_similarity`
a rotary (RoPE) rotation of queries or keys      :func:`check_rope_rotate`
===============================================  ==================================

The references are written from the formulas (in float64), independently of
:mod:`companion.positional`; ``tests/test_exercises_ch04.py`` checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from companion.exercises._checker import Case, CheckResult, run_check, seeded_generator

__all__ = [
    "check_sinusoidal_table",
    "check_shift_matrix",
    "check_pe_similarity",
    "check_rope_rotate",
    "reference_sinusoidal_table",
    "reference_shift_matrix",
    "reference_pe_similarity",
    "reference_rope_rotate",
]

#: The ``10000`` of "Attention Is All You Need"; every exercise of the chapter uses it.
BASE = 10000.0


def _frequencies(dim: int) -> Tensor:
    """``ω_i = BASE^(-2i/dim)`` for the pairs ``i = 0 .. dim/2 - 1``, float64, shape ``(dim/2,)``."""
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)  # (dim/2,) = 0, 2, 4, ...
    return BASE ** (-two_i / dim)  # (dim/2,)


# --------------------------------------------------------------------------------------------
# Exercise 1: the sinusoidal table
# --------------------------------------------------------------------------------------------


def reference_sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """``PE[p, 2i] = sin(p ω_i)``, ``PE[p, 2i+1] = cos(p ω_i)``, ``ω_i = 10000^(-2i/d_model)``.

    Args:
        max_len: number of positions ``0 .. max_len - 1``.
        d_model: size of an encoding vector (even).

    Returns:
        float32 tensor of shape ``(max_len, d_model)``.
    """
    positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    angles = positions * _frequencies(d_model)  # (max_len, d_model/2)
    pairs = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1)  # (max_len, d/2, 2)
    return pairs.flatten(-2).float()  # (max_len, d_model): sin, cos, sin, cos, ...


def _table_cases() -> list[Case]:
    # d_model = 2 alone cannot tell the exponent bugs apart (i = 0 only): larger sizes can.
    sizes = [(10, 4), (50, 16), (1, 8), (7, 128), (100, 6), (3, 512), (20, 2)]
    return [{"max_len": max_len, "d_model": d_model} for max_len, d_model in sizes]


def check_sinusoidal_table(
    sinusoidal_table: Callable[[int, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``sinusoidal_table(max_len, d_model) -> (max_len, d_model)``.

    The tolerance (``5e-5``) admits a float32 computation of the angles (up to position 99,
    their rounding error stays below ``1e-5``); the classic bugs are off by 0.1 to 2.
    """
    return run_check(
        "sinusoidal_table",
        sinusoidal_table,
        reference_sinusoidal_table,
        _table_cases(),
        atol=5e-5,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: the shift matrix M_k with PE[p + k] = M_k PE[p]
# --------------------------------------------------------------------------------------------


def reference_shift_matrix(shift: int, d_model: int) -> Tensor:
    """The block-diagonal ``M_k`` with ``PE[p + k] = M_k @ PE[p]`` for every position ``p``.

    Block ``i`` acts on the pair ``(sin(p ω_i), cos(p ω_i))`` and is
    ``[[cos(k ω_i), sin(k ω_i)], [-sin(k ω_i), cos(k ω_i)]]`` (angle-addition formulas).

    Args:
        shift: the offset ``k`` (any integer, also negative).
        d_model: size of an encoding vector (even).

    Returns:
        float32 tensor of shape ``(d_model, d_model)``.
    """
    angles = shift * _frequencies(d_model)  # (d_model/2,)
    cos, sin = torch.cos(angles), torch.sin(angles)  # (d_model/2,) each
    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)  # (d_model, d_model)
    even = torch.arange(0, d_model, 2)  # (d_model/2,) row/column of each sine
    matrix[even, even] = cos  # new sin ← cos(kω) · sin
    matrix[even, even + 1] = sin  # new sin ← sin(kω) · cos
    matrix[even + 1, even] = -sin  # new cos ← -sin(kω) · sin
    matrix[even + 1, even + 1] = cos  # new cos ← cos(kω) · cos
    return matrix.float()  # (d_model, d_model)


def _shift_cases() -> list[Case]:
    pairs = [(1, 4), (5, 8), (-3, 6), (0, 4), (17, 16), (1, 2), (40, 32), (-12, 10)]
    return [{"shift": shift, "d_model": d_model} for shift, d_model in pairs]


def check_shift_matrix(
    shift_matrix: Callable[[int, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``shift_matrix(shift, d_model) -> (d_model, d_model)``."""
    return run_check(
        "shift_matrix", shift_matrix, reference_shift_matrix, _shift_cases(), verbose=verbose
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: the similarity of two positions, in closed form
# --------------------------------------------------------------------------------------------


def reference_pe_similarity(offsets: Tensor, d_model: int) -> Tensor:
    """``PE[p] · PE[p + k] = Σ_i cos(k ω_i)`` for each offset ``k`` (the same for every ``p``).

    ``sin(a) sin(b) + cos(a) cos(b) = cos(a - b)``, one term per (sin, cos) pair.

    Args:
        offsets: integer offsets ``k``, shape ``(n,)``.
        d_model: size of an encoding vector (even).

    Returns:
        float64 tensor of shape ``(n,)``; ``d_model / 2`` at offset 0.
    """
    angles = offsets.double()[:, None] * _frequencies(d_model)  # (n, d_model/2)
    return torch.cos(angles).sum(dim=-1)  # (n,)


def _similarity_cases() -> list[Case]:
    g = seeded_generator(401)
    cases: list[Case] = [
        {"offsets": torch.arange(0, 10), "d_model": 8},
        {"offsets": torch.tensor([0, 1, -1, 5, -5]), "d_model": 16},  # symmetric in k
        {"offsets": torch.randint(-200, 200, (12,), generator=g), "d_model": 128},
        {"offsets": torch.tensor([3]), "d_model": 2},
        {"offsets": torch.randint(0, 1000, (20,), generator=g), "d_model": 64},
    ]
    return cases


def check_pe_similarity(
    pe_similarity: Callable[[Tensor, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``pe_similarity(offsets, d_model) -> (n,)``, the dot product of two encodings."""
    return run_check(
        "pe_similarity",
        pe_similarity,
        reference_pe_similarity,
        _similarity_cases(),
        atol=1e-4,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: rotary position embedding (RoPE)
# --------------------------------------------------------------------------------------------


def reference_rope_rotate(x: Tensor, positions: Tensor) -> Tensor:
    """Rotate each pair ``(x[..., 2i], x[..., 2i+1])`` of position ``p`` by the angle ``p ω_i``.

    ``(a, b) → (a cos θ - b sin θ, a sin θ + b cos θ)`` with ``θ = p · 10000^(-2i/head_dim)``:
    a counter-clockwise rotation, the convention of :class:`companion.positional.RotaryEmbedding`.

    Args:
        x: queries or keys, shape ``(..., seq_len, head_dim)`` (``head_dim`` even).
        positions: integer positions, shape ``(seq_len,)``.

    Returns:
        Tensor with the shape and dtype of ``x``.
    """
    angles = positions.double()[:, None] * _frequencies(x.shape[-1])  # (seq_len, head_dim/2)
    cos, sin = torch.cos(angles), torch.sin(angles)  # (seq_len, head_dim/2) each
    a, b = x[..., 0::2].double(), x[..., 1::2].double()  # (..., seq_len, head_dim/2) each
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (..., L, hd/2, 2)
    return rotated.flatten(-2).to(x.dtype)  # (..., seq_len, head_dim)


def _rope_cases() -> list[Case]:
    g = seeded_generator(402)
    cases: list[Case] = []
    for shape in [(5, 4), (6, 16), (2, 3, 7, 8), (1, 2), (4, 3, 32)]:
        seq_len = shape[-2]
        cases.append({"x": torch.randn(shape, generator=g), "positions": torch.arange(seq_len)})
    # positions that are not 0, 1, 2, ...: an offset, repeats, any order
    cases.append({"x": torch.randn(4, 8, generator=g), "positions": torch.tensor([7, 0, 3, 3])})
    cases.append({"x": torch.randn(2, 6, 12, generator=g), "positions": torch.arange(40, 46)})
    return cases


def check_rope_rotate(
    rope_rotate: Callable[[Tensor, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``rope_rotate(x, positions)``: ``(..., seq_len, head_dim)``, ``(seq_len,)`` → same shape as ``x``."""
    return run_check(
        "rope_rotate", rope_rotate, reference_rope_rotate, _rope_cases(), verbose=verbose
    )
