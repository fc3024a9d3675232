"""The decoder-only and encoder-only families (companion.families): causality and
bidirectionality, cached = uncached, generation, parity of the encoder stack with
torch.nn.TransformerEncoder, tied weights, pooling, segment memory, checkpoints, bad inputs.

Each test says in a comment which wrong code it catches."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import max_abs_diff, randomize_
from torch import nn

from companion.cache import DecoderOnlyCache, KeyValueCache
from companion.checkpoint import CheckpointError, model_from_checkpoint, save_checkpoint
from companion.families import DecoderOnlyTransformer, EncoderOnlyTransformer
from companion.interop import load_from_torch
from companion.model import Transformer, TransformerConfig
from companion.utils import count_parameters

KINDS = ["sinusoidal", "learned", "rope", "alibi", "none"]
VOCAB, PAD, TOL = 23, 0, 1e-5


def config(positional="rope", **changes):
    """A small Pre-LN configuration (d_model 16, 4 heads, 2 layers, no dropout)."""
    settings = dict(
        src_vocab=VOCAB,
        tgt_vocab=VOCAB,
        d_model=16,
        num_heads=4,
        num_layers=2,
        d_ff=32,
        dropout=0.0,
        norm_first=True,
        positional=positional,
        src_pad_id=PAD,
        tgt_pad_id=PAD,
        tie_embeddings=True,
        max_len=64,
    )
    return TransformerConfig(**(settings | changes))


def gpt(positional="rope", seed=0, **changes):
    torch.manual_seed(seed)
    return DecoderOnlyTransformer(config(positional, **changes)).eval()


def bert(positional="rope", seed=0, num_classes=3, pooling="cls", **changes):
    torch.manual_seed(seed)
    model = EncoderOnlyTransformer(
        config(positional, **changes), num_classes=num_classes, pooling=pooling
    )
    return model.eval()


def tokens(batch, length, seed=0, low=1):
    return torch.randint(low, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def argmax_loop(model, prompt, steps):
    """The reference for greedy generation: the whole sequence through the model at every
    step, no cache, the pad id never chosen."""
    out = prompt
    for _ in range(steps):
        logits = model(out)[:, -1].clone()  # (batch, vocab)
        logits[:, PAD] = -torch.inf
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    return out


# ------------------------------------------------------------------ decoder-only


@pytest.mark.parametrize("pad_id", [None, PAD])
@pytest.mark.parametrize("kind", KINDS)
def test_decoder_only_never_leaks_a_later_token(kind, pad_id):
    # Catches: a missing causal mask (is_causal dropped, or lost when the padding mask is
    # combined with it: pad_id=PAD takes that path), a causal mask on the wrong diagonal.
    model = gpt(kind, tgt_pad_id=pad_id)
    seq = tokens(2, 8)
    seq[1, 2] = PAD  # padding inside row 1 exercises the padding mask
    logits = model(seq)
    for t in range(1, 8):
        changed = seq.clone()
        changed[:, t] = (changed[:, t] + 5) % (VOCAB - 1) + 1  # another real token
        other = model(changed)
        assert max_abs_diff(other[:, :t], logits[:, :t]) <= 1e-6, f"position {t} leaked"
        assert max_abs_diff(other[:, t:], logits[:, t:]) > 1e-4  # the change is seen later


@pytest.mark.parametrize("kind", KINDS)
def test_cached_steps_equal_the_whole_sequence(kind):
    # Catches: positions restarting at 0 with a cache (sinusoidal/learned offset), RoPE
    # rotating new keys at the wrong position, a cache that drops or repeats keys, the padding
    # of cached tokens forgotten (row 1 has a pad at position 1).
    model = gpt(kind)
    seq = tokens(2, 9, seed=1)
    seq[1, 1] = PAD
    full = model(seq)  # (2, 9, vocab)
    cache = model.new_cache()
    first = model(seq[:, :3], cache=cache)  # a prompt of 3 tokens, then one token per call
    steps = [first] + [model(seq[:, t : t + 1], cache=cache) for t in range(3, 9)]
    assert max_abs_diff(torch.cat(steps, dim=1), full) <= TOL
    assert cache.length == 9 and cache.key_padding.shape == (2, 9)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_equals_an_uncached_argmax_loop(kind):
    # Catches: a wrong cache in generate, sampling although temperature=0, the last logits
    # taken from the wrong position, the prompt not kept in front.
    model = gpt(kind)
    prompt = tokens(3, 4, seed=2)
    out = model.generate(prompt, 6, temperature=0)
    assert out.shape == (3, 10) and out.dtype == torch.long
    assert torch.equal(out[:, :4], prompt)
    assert torch.equal(out, argmax_loop(model, prompt, 6))


def test_sampling_reproduces_with_a_seeded_generator():
    # Catches: draws from the global random state instead of `generator` (the two calls
    # below would differ), a temperature that changes nothing.
    model = gpt(seed=3)
    prompt = tokens(4, 2, seed=3)

    def sample(seed, **options):
        generator = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 12, generator=generator, **options)

    assert torch.equal(sample(0), sample(0))
    assert not torch.equal(sample(0), sample(1))
    assert not torch.equal(sample(0, temperature=5.0), sample(0, temperature=0.05))


def test_top_k_1_is_greedy():
    # Catches: top_k ignored or applied after the draw.
    model = gpt("alibi", seed=4)
    prompt = tokens(3, 3, seed=4)
    sampled = model.generate(prompt, 8, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, model.generate(prompt, 8, temperature=0))


def test_generation_never_produces_the_pad_id():
    # Catches: the pad id left among the candidates (its logit is made the largest here).
    model = gpt(seed=5)
    with torch.no_grad():
        model.lm_head.bias[PAD] = 100.0
    out = model.generate(tokens(2, 2), 6, generator=torch.Generator().manual_seed(0))
    assert not (out[:, 2:] == PAD).any()


def test_eos_finishes_a_row_and_stops_when_all_have():
    # Catches: tokens generated after <eos>, no early stop, a finished row not filled.
    model = gpt(seed=6)
    prompt = tokens(2, 3, seed=6)
    greedy = model.generate(prompt, 6, temperature=0)
    eos = int(greedy[0, 3])  # row 0's first new token
    out = model.generate(prompt, 6, temperature=0, eos_id=eos)
    assert out[0, 3] == eos and (out[0, 4:] == PAD).all()
    if (greedy[1, 3:] != eos).all():  # row 1 never says eos: it runs to the end unchanged
        assert torch.equal(out[1], greedy[1])
    alone = model.generate(prompt[:1], 6, temperature=0, eos_id=eos)
    assert alone.shape == (1, 4)  # stopped right after the only row finished


def test_generate_restores_the_mode_and_keeps_no_graph():
    # Catches: generate leaving the model in eval mode, or building an autograd graph.
    model = gpt(seed=7).train()
    out = model.generate(tokens(1, 2), 3, temperature=0)
    assert model.training and not out.requires_grad


def test_zero_new_tokens_return_the_prompt():
    # Catches: an off-by-one that generates a token for max_new_tokens=0.
    model = gpt()
    prompt = tokens(2, 5).int()
    out = model.generate(prompt, 0)
    assert out.dtype == torch.long and torch.equal(out, prompt.long())


def test_a_prefix_lm_mask_sees_the_whole_prefix():
    # Catches: `mask` ignored, or the causal mask forced on when is_causal=False.
    model = gpt(seed=8)
    seq, prefix = tokens(1, 7, seed=8), 3
    key = torch.arange(7)
    prefix_lm = (key[None, :] <= key[:, None]) | (key[None, :] < prefix)  # (7, 7)
    logits = model(seq, prefix_lm, is_causal=False)
    inside, after = seq.clone(), seq.clone()
    inside[0, prefix - 1] = (inside[0, prefix - 1] % (VOCAB - 1)) + 1
    after[0, prefix] = (after[0, prefix] % (VOCAB - 1)) + 1
    assert max_abs_diff(model(inside, prefix_lm, is_causal=False)[:, 0], logits[:, 0]) > 1e-4
    assert (
        max_abs_diff(model(after, prefix_lm, is_causal=False)[:, :prefix], logits[:, :prefix])
        <= 1e-6
    )


def test_attention_weights_for_plots():
    # Catches: weights not kept, or kept from the wrong layers.
    model = gpt()
    model(tokens(2, 5), need_weights=True)
    weights = model.attention_weights
    assert weights.shape == (2, 2, 4, 5, 5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 4, 5))
    assert (weights.triu(1) == 0).all()  # causal
    model(tokens(2, 5))
    assert model.attention_weights is None


# ------------------------------------------------------------------ segment memory


@pytest.mark.parametrize("kind", KINDS)
def test_segment_memory_equals_the_concatenation(kind):
    # Catches: memory not attended to, positions of the second segment restarting at 0.
    model = gpt(kind, seed=9)
    first, second = tokens(2, 5, seed=9), tokens(2, 4, seed=10)
    memory = model.new_cache()
    model(first, cache=memory)
    memory.keep_last(5)
    logits = model(second, cache=memory)  # (2, 4, vocab)
    full = model(torch.cat([first, second], dim=1))
    assert max_abs_diff(logits, full[:, 5:]) <= TOL


@pytest.mark.parametrize("kind", ["rope", "alibi", "none"])
def test_trimmed_memory_keeps_relative_positions(kind):
    # Catches: a trimmed cache whose RoPE positions restart at its length (no `start`): the
    # new keys would be rotated at the kept keys' positions. One layer, so the kept keys of
    # segment 2 depend only on segment 2's tokens, and relative positions make "segment 3
    # after segment 2 as memory" the same as "segments 2 + 3 from position 0".
    model = gpt(kind, seed=11, num_layers=1)
    segments = [tokens(2, 4, seed=s) for s in (11, 12, 13)]
    memory = model.new_cache()
    for segment in segments[:2]:
        model(segment, cache=memory)
        memory.keep_last(4)
    assert memory.start == 4 and memory.length == 4 and memory.next_position == 8
    logits = model(segments[2], cache=memory)
    fresh = model(torch.cat(segments[1:], dim=1))[:, 4:]
    assert max_abs_diff(logits, fresh) <= TOL


def test_memory_is_detached_and_trimmed():
    # Catches: memory that keeps the autograd graph of the previous segment (backward would
    # run into it), padding records that are not trimmed with the keys.
    model = gpt(seed=12).train()
    memory = model.new_cache()
    model(tokens(2, 6), cache=memory).sum().backward()
    assert memory.layers[0].keys.requires_grad
    memory.keep_last(4)
    for layer in memory.layers:
        assert not layer.keys.requires_grad and not layer.values.requires_grad
        assert layer.keys.shape[2] == 4 and layer.start == 2
    assert memory.key_padding.shape == (2, 4)
    model(tokens(2, 3, seed=1), cache=memory).sum().backward()  # no "backward twice" error


def test_key_value_cache_keep_last():
    # Catches: keep_last trimming from the wrong end, forgetting how many it dropped.
    cache = KeyValueCache()
    cache.keys = torch.arange(10.0).reshape(1, 1, 10, 1)
    cache.values = -cache.keys
    cache.keep_last(3)
    assert cache.keys.flatten().tolist() == [7.0, 8.0, 9.0] and cache.start == 7
    cache.keep_last(5)  # fewer than 5 kept: all stay
    assert cache.length == 3 and cache.next_position == 10
    cache.keep_last(0)
    assert cache.length == 0 and cache.next_position == 10
    with pytest.raises(ValueError, match="n must be >= 0"):
        cache.keep_last(-1)


# ------------------------------------------------------------------ encoder-only


@pytest.mark.parametrize("kind", KINDS)
def test_encoder_only_is_bidirectional(kind):
    # Catches: a causal mask in the encoder (earlier positions would not change).
    model = bert(kind)
    seq = tokens(2, 6, seed=14)
    hidden = model(seq)
    changed = seq.clone()
    changed[:, -1] = (changed[:, -1] % (VOCAB - 1)) + 1
    assert (model(changed)[:, 0] - hidden[:, 0]).abs().amax(-1).min() > 1e-4


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_equals_torch_transformer_encoder(norm_first, num_layers):
    # Catches: a wrong layer order or residual placement, a causal or missing padding mask,
    # a missing (Pre-LN) or extra (Post-LN) final norm.
    model = bert("sinusoidal", norm_first=norm_first, num_layers=num_layers)
    layer = nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    norm = nn.LayerNorm(16) if norm_first else None
    reference = nn.TransformerEncoder(layer, num_layers, norm=norm, enable_nested_tensor=False)
    randomize_(reference, torch.Generator().manual_seed(num_layers)).eval()
    load_from_torch(model.encoder, reference)
    seq = tokens(3, 7, seed=15)
    seq[1, 5:] = PAD
    x = model.positions(model.token_embedding(seq))  # (3, 7, 16)
    expected = reference(x, src_key_padding_mask=seq == PAD)
    real = seq != PAD
    assert max_abs_diff(model(seq)[real], expected[real]) <= TOL


def test_tied_weights_are_one_matrix():
    # Catches: a copy instead of a shared parameter (an update to one would miss the other),
    # a tied model that still counts both matrices.
    decoder, untied = gpt(), gpt(tie_embeddings=False)
    assert decoder.lm_head.weight is decoder.token_embedding.weight
    assert untied.lm_head.weight is not untied.token_embedding.weight
    assert count_parameters(untied) - count_parameters(decoder) == VOCAB * 16
    encoder = bert(tie_embeddings=False)  # the MLM head is tied whatever the config says
    assert encoder.mlm_head.weight is encoder.token_embedding.weight
    with torch.no_grad():
        encoder.token_embedding.weight[5] += 1.0
    seq = tokens(1, 4)
    hidden = encoder(seq)
    expected = hidden @ encoder.token_embedding.weight.T + encoder.mlm_head.bias
    assert max_abs_diff(encoder.mlm_logits(seq), expected) <= TOL
    assert encoder.mlm_logits(seq).shape == (1, 4, VOCAB)


def test_cls_pooling_reads_position_0():
    # Catches: pooling from another position, or averaging under pooling="cls".
    model = bert(pooling="cls")
    seq = tokens(2, 5, seed=16)
    expected = model.classifier(model(seq)[:, 0])
    assert model.classify(seq).shape == (2, 3)
    assert max_abs_diff(model.classify(seq), expected) <= TOL


def test_mean_pooling_ignores_padding():
    # Catches: a mean over every position, pads included (the padded row would change).
    model = bert(pooling="mean")
    seq = tokens(2, 5, seed=17)
    padded = torch.cat([seq, torch.full((2, 3), PAD)], dim=1)  # the same sentences + 3 pads
    assert max_abs_diff(model.classify(padded), model.classify(seq)) <= TOL
    hidden = model(padded)
    everything = model.classifier(hidden.mean(dim=1))  # the wrong answer differs
    assert max_abs_diff(everything, model.classify(padded)) > 1e-4
    # vectors: what sits at a masked position changes nothing
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    other = x.clone()
    other[0, 4:] = 7.0
    logits = model.classify_embeddings(x, mask)
    assert max_abs_diff(model.classify_embeddings(other, mask), logits) <= TOL


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "none"])
def test_encode_embeddings_adds_the_positions(kind):
    # Catches: encode_embeddings without positions (a permuted input would give the permuted
    # output for every kind, not only "none"); forward not going through it.
    model = bert(kind)
    seq = tokens(2, 6, seed=18)
    x = model.token_embedding(seq)  # (2, 6, 16)
    assert max_abs_diff(model.encode_embeddings(x), model(seq)) <= TOL
    order = torch.tensor([5, 4, 3, 2, 1, 0])
    difference = max_abs_diff(
        model.encode_embeddings(x[:, order]), model.encode_embeddings(x)[:, order]
    )
    assert (difference <= 1e-5) == (kind == "none")


def test_encoder_attention_weights_for_plots():
    # Catches: weights not kept by encode_embeddings (the ViT chapter draws them).
    model = bert()
    model.encode_embeddings(torch.randn(2, 5, 16), need_weights=True)
    assert model.attention_weights.shape == (2, 2, 4, 5, 5)


# ------------------------------------------------------------------ checkpoints


def test_decoder_only_checkpoint_round_trip(tmp_path):
    # Catches: a checkpoint that loses the kind, the config or the tie, or that the
    # encoder-decoder loader would take for a Transformer.
    model = gpt("learned", seed=19)
    path = save_checkpoint(model.to_checkpoint(), tmp_path / "gpt.pt")
    loaded = DecoderOnlyTransformer.from_checkpoint(path)
    assert loaded.config == model.config and not loaded.training
    assert loaded.lm_head.weight is loaded.token_embedding.weight
    seq = tokens(2, 5)
    assert torch.equal(loaded(seq), model(seq))
    with pytest.raises(CheckpointError, match=r"DecoderOnlyTransformer\.from_checkpoint"):
        model_from_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"EncoderOnlyTransformer"):
        EncoderOnlyTransformer.from_checkpoint(path)


def test_encoder_only_checkpoint_round_trip(tmp_path):
    # Catches: num_classes or pooling not saved (the head would be missing or pool wrongly).
    model = bert("alibi", num_classes=4, pooling="mean", seed=20)
    path = save_checkpoint(model.to_checkpoint(), tmp_path / "bert.pt")
    loaded = EncoderOnlyTransformer.from_checkpoint(path)
    assert (loaded.num_classes, loaded.pooling) == (4, "mean")
    seq = tokens(2, 5)
    assert torch.equal(loaded.classify(seq), model.classify(seq))
    assert torch.equal(loaded.mlm_logits(seq), model.mlm_logits(seq))


def test_an_encoder_decoder_checkpoint_is_refused_by_the_families(tmp_path):
    # Catches: a family loading a Transformer checkpoint (no model_kind) as its own; old
    # checkpoints still load as Transformers.
    torch.manual_seed(0)
    transformer = Transformer(config("sinusoidal"))
    state = {
        "format": 1,
        "model": transformer.state_dict(),
        "config": {},
        "model_config": dataclasses.asdict(transformer.config),
    }
    path = save_checkpoint(state, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match=r"holds a Transformer.*model_from_checkpoint"):
        DecoderOnlyTransformer.from_checkpoint(path)
    assert model_from_checkpoint(path).config == transformer.config


# ------------------------------------------------------------------ bad inputs


def _learned_gpt():
    return gpt("learned", max_len=8)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda m: m.generate(tokens(1, 9), 0), ValueError, r"prompt has 9 position.*max_len=8"),
        (
            lambda m: m.generate(tokens(1, 5), 5),
            ValueError,
            r"max_new_tokens=5 .* max_len=8; generate at most 4",
        ),
        (lambda m: m.generate(tokens(1, 2), 2, top_k=0), ValueError, "top_k must be >= 1"),
        (lambda m: m.generate(tokens(1, 2), 2, top_k=2.0), TypeError, "top_k must be an int"),
        (
            lambda m: m.generate(tokens(1, 2), 2, temperature=-0.1),
            ValueError,
            "temperature must be",
        ),
        (lambda m: m.generate(tokens(1, 2), -1), ValueError, "max_new_tokens must be >= 0"),
        (lambda m: m.generate(tokens(1, 2).float(), 2), TypeError, "prompt must be an integer"),
        (
            lambda m: m.generate(tokens(1, 2) + VOCAB, 2),
            ValueError,
            r"prompt must hold ids in \[0, 22\]",
        ),
        (
            lambda m: m.generate(tokens(3, 0), 2),
            ValueError,
            r"prompt must have at least one position.*<bos>",
        ),
        (
            lambda m: m.generate(tokens(0, 2), 2),
            ValueError,
            "prompt must hold at least one sequence",
        ),
        (
            lambda m: m.generate(tokens(1, 2), 2, eos_id=VOCAB),
            ValueError,
            r"eos_id must be in \[0, 22\]",
        ),
        (
            lambda m: m.generate(tokens(1, 2), 2, generator=0),
            TypeError,
            "generator must be a torch.Generator",
        ),
        (
            lambda m: m(tokens(2, 3), cache=KeyValueCache()),
            TypeError,
            "cache must be a DecoderOnlyCache",
        ),
        (
            lambda m: m(tokens(2, 3), cache=DecoderOnlyCache(1)),
            ValueError,
            r"one entry per layer \(2\)",
        ),
        (lambda m: m(tokens(2, 3), torch.ones(3, 3)), TypeError, "mask must be a boolean"),
    ],
)
def test_decoder_only_bad_inputs_name_the_argument(call, error, words):
    # Catches: a missing check (torch's own error, or a silent wrong answer, instead).
    with pytest.raises(error, match=words):
        call(_learned_gpt())


def test_learned_positions_run_out_with_a_cache():
    # Catches: the length check forgetting the cached positions.
    model = _learned_gpt()
    cache = model.new_cache()
    model(tokens(1, 6), cache=cache)
    with pytest.raises(ValueError, match=r"tokens has 3 position\(s\) starting at position 6"):
        model(tokens(1, 3), cache=cache)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: bert(num_classes=None).classify(tokens(1, 3)), ValueError, "num_classes=None"),
        (lambda: bert(pooling="max"), ValueError, r"pooling must be one of 'cls', 'mean'"),
        (lambda: bert(num_classes=0), ValueError, "num_classes must be >= 1"),
        (
            lambda: bert().encode_embeddings(
                torch.randn(2, 3, 16), torch.ones(2, 4, dtype=torch.bool)
            ),
            ValueError,
            r"mask must have shape \(batch, len\) = \(2, 3\)",
        ),
        (
            lambda: bert().encode_embeddings(torch.randn(2, 3, 8)),
            ValueError,
            r"x must have shape \(batch, len, 16\)",
        ),
        (
            lambda: bert("learned", max_len=4)(tokens(1, 5)),
            ValueError,
            r"tokens has 5 position.*max_len=4",
        ),
        (
            lambda: EncoderOnlyTransformer(config(src_vocab=None)),
            ValueError,
            r"config\.src_vocab must be set",
        ),
        (
            lambda: DecoderOnlyTransformer(config(tgt_vocab=None, tgt_pad_id=None)),
            ValueError,
            r"config\.tgt_vocab must be set",
        ),
        (
            lambda: DecoderOnlyTransformer({"d_model": 16}),
            TypeError,
            "config must be a TransformerConfig",
        ),
    ],
)
def test_encoder_only_and_construction_bad_inputs(make, error, words):
    # Catches: a missing check (an AttributeError on None, or a silent wrong answer).
    with pytest.raises(error, match=words):
        make()


# ------------------------------------------------------------------ torch.compile


def test_forward_and_loss_compile_without_a_graph_break():
    # Catches: a host synchronisation or a check on the decoder-only training path (a graph
    # break). The encoder-only model runs the Encoder that tests/test_compile.py covers.
    import torch._dynamo as dynamo

    model = gpt("rope", dropout=0.1).train()
    seq = tokens(3, 7, seed=21)
    seq[0, 5:] = PAD

    def forward_and_loss(ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids)  # (3, 7, vocab)
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten(), ignore_index=PAD)

    dynamo.reset()
    explanation = dynamo.explain(forward_and_loss)(seq)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


def test_the_public_helpers_check_their_inputs_when_called_directly():
    # Catches: next_token or a block with a cache running on wrong input (a silent wrong
    # answer or a deep torch error) when a reader calls them on their own.
    model = gpt()
    with pytest.raises(ValueError, match=r"logits must have shape \(batch, 23\)"):
        model.next_token(torch.randn(2, 7), 1.0)
    with pytest.raises(ValueError, match="temperature must be"):
        model.next_token(torch.randn(2, VOCAB), -1.0)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, src_len, 16\)"):
        model.layers[0](torch.randn(2, 3, 8), cache=KeyValueCache())


def test_a_block_with_a_cache_equals_the_causal_block_over_the_whole_sequence():
    # Catches: EncoderLayer.forward dropping its cache (each step would see only itself) or a
    # step whose positions restart at 0 (the block runs RoPE inside attention).
    model = gpt(positional="rope")
    layer = model.layers[0]
    x = torch.randn(2, 5, 16)
    expected = layer(x, is_causal=True)  # (2, 5, 16): the whole sequence at once
    cache = KeyValueCache()
    steps = [layer(x[:, :2], is_causal=True, cache=cache)]  # the first two positions
    steps += [layer(x[:, t : t + 1], cache=cache) for t in range(2, 5)]  # then one at a time
    assert max_abs_diff(torch.cat(steps, dim=1), expected) <= TOL
    assert cache.length == 5
