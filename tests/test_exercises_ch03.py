"""Chapter 3 exercise checks: right answers pass, plausible wrong answers (a reshape without a
transpose, which mixes positions; the other fused layout; ``repeat`` instead of
``repeat_interleave``; the wrong scale; forgetting the values in the cache) fail,
stubs are reported without raising."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from companion.attention import MultiHeadAttention, scaled_dot_product_attention
from companion.exercises import ch03

# --------------------------------------------------------------------------------------------
# split_fused_qkv (per-head layout)
# --------------------------------------------------------------------------------------------


def fused_correct(qkv, num_heads):
    per_head = qkv.unflatten(-1, (num_heads, -1)).transpose(1, 2)  # (batch, h, len, 3·d_k)
    return tuple(per_head.chunk(3, dim=-1))


def fused_by_slices(qkv, num_heads):
    d_k = qkv.shape[-1] // (3 * num_heads)
    blocks = [qkv[..., i * d_k : (i + 1) * d_k] for i in range(3 * num_heads)]
    q = torch.stack(blocks[0::3], dim=1)
    k = torch.stack(blocks[1::3], dim=1)
    v = torch.stack(blocks[2::3], dim=1)
    return q, k, v


def fused_chunk_first(qkv, num_heads):
    # the other layout, [all q | all k | all v]: valid for weights stored that way, not here
    return tuple(_split(part, num_heads) for part in qkv.chunk(3, dim=-1))


def fused_without_transpose(qkv, num_heads):
    # right shape, but moves features between positions
    batch, length, width = qkv.shape
    per_head = qkv.reshape(batch, num_heads, length, width // num_heads)
    return tuple(per_head.chunk(3, dim=-1))


def fused_heads_interleaved(qkv, num_heads):
    # head h gets every num_heads-th block instead of a contiguous group
    batch, length, width = qkv.shape
    per_head = qkv.view(batch, length, 3 * width // (3 * num_heads), num_heads)
    return tuple(per_head.permute(0, 3, 1, 2).chunk(3, dim=-1))


def test_split_fused_qkv_accepts_correct():
    assert ch03.check_split_fused_qkv(fused_correct, verbose=False)
    assert ch03.check_split_fused_qkv(fused_by_slices, verbose=False)


@pytest.mark.parametrize(
    "wrong", [fused_chunk_first, fused_without_transpose, fused_heads_interleaved]
)
def test_split_fused_qkv_rejects_wrong(wrong):
    assert not ch03.check_split_fused_qkv(wrong, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (fused_chunk_first, "stacked layout"),
        (fused_without_transpose, "without the transpose"),
    ],
)
def test_split_fused_qkv_names_the_slip(wrong, hint):
    result = ch03.check_split_fused_qkv(wrong, verbose=False)
    assert not result
    assert hint in result.message, result.message


def fused_axes_swapped(qkv, num_heads):
    # the heads axis and the q/k/v axis swapped: with 3 heads (case 1) the result has the
    # right shapes and the same numbers as the stacked-layout split
    return qkv.unflatten(-1, (num_heads, 3, -1)).permute(2, 0, 3, 1, 4).unbind(0)


def test_split_fused_qkv_names_both_slips_when_they_coincide():
    result = ch03.check_split_fused_qkv(fused_axes_swapped, verbose=False)
    assert not result
    assert "axis of size 3 is q/k/v" in result.message, result.message
    assert "stacked layout" in result.message, result.message


def test_split_fused_qkv_names_no_slip_for_another_wrong_answer():
    result = ch03.check_split_fused_qkv(fused_heads_interleaved, verbose=False)
    assert not result
    assert "this looks like" not in result.message, result.message


def test_split_without_transpose_fails_on_values_not_only_shapes():
    """Where len = heads = head_dim the wrong reshape has the right shape: values catch it."""
    result = ch03.check_split_fused_qkv(fused_without_transpose, verbose=False)
    assert not result
    assert "entries differ" in result.message


def test_per_head_layout_is_a_row_permutation_of_the_companion_weights():
    """Permuting the rows of the stacked weights turns companion's layout into the per-head
    one, and the per-head split then gives the module's own q, k, v."""
    torch.manual_seed(0)
    module = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    stacked = torch.cat(
        [module.query_proj.weight, module.key_proj.weight, module.value_proj.weight]
    )
    order = torch.arange(36).view(3, 3, 4).transpose(0, 1).flatten()  # per head: q, k, v rows
    qkv = x @ stacked[order].T
    q, k, v = ch03.reference_split_fused_qkv(qkv, 3)
    torch.testing.assert_close(q, module.split_heads(x @ module.query_proj.weight.T))
    torch.testing.assert_close(v, module.split_heads(x @ module.value_proj.weight.T))


# --------------------------------------------------------------------------------------------
# multi_head_attention
# --------------------------------------------------------------------------------------------


