"""Chapter 4 exercise checks: right answers pass, the classic buggy versions fail, stubs are
reported without raising."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from companion.attention import MultiHeadAttention, scaled_dot_product_attention
from companion.exercises import ch04
from companion.positional import (
    RotaryEmbedding,
    rope_layout_permutation,
    sinusoidal_shift_matrix,
    sinusoidal_table,
)

# --------------------------------------------------------------------------------------------
# sinusoidal_table: the reference that reference_encode uses
# --------------------------------------------------------------------------------------------


def test_reference_table_matches_companion():
    for max_len, d_model in [(50, 128), (7, 6), (1, 2)]:
        torch.testing.assert_close(
            ch04.reference_sinusoidal_table(max_len, d_model), sinusoidal_table(max_len, d_model)
        )


# --------------------------------------------------------------------------------------------
# concat_shift_matrix (the sin | cos layout)
# --------------------------------------------------------------------------------------------


def sin_cos_order(d_model):
    """The sin | cos order 0, 2, 4, ..., 1, 3, 5, ... built by hand."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def concat_shift_blocks(shift, d_model):
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    c, s = torch.diag(torch.cos(shift * omega)), torch.diag(torch.sin(shift * omega))
    return torch.cat([torch.cat([c, -s], 1), torch.cat([s, c], 1)], 0)


def concat_shift_interleaved(shift, d_model):
    """The interleaved M_Δ as it is (the identity order), built by hand from section 4.1's
    clock-hand step: the other layout's matrix."""
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    blocks = [
        torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
        for a in (shift * omega).tolist()
    ]
    return torch.block_diag(*blocks)


def concat_shift_transposed(shift, d_model):
    return concat_shift_blocks(shift, d_model).T  # M_{-Δ}


def concat_shift_signs_swapped(shift, d_model):
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    c, s = torch.diag(torch.cos(shift * omega)), torch.diag(torch.sin(shift * omega))
    return torch.cat([torch.cat([c, s], 1), torch.cat([-s, c], 1)], 0)


def concat_shift_interleaved_reordered(shift, d_model):
    """Correct: the interleaved blocks built by hand, rows and columns put in sin | cos order."""
    order = sin_cos_order(d_model)
    return concat_shift_interleaved(shift, d_model)[order][:, order]


def concat_shift_by_permutation(shift, d_model):
    """Right numbers, but the package's M_Δ reordered: one line, refused."""
    order = sin_cos_order(d_model)
    return sinusoidal_shift_matrix(shift, d_model)[order][:, order]


def concat_shift_by_layout_permutation(shift, d_model):
    """Right numbers, the package's M_Δ and permutation: M[p][:, p], refused."""
    order = rope_layout_permutation(d_model)
    return sinusoidal_shift_matrix(shift, d_model)[order][:, order]


def concat_shift_inverse_order(shift, d_model):
    """The inverse of the sin | cos order (argsort) on rows and columns: the wrong way."""
    order = torch.argsort(sin_cos_order(d_model))
    return concat_shift_interleaved(shift, d_model)[order][:, order]


def concat_shift_mixed_orders(shift, d_model):
    """Rows by the sin | cos order, columns by its inverse: P T P instead of Pᵀ T P."""
    order = sin_cos_order(d_model)
    return concat_shift_interleaved(shift, d_model)[order][:, torch.argsort(order)]


def concat_shift_columns_only(shift, d_model):
    """Reorders the columns as the table's are, but not the rows."""
    return concat_shift_interleaved(shift, d_model)[:, sin_cos_order(d_model)]


def concat_shift_rows_only(shift, d_model):
    return concat_shift_interleaved(shift, d_model)[sin_cos_order(d_model)]


@pytest.mark.parametrize("correct", [concat_shift_blocks, concat_shift_interleaved_reordered])
def test_concat_shift_matrix_accepts_every_route_from_the_formulas(correct):
    assert ch04.check_concat_shift_matrix(correct, verbose=False)


@pytest.mark.parametrize(
    "package_route", [concat_shift_by_permutation, concat_shift_by_layout_permutation]
)
def test_concat_shift_matrix_refuses_the_package(package_route):
    """M[p][:, p] from companion.positional gives the right numbers and is refused."""
    reference = ch04.reference_concat_shift_matrix
    for shift, d_model in [(1, 4), (-3, 6), (40, 32)]:
        torch.testing.assert_close(package_route(shift, d_model), reference(shift, d_model))
    result = ch04.check_concat_shift_matrix(package_route, verbose=False)
    assert not result and "called companion.positional" in result.message, result.message


@pytest.mark.parametrize(
    "wrong",
    [
        concat_shift_interleaved,
        concat_shift_transposed,
        concat_shift_signs_swapped,
        concat_shift_inverse_order,
        concat_shift_mixed_orders,
        concat_shift_columns_only,
        concat_shift_rows_only,
    ],
)
def test_concat_shift_matrix_rejects_wrong(wrong):
    result = ch04.check_concat_shift_matrix(wrong, verbose=False)
    assert not result and "is wrong" in result.message, result.message


def test_concat_shift_matrix_names_the_transpose_and_the_interleaved_matrix():
    """The two classic slips get a targeted hint: M_(-Δ), and section 4.2's M_Δ unreordered."""
    for wrong in (concat_shift_transposed, concat_shift_signs_swapped):
        result = ch04.check_concat_shift_matrix(wrong, verbose=False)
        assert not result and "M_(-Δ), the transpose" in result.message, result.message
    result = ch04.check_concat_shift_matrix(concat_shift_interleaved, verbose=False)
    assert not result and "for the interleaved table" in result.message, result.message
    for other in (concat_shift_inverse_order, concat_shift_columns_only):
        result = ch04.check_concat_shift_matrix(other, verbose=False)
        assert not result and "transpose" not in result.message, result.message
        assert "for the interleaved table" not in result.message, result.message


def concat_table_float64(max_len, d_model):
    """The concatenated table computed in float64 throughout (exact to float64 rounding)."""
    positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    angles = positions * 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (max_len, d_model)


def concat_shift_least_squares(rows, dtype=torch.float32):
    """M fitted by least squares to `rows` rows of the concatenated table, in `dtype`."""

    def fit(shift, d_model):
        rows_in = rows + abs(shift)
        if dtype == torch.float64:
            table = concat_table_float64(rows_in, d_model)  # (rows + |Δ|, d_model)
        else:
            table = ch04.reference_concat_table(rows_in, d_model)  # (rows + |Δ|, d_model)
        early, late = table[:rows], table[abs(shift) :]  # (rows, d_model) each: PE_i, PE_(i+|Δ|)
        source, target = (early, late) if shift >= 0 else (late, early)
        return torch.linalg.lstsq(source, target).solution  # source @ M ≈ target

    return fit


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [100, 1000])
def test_concat_shift_matrix_rejects_a_least_squares_fit(rows, dtype):
    """The hint's claim: fits fail the check, even to a float64 table (the slow pairs'
    columns are nearly dependent over a short table)."""
    fit = concat_shift_least_squares(rows, dtype)
    result = ch04.check_concat_shift_matrix(fit, verbose=False)
    assert not result and "is wrong" in result.message, result.message


def test_reference_concat_shift_matrix_shifts_the_concat_table():
    table = ch04.reference_concat_table(60, 16).double()
    for shift in [0, 1, 7, -4]:
        m = ch04.reference_concat_shift_matrix(shift, 16).double()
        start, stop = max(0, -shift), 60 - max(0, shift)
        shifted = table[start:stop] @ m  # row i → row i + shift
        torch.testing.assert_close(shifted, table[start + shift : stop + shift], atol=1e-6, rtol=0)


def test_concat_table_is_a_column_permutation_of_the_interleaved_one():
    order = torch.cat([torch.arange(0, 16, 2), torch.arange(1, 16, 2)])
    torch.testing.assert_close(
        ch04.reference_concat_table(30, 16), sinusoidal_table(30, 16)[:, order]
    )


# --------------------------------------------------------------------------------------------
# closest_codes
# --------------------------------------------------------------------------------------------


def closest_by_table(seq_len, d_model):
    """Correct: a float32 table, every pair of rows, the smallest distance off the diagonal."""
    table = sinusoidal_table(seq_len, d_model)
    offset = (torch.arange(seq_len)[None, :] - torch.arange(seq_len)[:, None]).abs()
    distance = (table[:, None, :] - table[None, :, :]).norm(dim=-1)  # (seq_len, seq_len)
    distance[offset == 0] = float("inf")
    flat = int(distance.argmin())
    return int(offset.flatten()[flat]), distance.flatten()[flat]


