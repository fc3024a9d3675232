"""MultiHeadAttention: parity with torch.nn.MultiheadAttention, both paths, weights, parameters.

Parity tests copy the weights of a randomly initialised ``torch.nn.MultiheadAttention`` and
compare in float32, eval mode: maximum absolute difference ≤ 1e-5. Query rows that may attend
to no key are excluded from the comparison (torch gives NaN or its bias there); ours must be
exactly zero.
"""

import math

import pytest
import torch
from helpers import max_abs_diff, randomize_
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from companion.attention import (
    KeyValueCache,
    MultiHeadAttention,
    fused_linear,
    scaled_dot_product_attention,
)
from companion.interop import (
    from_torch,
    load_from_torch,
    to_torch,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from companion.masking import causal_mask, combine_masks
from companion.utils import count_parameters

TOL = 1e-5
MASK_KINDS = ["none", "padding", "causal", "padding+causal", "random", "random-per-head"]


@st.composite
def attention_cases(draw):
    case = {
        "batch": draw(st.integers(1, 3)),
        "heads": draw(st.integers(1, 4)),
        "head_dim": draw(st.integers(1, 4)),
        "q_len": draw(st.integers(1, 6)),
        "cross": draw(st.booleans()),
        "mask_kind": draw(st.sampled_from(MASK_KINDS)),
        "use_is_causal": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "need_weights": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }
    min_k = case["q_len"] if "causal" in case["mask_kind"] else 1
    case["k_len"] = draw(st.integers(min_k, 7)) if case["cross"] else case["q_len"]
    return case


def build_masks(case, generator):
    """(ours, torch kwargs, full mask (batch, heads, q, k) or None, is_causal flag for ours)."""
    batch, heads, q_len, k_len = case["batch"], case["heads"], case["q_len"], case["k_len"]
    kind = case["mask_kind"]
    padding = causal = random = None
    if "padding" in kind:
        padding = torch.rand(batch, 1, 1, k_len, generator=generator) > 0.3  # may block all keys
    if "causal" in kind:
        causal = causal_mask(q_len, k_len)
    if kind == "random":
        random = torch.rand(batch, 1, q_len, k_len, generator=generator) > 0.4
    if kind == "random-per-head":
        random = torch.rand(batch, heads, q_len, k_len, generator=generator) > 0.4
    torch_kwargs = {}
    if padding is not None:
        torch_kwargs["key_padding_mask"] = to_torch_key_padding_mask(padding)
    if causal is not None:
        torch_kwargs["attn_mask"] = to_torch_attn_mask(causal)
    if random is not None:
        torch_kwargs["attn_mask"] = to_torch_attn_mask(random, num_heads=heads)
    full = combine_masks(padding, causal, random)
    use_is_causal = causal is not None and case["use_is_causal"]
    ours = combine_masks(padding, None if use_is_causal else causal, random)
    return ours, torch_kwargs, full, use_is_causal


def valid_rows(full_mask, batch, heads, q_len, k_len):
    """(batch, q_len) True where the query may attend to some key in every head."""
    if full_mask is None:
        return torch.ones(batch, q_len, dtype=torch.bool)
    return full_mask.expand(batch, heads, q_len, k_len).any(-1).all(1)


def empty_rows(full_mask, batch, heads, q_len, k_len):
    """(batch, q_len) True where no head lets the query attend anywhere."""
    if full_mask is None:
        return torch.zeros(batch, q_len, dtype=torch.bool)
    return ~full_mask.expand(batch, heads, q_len, k_len).any(-1).any(1)


@settings(max_examples=100, deadline=None)
@given(attention_cases())
def test_parity_with_torch_multihead_attention(case):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, heads, q_len, k_len = case["batch"], case["heads"], case["q_len"], case["k_len"]
    d_model = heads * case["head_dim"]
    reference = nn.MultiheadAttention(d_model, heads, bias=case["bias"], batch_first=True)
    randomize_(reference, gen).eval()
    ours = from_torch(reference).eval()

    query = torch.randn(batch, q_len, d_model, generator=gen)
    if case["cross"]:
        key = value = torch.randn(batch, k_len, d_model, generator=gen)
    else:
        key = value = query
    mask, torch_kwargs, full, use_is_causal = build_masks(case, gen)

    out, weights = ours(
        query, key, value, mask, need_weights=case["need_weights"], is_causal=use_is_causal
    )
    ref_out, ref_weights = reference(
        query, key, value, need_weights=True, average_attn_weights=False, **torch_kwargs
    )
    assert out.shape == (batch, q_len, d_model)
    assert torch.isfinite(out).all()
    valid = valid_rows(full, batch, heads, q_len, k_len)
    assert max_abs_diff(out[valid], ref_out[valid]) <= TOL
    empty = empty_rows(full, batch, heads, q_len, k_len)
    assert (out[empty] == 0).all()
    if case["need_weights"]:
        assert weights.shape == (batch, heads, q_len, k_len)
        rows = valid[:, None, :].expand(batch, heads, q_len)
        assert max_abs_diff(weights[rows], ref_weights[rows]) <= TOL
    else:
        assert weights is None


@settings(max_examples=60, deadline=None)
@given(attention_cases())
def test_fast_and_explicit_paths_agree(case):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, heads, q_len, k_len = case["batch"], case["heads"], case["q_len"], case["k_len"]
    d_model = heads * case["head_dim"]
    torch.manual_seed(case["seed"])
    attention = randomize_(MultiHeadAttention(d_model, heads, bias=case["bias"]), gen).eval()
    query = torch.randn(batch, q_len, d_model, generator=gen)
    key = value = torch.randn(batch, k_len, d_model, generator=gen) if case["cross"] else query
    mask, _, full, use_is_causal = build_masks(case, gen)
    fast, none = attention(query, key, value, mask, need_weights=False, is_causal=use_is_causal)
    explicit, weights = attention(
        query, key, value, mask, need_weights=True, is_causal=use_is_causal
    )
    assert none is None
    assert (fast - explicit).abs().max().item() <= TOL
    assert torch.isfinite(fast).all() and torch.isfinite(weights).all()


def test_fully_masked_rows_are_zero_and_have_finite_gradients():
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2, dropout=0.2)
    x = torch.randn(2, 3, 8, requires_grad=True)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[0, 0, 1] = False  # query 1 of sequence 0 may attend nowhere
    mask[1] = False  # sequence 1: nothing at all
    for need_weights in (False, True):
        for training in (False, True):
            attention.train(training)
            out, weights = attention(x, x, x, mask, need_weights=need_weights)
            assert torch.equal(out[0, 1], torch.zeros(8))
            assert torch.equal(out[1], torch.zeros(3, 8))
            if need_weights:
                assert torch.equal(weights[0, :, 1], torch.zeros(2, 3))
            out.sum().backward()
            assert torch.isfinite(x.grad).all()
            x.grad = None


