"""Properties that must hold for every input (hypothesis, 100 examples each)."""

import torch
from helpers import max_abs_diff, tiny_transformer
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.attention import MultiHeadAttention
from companion.masking import padding_mask
from companion.model import Encoder, Transformer, TransformerConfig
from companion.positional import RotaryEmbedding, sinusoidal_shift_matrix, sinusoidal_table

TOL = 1e-5
EXAMPLES = settings(max_examples=100, deadline=None)
PAD = 0


def tiny_model(seed: int, norm_first: bool, pad_ids: bool = True) -> Transformer:
    return tiny_transformer(
        9, seed=seed, pad_id=PAD if pad_ids else None, d_model=8, num_heads=2, num_layers=2,
        d_ff=16, dropout=0.1, norm_first=norm_first, max_len=32,
    ).eval()  # fmt: skip


@EXAMPLES
@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 7),
    heads=st.sampled_from([1, 2, 4]),
    use_mask=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_self_attention_without_positions_is_permutation_equivariant(
    batch, length, heads, use_mask, seed
):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    attention = MultiHeadAttention(8, heads).eval()
    encoder = Encoder(TransformerConfig(num_layers=2, d_model=8, num_heads=heads, d_ff=16)).eval()
    x = torch.randn(batch, length, 8, generator=gen)
    mask = torch.rand(batch, 1, 1, length, generator=gen) > 0.3 if use_mask else None
    perm = torch.randperm(length, generator=gen)
    permuted_mask = mask[..., perm] if use_mask else None

    out, _ = attention(x, x, x, mask)
    out_perm, _ = attention(x[:, perm], x[:, perm], x[:, perm], permuted_mask)
    assert max_abs_diff(out[:, perm], out_perm) <= TOL
    assert max_abs_diff(encoder(x, mask)[:, perm], encoder(x[:, perm], permuted_mask)) <= TOL


@EXAMPLES
@given(
    batch=st.integers(1, 3),
    src_len=st.integers(1, 6),
    tgt_len=st.integers(2, 8),
    data=st.data(),
    norm_first=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_causal_model_ignores_future_target_tokens(batch, src_len, tgt_len, data, norm_first, seed):
    """Changing the target tokens after position t leaves the logits up to t unchanged."""
    gen = torch.Generator().manual_seed(seed)
    model = tiny_model(seed, norm_first)
    t = data.draw(st.integers(0, tgt_len - 2), label="t")
    src = torch.randint(1, 9, (batch, src_len), generator=gen)
    tgt = torch.randint(0, 9, (batch, tgt_len), generator=gen)
    changed = tgt.clone()
    changed[:, t + 1 :] = torch.randint(0, 9, (batch, tgt_len - t - 1), generator=gen)
    before, after = model(src, tgt), model(src, changed)
    assert max_abs_diff(before[:, : t + 1], after[:, : t + 1]) <= TOL


@EXAMPLES
@given(
    batch=st.integers(1, 3),
    src_len=st.integers(1, 6),
    tgt_len=st.integers(1, 6),
    extra_src=st.integers(1, 4),
    extra_tgt=st.integers(0, 4),
    norm_first=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_appending_padding_leaves_real_positions_unchanged(
    batch, src_len, tgt_len, extra_src, extra_tgt, norm_first, seed
):
    gen = torch.Generator().manual_seed(seed)
    model = tiny_model(seed, norm_first)
    src = torch.randint(1, 9, (batch, src_len), generator=gen)
    tgt = torch.randint(1, 9, (batch, tgt_len), generator=gen)
    padded_src = torch.cat([src, torch.full((batch, extra_src), PAD)], 1)
    padded_tgt = torch.cat([tgt, torch.full((batch, extra_tgt), PAD)], 1)
    logits = model(src, tgt)
    padded_logits = model(padded_src, padded_tgt)
    assert padded_logits.shape == (batch, tgt_len + extra_tgt, 9)
    assert max_abs_diff(logits, padded_logits[:, :tgt_len]) <= TOL
    memory, padded_memory = model.encode(src), model.encode(padded_src)
    assert max_abs_diff(memory, padded_memory[:, :src_len]) <= TOL


@EXAMPLES
@given(
    batch=st.integers(1, 3),
    q_len=st.integers(1, 6),
    k_len=st.integers(1, 6),
    heads=st.sampled_from([1, 2, 4]),
    mask_kind=st.sampled_from(["none", "padding", "random"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_attention_weight_rows_sum_to_one(batch, q_len, k_len, heads, mask_kind, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    attention = MultiHeadAttention(8, heads).eval()
    query = torch.randn(batch, q_len, 8, generator=gen) * 3
    memory = torch.randn(batch, k_len, 8, generator=gen) * 3
    if mask_kind == "padding":
        tokens = torch.randint(0, 3, (batch, k_len), generator=gen)
        mask = padding_mask(tokens, pad_id=0)
    elif mask_kind == "random":
        mask = torch.rand(batch, heads, q_len, k_len, generator=gen) > 0.4
    else:
        mask = None
    _, weights = attention(query, memory, memory, mask, need_weights=True)
    sums = weights.sum(-1)  # (batch, heads, q_len)
    has_key = (
        torch.ones_like(sums, dtype=torch.bool)
        if mask is None
        else mask.expand(batch, heads, q_len, k_len).any(-1)
    )
    assert (weights >= 0).all()
    assert max_abs_diff(sums[has_key], torch.ones_like(sums[has_key])) <= TOL
    assert (sums[~has_key] == 0).all()  # a query with no key: zero weights, never NaN


@EXAMPLES
@given(
    half_d=st.integers(1, 32),
    shift=st.integers(-40, 40),
    double=st.booleans(),
)
def test_sinusoidal_shift_is_a_fixed_rotation(half_d, shift, double):
    """PE(p + k) = PE(p) @ M_k for every p (row vectors), with one block-diagonal rotation M_k."""
    d_model, max_len = 2 * half_d, 100
    dtype = torch.float64 if double else torch.float32
    table = sinusoidal_table(max_len, d_model, dtype=dtype)  # (max_len, d_model)
    m_k = sinusoidal_shift_matrix(shift, d_model, dtype=dtype)  # (d_model, d_model)
    positions = torch.arange(max(0, -shift), min(max_len, max_len - shift))
    predicted = table[positions] @ m_k  # row p: PE(p) @ M_k
    tolerance = 1e-9 if double else 2e-5
    assert max_abs_diff(predicted, table[positions + shift]) <= tolerance
    assert max_abs_diff(m_k @ m_k.T, torch.eye(d_model, dtype=dtype)) <= tolerance


@EXAMPLES
@given(
    half_dim=st.integers(1, 16),
    m=st.integers(0, 200),
    n=st.integers(0, 200),
    shift=st.integers(0, 200),
    seed=st.integers(0, 2**31 - 1),
)
def test_rope_scores_depend_only_on_the_offset(half_dim, m, n, shift, seed):
    """⟨R_m q, R_n k⟩ = ⟨R_{m+s} q, R_{n+s} k⟩: only m - n matters."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = 2 * half_dim
    rope = RotaryEmbedding(head_dim, max_len=64)
    q = torch.randn(1, head_dim, generator=gen)
    k = torch.randn(1, head_dim, generator=gen)
    score = (rope.rotate(q, offset=m) * rope.rotate(k, offset=n)).sum()
    shifted = (rope.rotate(q, offset=m + shift) * rope.rotate(k, offset=n + shift)).sum()
    scale = q.norm() * k.norm()
    assert abs(score - shifted).item() <= 1e-5 * max(1.0, scale.item())
