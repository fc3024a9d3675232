"""Grouped-query and multi-query attention: ``MultiHeadAttention(num_kv_heads=...)``.

References: ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` on the
module's own projections, and a multi-head module whose key/value weights are the grouped
ones repeated per group. Float64 comparisons hold to 1e-12, float32 to 1e-6.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import max_abs_diff, randomize_, tiny_transformer

from companion.attention import KeyValueCache, MultiHeadAttention, repeat_kv_heads
from companion.decode import beam_search, greedy_decode
from companion.interop import copy_to_torch, load_from_torch, to_torch
from companion.masking import causal_mask
from companion.model import TransformerConfig
from companion.utils import count_parameters

D_MODEL, HEADS = 32, 8
TOL = {torch.float64: 1e-12, torch.float32: 1e-6}


def grouped(num_kv_heads: int, dtype: torch.dtype = torch.float64, seed: int = 0, **options):
    """A ``MultiHeadAttention(32, 8, num_kv_heads=...)`` with random weights and biases."""
    torch.manual_seed(seed)
    attention = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=num_kv_heads, **options)
    return randomize_(attention.to(dtype), torch.Generator().manual_seed(seed), std=0.1).eval()


def inputs(dtype: torch.dtype, batch: int = 3, length: int = 6, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, D_MODEL, generator=generator).to(dtype)


def padding(batch: int = 3, length: int = 6) -> torch.Tensor:
    """``(batch, 1, 1, length)``: sequence 1 has 2 padded keys, sequence 2 has 4."""
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[1, ..., -2:] = False
    mask[2, ..., -4:] = False
    return mask


def reference_output(attention, x, mask=None, is_causal=False):
    """torch's kernel with enable_gqa=True on the module's projections, then ``out_proj``."""
    q = attention.split_heads(attention.query_proj(x))  # (batch, heads, len, head_dim)
    kv_heads = attention.num_kv_heads
    k = attention.split_heads(attention.key_proj(x), kv_heads)  # (batch, kv_heads, len, hd)
    v = attention.split_heads(attention.value_proj(x), kv_heads)  # (batch, kv_heads, len, hd)
    if is_causal:
        causal = causal_mask(x.shape[1])  # (len, len)
        mask = causal if mask is None else mask & causal
    per_head = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return attention.out_proj(attention.merge_heads(per_head))  # (batch, len, d_model)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "padding+causal"])
def test_matches_torch_sdpa_with_enable_gqa(num_kv_heads, dtype, masks):
    """Catches a wrong pairing of query and key/value heads (e.g. ``h % kv_heads``, which
    ``repeat`` gives) and a wrong split of the fused q/k/v product (``chunk(3)`` on unequal
    sizes cannot even run)."""
    attention, x = grouped(num_kv_heads, dtype), inputs(dtype)
    mask = padding() if "padding" in masks else None
    is_causal = "causal" in masks
    expected = reference_output(attention, x, mask, is_causal)
    got, _ = attention(x, x, x, mask, is_causal=is_causal)  # fused projections, fast path
    assert max_abs_diff(got, expected) <= TOL[dtype]


def repeated_mha(attention: MultiHeadAttention, tile: bool = False) -> MultiHeadAttention:
    """A multi-head module with the same weights, key/value heads repeated per group
    (``repeat_interleave``; ``tile=True`` repeats the whole stack instead: the wrong way)."""
    group = attention.num_heads // attention.num_kv_heads
    mha = MultiHeadAttention(D_MODEL, HEADS).to(attention.out_proj.weight.dtype).eval()
    with torch.no_grad():
        for name in ("query_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(attention, name).state_dict())
        for name in ("key_proj", "value_proj"):
            ours, theirs = getattr(attention, name), getattr(mha, name)
            for param in ("weight", "bias"):
                heads = getattr(ours, param).unflatten(0, (attention.num_kv_heads, -1))
                if tile:
                    per_head = heads.repeat(group, *([1] * (heads.dim() - 1)))
                else:
                    per_head = heads.repeat_interleave(group, dim=0)
                getattr(theirs, param).copy_(per_head.flatten(0, 1))
    return mha


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_equals_multi_head_attention_with_key_value_heads_repeated_per_group(num_kv_heads, dtype):
    attention, x = grouped(num_kv_heads, dtype, seed=2), inputs(dtype, seed=3)
    memory = inputs(dtype, length=4, seed=4)
    for args in ((x, x, x), (x, memory, memory)):  # self- and cross-attention
        got, _ = attention(*args, is_causal=args[1] is x)
        expected, _ = repeated_mha(attention)(*args, is_causal=args[1] is x)
        assert max_abs_diff(got, expected) <= TOL[dtype]
        if num_kv_heads == 2:  # the test can fail: tiling pairs the heads differently
            tiled, _ = repeated_mha(attention, tile=True)(*args, is_causal=args[1] is x)
            assert max_abs_diff(got, tiled) > 1e-3


def test_repeat_kv_heads_uses_repeat_interleave_on_the_head_axis():
    """Query head h reads key/value head h // group (catches ``repeat``, which gives h % kv)."""
    x = torch.arange(2 * 3 * 1 * 1, dtype=torch.float64).reshape(2, 3, 1, 1)  # 3 kv heads
    out = repeat_kv_heads(x, 6)  # (2, 6, 1, 1)
    assert out[0, :, 0, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert torch.equal(out, torch.repeat_interleave(x, 2, dim=1))
    assert repeat_kv_heads(x, 3) is x  # one head per query head: nothing to repeat


@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "padding+causal"])
def test_need_weights_path_equals_the_fast_path(num_kv_heads, masks):
    """Catches an explicit path that forgets to repeat the key/value heads (it cannot run) or
    repeats them differently from the fused kernel's grouping."""
    attention, x = grouped(num_kv_heads), inputs(torch.float64, seed=5)
    mask = padding() if "padding" in masks else None
    is_causal = "causal" in masks
    fast, none = attention(x, x, x, mask, is_causal=is_causal)
    explicit, weights = attention(x, x, x, mask, is_causal=is_causal, need_weights=True)
    assert none is None and weights.shape == (3, HEADS, 6, 6)
    assert max_abs_diff(fast, explicit) <= 1e-12
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, HEADS, 6, dtype=torch.float64))


