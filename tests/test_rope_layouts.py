"""RoPE's two layouts: interleaved (RoFormer, Meta's LLaMA code, ``RotaryEmbedding``) and
rotate-half (GPT-NeoX, Hugging Face: ``rope_rotate_half``), and the feature permutation that
converts a checkpoint between them (``rope_layout_permutation``).

The references are written out here with complex numbers: pair ``m`` of a head vector is the
complex number ``a + i b`` and RoPE multiplies it by ``exp(i · p · θ_m)``. Float64 throughout,
so the comparisons hold to 1e-12.
"""

from __future__ import annotations

import math

import pytest
import torch

from companion.attention import MultiHeadAttention
from companion.positional import RotaryEmbedding, rope_layout_permutation, rope_rotate_half

F64 = torch.float64


def thetas(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """θ_m = base^(-2m/head_dim), m = 0 .. head_dim/2 - 1: (head_dim/2,) float64."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=F64) / head_dim)


def complex_rope(
    x: torch.Tensor, layout: str, offset: int = 0, base: float = 10000.0
) -> torch.Tensor:
    """Reference RoPE of ``x (..., seq_len, head_dim)``: pair m as a complex number, times
    exp(i p θ_m), back to the same layout. ``layout`` is "interleaved" or "rotate_half"."""
    seq_len, head_dim = x.shape[-2], x.shape[-1]
    half = head_dim // 2
    if layout == "interleaved":  # pair m = (x[2m], x[2m+1])
        real, imag = x[..., 0::2], x[..., 1::2]
    else:  # pair m = (x[m], x[m + head_dim/2])
        real, imag = x[..., :half], x[..., half:]
    z = torch.complex(real, imag)  # (..., seq_len, head_dim/2)
    positions = torch.arange(offset, offset + seq_len, dtype=F64)[:, None]  # (seq_len, 1)
    angles = positions * thetas(head_dim, base)  # (seq_len, head_dim/2): p θ_m
    turned = z * torch.polar(torch.ones_like(angles), angles)  # z · exp(i p θ_m)
    if layout == "interleaved":
        return torch.stack([turned.real, turned.imag], dim=-1).flatten(-2)
    return torch.cat([turned.real, turned.imag], dim=-1)


def explicit_permutation(head_dim: int, num_heads: int) -> list[int]:
    """Written as Hugging Face's LLaMA conversion does it: rows (h, m, s) -> (h, s, m)."""
    half = head_dim // 2
    return [h * head_dim + 2 * m + s for h in range(num_heads) for s in (0, 1) for m in range(half)]


# --- the permutation itself ---------------------------------------------------------------


@pytest.mark.parametrize("head_dim, num_heads", [(2, 1), (8, 1), (8, 3), (64, 4)])
def test_permutation_values(head_dim, num_heads):
    perm = rope_layout_permutation(head_dim, num_heads=num_heads)
    assert perm.dtype == torch.int64 and perm.shape == (head_dim * num_heads,)
    assert perm.tolist() == explicit_permutation(head_dim, num_heads)
    assert sorted(perm.tolist()) == list(range(head_dim * num_heads)), "a permutation"


def test_permutation_of_one_head_is_the_concatenated_sinusoidal_order():
    """Chapter 4, section 4.9: the sin | cos table is the interleaved one reordered alike."""
    assert rope_layout_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


# --- both rotations against the complex-number reference -----------------------------------


@pytest.mark.parametrize("offset", [0, 5, 1000])
def test_rotate_half_matches_the_complex_reference(offset):
    x = torch.randn(2, 3, 7, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    expected = complex_rope(x, "rotate_half", offset)
    assert torch.allclose(rope_rotate_half(x, offset=offset), expected, atol=1e-12)


def test_rotate_half_base_and_dtype():
    x = torch.randn(5, 8, dtype=F64, generator=torch.Generator().manual_seed(1))
    expected = complex_rope(x, "rotate_half", base=500.0)
    assert torch.allclose(rope_rotate_half(x, base=500.0), expected, atol=1e-12)
    single = rope_rotate_half(x.float())
    assert single.dtype == torch.float32 and single.shape == x.shape
    assert torch.allclose(single.double(), complex_rope(x, "rotate_half"), atol=1e-6)


def test_position_zero_is_not_rotated():
    x = torch.randn(1, 12, dtype=F64)
    assert torch.equal(rope_rotate_half(x), x)


def test_rotary_embedding_is_the_interleaved_layout():
    x = torch.randn(2, 3, 7, 16, dtype=F64, generator=torch.Generator().manual_seed(2))
    rotary = RotaryEmbedding(16).double()
    assert torch.allclose(rotary.rotate(x, offset=3), complex_rope(x, "interleaved", 3), atol=1e-12)


@pytest.mark.parametrize("head_dim", [2, 8, 64])
def test_permuting_commutes_with_the_rotation(head_dim):
    x = torch.randn(3, 11, head_dim, dtype=F64, generator=torch.Generator().manual_seed(3))
    perm = rope_layout_permutation(head_dim)
    interleaved = complex_rope(x, "interleaved")  # (3, 11, head_dim), independent of companion
    assert torch.allclose(rope_rotate_half(x[..., perm]), interleaved[..., perm], atol=1e-12)
    inverse = torch.argsort(perm)  # rotate-half -> interleaved
    half_layout = x[..., perm]
    back = RotaryEmbedding(head_dim).double().rotate(half_layout[..., inverse])
    assert torch.allclose(back, complex_rope(half_layout, "rotate_half")[..., inverse], atol=1e-12)


# --- converting a checkpoint ------------------------------------------------------------------


def meta_attention(num_kv_heads: int | None = None) -> MultiHeadAttention:
    """Interleaved RoPE attention (the "Meta" checkpoint), d_model 32, 4 heads, float64."""
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, positional="rope")
    with torch.no_grad():
        for proj in (module.query_proj, module.key_proj):
            proj.bias.normal_()  # non-zero biases: they must be permuted too
    return module.double().eval()


def rotate_half_scores(
    weights: dict[str, torch.Tensor], x: torch.Tensor, heads: int, kv_heads: int
) -> torch.Tensor:
    """Scores of a rotate-half implementation: x (batch, n, 32) -> (batch, heads, n, n)."""
    batch, n, _ = x.shape
    head_dim = 32 // heads
    q = (x @ weights["wq"].T + weights["bq"]).view(batch, n, heads, head_dim).transpose(1, 2)
    k = (x @ weights["wk"].T + weights["bk"]).view(batch, n, kv_heads, head_dim).transpose(1, 2)
    q, k = rope_rotate_half(q), rope_rotate_half(k)
    k = k.repeat_interleave(heads // kv_heads, dim=1)  # (batch, heads, n, head_dim)
    return q @ k.transpose(-2, -1) / math.sqrt(head_dim)


def reference_scores(module: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Scores of the interleaved checkpoint, computed with the complex reference (no module
    rotation involved): (batch, heads, n, n)."""
    batch, n, _ = x.shape
    hd, heads, kv_heads = module.head_dim, module.num_heads, module.num_kv_heads
    q = module.query_proj(x).view(batch, n, heads, hd).transpose(1, 2)
    k = module.key_proj(x).view(batch, n, kv_heads, hd).transpose(1, 2)
    q, k = complex_rope(q, "interleaved"), complex_rope(k, "interleaved")
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    return q @ k.transpose(-2, -1) / math.sqrt(hd)


def checkpoint(module: MultiHeadAttention, permute: bool) -> dict[str, torch.Tensor]:
    q_perm = rope_layout_permutation(module.head_dim, num_heads=module.num_heads)
    k_perm = rope_layout_permutation(module.head_dim, num_heads=module.num_kv_heads)
    if not permute:  # the porting bug: loaded as they are
        q_perm, k_perm = slice(None), slice(None)
    q, k = module.query_proj, module.key_proj
    return {
        "wq": q.weight.detach()[q_perm],
        "bq": q.bias.detach()[q_perm],
        "wk": k.weight.detach()[k_perm],
        "bk": k.bias.detach()[k_perm],
    }


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_permuted_checkpoint_gives_the_same_scores(num_kv_heads):
    module = meta_attention(num_kv_heads)
    x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(4))
    expected = reference_scores(module, x)  # (2, 4, 9, 9)
    with torch.no_grad():
        q, k, _ = module.project(x, x, x)  # companion's own rotation agrees with the reference
        k = k.repeat_interleave(module.num_heads // module.num_kv_heads, dim=1)
        own = q @ k.transpose(-2, -1) / math.sqrt(module.head_dim)
        converted = rotate_half_scores(
            checkpoint(module, permute=True), x, module.num_heads, module.num_kv_heads
        )
    assert torch.allclose(own, expected, atol=1e-12)
    assert torch.allclose(converted, expected, atol=1e-12)


def test_unpermuted_checkpoint_gives_wrong_scores_that_agree_at_offset_zero():
    """The porting bug: nothing fails to load, the scores are wrong, yet equal where the query
    and the key share a position (R_0 is the identity), which a one-token test would check."""
    module = meta_attention()
    x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(5))
    expected = reference_scores(module, x)
    with torch.no_grad():
        wrong = rotate_half_scores(checkpoint(module, permute=False), x, 4, 4)
    gap = (wrong - expected).abs()  # (2, 4, 9, 9)
    assert not torch.allclose(wrong, expected, atol=1e-6)
    assert gap.amax() > 0.1 * expected.abs().amax(), "wrong by as much as the scores themselves"
    diagonal = gap.diagonal(dim1=-2, dim2=-1)  # (2, 4, 9): query and key at the same position
    assert diagonal.amax() < 1e-12, "same position: no rotation, so the bug is invisible there"


def test_whole_attention_output_after_conversion():
    """Values and the output projection are not rotated: only W_Q and W_K are permuted."""
    module = meta_attention()
    x = torch.randn(1, 6, 32, dtype=F64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected, _ = module(x, x, x, is_causal=True)  # (1, 6, 32)
        scores = rotate_half_scores(checkpoint(module, permute=True), x, 4, 4)  # (1, 4, 6, 6)
        causal = torch.ones(6, 6, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        v = module.value_proj(x).view(1, 6, 4, 8).transpose(1, 2)  # (1, 4, 6, 8)
        output = module.out_proj((weights @ v).transpose(1, 2).reshape(1, 6, 32))
    assert torch.allclose(output, expected, atol=1e-12)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: rope_layout_permutation(7), ValueError, r"head_dim must be even.*got 7"),
        (lambda: rope_layout_permutation(0), ValueError, r"head_dim must be >= 1, got 0"),
        (lambda: rope_layout_permutation(8.0), TypeError, r"head_dim must be an int, got float"),
        (lambda: rope_layout_permutation(True), TypeError, r"head_dim must be an int, got bool"),
        (lambda: rope_layout_permutation(8, num_heads=0), ValueError, r"num_heads must be >= 1"),
        (lambda: rope_layout_permutation(8, num_heads="4"), TypeError, r"num_heads must be an int, got str"),
        (lambda: rope_rotate_half([[1.0, 2.0]]), TypeError, r"x must be a torch.Tensor, got list"),
        (lambda: rope_rotate_half(torch.ones(3, 4, dtype=torch.long)), TypeError,
         r"x must be a floating-point tensor .* got dtype torch.int64"),
        (lambda: rope_rotate_half(torch.ones(8)), ValueError,
         r"x must have shape \(\.\.\., seq_len, head_dim\) \(at least 2-D\), got a 1-D tensor of shape \(8,\)"),
        (lambda: rope_rotate_half(torch.ones(3, 5)), ValueError,
         r"head_dim even and non-zero .* got shape \(3, 5\)"),
        (lambda: rope_rotate_half(torch.ones(3, 0)), ValueError, r"got shape \(3, 0\)"),
        (lambda: rope_rotate_half(torch.full((3, 4), float("nan"))), ValueError,
         r"x contains 12 NaN or infinite value\(s\)"),
        (lambda: rope_rotate_half(torch.ones(3, 4), offset=-1), ValueError, r"offset must be >= 0, got -1"),
        (lambda: rope_rotate_half(torch.ones(3, 4), offset=1.5), TypeError, r"offset must be an int"),
        (lambda: rope_rotate_half(torch.ones(3, 4), base=0.0), ValueError,
         r"base must be a positive finite number, got 0.0"),
        (lambda: rope_rotate_half(torch.ones(3, 4), base="1e4"), TypeError, r"base must be a float, got str"),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_empty_sequence_is_fine():
    assert rope_rotate_half(torch.ones(2, 0, 4)).shape == (2, 0, 4)
