"""Positions inside attention - RoPE and ALiBi - and models without positions (NoPE).

``MultiHeadAttention(positional="rope" | "alibi")``, ``TransformerConfig(positional=...)``,
``companion.positional.alibi_slopes`` / ``alibi_bias``. The references are written out here
from the papers' formulas; float64 comparisons hold to 1e-12.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch
import torch._dynamo as dynamo
from helpers import max_abs_diff, randomize_, tiny_transformer

from companion.attention import KeyValueCache, MultiHeadAttention, repeat_kv_heads
from companion.checkpoint import CHECKPOINT_FORMAT, model_from_checkpoint, save_checkpoint
from companion.decode import beam_search, greedy_decode
from companion.interop import load_from_torch, to_torch
from companion.masking import causal_mask
from companion.model import TransformerConfig
from companion.positional import (
    NoPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
)
from companion.train import sequence_loss, shift_targets

D_MODEL, HEADS = 32, 4
F64 = torch.float64


def attention(positional: str, num_kv_heads: int | None = None, seed: int = 0, **options):
    """A float64 ``MultiHeadAttention(32, 4, positional=...)`` with random weights, eval mode."""
    torch.manual_seed(seed)
    module = MultiHeadAttention(
        D_MODEL, HEADS, num_kv_heads=num_kv_heads, positional=positional, **options
    )
    return randomize_(module.double(), torch.Generator().manual_seed(seed), std=0.1).eval()


def inputs(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, length, D_MODEL, generator=torch.Generator().manual_seed(seed)).to(
        F64
    )


def padding(batch: int = 2, length: int = 7) -> torch.Tensor:
    """``(batch, 1, 1, length)``: sequence 1 has 3 padded keys."""
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[1, ..., -3:] = False
    return mask


def projections(module: MultiHeadAttention, x: torch.Tensor):
    """Unrotated ``q (batch, heads, len, hd)``, ``k, v (batch, heads, len, hd)`` (key/value
    heads repeated per group), computed from the separate projections."""
    q = module.split_heads(module.query_proj(x))
    k = module.split_heads(module.key_proj(x), module.num_kv_heads)
    v = module.split_heads(module.value_proj(x), module.num_kv_heads)
    return q, repeat_kv_heads(k, HEADS), repeat_kv_heads(v, HEADS)


def written_out_attention(module, q, k, v, bias=None, mask=None):
    """``softmax(q kᵀ/√d + bias)`` over the allowed keys, times ``v``, through ``out_proj``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, heads, q_len, k_len)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    per_head = torch.softmax(scores, dim=-1) @ v  # (batch, heads, q_len, head_dim)
    return module.out_proj(module.merge_heads(per_head))  # (batch, q_len, d_model)