def test_self_attention_uses_fused_projection_with_same_result():
    torch.manual_seed(0)
    attention = MultiHeadAttention(12, 3).eval()
    x = torch.randn(2, 5, 12)
    fused, _ = attention(x, x, x)  # query is key is value: one matrix product
    separate, _ = attention(x, x.clone(), x.clone())  # three products
    assert (fused - separate).abs().max().item() <= TOL


def test_fused_linear_equals_the_layers_one_by_one():
    torch.manual_seed(0)
    for bias in (True, False):
        layers = [
            nn.Linear(6, 6, bias=bias),
            nn.Linear(6, 4, bias=bias),
            nn.Linear(6, 2, bias=bias),
        ]
        x = torch.randn(2, 5, 6)  # (batch, len, d_in)
        fused = fused_linear(x, layers)  # (batch, len, 6 + 4 + 2)
        assert fused.shape == (2, 5, 12)
        torch.testing.assert_close(fused, torch.cat([layer(x) for layer in layers], dim=-1))
        torch.testing.assert_close(fused_linear(x, layers[:1]), layers[0](x))


def test_split_heads_and_merge_heads():
    """Head i holds features i·head_dim … (i+1)·head_dim - 1; merge_heads undoes split_heads."""
    attention = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)  # (batch, len, d_model)
    heads = attention.split_heads(x)  # (batch, heads, len, head_dim)
    assert heads.shape == (2, 3, 5, 4)
    assert heads.data_ptr() == x.data_ptr()  # a view, no copy
    for i in range(3):
        assert torch.equal(heads[:, i], x[..., 4 * i : 4 * (i + 1)])
    assert torch.equal(attention.merge_heads(heads), x)
    assert torch.equal(attention.merge_heads(heads.contiguous()), x)