def test_fully_masked_rows_are_zero_not_nan():
    attention, x = grouped(2), inputs(torch.float64, seed=6)
    mask = padding()
    mask[0] = False  # sequence 0: no key at all
    for need_weights in (False, True):
        out, _ = attention(x, x, x, mask, need_weights=need_weights)
        assert torch.isfinite(out).all()
        assert (out[0] == 0).all() and (out[1:].abs().amax(-1) > 0).all()


@pytest.mark.parametrize("kind", ["padding", "causal"])
def test_cpu_dropout_path_is_attention_when_nothing_is_dropped(kind, monkeypatch):
    """The CPU training path with dropout repeats the key/value heads itself; with dropout
    made the identity it equals eval-mode attention, with real dropout it differs."""
    import companion.kernels as kernels_module

    attention = grouped(2, torch.float32, dropout=0.3)
    q = torch.randn(3, HEADS, 5, 4)  # (batch, heads, len, head_dim)
    k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)  # (batch, kv_heads, len, head_dim)
    mask, is_causal = (padding(3, 5), False) if kind == "padding" else (None, True)
    expected, _ = attention.eval().attend(q, k, v, mask, is_causal=is_causal)
    monkeypatch.setattr(  # every factor 1: dropout made the identity
        kernels_module, "dropout_factor", lambda weights, p: torch.ones_like(weights)
    )
    got, _ = attention.train().attend(q, k, v, mask, is_causal=is_causal)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    monkeypatch.undo()
    dropped, _ = attention.train().attend(q, k, v, mask, is_causal=is_causal)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, expected)


# ------------------------------------------------------------------------- the cache