def closest_by_cdist(seq_len, d_model):
    """Correct: torch.cdist (its matrix-product shortcut costs precision: within 1e-3)."""
    table = sinusoidal_table(seq_len, d_model)
    distance = torch.cdist(table, table) + torch.eye(seq_len) * 1e9
    i, j = divmod(int(distance.argmin()), seq_len)
    return abs(i - j), distance[i, j].item()


def _closest_over(offsets, d_model, transform=math.sqrt):
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    squared = d_model - 2 * torch.cos(offsets.double()[:, None] * omega).sum(-1)
    best = int(squared.argmin())
    return int(offsets[best]), transform(max(squared[best].item(), 0.0))


def closest_closed_form(seq_len, d_model):
    """Correct: ‖PE_i - PE_j‖² = d - 2 S(Δ), the offsets 1 .. seq_len - 1."""
    return _closest_over(torch.arange(1, seq_len), d_model)


def closest_includes_zero(seq_len, d_model):
    return _closest_over(torch.arange(0, seq_len), d_model)  # a position and itself: 0


def closest_squared(seq_len, d_model):
    return _closest_over(torch.arange(1, seq_len), d_model, transform=float)  # ‖·‖², no root


def closest_one_short(seq_len, d_model):
    return _closest_over(torch.arange(1, seq_len - 1), d_model)  # misses offset seq_len - 1


def closest_one_too_far(seq_len, d_model):
    return _closest_over(torch.arange(1, seq_len + 1), d_model)  # offset seq_len: no such pair


def closest_similarity(seq_len, d_model):
    offsets = torch.arange(1, seq_len)
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    similarity = torch.cos(offsets.double()[:, None] * omega).sum(-1)
    best = int(similarity.argmax())
    return int(offsets[best]), similarity[best].item()  # the dot product, not the distance


def closest_all_dims(seq_len, d_model):
    """Bug B's frequencies: one per dimension, d terms."""
    offsets = torch.arange(1, seq_len)
    omega = 10000 ** (-torch.arange(d_model, dtype=torch.float64) / d_model)
    squared = 2 * d_model - 2 * torch.cos(offsets.double()[:, None] * omega).sum(-1)
    best = int(squared.argmin())
    return int(offsets[best]), math.sqrt(squared[best].item())


@pytest.mark.parametrize("correct", [closest_by_table, closest_by_cdist, closest_closed_form])
def test_closest_codes_accepts_correct(correct):
    assert ch04.check_closest_codes(correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        closest_includes_zero,
        closest_squared,
        closest_one_short,
        closest_one_too_far,
        closest_similarity,
        closest_all_dims,
    ],
)
def test_closest_codes_rejects_wrong(wrong):
    assert not ch04.check_closest_codes(wrong, verbose=False)


def closest_float_offset(seq_len, d_model):
    """Right numbers, but the offset as a float (63.0): the exercise asks for an int."""
    offset, distance = closest_closed_form(seq_len, d_model)
    return float(offset), distance


def test_closest_codes_rejects_a_float_offset():
    result = ch04.check_closest_codes(closest_float_offset, verbose=False)
    assert not result and "the offset should be an int" in result.message, result.message


def test_closest_codes_treats_tensors_like_the_numbers_they_hold():
    """An integer 0-d tensor is an int offset (accepted); a float one is a float (rejected)."""

    def integer_tensors(seq_len, d_model):
        offset, distance = closest_closed_form(seq_len, d_model)
        return torch.tensor(offset), torch.tensor(distance)

    def float_tensor_offset(seq_len, d_model):
        offset, distance = closest_closed_form(seq_len, d_model)
        return torch.tensor(float(offset)), distance

    assert ch04.check_closest_codes(integer_tensors, verbose=False)
    result = ch04.check_closest_codes(float_tensor_offset, verbose=False)
    assert not result and "the offset should be an int" in result.message, result.message


def test_reference_closest_codes_is_the_brute_force_minimum():
    for seq_len, d_model in [(45, 2), (60, 6), (200, 32)]:
        offset, distance = closest_by_table(seq_len, d_model)
        expected = ch04.reference_closest_codes(seq_len, d_model)
        assert offset == expected[0]
        assert abs(float(distance) - expected[1]) < 1e-4
    with pytest.raises(ValueError, match="seq_len must be an int of at least 2"):
        ch04.reference_closest_codes(1, 8)


def test_closest_codes_are_neighbours_from_d_model_12_on():
    """The solution's claim over 512 positions: offsets 63 at d = 8 and 6 at d = 10, then 1."""
    offsets = {d: ch04.reference_closest_codes(512, d)[0] for d in range(8, 514, 2)}
    assert offsets[8] == 63 and offsets[10] == 6, {d: offsets[d] for d in (8, 10)}
    not_neighbours = [d for d in range(12, 514, 2) if offsets[d] != 1]
    assert not not_neighbours, f"offset 1 expected from d_model = 12 on, not at {not_neighbours}"
    assert closest_by_table(512, 12)[0] == 1 and closest_by_table(512, 10)[0] == 6


def test_closest_codes_at_d_model_8_come_from_the_two_fast_hands_turning_round():
    """The solution's claim at d_model = 8: offset 63 at about 0.65; the third hand turns 0.63 rad
    and gives 0.38 of the squared distance 0.42, the slowest almost nothing; neighbours 0.96."""
    offset, distance = ch04.reference_closest_codes(512, 8)
    table = sinusoidal_table(64, 8).double()  # positions 0..63
    gap = table[63] - table[0]  # (8,)
    per_hand = [(gap[2 * m : 2 * m + 2] ** 2).sum().item() for m in range(4)]  # squared, by hand
    neighbours = (table[1] - table[0]).norm().item()
    assert offset == 63 and round(distance, 2) == 0.65, (offset, distance)
    assert round(63 * 10000 ** (-4 / 8), 2) == 0.63, "the third hand's turn in 63 steps"
    assert round(per_hand[2], 2) == 0.38 and round(sum(per_hand), 2) == 0.42, per_hand
    assert per_hand[3] < 0.01 and round(neighbours, 2) == 0.96 > distance, (per_hand, neighbours)


def test_closest_codes_at_d_model_12_are_far_apart_over_20000_positions():
    """The solution's follow-up: over 20,000 positions, d_model = 12's closest codes are 14,495 apart."""
    offset, distance = ch04.reference_closest_codes(20000, 12)
    neighbours = (sinusoidal_table(2, 12)[1] - sinusoidal_table(2, 12)[0]).norm().item()
    assert offset == 14495 and distance < neighbours, (offset, distance, neighbours)


def test_closest_codes_at_d_model_10_are_barely_closer_than_neighbours():
    """The solution's claim at d_model = 10: offset 6 at 0.970, neighbours at 0.972."""
    offset, distance = ch04.reference_closest_codes(512, 10)
    table = sinusoidal_table(2, 10)  # positions 0 and 1
    neighbours = (table[1] - table[0]).norm().item()
    assert offset == 6 and round(distance, 3) == 0.970, (offset, distance)
    assert round(neighbours, 3) == 0.972, neighbours


# --------------------------------------------------------------------------------------------
# rope_rotate
# --------------------------------------------------------------------------------------------


def rope_correct(x, positions):
    head_dim = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions[:, None].float() * omega  # (seq_len, head_dim/2)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * angles.cos() - b * angles.sin()
    out[..., 1::2] = a * angles.sin() + b * angles.cos()
    return out


def rope_with_companion(x, positions):
    return RotaryEmbedding(x.shape[-1]).rotate(x, positions)


def rope_complex(x, positions):
    """Correct: pairs as complex numbers, multiplied by e^{i p ω}."""
    head_dim = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    phases = torch.polar(
        torch.ones(len(positions), head_dim // 2, dtype=torch.float64),
        positions[:, None].double() * omega,
    )
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], head_dim // 2, 2).contiguous())
    return torch.view_as_real(z * phases).flatten(-2).to(x.dtype)


def rope_clockwise(x, positions):
    return rope_correct(x, -positions)  # rotates the other way


