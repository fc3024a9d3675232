"""Where a cache, a checkpoint, a dtype or a sampling parameter crosses a public boundary of
the newer APIs (grouped-query heads, RoPE/ALiBi, latent attention, the two families,
family checkpoints): the right result, or one clear ``ValueError``/``TypeError`` naming the
argument - never a raw ``RuntimeError`` from ``torch.cat``, ``torch.multinomial`` or a
matrix product deep inside."""

from __future__ import annotations

import pytest
import torch
from helpers import max_abs_diff, tiny_transformer

from companion.attention import MultiHeadAttention
from companion.cache import DecoderCache, DecoderOnlyCache, KeyValueCache, LatentCache
from companion.checkpoint import model_checkpoint, model_from_checkpoint, save_checkpoint
from companion.decode import greedy_decode, sample_decode, sampling_distribution
from companion.families import DecoderOnlyTransformer, EncoderOnlyTransformer
from companion.latent_attention import MultiHeadLatentAttention
from companion.model import TransformerConfig

VOCAB, PAD = 23, 0


def config(**changes) -> TransformerConfig:
    """Small, Pre-LN, no dropout; ``changes`` override any field."""
    settings = dict(
        src_vocab=VOCAB,
        tgt_vocab=VOCAB,
        d_model=16,
        num_heads=4,
        num_layers=2,
        d_ff=32,
        dropout=0.0,
        norm_first=True,
        positional="rope",
        src_pad_id=PAD,
        tgt_pad_id=PAD,
        max_len=64,
    )
    return TransformerConfig(**(settings | changes))


def gpt(seed: int = 0, **changes) -> DecoderOnlyTransformer:
    torch.manual_seed(seed)
    return DecoderOnlyTransformer(config(**changes)).eval()


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=generator)


def filled_cache(model: DecoderOnlyTransformer, batch: int = 2, length: int = 3):
    cache = model.new_cache()
    model(tokens(batch, length), cache=cache)
    return cache


# ------------------------------------------------------------------ 1. head size of a cache


def test_a_cache_with_another_head_size_is_refused():
    """Batch and kv heads were checked, the head size was not: torch.cat failed."""
    attention = MultiHeadAttention(16, 4, num_kv_heads=2)  # head_dim 4
    x = torch.randn(2, 3, 16)
    cache = KeyValueCache(keys=torch.randn(2, 2, 3, 8), values=torch.randn(2, 2, 3, 8))
    with pytest.raises(ValueError, match=r"cache must hold keys of shape \(2, 2, len, 4\)"):
        attention(x, x, x, cache=cache)


def test_a_cross_attention_cache_with_another_head_size_is_refused():
    """A filled cross-attention cache is used as it is (never concatenated): the kernel failed."""
    attention = MultiHeadAttention(16, 4)
    x = torch.randn(2, 3, 16)
    cache = KeyValueCache(
        growing=False, keys=torch.randn(2, 4, 5, 2), values=torch.randn(2, 4, 5, 2)
    )
    with pytest.raises(ValueError, match=r"cache must hold keys of shape \(2, 4, len, 4\)"):
        attention(x, x, x, cache=cache)


def test_cache_values_must_match_the_keys():
    attention, x = MultiHeadAttention(16, 4), torch.randn(2, 3, 16)
    cache = KeyValueCache(keys=torch.randn(2, 4, 3, 4), values=torch.randn(2, 4, 2, 4))
    with pytest.raises(ValueError, match=r"cache.values must have the shape of cache.keys"):
        attention(x, x, x, cache=cache)


def test_a_cache_of_another_dtype_is_refused():
    """A float64 cache in a float32 module: torch.cat promoted, the kernel refused."""
    attention, x = MultiHeadAttention(16, 4), torch.randn(2, 3, 16)
    cache = KeyValueCache(keys=torch.randn(2, 4, 3, 4).double(), values=torch.randn(2, 4, 3, 4))
    with pytest.raises(TypeError, match=r"cache.keys must have dtype torch.float32"):
        attention(x, x, x, cache=cache)


# ------------------------------------------------------------------ 2. a cache of another model


@pytest.mark.parametrize(
    "other", [dict(num_kv_heads=2), dict(d_model=32, d_ff=64)], ids=["kv_heads", "d_model"]
)
def test_decoder_only_refuses_a_cache_of_another_model(other):
    model, cache = gpt(), filled_cache(gpt(**other))
    with pytest.raises(ValueError, match=r"cache.layers\[0\] must hold keys of shape"):
        model(tokens(2, 1), cache=cache)


@pytest.mark.parametrize(
    "other", [dict(num_kv_heads=2), dict(d_model=64, d_ff=64)], ids=["kv_heads", "d_model"]
)
def test_transformer_decode_refuses_a_cache_of_another_model(other):
    model, stranger = tiny_transformer(VOCAB), tiny_transformer(VOCAB, **other)
    src, step = tokens(2, 4), tokens(2, 1, seed=1)
    cache = stranger.new_cache()
    stranger.decode(step, stranger.encode(src), cache=cache)
    with pytest.raises(ValueError, match=r"cache.layers\[0\].self_attention must hold keys"):
        model.decode(step, model.encode(src), cache=cache)


