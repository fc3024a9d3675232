"""MultiHeadLatentAttention: absorbed = naive, the latent cache, causality, parity with
MultiHeadAttention on composed weights, parameter count, gradients, bad input.

Each test says in a comment which plausible wrong code it catches.
"""

import pytest
import torch
from helpers import max_abs_diff, randomize_
from torch.func import functional_call

from companion.attention import MultiHeadAttention
from companion.cache import KeyValueCache, LatentCache
from companion.latent_attention import (
    AbsorbedWeights,
    MultiHeadLatentAttention,
    latent_attention_parameters,
)
from companion.masking import causal_mask

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
MASK_KINDS = ["none", "padding", "causal", "padding+causal", "per-head"]


def make_mla(d_model=12, num_heads=3, d_latent=5, *, bias=True, dtype=torch.float64, seed=0):
    """An MLA in eval mode with every parameter random (biases too), in ``dtype``."""
    torch.manual_seed(seed)
    mla = MultiHeadLatentAttention(d_model, num_heads, d_latent, bias=bias).to(dtype).eval()
    return randomize_(mla, torch.Generator().manual_seed(seed), std=0.4)


def make_mask(kind, batch, heads, q_len, k_len, generator):
    """(mask or None, is_causal) for ``kind``; padding blocks every key of batch row 0."""
    mask, is_causal = None, "causal" in kind
    if "padding" in kind:
        mask = torch.rand(batch, 1, 1, k_len, generator=generator) > 0.3  # (batch, 1, 1, k_len)
        mask[0] = False  # a batch row with no key at all
    if kind == "per-head":  # differs per head and per query: catches heads/queries mixed up
        mask = torch.rand(batch, heads, q_len, k_len, generator=generator) > 0.4
    return mask, is_causal


# ------------------------------------------------------------------ absorbed = naive


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("bias", [False, True])
def test_absorbed_equals_naive(dtype, kind, bias):
    # Catches an absorbed path scaled by 1/√d_latent instead of 1/√head_dim, W_up_k / W_up_v
    # cut into heads along the wrong axis, and a per-head mask flattened in another order than
    # the queries (the "per-head" masks).
    mla = make_mla(bias=bias, dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 12, generator=generator).to(dtype)
    mask, is_causal = make_mask(kind, 2, 3, 6, 6, generator)
    naive, naive_weights = mla(x, mask, is_causal=is_causal)
    absorbed, absorbed_weights = mla(x, mask, is_causal=is_causal, absorbed=True)
    assert naive.shape == absorbed.shape == (2, 6, 12)
    assert naive_weights.shape == absorbed_weights.shape == (2, 3, 6, 6)
    assert max_abs_diff(naive, absorbed) <= TOL[dtype]
    assert max_abs_diff(naive_weights, absorbed_weights) <= TOL[dtype]
    assert naive.abs().max() > 0.1  # a real output, not zeros on both sides


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_absorbed_equals_naive_with_a_cache_and_padding(dtype):
    # Catches an absorbed path that reads only the new latents, or that appends to the cache
    # differently from the naive one (each path keeps its own cache here).
    mla = make_mla(dtype=dtype)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 7, 12, generator=generator).to(dtype)
    padding = torch.rand(2, 1, 1, 7, generator=generator) > 0.3  # (batch, 1, 1, 7)
    padding[:, :, :, 0] = True  # every row keeps a key
    caches = {False: LatentCache(), True: LatentCache()}
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 7)]:  # a prompt, two steps, a chunk of 2
        outputs = {
            absorbed: mla(
                x[:, start:stop],
                padding[..., :stop],
                is_causal=True,
                cache=caches[absorbed],
                absorbed=absorbed,
            )[0]
            for absorbed in (False, True)
        }
        assert max_abs_diff(outputs[False], outputs[True]) <= TOL[dtype]
    assert torch.equal(caches[False].latents, caches[True].latents)