# ------------------------------------------------------------------------- RoPE


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "padding+causal"])
def test_rope_attention_equals_attention_on_rotated_queries_and_keys(num_kv_heads, masks):
    """Reference: ``RotaryEmbedding.rotate`` with explicit positions 0..len-1 (its other path).
    Catches rotating after the heads are merged, rotating v, or no rotation at all."""
    module, x = attention("rope", num_kv_heads), inputs()
    mask = padding() if "padding" in masks else None
    is_causal = "causal" in masks
    q, k, v = projections(module, x)
    rotary = RotaryEmbedding(D_MODEL // HEADS).double()
    positions = torch.arange(7)
    q, k = rotary.rotate(q, positions), rotary.rotate(k, positions)
    full_mask = mask
    if is_causal:
        full_mask = causal_mask(7) if mask is None else mask & causal_mask(7)
    expected = written_out_attention(module, q, k, v, mask=full_mask)
    for need_weights in (False, True):
        got, _ = module(x, x, x, mask, is_causal=is_causal, need_weights=need_weights)
        assert max_abs_diff(got, expected) <= 1e-12


def test_rope_rotates_queries_and_keys_but_not_values():
    module, x = attention("rope"), inputs()
    plain = MultiHeadAttention(D_MODEL, HEADS).double()
    plain.load_state_dict(module.state_dict())  # same weights (RoPE has none), no positions
    q, k, v = module.project(x, x, x)
    plain_q, plain_k, plain_v = plain.project(x, x, x)
    assert torch.equal(v, plain_v)  # values carry content, not position
    positions = torch.arange(7)
    assert max_abs_diff(q, module.rotary.rotate(plain_q, positions)) <= 1e-15
    assert max_abs_diff(k, module.rotary.rotate(plain_k, positions)) <= 1e-15
    assert torch.equal(q[:, :, 0], plain_q[:, :, 0])  # position 0: angle 0
    assert max_abs_diff(q, plain_q) > 1e-2 and max_abs_diff(k, plain_k) > 1e-2


def test_rope_scores_depend_only_on_the_distance():
    """Shifting every position by 37 leaves the scores unchanged (to 1e-12), while the
    rotation does change them; with one vector at every position the score matrix is
    constant along its diagonals (a Toeplitz matrix)."""
    module, x = attention("rope"), inputs(length=6)
    q, k, _ = projections(module, x)

    def scores(shift: int) -> torch.Tensor:
        q_rot, k_rot = module.rotate(q, k, shift)  # keys (and queries) at shift .. shift + 5
        return q_rot @ k_rot.transpose(-2, -1)  # (batch, heads, 6, 6)

    assert max_abs_diff(scores(37), scores(0)) <= 1e-12
    assert max_abs_diff(scores(0), q @ k.transpose(-2, -1)) > 1e-2
    same = inputs(length=1).expand(2, 6, D_MODEL)  # one vector, six positions
    q_same, k_same, _ = module.project(same, same, same)
    table = q_same @ k_same.transpose(-2, -1)  # (batch, heads, 6, 6): f(m - n)
    assert max_abs_diff(table[..., 1:, 1:], table[..., :-1, :-1]) <= 1e-12
    assert max_abs_diff(table[..., 1:, :], table[..., :-1, :]) > 1e-3  # not constant


@pytest.mark.parametrize("positional", ["rope", "alibi"])
@pytest.mark.parametrize("num_kv_heads", [None, 1])
@pytest.mark.parametrize("step", [1, 3])
def test_cached_steps_equal_full_causal_attention(positional, num_kv_heads, step):
    """Catches a cached step whose queries and new keys restart at position 0 (RoPE) or
    whose bias ignores the cached keys (ALiBi)."""
    module, x = attention(positional, num_kv_heads), inputs(length=6)
    mask = padding(length=6)
    full, _ = module(x, x, x, mask, is_causal=True)
    cache = KeyValueCache()
    steps = []
    for t in range(0, 6, step):
        new = x[:, t : t + step]
        seen = mask[..., : t + step]  # the padding of the keys so far
        steps.append(module(new, new, new, seen, is_causal=True, cache=cache)[0])
    assert cache.keys.shape == (2, num_kv_heads or HEADS, 6, D_MODEL // HEADS)
    assert max_abs_diff(torch.cat(steps, dim=1), full) <= 1e-12


def test_cached_keys_are_stored_rotated():
    module, x = attention("rope"), inputs(length=5)
    cache = KeyValueCache()
    module(x, x, x, is_causal=True, cache=cache)
    _, k, v = module.project(x, x, x)
    assert max_abs_diff(cache.keys, k) <= 1e-15 and torch.equal(cache.values, v)


# ------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_for_a_power_of_two_are_geometric():
    assert alibi_slopes(8, dtype=F64).tolist() == [2.0**-i for i in range(1, 9)]
    sixteen = torch.tensor([2.0 ** (-i / 2) for i in range(1, 17)], dtype=F64)
    torch.testing.assert_close(alibi_slopes(16, dtype=F64), sixteen, rtol=1e-15, atol=0)
    assert alibi_slopes(1, dtype=F64).tolist() == [2.0**-8]
    assert alibi_slopes(4).dtype == torch.get_default_dtype()


@pytest.mark.parametrize(
    ("heads", "exponents"),
    [
        # 4 heads' slopes, then every other slope of 8 heads (2^-1, 2^-3) for the 2 left
        (6, [2, 4, 6, 8, 1, 3]),
        # 2 heads' slopes (2^-4, 2^-8), then the first of 4 heads' odd-numbered ones (2^-2)
        (3, [4, 8, 2]),
        # 8 heads' slopes, then 16 heads' 1st, 3rd, 5th, 7th: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
        (12, [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]),
    ],
)
def test_alibi_slopes_for_other_head_counts_follow_the_paper(heads, exponents):
    """Catches the geometric sequence of n heads used for every n (2^(-8/6) ... for 6)."""
    expected = torch.tensor([2.0**-e for e in exponents], dtype=F64)
    torch.testing.assert_close(alibi_slopes(heads, dtype=F64), expected, rtol=1e-15, atol=0)


def test_a_float64_alibi_module_has_float64_slopes():
    """Built in float32, then ``.double()``: the slopes are recomputed, not widened."""
    module = MultiHeadAttention(48, 12, positional="alibi")
    assert module.alibi_slopes.dtype == torch.float32
    assert torch.equal(module.double().alibi_slopes, alibi_slopes(12, dtype=F64))
    assert module.state_dict().keys() == MultiHeadAttention(48, 12).state_dict().keys()


def test_alibi_bias_values():
    slopes = torch.tensor([0.5, 0.25], dtype=F64)
    causal = alibi_bias(slopes, 3, 5, offset=2)  # (2, 3, 5): queries at 2, 3, 4
    both_ways = alibi_bias(slopes, 3, 5, offset=2, causal=False)
    assert causal.shape == both_ways.shape == (2, 3, 5)
    for h in range(2):
        for i in range(3):
            for j in range(5):
                distance = (2 + i) - j
                assert causal[h, i, j].item() == -slopes[h].item() * distance
                assert both_ways[h, i, j].item() == -slopes[h].item() * abs(distance)
    keys_a_query_may_see = causal_mask(3, 5)  # bottom-right aligned: key j <= 2 + i
    assert torch.equal(causal[:, keys_a_query_may_see], both_ways[:, keys_a_query_may_see])


def test_bidirectional_alibi_bias_is_symmetric_and_shift_invariant():
    slopes = alibi_slopes(HEADS, dtype=F64)
    bias = alibi_bias(slopes, 6, 6, causal=False)  # (heads, 6, 6)
    assert torch.equal(bias, bias.transpose(-2, -1))
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all() and (bias <= 0).all()
    module, x = attention("alibi"), inputs(length=6)
    q, k, _ = module.project(x, x, x)
    assert torch.equal(module.position_bias(q, k, is_causal=False), bias)  # the encoder's
    # a query continuing a sequence sees the same distances as the full sequence's last one
    assert torch.equal(alibi_bias(slopes, 1, 6, offset=5), alibi_bias(slopes, 6, 6)[:, -1:])


@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "padding+causal"])
def test_alibi_attention_equals_the_written_out_formula(num_kv_heads, masks):
    """Both paths against ``softmax(q kᵀ/√d - slope·distance)``; catches the bias added to
    the wrong heads, with the wrong sign, or after the mask has been applied."""
    module, x = attention("alibi", num_kv_heads), inputs()
    mask = padding() if "padding" in masks else None
    is_causal = "causal" in masks
    q, k, v = projections(module, x)
    slopes = alibi_slopes(HEADS, dtype=F64)
    bias = alibi_bias(slopes, 7, 7, causal=is_causal)  # (heads, 7, 7)
    full_mask = mask
    if is_causal:
        full_mask = causal_mask(7) if mask is None else mask & causal_mask(7)
    expected = written_out_attention(module, q, k, v, bias, full_mask)
    for need_weights in (False, True):
        got, _ = module(x, x, x, mask, is_causal=is_causal, need_weights=need_weights)
        assert max_abs_diff(got, expected) <= 1e-12
    without_bias = written_out_attention(module, q, k, v, mask=full_mask)
    assert max_abs_diff(expected, without_bias) > 1e-3  # the bias matters here


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(positional):
    module, x = attention(positional), inputs().requires_grad_()
    mask = padding()
    mask[0] = False  # sequence 0 may attend to nothing
    for need_weights in (False, True):
        out, _ = module(x, x, x, mask, is_causal=True, need_weights=need_weights)
        assert torch.isfinite(out).all() and (out[0] == 0).all()
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_cpu_dropout_path_is_attention_when_nothing_is_dropped(positional, monkeypatch):
    import companion.kernels as kernels_module

    module, x = attention(positional, 2, dropout=0.3), inputs()
    mask = padding()
    expected, _ = module.eval()(x, x, x, mask, is_causal=True)
    monkeypatch.setattr(  # every factor 1: dropout made the identity
        kernels_module, "dropout_factor", lambda weights, p: torch.ones_like(weights)
    )
    got, _ = module.train()(x, x, x, mask, is_causal=True)
    assert max_abs_diff(got, expected) <= 1e-12
    monkeypatch.undo()
    dropped, _ = module.train()(x, x, x, mask, is_causal=True)
    assert torch.isfinite(dropped).all() and max_abs_diff(dropped, expected) > 1e-3