def test_cross_attention_with_different_lengths():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4)
    out, weights = attention(
        torch.randn(3, 2, 16), torch.randn(3, 7, 16), torch.randn(3, 7, 16), need_weights=True
    )
    assert out.shape == (3, 2, 16)
    assert weights.shape == (3, 4, 2, 7)


def test_causal_flag_with_more_keys_matches_explicit_mask():
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2).eval()
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    flagged, _ = attention(q, kv, kv, is_causal=True)
    explicit, _ = attention(q, kv, kv, causal_mask(3, 5))
    assert (flagged - explicit).abs().max().item() <= TOL


@pytest.mark.parametrize("bias", [True, False])
def test_weight_copy_round_trip(bias):
    torch.manual_seed(0)
    ours = MultiHeadAttention(12, 3, bias=bias).eval()
    theirs = to_torch(ours).eval()
    assert isinstance(theirs, nn.MultiheadAttention) and theirs.batch_first
    back = MultiHeadAttention(12, 3, bias=bias)
    load_from_torch(back, theirs)
    for (name, p), (_, q) in zip(ours.named_parameters(), back.named_parameters()):
        assert torch.equal(p, q), name
    x = torch.randn(2, 4, 12)
    assert (ours(x, x, x)[0] - theirs(x, x, x, need_weights=False)[0]).abs().max() <= TOL


def test_parameter_names_are_readable():
    names = {name for name, _ in MultiHeadAttention(8, 2).named_parameters()}
    assert names == {
        f"{proj}.{kind}"
        for proj in ("query_proj", "key_proj", "value_proj", "out_proj")
        for kind in ("weight", "bias")
    }


@pytest.mark.parametrize("d_model, heads", [(8, 2), (64, 8), (512, 8)])
def test_parameter_count(d_model, heads):
    assert count_parameters(MultiHeadAttention(d_model, heads)) == 4 * d_model**2 + 4 * d_model
    assert count_parameters(MultiHeadAttention(d_model, heads, bias=False)) == 4 * d_model**2
    torch_count = count_parameters(nn.MultiheadAttention(d_model, heads))
    assert count_parameters(MultiHeadAttention(d_model, heads)) == torch_count


def test_dropout_only_in_training():
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(1, 6, 8)
    attention.eval()
    assert torch.equal(attention(x, x, x)[0], attention(x, x, x)[0])
    attention.train()
    assert not torch.equal(attention(x, x, x)[0], attention(x, x, x)[0])


def test_existing_teaching_function_is_unchanged():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    out, weights = scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert torch.allclose(out, expected @ v, atol=1e-6)


def test_key_value_cache_step_by_step_equals_causal_attention():
    torch.manual_seed(0)
    self_attention = MultiHeadAttention(8, 2).eval()
    cross_attention = MultiHeadAttention(8, 2).eval()
    x, memory = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    full_self, _ = self_attention(x, x, x, is_causal=True)
    full_cross, _ = cross_attention(x, memory, memory)
    self_cache, cross_cache = KeyValueCache(growing=True), KeyValueCache(growing=False)
    for t in range(5):
        step = x[:, t : t + 1]
        out, weights = self_attention(step, step, step, need_weights=True, cache=self_cache)
        assert weights.shape == (2, 2, 1, t + 1) and self_cache.length == t + 1
        assert max_abs_diff(out[:, 0], full_self[:, t]) <= TOL
        out, _ = cross_attention(step, memory, memory, cache=cross_cache)
        assert cross_cache.length == 4  # memory projected once, then reused
        assert max_abs_diff(out[:, 0], full_cross[:, t]) <= TOL