def rope_rotate_half(x, positions):
    """Pairs (i, i + d/2) instead of (2i, 2i + 1): the GPT-NeoX layout, another convention."""
    head_dim = x.shape[-1]
    half = head_dim // 2
    omega = 10000 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions[:, None].float() * omega
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angles.cos() - b * angles.sin(), a * angles.sin() + b * angles.cos()], -1)


def rope_ignores_positions(x, positions):
    return rope_correct(x, torch.arange(x.shape[-2]))


def rope_double_index(x, positions):
    head_dim = x.shape[-1]
    omega = 10000 ** (-2 * torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions[:, None].float() * omega
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack(
        [a * angles.cos() - b * angles.sin(), a * angles.sin() + b * angles.cos()], -1
    ).flatten(-2)


def rope_one_angle(x, positions):
    angles = positions[:, None].float().expand(-1, x.shape[-1] // 2)  # ω = 1 for every pair
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack(
        [a * angles.cos() - b * angles.sin(), a * angles.sin() + b * angles.cos()], -1
    ).flatten(-2)


def test_rope_rotate_accepts_correct():
    assert ch04.check_rope_rotate(rope_correct, verbose=False)


def rope_float64_angles(x, positions):
    """Correct, with the angles in float64 (the solution's way)."""
    head_dim = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[:, None].double() * omega  # (seq_len, head_dim/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def rope_in_place(x, positions):
    """Right numbers, but written into x: exercise (d) then sees a rotated x on its second call."""
    a, b = x[..., 0::2].clone(), x[..., 1::2].clone()
    head_dim = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[:, None].double() * omega  # (seq_len, head_dim/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x[..., 0::2] = a * cos - b * sin
    x[..., 1::2] = a * sin + b * cos
    return x


def test_rope_rotate_rejects_a_rotation_written_into_x():
    x, positions = torch.randn(2, 5, 8), torch.arange(5)
    torch.testing.assert_close(
        rope_in_place(x.clone(), positions), ch04.reference_rope_rotate(x, positions)
    )
    result = ch04.check_rope_rotate(rope_in_place, verbose=False)
    assert not result and "changed its input x in place" in result.message, result.message


def test_rope_rotate_notes_float32_angles_without_failing():
    """Float32 angles pass (the cases reach position 45) but get a note: exercise (d)'s far
    starts, near 10 000, need float64 angles. Float64 angles get no note."""
    float32_result = ch04.check_rope_rotate(rope_correct, verbose=False)
    assert float32_result and "Note: at positions near 10 000" in float32_result.message
    assert "float64" in float32_result.message
    float64_result = ch04.check_rope_rotate(rope_float64_angles, verbose=False)
    assert float64_result and "Note" not in float64_result.message


def test_rope_rotate_rejects_the_complex_form_the_chapter_shows():
    """Exercise 4(a) asks for real pairs; the complex form is shown in section 4.5."""
    result = ch04.check_rope_rotate(rope_complex, verbose=False)
    assert not result and "complex numbers" in result.message


def test_the_complex_form_is_a_correct_rotation():
    g = torch.Generator().manual_seed(1)
    x, positions = torch.randn(2, 5, 8, generator=g), torch.tensor([3, 0, 7, 7, 40])
    torch.testing.assert_close(rope_complex(x, positions), ch04.reference_rope_rotate(x, positions))


def rope_block_diag(x, positions):
    """Right numbers by section 4.5's visible route: R_i = block_diag(ρ(p ω_0), ...), x R_i."""
    head_dim = x.shape[-1]
    omega = [10000 ** (-2 * m / head_dim) for m in range(head_dim // 2)]

    def rho(phi):
        return torch.tensor([[math.cos(phi), math.sin(phi)], [-math.sin(phi), math.cos(phi)]])

    rows = [
        x[..., r, :] @ torch.block_diag(*(rho(p * w) for w in omega))
        for r, p in enumerate(positions.tolist())
    ]
    return torch.stack(rows, dim=-2)


def rope_matrix_by_hand(x, positions):
    """Right numbers: the same d_k × d_k matrices, filled entry by entry instead of block_diag."""
    head_dim = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.double()[:, None] * omega  # (seq_len, head_dim/2)
    r = torch.zeros(len(positions), head_dim, head_dim, dtype=torch.float64)
    r[:, 0::2, 0::2] = torch.diag_embed(angles.cos())
    r[:, 0::2, 1::2] = torch.diag_embed(angles.sin())
    r[:, 1::2, 0::2] = torch.diag_embed(-angles.sin())
    r[:, 1::2, 1::2] = torch.diag_embed(angles.cos())
    return (x.double().unsqueeze(-2) @ r).squeeze(-2).to(x.dtype)


@pytest.mark.parametrize("matrix_route", [rope_block_diag, rope_matrix_by_hand])
def test_rope_rotate_rejects_the_matrix_route_the_chapter_shows(matrix_route):
    """Exercise 4(a) asks for the pairwise form; section 4.5 builds R_i with block_diag."""
    g = torch.Generator().manual_seed(2)
    x, positions = torch.randn(3, 7, 8, generator=g), torch.tensor([3, 0, 7, 7, 40, 1, 2])
    torch.testing.assert_close(matrix_route(x, positions), ch04.reference_rope_rotate(x, positions))
    result = ch04.check_rope_rotate(matrix_route, verbose=False)
    assert not result and "d_k × d_k matrix" in result.message, result.message


def rope_cache_full_width(x, positions):
    """Right (the GPT-NeoX / Hugging Face way): cos/sin tables for positions 0..max(positions),
    full width (repeat_interleave), gathered by position, then x·cos + (-b, a)·sin."""
    d_k = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    angles = torch.arange(int(positions.max()) + 1, dtype=torch.float64)[:, None] * omega
    cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)[positions]  # (seq_len, d_k)
    sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)[positions]
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)  # (-b, a)
    return x * cos + rotated * sin


def rope_cache_square(x, positions):
    """Right: a cache of exactly d_k positions (a d_k × d_k table, unsqueezed as in Hugging
    Face's code), gathered by position; positions beyond it wrap into a second table."""
    d_k = x.shape[-1]
    omega = 10000 ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    rows = torch.arange(d_k, dtype=torch.float64)[:, None]  # a d_k-row cache: (d_k, d_k) tables
    cos_cache = (rows * omega).cos().repeat_interleave(2, -1)[None, None]  # (1, 1, d_k, d_k)
    sin_cache = (rows * omega).sin().repeat_interleave(2, -1)[None, None]
    angles = positions.double()[:, None] * omega  # any position: computed directly
    cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)
    sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)
    inside = positions < d_k
    cos[inside] = cos_cache[0, 0, positions[inside]].to(x.dtype)
    sin[inside] = sin_cache[0, 0, positions[inside]].to(x.dtype)
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * cos + rotated * sin


@pytest.mark.parametrize("cached", [rope_cache_full_width, rope_cache_square])
def test_rope_rotate_accepts_a_cos_sin_cache_of_any_shape(cached):
    """A (d_k, d_k) table of cosines and sines is not section 4.5's R_i: only a matrix product
    with a d_k × d_k operand, block_diag or complex numbers are refused."""
    result = ch04.check_rope_rotate(cached, verbose=False)
    assert result, result.message


def test_rope_cases_never_have_seq_len_equal_to_d_k():
    """Neither a right answer's (seq_len, d_k) tensors nor a cos/sin table for positions
    0..max(positions) is d_k × d_k in any case."""
    for case in ch04._rope_cases():
        seq_len, d_k = case["x"].shape[-2:]
        assert seq_len != d_k and int(case["positions"].max()) + 1 != d_k


def test_rope_rotate_names_a_turn_the_other_way():
    """Built from section 4.2's M_Δ block, the turn goes clockwise: the hint says R_i = M_(-i)."""
    result = ch04.check_rope_rotate(rope_clockwise, verbose=False)
    assert not result and "R_i = M_(-i)" in result.message, result.message
    for other in (rope_rotate_half, rope_double_index):
        result = ch04.check_rope_rotate(other, verbose=False)
        assert not result and "M_(-i)" not in result.message, result.message


def test_rope_rotate_rejects_companion_rotary_embedding():
    result = ch04.check_rope_rotate(rope_with_companion, verbose=False)
    assert not result and "called companion.positional" in result.message


@pytest.mark.parametrize(
    "wrong",
    [rope_clockwise, rope_rotate_half, rope_ignores_positions, rope_double_index, rope_one_angle],
)
def test_rope_rotate_rejects_wrong(wrong):
    assert not ch04.check_rope_rotate(wrong, verbose=False)


