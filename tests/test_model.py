"""The full model: parity of the encoder-decoder stacks with torch.nn.Transformer (with and
without final norms, Pre-LN and Post-LN), embeddings, configuration, weights for plots."""

import dataclasses
import math
import warnings

import pytest
import torch
from helpers import max_abs_diff, randomize_
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from companion.interop import load_from_torch, to_torch, to_torch_attn_mask
from companion.masking import causal_mask, padding_mask
from companion.model import Decoder, Encoder, TokenEmbedding, Transformer, TransformerConfig
from companion.utils import count_parameters

TOL = 1e-5
PAD = 0


def torch_transformer(d_model, heads, n_enc, n_dec, d_ff, activation, norm_first, final_norm):
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first"
        warnings.simplefilter("ignore")
        reference = nn.Transformer(
            d_model, heads, n_enc, n_dec, d_ff, dropout=0.1, activation=activation,
            batch_first=True, norm_first=norm_first,
        )  # fmt: skip
    if not final_norm:  # nn.Transformer always has final norms; remove them to compare
        reference.encoder.norm = None
        reference.decoder.norm = None
    return reference


def random_tokens(batch, length, vocab, gen, pad_probability=0.25):
    tokens = torch.randint(1, vocab, (batch, length), generator=gen)
    pads = torch.rand(batch, length, generator=gen) < pad_probability
    return tokens.masked_fill(pads, PAD)


