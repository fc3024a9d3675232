"""Exercises of chapter 4, "Positional encoding".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several sizes, plus edge cases), and returns
a :class:`~companion.exercises._checker.CheckResult` that is truthy when every case matches.
The checks call your function with keyword arguments, so keep the parameter names of the
stub in the notebook.

===============================================  ==================================
exercise                                         check
===============================================  ==================================
the shift matrix ``M_Δ`` of the sin | cos layout  :func:`check_concat_shift_matrix`
the two closest codes of a table, measured      :func:`check_closest_codes`
porting a rotate-half checkpoint (GQA, biases)  :func:`check_half_to_interleaved`
capstone: a rotary (RoPE) rotation              :func:`check_rope_rotate`
capstone: ``MyMHA`` with optional RoPE           :func:`check_my_mha`
capstone: ``encode(tokens, ..., starts)``        :func:`check_encode`
capstone: is a layer shift-invariant?          :func:`check_shift_invariant`
===============================================  ==================================

The references are written from the formulas (in float64), independently of
:mod:`companion.positional`; ``tests/test_exercises_ch04.py`` checks that the two agree.
The exercises that ask the reader to build something :mod:`companion.positional` already
provides (the shift matrix of exercise 1, the layout reordering of exercise 3, the rotation,
the table inside ``encode``) are checked with that module switched off: a call into it fails
the check. The rotation must also be the pairwise form: no complex tensors, no ``d_k × d_k``
matrix.
``MyMHA`` is checked with :mod:`companion.attention` and PyTorch's fused attention switched
off as well.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

import companion.attention as _attention
import companion.positional as _positional
from companion._validation import check_callable as _check_callable
from companion.exercises._checker import (
    Case,
    CheckResult,
    as_verdict,
    call_reader,
    compare,
    refusing_calls,
    report,
    run_check,
    run_verdict_check,
    seeded_generator,
)

__all__ = [
    "check_concat_shift_matrix",
    "check_closest_codes",
    "check_half_to_interleaved",
    "check_rope_rotate",
    "check_my_mha",
    "check_encode",
    "check_shift_invariant",
]

#: The ``10000`` of "Attention Is All You Need"; every exercise of the chapter uses it.
BASE = 10000.0


def _frequencies(dim: int) -> Tensor:
    """``ω_m = BASE^(-2m/dim)`` for the pairs ``m = 0 .. dim/2 - 1``, float64, shape ``(dim/2,)``."""
    two_m = torch.arange(0, dim, 2, dtype=torch.float64)  # (dim/2,) = 0, 2, 4, ...
    return BASE ** (-two_m / dim)  # (dim/2,)


def _without_package(
    fn: Callable[..., object], task: str, modules: tuple[object, ...] = (_positional,)
) -> Callable[..., object]:
    """``fn``, failing (``RuntimeError``) when it calls into one of ``modules`` (by default
    :mod:`companion.positional`): the exercise asks for ``task`` by hand."""
    return refusing_calls(fn, task, modules, why=", from the formulas of the chapter")


def _without_positional(fn: Callable[..., object], task: str) -> Callable[..., object]:
    """``fn``, failing (``RuntimeError``) when it calls into :mod:`companion.positional`."""
    return _without_package(fn, task)


#: Torch functions that multiply by a matrix: a ``(..., d_k, d_k)`` operand of one of them is
#: section 4.5's ``R_i`` applied to the vectors.
_MATMUL_NAMES = frozenset(
    {
        "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "einsum", "tensordot", "linear",
        "multi_dot", "chain_matmul", "addmm", "baddbmm", "addbmm", "mv", "bilinear",
    }
)  # fmt: skip


class _PairwiseWatch(torch.overrides.TorchFunctionMode):
    """Records, while the mode is on, the first torch function that returns a complex tensor,
    a call of ``torch.block_diag``, and the first matrix product (:data:`_MATMUL_NAMES`) with a
    ``(..., width, width)`` operand (a ``d_k × d_k`` matrix applied to the vectors).

    Only operations are flagged, not shapes: a table of cosines and sines that happens to be
    ``d_k × d_k`` (positions ``0 .. d_k - 1``), indexed by position and multiplied entry by
    entry, is the pairwise form and passes.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.complex: str | None = None
        self.square: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        if self.square is None and self.width > 0:
            if name == "block_diag":
                self.square = "block_diag"
            elif name in _MATMUL_NAMES:
                operands = [*args, *kwargs.values()]
                operands += [t for a in args if isinstance(a, (tuple, list)) for t in a]
                for t in operands:
                    if isinstance(t, Tensor) and t.dim() >= 2 and t.shape[-2:] == (self.width,) * 2:
                        self.square = f"{name} with an operand of shape {tuple(t.shape)}"
                        break
        value = func(*args, **kwargs)
        outputs = value if isinstance(value, (tuple, list)) else (value,)
        for v in outputs:
            if self.complex is None and isinstance(v, Tensor) and v.is_complex():
                self.complex = name
        return value


def _pairwise_only(fn: Callable[..., object], task: str) -> Callable[..., object]:
    """``fn``, failing (``RuntimeError``) when it computes with complex tensors, calls
    ``torch.block_diag``, or multiplies by a ``d_k × d_k`` matrix (``d_k = x.shape[-1]`` at
    least 4; at ``d_k = 2`` a ``2 × 2`` block is the pairwise form itself).

    The chapter shows both forms of the rotation: the complex numbers, and the block-diagonal
    ``R_i`` of section 4.5 (``torch.block_diag``). The exercise asks for ``task`` with real
    pairs. The signature of ``fn`` is kept (``functools.wraps``).
    """

    @functools.wraps(fn)
    def run(**kwargs: object) -> object:
        x = kwargs.get("x")
        width = x.shape[-1] if isinstance(x, Tensor) and x.dim() >= 1 else 0
        with _PairwiseWatch(width if width >= 4 else -1) as watch:
            value = fn(**kwargs)
        pairs = "real pairs (a, b) = (x[..., 0::2], x[..., 1::2]), turned with cos and sin"
        if watch.complex is not None:
            raise RuntimeError(
                f"your function computed with complex numbers ({watch.complex}); the chapter "
                f"shows that form, this exercise asks you to {task} with {pairs}"
            )
        if watch.square is not None:
            raise RuntimeError(
                f"your function seems to apply a d_k × d_k matrix ({watch.square}), "
                f"as section 4.5 does to show the algebra; this exercise asks you to {task} "
                f"with {pairs}, entry by entry. (A table of cosines and sines indexed by "
                "position and multiplied entry by entry is fine.)"
            )
        return value

    return run


#: PyTorch's ready-made attention: one call scales, softmaxes and mixes the values.
_FUSED_ATTENTION = (
    torch.nn.functional.scaled_dot_product_attention,
    torch.nn.functional.multi_head_attention_forward,
)


# --------------------------------------------------------------------------------------------
# The sinusoidal table: the codes that reference_encode adds
# --------------------------------------------------------------------------------------------