def test_reference_rope_matches_companion_and_the_shift_matrix():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 8, generator=g)
    positions = torch.tensor([0, 1, 2, 5, 8, 8, 13, 21, 34])
    torch.testing.assert_close(
        ch04.reference_rope_rotate(x, positions), RotaryEmbedding(8).rotate(x, positions)
    )
    # a row vector at position p is rotated by x @ R_p = x @ M_{-p}: the shift matrix, backwards
    for p in [0, 3, 30]:
        rotated = ch04.reference_rope_rotate(x[0, 0, :1], torch.tensor([p]))
        torch.testing.assert_close(rotated, x[0, 0, :1] @ sinusoidal_shift_matrix(-p, 8))


# --------------------------------------------------------------------------------------------
# every check: stubs, crashes, the references
# --------------------------------------------------------------------------------------------


def test_cases_are_reproducible():
    first, second = ch04._rope_cases(), ch04._rope_cases()
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(first, second))
    assert all(torch.equal(a["positions"], b["positions"]) for a, b in zip(first, second))


# --------------------------------------------------------------------------------------------
# capstone: MyMHA, encode, the test that a layer is relative
# --------------------------------------------------------------------------------------------


def _rotate(x, positions):
    """RoPE written out (check_my_mha switches companion.positional off)."""
    return ch04.reference_rope_rotate(x, positions)


class MHACorrect(nn.Module):
    def __init__(self, d_model, num_heads, rope=False):
        super().__init__()
        self.h, self.d_k, self.rope = num_heads, d_model // num_heads, rope
        self.query_proj = nn.Linear(d_model, d_model)
        self.key_proj = nn.Linear(d_model, d_model)
        self.value_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, t):  # (batch, n, d_model) → (batch, h, n, d_k)
        return t.unflatten(-1, (self.h, self.d_k)).transpose(1, 2)

    def rotate_qk(self, q, k):
        positions = torch.arange(q.shape[-2])
        return _rotate(q, positions), _rotate(k, positions)

    def attend(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1) @ v

    def forward(self, x):
        q, k, v = (
            self.split(self.query_proj(x)),
            self.split(self.key_proj(x)),
            self.split(self.value_proj(x)),
        )
        if self.rope:
            q, k = self.rotate_qk(q, k)
        return self.out_proj(self.attend(q, k, v).transpose(1, 2).flatten(-2))


class MHARotateAcrossHeads(MHACorrect):
    """Rotates the whole d_model vector before the split: pairs use d_model's frequencies."""

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        q, k = self.query_proj(x), self.key_proj(x)
        if self.rope:
            q, k = _rotate(q, positions), _rotate(k, positions)
        q, k, v = self.split(q), self.split(k), self.split(self.value_proj(x))
        return self.out_proj(self.attend(q, k, v).transpose(1, 2).flatten(-2))


class MHARotateAfterAttention(MHACorrect):
    """Rotates each head's output instead of the queries and keys."""

    def forward(self, x):
        q, k, v = (
            self.split(self.query_proj(x)),
            self.split(self.key_proj(x)),
            self.split(self.value_proj(x)),
        )
        heads = self.attend(q, k, v)
        if self.rope:
            heads = _rotate(heads, torch.arange(x.shape[1]))
        return self.out_proj(heads.transpose(1, 2).flatten(-2))


class MHARotateValuesToo(MHACorrect):
    def forward(self, x):
        q, k, v = (
            self.split(self.query_proj(x)),
            self.split(self.key_proj(x)),
            self.split(self.value_proj(x)),
        )
        if self.rope:
            positions = torch.arange(x.shape[1])
            q, k, v = _rotate(q, positions), _rotate(k, positions), _rotate(v, positions)
        return self.out_proj(self.attend(q, k, v).transpose(1, 2).flatten(-2))


class MHAIgnoresRope(MHACorrect):
    def __init__(self, d_model, num_heads, rope=False):
        super().__init__(d_model, num_heads, rope=False)  # positions ignored


class MHARotateOnlyQueries(MHACorrect):
    def rotate_qk(self, q, k):
        return _rotate(q, torch.arange(q.shape[-2])), k


class MHAScaledByDModel(MHACorrect):
    def attend(self, q, k, v):
        d_model = self.h * self.d_k
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_model), dim=-1) @ v


def test_my_mha_accepts_correct():
    assert ch04.check_my_mha(MHACorrect, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        MHARotateAcrossHeads,
        MHARotateAfterAttention,
        MHARotateValuesToo,
        MHAIgnoresRope,
        MHARotateOnlyQueries,
        MHAScaledByDModel,
    ],
)
def test_my_mha_rejects_wrong(wrong):
    assert not ch04.check_my_mha(wrong, verbose=False)


def test_my_mha_failure_message_names_the_state_briefly():
    result = ch04.check_my_mha(MHARotateValuesToo, verbose=False)
    assert not result
    assert "out_proj: weight (16, 16), bias (16,)" in result.message, result.message
    assert "tensor(" not in result.message and len(result.message) < 1500, result.message


class MHASubclassesCompanion(MultiHeadAttention):
    """The package's module, renamed: right numbers, but no attention written."""

    def __init__(self, d_model, num_heads, rope=False):
        super().__init__(d_model, num_heads, positional="rope" if rope else None)

    def forward(self, x):
        return super().forward(x, x, x)[0]


def test_my_mha_rejects_a_subclass_of_companion_attention():
    result = ch04.check_my_mha(MHASubclassesCompanion, verbose=False)
    assert not result and "called companion.attention" in result.message, result.message


def test_my_mha_rejects_companion_rotary_embedding():
    class CompanionRotation(MHACorrect):
        def rotate_qk(self, q, k):
            positions = torch.arange(q.shape[-2])
            rope = RotaryEmbedding(q.shape[-1])
            return rope.rotate(q, positions), rope.rotate(k, positions)

    result = ch04.check_my_mha(CompanionRotation, verbose=False)
    assert not result and "called companion.positional" in result.message, result.message