@st.composite
def model_cases(draw):
    heads = draw(st.integers(1, 3))
    return {
        "batch": draw(st.integers(1, 3)),
        "heads": heads,
        "d_model": 2 * heads * draw(st.integers(1, 2)),
        "d_ff": draw(st.integers(1, 10)),
        "n_enc": draw(st.integers(1, 2)),
        "n_dec": draw(st.integers(1, 2)),
        "src_len": draw(st.integers(1, 6)),
        "tgt_len": draw(st.integers(1, 6)),
        "norm_first": draw(st.booleans()),
        "final_norm": draw(st.booleans()),
        "activation": draw(st.sampled_from(["relu", "gelu"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@settings(max_examples=80, deadline=None)
@given(model_cases())
def test_transformer_parity_with_torch(case):
    gen = torch.Generator().manual_seed(case["seed"])
    torch.manual_seed(case["seed"])
    batch, src_len, tgt_len = case["batch"], case["src_len"], case["tgt_len"]
    reference = torch_transformer(
        case["d_model"], case["heads"], case["n_enc"], case["n_dec"], case["d_ff"],
        case["activation"], case["norm_first"], case["final_norm"],
    )  # fmt: skip
    randomize_(reference, gen).eval()
    ours = Transformer(TransformerConfig(
        11, 13, case["d_model"], case["heads"], case["n_enc"], case["d_ff"], 0.1,
        case["norm_first"], num_decoder_layers=case["n_dec"], activation=case["activation"],
        final_norm=case["final_norm"], src_pad_id=PAD, tgt_pad_id=PAD,
    )).eval()  # fmt: skip
    load_from_torch(ours, reference)

    src = random_tokens(batch, src_len, 11, gen)
    tgt = random_tokens(batch, tgt_len, 13, gen)
    logits = ours(src, tgt)
    memory = ours.encode(src)

    # Feed the same embeddings + positions to torch's stacks.
    src_x = ours.src_positions(ours.src_embedding(src))  # (batch, src_len, d_model)
    tgt_x = ours.tgt_positions(ours.tgt_embedding(tgt))  # (batch, tgt_len, d_model)
    ref_memory = reference.encoder(src_x, src_key_padding_mask=src == PAD)
    ref_out = reference(
        src_x, tgt_x,
        tgt_mask=to_torch_attn_mask(causal_mask(tgt_len)),
        src_key_padding_mask=src == PAD,
        tgt_key_padding_mask=tgt == PAD,
        memory_key_padding_mask=src == PAD,
    )  # fmt: skip
    ref_logits = ours.generator(ref_out)

    assert logits.shape == (batch, tgt_len, 13)
    assert torch.isfinite(logits).all()
    # Rows that may attend to nothing (all-padding prefixes or sources) are excluded: torch
    # gives its bias or NaN there, ours zero attention - and they are never attended to.
    has_src = (src != PAD).any(1, keepdim=True)  # (batch, 1)
    has_tgt_key = (tgt != PAD).cumsum(1) > 0  # (batch, tgt_len): some real token at or before
    valid = has_src & has_tgt_key
    assert max_abs_diff(logits[valid], ref_logits[valid]) <= TOL
    real_src = has_src.expand(batch, src_len)
    assert max_abs_diff(memory[real_src], ref_memory[real_src]) <= TOL


@pytest.mark.parametrize("norm_first", [False, True])
def test_to_torch_round_trip(norm_first):
    torch.manual_seed(0)
    ours = Transformer(
        TransformerConfig(9, 9, 8, 2, 2, 16, 0.1, norm_first, src_pad_id=PAD, tgt_pad_id=PAD)
    ).eval()
    assert (ours.encoder.final_norm is not None) == norm_first  # default final_norm=norm_first
    reference = to_torch(ours).eval()
    assert (reference.encoder.norm is None) == (not norm_first)
    src, tgt = torch.tensor([[3, 4, 5, PAD]]), torch.tensor([[1, 2, 3]])
    ref_out = reference(
        ours.src_positions(ours.src_embedding(src)),
        ours.tgt_positions(ours.tgt_embedding(tgt)),
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(3),
        src_key_padding_mask=src == PAD,
        memory_key_padding_mask=src == PAD,
    )
    assert max_abs_diff(ours(src, tgt), ours.generator(ref_out)) <= TOL


def test_load_from_torch_requires_matching_final_norm():
    reference = torch_transformer(8, 2, 1, 1, 16, "relu", norm_first=False, final_norm=True)
    ours = Transformer(TransformerConfig(9, 9, 8, 2, 1, 16))  # Post-LN: no final norm by default
    with pytest.raises(ValueError, match=r"norm must be None .* final_norm=True"):
        load_from_torch(ours, reference)


def test_token_embedding_is_scaled_by_sqrt_d_model():
    embedding = TokenEmbedding(10, 16)
    tokens = torch.tensor([[1, 2, 3]])
    expected = embedding.embedding.weight[tokens] * math.sqrt(16)
    assert torch.equal(embedding(tokens), expected)
    assert embedding(tokens).shape == (1, 3, 16)


def test_tied_embeddings_share_one_matrix():
    model = Transformer(TransformerConfig(7, 11, 8, 2, 1, 16, tie_embeddings=True))
    assert model.generator.weight is model.tgt_embedding.weight
    untied = Transformer(TransformerConfig(7, 11, 8, 2, 1, 16))
    assert count_parameters(untied) - count_parameters(model) == 11 * 8


def test_config_round_trip_and_defaults():
    config = TransformerConfig(src_vocab=100, tgt_vocab=120)
    assert (config.d_model, config.num_heads, config.num_layers, config.d_ff) == (512, 8, 6, 2048)
    assert config.dropout == 0.1 and not config.norm_first
    small = dataclasses.replace(
        config, d_model=16, num_heads=2, num_layers=1, d_ff=32, tgt_pad_id=0
    )
    model = Transformer(small)
    assert model.config == small
    clone = Transformer(model.config)
    assert count_parameters(clone) == count_parameters(model)
    assert len(model.decoder.layers) == 1


def test_model_returns_logits_with_expected_shape():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(20, 30, 16, 4, 2, 32, src_pad_id=PAD, tgt_pad_id=PAD)
    ).eval()
    src = torch.randint(1, 20, (3, 7))
    tgt = torch.randint(1, 30, (3, 5))
    logits = model(src, tgt)
    assert logits.shape == (3, 5, 30)
    assert not torch.allclose(logits.softmax(-1).sum(-1), logits.sum(-1))  # not probabilities
    assert model.encode(src).shape == (3, 7, 16)


def test_decode_with_offset_matches_the_sequence_positions():
    """decode(..., offset) adds the positions offset, offset + 1, ... (for incremental decoding)."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(10, 10, 8, 2, 1, 16)).eval()
    src, tgt = torch.randint(0, 10, (1, 4)), torch.randint(0, 10, (1, 6))
    memory = model.encode(src)
    full = model.decode(tgt, memory)
    y = model.tgt_positions(model.tgt_embedding(tgt))  # what decode does with offset=0
    shifted = model.tgt_positions(model.tgt_embedding(tgt[:, 2:]), offset=2)
    assert max_abs_diff(y[:, 2:], shifted) <= TOL
    assert full.shape == (1, 6, 10)


def test_model_attention_weights_for_plots():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(10, 12, 8, 2, 3, 16, src_pad_id=PAD, tgt_pad_id=PAD)
    ).eval()
    src = torch.tensor([[4, 5, 6, PAD], [7, 8, PAD, PAD]])
    tgt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    plain = model(src, tgt)
    assert model.decoder.cross_attention_weights is None
    logits = model(src, tgt, need_weights=True)
    assert max_abs_diff(plain, logits) <= TOL
    cross = model.decoder.cross_attention_weights
    assert cross.shape == (3, 2, 2, 3, 4)  # (layers, batch, heads, tgt_len, src_len)
    assert model.encoder.attention_weights.shape == (3, 2, 2, 4, 4)
    assert model.decoder.attention_weights.shape == (3, 2, 2, 3, 3)
    # padding gets no weight, every row sums to 1
    assert cross[:, 1, :, :, 2:].abs().max() == 0
    assert torch.allclose(cross.sum(-1), torch.ones(3, 2, 2, 3), atol=1e-6)


def test_stacks_standalone():
    torch.manual_seed(0)
    config = TransformerConfig(num_layers=2, d_model=8, num_heads=2, d_ff=16, norm_first=True)
    encoder = Encoder(config)
    decoder = Decoder(config)
    assert encoder.final_norm is not None and decoder.final_norm is not None
    x, y = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    mask = padding_mask(torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]), 0)
    memory = encoder(x, mask)
    assert decoder(y, memory, memory_mask=mask).shape == (2, 3, 8)


def test_learned_positions_option():
    model = Transformer(TransformerConfig(10, 10, 8, 2, 1, 16, positional="learned", max_len=6))
    assert (
        count_parameters(model)
        == count_parameters(Transformer(TransformerConfig(10, 10, 8, 2, 1, 16))) + 2 * 6 * 8
    )
    with pytest.raises(ValueError, match="max_len=6"):
        model(torch.zeros(1, 7, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))


def test_training_step_reduces_loss():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(12, 12, 16, 2, 1, 32, dropout=0.0, src_pad_id=PAD, tgt_pad_id=PAD)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    src = torch.randint(1, 12, (8, 6))
    tgt = torch.cat([torch.ones(8, 1, dtype=torch.long), src], 1)  # copy task
    losses = []
    for _ in range(30):
        logits = model(src, tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_steps_match_the_whole_prefix(norm_first):
    """decode(..., cache=...) one token at a time == decode of the whole prefix (padding too)."""
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(12, 12, 8, 2, 2, 16, 0.1, norm_first, src_pad_id=PAD, tgt_pad_id=PAD)
    ).eval()
    src = torch.tensor([[3, 4, 5, PAD], [6, 7, 8, 9], [5, PAD, PAD, PAD]])
    tgt = torch.tensor([[1, 2, 3, 4, 5], [1, PAD, 7, 8, PAD], [1, 9, PAD, PAD, PAD]])
    src_mask = model.make_src_mask(src)
    memory = model.encode(src, src_mask)
    full = model.decode(tgt, memory, src_mask)
    cache = model.new_cache()
    steps = []
    for t in range(tgt.shape[1]):
        steps.append(model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache))
        assert cache.length == t + 1
    assert max_abs_diff(torch.cat(steps, 1), full) <= TOL
    # several tokens per step work too
    cache = model.new_cache()
    chunks = [model.decode(tgt[:, :2], memory, src_mask, cache=cache)]
    chunks.append(model.decode(tgt[:, 2:], memory, src_mask, cache=cache))
    assert max_abs_diff(torch.cat(chunks, 1), full) <= TOL


def test_cache_reorder_follows_the_beams():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(12, 12, 8, 2, 2, 16, src_pad_id=PAD, tgt_pad_id=PAD)
    ).eval()
    src = torch.tensor([[3, 4, 5], [6, 7, PAD]])
    tgt = torch.tensor([[1, 2, 3], [1, 4, 5]])
    memory = model.encode(src)
    src_mask = model.make_src_mask(src)
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, src_mask, cache=cache)
    rows = torch.tensor([1, 1, 0])  # beam search keeps row 1 twice and row 0 once
    cache.reorder(rows)
    step = model.decode(tgt[rows, 2:], memory[rows], src_mask[rows], cache=cache)
    full = model.decode(tgt[rows], memory[rows], src_mask[rows])
    assert max_abs_diff(step[:, 0], full[:, 2]) <= TOL


def test_cache_errors_are_clear():
    model = Transformer(TransformerConfig(12, 12, 8, 2, 1, 16))
    memory = torch.randn(2, 3, 8)
    tgt = torch.ones(2, 1, dtype=torch.long)
    with pytest.raises(TypeError, match="cache must be a DecoderCache, got dict"):
        model.decode(tgt, memory, cache={})
    cache = model.new_cache()
    with pytest.raises(ValueError, match=r"offset must be 0 with a cache .* got 3"):
        model.decode(tgt, memory, offset=3, cache=cache)
    model.decode(tgt, memory, cache=cache)
    with pytest.raises(
        ValueError, match=r"tgt must have the cache's batch size 2, got shape \(3, 1\)"
    ):
        model.decode(torch.ones(3, 1, dtype=torch.long), torch.randn(3, 3, 8), cache=cache)


# ------------------------------------------------- shared source embedding, is_causal


def test_tie_source_embedding_shares_one_matrix_three_ways():
    model = Transformer(TransformerConfig(50, 50, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                        tie_embeddings=True, tie_source_embedding=True))  # fmt: skip
    table = model.tgt_embedding.weight
    assert model.src_embedding.weight is table and model.generator.weight is table
    untied = Transformer(TransformerConfig(50, 50, d_model=16, num_heads=2, num_layers=1, d_ff=32))
    assert count_parameters(untied) - count_parameters(model) == 2 * 50 * 16
    # the shared matrix receives the gradient of all three uses
    src = torch.randint(0, 50, (2, 5))
    tgt = torch.randint(0, 50, (2, 4))
    model(src, tgt).sum().backward()
    assert table.grad is not None and table.grad[src.unique()].abs().sum() > 0


def test_tie_source_embedding_survives_a_state_dict_round_trip():
    kwargs = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, tie_source_embedding=True)
    a, b = (
        Transformer(TransformerConfig(30, 30, **kwargs)),
        Transformer(TransformerConfig(30, 30, **kwargs)),
    )
    b.load_state_dict(a.state_dict())
    assert b.src_embedding.weight is b.tgt_embedding.weight
    assert torch.equal(b.src_embedding.weight, a.tgt_embedding.weight)


def test_tie_source_embedding_needs_one_vocabulary():
    with pytest.raises(ValueError, match=r"tie_source_embedding.*src_vocab=30.*tgt_vocab=40"):
        TransformerConfig(src_vocab=30, tgt_vocab=40, tie_source_embedding=True)
    with pytest.raises(TypeError, match="tie_source_embedding"):
        TransformerConfig(src_vocab=30, tgt_vocab=30, tie_source_embedding="yes")


def test_paper_base_and_big_counts_on_the_meta_device():
    """Vaswani et al. (2017), Table 3 reports ~65M and ~213M parameters with a shared
    37,000-token vocabulary; with all three embeddings shared the count is 63.1M / 214.3M."""
    counts = []
    for d, heads, d_ff in ((512, 8, 2048), (1024, 16, 4096)):
        with torch.device("meta"):
            model = Transformer(TransformerConfig(37000, 37000, d, heads, 6, d_ff, tie_embeddings=True,
                                tie_source_embedding=True))  # fmt: skip
        assert model.generator.weight.is_meta
        counts.append(count_parameters(model))
    assert counts == [63_119_496, 214_282_376]


def test_decode_is_causal_false_lets_positions_see_the_future():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(20, 20, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
    )
    src, tgt = torch.randint(0, 20, (2, 5)), torch.randint(0, 20, (2, 6))
    memory = model.encode(src)
    causal = model.decode(tgt, memory)
    leaky = model.decode(tgt, memory, is_causal=False)
    assert torch.allclose(causal, model(src, tgt), atol=1e-6)
    # the last position sees everything either way; the earlier ones do not
    assert torch.allclose(leaky[:, -1], causal[:, -1], atol=1e-5)
    assert (leaky[:, :-1] - causal[:, :-1]).abs().max() > 1e-3
    with pytest.raises(TypeError, match="is_causal"):
        model.decode(tgt, memory, is_causal=None)


def test_learned_position_errors_name_src_and_tgt():
    """Issue 11, item 5: a sequence longer than the learned table is named ``src``/``tgt``."""
    from helpers import tiny_transformer

    model = tiny_transformer(11, positional="learned", max_len=5).eval()
    short, long = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)
    for call, name in (
        (lambda: model(long, short), "src"),
        (lambda: model(short, long), "tgt"),
        (lambda: model.encode(long), "src"),
        (lambda: model.decode(long, model.encode(short)), "tgt"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} has 7 positions, so it needs .* max_len=5"):
            call()
    memory = model.encode(short)
    with pytest.raises(ValueError, match=r"^tgt has 3 positions starting at position 4"):
        model.decode(short, memory, offset=4)
    cache = model.new_cache()
    model.decode(torch.ones(1, 4, dtype=torch.long), memory, cache=cache)  # positions 0..3
    model.decode(short[:, :1], memory, cache=cache)  # position 4: the last one
    with pytest.raises(ValueError, match=r"^tgt has 1 position starting at position 5"):
        model.decode(short[:, :1], memory, cache=cache)
    assert model(torch.ones(1, 5, dtype=torch.long), short).shape == (1, 3, 11)  # 5 fits