@pytest.mark.parametrize("kind", ["padding", "causal_flag", "causal_mask_and_blocked_row"])
def test_training_path_with_dropout_is_attention_when_nothing_is_dropped(kind, monkeypatch):
    """On a CPU, training-mode attention with dropout > 0 takes a path of its own (with
    companion.dropout's random lanes and a backward pass of its own); with dropout made the
    identity it must equal eval-mode attention."""
    import companion.kernels as kernels_module

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.3)
    q, k, v = (torch.randn(3, 4, 6, 4) for _ in range(3))  # (batch, heads, len, head_dim)
    mask, is_causal = None, False
    if kind == "padding":
        mask = torch.rand(3, 1, 1, 6) > 0.3
        mask[:, :, :, 0] = True
    elif kind == "causal_flag":
        is_causal = True
    else:
        mask = causal_mask(6).expand(3, 1, 6, 6).clone()
        mask[1, :, 2] = False  # query 2 of sequence 1 has no key: zero output
    expected, _ = mha.eval().attend(q, k, v, mask, is_causal=is_causal)
    monkeypatch.setattr(  # every factor 1: dropout made the identity
        kernels_module, "dropout_factor", lambda weights, p: torch.ones_like(weights)
    )
    got, _ = mha.train().attend(q, k, v, mask, is_causal=is_causal)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    monkeypatch.undo()
    dropped, _ = mha.train().attend(q, k, v, mask, is_causal=is_causal)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, expected)
    if kind == "causal_mask_and_blocked_row":
        assert (dropped[1, :, 2] == 0).all()


def _fixed_factor(monkeypatch, shape: tuple[int, ...], p: float) -> Tensor:
    """Make the written-out CPU attention's dropout decisions a fixed tensor (float64)."""
    import companion.kernels as kernels_module

    factor = (torch.rand(shape, dtype=torch.float64) >= p).double() / (1 - p)
    monkeypatch.setattr(kernels_module, "dropout_factor", lambda weights, p: factor.clone())
    return factor


@pytest.mark.parametrize("with_bias", [False, True])
def test_written_out_dropout_attention_backward_passes_gradcheck(with_bias, monkeypatch):
    """The CPU attention with dropout writes its backward pass by hand (one autograd node);
    finite differences check it, for q, k, v and a bias that needs a gradient too."""
    import companion.kernels as kernels_module

    torch.manual_seed(0)

    def leaf(*shape: int) -> Tensor:  # (batch, heads, len, dim), strided like split heads
        x = torch.randn(shape[0], shape[2], shape[1], shape[3], dtype=torch.float64)
        return x.transpose(1, 2).detach().requires_grad_()

    q, k, v = leaf(2, 3, 5, 4), leaf(2, 3, 6, 4), leaf(2, 3, 6, 7)
    bias = torch.randn(2, 1, 5, 6, dtype=torch.float64, requires_grad=True) if with_bias else None
    _fixed_factor(monkeypatch, (6, 5, 6), 0.3)  # (batch·heads, q_len, k_len)

    def attention(*inputs: Tensor) -> Tensor:
        return kernels_module.DroppedAttention.apply(*inputs, bias, 0.3)

    assert torch.autograd.gradcheck(attention, (q, k, v))
    if with_bias:
        assert torch.autograd.gradcheck(
            lambda b: kernels_module.DroppedAttention.apply(q, k, v, b, 0.3), (bias,)
        )


def test_written_out_dropout_attention_matches_autograd_with_a_mask(monkeypatch):
    """Output and gradients equal the same arithmetic through torch's autograd: padding and
    causal mask, the same dropout decisions (float64)."""
    import companion.kernels as kernels_module

    torch.manual_seed(1)
    q, k, v = (torch.randn(3, 4, 6, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    mask = (torch.rand(3, 1, 1, 6) > 0.3) & causal_mask(6)  # (batch, 1, q_len, k_len)
    mask[..., 0] = True  # every query has a key
    factor = _fixed_factor(monkeypatch, (12, 6, 6), 0.2).view(3, 4, 6, 6)
    got = kernels_module.attention_with_dropout(q, k, v, mask, 0.2, False)
    scores = (q @ k.mT / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    expected = (torch.softmax(scores, dim=-1) * factor) @ v  # (batch, heads, q_len, d)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(got)
    for mine, theirs in zip(
        torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)
    ):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