def test_my_mha_subclass_of_companion_attention_gives_the_right_numbers():
    """So the rejection above is by the guard, not by the values."""
    torch.manual_seed(1)
    x = torch.randn(2, 6, 16)
    for rope in (False, True):
        module = MHASubclassesCompanion(16, 2, rope=rope)
        state = dict(module.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(
                module(x), ch04.reference_mha_forward(state, x, 2, rope=rope).float()
            )


class MHAFusedSDPA(MHACorrect):
    """Right numbers from PyTorch's fused attention: no attention written."""

    def attend(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v)


class MHAWrapsTorchModule(MHACorrect):
    """Without RoPE, torch's multi_head_attention_forward on the four named layers."""

    def forward(self, x):
        if self.rope:
            return super().forward(x)
        w = torch.cat([self.query_proj.weight, self.key_proj.weight, self.value_proj.weight])
        b = torch.cat([self.query_proj.bias, self.key_proj.bias, self.value_proj.bias])
        t = x.transpose(0, 1)  # (seq_len, batch, d_model): the functional's layout
        out, _ = nn.functional.multi_head_attention_forward(
            t, t, t, x.shape[-1], self.h, w, b, None, None, False, 0.0,
            self.out_proj.weight, self.out_proj.bias, need_weights=False,
        )  # fmt: skip
        return out.transpose(0, 1)


@pytest.mark.parametrize(
    "fused, name",
    [
        (MHAFusedSDPA, "scaled_dot_product_attention"),
        (MHAWrapsTorchModule, "multi_head_attention_forward"),
    ],
)
def test_my_mha_rejects_pytorch_fused_attention(fused, name):
    result = ch04.check_my_mha(fused, verbose=False)
    assert not result and name in result.message, result.message
    assert ch04.check_my_mha(MHACorrect, verbose=False), "the written-out attention still passes"
    assert ch04.check_my_mha(ch04.reference_my_mha, verbose=False), "the reference passes"


@pytest.mark.parametrize("fused", [MHAFusedSDPA, MHAWrapsTorchModule])
def test_my_mha_fused_attention_gives_the_right_numbers(fused):
    """So the rejection above is by the guard, not by the values."""
    torch.manual_seed(2)
    x = torch.randn(2, 6, 16)
    for rope in (False, True):
        module = fused(16, 2, rope=rope)
        state = dict(module.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(
                module(x),
                ch04.reference_mha_forward(state, x, 2, rope=rope).float(),
                atol=1e-5,
                rtol=1e-4,
            )


def test_my_mha_reports_wrong_parameter_names():
    class Renamed(MHACorrect):
        def __init__(self, d_model, num_heads, rope=False):
            super().__init__(d_model, num_heads, rope)
            self.w_q = self.query_proj
            del self.query_proj

    result = ch04.check_my_mha(Renamed, verbose=False)
    assert not result and "raised" in result.message


class MHACachedTables(MHACorrect):
    """The common design: a cos/sin table built once in __init__ and stored as buffers."""

    def __init__(self, d_model, num_heads, rope=False, persistent=True, max_len=64):
        super().__init__(d_model, num_heads, rope)
        omega = 10000 ** (-torch.arange(0, self.d_k, 2, dtype=torch.float64) / self.d_k)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * omega  # (max_len, d_k/2)
        self.register_buffer("cos", angles.cos().float(), persistent=persistent)
        self.register_buffer("sin", angles.sin().float(), persistent=persistent)

    def rotate_qk(self, q, k):
        n = q.shape[-2]
        cos, sin = self.cos[:n], self.sin[:n]

        def turn(x):
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

        return turn(q), turn(k)


@pytest.mark.parametrize("persistent", [True, False])
def test_my_mha_accepts_a_cos_sin_cache_in_buffers(persistent):
    """A right answer with a cos/sin cache: persistent buffers are missing from the check's
    state dict, and must not make the load fail (review s11rv04)."""

    def build(d_model, num_heads, rope=False):
        return MHACachedTables(d_model, num_heads, rope, persistent=persistent)

    result = ch04.check_my_mha(build, verbose=False)
    assert result, result.message


def test_my_mha_rejects_an_extra_parameter_by_name():
    class ExtraScale(MHACorrect):
        def __init__(self, d_model, num_heads, rope=False):
            super().__init__(d_model, num_heads, rope)
            self.scale = nn.Parameter(torch.ones(1))

    result = ch04.check_my_mha(ExtraScale, verbose=False)
    assert not result and "scale" in result.message


def test_reference_my_mha_matches_companion_with_and_without_rope():
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=0.3)
    x = torch.randn(2, 7, 16)
    state = dict(module.state_dict())
    torch.testing.assert_close(
        ch04.reference_mha_forward(state, x, 2, rope=False),
        module(x, x, x)[0],
        atol=1e-5,
        rtol=1e-4,
    )
    # RoPE by hand on companion's own projections and RotaryEmbedding
    q, k, v = (
        module.split_heads(p(x)) for p in (module.query_proj, module.key_proj, module.value_proj)
    )
    rope = RotaryEmbedding(8)
    per_head, _ = scaled_dot_product_attention(rope.rotate(q), rope.rotate(k), v)
    expected = module.out_proj(module.merge_heads(per_head))
    torch.testing.assert_close(ch04.reference_mha_forward(state, x, 2, rope=True), expected)


def own_table(seq_len, d_model):
    """The sinusoidal table written out (the encode check switches companion.positional off)."""
    i = torch.arange(seq_len, dtype=torch.float64)[:, None]
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([torch.sin(i * omega), torch.cos(i * omega)], -1).flatten(1).float()


def codes_at(positions, d_model):
    """Sinusoidal codes of float64 positions (..., seq_len) → (..., seq_len, d_model), float32."""
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = positions.double()[..., None] * omega
    return torch.stack([torch.sin(angles), torch.cos(angles)], -1).flatten(-2).float()


def positions_of(tokens, starts):
    return starts[:, None] + torch.arange(tokens.shape[1])  # (batch, seq_len)


def encode_with_companion_table(tokens, embedding, attention, starts):
    x = embedding(tokens) * math.sqrt(embedding.embedding_dim)
    n, d = tokens.shape[1], embedding.embedding_dim
    table = sinusoidal_table(int(starts.max()) + n, d)
    return attention(x + table[positions_of(tokens, starts)])


def test_encode_rejects_companion_table():
    result = ch04.check_encode(encode_with_companion_table, verbose=False)
    assert not result and "called companion.positional" in result.message


def encode_correct(tokens, embedding, attention, starts):
    d = embedding.embedding_dim
    codes = codes_at(positions_of(tokens, starts), d)
    return attention(embedding(tokens) * math.sqrt(d) + codes)


def encode_correct_by_table_rows(tokens, embedding, attention, starts):
    """Correct too: one table up to the farthest position, rows gathered per sequence."""
    n, d = tokens.shape[1], embedding.embedding_dim
    table = own_table(int(starts.max()) + n, d)
    return attention(embedding(tokens) * math.sqrt(d) + table[positions_of(tokens, starts)])


def encode_correct_loop(tokens, embedding, attention, starts):
    """Correct too: one sequence at a time, each with its own slice of the table."""
    n, d = tokens.shape[1], embedding.embedding_dim
    codes = torch.stack([own_table(int(s) + n, d)[int(s) :] for s in starts])
    return attention(embedding(tokens) * math.sqrt(d) + codes)


def encode_no_scale(tokens, embedding, attention, starts):
    return attention(
        embedding(tokens) + codes_at(positions_of(tokens, starts), embedding.embedding_dim)
    )


def encode_no_positions(tokens, embedding, attention, starts):
    return attention(embedding(tokens) * math.sqrt(embedding.embedding_dim))


def encode_scales_the_sum(tokens, embedding, attention, starts):
    d = embedding.embedding_dim
    return attention((embedding(tokens) + codes_at(positions_of(tokens, starts), d)) * math.sqrt(d))


def encode_ignores_start(tokens, embedding, attention, starts):
    """The chapter's table of positions 0..n-1, whatever the starts."""
    n, d = tokens.shape[1], embedding.embedding_dim
    return attention(embedding(tokens) * math.sqrt(d) + own_table(n, d))


def encode_off_by_one(tokens, embedding, attention, starts):
    """Positions start+1 .. start+n."""
    d = embedding.embedding_dim
    codes = codes_at(positions_of(tokens, starts) + 1, d)
    return attention(embedding(tokens) * math.sqrt(d) + codes)


def encode_first_start_for_all(tokens, embedding, attention, starts):
    """One start, the first sequence's, for the whole batch."""
    n, d = tokens.shape[1], embedding.embedding_dim
    start = int(starts[0])
    return attention(embedding(tokens) * math.sqrt(d) + own_table(start + n, d)[start:])


def encode_positions_transposed(tokens, embedding, attention, starts):
    """Positions laid out (seq_len, batch) and read back as (batch, seq_len)."""
    n, d = tokens.shape[1], embedding.embedding_dim
    positions = (starts[None, :] + torch.arange(n)[:, None]).reshape(-1, n)  # wrong axis
    return attention(embedding(tokens) * math.sqrt(d) + codes_at(positions, d))


def encode_start_as_offset_angle(tokens, embedding, attention, starts):
    """Adds the start to the angle of pair 0 only (a shift of the first column)."""
    n, d = tokens.shape[1], embedding.embedding_dim
    codes = own_table(n, d).repeat(tokens.shape[0], 1, 1)
    codes[..., 0] = torch.sin(positions_of(tokens, starts).double()).float()
    return attention(embedding(tokens) * math.sqrt(d) + codes)


def encode_textbook_float32(tokens, embedding, attention, starts):
    """Correct too: the Annotated Transformer's float32 table (angles rounded in float32)."""
    n, d = tokens.shape[1], embedding.embedding_dim
    pe = torch.zeros(int(starts.max()) + n, d)
    position = torch.arange(0, pe.shape[0]).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return attention(embedding(tokens) * math.sqrt(d) + pe[positions_of(tokens, starts)])


def encode_concat_layout(tokens, embedding, attention, starts):
    """All sines, then all cosines: the other layout, not the chapter's table."""
    d = embedding.embedding_dim
    codes = codes_at(positions_of(tokens, starts), d)
    codes = torch.cat([codes[..., 0::2], codes[..., 1::2]], dim=-1)
    return attention(embedding(tokens) * math.sqrt(d) + codes)


def test_encode_textbook_float32_differs_only_at_the_far_start():
    """The float32 table is off by float32 rounding of start · ω (below 1e-5 near 0), more
    than the default atol at start 1000, where the check's start-dependent tolerance applies."""
    gaps = {}
    for case in ch04._encode_cases():
        with torch.no_grad():
            gap = (encode_textbook_float32(**case) - ch04.reference_encode(**case)).abs().max()
        gaps[int(case["starts"].max())] = gap.item()
    assert gaps[1000] > 1e-5 and max(g for s, g in gaps.items() if s < 100) < 1e-5, gaps


def test_encode_hints_at_float32_angles_for_a_small_gap():
    def rounded(tokens, embedding, attention, starts):
        return encode_correct(tokens, embedding, attention, starts) + 3e-3 * bool(
            starts.max() > 100
        )

    result = ch04.check_encode(rounded, verbose=False)
    assert not result and "float64" in result.message, result.message


def test_reference_encode_matches_a_table_per_sequence():
    for case in ch04._encode_cases():
        with torch.no_grad():
            torch.testing.assert_close(
                ch04.reference_encode(**case), encode_correct_loop(**case), atol=1e-6, rtol=0
            )


def test_reference_encode_rejects_bad_starts():
    case = ch04._encode_cases()[0]
    with pytest.raises(TypeError, match="starts must be an integer tensor"):
        ch04.reference_encode(**{**case, "starts": 3})
    with pytest.raises(ValueError, match="starts must have shape"):
        ch04.reference_encode(**{**case, "starts": torch.tensor([1, 2, 3])})


@pytest.mark.parametrize(
    "correct",
    [encode_correct, encode_correct_by_table_rows, encode_correct_loop, encode_textbook_float32],
)
def test_encode_accepts_correct(correct):
    assert ch04.check_encode(correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        encode_no_scale,
        encode_no_positions,
        encode_scales_the_sum,
        encode_ignores_start,
        encode_off_by_one,
        encode_first_start_for_all,
        encode_positions_transposed,
        encode_start_as_offset_angle,
        encode_concat_layout,
    ],
)
def test_encode_rejects_wrong(wrong):
    assert not ch04.check_encode(wrong, verbose=False)