@pytest.mark.parametrize("num_kv_heads", [1, 2, 8])
def test_cache_holds_only_the_key_value_heads_and_steps_equal_full_attention(num_kv_heads):
    attention, x = grouped(num_kv_heads), inputs(torch.float64, seed=7)
    full, _ = attention(x, x, x, is_causal=True)
    cache = KeyValueCache()
    steps = [attention(*[x[:, t : t + 2]] * 3, is_causal=True, cache=cache)[0]
             for t in range(0, 6, 2)]  # fmt: skip
    assert cache.keys.shape == cache.values.shape == (3, num_kv_heads, 6, D_MODEL // HEADS)
    # 2 tensors · batch 3 · kv_heads · 6 positions · head_dim 4 · 8 bytes (float64)
    assert cache.nbytes == 2 * 3 * num_kv_heads * 6 * 4 * 8
    assert max_abs_diff(torch.cat(steps, dim=1), full) <= 1e-12


def test_cross_attention_cache_holds_the_projected_memory_once():
    attention = grouped(2)
    x, memory = inputs(torch.float64, seed=8), inputs(torch.float64, length=4, seed=9)
    full, _ = attention(x, memory, memory)
    cache = KeyValueCache(growing=False)
    steps = [attention(x[:, t : t + 1], memory, memory, cache=cache)[0] for t in range(6)]
    assert cache.keys.shape == (3, 2, 4, 4)
    assert max_abs_diff(torch.cat(steps, dim=1), full) <= 1e-12


def test_a_cache_with_the_wrong_number_of_heads_is_refused():
    attention, x = grouped(2), inputs(torch.float64)
    cache = KeyValueCache()
    grouped(8)(x, x, x, cache=cache)  # filled by a module with 8 key/value heads
    with pytest.raises(ValueError, match=r"cache must hold keys of shape \(3, 2, len, 4\)"):
        attention(x, x, x, cache=cache)


def test_decoder_cache_bytes_per_token_for_mha_gqa_mqa():
    """The cache grows by 2 · layers · kv_heads · head_dim numbers per token and sentence."""
    growth = {}
    for num_kv_heads in (8, 2, 1):  # MHA, GQA, MQA
        model = tiny_transformer(20, num_layers=2, num_heads=8, pad_id=None,
                                 num_kv_heads=num_kv_heads).eval()  # fmt: skip
        src = torch.randint(3, 20, (2, 5))
        memory = model.encode(src)
        cache = model.new_cache()
        sizes = []
        for t in range(4):
            model.decode(torch.randint(3, 20, (2, 1)), memory, cache=cache)
            layer = cache.layers[0]
            assert layer.self_attention.keys.shape == (2, num_kv_heads, t + 1, 4)
            assert layer.cross_attention.keys.shape == (2, num_kv_heads, 5, 4)
            sizes.append(cache.nbytes)
        growth[num_kv_heads] = {b - a for a, b in zip(sizes, sizes[1:])}
        # 2 (k and v) · 2 layers · kv_heads · head_dim 4 · 4 bytes · batch 2, every step
        assert growth[num_kv_heads] == {2 * 2 * num_kv_heads * 4 * 4 * 2}
        cross = sum(layer.cross_attention.nbytes for layer in cache.layers)
        assert cross == 2 * 2 * num_kv_heads * 5 * 4 * 4 * 2 and cache.nbytes == sizes[-1]
    assert growth[8] == {4 * x for x in growth[2]} and growth[8] == {8 * x for x in growth[1]}


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_transformer_cached_decoding_equals_decoding_the_whole_prefix(num_kv_heads):
    model = tiny_transformer(20, num_layers=2, num_kv_heads=num_kv_heads).double().eval()
    src = torch.randint(3, 20, (3, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 20, (3, 6))
    tgt[2, 4:] = 0  # padding inside the target too: the cache must remember it
    with torch.no_grad():
        src_mask = model.make_src_mask(src)
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)  # (3, 6, 20)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(6)]
    assert max_abs_diff(torch.cat(steps, dim=1), full) <= 1e-12


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_greedy_with_and_without_cache_and_beam_search(num_kv_heads):
    model = tiny_transformer(20, num_layers=2, num_kv_heads=num_kv_heads, seed=3)
    with torch.no_grad():
        model.generator.bias[2] = 1.0  # <eos> likely enough that sentences end
    src = torch.randint(3, 20, (4, 7))
    src[1, 3:] = 0
    cached = greedy_decode(model, src, max_len=10, use_cache=True)
    assert torch.equal(cached, greedy_decode(model, src, max_len=10, use_cache=False))
    # a beam of one is greedy; a wider beam reorders the (grouped) caches at every step
    assert torch.equal(beam_search(model, src, beam_size=1, max_len=10), cached)
    wide = beam_search(model, src, beam_size=3, max_len=10)
    assert wide.shape[0] == 4 and wide.dtype == torch.long


# ------------------------------------------------------------------------- parameters


def test_num_kv_heads_equal_to_num_heads_is_the_multi_head_module():
    """Same parameter names, shapes and initial values: old checkpoints load."""
    torch.manual_seed(0)
    old = MultiHeadAttention(D_MODEL, HEADS)
    torch.manual_seed(0)
    new = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=HEADS)
    old_state, new_state = old.state_dict(), new.state_dict()
    assert list(old_state) == list(new_state)
    for name, tensor in old_state.items():
        assert torch.equal(new_state[name], tensor), name
    new.load_state_dict(old_state, strict=True)
    assert repr(new) == repr(old)