def test_a_cache_whose_later_layer_is_foreign_is_refused():
    """The model-level check covers every layer, not only the first."""
    model = gpt()
    cache = filled_cache(model)
    cache.layers[1] = filled_cache(gpt(num_kv_heads=1)).layers[1]
    with pytest.raises(ValueError, match=r"cache.layers\[1\] must hold keys of shape"):
        model(tokens(2, 1), cache=cache)


def test_layers_of_one_cache_must_hold_the_same_positions():
    model = gpt()
    cache = filled_cache(model)
    cache.layers[1] = filled_cache(model, length=5).layers[1]
    with pytest.raises(ValueError, match=r"every layer must cache the same positions"):
        model(tokens(2, 1), cache=cache)


def test_a_cache_without_a_padding_record_is_refused_by_a_model_with_a_pad_id():
    """Filled by a model without a pad id: the padding mask would not cover the cached keys."""
    cache = filled_cache(gpt(tgt_pad_id=None))
    with pytest.raises(ValueError, match=r"cache.key_padding is None but the cache holds 3"):
        gpt()(tokens(2, 1), cache=cache)


def test_transformer_decode_refuses_a_cache_without_a_padding_record():
    stranger, model = tiny_transformer(VOCAB, pad_id=None), tiny_transformer(VOCAB)
    src, step = tokens(2, 4), tokens(2, 1, seed=1)
    cache = stranger.new_cache()
    stranger.decode(step, stranger.encode(src), cache=cache)
    with pytest.raises(ValueError, match=r"cache.key_padding is None"):
        model.decode(step, model.encode(src), cache=cache)


def test_decoder_cache_entries_must_be_layer_caches():
    model = tiny_transformer(VOCAB)
    cache = DecoderCache(1)
    cache.layers[0] = KeyValueCache()
    src = tokens(2, 4)
    with pytest.raises(TypeError, match=r"cache.layers\[0\] must be a DecoderLayerCache"):
        model.decode(tokens(2, 1), model.encode(src), cache=cache)


def test_a_cache_of_the_same_model_still_continues_exactly():
    """The new checks refuse nothing a model's own cache holds (segment memory included)."""
    model, sequence = gpt(), tokens(2, 6)
    whole = model(sequence)
    cache = DecoderOnlyCache(2)
    steps = [model(sequence[:, t : t + 1], cache=cache) for t in range(6)]
    assert max_abs_diff(torch.cat(steps, dim=1), whole) <= 1e-5
    cache.keep_last(2)
    assert model(tokens(2, 2), cache=cache).shape == (2, 2, VOCAB)


# ------------------------------------------------------------------ 3. learned positions


def test_generate_with_learned_positions_may_fill_max_len_plus_one():
    """The last new token is never fed back: positions up to max_len - 1 suffice for
    prompt_len + max_new_tokens = max_len + 1 (a prompt of max_len tokens gets one more)."""
    model = gpt(positional="learned", max_len=8)
    assert model.generate(tokens(1, 8), 1, temperature=0).shape == (1, 9)
    assert model.generate(tokens(1, 5), 4, temperature=0).shape == (1, 9)
    with pytest.raises(ValueError, match=r"max_new_tokens=5 .* max_len=8; generate at most 4"):
        model.generate(tokens(1, 5), 5)


def test_greedy_generation_at_the_last_learned_position_matches_the_whole_sequence():
    model, prompt = gpt(positional="learned", max_len=8), tokens(1, 5)
    out = model.generate(prompt, 4, temperature=0)  # (1, 9): fed positions 0..7
    logits = model(out[:, :-1])  # (1, 8, vocab), every position the model has
    assert torch.equal(
        out[:, -1], logits[:, -1].index_fill(-1, torch.tensor([PAD]), -torch.inf).argmax(-1)
    )


# ------------------------------------------------------------------ 4. a tiny temperature


def test_a_tiny_temperature_samples_the_greedy_token():
    """1e-40 passed the argument check and overflowed the logits: multinomial's raw error."""
    model, prompt = gpt(), tokens(2, 3)
    greedy = model.generate(prompt, 4, temperature=0)
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(model.generate(prompt, 4, temperature=1e-40, generator=generator), greedy)


def test_sampling_distribution_at_a_tiny_temperature_is_the_argmax():
    logits = torch.tensor([[1.0, 3.0, -2.0, -torch.inf], [0.5, 0.5, 0.0, 0.0]])
    probs = sampling_distribution(logits, 1e-40)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]))
    normal = sampling_distribution(logits, 0.7, top_k=2)
    assert (
        max_abs_diff(
            normal,
            torch.softmax(
                logits.masked_fill(logits < logits.topk(2).values[:, -1:], -torch.inf) / 0.7, -1
            ),
        )
        <= 1e-7
    )