def reference_sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """``PE[i, 2m] = sin(i ω_m)``, ``PE[i, 2m+1] = cos(i ω_m)``, ``ω_m = 10000^(-2m/d_model)``.

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


# --------------------------------------------------------------------------------------------
# Exercise 1: the shift matrix M_Δ of the concatenated (sin | cos) layout
# --------------------------------------------------------------------------------------------


def reference_concat_table(max_len: int, d_model: int) -> Tensor:
    """The paper's sinusoidal table in the concatenated layout: all sines, then all cosines,
    ``[sin(i ω_0) … sin(i ω_{d/2-1}) | cos(i ω_0) … cos(i ω_{d/2-1})]`` with
    ``ω_m = 10000^(-2m/d)``. (tensor2tensor's ``get_timing_signal_1d`` also concatenates, but
    spaces its frequencies as ``10000^(-m/(d/2 - 1))``, so its table is not this one.)

    Returns:
        float32 tensor of shape ``(max_len, d_model)``.
    """
    positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    angles = positions * _frequencies(d_model)  # (max_len, d_model/2)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).float()  # (max_len, d)


def reference_concat_shift_matrix(shift: int, d_model: int) -> Tensor:
    """``M_Δ`` with ``PE[i + Δ] = PE[i] @ M_Δ`` (row vectors, as in chapter 4) for the
    **concatenated** layout.

    The four ``d/2 × d/2`` blocks are diagonal: ``[[C, -S], [S, C]]`` with
    ``C = diag(cos(Δ ω_m))`` and ``S = diag(sin(Δ ω_m))`` - the interleaved ``M_Δ`` (chapter
    4, section 4.2) with its rows and columns permuted.

    Args:
        shift: the offset ``Δ`` (any integer, also negative).
        d_model: size of an encoding vector (even).

    Returns:
        float32 tensor of shape ``(d_model, d_model)``.
    """
    angles = shift * _frequencies(d_model)  # (d_model/2,)
    cos, sin = torch.diag(torch.cos(angles)), torch.diag(torch.sin(angles))  # (d/2, d/2) each
    # new sine = sin · cos(Δω) + cos · sin(Δω); new cosine = cos · cos(Δω) - sin · sin(Δω)
    from_sines = torch.cat([cos, -sin], dim=1)  # rows of the old sines
    from_cosines = torch.cat([sin, cos], dim=1)  # rows of the old cosines
    return torch.cat([from_sines, from_cosines], dim=0).float()  # (d_model, d_model)


def _shift_cases() -> list[Case]:
    pairs = [(1, 4), (5, 8), (-3, 6), (0, 4), (17, 16), (1, 2), (40, 32), (-12, 10)]
    return [{"shift": shift, "d_model": d_model} for shift, d_model in pairs]


def check_concat_shift_matrix(
    concat_shift_matrix: Callable[[int, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``concat_shift_matrix(shift, d_model) -> (d_model, d_model)`` for the sin | cos
    layout, with :mod:`companion.positional` switched off: reordering the package's
    ``sinusoidal_shift_matrix`` (``M_Δ``) by ``rope_layout_permutation`` is one line, so a
    call into the module fails the check. Every route from the formulas passes: the four
    diagonal blocks, or the interleaved ``M_Δ`` built by hand with its rows and columns
    reordered into the sin | cos order. The interleaved matrix itself, its transpose
    (``M_{-Δ}``), the inverse order, or reordering the columns alone fail."""
    return run_check(
        "concat_shift_matrix",
        _without_positional(concat_shift_matrix, "build the shift matrix"),
        reference_concat_shift_matrix,
        _shift_cases(),
        verbose=verbose,
        hint=_concat_shift_hint,
    )


def _close_to(got: object, expected: Tensor) -> bool:
    """Whether ``got`` is a tensor of ``expected``'s shape with the same entries, to 1e-4."""
    return (
        isinstance(got, Tensor)
        and got.shape == expected.shape
        and torch.allclose(got.double(), expected.double(), atol=1e-4, rtol=1e-3)
    )


def _concat_shift_hint(case: Mapping[str, object], got: object) -> str:
    """The hint of the two classic slips: the matrix that turns back (``M_{-Δ}``, the
    transpose), and section 4.2's interleaved ``M_Δ`` left in its own order."""
    shift, d_model = int(case["shift"]), int(case["d_model"])
    if _close_to(got, reference_concat_shift_matrix(-shift, d_model)):
        return (
            "\n   Your matrix is M_(-Δ), the transpose: it moves the table back by `shift`. "
            "Check table[i + shift] == table[i] @ M on a few rows of the concatenated table."
        )
    back = torch.argsort(torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)]))
    interleaved = reference_concat_shift_matrix(shift, d_model)[back][:, back]  # section 4.2's M_Δ
    if _close_to(got, interleaved):
        return (
            "\n   This is section 4.2's M_Δ for the interleaved table. The concatenated table "
            "has its columns in the sin | cos order: reorder M's rows and its columns alike."
        )
    return ""


# --------------------------------------------------------------------------------------------
# Exercise 2: the two closest codes of a table, measured
# --------------------------------------------------------------------------------------------


def reference_closest_codes(seq_len: int, d_model: int) -> tuple[int, float]:
    """The offset ``Δ > 0`` whose codes are closest, and their distance ``‖PE_i - PE_{i+Δ}‖``.

    Every code has ``‖PE_i‖² = d/2`` and ``PE_i · PE_{i+Δ} = S(Δ) = Σ_m cos(Δ ω_m)``, so
    ``‖PE_i - PE_{i+Δ}‖² = d - 2 S(Δ)``: the same for every ``i``. The minimum runs over the
    offsets ``1 .. seq_len - 1`` that two positions of a ``seq_len``-row table can have.

    Args:
        seq_len: number of positions ``0 .. seq_len - 1`` (at least 2).
        d_model: size of an encoding vector (even).

    Returns:
        ``(offset, distance)``: a Python ``int`` and ``float``.
    """
    if not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int of at least 2 (two positions), got {seq_len!r}")
    offsets = torch.arange(1, seq_len, dtype=torch.float64)  # (seq_len - 1,)
    similarity = torch.cos(offsets[:, None] * _frequencies(d_model)).sum(dim=-1)  # (seq_len - 1,)
    squared = (d_model - 2 * similarity).clamp(min=0)  # (seq_len - 1,)
    best = int(squared.argmin())
    return best + 1, math.sqrt(squared[best].item())


def _closest_cases() -> list[Case]:
    # (45, 2): one pair of wavelength 2π, and 44 ≈ 7 · 2π: positions 0 and 44 nearly coincide;
    # (44, 2): without offset 44 the closest is 25 ≈ 4 · 2π, so the offsets' range matters.
    pairs = [(45, 2), (44, 2), (10, 2), (2, 8), (100, 4), (300, 8), (512, 16), (512, 128)]
    return [{"seq_len": seq_len, "d_model": d_model} for seq_len, d_model in pairs]