def test_absorbed_weights_reproduce_the_naive_output():
    # The folded matrices, used as AbsorbedWeights documents, give the module's output. Catches
    # a fold with W_o's columns instead of its rows per head, a missing transpose, or a query
    # bias left out of the fold.
    mla = make_mla(d_model=12, num_heads=3, d_latent=5, bias=True)
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    folded = mla.absorbed_weights()
    assert isinstance(folded, AbsorbedWeights)
    assert folded.query.shape == (3, 12, 5) and folded.query_bias.shape == (3, 5)
    assert folded.output.shape == (3, 5, 12)

    latents = mla.latent_proj(x)  # (2, 6, 5)
    blocked = ~causal_mask(6)  # (6, 6)
    output = mla.out_proj.bias.expand(2, 6, 12)  # (2, 6, 12)
    for h in range(3):
        query = x @ folded.query[h] + folded.query_bias[h]  # (2, 6, 5)
        scores = query @ latents.transpose(1, 2) / 4**0.5  # head_dim = 4
        weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)  # (2, 6, 6)
        output = output + (weights @ latents) @ folded.output[h]  # (2, 6, 12)
    expected, _ = mla(x, is_causal=True)
    assert max_abs_diff(output, expected) <= 1e-12

    assert mla.absorbed_weights().query_bias is not None
    assert make_mla(bias=False).absorbed_weights().query_bias is None


# ------------------------------------------------------------------ the cache