STARTS = (1, 2, 3, 10_000)


def relative_correct(layer, x):
    out = layer(x, 0)
    return all(torch.allclose(layer(x, s), out, atol=1e-5, rtol=1e-4) for s in STARTS)


def relative_solution(layer, x):
    """The notebook's solution: start 1 moves every periodic code, start 10 000 the slow ones."""
    out = layer(x, 0)
    return all(torch.allclose(layer(x, s), out, atol=1e-5, rtol=1e-4) for s in (1, 10_000))


def relative_tolerance(atol, starts=STARTS):
    def test(layer, x):
        out = layer(x, 0)
        return all(torch.allclose(layer(x, s), out, atol=atol) for s in starts)

    test.__name__ = f"relative_atol_{atol:g}_starts_{'_'.join(map(str, starts))}"
    return test


def relative_near_only(atol, rtol, starts):
    """Wrong: a good tolerance, but near starts only; the slow code moves by rounding there."""

    def test(layer, x):
        out = layer(x, 0)
        return all(torch.allclose(layer(x, s), out, atol=atol, rtol=rtol) for s in starts)

    test.__name__ = f"relative_near_only_atol_{atol:g}_rtol_{rtol:g}_starts_1_to_{max(starts)}"
    return test


def relative_exact(layer, x):
    out = layer(x, 0)
    return all(torch.equal(layer(x, s), out) for s in STARTS)  # rounding makes RoPE fail


def relative_default_allclose(layer, x):
    out = layer(x, 0)
    return all(torch.allclose(layer(x, s), out) for s in STARTS)  # atol=1e-8: too strict


def relative_same_start(layer, x):
    return torch.allclose(layer(x, 0), layer(x, 0), atol=1e-5)  # compares a layer with itself


def relative_shapes_only(layer, x):
    return layer(x, 5).shape == layer(x, 0).shape  # cannot fail


def relative_tensor_verdict(layer, x):
    return torch.tensor(relative_correct(layer, x))  # a 0-d bool tensor is accepted too


def relative_numpy_verdict(layer, x):
    return np.bool_(relative_correct(layer, x))  # np.all(...)'s NumPy bool is accepted too


@pytest.mark.parametrize(
    "correct",
    [
        relative_correct,
        relative_solution,
        relative_tensor_verdict,
        relative_numpy_verdict,
        relative_tolerance(1e-5, (1, 2, 3, 500)),
        relative_tolerance(1e-4, (1, 3, 10000)),
        relative_tolerance(1e-5, (7, 1001, 5000)),
    ],
    ids=lambda fn: fn.__name__,
)
def test_relative_test_accepts_correct(correct):
    assert ch04.check_shift_invariant(correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        relative_same_start,
        relative_shapes_only,
        relative_tolerance(1e-2),  # misses the faint codes
        relative_tolerance(1e-3),  # misses the faint parity code (100 times "about 1e-5")
        relative_tolerance(1e-5, (2, 4, 100, 1000)),  # even starts only: misses the parity code
        relative_tolerance(1e-5, (1, 2, 3)),  # near starts only: misses the slow code
        relative_near_only(1e-5, 0.0, (1, 2, 3)),  # whatever the tolerance near 1e-5
        relative_near_only(1e-5, 1e-5, tuple(range(1, 11))),
        relative_near_only(1e-5, 1e-4, tuple(range(1, 11))),
        relative_tolerance(1e-5, (1,)),
        relative_tolerance(1e-5, (1001,)),  # one far odd start: misses periods 7, 11, 13
        relative_tolerance(1e-5, (12345,)),  # misses periods 3 and 5
        relative_tolerance(1e-5, (105, 210)),  # both divisible by 3, 5 and 7
    ],
    ids=lambda fn: fn.__name__,
)
def test_relative_test_rejects_loose_or_narrow_tests(wrong):
    assert not ch04.check_shift_invariant(wrong, verbose=False)


def _summary_test(summary, name):
    """A test with a good tolerance and good starts that compares only ``summary(output)``."""

    def test(layer, x):
        out = summary(layer(x, 0))
        return all(torch.allclose(summary(layer(x, s)), out, atol=1e-5, rtol=1e-4) for s in STARTS)

    test.__name__ = name
    return test


WEAK_SUMMARIES = {
    "relative_sum_only": lambda out: out.sum(),
    "relative_mean_over_sequence": lambda out: out.mean(dim=1),
    "relative_first_token_only": lambda out: out[:, 0],
    "relative_last_token_only": lambda out: out[:, -1],
    "relative_batch_element_0_only": lambda out: out[0],
}


@pytest.mark.parametrize("name", list(WEAK_SUMMARIES))
def test_relative_test_rejects_a_summary_of_the_outputs(name):
    """Comparing a sum, a mean, one token or one batch element misses an absolute layer."""
    result = ch04.check_shift_invariant(_summary_test(WEAK_SUMMARIES[name], name), verbose=False)
    assert not result
    assert "Compare every output" in result.message


def test_relative_summary_layers_hide_from_their_summary():
    """Each summary-blind layer moves, yet the summary it targets stays put."""
    cases = {repr(case["layer"]): case for case in ch04._relative_cases()}

    def find(word):
        return next(case for name, case in cases.items() if word in name)

    for word, summary in [
        ("rolled", WEAK_SUMMARIES["relative_mean_over_sequence"]),
        ("rolled", WEAK_SUMMARIES["relative_sum_only"]),
        ("LAST token", WEAK_SUMMARIES["relative_first_token_only"]),
        ("FIRST token", WEAK_SUMMARIES["relative_last_token_only"]),
        ("batch element 1", WEAK_SUMMARIES["relative_batch_element_0_only"]),
    ]:
        case = find(word)
        layer, x = case["layer"], case["x"]
        with torch.no_grad():
            assert not case["relative"] and (layer(x, 3) - layer(x, 0)).abs().max() > 0.1, word
            assert torch.allclose(summary(layer(x, 3)), summary(layer(x, 0)), atol=1e-5), word


@pytest.mark.parametrize("too_strict", [relative_exact, relative_default_allclose])
def test_relative_test_names_a_too_strict_comparison(too_strict):
    """A test that rejects RoPE attention (relative, up to float32 rounding) is told so."""
    result = ch04.check_shift_invariant(too_strict, verbose=False)
    assert not result
    assert "rejected attention with RoPE (relative)" in result.message
    assert "do NOT depend on the start" in result.message
    assert "float32 rounding" in result.message and "atol=1e-5" in result.message