def _as_offset_and_distance(value: object) -> object:
    """``(offset, distance)`` with 0-d tensors turned into Python numbers; else unchanged."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        offset, distance = value
        if isinstance(offset, Tensor) and offset.numel() == 1:
            offset = offset.item()
        if isinstance(distance, Tensor) and distance.numel() == 1:
            distance = distance.item()
        return (offset, distance)
    return value


def check_closest_codes(
    closest_codes: Callable[[int, int], tuple[int, float]], verbose: bool = True
) -> CheckResult:
    """Check ``closest_codes(seq_len, d_model) -> (offset, distance)``.

    The distance may come from a float32 table (tolerance ``1e-3``, far below the gaps
    between a distance and its square, or between neighbouring candidates). Offset 0 (a
    position and itself), the squared distance, the largest dot product reported as the
    distance, or an offset range that stops one short or runs one too far are all rejected,
    and so is an offset returned as a float (``63.0``, or a float tensor): the exercise asks for
    an ``int``. An integer 0-d tensor counts as an int, and a 0-d tensor distance as a float.
    """

    @functools.wraps(closest_codes)
    def run(**kwargs: object) -> object:
        value = _as_offset_and_distance(closest_codes(**kwargs))
        if isinstance(value, tuple) and not isinstance(value[0], (int, Tensor)):
            offset = value[0]
            if isinstance(offset, float) and offset.is_integer():  # e.g. 63.0
                raise TypeError(
                    f"the offset should be an int, as the exercise asks; got the float {offset!r} "
                    "(int(...) converts it)"
                )
        return value

    return run_check(
        "closest_codes",
        run,
        reference_closest_codes,
        _closest_cases(),
        atol=1e-3,
        rtol=1e-3,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: porting a rotate-half checkpoint to the interleaved layout (GQA, biases)
# --------------------------------------------------------------------------------------------

#: Parameter names of a rotate-half attention checkpoint (Hugging Face's names, as in Qwen2:
#: biases on the query, key and value projections, none on the output projection).
PORT_PARAMETERS = (
    "q_proj.weight",
    "q_proj.bias",
    "k_proj.weight",
    "k_proj.bias",
    "v_proj.weight",
    "v_proj.bias",
    "o_proj.weight",
)


def _rotate_interleaved(x: Tensor) -> Tensor:
    """RoPE, pairs ``(2m, 2m+1)``: ``x (batch, heads, seq_len, head_dim)`` at positions 0, 1, ...

    Float64 throughout; the rotation of :func:`reference_rope_rotate`.
    """
    return reference_rope_rotate(x, torch.arange(x.shape[-2]))  # (batch, heads, seq_len, hd)


def _rotate_half(x: Tensor) -> Tensor:
    """RoPE, pairs ``(m, m + head_dim/2)``: ``x (batch, heads, seq_len, head_dim)`` at 0, 1, ...

    ``x cos + [-x_2 | x_1] sin`` with the ``head_dim/2`` angles repeated over both halves.
    """
    positions = torch.arange(x.shape[-2], dtype=torch.float64)[:, None]  # (seq_len, 1)
    angles = positions * _frequencies(x.shape[-1])  # (seq_len, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (seq_len, head_dim)
    first, second = x.chunk(2, dim=-1)  # (..., seq_len, head_dim/2) each
    return x * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()


def reference_rope_attention(
    state: dict[str, Tensor], x: Tensor, num_heads: int, num_kv_heads: int, layout: str
) -> Tensor:
    """Self-attention with RoPE and grouped-query heads, from a checkpoint, in float64.

    Query head ``r`` reads key/value head ``r // (num_heads / num_kv_heads)``. Queries and
    keys are rotated after the split into heads (positions ``0 .. seq_len-1``); values are not.

    Args:
        state: the tensors named in :data:`PORT_PARAMETERS`: ``q_proj.weight``
            ``(num_heads · head_dim, d_model)``, ``k_proj.weight`` and ``v_proj.weight``
            ``(num_kv_heads · head_dim, d_model)``, their biases, ``o_proj.weight``
            ``(d_model, num_heads · head_dim)``.
        x: shape ``(batch, seq_len, d_model)``.
        num_heads: query heads ``h``; ``head_dim = d_model / h``.
        num_kv_heads: key/value heads ``g`` (divides ``h``).
        layout: ``"interleaved"`` (RoFormer, Meta's LLaMA) or ``"rotate_half"`` (GPT-NeoX,
            Hugging Face).

    Returns:
        float64 tensor of shape ``(batch, seq_len, d_model)``.
    """
    if layout not in ("interleaved", "rotate_half"):
        raise ValueError(f"layout must be 'interleaved' or 'rotate_half', got {layout!r}")
    batch, seq_len, d_model = x.shape
    head_dim = d_model // num_heads
    x64 = x.double()  # (batch, seq_len, d_model)

    def project(name: str, heads: int) -> Tensor:  # → (batch, heads, seq_len, head_dim)
        weight, bias = state[f"{name}.weight"].double(), state[f"{name}.bias"].double()
        y = x64 @ weight.T + bias  # (batch, seq_len, heads · head_dim)
        return y.view(batch, seq_len, heads, head_dim).transpose(1, 2)

    rotate = _rotate_interleaved if layout == "interleaved" else _rotate_half
    q = rotate(project("q_proj", num_heads))  # (batch, h, seq_len, head_dim)
    k = rotate(project("k_proj", num_kv_heads))  # (batch, g, seq_len, head_dim)
    v = project("v_proj", num_kv_heads)  # (batch, g, seq_len, head_dim)
    group = num_heads // num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (b, h, n, hd)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (batch, h, seq_len, seq_len)
    heads = torch.softmax(scores, dim=-1) @ v  # (batch, h, seq_len, head_dim)
    merged = heads.transpose(1, 2).reshape(batch, seq_len, num_heads * head_dim)
    return merged @ state["o_proj.weight"].double().T  # (batch, seq_len, d_model)


def reference_half_to_interleaved(
    state: dict[str, Tensor], num_heads: int, num_kv_heads: int
) -> dict[str, Tensor]:
    """Convert a rotate-half checkpoint to the interleaved layout.

    Interleaved feature ``2m`` of a head is rotate-half feature ``m`` and feature ``2m + 1`` is
    feature ``m + head_dim/2``: the rows (output features) of ``W_Q`` and ``W_K`` and their
    biases are reordered head by head; values and ``W_O`` stay as they are.

    Args:
        state: a rotate-half checkpoint, named as in :data:`PORT_PARAMETERS`.
        num_heads: query heads; ``head_dim = d_model / num_heads``.
        num_kv_heads: key/value heads (the heads of ``k_proj``).

    Returns:
        A new dict with the same names and shapes.
    """
    d_model = state["o_proj.weight"].shape[0]
    head_dim = d_model // num_heads
    within = torch.stack(
        [torch.arange(head_dim // 2), torch.arange(head_dim // 2) + head_dim // 2], dim=-1
    ).flatten()  # (head_dim,): 0, hd/2, 1, hd/2 + 1, ...

    def rows(heads: int) -> Tensor:  # (heads · head_dim,)
        return (torch.arange(heads)[:, None] * head_dim + within).flatten()

    converted = {name: tensor.clone() for name, tensor in state.items()}
    for name, heads in (("q_proj", num_heads), ("k_proj", num_kv_heads)):
        for kind in ("weight", "bias"):
            converted[f"{name}.{kind}"] = state[f"{name}.{kind}"][rows(heads)].clone()
    return converted


class StateDict(dict):
    """A state dict whose repr lists names and shapes (a failed check prints its inputs)."""

    def __repr__(self) -> str:
        return ", ".join(f"{name} {tuple(tensor.shape)}" for name, tensor in self.items())


def _port_state(
    d_model: int, num_heads: int, num_kv_heads: int, g: torch.Generator
) -> dict[str, Tensor]:
    head_dim = d_model // num_heads
    q_out, kv_out = num_heads * head_dim, num_kv_heads * head_dim
    std = 1 / math.sqrt(d_model)
    shapes = {
        "q_proj.weight": (q_out, d_model),
        "q_proj.bias": (q_out,),
        "k_proj.weight": (kv_out, d_model),
        "k_proj.bias": (kv_out,),
        "v_proj.weight": (kv_out, d_model),
        "v_proj.bias": (kv_out,),
        "o_proj.weight": (d_model, q_out),
    }
    state = StateDict()
    for name, shape in shapes.items():
        scale = 0.5 if name.endswith("bias") else (3 * std if name[0] in "qk" else std)
        state[name] = scale * torch.randn(shape, generator=g)  # peaked scores, visible biases
    return state


def _port_cases() -> list[Case]:
    g = seeded_generator(407)
    cases: list[Case] = []
    # (d_model, num_heads, num_kv_heads, seq_len); head_dim >= 8, where the two reorderings
    # (interleaved → half and back) differ
    for d_model, heads, kv_heads, seq_len in [
        (32, 2, 2, 9),  # head_dim 16, multi-head
        (32, 4, 2, 10),  # head_dim 8, grouped-query
        (48, 4, 1, 8),  # head_dim 12, multi-query
        (64, 8, 4, 12),  # head_dim 8
        (24, 3, 3, 7),  # head_dim 8, an odd number of heads
    ]:
        cases.append(
            {
                "state": _port_state(d_model, heads, kv_heads, g),
                "x": torch.randn(2, seq_len, d_model, generator=g),
                "num_heads": heads,
                "num_kv_heads": kv_heads,
            }
        )
    return cases


def check_half_to_interleaved(
    half_to_interleaved: Callable[..., dict[str, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``half_to_interleaved(state, num_heads, num_kv_heads) -> dict``.

    ``state`` is a rotate-half checkpoint named as in :data:`PORT_PARAMETERS` (grouped-query
    heads, biases on ``q``, ``k``, ``v``). The check loads the reader's converted dict into
    interleaved RoPE attention and compares its outputs on random tokens with those of the
    rotate-half attention loaded with the original: a correct conversion changes nothing
    (to float64 rounding). Reordering in the wrong direction, over the whole width instead
    of head by head, forgetting ``W_K`` or the biases, reordering columns, or reordering
    the values without ``W_O`` all change the outputs.
    """

    def convert_and_run(
        state: dict[str, Tensor], x: Tensor, num_heads: int, num_kv_heads: int
    ) -> Tensor:
        given = {name: tensor.clone() for name, tensor in state.items()}
        convert = _without_positional(half_to_interleaved, "build the reordering")
        try:
            converted = convert(state=given, num_heads=num_heads, num_kv_heads=num_kv_heads)
        except IndexError as error:  # the classic: the key rows built for num_heads heads
            if num_kv_heads == num_heads:
                raise
            head_dim = state["o_proj.weight"].shape[1] // num_heads
            raise IndexError(
                f"{error}. Hint: k_proj and v_proj have num_kv_heads = {num_kv_heads} heads "
                f"({num_kv_heads * head_dim} rows), not num_heads = {num_heads}; build the "
                "key rows from num_kv_heads"
            ) from error
        if not isinstance(converted, dict):
            raise TypeError(
                f"half_to_interleaved must return a dict of tensors, got {type(converted).__name__}"
            )
        missing = [name for name in PORT_PARAMETERS if name not in converted]
        if missing:
            raise ValueError(f"the returned dict lacks {missing}; expected the keys of `state`")
        for name in PORT_PARAMETERS:
            if tuple(converted[name].shape) != tuple(state[name].shape):
                raise ValueError(
                    f"{name}: expected shape {tuple(state[name].shape)}, "
                    f"got {tuple(converted[name].shape)}"
                )
        with torch.no_grad():
            return reference_rope_attention(converted, x, num_heads, num_kv_heads, "interleaved")

    def reference(state: dict[str, Tensor], x: Tensor, num_heads: int, num_kv_heads: int) -> Tensor:
        return reference_rope_attention(state, x, num_heads, num_kv_heads, "rotate_half")

    return run_check(
        "half_to_interleaved",
        convert_and_run,
        reference,
        _port_cases(),
        atol=1e-8,
        rtol=1e-8,
        verbose=verbose,
        hint=_port_hint,
    )