# ------------------------------------------------------------------------- the model

KINDS = ["sinusoidal", "learned", "rope", "alibi", "none"]


def model(positional: str, num_kv_heads: int | None = None, seed: int = 0, **changes):
    return tiny_transformer(
        20, num_layers=2, positional=positional, num_kv_heads=num_kv_heads, seed=seed, **changes
    )


def test_where_the_positions_go():
    for kind in ("rope", "alibi", "none"):
        built = model(kind)
        assert isinstance(built.src_positions, NoPositionalEncoding)
        assert isinstance(built.tgt_positions, NoPositionalEncoding)
        attention_kind = None if kind == "none" else kind
        assert built.encoder.layers[0].self_attention.positional == attention_kind
        assert built.decoder.layers[1].self_attention.positional == attention_kind
        assert built.decoder.layers[1].cross_attention.positional is None  # never across
    assert isinstance(model("sinusoidal").src_positions, SinusoidalPositionalEncoding)
    rope = model("rope", num_kv_heads=2)
    assert rope.decoder.layers[0].cross_attention.num_kv_heads == 2
    assert rope.encoder.layers[0].self_attention.rotary is not None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_kv_heads", [None, 1])
def test_cached_decoding_equals_decoding_the_whole_prefix(kind, num_kv_heads):
    built = model(kind, num_kv_heads).double().eval()
    src = torch.randint(3, 20, (3, 7))
    src[1, 4:] = 0
    tgt = torch.randint(3, 20, (3, 6))
    tgt[2, 3:] = 0
    with torch.no_grad():
        src_mask = built.make_src_mask(src)
        memory = built.encode(src, src_mask)
        full = built.decode(tgt, memory, src_mask)  # (3, 6, 20)
        cache = built.new_cache()
        steps = [built.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(6)]
        two_at_a_time = built.new_cache()
        pairs = [built.decode(tgt[:, t : t + 2], memory, src_mask, cache=two_at_a_time)
                 for t in range(0, 6, 2)]  # fmt: skip
    assert max_abs_diff(torch.cat(steps, dim=1), full) <= 1e-12
    assert max_abs_diff(torch.cat(pairs, dim=1), full) <= 1e-12