@pytest.mark.parametrize(("num_kv_heads", "count"), [(8, 4224), (4, 3168), (2, 2640), (1, 2376)])
def test_parameter_count(num_kv_heads, count):
    """2·d² + 2·d²·g/h weights and 2·d + 2·d·g/h biases (d = 32, h = 8)."""
    attention = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=num_kv_heads)
    assert count_parameters(attention) == count
    head_dim = D_MODEL // HEADS
    assert attention.key_proj.weight.shape == (num_kv_heads * head_dim, D_MODEL)
    assert attention.value_proj.bias.shape == (num_kv_heads * head_dim,)
    no_bias = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=num_kv_heads, bias=False)
    assert count_parameters(no_bias) == 2 * D_MODEL**2 * (1 + num_kv_heads / HEADS)


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0, ValueError, r"num_kv_heads must be >= 1, got 0"),
        (-2, ValueError, r"num_kv_heads must be >= 1, got -2"),
        (3, ValueError, r"num_kv_heads must divide num_heads .* num_heads=8 and num_kv_heads=3"),
        (16, ValueError, r"num_kv_heads must divide num_heads"),
        (2.0, TypeError, r"num_kv_heads must be an int, got float"),
        (True, TypeError, r"num_kv_heads must be an int, got bool"),
        ("2", TypeError, r"num_kv_heads must be an int, got str"),
    ],
)
def test_bad_num_kv_heads(value, error, words):
    with pytest.raises(error, match=words):
        MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=value)
    with pytest.raises(error, match=words):
        TransformerConfig(10, 10, d_model=D_MODEL, num_heads=HEADS, num_kv_heads=value)


def test_split_heads_for_key_value_heads():
    attention = grouped(2)
    x = torch.randn(3, 5, 8, dtype=torch.float64)  # (batch, len, kv_heads · head_dim)
    heads = attention.split_heads(x, 2)  # (3, 2, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:])
    with pytest.raises(ValueError, match=r"x must have shape \(batch, len, 8\)"):
        attention.split_heads(torch.randn(3, 5, 32), 2)


def test_torch_nn_conversion_is_refused():
    """torch.nn.MultiheadAttention has one key/value head per query head."""
    attention = grouped(2)
    words = r"num_kv_heads=2 and num_heads=8 .*grouped-query or multi-query"
    with pytest.raises(ValueError, match=words):
        to_torch(attention)
    torch_attention = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).double()
    with pytest.raises(ValueError, match=words):
        load_from_torch(attention, torch_attention)
    with pytest.raises(ValueError, match=words):
        copy_to_torch(attention, torch_attention)
    model = tiny_transformer(10, num_heads=8, num_kv_heads=1)
    with pytest.raises(
        ValueError, match=r"num_kv_heads=1 .*\(encoder\.layers\.0\.self_attention\)"
    ):
        to_torch(model)