def _port_hint(case: Mapping[str, object], got: object) -> str:
    """The hint of the classic slip: the rows reordered the other way (section 4.6's order
    ``0, 2, 4, ..., 1, 3, ...`` per head, which turns interleaved into rotate-half)."""
    state, x = case["state"], case["x"]
    num_heads, num_kv_heads = int(case["num_heads"]), int(case["num_kv_heads"])
    if not isinstance(state, dict) or not isinstance(x, Tensor):
        return ""
    head_dim = state["o_proj.weight"].shape[1] // num_heads
    within = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])  # (head_dim,)
    wrong = dict(state)
    for name, heads in (("q_proj", num_heads), ("k_proj", num_kv_heads)):
        rows = (torch.arange(heads)[:, None] * head_dim + within).flatten()  # (heads · head_dim,)
        for kind in ("weight", "bias"):
            wrong[f"{name}.{kind}"] = state[f"{name}.{kind}"][rows]
    expected = reference_rope_attention(wrong, x, num_heads, num_kv_heads, "interleaved")
    if not _close_to(got, expected):
        return ""
    return (
        "\n   Your rows go the other way: per head 0, 2, 4, ..., 1, 3, ... is section 4.6's "
        "order, interleaved → rotate-half. Here new feature 2m must be rotate-half feature m, "
        "and new feature 2m + 1 feature m + head_dim/2."
    )


# --------------------------------------------------------------------------------------------
# Capstone (a): rotary position embedding (RoPE)
# --------------------------------------------------------------------------------------------


def reference_rope_rotate(x: Tensor, positions: Tensor) -> Tensor:
    """Rotate each pair ``(x[..., 2m], x[..., 2m+1])`` of position ``i`` by the angle ``i ω_m``.

    ``(a, b) → (a cos θ - b sin θ, a sin θ + b cos θ)`` with ``θ = i · 10000^(-2m/head_dim)``:
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
    # seq_len != head_dim in every case: a right answer's (seq_len, head_dim) tensors must not
    # look like the d_k × d_k matrix that _pairwise_only refuses
    g = seeded_generator(402)
    cases: list[Case] = []
    for shape in [(5, 4), (6, 16), (2, 3, 7, 8), (1, 2), (4, 3, 32)]:
        seq_len = shape[-2]
        cases.append({"x": torch.randn(shape, generator=g), "positions": torch.arange(seq_len)})
    # positions that are not 0, 1, 2, ...: an offset, repeats, any order
    # (positions 0..9 at d_k = 8: a cos/sin table for 0..max(positions) is 10 × 8, not d_k × d_k;
    # the watch looks at operations, not shapes, but a square table would look suspicious)
    cases.append({"x": torch.randn(4, 8, generator=g), "positions": torch.tensor([9, 0, 3, 3])})
    cases.append({"x": torch.randn(2, 6, 12, generator=g), "positions": torch.arange(40, 46)})
    return cases


def check_rope_rotate(
    rope_rotate: Callable[[Tensor, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``rope_rotate(x, positions)``: ``(..., seq_len, head_dim)``, ``(seq_len,)`` → same shape as ``x``.

    The rotation must be written with real pairs: a call into :mod:`companion.positional`, a
    computation with complex tensors, ``torch.block_diag``, or a matrix product with a
    ``d_k × d_k`` operand (the two forms the chapter shows: the complex numbers, and section
    4.5's block-diagonal ``R_i``) fails the check. Tables of cosines and sines of any shape,
    indexed by position, pass.
    """
    user = _keeps_its_input(
        _without_positional(_pairwise_only(rope_rotate, "write the rotation"), "write the rotation")
    )
    result = run_check(
        "rope_rotate",
        user,
        reference_rope_rotate,
        _rope_cases(),
        verbose=False,
        hint=_rope_rotate_hint,
    )
    if result.passed:
        result.message += _rope_far_note(user)
    if verbose:
        report(result)
    return result


def _keeps_its_input(
    rope_rotate: Callable[[Tensor, Tensor], Tensor],
) -> Callable[..., Tensor]:
    """``rope_rotate`` that raises when it changes ``x`` in place: exercise (d) calls it twice on
    one ``x`` (``q = k = rope_rotate(x, ...)`` at two starts), and a rotation written into ``x``
    turns the second call's input into the first call's output, so RoPE looks shift-variant."""

    @functools.wraps(rope_rotate)
    def run(**kwargs: Tensor) -> Tensor:
        x = kwargs["x"]
        before = x.clone()
        out = rope_rotate(**kwargs)
        if not torch.equal(x, before):
            raise ValueError(
                "rope_rotate changed its input x in place (for example x[..., 0::2] = ...): "
                "return a new tensor instead (build it with torch.stack or torch.empty_like). "
                "Exercise (d) calls it twice on the same x, and an x changed by the first call "
                "makes RoPE look as if it depended on the start."
            )
        return out

    return run


def _rope_far_note(user: Callable[[Tensor, Tensor], Tensor]) -> str:
    """A note, not a failure: the cases reach position 45 only, where float32 angles are exact
    enough; at positions near 10 000 (exercise (d)'s far starts) float32 angles ``i · ω`` lose
    about 1e-3 of a radian, float64 ones stay within float32 rounding of the reference."""
    x = torch.randn(2, 6, 16, generator=seeded_generator(403))  # (batch, seq_len, head_dim)
    positions = torch.arange(10_000, 10_006)  # (seq_len,)
    try:
        with torch.no_grad():
            got = user(x=x.clone(), positions=positions.clone())
        gap = (got.double() - reference_rope_rotate(x, positions).double()).abs().max().item()
    except Exception:  # the cases above passed; a note must not turn them into a failure
        return ""
    if not gap > 1e-5:
        return ""
    return (
        f"\n   Note: at positions near 10 000 your rotation is off by {gap:.1e}. Compute the "
        f"angles (position · ω) in float64, then convert cos and sin to x's dtype: exercise (d) "
        f"uses far starts, where float32 angles lose digits."
    )


def _rope_rotate_hint(case: Mapping[str, object], got: object) -> str:
    """The hint of a rotation that turns the other way, as section 4.2's ``M_Δ`` (sine first)
    does: built from that block, it is ``M_i``, while RoPE's ``R_i`` is ``M_{-i}``."""
    x, positions = case["x"], case["positions"]
    if not isinstance(x, Tensor) or not isinstance(positions, Tensor):
        return ""
    if not _close_to(got, reference_rope_rotate(x, -positions)):
        return ""
    return (
        "\n   Your rotation turns the other way (clockwise), (a, b) ↦ (a cos φ + b sin φ, "
        "-a sin φ + b cos φ): that is the block of section 4.2's M_Δ at Δ = i, built for codes "
        "that hold the sine first. RoPE's R_i = M_(-i): (a, b) ↦ (a cos φ - b sin φ, "
        "a sin φ + b cos φ)."
    )