def relative_norm(layer, x):
    """Right: the norm of the move below 1e-4 of the outputs' norm."""
    out = layer(x, 0)
    return all((layer(x, s) - out).norm() < 1e-4 * out.norm() for s in STARTS)


def relative_to_largest(layer, x):
    """Right: every entry within 1e-4 of the largest output."""
    out = layer(x, 0)
    return all((layer(x, s) - out).abs().max() < 1e-4 * out.abs().max() for s in STARTS)


@pytest.mark.parametrize("correct", [relative_norm, relative_to_largest])
def test_relative_test_accepts_relative_tolerances(correct):
    assert ch04.check_shift_invariant(correct, verbose=False)


def test_relative_test_rejects_a_tolerance_of_1e_3():
    """The statement asks for about 1e-5; a tolerance of 1e-3 misses the faint parity code."""
    result = ch04.check_shift_invariant(relative_tolerance(1e-3), verbose=False)
    assert not result and "faint period-2 code" in result.message, result.message
    assert "stricter tolerance" in result.message
    cases = {repr(case["layer"]): case for case in ch04._relative_cases()}
    faint = next(case for name, case in cases.items() if "faint period-2" in name)
    with torch.no_grad():
        out = faint["layer"](faint["x"], 0)
        move = (faint["layer"](faint["x"], 1) - out).abs().max().item()
        assert 2e-4 * out.abs().max() < move < 1e-3, move  # caught at "about 1e-5", missed at 1e-3
        assert torch.equal(faint["layer"](faint["x"], 2), out)  # even starts: exactly the same


def test_relative_test_explains_a_missed_dependence():
    result = ch04.check_shift_invariant(relative_tolerance(1e-2), verbose=False)
    assert (
        "accepted attention on tokens plus sinusoidal codes 10000 times fainter" in result.message
    )
    assert "stricter tolerance" in result.message
    result = ch04.check_shift_invariant(relative_tolerance(1e-5, (2, 4, 100, 1000)), verbose=False)
    assert "parity" in result.message and "Try several starts" in result.message


def test_relative_cases_are_what_they_say():
    """The relative layers move by float32 rounding only; the absolute ones by the amounts said."""
    cases = {repr(case["layer"]): case for case in ch04._relative_cases()}

    def gap(name, start):
        layer, x = cases[name]["layer"], cases[name]["x"]
        with torch.no_grad():
            return (layer(x, start) - layer(x, 0)).abs().max().item()

    rope = "attention with RoPE (relative)"
    assert 0 < gap(rope, 12345) < 1e-5  # rounding: not exactly equal
    for case in ch04._relative_cases():
        assert ch04.reference_shift_invariant(case["layer"], case["x"]) == case["relative"]
    faint = "attention on tokens plus sinusoidal codes 10000 times fainter (absolute)"
    assert 1e-4 < gap(faint, 1000) < 1e-2
    parity = "attention on tokens plus ±1 by the parity of the position (period 2)"
    assert gap(parity, 1) > 0.1 and gap(parity, 100) == 0
    slow = [name for name in cases if "wavelength" in name][0]
    # starts 1 to 10 move it by float32 rounding only (as RoPE moves), start 10 000 far more
    assert max(gap(slow, start) for start in range(1, 11)) < 8e-6
    assert gap(slow, 10_000) > 5e-4 > 2 * gap(rope, 12345)
    for period, divided in [(3, 12345), (5, 12345), (7, 1001)]:
        name = [name for name in cases if f"a code of period {period} " in name][0]
        assert gap(name, 1) > 0.1 and gap(name, 1000 + (-1000) % period + 1) > 0.1, period
        assert gap(name, period) == 0 and gap(name, divided) == 0, period  # it returns exactly


@pytest.mark.parametrize("rtol", [0.0, 1e-5, 1e-4])
def test_relative_test_near_starts_miss_the_slow_code(rtol):
    """Near starts only (1 to 10) are rejected for the slow code itself, whatever the rtol."""
    result = ch04.check_shift_invariant(
        relative_near_only(1e-5, rtol, tuple(range(1, 11))), verbose=False
    )
    assert not result and "wavelength 2π·10^8" in result.message, result.message
    # the advice is a far start, never a stricter tolerance (1e-5 is already right)
    assert "Try a far start" in result.message and "stricter" not in result.message
    assert ch04.check_shift_invariant(relative_solution, verbose=False)


def test_relative_test_explains_a_missed_period():
    """One far start is told that a code whose period divides it came back."""
    for start, period in [(1001, 7), (12345, 3)]:
        result = ch04.check_shift_invariant(relative_tolerance(1e-5, (start,)), verbose=False)
        assert not result
        assert f"a code of period {period}" in result.message, result.message
        assert "every period that divides it" in result.message


def relative_without_start_0(layer, x):
    """Good tolerance, near and far starts, but start 0 never used: blind to position 0."""
    out = layer(x, 1)
    return all(torch.allclose(layer(x, s), out, atol=1e-5, rtol=1e-4) for s in (2, 10_001))


def test_relative_test_rejects_a_test_that_never_uses_start_0():
    result = ch04.check_shift_invariant(relative_without_start_0, verbose=False)
    assert not result and "marker on position 0 only" in result.message, result.message
    assert "Include start 0" in result.message


def test_relative_layers_reject_a_non_integer_start():
    layer = ch04._relative_cases()[0]["layer"]
    with pytest.raises(TypeError, match="start must be an int"):
        layer(torch.zeros(1, 3, 16), 1.5)
    x = torch.randn(1, 3, 16)
    assert torch.equal(layer(x, torch.tensor(4)), layer(x, 4))  # a 0-d integer tensor is fine


# --------------------------------------------------------------------------------------------
# porting a rotate-half checkpoint to the interleaved layout
# --------------------------------------------------------------------------------------------


def _head_dim(state, num_heads):
    return state["o_proj.weight"].shape[0] // num_heads


def _interleaving_rows(head_dim, heads):
    """Rows of the interleaved layout, read from a rotate-half projection: 0, hd/2, 1, ..."""
    half = head_dim // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()
    return torch.cat([h * head_dim + within for h in range(heads)])


def _reorder(state, rows_q, rows_k, names=("q_proj", "k_proj"), kinds=("weight", "bias")):
    out = dict(state)
    for name, rows in zip(names, (rows_q, rows_k)):
        for kind in kinds:
            out[f"{name}.{kind}"] = state[f"{name}.{kind}"][rows]
    return out


def port_correct(state, num_heads, num_kv_heads):
    hd = _head_dim(state, num_heads)
    return _reorder(state, _interleaving_rows(hd, num_heads), _interleaving_rows(hd, num_kv_heads))


def port_with_argsort(state, num_heads, num_kv_heads):
    """Correct: the inverse of companion's interleaved → rotate-half order."""
    from companion.positional import rope_layout_permutation

    hd = _head_dim(state, num_heads)
    rows_q = torch.argsort(rope_layout_permutation(hd, num_heads=num_heads))
    rows_k = torch.argsort(rope_layout_permutation(hd, num_heads=num_kv_heads))
    return _reorder(state, rows_q, rows_k)


def port_values_and_output_consistently(state, num_heads, num_kv_heads):
    """Correct too: reordering the value features is harmless when W_O's columns follow."""
    out = port_correct(state, num_heads, num_kv_heads)
    hd = _head_dim(state, num_heads)
    group = num_heads // num_kv_heads
    v_rows = _interleaving_rows(hd, num_kv_heads)
    o_cols = _interleaving_rows(hd, num_heads)  # each query head reads its group's value head
    assert group >= 1
    out["v_proj.weight"], out["v_proj.bias"] = (
        state["v_proj.weight"][v_rows],
        state["v_proj.bias"][v_rows],
    )
    out["o_proj.weight"] = state["o_proj.weight"][:, o_cols]
    return out


def port_as_stored(state, num_heads, num_kv_heads):
    return dict(state)  # no conversion at all


def port_wrong_direction(state, num_heads, num_kv_heads):
    hd = _head_dim(state, num_heads)  # interleaved → rotate-half, not back
    return _reorder(
        state,
        torch.argsort(_interleaving_rows(hd, num_heads)),
        torch.argsort(_interleaving_rows(hd, num_kv_heads)),
    )


def port_whole_width(state, num_heads, num_kv_heads):
    hd = _head_dim(state, num_heads)  # one "head" as wide as the projection
    return _reorder(
        state, _interleaving_rows(num_heads * hd, 1), _interleaving_rows(num_kv_heads * hd, 1)
    )