def gated(fn):
    """Give an ungated attempt the exercise's head_gates, folded into W_O's head blocks of rows
    (head r's output times g_r = the same head through g_r·W_O^(r)): a slip stays that slip."""

    def run(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
        d_v = w_o.shape[0] // num_heads
        w_o = w_o * head_gates.repeat_interleave(d_v)[:, None]  # row block r times g_r
        return fn(query, key, value, w_q, w_k, w_v, w_o, num_heads)

    run.__name__ = fn.__name__
    return run


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
    assert ch03.check_multi_head_attention(ch03.reference_multi_head_attention, verbose=False)
    assert ch03.check_multi_head_attention(gated(mha_loop), verbose=False)
    assert ch03.check_multi_head_attention(gated(mha_sum_of_heads), verbose=False)


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
    assert not ch03.check_multi_head_attention(gated(wrong), verbose=False)


def mha_returns_gated_weights(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    """The right output, but the weights returned after the gates: head r's map times g_r."""
    output, weights = ch03.reference_multi_head_attention(
        query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates
    )
    return output, weights * head_gates[:, None, None]


def test_multi_head_attention_names_gated_weights():
    result = ch03.check_multi_head_attention(mha_returns_gated_weights, verbose=False)
    assert not result
    assert "weights returned after gating" in result.message, result.message
    # a different wrong answer does not get that hint
    other = ch03.check_multi_head_attention(gated(mha_averaged_weights), verbose=False)
    assert not other
    assert "after gating" not in other.message, other.message


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
# grouped_query_attention
# --------------------------------------------------------------------------------------------


def gqa_loop(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    """One query head at a time, each with key/value head h // group: a different route."""
    d_k = w_q.shape[1] // num_heads
    group = num_heads // num_kv_heads
    outputs = []
    for h in range(num_heads):
        g = h // group
        q = query @ w_q[:, h * d_k : (h + 1) * d_k]
        k = key @ w_k[:, g * d_k : (g + 1) * d_k]
        v = value @ w_v[:, g * d_k : (g + 1) * d_k]
        outputs.append(scaled_dot_product_attention(q, k, v)[0])
    return torch.cat(outputs, dim=-1) @ w_o


def _gqa_with(expand):
    def gqa(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
        d_k = w_q.shape[1] // num_heads
        q = _split(query @ w_q, num_heads)
        k = expand(_split(key @ w_k, num_kv_heads), num_heads // num_kv_heads)
        v = expand(_split(value @ w_v, num_kv_heads), num_heads // num_kv_heads)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
        return _merge(weights @ v) @ w_o

    return gqa


gqa_interleave = _gqa_with(lambda t, r: t.repeat_interleave(r, dim=1))
gqa_expand_reshape = _gqa_with(
    lambda t, r: t[:, :, None].expand(-1, -1, r, -1, -1).flatten(1, 2)  # the Llama code's way
)
gqa_repeat = _gqa_with(lambda t, r: t.repeat(1, r, 1, 1))  # kv head h % g: the wrong groups
gqa_only_first_kv_head = _gqa_with(lambda t, r: t[:, :1].expand(-1, r * t.shape[1], -1, -1))


def gqa_scaled_by_kv_width(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    d_kv = w_k.shape[1]  # the width of all key/value heads, not of one head
    q = _split(query @ w_q, num_heads)
    r = num_heads // num_kv_heads
    k = _split(key @ w_k, num_kv_heads).repeat_interleave(r, dim=1)
    v = _split(value @ w_v, num_kv_heads).repeat_interleave(r, dim=1)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_kv), dim=-1)
    return _merge(weights @ v) @ w_o


def gqa_d_k_from_d_model(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    """Head width d_model // num_heads instead of w_q.shape[1] // num_heads."""
    d_k = query.shape[-1] // num_heads
    q = (query @ w_q).unflatten(-1, (-1, d_k)).transpose(1, 2)
    k = (key @ w_k).unflatten(-1, (-1, d_k)).transpose(1, 2)
    v = (value @ w_v).unflatten(-1, (-1, d_k)).transpose(1, 2)
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    return _merge(weights @ v) @ w_o


def test_gqa_cases_have_a_head_width_not_d_model_over_h():
    assert any(c["w_q"].shape[1] != c["query"].shape[-1] for c in ch03._gqa_cases()), (
        "one case should have num_heads · d_k != d_model"
    )


def test_gqa_hint_names_the_head_width():
    message = ch03.check_grouped_query_attention(gqa_d_k_from_d_model, verbose=False).message
    assert "w_q.shape[1] // num_heads" in message, message


def test_gqa_accepts_correct():
    for fn in (gqa_loop, gqa_interleave, gqa_expand_reshape):
        assert ch03.check_grouped_query_attention(fn, verbose=False), fn


@pytest.mark.parametrize(
    "wrong", [gqa_repeat, gqa_only_first_kv_head, gqa_scaled_by_kv_width, gqa_d_k_from_d_model]
)
def test_gqa_rejects_wrong(wrong):
    assert not ch03.check_grouped_query_attention(wrong, verbose=False)


def test_gqa_with_one_group_per_head_is_multi_head_attention():
    for case in ch03._mha_cases():
        if case["w_q"].shape != case["w_v"].shape:
            continue  # d_k != d_v: not a GQA shape
        heads = case["num_heads"]
        case = {name: value for name, value in case.items() if name != "head_gates"}
        expected, _ = ch03.reference_multi_head_attention(**case)
        got = ch03.reference_grouped_query_attention(**case, num_kv_heads=heads)
        torch.testing.assert_close(got, expected)


def test_gqa_cases_tell_repeat_from_repeat_interleave():
    assert any(1 < c["num_kv_heads"] < c["num_heads"] for c in ch03._gqa_cases())


# --------------------------------------------------------------------------------------------
# permute_heads
# --------------------------------------------------------------------------------------------


def permute_correct_loop(w_q, w_k, w_v, w_o, num_heads, order):
    """Slice by slice: a different route to the reference's unflatten/index/flatten."""
    d_k, d_v = w_q.shape[1] // num_heads, w_v.shape[1] // num_heads
    cols_k = torch.cat([torch.arange(r * d_k, (r + 1) * d_k) for r in order])
    cols_v = torch.cat([torch.arange(r * d_v, (r + 1) * d_v) for r in order])
    return w_q[:, cols_k], w_k[:, cols_k], w_v[:, cols_v], w_o[cols_v]


def _blocks(num_heads, order, width):
    return torch.cat([torch.arange(r * width, (r + 1) * width) for r in order])


def permute_forgets_w_o(w_q, w_k, w_v, w_o, num_heads, order):
    # the weights come out right, but W_O still expects the old order of the head outputs
    q, k, v, _ = ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, order)
    return q, k, v, w_o


def permute_w_o_columns(w_q, w_k, w_v, w_o, num_heads, order):
    # the nn.Linear habit: in the math convention W_O's head blocks are rows, not columns
    q, k, v, _ = ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, order)
    if w_o.shape[1] % num_heads:
        return q, k, v, w_o
    return q, k, v, w_o[:, _blocks(num_heads, order, w_o.shape[1] // num_heads)]


def permute_only_queries_and_keys(w_q, w_k, w_v, w_o, num_heads, order):
    # the attention maps move, but each map now averages another head's values
    q, k, _, _ = ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, order)
    return q, k, w_v, w_o


def permute_forgets_w_v(w_q, w_k, w_v, w_o, num_heads, order):
    # W_Q, W_K and W_O move, W_V does not: each map averages another head's values
    q, k, _, o = ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, order)
    return q, k, w_v, o


def permute_inverse(w_q, w_k, w_v, w_o, num_heads, order):
    # a consistent reordering (the output is unchanged), but by the inverse permutation
    inverse = torch.argsort(torch.tensor(order)).tolist()
    return ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, inverse)


def permute_strided_blocks(w_q, w_k, w_v, w_o, num_heads, order):
    # unflatten(1, (-1, num_heads)): treats features r, r + h, r + 2h, ... as head r, the
    # strided layout, so the "heads" it moves are not the layer's heads
    index = torch.tensor(order)

    def columns(w):
        return w.unflatten(1, (-1, num_heads))[:, :, index].flatten(1)

    return (
        columns(w_q),
        columns(w_k),
        columns(w_v),
        w_o.unflatten(0, (-1, num_heads))[:, index].flatten(0, 1),
    )


def test_permute_heads_accepts_correct():
    assert ch03.check_permute_heads(ch03.reference_permute_heads, verbose=False)
    assert ch03.check_permute_heads(permute_correct_loop, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        permute_forgets_w_o,
        permute_w_o_columns,
        permute_only_queries_and_keys,
        permute_forgets_w_v,
        permute_inverse,
        permute_strided_blocks,
    ],
)
def test_permute_heads_rejects_wrong(wrong):
    assert not ch03.check_permute_heads(wrong, verbose=False)


def test_permute_heads_explains_what_changed():
    result = ch03.check_permute_heads(permute_forgets_w_o, verbose=False)
    assert "must not change" in result.message
    result = ch03.check_permute_heads(permute_inverse, verbose=False)
    assert "order[r]" in result.message
    assert "you applied the inverse permutation" in result.message
    # the hint is for the inverse only: a different wrong answer does not get it
    result = ch03.check_permute_heads(permute_only_queries_and_keys, verbose=False)
    assert "inverse permutation" not in result.message
    assert "only W_Q and W_K moved" in result.message, result.message
    result = ch03.check_permute_heads(permute_w_o_columns, verbose=False)
    assert "W_O's columns moved" in result.message, result.message
    result = ch03.check_permute_heads(permute_forgets_w_o, verbose=False)
    assert "W_O kept as it was" in result.message, result.message
    result = ch03.check_permute_heads(permute_forgets_w_v, verbose=False)
    assert "W_V kept as it was" in result.message, result.message
    # a wrong answer that is none of the named slips gets no name
    result = ch03.check_permute_heads(permute_strided_blocks, verbose=False)
    assert "this looks like" not in result.message, result.message


def test_permute_heads_reports_a_stub_and_a_wrong_return():
    def stub(w_q, w_k, w_v, w_o, num_heads, order):
        raise NotImplementedError

    assert "not attempted yet" in ch03.check_permute_heads(stub, verbose=False).message
    result = ch03.check_permute_heads(
        lambda w_q, w_k, w_v, w_o, num_heads, order: w_q, verbose=False
    )
    assert not result and "expected a tuple" in result.message


def test_permuted_companion_module_computes_the_same_layer():
    """The reference applied to a trained-looking companion module (nn.Linear stores W.T)."""
    torch.manual_seed(0)
    module = MultiHeadAttention(12, 3, bias=False)
    x = torch.randn(2, 5, 12)
    order = [2, 0, 1]
    math_w = [
        p.weight.T for p in (module.query_proj, module.key_proj, module.value_proj, module.out_proj)
    ]
    permuted = ch03.reference_permute_heads(*math_w, num_heads=3, order=order)
    other = MultiHeadAttention(12, 3, bias=False)
    with torch.no_grad():
        for proj, w in zip(
            (other.query_proj, other.key_proj, other.value_proj, other.out_proj), permuted
        ):
            proj.weight.copy_(w.T)
        out, weights = module(x, x, x, need_weights=True)
        out2, weights2 = other(x, x, x, need_weights=True)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(weights2, weights[:, order])


# --------------------------------------------------------------------------------------------
# head_score_matrices
# --------------------------------------------------------------------------------------------


def scores_loop(w_q, w_k, num_heads):
    """Head by head with slices: a different route to the reference's unflatten/matmul."""
    d_k = w_q.shape[1] // num_heads
    return torch.stack(
        [
            w_q[:, r * d_k : (r + 1) * d_k] @ w_k[:, r * d_k : (r + 1) * d_k].T
            for r in range(num_heads)
        ]
    )


def scores_einsum(w_q, w_k, num_heads):
    q = w_q.unflatten(1, (num_heads, -1))  # (d_model, h, d_k)
    k = w_k.unflatten(1, (num_heads, -1))
    return torch.einsum("ahc,bhc->hab", q, k)


def scores_transposed(w_q, w_k, num_heads):
    # W_K^(r) W_Q^(r)ᵀ: entry (i, j) is the score of query j for key i
    return scores_loop(w_q, w_k, num_heads).transpose(-2, -1)


def scores_scaled(w_q, w_k, num_heads):
    # the softmax's input, not the raw score the exercise asks for
    return scores_loop(w_q, w_k, num_heads) / math.sqrt(w_q.shape[1] // num_heads)


def scores_whole_layer(w_q, w_k, num_heads):
    # one wide head's matrix, repeated: the sum of the heads' matrices, not each one
    return (w_q @ w_k.T).expand(num_heads, -1, -1)


def scores_strided(w_q, w_k, num_heads):
    # features r, r + h, r + 2h, ... taken as head r
    q = w_q.unflatten(1, (-1, num_heads)).permute(2, 0, 1)  # (h, d_model, d_k)
    k = w_k.unflatten(1, (-1, num_heads)).permute(2, 0, 1)
    return q @ k.transpose(-2, -1)


def scores_weights_reshaped(w_q, w_k, num_heads):
    # w_q.reshape(h, d_model, d_k): right shape, wrong numbers (section 3.3's bug on weights)
    d_k = w_q.shape[1] // num_heads
    return w_q.reshape(num_heads, -1, d_k) @ w_k.reshape(num_heads, -1, d_k).transpose(-2, -1)


def scores_small_gram(w_q, w_k, num_heads):
    # W_Q^(r)ᵀ W_K^(r): a (d_k, d_k) matrix, not the (d_model, d_model) form of the scores
    d_k = w_q.shape[1] // num_heads
    return torch.stack(
        [
            w_q[:, r * d_k : (r + 1) * d_k].T @ w_k[:, r * d_k : (r + 1) * d_k]
            for r in range(num_heads)
        ]
    )


def test_head_score_matrices_accepts_correct():
    assert ch03.check_head_score_matrices(ch03.reference_head_score_matrices, verbose=False)
    assert ch03.check_head_score_matrices(scores_loop, verbose=False)
    assert ch03.check_head_score_matrices(scores_einsum, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (scores_transposed, "the transpose"),
        (scores_scaled, "scaled by 1/√d_k"),
        (scores_whole_layer, "of all heads together"),
        (scores_strided, "strided heads"),
        (scores_weights_reshaped, "w_q.reshape(h, d_model, d_k)"),
        (scores_small_gram, None),
    ],
)
def test_head_score_matrices_rejects_wrong(wrong, hint):
    result = ch03.check_head_score_matrices(wrong, verbose=False)
    assert not result
    if hint is not None:
        assert hint in result.message, result.message


def test_head_score_matrices_reports_a_stub():
    def stub(w_q, w_k, num_heads):
        raise NotImplementedError

    result = ch03.check_head_score_matrices(stub, verbose=False)
    assert not result and "not attempted yet" in result.message


def test_head_score_matrices_give_the_raw_scores_and_add_up_to_one_wide_head():
    """x_i M_r x_jᵀ is head r's raw score; the h matrices sum to W_Q W_Kᵀ; rank M_r <= d_k."""
    torch.manual_seed(0)
    module = MultiHeadAttention(12, 3, bias=False)
    x = torch.randn(2, 5, 12)
    w_q, w_k = module.query_proj.weight.T, module.key_proj.weight.T  # math convention
    with torch.no_grad():
        forms = ch03.reference_head_score_matrices(w_q, w_k, 3)  # (3, 12, 12)
        q = module.split_heads(module.query_proj(x))  # (2, 3, 5, 4)
        k = module.split_heads(module.key_proj(x))
        torch.testing.assert_close(x[:, None] @ forms @ x[:, None].transpose(-2, -1), q @ k.mT)
        torch.testing.assert_close(forms.sum(0), w_q @ w_k.T)
    assert torch.linalg.matrix_rank(forms).max().item() == 4


def test_score_matrix_cases_have_heads_whose_width_differs_from_d_model_over_h():
    cases = ch03._score_matrix_cases()
    assert any(c["w_q"].shape[1] != c["w_q"].shape[0] for c in cases)
    assert any(c["num_heads"] == 1 for c in cases) and any(c["num_heads"] > 1 for c in cases)


# --------------------------------------------------------------------------------------------
# determinism of the generated cases
# --------------------------------------------------------------------------------------------


def test_cases_are_reproducible():
    first, second = ch03._mha_cases(), ch03._mha_cases()
    for a, b in zip(first, second):
        assert all(torch.equal(a[name], b[name]) for name in ("query", "w_q", "w_o"))


# --------------------------------------------------------------------------------------------
# more classic slips, one test each
# --------------------------------------------------------------------------------------------


def mha_unscaled(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # forgets the 1/√d_k of chapter 2
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return _merge(weights @ v) @ w_o, weights


def mha_head_width_from_d_model(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # TinyMHA's habit, d_k = d_model // h, instead of reading d_k off the weights
    d_k = query.shape[-1] // num_heads
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    return _merge(weights @ v) @ w_o, weights


def mha_values_as_wide_as_keys(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # assumes d_v = d_k: cuts W_V into blocks of d_k columns
    d_k = w_q.shape[1] // num_heads
    heads, weights = [], []
    for r in range(num_heads):
        cols = slice(r * d_k, (r + 1) * d_k)
        head, w = scaled_dot_product_attention(
            query @ w_q[:, cols], key @ w_k[:, cols], value @ w_v
        )
        heads.append(head[..., r * d_k : (r + 1) * d_k])
        weights.append(w)
    return torch.cat(heads, dim=-1) @ w_o[: num_heads * d_k], torch.stack(weights, dim=1)


@pytest.mark.parametrize(
    "wrong", [mha_unscaled, mha_head_width_from_d_model, mha_values_as_wide_as_keys]
)
def test_multi_head_attention_rejects_more_slips(wrong):
    assert not ch03.check_multi_head_attention(gated(wrong), verbose=False)


def gqa_kv_head_r_over_g(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    # query head r reads key/value head r // g instead of r // (h/g): wrong wherever h/g != g
    d_k = w_q.shape[1] // num_heads
    outputs = []
    for r in range(num_heads):
        kv = min(r // num_kv_heads, num_kv_heads - 1)
        q = query @ w_q[:, r * d_k : (r + 1) * d_k]
        k = key @ w_k[:, kv * d_k : (kv + 1) * d_k]
        v = value @ w_v[:, kv * d_k : (kv + 1) * d_k]
        outputs.append(scaled_dot_product_attention(q, k, v)[0])
    return torch.cat(outputs, dim=-1) @ w_o


def gqa_scaled_by_d_model(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    # the width of the layer, not of one head
    q = _split(query @ w_q, num_heads)
    r = num_heads // num_kv_heads
    k = _split(key @ w_k, num_kv_heads).repeat_interleave(r, dim=1)
    v = _split(value @ w_v, num_kv_heads).repeat_interleave(r, dim=1)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    return _merge(weights @ v) @ w_o


@pytest.mark.parametrize("wrong", [gqa_kv_head_r_over_g, gqa_scaled_by_d_model])
def test_gqa_rejects_more_slips(wrong):
    assert not ch03.check_grouped_query_attention(wrong, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (gqa_repeat, "`repeat`"),
        (gqa_kv_head_r_over_g, "dividing by the number of groups"),
        (gqa_only_first_kv_head, "the first key/value head"),
    ],
)
def test_gqa_message_names_the_key_value_head_used(wrong, hint):
    result = ch03.check_grouped_query_attention(wrong, verbose=False)
    assert not result
    assert hint in result.message, result.message
    assert "used key/value head" in result.message, result.message


def test_gqa_repeat_message_names_query_head_1():
    # first case: 4 query heads, 2 key/value heads; tiled, query head 1 reads kv head 1, not 0
    message = ch03.check_grouped_query_attention(gqa_repeat, verbose=False).message
    assert "query head 1 used key/value head 1" in message, message
    assert "group 0" in message, message


def test_gqa_message_has_no_hint_for_a_scale_slip():
    message = ch03.check_grouped_query_attention(gqa_scaled_by_d_model, verbose=False).message
    assert "used key/value head" not in message, message


def fused_q_k_v_swapped(qkv, num_heads):
    # the right split, but the blocks of each head read as (k, q, v)
    q, k, v = fused_correct(qkv, num_heads)
    return k, q, v


def test_split_fused_qkv_rejects_swapped_blocks():
    assert not ch03.check_split_fused_qkv(fused_q_k_v_swapped, verbose=False)


def fused_k_v_swapped(qkv, num_heads):
    # the right split, but k and v returned in each other's place
    q, k, v = fused_correct(qkv, num_heads)
    return q, v, k


@pytest.mark.parametrize(
    "wrong, named", [(fused_k_v_swapped, "(q, v, k)"), (fused_q_k_v_swapped, "(k, q, v)")]
)
def test_split_fused_qkv_names_blocks_returned_in_another_order(wrong, named):
    result = ch03.check_split_fused_qkv(wrong, verbose=False)
    assert not result
    assert f"you returned {named} in place of (q, k, v)" in result.message, result.message


def test_split_fused_qkv_no_order_hint_for_a_wrong_split():
    for wrong in (fused_chunk_first, fused_without_transpose, fused_heads_interleaved):
        message = ch03.check_split_fused_qkv(wrong, verbose=False).message
        assert "in place of (q, k, v)" not in message, message


def test_gqa_names_the_scale_d_model():
    message = ch03.check_grouped_query_attention(gqa_scaled_by_d_model, verbose=False).message
    assert "the scale 1/√d_model" in message and "1/√d_k" in message, message


def test_gqa_no_scale_hint_for_a_grouping_slip():
    for wrong in (gqa_repeat, gqa_kv_head_r_over_g, gqa_only_first_kv_head):
        message = ch03.check_grouped_query_attention(wrong, verbose=False).message
        assert "the scale 1/√d_model" not in message, message


def test_multi_head_attention_gates_on_scores_hint_only_for_that_slip():
    for wrong in (mha_gates_ignored, mha_gates_on_w_o_columns):
        message = ch03.check_multi_head_attention(wrong, verbose=False).message
        assert "multiplied into the scores" not in message, message


# --------------------------------------------------------------------------------------------
# exercise 1 (multi-head attention with d_k != d_v): more slips, and the messages
# --------------------------------------------------------------------------------------------


def mha_merge_without_transpose(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # splits and gates right, but glues the heads back with a reshape that skips transpose(1, 2)
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    per_head = (weights @ v) * head_gates[:, None, None]  # (batch, h, q_len, d_v)
    batch, _, q_len, d_v = per_head.shape
    return per_head.reshape(batch, q_len, num_heads * d_v) @ w_o, weights


def mha_scaled_by_d_v(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # the width of the values, not of the queries and keys that the dot product multiplies
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1]), dim=-1)
    return _merge(weights @ v) @ w_o, weights


def _gated_heads(query, key, value, w_q, w_k, w_v, num_heads, gate):
    """Right split and scale; ``gate(per_head (batch, h, q_len, d_v), weights)`` → per_head."""
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return gate(weights @ v, weights), weights


def mha_gates_repeated(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # gates spread over the concatenation with repeat: feature j gets gate j mod h
    per_head, weights = _gated_heads(
        query, key, value, w_q, w_k, w_v, num_heads, lambda heads, _: heads
    )
    d_v = per_head.shape[-1]
    return (_merge(per_head) * head_gates.repeat(d_v)) @ w_o, weights


def mha_gates_ignored(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # TinyMHA as it stands: every head on
    return gated(mha_loop)(
        query, key, value, w_q, w_k, w_v, w_o, num_heads, torch.ones_like(head_gates)
    )


def mha_gates_on_scores(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # multiplies the scores, inside the softmax: a gate of 0 gives an even average, not nothing
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) * head_gates[:, None, None]
    weights = torch.softmax(scores, dim=-1)
    return _merge(weights @ v) @ w_o, weights


def mha_gated_weights_returned(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # the right output, but returns the gated weights instead of the softmax's
    out, weights = gated(mha_loop)(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates)
    return out, weights * head_gates[:, None, None]


def mha_gates_on_w_o_columns(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # the nn.Linear habit: gates W_O's columns (its rows in storage), which runs when W_O is
    # square and d_model is a multiple of h
    out, weights = mha_loop(query, key, value, w_q, w_k, w_v, w_o, num_heads)
    if w_o.shape[1] % num_heads:
        return out, weights
    d = w_o.shape[1] // num_heads
    gated_w_o = w_o * head_gates.repeat_interleave(d)[None, :]
    return mha_loop(query, key, value, w_q, w_k, w_v, gated_w_o, num_heads)


@pytest.mark.parametrize(
    "wrong",
    [mha_gates_ignored, mha_gates_on_scores, mha_gated_weights_returned, mha_gates_on_w_o_columns],
)
def test_multi_head_attention_rejects_gate_slips(wrong):
    assert not ch03.check_multi_head_attention(wrong, verbose=False)


def test_multi_head_attention_cases_have_unequal_gates_and_a_zero_gate():
    gates = [case["head_gates"] for case in ch03._mha_cases()]
    assert any(bool((g == 0).any()) for g in gates)
    assert any(len(set(g.tolist())) == len(g) > 2 for g in gates)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (mha_merge_without_transpose, "without transpose(1, 2)"),
        (mha_scaled_by_d_v, "1/√d_v"),
        (mha_scaled_by_d_model, "1/√d_model"),
        (mha_unscaled, "no scale"),
        (mha_split_without_transpose, "split by a reshape to (batch, h, len, d_k)"),
        (mha_gates_repeated, "repeat_interleave(d_v)"),
    ],
)
def test_multi_head_attention_rejects_and_names_the_slip(wrong, hint):
    fn = wrong if "head_gates" in wrong.__code__.co_varnames else gated(wrong)
    result = ch03.check_multi_head_attention(fn, verbose=False)
    assert not result
    assert hint in result.message, result.message


def test_multi_head_attention_split_hint_does_not_name_the_merge_slip():
    # the split slip gets its own name, not the merge's (the two reshapes differ)
    message = ch03.check_multi_head_attention(
        gated(mha_split_without_transpose), verbose=False
    ).message
    assert "merged by a reshape" not in message, message


def test_multi_head_attention_names_no_slip_for_an_unrelated_wrong_answer():
    result = ch03.check_multi_head_attention(gated(mha_output_transposed), verbose=False)
    assert not result
    assert "this looks like" not in result.message, result.message


def test_multi_head_attention_cases_have_d_k_different_from_d_v():
    cases = ch03._mha_cases()
    assert any(
        c["w_q"].shape[1] // c["num_heads"] != c["w_v"].shape[1] // c["num_heads"] for c in cases
    )


def test_a_stub_is_reported_not_raised():
    def stub(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
        raise NotImplementedError

    result = ch03.check_multi_head_attention(stub, verbose=False)
    assert not result and "not attempted yet" in result.message, result.message


# --------------------------------------------------------------------------------------------
# messages report the largest difference, not the first one
# --------------------------------------------------------------------------------------------


def test_gqa_message_reports_the_largest_difference():
    case = ch03._gqa_cases()[0]
    expected = ch03.reference_grouped_query_attention(**case)
    got = gqa_repeat(**case)
    largest = (got - expected).abs().max().item()
    message = ch03.check_grouped_query_attention(gqa_repeat, verbose=False).message
    assert "the largest difference" in message, message
    assert f"off by {largest:.3g}" in message, message
    assert largest > 1.0, largest  # the first differing entry is off by about 1e-4


def test_permute_message_reports_the_largest_difference():
    case = ch03._permute_cases()[0]
    layer = {k: case[k] for k in ("w_q", "w_k", "w_v", "w_o", "num_heads")}
    before_out, before_w = ch03.reference_multi_head_attention(
        case["query"], case["key"], case["key"], **layer
    )
    w_q, w_k, w_v, w_o = permute_only_queries_and_keys(**layer, order=case["order"])
    _, weights = ch03.reference_multi_head_attention(
        case["query"], case["key"], case["key"], w_q, w_k, w_v, w_o, case["num_heads"]
    )
    expected_w = before_w[:, case["order"]]
    assert torch.allclose(weights, expected_w, atol=1e-5)  # the maps move: the output is wrong
    out, _ = ch03.reference_multi_head_attention(
        case["query"], case["key"], case["key"], w_q, w_k, w_v, w_o, case["num_heads"]
    )
    largest = (out - before_out).abs().max().item()
    message = ch03.check_permute_heads(permute_only_queries_and_keys, verbose=False).message
    assert "case 1 is wrong" in message, message
    assert "the largest difference" in message, message
    assert f"off by {largest:.3g}" in message, message


def test_compare_picks_the_largest_entry_and_nan():
    from companion.exercises import compare

    expected = torch.zeros(2, 3)
    got = expected.clone()
    got[0, 0], got[1, 2] = 1e-3, 5.0
    assert "index (1, 2)" in compare(expected, got)
    got[0, 1] = float("nan")
    assert "index (0, 1)" in compare(expected, got)
    assert compare((expected,), (expected.clone(),)) is None
    assert "wrong shape" in compare(expected, torch.zeros(3, 2))


def fused_no_transpose_at_all(qkv, num_heads):
    # view into heads, then chunk: (batch, len, heads, d_k), the right shape only where len = heads
    batch, length, width = qkv.shape
    return tuple(qkv.view(batch, length, num_heads, width // num_heads).chunk(3, dim=-1))


def test_split_fused_qkv_rejects_a_split_with_no_transpose_at_all():
    assert not ch03.check_split_fused_qkv(fused_no_transpose_at_all, verbose=False)
    # and it is rejected on values, not only on shapes, in the cases where len = heads
    square = [c for c in ch03._fused_cases() if c["qkv"].shape[1] == c["num_heads"]]
    assert square
    for case in square:
        got = fused_no_transpose_at_all(**case)
        right = ch03.reference_split_fused_qkv(**case)
        assert got[0].shape == right[0].shape
        assert not torch.allclose(got[0], right[0])


def test_head_score_matrices_runs_on_a_given_layer():
    """With ``attention=``, the layer's own weights are one more case: an answer that is right
    only on the random cases' sizes passes without it and fails with it."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 16)  # the sizes of the chapter's counters[16].attention
    reference = ch03.reference_head_score_matrices
    without = ch03.check_head_score_matrices(reference, verbose=False)
    result = ch03.check_head_score_matrices(reference, verbose=False, attention=layer)
    assert result and result.cases_run == without.cases_run + 1, result.message

    def right_but_not_for_32(w_q, w_k, num_heads):
        forms = ch03.reference_head_score_matrices(w_q, w_k, num_heads)
        return forms.transpose(-2, -1) if w_q.shape[0] == 32 else forms

    assert ch03.check_head_score_matrices(right_but_not_for_32, verbose=False)
    wrong = ch03.check_head_score_matrices(right_but_not_for_32, verbose=False, attention=layer)
    assert not wrong and "the transpose" in wrong.message, wrong.message


def test_head_score_matrices_refuses_a_bad_layer():
    with pytest.raises(
        TypeError, match=r"attention: expected a companion MultiHeadAttention.*got str"
    ):
        ch03.check_head_score_matrices(ch03.reference_head_score_matrices, attention="layer")
    grouped = MultiHeadAttention(32, 16, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"attention: expected one key head per query head"):
        ch03.check_head_score_matrices(ch03.reference_head_score_matrices, attention=grouped)


def mha_scaled_by_true_d_model(query, key, value, w_q, w_k, w_v, w_o, num_heads):
    # 1/√d_model with d_model read off the input (not off w_q)
    q, k, v = (
        _split(query @ w_q, num_heads),
        _split(key @ w_k, num_heads),
        _split(value @ w_v, num_heads),
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    return _merge(weights @ v) @ w_o, weights


def test_scale_hint_says_d_model_and_h_d_k_coincide_when_they_do():
    # case 1 has d_model = h·d_k = 12: a scale by either width is named with both
    for wrong in (mha_scaled_by_d_model, mha_scaled_by_true_d_model):
        result = ch03.check_multi_head_attention(gated(wrong), verbose=False)
        assert not result and result.cases_run == 1, result.message
        assert "1/√d_model (= 1/√(h·d_k) in this case" in result.message, result.message


def test_scale_hint_names_h_d_k_where_it_differs_from_d_model():
    case = ch03._mha_cases()[2]  # d_model = 8, h·d_k = 6
    got = (ch03._mha_variant(case, scale_width="h·d_k"), None)
    hint = ch03._mha_hint(case, got)
    assert "1/√(h·d_k), the width of all heads together" in hint, hint
    assert "1/√d_model" not in hint, hint


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (mha_gates_on_w_o_columns, "the gates put on the columns of W_O"),
        (mha_gates_ignored, "the gates ignored"),
        (mha_gates_on_scores, "the gates multiplied into the scores"),
    ],
)
def test_multi_head_attention_names_the_gate_slips(wrong, hint):
    result = ch03.check_multi_head_attention(wrong, verbose=False)
    assert not result
    assert hint in result.message, result.message


def mha_view_with_d_model_over_h(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # TinyMHA's habit d_k = d_v = d_model // h inside .view: raises where h·d_k != d_model
    batch, q_len, d_model = query.shape
    k_len, d = key.shape[1], d_model // num_heads
    q = (query @ w_q).view(batch, q_len, num_heads, d).transpose(1, 2)
    k = (key @ w_k).view(batch, k_len, num_heads, d).transpose(1, 2)
    v = (value @ w_v).view(batch, k_len, num_heads, d).transpose(1, 2)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
    heads = weights @ v * head_gates[:, None, None]
    return heads.transpose(1, 2).reshape(batch, q_len, -1) @ w_o, weights


def gqa_view_with_d_model_over_h(query, key, value, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    batch, q_len, d_model = query.shape
    k_len, d = key.shape[1], d_model // num_heads
    q = (query @ w_q).view(batch, q_len, num_heads, d).transpose(1, 2)
    k = (key @ w_k).view(batch, k_len, num_kv_heads, d).transpose(1, 2)
    v = (value @ w_v).view(batch, k_len, num_kv_heads, d).transpose(1, 2)
    group = num_heads // num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
    return _merge(weights @ v) @ w_o


@pytest.mark.parametrize(
    "check, wrong, hint",
    [
        (
            ch03.check_multi_head_attention,
            mha_view_with_d_model_over_h,
            "read d_k and d_v off the weights (w_q.shape[1] // num_heads, w_v.shape[1]",
        ),
        (
            ch03.check_grouped_query_attention,
            gqa_view_with_d_model_over_h,
            "read d_k off the weights (w_q.shape[1] // num_heads)",
        ),
    ],
)
def test_a_raise_from_d_model_over_h_gets_the_width_hint(check, wrong, hint):
    result = check(wrong, verbose=False)
    assert not result and "raised" in result.message, result.message
    assert hint in result.message, result.message


def test_no_width_hint_for_a_raise_where_the_widths_are_d_model_over_h():
    def raises(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
        raise RuntimeError("boom")

    result = ch03.check_multi_head_attention(raises, verbose=False)
    assert not result and result.cases_run == 1, result.message
    assert "off the weights" not in result.message, result.message


def test_multi_head_attention_names_the_softmax_over_the_queries():
    result = ch03.check_multi_head_attention(gated(mha_softmax_over_queries), verbose=False)
    assert not result
    assert "softmax over dim=-2, the queries" in result.message, result.message
    # another wrong answer does not get that hint
    other = ch03.check_multi_head_attention(gated(mha_unscaled), verbose=False)
    assert not other and "dim=-2" not in other.message, other.message


def scores_d_k_from_d_model(w_q, w_k, num_heads):
    # TinyMHA's habit d_k = d_model // h: raises where h·d_k != d_model
    d_k = w_q.shape[0] // num_heads
    q = w_q.unflatten(1, (num_heads, d_k)).transpose(0, 1)  # (h, d_model, d_k)
    k = w_k.unflatten(1, (num_heads, d_k)).transpose(0, 1)
    return q @ k.transpose(-2, -1)


def scores_d_k_from_d_model_sliced(w_q, w_k, num_heads):
    # d_k = d_model // h in a loop of slices: no raise, silently wrong where h·d_k != d_model
    d_k = w_q.shape[0] // num_heads
    return torch.stack(
        [
            w_q[:, r * d_k : (r + 1) * d_k] @ w_k[:, r * d_k : (r + 1) * d_k].T
            for r in range(num_heads)
        ]
    )


def test_head_score_matrices_names_slices_of_width_d_model_over_h():
    result = ch03.check_head_score_matrices(scores_d_k_from_d_model_sliced, verbose=False)
    assert not result and "raised" not in result.message, result.message
    assert "heads of width d_model // num_heads = 4: here d_k = 3" in result.message, result.message


def test_head_score_matrices_raise_from_d_model_over_h_gets_the_width_hint():
    result = ch03.check_head_score_matrices(scores_d_k_from_d_model, verbose=False)
    assert not result and "raised" in result.message, result.message
    assert "read d_k off the weights (w_q.shape[1] // num_heads)" in result.message, result.message


def test_head_score_matrices_no_width_hint_for_a_raise_where_d_k_is_d_model_over_h():
    def raises(w_q, w_k, num_heads):
        raise RuntimeError("boom")

    result = ch03.check_head_score_matrices(raises, verbose=False)
    assert not result and result.cases_run == 1, result.message
    assert "off the weights" not in result.message, result.message


def permute_blocks_of_d_model_over_h_sliced(w_q, w_k, w_v, w_o, num_heads, order):
    # blocks of width d_model // h by slicing: no raise, silently wrong where d_k, d_v differ
    width = w_q.shape[0] // num_heads

    def columns(w):
        return torch.cat([w[:, r * width : (r + 1) * width] for r in order], 1)

    return (
        columns(w_q),
        columns(w_k),
        columns(w_v),
        torch.cat([w_o[r * width : (r + 1) * width] for r in order], 0),
    )


def permute_blocks_of_d_model_over_h_unflatten(w_q, w_k, w_v, w_o, num_heads, order):
    # unflatten with d_model // h: raises where h·d_k != d_model
    width, index = w_q.shape[0] // num_heads, torch.tensor(order)

    def columns(w):
        return w.unflatten(1, (num_heads, width))[:, index].flatten(1)

    return (
        columns(w_q),
        columns(w_k),
        columns(w_v),
        w_o.unflatten(0, (num_heads, width))[index].flatten(0, 1),
    )


@pytest.mark.parametrize(
    "wrong",
    [permute_blocks_of_d_model_over_h_sliced, permute_blocks_of_d_model_over_h_unflatten],
)
def test_permute_heads_names_blocks_of_width_d_model_over_h(wrong):
    result = ch03.check_permute_heads(wrong, verbose=False)
    assert not result and result.cases_run == 3, result.message
    assert "not d_model // num_heads" in result.message, result.message


def test_permute_heads_no_width_hint_for_other_slips():
    assert ch03.check_permute_heads(ch03.reference_permute_heads, verbose=False)
    for wrong in (permute_forgets_w_o, permute_inverse, permute_strided_blocks):
        result = ch03.check_permute_heads(wrong, verbose=False)
        assert not result and "d_model // num_heads" not in result.message, result.message


# --------------------------------------------------------------------------------------------
# blend_separable (exercise 3): can one head's blend be taken apart?
# --------------------------------------------------------------------------------------------


def separable_correct(weights, tol):
    totals = sorted(
        sum(w * b for w, b in zip(weights.tolist(), bits))
        for bits in itertools.product((0, 1), repeat=len(weights))
    )
    return all(b - a > tol for a, b in zip(totals, totals[1:]))


def separable_with_tensors(weights, tol):
    k = len(weights)
    bits = torch.tensor(list(itertools.product((0, 1), repeat=k)), dtype=weights.dtype)  # (2^k, k)
    totals = (bits @ weights).sort().values
    return bool((totals.diff() > tol).all())  # a bool, not a tensor: either is accepted


def separable_weights_differ(weights, tol):
    # only the weights one by one: misses 0.4 + 0.1 = 0.3 + 0.2
    ordered = sorted(weights.tolist())
    return all(b - a > tol for a, b in zip(ordered, ordered[1:]))


def separable_each_outweighs_lighter(weights, tol):
    # sufficient, not necessary: rejects (0.45, 0.3, 0.17, 0.08), whose totals all differ
    ordered = sorted(weights.tolist(), reverse=True)
    return all(w > sum(ordered[i + 1 :]) + tol for i, w in enumerate(ordered[:-1])) and (
        ordered[-1] > tol
    )


def separable_ignores_tol(weights, tol):
    totals = sorted(
        sum(w * b for w, b in zip(weights.tolist(), bits))
        for bits in itertools.product((0, 1), repeat=len(weights))
    )
    return all(b - a > 1e-9 for a, b in zip(totals, totals[1:]))


def separable_same_size_only(weights, tol):
    # compares subsets of the same size only: misses 0.5 = 0.3 + 0.2
    values = weights.tolist()
    for size in range(1, len(values) + 1):
        totals = sorted(sum(c) for c in itertools.combinations(values, size))
        if any(b - a <= tol for a, b in zip(totals, totals[1:])):
            return False
    return True


def separable_unsorted_neighbours(weights, tol):
    # neighbouring totals in product order, not sorted: misses 0.4 + 0.1 = 0.35 + 0.15
    totals = [
        sum(w * b for w, b in zip(weights.tolist(), bits))
        for bits in itertools.product((0, 1), repeat=len(weights))
    ]
    return all(abs(b - a) > tol for a, b in zip(totals, totals[1:]))


def separable_at_least_tol(weights, tol):
    # ">= tol" for "more than tol": accepts (0.5, 0.25) at tol 0.25, whose totals are exactly tol apart
    totals = sorted(
        sum(w * b for w, b in zip(weights.tolist(), bits))
        for bits in itertools.product((0, 1), repeat=len(weights))
    )
    return all(b - a >= tol for a, b in zip(totals, totals[1:]))


def separable_buckets(weights, tol):
    # totals rounded to multiples of tol: 0.5 and 0.506 land in buckets 50 and 51
    totals = [
        sum(w * b for w, b in zip(weights.tolist(), bits))
        for bits in itertools.product((0, 1), repeat=len(weights))
    ]
    return len({round(t / tol) for t in totals}) == len(totals)


def test_blend_separable_accepts_correct():
    assert ch03.check_blend_separable(separable_correct, verbose=False)
    assert ch03.check_blend_separable(separable_with_tensors, verbose=False)
    assert ch03.check_blend_separable(
        lambda weights, tol: torch.tensor(ch03.reference_blend_separable(weights, tol)),
        verbose=False,
    )
    # NumPy's bool (np.all's result; named bool_ before NumPy 2) is a right answer too
    assert ch03.check_blend_separable(
        lambda weights, tol: np.bool_(ch03.reference_blend_separable(weights, tol)),
        verbose=False,
    )


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (separable_weights_differ, "not the weights one by one"),
        (separable_each_outweighs_lighter, "need not outweigh all lighter ones"),
        (separable_ignores_tol, "no more than tol apart"),
        (separable_same_size_only, "no more than tol apart"),
        (separable_unsorted_neighbours, "once sorted, neighbours are enough"),
        (separable_buckets, "different buckets of width tol"),
        (separable_at_least_tol, "use >, not >="),
        (lambda weights, tol: True, "expected False"),
        (lambda weights, tol: False, "expected True"),
        (lambda weights, tol: 0.5, "return True or False"),
    ],
)
def test_blend_separable_rejects_wrong(wrong, hint):
    result = ch03.check_blend_separable(wrong, verbose=False)
    assert not result
    assert hint in result.message, result.message


def test_blend_separable_at_least_tol_is_not_blamed_on_buckets():
    """Totals exactly tol apart are not MORE than tol apart: the '>= tol' slip gets the plain
    message, not the rounding-into-buckets one (review s10rv03b)."""
    result = ch03.check_blend_separable(separable_at_least_tol, verbose=False)
    assert not result
    assert "buckets" not in result.message, result.message
    # ... and is told the slip itself, not the advice for comparing weights one by one
    assert "one by one" not in result.message, result.message


def test_blend_separable_cases_have_both_verdicts_and_a_tol_that_matters():
    cases = ch03._separable_cases()
    verdicts = [ch03.reference_blend_separable(**case) for case in cases]
    assert True in verdicts and False in verdicts
    same = [c for c in cases if c["weights"].tolist() == [0.5, 0.3, 0.205]]
    assert sorted(ch03.reference_blend_separable(**c) for c in same) == [False, True]


def test_blend_separable_reports_a_stub():
    def stub(weights, tol):
        raise NotImplementedError

    result = ch03.check_blend_separable(stub, verbose=False)
    assert not result


# --------------------------------------------------------------------------------------------
# review s11rv03: the slips its wrong answers found
# --------------------------------------------------------------------------------------------


def separable_forgets_the_full_set(weights, tol):
    # subsets of sizes 1 to k - 1 (range(1, k)): misses {0.995, 0.005} against {0.995}
    values = weights.tolist()
    totals = sorted(
        sum(c) for r in range(1, len(values)) for c in itertools.combinations(values, r)
    )
    return all(b - a > tol for a, b in zip(totals, totals[1:]))


def separable_non_empty_subsets(weights, tol):
    # a right answer: the empty subset left out (the solution says it may be)
    values = weights.tolist()
    totals = sorted(
        sum(c) for r in range(1, len(values) + 1) for c in itertools.combinations(values, r)
    )
    return all(b - a > tol for a, b in zip(totals, totals[1:]))


def test_blend_separable_rejects_a_forgotten_full_set_and_accepts_non_empty_subsets():
    result = ch03.check_blend_separable(separable_forgets_the_full_set, verbose=False)
    assert not result and "expected False" in result.message, result.message
    # the subsets named are two the slip compares, not the empty one it may leave out
    assert "{0.995} and {0.995, 0.005}" in result.message, result.message
    # ... and the message names the slip (review s11rv03c)
    assert "the full set of lookups is a subset too" in result.message, result.message
    assert "one by one" not in result.message, result.message
    assert ch03.check_blend_separable(separable_non_empty_subsets, verbose=False)


def permute_w_o_rows_in_blocks_of_d_k(w_q, w_k, w_v, w_o, num_heads, order):
    # W_Q, W_K, W_V right, W_O's rows cut in blocks of d_k (W_Q's width) instead of d_v
    q, k, v, _ = ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, order)
    d_k = w_q.shape[1] // num_heads
    moved = torch.cat([w_o[r * d_k : (r + 1) * d_k] for r in order] + [w_o[num_heads * d_k :]])
    return q, k, v, moved


def test_permute_heads_names_w_o_rows_in_blocks_of_d_k():
    result = ch03.check_permute_heads(permute_w_o_rows_in_blocks_of_d_k, verbose=False)
    assert not result and result.cases_run == 3, result.message
    assert "W_O's rows cut in blocks of d_k" in result.message, result.message
    assert "not d_model // num_heads" not in result.message, result.message


def mha_gates_w_o_in_place(query, key, value, w_q, w_k, w_v, w_o, num_heads, head_gates):
    # the right output, but the caller's w_o is gated in place
    w_o *= head_gates.repeat_interleave(w_o.shape[0] // num_heads)[:, None]
    return ch03.reference_multi_head_attention(query, key, value, w_q, w_k, w_v, w_o, num_heads)


def test_multi_head_attention_notes_an_input_changed_in_place():
    result = ch03.check_multi_head_attention(mha_gates_w_o_in_place, verbose=False)
    assert result and "changed its input w_o in place" in result.message, result.message
    plain = ch03.check_multi_head_attention(ch03.reference_multi_head_attention, verbose=False)
    assert plain and "in place" not in plain.message, plain.message


def separable_normalised_first(weights, tol):
    # the weights rescaled to sum 1 first: stretches every gap when they sum to less
    totals = sorted(
        sum(w * b for w, b in zip((weights / weights.sum()).tolist(), bits))
        for bits in itertools.product((0, 1), repeat=len(weights))
    )
    return all(b - a > tol for a, b in zip(totals, totals[1:]))


def test_blend_separable_names_normalised_weights():
    """Review s12rv03b: an answer that normalises the weights first was rejected with the '>='
    hint; a case whose weights sum to 0.5 now rejects it first, with its own hint."""
    cases = ch03._separable_cases()
    half = [c for c in cases if c["weights"].tolist() == [0.26, 0.13, 0.07, 0.04]]
    assert len(half) == 1 and not ch03.reference_blend_separable(**half[0])
    assert ch03.reference_blend_separable(half[0]["weights"] * 2, half[0]["tol"])  # normalised
    result = ch03.check_blend_separable(separable_normalised_first, verbose=False)
    assert not result and "use the weights as given" in result.message, result.message
    assert ">=" not in result.message, result.message
    # the '>=' slip still gets its own hint, not this one
    result = ch03.check_blend_separable(separable_at_least_tol, verbose=False)
    assert "use >, not >=" in result.message and "as given" not in result.message, result.message


def permute_heads_zeroes_w_q_in_place(w_q, w_k, w_v, w_o, num_heads, order):
    # the right weights, but the caller's w_q is zeroed in place afterwards
    new = ch03.reference_permute_heads(w_q, w_k, w_v, w_o, num_heads, order)
    w_q.zero_()
    return new


def test_permute_heads_notes_an_input_changed_in_place():
    result = ch03.check_permute_heads(permute_heads_zeroes_w_q_in_place, verbose=False)
    assert result and "changed its input w_q in place" in result.message, result.message
    plain = ch03.check_permute_heads(ch03.reference_permute_heads, verbose=False)
    assert plain and "in place" not in plain.message, plain.message