# --------------------------------------------------------------------------------------------
# Capstone (b)-(d): MyMHA (optional RoPE), encode, and a test that a layer is relative
# --------------------------------------------------------------------------------------------

#: Parameter names a ``MyMHA`` must have, so that weights can be copied in by name.
MHA_PARAMETERS = (
    "query_proj.weight",
    "query_proj.bias",
    "key_proj.weight",
    "key_proj.bias",
    "value_proj.weight",
    "value_proj.bias",
    "out_proj.weight",
    "out_proj.bias",
)


def reference_mha_forward(
    state: dict[str, Tensor],
    x: Tensor,
    num_heads: int,
    rope: bool,
    score_bias: Tensor | None = None,
    start: int = 0,
) -> Tensor:
    """Multi-head self-attention from a state dict, with optional RoPE.

    With ``rope=True`` the queries and keys of every head are rotated (pairs ``(2m, 2m+1)`` of
    the head's ``head_dim`` features, position ``i`` by ``i ω_m``) after the split into heads
    and before the scores; the values are not rotated.

    Args:
        state: ``nn.Linear`` weights ``(out, in)`` and biases named as in :data:`MHA_PARAMETERS`.
        x: shape ``(batch, seq_len, d_model)``.
        num_heads: number of heads.
        rope: rotate queries and keys.
        score_bias: added to every head's scaled scores, shape ``(seq_len, seq_len)``, or
            ``None``.
        start: the position of the first token (RoPE rotates token ``t`` by
            ``(start + t) ω_m``).

    Returns:
        Shape ``(batch, seq_len, d_model)``.
    """
    batch, seq_len, d_model = x.shape
    head_dim = d_model // num_heads

    def project(name: str) -> Tensor:  # (batch, seq_len, d_model) → (batch, h, seq_len, d_k)
        y = x @ state[f"{name}.weight"].T + state[f"{name}.bias"]  # (batch, seq_len, d_model)
        return y.view(batch, seq_len, num_heads, head_dim).transpose(1, 2)

    q, k, v = project("query_proj"), project("key_proj"), project("value_proj")
    if rope:
        positions = torch.arange(start, start + seq_len)  # (seq_len,)
        q, k = reference_rope_rotate(q, positions), reference_rope_rotate(k, positions)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (batch, h, seq_len, seq_len)
    if score_bias is not None:
        scores = scores + score_bias  # (batch, h, seq_len, seq_len)
    heads = torch.softmax(scores, dim=-1) @ v  # (batch, h, seq_len, d_k)
    merged = heads.transpose(1, 2).reshape(batch, seq_len, d_model)  # (batch, seq_len, d_model)
    return merged @ state["out_proj.weight"].T + state["out_proj.bias"]  # (batch, seq_len, d)


class _ReferenceMHA(nn.Module):
    """The reference ``MyMHA``: four named ``nn.Linear``, forward by :func:`reference_mha_forward`."""

    def __init__(self, d_model: int, num_heads: int, rope: bool = False) -> None:
        super().__init__()
        self.num_heads, self.rope = num_heads, rope
        self.query_proj = nn.Linear(d_model, d_model)
        self.key_proj = nn.Linear(d_model, d_model)
        self.value_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return reference_mha_forward(dict(self.state_dict()), x, self.num_heads, self.rope)


def reference_my_mha(d_model: int, num_heads: int, rope: bool = False) -> nn.Module:
    """A reference ``MyMHA(d_model, num_heads, rope)`` module (self-attention, optional RoPE)."""
    return _ReferenceMHA(d_model, num_heads, rope=rope)


def _torch_mha(state: dict[str, Tensor], x: Tensor, num_heads: int) -> Tensor:
    """The same attention computed by ``torch.nn.MultiheadAttention`` (weights copied in)."""
    d_model = x.shape[-1]
    module = nn.MultiheadAttention(d_model, num_heads, batch_first=True)
    with torch.no_grad():
        module.in_proj_weight.copy_(
            torch.cat([state[f"{n}.weight"] for n in ("query_proj", "key_proj", "value_proj")])
        )
        module.in_proj_bias.copy_(
            torch.cat([state[f"{n}.bias"] for n in ("query_proj", "key_proj", "value_proj")])
        )
        module.out_proj.weight.copy_(state["out_proj.weight"])
        module.out_proj.bias.copy_(state["out_proj.bias"])
        output, _ = module(x, x, x, need_weights=False)  # (batch, seq_len, d_model)
    return output


class _MHAState(StateDict):
    """Four projections of one shape each: the repr names them once, then the two shapes."""

    def __repr__(self) -> str:
        layers = ", ".join(
            name.removesuffix(".weight") for name in self if name.endswith(".weight")
        )
        return f"{layers}: weight {tuple(self[next(iter(self))].shape)}, bias {tuple(self[list(self)[1]].shape)}"


def _mha_state(d_model: int, g: torch.Generator) -> dict[str, Tensor]:
    std = 1 / math.sqrt(d_model)
    state = _MHAState()  # a short repr in failure messages
    for name in ("query_proj", "key_proj", "value_proj", "out_proj"):
        scale = 3 * std if name in ("query_proj", "key_proj") else std  # peaked weights
        state[f"{name}.weight"] = scale * torch.randn(d_model, d_model, generator=g)
        state[f"{name}.bias"] = 0.1 * torch.randn(d_model, generator=g)
    return state


def _my_mha_cases() -> list[Case]:
    g = seeded_generator(403)
    cases: list[Case] = []
    # (d_model, num_heads, rope, batch, seq_len)
    for d_model, heads, rope, batch, seq_len in [
        (16, 2, False, 2, 5),
        (24, 3, False, 1, 7),
        (16, 2, True, 2, 6),  # head_dim 8: four pairs per head
        (24, 4, True, 2, 9),  # head_dim 6
        (32, 4, True, 1, 12),
        (8, 1, True, 2, 5),  # one head: rotation of the whole vector is right
    ]:
        cases.append(
            {
                "d_model": d_model,
                "num_heads": heads,
                "rope": rope,
                "state": _mha_state(d_model, g),
                "x": torch.randn(batch, seq_len, d_model, generator=g),
            }
        )
    return cases


def check_my_mha(my_mha_class: Callable[..., nn.Module], verbose: bool = True) -> CheckResult:
    """Check a class ``MyMHA(d_model, num_heads, rope=False)`` whose ``forward(x)`` maps
    ``(batch, seq_len, d_model)`` to ``(batch, seq_len, d_model)``.

    Its parameters must be exactly those named in :data:`MHA_PARAMETERS` (four ``nn.Linear``
    with biases), so that the check can copy random weights in; buffers (a cos/sin cache,
    persistent or not) are allowed and keep their own values. Without RoPE the result is
    compared with ``torch.nn.MultiheadAttention`` holding the same weights; with RoPE with
    :func:`reference_mha_forward`. The class is built and run with :mod:`companion.attention`
    and :mod:`companion.positional` switched off: a subclass of ``MultiHeadAttention``, or a
    call into ``RotaryEmbedding``, fails the check. So does PyTorch's ready-made attention,
    ``F.scaled_dot_product_attention`` or ``nn.MultiheadAttention``.
    """

    def build_and_run(d_model: int, num_heads: int, rope: bool, state: dict, x: Tensor) -> Tensor:
        module = my_mha_class(d_model, num_heads, rope=rope)
        # the eight parameters by name; buffers (a cos/sin cache, persistent or not) keep their own
        # values, so load non-strictly after checking the parameter names
        names = [name for name, _ in module.named_parameters()]
        absent = [name for name in MHA_PARAMETERS if name not in names]
        extra = [name for name in names if name not in MHA_PARAMETERS]
        if absent or extra:
            raise ValueError(
                f"MyMHA's parameters should be exactly {', '.join(MHA_PARAMETERS)}; "
                f"missing: {absent or 'none'}, other parameters: {extra or 'none'}"
            )
        module.load_state_dict(state, strict=False)
        with torch.no_grad():
            return module(x)  # (batch, seq_len, d_model)

    def reference(d_model: int, num_heads: int, rope: bool, state: dict, x: Tensor) -> Tensor:
        if rope:
            return reference_mha_forward(state, x, num_heads, rope=True)
        return _torch_mha(state, x, num_heads)

    task = "write multi-head attention (and its rotation)"
    # the package's guard inside: companion's attention itself calls PyTorch's fused kernel
    guarded = refusing_calls(
        _without_package(build_and_run, task, (_attention, _positional)),
        task,
        (),
        why=": scores q @ k.transpose(-2, -1) / √d_k, softmax over the keys, times v",
        functions=_FUSED_ATTENTION,
    )
    return run_check(
        "MyMHA", guarded, reference, _my_mha_cases(), verbose=verbose, hint=_my_mha_hint
    )