@pytest.mark.parametrize("kind", ["rope", "alibi", "none"])
def test_greedy_with_and_without_cache_and_beam_search(kind):
    built = model(kind, 2, seed=3)
    with torch.no_grad():
        built.generator.bias[2] = 1.0  # <eos> likely enough that sentences end
    src = torch.randint(3, 20, (4, 7))
    src[2, 3:] = 0
    cached = greedy_decode(built, src, max_len=10)
    assert torch.equal(cached, greedy_decode(built, src, max_len=10, use_cache=False))
    assert torch.equal(beam_search(built, src, beam_size=1, max_len=10), cached)
    assert beam_search(built, src, beam_size=3, max_len=10).shape[0] == 4


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_decoding_offset_changes_nothing_for_relative_positions(kind):
    """RoPE and ALiBi see distances only; a sinusoidal model does see the offset."""
    for positional, same in ((kind, True), ("sinusoidal", False)):
        built = model(positional).double().eval()
        src, tgt = torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
        memory = built.encode(src)
        moved = max_abs_diff(built.decode(tgt, memory, offset=9), built.decode(tgt, memory))
        assert (moved <= 1e-12) == same


@pytest.mark.parametrize("kind", KINDS)
def test_only_a_model_without_positions_has_a_permutation_equivariant_encoder(kind):
    """NoPE: permuting the source tokens (padding included) permutes the encoder's output;
    every other kind of position breaks this."""
    built = model(kind).double().eval()
    src = torch.randint(3, 20, (2, 7))
    src[1, 5:] = 0
    permutation = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    with torch.no_grad():
        memory = built.encode(src)  # (2, 7, 32), padding mask from src
        permuted = built.encode(src[:, permutation])
    difference = max_abs_diff(permuted, memory[:, permutation])
    if kind == "none":
        assert difference <= 1e-12
    else:
        assert difference > 1e-3


@pytest.mark.parametrize("kind", ["rope", "alibi", "none"])
def test_checkpoint_round_trip(kind, tmp_path):
    built = model(kind, 2).eval()
    path = tmp_path / "checkpoint.pt"
    state = {
        "format": CHECKPOINT_FORMAT,
        "model": built.state_dict(),
        "model_config": asdict(built.config),
        "config": {},
    }
    save_checkpoint(state, path)
    loaded = model_from_checkpoint(path)
    assert loaded.config == built.config
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 5))
    assert torch.equal(loaded(src, tgt), built(src, tgt))


def test_a_checkpoint_config_without_the_new_fields_still_loads(tmp_path):
    """An older checkpoint's model_config has no ``num_kv_heads``: the default applies."""
    built = model("sinusoidal").eval()
    config = asdict(built.config)
    del config["num_kv_heads"]
    state = {"format": CHECKPOINT_FORMAT, "model": built.state_dict(), "model_config": config,
             "config": {}}  # fmt: skip
    save_checkpoint(state, tmp_path / "old.pt")
    assert model_from_checkpoint(tmp_path / "old.pt").config == built.config