def test_sample_decode_at_a_tiny_temperature_is_greedy():
    model, src = tiny_transformer(VOCAB), tokens(2, 5)
    greedy = greedy_decode(model, src, max_len=6)
    assert torch.equal(sample_decode(model, src, max_len=6, temperature=1e-40), greedy)


def test_sampling_distribution_refuses_integer_logits():
    with pytest.raises(TypeError, match=r"logits must be a floating-point tensor"):
        sampling_distribution(torch.tensor([1, 2, 3]), 1.0)


# ------------------------------------------------------------------ 5. a float64 checkpoint


@pytest.mark.parametrize(
    "kind", ["DecoderOnlyTransformer", "EncoderOnlyTransformer", "Transformer"]
)
def test_a_float64_model_comes_back_float64_and_exact(kind, tmp_path):
    """from_checkpoint built a float32 model and rounded the saved float64 weights into it."""
    torch.manual_seed(0)
    if kind == "Transformer":
        model = tiny_transformer(VOCAB).double()
        save_checkpoint(model_checkpoint(model, "Transformer"), tmp_path / "c.pt")
        back = model_from_checkpoint(tmp_path / "c.pt")
    else:
        cls = {
            "DecoderOnlyTransformer": DecoderOnlyTransformer,
            "EncoderOnlyTransformer": EncoderOnlyTransformer,
        }[kind]
        model = cls(config(positional="alibi")).double()
        save_checkpoint(model.to_checkpoint(), tmp_path / "c.pt")
        back = cls.from_checkpoint(tmp_path / "c.pt")
    for name, saved in model.state_dict().items():
        loaded = back.state_dict()[name]
        assert loaded.dtype == saved.dtype == torch.float64, name
        assert torch.equal(loaded, saved), name
    for name, buffer in back.named_buffers():  # ALiBi's slopes (not saved) follow the model
        if buffer.is_floating_point():
            assert buffer.dtype == torch.float64, name


def test_a_float32_checkpoint_still_loads_float32(tmp_path):
    model = gpt()
    save_checkpoint(model.to_checkpoint(), tmp_path / "c.pt")
    back = DecoderOnlyTransformer.from_checkpoint(tmp_path / "c.pt")
    assert all(p.dtype == torch.float32 for p in back.parameters())
    assert back.lm_head.weight is back.token_embedding.weight or not model.config.tie_embeddings


# ------------------------------------------------------------------ 6. latent attention, autocast


@pytest.mark.parametrize("absorbed", [False, True])
def test_latent_cache_under_bf16_autocast_continues(absorbed):
    """README: autocast is exempt from the dtype rule. The bf16 latents a step stored were
    refused by the next step with a TypeError."""
    torch.manual_seed(0)
    attention, x = MultiHeadLatentAttention(16, 4, 8).eval(), torch.randn(2, 4, 16)
    cache = LatentCache()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        whole, _ = attention(x, is_causal=True, absorbed=absorbed)
        first, _ = attention(x[:, :3], is_causal=True, cache=cache, absorbed=absorbed)
        assert cache.latents.dtype == torch.bfloat16
        last, _ = attention(x[:, 3:], cache=cache, absorbed=absorbed)
    steps = torch.cat([first, last], dim=1).float()
    assert max_abs_diff(steps, whole.float()) <= 0.05


def test_latent_cache_outside_autocast_keeps_the_dtype_rule():
    attention, x = MultiHeadLatentAttention(16, 4, 8), torch.randn(2, 1, 16)
    cache = LatentCache(latents=torch.randn(2, 3, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"cache.latents must have dtype torch.float32"):
        attention(x, cache=cache)
    cache = LatentCache(latents=torch.ones(2, 3, 8, dtype=torch.long))
    with pytest.raises(TypeError, match=r"cache.latents must be a floating-point tensor"):
        attention(x, cache=cache)


def test_decoder_only_cache_entries_must_be_key_value_caches():
    model, cache = gpt(), DecoderOnlyCache(2)
    cache.layers[0] = LatentCache()
    with pytest.raises(TypeError, match=r"cache.layers\[0\] must be a KeyValueCache"):
        model(tokens(2, 1), cache=cache)


# ------------------------------------------------------------------ the clinic's patient


def test_patient_greedy_decode_refuses_more_tokens_than_positions():
    """The patient feeds the whole prefix back: max_len tokens read positions 0..max_len-1,
    so max_len = the table's max_len is the most (one more failed in a broadcast, unnamed)."""
    from companion import clinic

    torch.manual_seed(0)
    model = clinic.Transformer(max_len=8).eval()
    src = torch.randint(4, clinic.VOCAB_SIZE, (2, 5))
    with torch.no_grad():
        assert clinic.greedy_decode(model, src, 8).shape == (2, 8)
        with pytest.raises(ValueError, match=r"max_len must be <= the model's max_len=8, got 9"):
            clinic.greedy_decode(model, src, 9)
        with pytest.raises(ValueError, match=r"x has 9 positions, the table max_len=8"):
            model.encode(torch.randint(4, clinic.VOCAB_SIZE, (2, 9)))
