"""Chapter 3 exercise checks: right answers pass, plausible wrong answers (a reshape without a
transpose, which mixes the heads; the wrong scale; forgetting the values in the cache) fail,
stubs are reported without raising."""

from __future__ import annotations

import math

import pytest
import torch

from companion.attention import MultiHeadAttention, scaled_dot_product_attention
from companion.exercises import ch03
from companion.utils import count_parameters

# --------------------------------------------------------------------------------------------
# split_heads
# --------------------------------------------------------------------------------------------


def split_correct(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def split_without_transpose(x, num_heads):
    # the classic bug: right shape, but "head 0" gets the first features of several positions
    batch, length, d_model = x.shape
    return x.reshape(batch, num_heads, length, d_model // num_heads)


def split_interleaved(x, num_heads):
    # head h gets features h, h + heads, h + 2·heads, ... instead of a contiguous slice
    batch, length, d_model = x.shape
    return x.view(batch, length, d_model // num_heads, num_heads).permute(0, 3, 1, 2)


def split_no_move(x, num_heads):
    # forgets to move the head axis in front of the positions
    batch, length, d_model = x.shape
    return x.view(batch, length, num_heads, d_model // num_heads)


def test_split_heads_accepts_correct():
    assert ch03.check_split_heads(split_correct, verbose=False)
    assert ch03.check_split_heads(
        lambda x, num_heads: torch.stack(x.chunk(num_heads, dim=-1), dim=1), verbose=False
    )


@pytest.mark.parametrize("wrong", [split_without_transpose, split_interleaved, split_no_move])
def test_split_heads_rejects_wrong(wrong):
    assert not ch03.check_split_heads(wrong, verbose=False)


def test_split_without_transpose_fails_on_values_not_only_shapes():
    """Where len = heads = head_dim the wrong reshape has the right shape: values catch it."""
    result = ch03.check_split_heads(split_without_transpose, verbose=False)
    assert not result
    assert "entries differ" in result.message


def test_reference_split_matches_the_companion_module():
    module = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(ch03.reference_split_heads(x, 3), module.split_heads(x))


# --------------------------------------------------------------------------------------------
# merge_heads
# --------------------------------------------------------------------------------------------


def merge_correct(x):
    return x.transpose(1, 2).flatten(-2)


def merge_without_transpose(x):
    batch, heads, length, head_dim = x.shape
    return x.reshape(batch, length, heads * head_dim)


def merge_interleaved(x):
    # features of the heads interleaved instead of concatenated
    batch, heads, length, head_dim = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, length, heads * head_dim)


def merge_sum(x):
    # adds the heads instead of concatenating them
    return x.sum(dim=1)


def test_merge_heads_accepts_correct():
    assert ch03.check_merge_heads(merge_correct, verbose=False)
    assert ch03.check_merge_heads(lambda x: torch.cat(x.unbind(dim=1), dim=-1), verbose=False)


@pytest.mark.parametrize("wrong", [merge_without_transpose, merge_interleaved, merge_sum])
def test_merge_heads_rejects_wrong(wrong):
    assert not ch03.check_merge_heads(wrong, verbose=False)


def test_merge_inverts_split():
    x = torch.randn(2, 5, 12)
    split = ch03.reference_split_heads(x, 3)
    assert torch.equal(ch03.reference_merge_heads(split), x)


# --------------------------------------------------------------------------------------------
# multi_head_attention
# --------------------------------------------------------------------------------------------


def mha_loop(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    """One head at a time, with the companion function: a different route to the same result."""
    d_k, d_v = w_q.shape[1] // num_heads, w_v.shape[1] // num_heads
    outputs, weights = [], []
    for h in range(num_heads):
        q = query @ w_q[:, h * d_k : (h + 1) * d_k]
        k = key @ w_k[:, h * d_k : (h + 1) * d_k]
        v = value @ w_v[:, h * d_v : (h + 1) * d_v]
        out, w = scaled_dot_product_attention(q, k, v)
        outputs.append(out)
        weights.append(w)
    return torch.cat(outputs, dim=-1) @ w_o, torch.stack(weights, dim=1)


def mha_sum_of_heads(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    """concat(heads) W_O = Σ_h head_h W_O[rows of head h]: no concatenation at all."""
    d_k, d_v = w_q.shape[1] // num_heads, w_v.shape[1] // num_heads
    output, weights = 0, []
    for h in range(num_heads):
        q = query @ w_q[:, h * d_k : (h + 1) * d_k]
        k = key @ w_k[:, h * d_k : (h + 1) * d_k]
        v = value @ w_v[:, h * d_v : (h + 1) * d_v]
        head, w = scaled_dot_product_attention(q, k, v)
        output = output + head @ w_o[h * d_v : (h + 1) * d_v]
        weights.append(w)
    return output, torch.stack(weights, dim=1)


def _split(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def _merge(x):
    return x.transpose(1, 2).flatten(-2)


def mha_scaled_by_d_model(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(w_q.shape[1]), dim=-1)
    return _merge(weights @ v) @ w_o, weights


def mha_split_without_transpose(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    def bad_split(x):
        batch, length, width = x.shape
        return x.reshape(batch, num_heads, length, width // num_heads)

    q, k, v = bad_split(query @ w_q), bad_split(key @ w_k), bad_split(value @ w_v)
    d_k = q.shape[-1]
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    return _merge(weights @ v) @ w_o, weights


def mha_output_transposed(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # the nn.Linear habit: multiplies by W_O.T, which runs (with wrong values) when W_O is square
    return mha_loop(query, key, value, w_q, w_k, w_v, w_o.T, num_heads)


def mha_softmax_over_queries(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
    return _merge(weights @ v) @ w_o, weights


def mha_averaged_weights(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # returns the head-averaged weights, like torch.nn.MultiheadAttention's default
    out, weights = mha_loop(query, key, value, w_q, w_k, w_v, w_o, num_heads)
    return out, weights.mean(dim=1, keepdim=True).expand_as(weights)


def test_multi_head_attention_accepts_correct():
    assert ch03.check_multi_head_attention(mha_loop, verbose=False)
    assert ch03.check_multi_head_attention(mha_sum_of_heads, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        mha_scaled_by_d_model,
        mha_split_without_transpose,
        mha_output_transposed,
        mha_softmax_over_queries,
        mha_averaged_weights,
    ],
)
def test_multi_head_attention_rejects_wrong(wrong):
    assert not ch03.check_multi_head_attention(wrong, verbose=False)


def test_cases_include_a_non_square_output_projection():
    shapes = [tuple(case["w_o"].shape) for case in ch03._mha_cases()]
    assert any(rows != cols for rows, cols in shapes)


def test_reference_mha_matches_the_companion_module():
    torch.manual_seed(0)
    module = MultiHeadAttention(12, 3, bias=False)
    query, memory = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    expected, expected_weights = module(query, memory, memory, need_weights=True)
    got, weights = ch03.reference_multi_head_attention(
        query,
        memory,
        memory,
        module.query_proj.weight.T,  # nn.Linear stores (out, in)
        module.key_proj.weight.T,
        module.value_proj.weight.T,
        module.out_proj.weight.T,
        num_heads=3,
    )
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(weights, expected_weights)


# --------------------------------------------------------------------------------------------
# attention_parameter_count
# --------------------------------------------------------------------------------------------


def params_correct(d_model, num_heads, num_kv_heads, bias):
    kv = num_kv_heads * d_model // num_heads
    return 2 * d_model * d_model + 2 * d_model * kv + (2 * d_model + 2 * kv) * bias


def params_ignores_kv_heads(d_model, num_heads, num_kv_heads, bias):
    return 4 * d_model * d_model + 4 * d_model * bias


def params_kv_width_is_head_count(d_model, num_heads, num_kv_heads, bias):
    # shrinks K and V by num_kv_heads / d_model instead of num_kv_heads / num_heads
    kv = num_kv_heads
    return 2 * d_model * d_model + 2 * d_model * kv + (2 * d_model + 2 * kv) * bias


def params_forgets_output_projection(d_model, num_heads, num_kv_heads, bias):
    kv = num_kv_heads * d_model // num_heads
    return d_model * d_model + 2 * d_model * kv + (d_model + 2 * kv) * bias


def params_full_width_biases(d_model, num_heads, num_kv_heads, bias):
    kv = num_kv_heads * d_model // num_heads
    return 2 * d_model * d_model + 2 * d_model * kv + 4 * d_model * bias


def test_parameter_count_accepts_correct():
    assert ch03.check_attention_parameter_count(params_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        params_ignores_kv_heads,
        params_kv_width_is_head_count,
        params_forgets_output_projection,
        params_full_width_biases,
    ],
)
def test_parameter_count_rejects_wrong(wrong):
    assert not ch03.check_attention_parameter_count(wrong, verbose=False)


def test_parameter_count_is_exact():
    """Off by one parameter out of millions is still wrong."""
    assert not ch03.check_attention_parameter_count(
        lambda d_model, num_heads, num_kv_heads, bias: (
            params_correct(d_model, num_heads, num_kv_heads, bias) + 1
        ),
        verbose=False,
    )


@pytest.mark.parametrize(("d_model", "num_heads"), [(12, 1), (12, 3), (12, 4), (64, 8)])
@pytest.mark.parametrize("bias", [True, False])
def test_reference_parameter_count_matches_the_companion_module(d_model, num_heads, bias):
    module = MultiHeadAttention(d_model, num_heads, bias=bias)
    expected = ch03.reference_attention_parameter_count(d_model, num_heads, num_heads, bias)
    assert count_parameters(module) == expected
    assert expected == 4 * d_model**2 + 4 * d_model * bias


# --------------------------------------------------------------------------------------------
# kv_cache_bytes
# --------------------------------------------------------------------------------------------


def kv_correct(seq_len, num_layers, d_model, num_heads, num_kv_heads, bytes_per_value, batch):
    return (
        2 * batch * seq_len * num_layers * num_kv_heads * (d_model // num_heads) * bytes_per_value
    )


def kv_keys_only(seq_len, num_layers, d_model, num_heads, num_kv_heads, bytes_per_value, batch):
    return batch * seq_len * num_layers * num_kv_heads * (d_model // num_heads) * bytes_per_value


def kv_ignores_grouping(
    seq_len, num_layers, d_model, num_heads, num_kv_heads, bytes_per_value, batch
):
    return 2 * batch * seq_len * num_layers * d_model * bytes_per_value


def kv_in_values_not_bytes(
    seq_len, num_layers, d_model, num_heads, num_kv_heads, bytes_per_value, batch
):
    return 2 * batch * seq_len * num_layers * num_kv_heads * (d_model // num_heads)


def kv_forgets_batch(seq_len, num_layers, d_model, num_heads, num_kv_heads, bytes_per_value, batch):
    return 2 * seq_len * num_layers * num_kv_heads * (d_model // num_heads) * bytes_per_value


def test_kv_cache_accepts_correct():
    assert ch03.check_kv_cache_bytes(kv_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong", [kv_keys_only, kv_ignores_grouping, kv_in_values_not_bytes, kv_forgets_batch]
)
def test_kv_cache_rejects_wrong(wrong):
    assert not ch03.check_kv_cache_bytes(wrong, verbose=False)


def test_kv_cache_reference_known_values():
    mib = 2**20
    kwargs = dict(
        seq_len=4096, num_layers=1, d_model=4096, num_heads=32, bytes_per_value=2, batch=1
    )
    assert ch03.reference_kv_cache_bytes(num_kv_heads=32, **kwargs) == 64 * mib
    assert ch03.reference_kv_cache_bytes(num_kv_heads=8, **kwargs) == 16 * mib
    assert ch03.reference_kv_cache_bytes(num_kv_heads=1, **kwargs) == 2 * mib


# --------------------------------------------------------------------------------------------
# determinism of the generated cases
# --------------------------------------------------------------------------------------------


def test_cases_are_reproducible():
    first, second = ch03._mha_cases(), ch03._mha_cases()
    for a, b in zip(first, second):
        assert all(torch.equal(a[name], b[name]) for name in ("query", "w_q", "w_o"))