def _my_mha_hint(case: Mapping[str, object], got: object) -> str:
    """The hint of the classic slip: RoPE applied to the whole ``d_model`` query and key, with
    frequencies over ``d_model``, before the split into heads."""
    state, x = case["state"], case["x"]
    if not case["rope"] or not isinstance(state, dict) or not isinstance(x, Tensor):
        return ""
    num_heads = int(case["num_heads"])
    batch, seq_len, d_model = x.shape
    head_dim = d_model // num_heads
    positions = torch.arange(seq_len)  # (seq_len,)

    def project(name: str) -> Tensor:  # rotated over d_model, then (batch, h, seq_len, d_k)
        y = x.double() @ state[f"{name}.weight"].double().T + state[f"{name}.bias"].double()
        if name != "value_proj":
            y = reference_rope_rotate(y, positions)  # (batch, seq_len, d_model)
        return y.view(batch, seq_len, num_heads, head_dim).transpose(1, 2)

    q, k, v = project("query_proj"), project("key_proj"), project("value_proj")
    heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1) @ v
    merged = heads.transpose(1, 2).reshape(batch, seq_len, d_model)  # (batch, seq_len, d_model)
    expected = merged @ state["out_proj.weight"].double().T + state["out_proj.bias"].double()
    if not _close_to(got, expected):
        return ""
    return (
        "\n   You rotate the whole d_model-wide query and key, with frequencies over d_model, "
        "before the split. RoPE turns each head's d_k features, ω_m = 10000^(-2m/d_k): split "
        "into heads first, then rotate q and k."
    )


def reference_encode(
    tokens: Tensor, embedding: nn.Embedding, attention: nn.Module, starts: Tensor
) -> Tensor:
    """``attention(embedding(tokens) · √d_model + codes)``, sequence ``b`` at positions
    ``starts[b] .. starts[b] + seq_len - 1``.

    Args:
        tokens: integer ids, shape ``(batch, seq_len)``.
        embedding: an ``nn.Embedding(vocab_size, d_model)``.
        attention: any module mapping ``(batch, seq_len, d_model)`` to the same shape.
        starts: integer tensor of shape ``(batch,)``: the position of each sequence's first
            token (texts continued after different numbers of earlier tokens).

    Returns:
        Shape ``(batch, seq_len, d_model)``.
    """
    batch, seq_len = tokens.shape
    d_model = embedding.embedding_dim
    if not isinstance(starts, Tensor) or starts.dtype.is_floating_point:
        raise TypeError(f"starts must be an integer tensor of shape ({batch},), got {starts!r}")
    if starts.shape != (batch,):
        raise ValueError(f"starts must have shape ({batch},), got {tuple(starts.shape)}")
    steps = torch.arange(seq_len, dtype=torch.float64)  # (seq_len,)
    positions = starts.double()[:, None] + steps  # (batch, seq_len)
    angles = positions[..., None] * _frequencies(d_model)  # (batch, seq_len, d_model/2)
    codes = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(-2)
    x = embedding(tokens) * math.sqrt(d_model) + codes.float()  # (batch, seq_len, d_model)
    return attention(x)  # (batch, seq_len, d_model)


class _StateAttention(nn.Module):
    """Self-attention computed by :func:`reference_mha_forward` from fixed weights (a test double)."""

    def __init__(self, state: dict[str, Tensor], num_heads: int) -> None:
        super().__init__()
        self.state, self.num_heads = state, num_heads

    def forward(self, x: Tensor) -> Tensor:
        return reference_mha_forward(self.state, x, self.num_heads, rope=False)


def _encode_cases() -> list[Case]:
    g = seeded_generator(404)
    cases: list[Case] = []
    # (vocab, d_model, heads, seq_len, starts): one start per sequence, none printed in the
    # chapter; a batch of 4 sequences of 4 tokens catches positions laid out on the wrong axis
    for vocab, d_model, heads, seq_len, starts in [
        (10, 16, 2, 6, [0, 5]),
        (7, 8, 1, 9, [13]),
        (20, 32, 4, 12, [1000, 0, 7]),
        (10, 16, 2, 5, [1, 2]),
        (10, 16, 2, 4, [3, 0, 2, 1]),
    ]:
        embedding = nn.Embedding(vocab, d_model)
        with torch.no_grad():
            embedding.weight.copy_(torch.randn(vocab, d_model, generator=g) / math.sqrt(d_model))
        cases.append(
            {
                "tokens": torch.randint(0, vocab, (len(starts), seq_len), generator=g),
                "embedding": embedding,
                "attention": _StateAttention(_mha_state(d_model, g), heads),
                "starts": torch.tensor(starts),
            }
        )
    return cases


#: float32's machine epsilon (2^-23). The textbook table (float32 ``position · exp(2m · -ln
#: 10000 / d)``, as in the Annotated Transformer) rounds the angle ``start · ω_m`` to a few
#: units of its last place, an error up to about ``start · ω_m · 2 ε32`` with ``ω_m ≤ 1``
#: (the rounded ``ω_m`` and the rounded product): 1.2e-4 at ``start = 1000``. The check allows
#: ``4 · start · ε32`` on top of its usual ``atol``, so that right answer passes (measured:
#: 9e-5 after attention at start 1000), while every wrong start moves a code by ``ω_0 = 1``
#: radian or more per position (errors of order 0.1 to 1).
_EPS32 = float(torch.finfo(torch.float32).eps)


def check_encode(encode: Callable[..., Tensor], verbose: bool = True) -> CheckResult:
    """Check ``encode(tokens, embedding, attention, starts)`` =
    ``attention(embedding(tokens) · √d_model + codes)``, sequence ``b`` coded at positions
    ``starts[b] ..``, on several batches of starts (0, 1 and far ones: a table from position
    0, from ``start + 1``, or one start for the whole batch, fails).

    At a far start the tolerance grows by ``4 · max(starts) · ε32`` (float32 angles, see
    :data:`_EPS32`), so that a float32 table passes as well as a float64 one.
    """
    name = "encode"
    _check_callable("the function to check", encode)
    user = _without_positional(encode, "write the table of codes")
    count, result = 0, None
    for count, case in enumerate(_encode_cases(), start=1):
        with torch.no_grad():
            expected = reference_encode(**case)
            got, result = call_reader(name, count, user, dict(case))
        if result is not None:
            if result.message.startswith("❌"):  # raised: say at which start
                result.message += f"\n   starts: {case['starts'].tolist()}"
            break
        far = int(case["starts"].max())
        problem = compare(expected, got, atol=1e-5 + 4 * far * _EPS32, rtol=1e-4)
        if problem:
            hint = ""
            if isinstance(got, Tensor) and got.shape == expected.shape:
                gap = (got.double() - expected.double()).abs().max().item()
                if gap < 1e-2:
                    hint = (
                        f"\n   the largest difference is only {gap:.1e}: if you compute the "
                        f"angles (position · ω) in float32, compute them in float64, then "
                        f"convert the codes to float32"
                    )
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: case {count} is wrong.\n   {problem}{hint}"
                f"\n   starts: {case['starts'].tolist()}, tokens of shape "
                f"{tuple(case['tokens'].shape)}",
            )
            break
    if result is None:
        result = CheckResult(
            name, True, count, f"✅ {name}: all {count} cases match the reference."
        )
    if verbose:
        report(result)
    return result