def test_torch_nn_conversion_refuses_rope_and_alibi_and_takes_nope():
    for kind in ("rope", "alibi"):
        with pytest.raises(ValueError, match=rf"positional='{kind}' \(encoder\.layers\.0"):
            to_torch(model(kind))
        layer = model(kind).encoder.layers[0]
        with pytest.raises(ValueError, match=rf"positional='{kind}'"):
            load_from_torch(layer, to_torch(model("none").encoder.layers[0]))
    nope = model("none").eval()  # torch.nn.Transformer adds no positions either: same stacks
    torch_model = to_torch(nope).eval()
    src = torch.randint(3, 20, (2, 6))
    x = nope.src_positions(nope.src_embedding(src))  # (2, 6, 32)
    mask = nope.make_src_mask(src)
    expected = torch_model.encoder(x, src_key_padding_mask=~mask[:, 0, 0])
    assert max_abs_diff(nope.encoder(x, mask)[src != 0], expected[src != 0]) <= 1e-5


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: MultiHeadAttention(32, 4, positional="rotary"), ValueError,
         r"positional must be None, 'rope' or 'alibi', got 'rotary'"),
        (lambda: MultiHeadAttention(30, 10, positional="rope"), ValueError,
         r"positional='rope' needs an even head_dim .* got head_dim=3"),
        (lambda: MultiHeadAttention(32, 4, positional="rope", rope_base=0.0), ValueError,
         r"rope_base must be a positive finite number, got 0.0"),
        (lambda: MultiHeadAttention(32, 4, rope_base="big"), TypeError, r"rope_base must be"),
        (lambda: TransformerConfig(10, 10, d_model=30, num_heads=10, positional="rope"),
         ValueError, r"positional='rope' needs an even head_dim .* d_model=30, num_heads=10"),
        (lambda: alibi_slopes(0), ValueError, r"num_heads must be >= 1, got 0"),
        (lambda: alibi_bias(torch.ones(2, 1), 3, 3), ValueError, r"slopes must have shape \(heads,\)"),
        (lambda: alibi_bias(torch.ones(2), 3, 3, offset=-1), ValueError, r"offset must be >= 0"),
        (lambda: alibi_bias(torch.ones(2, dtype=torch.long), 3, 3), TypeError,
         r"slopes must be a floating-point tensor"),
    ],
)  # fmt: skip
def test_bad_arguments(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_positions_need_self_attention_alignment():
    module, x = attention("rope"), inputs()
    with pytest.raises(ValueError, match=r"k_len must be >= q_len with positional='rope'"):
        module(x, x[:, :3], x[:, :3])
    with pytest.raises(ValueError, match=r"cache must be a growing KeyValueCache"):
        module(x, x, x, cache=KeyValueCache(growing=False))


def test_explicit_bias_is_checked():
    from companion.attention import scaled_dot_product_attention

    q = torch.randn(2, 4, 3, 8)
    with pytest.raises(ValueError, match=r"bias of shape \(5, 3, 3\) does not broadcast"):
        scaled_dot_product_attention(q, q, q, bias=torch.zeros(5, 3, 3))
    with pytest.raises(TypeError, match=r"bias must have dtype torch.float32 to match q"):
        scaled_dot_product_attention(q, q, q, bias=torch.zeros(4, 3, 3, dtype=F64))
    bias = torch.zeros(3, 3)
    bias[0, 2] = -math.inf  # a mask belongs in mask=, as a boolean tensor
    with pytest.raises(ValueError, match=r"bias contains 1 NaN or infinite"):
        scaled_dot_product_attention(q, q, q, bias=bias)


# ------------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize(("positional", "num_kv_heads"), [("rope", 2), ("alibi", 1)])
def test_forward_and_loss_compile_without_a_graph_break(positional, num_kv_heads):
    """No host synchronisation on the hot path (e.g. ``int(positions.max())`` in RoPE)."""
    built = model(positional, num_kv_heads, dropout=0.1).train()
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(1, 20, (4, 9), generator=generator)
    tgt = torch.randint(1, 20, (4, 8), generator=generator)
    src[0, 6:], tgt[1, 5:] = 0, 0

    def forward_and_loss(src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        decoder_input, labels = shift_targets(tgt)
        return sequence_loss(built(src, decoder_input), labels, pad_id=0)

    dynamo.reset()
    explanation = dynamo.explain(forward_and_loss)(src, tgt)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]
    assert explanation.graph_count == 1
