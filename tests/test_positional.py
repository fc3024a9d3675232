"""Positions: the sinusoidal table of the paper, growth past max_len, learned embeddings, RoPE."""

import math

import pytest
import torch

from companion.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_frequencies,
    sinusoidal_shift_matrix,
    sinusoidal_table,
)


def test_sinusoidal_table_matches_the_paper_formula():
    max_len, d_model = 50, 16
    table = sinusoidal_table(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == torch.float32
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_wavelengths():
    """Pair i turns by ω_i = 1/10000^(2i/d) per position: wavelength 2π·10000^(2i/d)."""
    d_model = 8
    table = sinusoidal_table(2, d_model, dtype=torch.float64)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * 4, dtype=torch.float64))
    angle_per_position = torch.atan2(table[1, 0::2], table[1, 1::2])  # (d_model/2,)
    wavelengths = 2 * math.pi / angle_per_position
    expected = [2 * math.pi * 10000 ** (2 * i / d_model) for i in range(d_model // 2)]
    assert wavelengths.tolist() == pytest.approx(expected, rel=1e-9)


def test_sinusoidal_frequencies():
    """ω_i = base^(-2i/dim) in float64, from 1 down to almost 1/base."""
    frequencies = sinusoidal_frequencies(8)
    assert frequencies.shape == (4,) and frequencies.dtype == torch.float64
    expected = [10000 ** (-2 * i / 8) for i in range(4)]
    assert frequencies.tolist() == pytest.approx(expected, rel=1e-12)
    assert sinusoidal_frequencies(4, base=100.0).tolist() == pytest.approx([1.0, 0.1], rel=1e-12)
    table = sinusoidal_table(3, 8, dtype=torch.float64)  # (3, 8)
    assert torch.allclose(table[2, 0::2], torch.sin(2 * frequencies))


def test_shift_matrix_is_block_diagonal_rotation():
    m = sinusoidal_shift_matrix(5, 8, dtype=torch.float64)
    table = sinusoidal_table(12, 8, dtype=torch.float64)  # (12, 8)
    assert torch.allclose(table[:7] @ m, table[5:], atol=1e-12)  # PE[i + 5] = PE[i] @ M_5
    assert torch.allclose(sinusoidal_shift_matrix(-5, 8, dtype=torch.float64), m.T, atol=1e-12)
    assert torch.allclose(m @ m.T, torch.eye(8, dtype=torch.float64), atol=1e-12)
    off_block = m.clone()
    for i in range(4):
        off_block[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0
    assert off_block.abs().max() == 0


def test_encoding_adds_to_x_with_offset():
    encoding = SinusoidalPositionalEncoding(8, max_len=20).eval()
    x = torch.randn(2, 5, 8)
    assert torch.allclose(encoding(x), x + sinusoidal_table(5, 8))
    assert torch.allclose(encoding(x, offset=3), x + sinusoidal_table(8, 8)[3:])


def test_sinusoidal_encoding_grows_past_max_len():
    """Documented choice: the sinusoidal table grows on demand (the formula holds everywhere)."""
    encoding = SinusoidalPositionalEncoding(8, max_len=4).eval()
    x = torch.zeros(1, 10, 8)
    out = encoding(x)
    assert encoding.max_len >= 10
    assert torch.allclose(out[0], sinusoidal_table(10, 8), atol=1e-6)
    assert "table" not in encoding.state_dict()  # not saved: it is recomputed


def test_learned_embedding_raises_past_max_len():
    """Documented choice: a learned table has no rows to grow from, so it raises."""
    embedding = LearnedPositionalEmbedding(4, 8)
    assert embedding(torch.zeros(2, 4, 8)).shape == (2, 4, 8)
    with pytest.raises(ValueError, match=r"seq_len=5 .* max_len=4"):
        embedding(torch.zeros(2, 5, 8))
    with pytest.raises(ValueError, match=r"offset=2.*max_len=4"):
        embedding(torch.zeros(2, 3, 8), offset=2)


def test_learned_embedding_adds_one_vector_per_position():
    embedding = LearnedPositionalEmbedding(6, 4).eval()
    x = torch.zeros(3, 6, 4)
    out = embedding(x)
    assert torch.equal(out[0], embedding.embedding.weight)
    assert torch.equal(out[0], out[2])


def test_rotary_preserves_norms_and_rotates_pairs():
    rope = RotaryEmbedding(4)
    q = torch.tensor([[1.0, 0.0, 1.0, 0.0]] * 3)  # (seq_len=3, head_dim=4)
    rotated = rope.rotate(q)
    assert torch.allclose(rotated.norm(dim=-1), q.norm(dim=-1))
    assert torch.allclose(rotated[0], q[0])  # position 0: no rotation
    # position 1, pair 0 rotates by 1 radian: (1, 0) -> (cos 1, sin 1)
    assert torch.allclose(rotated[1, :2], torch.tensor([math.cos(1.0), math.sin(1.0)]))


def test_rotary_apply_positions_offset_and_growth():
    rope = RotaryEmbedding(8, max_len=4)
    q, k = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)  # (batch, heads, seq, head_dim)
    q_rot, k_rot = rope.apply(q, k, offset=10)  # positions 10..15, past max_len: grows
    assert rope.max_len >= 16
    explicit = rope.rotate(q, positions=torch.arange(10, 16))
    assert torch.allclose(q_rot, explicit)
    per_batch = torch.arange(10, 16).expand(2, 6)
    assert torch.allclose(rope.rotate(k, positions=per_batch), k_rot)
    assert rope(q, k)[0].shape == q.shape  # forward = apply


def test_rotary_module_apply_with_function_is_still_module_apply():
    rope = RotaryEmbedding(4)
    seen = []
    rope.apply(lambda module: seen.append(type(module).__name__))
    assert seen == ["RotaryEmbedding"]


def float64_formula(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(...)`` in float64."""
    frequencies = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = positions.double()[:, None] * frequencies  # (len, d_model/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (len, d_model)


@pytest.mark.parametrize("make_float64", ["double()", "to(float64)", "default dtype"])
def test_float64_sinusoidal_encoding_is_exact_at_every_length(make_float64):
    """Issue 11, item 4: a float64 module has float64 encodings, for the initial rows and for
    rows added when the table grows (the precision does not depend on the length)."""
    from companion.positional import SinusoidalPositionalEncoding

    if make_float64 == "default dtype":
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            module = SinusoidalPositionalEncoding(16, max_len=50)
        finally:
            torch.set_default_dtype(previous)
    elif make_float64 == "double()":
        module = SinusoidalPositionalEncoding(16, max_len=50).double()
    else:
        module = SinusoidalPositionalEncoding(16, max_len=50).to(torch.float64)
    assert module.table.dtype == torch.float64
    for length in (50, 3000):  # within the initial table, then grown
        x = torch.zeros(1, length, 16, dtype=torch.float64)
        got = module(x)[0]  # (length, 16)
        expected = float64_formula(torch.arange(length), 16)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
    back = module.float()  # and back to float32: the float32 rounding of the exact values
    assert torch.equal(back.table, float64_formula(torch.arange(back.max_len), 16).float())


def test_float64_rotary_tables_are_exact():
    from companion.positional import RotaryEmbedding

    rope = RotaryEmbedding(8, max_len=16).double()
    angles = torch.arange(40, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, 8, 2, dtype=torch.float64) / 8
    )  # (40, 4)
    x = torch.zeros(40, 8, dtype=torch.float64)
    x[:, 0::2] = 1.0  # rotating (1, 0) gives (cos, sin)
    rotated = rope.rotate(x)  # grows the tables to 40 rows
    torch.testing.assert_close(rotated[:, 0::2], angles.cos(), rtol=0, atol=1e-15)
    torch.testing.assert_close(rotated[:, 1::2], angles.sin(), rtol=0, atol=1e-15)