#: The starts the reference test tries: neighbours (1, 2, 3: a code of period 2 or 3 moves),
#: and far ones (100, 1000, 12345: a code that a step of 1 barely moves).
RELATIVE_STARTS = (1, 2, 3, 7, 100, 1000, 12345)


def reference_shift_invariant(layer: Callable[[Tensor, int], Tensor], x: Tensor) -> bool:
    """Whether ``layer(x, start)`` is the same for every ``start`` (to float32 rounding).

    Args:
        layer: ``layer(x, start)`` runs a layer on ``x (batch, seq_len, d)`` with its tokens at
            positions ``start, start + 1, ..., start + seq_len - 1``.
        x: shape ``(batch, seq_len, d)``.
    """
    with torch.no_grad():
        out = layer(x, 0)  # (batch, seq_len, d_out)
        for start in RELATIVE_STARTS:
            if not torch.allclose(layer(x, start), out, atol=1e-5, rtol=1e-4):
                return False
    return True


def relative_gap(layer: Callable[[Tensor, int], Tensor], x: Tensor) -> tuple[float, int]:
    """The largest ``|layer(x, start) - layer(x, 0)|`` over :data:`RELATIVE_STARTS`, and the
    start where it occurs."""
    with torch.no_grad():
        out = layer(x, 0)
        gaps = [((layer(x, start) - out).abs().max().item(), start) for start in RELATIVE_STARTS]
    return max(gaps)


class _PositionedLayer:
    """A layer ``(x, start) → output`` with a readable name for the check's messages."""

    def __init__(self, name: str, fn: Callable[[Tensor, int], Tensor]) -> None:
        self.name, self.fn = name, fn

    def __call__(self, x: Tensor, start: int) -> Tensor:
        if isinstance(start, Tensor) and start.numel() == 1 and not start.is_floating_point():
            start = start.item()  # a 0-d integer tensor, e.g. from torch.randint
        try:
            start = operator.index(start)  # int, numpy integer
        except TypeError:
            raise TypeError(
                f"start must be an int (the first position), got {type(start).__name__} {start!r}"
            ) from None
        if isinstance(start, bool):
            raise TypeError(f"start must be an int (the first position), got the bool {start}")
        # e.g. x.double(): the layers' weights are float32
        if isinstance(x, Tensor) and x.dtype != torch.float32:
            raise TypeError(
                f"layer(x, start) takes x as given (float32), got {x.dtype}: pass x itself, "
                "not x.double() or x.half()"
            )
        return self.fn(x, start)

    def __repr__(self) -> str:
        return self.name


def _codes_at(start: int, seq_len: int, d: int) -> Tensor:
    """Sinusoidal codes of positions ``start .. start + seq_len - 1``, float32 ``(seq_len, d)``."""
    positions = torch.arange(start, start + seq_len, dtype=torch.float64)[:, None]
    angles = positions * _frequencies(d)  # (seq_len, d/2)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1).float()


#: The size of the faint parity code of :func:`_relative_cases`: it moves the outputs by 8.7e-4
#: at every odd start (the norm of the move is 1.2e-4 of the outputs'), above the statement's
#: "about 1e-5" (even read as rtol 1e-4 or a relative norm of 1e-4), below a tolerance of 1e-3.
FAINT_PARITY = 5.3e-5

#: The size of the faint multiplicative code of :func:`_relative_cases`: odd starts scale every
#: output by (1 - 2e-4) / (1 + 2e-4), a relative change of 4e-4: below a purely relative
#: tolerance of 1e-3 (``rtol=1e-3, atol=0``), far above float32 rounding.
FAINT_SCALE = 2e-4