def port_weights_only(state, num_heads, num_kv_heads):
    hd = _head_dim(state, num_heads)  # forgets the biases
    rows_q, rows_k = _interleaving_rows(hd, num_heads), _interleaving_rows(hd, num_kv_heads)
    return _reorder(state, rows_q, rows_k, kinds=("weight",))


def port_queries_only(state, num_heads, num_kv_heads):
    hd = _head_dim(state, num_heads)  # forgets W_K
    return _reorder(state, _interleaving_rows(hd, num_heads), None, names=("q_proj",))


def port_values_too(state, num_heads, num_kv_heads):
    out = port_correct(state, num_heads, num_kv_heads)
    rows = _interleaving_rows(_head_dim(state, num_heads), num_kv_heads)
    out["v_proj.weight"], out["v_proj.bias"] = (
        state["v_proj.weight"][rows],
        state["v_proj.bias"][rows],
    )
    return out  # values are never rotated, and W_O was not told


def port_columns(state, num_heads, num_kv_heads):
    out = dict(state)
    d_model = state["o_proj.weight"].shape[0]
    columns = _interleaving_rows(_head_dim(state, num_heads), num_heads)[:d_model]
    for name in ("q_proj", "k_proj"):
        out[f"{name}.weight"] = state[f"{name}.weight"][:, columns]  # input features, not output
    return out


def port_kv_with_num_heads(state, num_heads, num_kv_heads):
    hd = _head_dim(state, num_heads)  # W_K has num_kv_heads heads, not num_heads
    return _reorder(state, _interleaving_rows(hd, num_heads), _interleaving_rows(hd, num_heads))


def test_half_to_interleaved_rejects_rope_layout_permutation():
    result = ch04.check_half_to_interleaved(port_with_argsort, verbose=False)
    assert not result and "called companion.positional" in result.message


@pytest.mark.parametrize(
    "correct", [ch04.reference_half_to_interleaved, port_correct,
                port_values_and_output_consistently],
    ids=lambda fn: fn.__name__,
)  # fmt: skip
def test_half_to_interleaved_accepts_correct(correct):
    assert ch04.check_half_to_interleaved(correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        port_as_stored,
        port_wrong_direction,
        port_whole_width,
        port_weights_only,
        port_queries_only,
        port_values_too,
        port_columns,
        port_kv_with_num_heads,
    ],
    ids=lambda fn: fn.__name__,
)
def test_half_to_interleaved_rejects_wrong(wrong):
    assert not ch04.check_half_to_interleaved(wrong, verbose=False)


def test_half_to_interleaved_explains_a_wrong_return_value(capsys):
    assert not ch04.check_half_to_interleaved(lambda state, num_heads, num_kv_heads: None)
    assert "must return a dict of tensors, got NoneType" in capsys.readouterr().out

    def drops_biases(state, num_heads, num_kv_heads):
        return {name: t for name, t in state.items() if not name.endswith("bias")}

    assert not ch04.check_half_to_interleaved(drops_biases)
    assert "lacks ['q_proj.bias', 'k_proj.bias', 'v_proj.bias']" in capsys.readouterr().out


def test_port_references_match_companion():
    """Interleaved reference = companion's RoPE attention (GQA, biases); rotate-half reference
    = rope_rotate_half; the reference conversion = argsort(rope_layout_permutation)."""
    from companion.positional import rope_layout_permutation, rope_rotate_half

    case = ch04._port_cases()[1]  # d_model 32, 4 heads, 2 key/value heads
    state, x = case["state"], case["x"]
    heads, kv_heads = case["num_heads"], case["num_kv_heads"]
    mha = MultiHeadAttention(32, heads, num_kv_heads=kv_heads, positional="rope").eval()
    with torch.no_grad():
        for ours, theirs in [
            ("q_proj", "query_proj"),
            ("k_proj", "key_proj"),
            ("v_proj", "value_proj"),
        ]:
            getattr(mha, theirs).weight.copy_(state[f"{ours}.weight"])
            getattr(mha, theirs).bias.copy_(state[f"{ours}.bias"])
        mha.out_proj.weight.copy_(state["o_proj.weight"])
        mha.out_proj.bias.zero_()
        expected, _ = mha(x, x, x)
    got = ch04.reference_rope_attention(state, x, heads, kv_heads, "interleaved")
    assert torch.allclose(got.float(), expected, atol=1e-5), (got.float() - expected).abs().max()

    head_vectors = torch.randn(2, 3, 7, 8, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(
        ch04._rotate_half(head_vectors.double()).float(), rope_rotate_half(head_vectors), atol=1e-6
    ), "the rotate-half reference is companion's rope_rotate_half"

    converted = ch04.reference_half_to_interleaved(state, heads, kv_heads)
    rows_q = torch.argsort(rope_layout_permutation(8, num_heads=heads))
    rows_k = torch.argsort(rope_layout_permutation(8, num_heads=kv_heads))
    assert torch.equal(converted["q_proj.weight"], state["q_proj.weight"][rows_q])
    assert torch.equal(converted["k_proj.bias"], state["k_proj.bias"][rows_k])
    assert torch.equal(converted["v_proj.weight"], state["v_proj.weight"]), "values untouched"


def test_half_to_interleaved_hints_at_num_kv_heads_when_keys_use_num_heads(capsys):
    """Key rows built for num_heads heads index past W_K: the report names num_kv_heads."""
    assert not ch04.check_half_to_interleaved(port_kv_with_num_heads)
    out = capsys.readouterr().out
    assert "IndexError" in out and "num_kv_heads" in out and "not num_heads" in out, out


def relative_rtol_only(layer, x):
    """Wrong: a purely relative elementwise tolerance, rtol=1e-3 and atol=0."""
    out = layer(x, 0)
    return all(torch.allclose(layer(x, s), out, rtol=1e-3, atol=0) for s in STARTS)


def test_relative_test_rejects_a_purely_relative_tolerance():
    """A faint multiplicative code moves every output by 4e-4 of its size: rtol=1e-3 misses it."""
    result = ch04.check_shift_invariant(relative_rtol_only, verbose=False)
    assert not result and "faint multiplicative code" in result.message, result.message
    assert "relative tolerance alone" in result.message
    cases = {repr(case["layer"]): case for case in ch04._relative_cases()}
    scaled = next(case for name, case in cases.items() if "multiplicative" in name)
    with torch.no_grad():
        out = scaled["layer"](scaled["x"], 0)
        at_1 = scaled["layer"](scaled["x"], 1)
        ratio = ((at_1 - out).abs() / out.abs()).max().item()
        assert 3.9e-4 < ratio < 4.1e-4, ratio  # under rtol=1e-3 everywhere
        assert (at_1 - out).abs().max() > 1e-4  # caught by atol=1e-5 (and rtol=1e-4)
        assert torch.equal(scaled["layer"](scaled["x"], 2), out)  # even starts: the same


def test_half_to_interleaved_names_the_wrong_direction():
    """Section 4.6's order (interleaved → rotate-half) gets a targeted hint; other slips do not."""
    result = ch04.check_half_to_interleaved(port_wrong_direction, verbose=False)
    assert not result and "the other way" in result.message, result.message
    for wrong in (port_as_stored, port_whole_width, port_values_too):
        result = ch04.check_half_to_interleaved(wrong, verbose=False)
        assert not result and "the other way" not in result.message, result.message


def test_my_mha_names_rope_over_the_whole_width():
    """RoPE over d_model before the head split gets a targeted hint; other slips do not."""
    result = ch04.check_my_mha(MHARotateAcrossHeads, verbose=False)
    assert not result and "split into heads first" in result.message, result.message
    for wrong in (MHARotateValuesToo, MHAScaledByDModel, MHARotateOnlyQueries):
        result = ch04.check_my_mha(wrong, verbose=False)
        assert not result and "split into heads first" not in result.message, result.message


def test_relative_test_passing_float64_is_told_to_pass_x_as_given():
    """A test that feeds the layer x.double() gets the check's message, not a raw matmul error."""

    def double_input(layer, x):
        out = layer(x.double(), 0)
        return all(torch.allclose(layer(x.double(), s), out, atol=1e-5) for s in STARTS)

    result = ch04.check_shift_invariant(double_input, verbose=False)
    assert not result
    assert "pass x itself" in result.message