@pytest.mark.parametrize("absorbed", [False, True])
def test_cached_decoding_equals_full_causal_attention(absorbed):
    # Catches a cache that restarts at each call (a step would see only itself), that stores
    # the latents before the current step but not the step itself, or that puts the new
    # latents in front of the cached ones (the final chunk of 2 has a causal mask, so the
    # order of the keys matters there).
    mla = make_mla()
    x = torch.randn(2, 8, 12, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    full, _ = mla(x, is_causal=True, absorbed=absorbed)
    cache = LatentCache()
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 6), (6, 8)]:
        step, weights = mla(x[:, start:stop], is_causal=True, cache=cache, absorbed=absorbed)
        assert cache.length == stop and weights.shape == (2, 3, stop - start, stop)
        assert max_abs_diff(step, full[:, start:stop]) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cache_holds_the_latents_and_counts_their_bytes(dtype):
    # Catches a cache of keys and values instead of latents (shape and bytes), and an nbytes
    # that counts numbers instead of bytes.
    d_model, heads, d_latent, batch = 16, 4, 6, 3
    mla = make_mla(d_model, heads, d_latent, dtype=dtype)
    mha = MultiHeadAttention(d_model, heads, bias=False).to(dtype).eval()
    x = torch.randn(batch, 5, d_model, generator=torch.Generator().manual_seed(5)).to(dtype)
    latent_cache, kv_cache = LatentCache(), KeyValueCache(growing=True)
    assert latent_cache.nbytes == 0 and latent_cache.length == 0
    mla(x[:, :2], is_causal=True, cache=latent_cache)
    mla(x[:, 2:], is_causal=True, cache=latent_cache)
    mha(x, x, x, is_causal=True, cache=kv_cache)

    assert latent_cache.latents.shape == (batch, 5, d_latent)
    expected = mla.latent_proj(x)  # (batch, 5, d_latent): the cache holds exactly c = x W_down
    assert max_abs_diff(latent_cache.latents, expected) <= TOL[dtype]
    size = torch.finfo(dtype).bits // 8
    per_token = latent_cache.nbytes / (batch * 5)
    assert per_token == d_latent * size  # 6 numbers per token
    kv_bytes = sum(t.numel() * t.element_size() for t in (kv_cache.keys, kv_cache.values))
    assert kv_bytes / (batch * 5) == 2 * heads * (d_model // heads) * size  # 32 numbers
    assert kv_bytes / latent_cache.nbytes == 2 * d_model / d_latent

    latent_cache.reorder(torch.tensor([2, 0]))  # beams: keep rows 2 and 0
    assert torch.equal(latent_cache.latents, expected[[2, 0]])


# ------------------------------------------------------------------ causality


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("changed", [0, 3, 5])
def test_changing_a_later_token_never_changes_an_earlier_output(absorbed, changed):
    # Catches a missing causal mask, one that is transposed (the future visible, the past
    # hidden), and an off-by-one diagonal. The changed position's own output must change, so
    # the test cannot pass on a module that ignores its input.
    mla = make_mla()
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(2, 6, 12, generator=generator, dtype=torch.float64)
    edited = x.clone()
    edited[:, changed] = torch.randn(2, 12, generator=generator, dtype=torch.float64)
    before, _ = mla(x, is_causal=True, absorbed=absorbed)
    after, _ = mla(edited, is_causal=True, absorbed=absorbed)
    assert max_abs_diff(before[:, :changed], after[:, :changed]) <= 1e-12
    assert (before[:, changed:] - after[:, changed:]).abs().amax(dim=-1).min() > 1e-3


# ------------------------------------------------------------------ parity with MHA


def mha_with_composed_weights(mla):
    """The MultiHeadAttention with W_k = W_down W_up_k, W_v = W_down W_up_v (composed here,
    independently of the module's own code), the same W_q and W_o, and with biases the key
    and value biases b_down W_up_k and b_down W_up_v."""
    mha = MultiHeadAttention(mla.d_model, mla.num_heads, bias=mla.bias).to(torch.float32)
    with torch.no_grad():
        mha.query_proj.weight.copy_(mla.query_proj.weight)
        mha.out_proj.weight.copy_(mla.out_proj.weight)
        mha.key_proj.weight.copy_(mla.key_up.weight @ mla.latent_proj.weight)
        mha.value_proj.weight.copy_(mla.value_up.weight @ mla.latent_proj.weight)
        if mla.bias:
            mha.query_proj.bias.copy_(mla.query_proj.bias)
            mha.out_proj.bias.copy_(mla.out_proj.bias)
            mha.key_proj.bias.copy_(mla.key_up.weight @ mla.latent_proj.bias)
            mha.value_proj.bias.copy_(mla.value_up.weight @ mla.latent_proj.bias)
    return mha.eval()


@pytest.mark.parametrize("d_latent", [16, 6])  # full rank (= d_model) and low rank
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_multi_head_attention_with_composed_weights(d_latent, kind, absorbed, bias):
    # Catches keys and values rebuilt with the up-projections in the wrong order or cut into
    # heads differently from MultiHeadAttention, and a different score scale.
    mla = make_mla(16, 4, d_latent, bias=bias, dtype=torch.float32)
    mha = mha_with_composed_weights(mla)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 16, generator=generator)
    mask, is_causal = make_mask(kind, 3, 4, 5, 5, generator)
    ours, _ = mla(x, mask, is_causal=is_causal, absorbed=absorbed)
    theirs, _ = mha(x, x, x, mask, is_causal=is_causal)
    assert max_abs_diff(ours, theirs) <= 1e-5


def test_a_full_rank_latent_can_hold_any_multi_head_attention():
    # The converse: with d_latent = d_model, W_down = I, W_up_k = W_k and W_up_v = W_v, MLA
    # is the given MHA. Catches an MLA that is not plain MHA on its composed weights.
    torch.manual_seed(8)
    mha = MultiHeadAttention(16, 4, bias=False).eval()
    randomize_(mha, torch.Generator().manual_seed(8))
    mla = MultiHeadLatentAttention(16, 4, 16, bias=False).eval()
    with torch.no_grad():
        mla.query_proj.weight.copy_(mha.query_proj.weight)
        mla.latent_proj.weight.copy_(torch.eye(16))
        mla.key_up.weight.copy_(mha.key_proj.weight)
        mla.value_up.weight.copy_(mha.value_proj.weight)
        mla.out_proj.weight.copy_(mha.out_proj.weight)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(9))
    theirs, _ = mha(x, x, x, is_causal=True)
    for absorbed in (False, True):
        assert max_abs_diff(mla(x, is_causal=True, absorbed=absorbed)[0], theirs) <= 1e-5