def _relative_cases() -> list[Case]:
    g = seeded_generator(406)
    d, heads = 16, 2
    state = _mha_state(d, g)
    direction = torch.randn(d, generator=g)
    direction = direction / direction.norm()  # (d,) a unit vector

    def attention(x: Tensor, **kwargs: object) -> Tensor:
        return reference_mha_forward(state, x, heads, **kwargs)  # type: ignore[arg-type]

    def distance_bias(n: int) -> Tensor:  # ALiBi-like: -0.5 |j - i|, offsets only
        positions = torch.arange(n, dtype=torch.float32)
        return -0.5 * (positions[None, :] - positions[:, None]).abs()  # (n, n)

    def q_only(x: Tensor, start: int) -> Tensor:  # RoPE on the queries alone: absolute
        batch, n, _ = x.shape
        head_dim = d // heads
        q = (x @ state["query_proj.weight"].T + state["query_proj.bias"]).view(batch, n, heads, -1)
        k = (x @ state["key_proj.weight"].T + state["key_proj.bias"]).view(batch, n, heads, -1)
        v = (x @ state["value_proj.weight"].T + state["value_proj.bias"]).view(batch, n, heads, -1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = reference_rope_rotate(q, torch.arange(start, start + n))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
        merged = (weights @ v).transpose(1, 2).reshape(batch, n, d)
        return merged @ state["out_proj.weight"].T + state["out_proj.bias"]

    layers = [
        ("attention with RoPE (relative)", lambda x, s: attention(x, rope=True, start=s), True),
        ("attention with no positions", lambda x, s: attention(x, rope=False), True),
        (
            "attention with a bias -0.5 |j - i| on the scores (relative)",
            lambda x, s: attention(x, rope=False, score_bias=distance_bias(x.shape[1])),
            True,
        ),
        ("tanh, token by token", lambda x, s: torch.tanh(x), True),
        (
            "attention on tokens plus sinusoidal codes (absolute)",
            lambda x, s: attention(x + _codes_at(s, x.shape[1], d), rope=False),
            False,
        ),
        ("attention with RoPE on the queries only (absolute)", q_only, False),
        (
            "attention on tokens plus ±1 by the parity of the position (period 2)",
            lambda x, s: attention(
                x + (1.0 - 2.0 * ((torch.arange(x.shape[1]) + s) % 2))[:, None] * direction,
                rope=False,
            ),
            False,
        ),
        (
            "attention on tokens plus sinusoidal codes 10000 times fainter (absolute)",
            lambda x, s: attention(x + _codes_at(s, x.shape[1], d) / 10000, rope=False),
            False,
        ),
        (
            "attention on tokens plus a code of wavelength 2π·10^8 (a step of 10 barely moves it)",
            # starts 1 to 10 move the outputs by at most about 3e-6, float32 rounding's size
            # (RoPE's own moves), so no tolerance near 1e-5 sees them; start 1000 moves them by
            # about 1.5e-4, start 10 000 by about 1.5e-3
            lambda x, s: attention(
                x
                + 2.0
                * torch.sin(1e-8 * torch.arange(s, s + x.shape[1], dtype=torch.float64))[
                    :, None
                ].float()
                * direction,
                rope=False,
            ),
            False,
        ),
        # absolute layers whose dependence on the start cancels in a summary of the outputs
        (
            "attention with no positions, its outputs then rolled by start % seq_len along the "
            "sequence (the sum and the mean over tokens do not move)",
            lambda x, s: torch.roll(attention(x, rope=False), s % x.shape[1], dims=1),
            False,
        ),
        (
            "attention with no positions, plus the sinusoidal code of its position on the LAST "
            "token's output only",
            lambda x, s: _on_token(attention(x, rope=False), -1, s, d),
            False,
        ),
        (
            "attention with no positions, plus the sinusoidal code of its position on the FIRST "
            "token's output only",
            lambda x, s: _on_token(attention(x, rope=False), 0, s, d),
            False,
        ),
        (
            "attention on tokens plus sinusoidal codes in batch element 1 only (element 0 has "
            "no positions)",
            lambda x, s: attention(
                x + torch.stack([torch.zeros(x.shape[1], d), _codes_at(s, x.shape[1], d)]),
                rope=False,
            ),
            False,
        ),
        # codes that come back after 3, 5 or 7 positions: one far start that they divide
        # (1001 = 7 · 11 · 13, 12345 = 3 · 5 · 823) does not move them
        *(
            (
                f"attention on tokens plus a code of period {period} (it returns at every "
                f"start that {period} divides)",
                lambda x, s, period=period: attention(
                    x + _periodic_code(s, x.shape[1], period)[:, None] * direction, rope=False
                ),
                False,
            )
            for period in (3, 5, 7)
        ),
        # a faint parity code: every odd start moves the outputs by 8.7e-4 (FAINT_PARITY):
        # far above float32 rounding (about 1e-6 here), missed by a tolerance of 1e-3
        (
            f"attention on tokens plus ±{FAINT_PARITY} by the parity of the position (a faint "
            "period-2 code)",
            lambda x, s: attention(
                x
                + FAINT_PARITY
                * (1.0 - 2.0 * ((torch.arange(x.shape[1]) + s) % 2))[:, None]
                * direction,
                rope=False,
            ),
            False,
        ),
        # a marker on position 0 only (a BOS-style absolute code): a test that never uses
        # start 0 sees no position 0 and so no change (last, so that the random inputs of
        # the cases above stay as they were)
        (
            "attention on tokens plus a marker on position 0 only (a test that never uses start 0 "
            "misses it)",
            lambda x, s: attention(
                x + (torch.arange(s, s + x.shape[1]) == 0).float()[:, None] * direction,
                rope=False,
            ),
            False,
        ),
        # a faint multiplicative code: every output scaled by 1 ± FAINT_SCALE by the parity of
        # its position, a relative change of 4e-4 at every odd start: a purely relative
        # tolerance (rtol=1e-3, atol=0) misses it, a tolerance near 1e-5 does not (last, so
        # that the random inputs of the cases above stay as they were)
        (
            f"attention with no positions, each output scaled by 1 ± {FAINT_SCALE} by the parity "
            "of its position (a faint multiplicative code)",
            lambda x, s: (
                attention(x, rope=False)
                * (1.0 + FAINT_SCALE * (1.0 - 2.0 * ((torch.arange(x.shape[1]) + s) % 2)))[:, None]
            ),
            False,
        ),
    ]
    return [
        {
            "layer": _PositionedLayer(name, fn),
            "x": torch.randn(2, 12, d, generator=g),
            "relative": rel,
        }
        for name, fn, rel in layers
    ]


def _periodic_code(start: int, seq_len: int, period: int) -> Tensor:
    """``cos(2π · position / period)`` at positions ``start .. start + seq_len - 1``, float32
    ``(seq_len,)``; computed from ``position % period``, so exactly equal at starts ``period``
    apart."""
    phase = torch.arange(start, start + seq_len) % period  # (seq_len,) integers
    return torch.cos(2 * math.pi * phase.double() / period).float()


def _on_token(out: Tensor, token: int, start: int, d: int) -> Tensor:
    """``out (batch, seq_len, d)`` with the sinusoidal code of its position added to one token."""
    seq_len = out.shape[1]
    position = start + (token % seq_len)  # the absolute position of that token
    out = out.clone()
    out[:, token] += _codes_at(position, 1, d)[0]
    return out


#: Words in a layer's name that mark a dependence hidden from summaries of the outputs.
_SUMMARY_BLIND = ("rolled", "LAST token", "FIRST token", "batch element 1")


def _relative_verdict_problem(got: object, case: Case) -> str | None:
    """Why the reader's verdict ``got`` on ``case`` is wrong, or ``None`` when it is right."""
    layer, x, expected = case["layer"], case["x"], case["relative"]
    got = as_verdict(got)  # a bool tensor or NumPy's bool (np.all's) is a right answer too
    if not isinstance(got, bool):
        return f"your test must return True or False, got {type(got).__name__} {got!r}"[:200]
    if got == expected:
        return None
    gap, start = relative_gap(layer, x)
    if expected:
        size = layer(x, 0).abs().max().item()
        return (
            f"your test rejected {layer!r}, a layer whose outputs do NOT depend on the start: "
            f"they differ between starts by at most {gap:.1e} (on outputs up to {size:.1e}), "
            "float32 rounding of the rotated queries and keys and of the attention arithmetic "
            "(already at start 1). Your "
            "comparison is too strict: exact equality, and torch.allclose with its default "
            "atol=1e-8, reject rounding; compare with a tolerance such as atol=1e-5"
        )
    if "wavelength" in repr(layer):
        # checked first: its largest move (at a far start) is small, yet no tolerance that
        # accepts RoPE's rounding sees it at near starts; the fix is a far start
        hint = (
            " Try a far start (thousands of positions, e.g. 10 000): starts up to 10 move this "
            "code's outputs by "
            "float32 rounding only, as they move RoPE's, so near starts miss it at any "
            "tolerance that accepts RoPE"
        )
    elif "position 0 only" in repr(layer):
        hint = (
            " Include start 0 among your starts: a code can mark one position only (a "
            "beginning-of-text marker on position 0), and starts that all skip it see nothing"
        )
    elif "multiplicative" in repr(layer):
        hint = (
            " Do not rely on a relative tolerance alone: this code changes every output by "
            "4e-4 of its size, under rtol=1e-3, yet far above float32 rounding (about 1e-6 "
            "here). An absolute tolerance of about 1e-5, or rtol about 1e-4, catches it"
        )
    elif gap < 1e-2 or "faint" in repr(layer):
        hint = (
            " Your test needs a stricter tolerance: a difference this size is not float32 "
            "rounding, which moves a relative layer's outputs here by about 1e-6 (a tolerance "
            "of about 1e-5 separates the two)"
        )
    elif any(word in repr(layer) for word in _SUMMARY_BLIND):
        hint = (
            " Compare every output, of every token and every batch element: a sum, a mean "
            "over the sequence, one token or one batch element can stay the same while "
            "the rest moves"
        )
    elif "a code of period" in repr(layer):
        hint = (
            " Try several starts: near ones (1, 2, 3) and far ones (10 000 and more). A code of "
            "period p returns at every start that p divides, so a test with one start misses "
            "every period that divides it"
        )
    else:
        hint = " Try several starts: near ones (1, 2, 3) and far ones (10 000 and more)"
    return (
        f"your test accepted {layer!r}, a layer whose outputs DO depend on the absolute "
        f"position: at start {start} they move by {gap:.1e}.{hint}"
    )


def check_shift_invariant(
    shift_invariant: Callable[[Callable[[Tensor, int], Tensor], Tensor], bool],
    verbose: bool = True,
) -> CheckResult:
    """Check the reader's test ``shift_invariant(layer, x) -> bool`` on layers whose answer is known.

    ``layer(x, start)`` runs a layer with the tokens of ``x`` at positions ``start ..
    start + seq_len - 1``; a relative layer gives the same outputs for every start. Relative:
    attention with RoPE (its outputs move by float32 rounding at far starts, so exact
    equality fails it), attention with a bias on ``|j - i|``, attention with no positions,
    ``tanh``. Absolute: attention on tokens plus sinusoidal codes, the same codes 10000 times
    fainter (outputs move by at most about ``2e-3``: a tolerance of ``1e-2`` misses it), a parity
    code of size ``5.3e-5`` (outputs move by ``8.7e-4``: a tolerance of ``1e-3`` misses it), RoPE on the
    queries only, a parity code (a test that tries only even starts misses it), codes of period
    3, 5 and 7 (a test with one far start such as 1001 or 12345 misses one of them) and a code
    of wavelength ``2π·10^8`` (starts up to 10 move it by float32 rounding only, so a test that
    tries only near starts misses it at any tolerance; start 10 000 moves it by ``1.5e-3``), a
    marker on position 0 only (a test that never uses start 0 misses it), outputs scaled by
    ``1 ± 2e-4`` by the parity of their position (a purely relative tolerance ``rtol=1e-3``
    misses it); and four
    whose dependence cancels in a summary: outputs rolled by ``start % seq_len`` (a test of
    the sum or of the mean over the sequence misses it), a code on the last token's output
    only (a test of the first token misses it), on the first token's only (a test of the last
    token misses it), and codes in batch element 1 only (a test of element 0 misses it). A
    wrong verdict is explained with the size of the difference.
    """
    name = "shift_invariant"
    cases = _relative_cases()
    return run_verdict_check(
        name,
        shift_invariant,
        cases,
        lambda case: {"layer": case["layer"], "x": case["x"].clone()},
        _relative_verdict_problem,
        what="layers",
        verbose=verbose,
    )