# ------------------------------------------------------------------ size, gradients, edges


@pytest.mark.parametrize("d_model, heads, d_latent", [(12, 3, 5), (16, 4, 16), (32, 8, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_parameter_count(d_model, heads, d_latent, bias):
    # Catches a formula that forgets a projection or a bias, or counts per head.
    mla = MultiHeadLatentAttention(d_model, heads, d_latent, bias=bias)
    counted = sum(p.numel() for p in mla.parameters())
    formula = 2 * d_model**2 + 3 * d_model * d_latent + (2 * d_model + d_latent) * bias
    assert counted == formula == mla.num_parameters
    assert latent_attention_parameters(d_model, d_latent, bias=bias) == counted


def test_fewer_parameters_than_mha_below_two_thirds_of_d_model():
    mha = sum(p.numel() for p in MultiHeadAttention(12, 3, bias=False).parameters())
    assert latent_attention_parameters(12, 7) < mha  # 7 < 2·12/3
    assert latent_attention_parameters(12, 8) == mha  # 8 = 2·12/3
    assert latent_attention_parameters(12, 9) > mha


@pytest.mark.parametrize("absorbed", [False, True])
def test_gradcheck(absorbed):
    # Gradients of the input and of every parameter, checked against finite differences in
    # float64 (with padding and a causal mask). Catches a non-differentiable step such as an
    # in-place write into a tensor autograd needs.
    mla = make_mla(d_model=4, num_heads=2, d_latent=3, bias=True)
    names = [name for name, _ in mla.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in mla.parameters()]
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    mask = torch.tensor([True, True, False]).view(1, 1, 1, 3)  # (1, 1, 1, 3)

    def run(x, *params):
        kwargs = {"is_causal": True, "absorbed": absorbed}
        return functional_call(mla, dict(zip(names, params)), (x, mask), kwargs)[0]

    assert torch.autograd.gradcheck(run, (x.requires_grad_(), *params))


@pytest.mark.parametrize("absorbed", [False, True])
def test_a_query_with_no_key_gets_zeros_not_nan(absorbed):
    # Catches masking with -inf (0/0 = NaN in softmax) and the output bias left on a row that
    # attends nowhere. Batch row 1 may attend to nothing; row 0 is a normal row.
    mla = make_mla(bias=True)
    x = torch.randn(2, 4, 12, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    padding = torch.tensor([[True, True, False, True], [False] * 4]).view(2, 1, 1, 4)
    output, weights = mla(x, padding, is_causal=True, absorbed=absorbed)
    assert not output.isnan().any()
    assert torch.equal(output[1], torch.zeros(4, 12, dtype=torch.float64))
    assert torch.equal(weights[1], torch.zeros(3, 4, 4, dtype=torch.float64))
    assert output[0].abs().amax(dim=-1).min() > 1e-3
    assert torch.allclose(weights[0].sum(-1), torch.ones(3, 4, dtype=torch.float64))


def test_dropout_only_in_training_and_the_same_in_both_paths():
    # Catches dropout applied in eval mode, dropout never applied, and dropout on a tensor
    # other than the weights in one path (the two paths draw the same mask from one seed).
    mla = MultiHeadLatentAttention(12, 3, 5, dropout=0.5).double()
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    mla.eval()
    assert torch.equal(mla(x, is_causal=True)[0], mla(x, is_causal=True)[0])
    mla.train()
    outputs = []
    for absorbed in (False, True):
        torch.manual_seed(13)
        outputs.append(mla(x, is_causal=True, absorbed=absorbed)[0])
    assert max_abs_diff(outputs[0], outputs[1]) <= 1e-12
    mla.eval()
    assert max_abs_diff(outputs[0], mla(x, is_causal=True)[0]) > 1e-3


def test_empty_batch_gives_an_empty_output():
    mla = make_mla()
    for absorbed in (False, True):
        output, weights = mla(torch.zeros(0, 3, 12, dtype=torch.float64), absorbed=absorbed)
        assert output.shape == (0, 3, 12) and weights.shape == (0, 3, 3, 3)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ((12, 3, 0), ValueError, "d_latent must be >= 1, got 0"),
        ((12, 3, 2.5), TypeError, "d_latent must be an int, got float"),
        ((12, 3, True), TypeError, "d_latent must be an int, got bool"),
        ((12, 5, 4), ValueError, "d_model must be divisible by num_heads"),
        ((0, 1, 4), ValueError, "d_model must be >= 1"),
    ],
)
def test_bad_sizes_are_rejected(arguments, error, match):
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(*arguments)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="dropout must be in"):
        MultiHeadLatentAttention(12, 3, 4, dropout=1.0)
    with pytest.raises(TypeError, match="bias must be a bool"):
        MultiHeadLatentAttention(12, 3, 4, bias=1)
    with pytest.raises(ValueError, match="d_latent must be >= 1"):
        latent_attention_parameters(12, 0)


def filled_cache(mla, batch, length, dtype=torch.float32):
    cache = LatentCache()
    mla(torch.randn(batch, length, mla.d_model, dtype=dtype), is_causal=True, cache=cache)
    return cache


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, x: m(x.long()), TypeError, "x must be a floating-point tensor"),
        (lambda m, x: m(x[0]), ValueError, r"x must have shape \(batch, q_len, 12\)"),
        (lambda m, x: m(x[..., :8]), ValueError, r"x must have shape \(batch, q_len, 12\)"),
        (lambda m, x: m(x.double()), TypeError, "x must have dtype torch.float32"),
        (lambda m, x: m(x.masked_fill(x > 1, float("nan"))), ValueError, "x contains"),
        (lambda m, x: m(x, torch.ones(2, 1, 1, 4)), TypeError, "mask must be a boolean"),
        (lambda m, x: m(x, torch.ones(2, 1, 1, 5, dtype=torch.bool)), ValueError, "mask of shape"),
        (lambda m, x: m(x, is_causal=1), TypeError, "is_causal must be a bool"),
        (lambda m, x: m(x, absorbed="yes"), TypeError, "absorbed must be a bool"),
        (lambda m, x: m(x, cache=KeyValueCache()), TypeError, "cache must be a .*LatentCache"),
        (
            lambda m, x: m(x, cache=filled_cache(m, 3, 2)),
            ValueError,
            r"cache.latents must have shape \(2, cached_len, 5\).*got \(3, 2, 5\)",
        ),
        (
            lambda m, x: m(x, cache=LatentCache(torch.zeros(2, 3, 4))),
            ValueError,
            r"cache.latents must have shape \(2, cached_len, 5\)",
        ),
        (
            lambda m, x: m(x, cache=LatentCache(torch.zeros(2, 3, 5, dtype=torch.float64))),
            TypeError,
            "cache.latents must have dtype torch.float32",
        ),
        (  # the mask must count the cached positions: k_len = 3 + 4
            lambda m, x: m(
                x, torch.ones(2, 1, 1, 4, dtype=torch.bool), cache=filled_cache(m, 2, 3)
            ),
            ValueError,
            r"\(batch, heads, q_len, k_len\) \(2, 3, 4, 7\)",
        ),
    ],
)
def test_bad_input_is_rejected_with_the_argument_named(call, error, match):
    mla = MultiHeadLatentAttention(12, 3, 5)
    x = torch.randn(2, 4, 12)
    with pytest.raises(error, match=match):
        call(mla, x)


def test_a_rejected_call_leaves_the_cache_as_it_was():
    # Catches checks that run after the latents were appended (a failed call would then
    # corrupt the cache of a decoding loop).
    mla = MultiHeadLatentAttention(12, 3, 5)
    cache = filled_cache(mla, 2, 3)
    before = cache.latents
    with pytest.raises(ValueError, match="mask of shape"):
        mla(torch.randn(2, 1, 12), torch.ones(2, 1, 1, 9, dtype=torch.bool), cache=cache)
    assert cache.latents is before and cache.length == 3
