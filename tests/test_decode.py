"""companion.decode: greedy decoding with and without the key/value cache, beam search."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from helpers import tiny_transformer

from companion.decode import (
    BeamStep,
    beam_search,
    greedy_decode,
    length_penalty,
    sample_decode,
    top_p_distribution,
)
from companion.model import Transformer, TransformerConfig

EOS, PAD = 2, 0


def make_model(
    norm_first: bool = False, vocab: int = 20, seed: int = 0, eos_bias: float = 2.0
) -> Transformer:
    model = tiny_transformer(vocab, seed=seed, num_layers=2, dropout=0.1, norm_first=norm_first)
    with torch.no_grad():  # make <eos> likely enough that sentences end at different steps
        model.generator.bias[EOS] = eos_bias
    return model


def padded_sources(seed: int = 1, vocab: int = 20) -> torch.Tensor:
    """Four sources of lengths 7, 3, 5, 1, right-padded with PAD: (4, 7)."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (4, 7), generator=generator)  # (4, 7)
    for row, length in enumerate((7, 3, 5, 1)):
        src[row, length:] = PAD
    return src


def check_format(out: torch.Tensor, max_len: int) -> None:
    """Rows: tokens, <eos>, then padding only; at most max_len tokens."""
    assert out.dtype == torch.long and out.shape[1] <= max_len
    for row in out.tolist():
        if EOS in row:
            end = row.index(EOS)
            assert all(t == PAD for t in row[end + 1 :])
            row = row[:end]
        assert PAD not in row and 1 not in row  # never <pad> or <bos> inside a sentence


# ------------------------------------------------------------------------- greedy


@pytest.mark.parametrize(("norm_first", "seed"), [(False, 0), (True, 1)])
def test_cache_gives_exactly_the_same_tokens(norm_first, seed):
    model = make_model(norm_first, seed=seed, eos_bias=1.0)
    src = padded_sources()
    cached = greedy_decode(model, src, max_len=12, use_cache=True)
    uncached = greedy_decode(model, src, max_len=12, use_cache=False)
    assert torch.equal(cached, uncached)
    check_format(cached, 12)
    lengths = [row.index(EOS) + 1 if EOS in row else 12 for row in cached.tolist()]
    assert len(set(lengths)) > 1  # the sentences really stopped at different steps


def test_cached_decoder_logits_match_the_full_decoder():
    model = make_model(norm_first=True).eval()
    src = padded_sources()
    tgt = torch.randint(4, 20, (4, 6))  # (4, 6)
    with torch.no_grad():
        src_mask = model.make_src_mask(src)
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)  # (4, 6, 20)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_a_translation():
    """A batch of sources of different lengths == each source decoded alone."""
    model = make_model()
    src = padded_sources()
    batch = greedy_decode(model, src, max_len=10)
    for row, length in enumerate((7, 3, 5, 1)):
        alone = greedy_decode(model, src[row : row + 1, :length], max_len=10)
        assert batch[row, : alone.shape[1]].tolist() == alone[0].tolist()
        assert all(t == PAD for t in batch[row, alone.shape[1] :].tolist())


def test_stops_at_eos():
    model = make_model()
    with torch.no_grad():
        model.generator.bias[EOS] = 100.0  # <eos> always wins
    out = greedy_decode(model, padded_sources(), max_len=10)
    assert out.tolist() == [[EOS]] * 4
    assert beam_search(model, padded_sources(), beam_size=3, max_len=10).tolist() == [[EOS]] * 4


def test_respects_max_len():
    model = make_model()
    with torch.no_grad():
        model.generator.bias[EOS] = -100.0  # <eos> never wins
    for max_len in (1, 5):
        out = greedy_decode(model, padded_sources(), max_len=max_len)
        assert out.shape == (4, max_len) and EOS not in out.tolist()
        beams = beam_search(model, padded_sources(), beam_size=2, max_len=max_len)
        assert beams.shape == (4, max_len) and EOS not in beams.tolist()


def test_one_length_limit_per_sentence():
    model = make_model()
    with torch.no_grad():
        model.generator.bias[EOS] = -100.0  # <eos> never wins
    src = padded_sources()
    limits = [3, 1, 5, 2]
    alone = [
        greedy_decode(model, src[i : i + 1], max_len=n)[0].tolist() for i, n in enumerate(limits)
    ]
    for out in (
        greedy_decode(model, src, max_len=limits),
        greedy_decode(model, src, max_len=torch.tensor(limits), use_cache=False),
        beam_search(model, src, beam_size=1, max_len=limits),
    ):
        assert out.shape == (4, 5)
        for row, n in enumerate(limits):
            assert out[row].tolist() == alone[row] + [PAD] * (5 - n)
    beams = beam_search(model, src, beam_size=3, max_len=limits)
    assert [int((row != PAD).sum()) for row in beams] == limits


def test_restores_training_mode():
    model = make_model().train()
    greedy_decode(model, padded_sources(), max_len=3)
    assert model.training
    beam_search(model.eval(), padded_sources(), beam_size=2, max_len=3)
    assert not model.training


# ------------------------------------------------------------------------- beam search


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_of_one_is_greedy(norm_first, alpha):
    model = make_model(norm_first, seed=3)
    src = padded_sources(seed=4)
    greedy = greedy_decode(model, src, max_len=15)
    beam = beam_search(model, src, beam_size=1, max_len=15, length_penalty_alpha=alpha)
    assert torch.equal(beam, greedy)


def sequence_score(model, src, tokens, alpha):
    """log P(tokens | src) / lp(len), by running the full decoder."""
    with torch.no_grad():
        memory = model.encode(src)
        tgt = torch.tensor([[1, *tokens[:-1]]])  # (1, len)
        logits = model.decode(tgt, memory).float()  # (1, len, V)
        logits[..., [PAD, 1]] = -float("inf")  # decoding never generates <pad> or <bos>
        log_probs = torch.log_softmax(logits, -1)[0]  # (len, V)
    total = sum(float(log_probs[t, token]) for t, token in enumerate(tokens))
    return total / length_penalty(len(tokens), alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_wide_beam_finds_the_best_sequence(alpha):
    """With max_len 2 and a beam wider than the vocabulary nothing that could win is pruned:
    beam search must return the best of all outputs of at most 2 tokens (exhaustive search)."""
    vocab = 6
    model = make_model(vocab=vocab, seed=5).eval()
    with torch.no_grad():
        model.generator.bias[EOS] = 0.5
    src = torch.tensor([[4, 5, 3]])  # (1, 3)
    words = range(3, vocab)  # everything but <pad>, <bos>, <eos>
    candidates = (
        [[EOS]] + [[a, EOS] for a in words] + [list(p) for p in itertools.product(words, repeat=2)]
    )
    best = max(candidates, key=lambda seq: sequence_score(model, src, seq, alpha))
    found = beam_search(model, src, beam_size=vocab + 2, max_len=2, length_penalty_alpha=alpha)
    assert found[0, : len(best)].tolist() == best


def test_beam_search_batch_matches_single_sentences():
    model = make_model(seed=7)
    src = padded_sources(seed=8)
    batch = beam_search(model, src, beam_size=3, max_len=10)
    check_format(batch, 10)
    for row, length in enumerate((7, 3, 5, 1)):
        alone = beam_search(model, src[row : row + 1, :length], beam_size=3, max_len=10)
        assert batch[row, : alone.shape[1]].tolist() == alone[0].tolist()


def beam_to_max_len(model, src, beam_size, max_len, alpha):
    """A plain beam search that never stops early: the same candidates as beam_search (the top
    2·beam_size, <eos> counted among the top beam_size), run to max_len; the best finished one."""
    with torch.no_grad():
        memory = model.encode(src)  # (1, src_len, d_model)
    beams, finished = [([1], 0.0)], []  # (tokens from <bos>, log P)
    for step in range(1, max_len + 1):
        with torch.no_grad():
            tgt = torch.tensor([tokens for tokens, _ in beams])  # (beams, step)
            logits = model.decode(tgt, memory.expand(len(beams), -1, -1))[:, -1].float()
        logits[:, [PAD, 1]] = -math.inf  # never <pad> or <bos>
        scores = torch.tensor([s for _, s in beams])[:, None] + logits.log_softmax(-1)
        values, index = scores.flatten().topk(2 * beam_size)
        opened = []
        for rank, (value, i) in enumerate(zip(values.tolist(), index.tolist())):
            parent, token = divmod(i, scores.shape[1])
            if token == EOS:
                if rank < beam_size:
                    finished.append((value, step, beams[parent][0][1:] + [EOS]))
            elif len(opened) < beam_size:
                opened.append((beams[parent][0] + [token], value))
        beams = opened
    finished += [(s, max_len, tokens[1:]) for tokens, s in beams]  # open at max_len: finished
    return max(finished, key=lambda h: h[0] / length_penalty(h[1], alpha))[2]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_bound_stop_returns_what_a_search_to_max_len_returns(alpha):
    """stop="bound" (tensor2tensor's rule) stops only when no open hypothesis can still win, so
    it returns what the same search run to max_len returns; fairseq's rule (stop at beam_size
    finished) differs on some of these sentences, so the option is not ignored."""
    model = make_model(seed=0, eos_bias=5.0).eval()
    with (
        torch.no_grad()
    ):  # sharper next-token distributions: a longer sentence can outscore a short one
        model.generator.weight.mul_(5.0)
    sources = torch.randint(4, 20, (12, 5), generator=torch.Generator().manual_seed(6))
    bound = beam_search(
        model, sources, beam_size=3, max_len=8, length_penalty_alpha=alpha, stop="bound"
    )
    fairseq = beam_search(model, sources, beam_size=3, max_len=8, length_penalty_alpha=alpha)
    differ = 0
    for row in range(len(sources)):
        reference = beam_to_max_len(model, sources[row : row + 1], 3, 8, alpha)
        assert bound[row, : len(reference)].tolist() == reference
        assert all(t == PAD for t in bound[row, len(reference) :].tolist())
        differ += fairseq[row].tolist() != bound[row].tolist()
        found = [t for t in fairseq[row].tolist() if t != PAD]
        assert (
            sequence_score(model, sources[row : row + 1], found, alpha)
            <= sequence_score(model, sources[row : row + 1], reference, alpha) + 1e-5
        )
    assert differ > 0, "expected fairseq's stop to return another answer on some sentence"


def test_bound_stop_rejects_unknown_rules():
    with pytest.raises(ValueError, match=r"stop must be 'fairseq' or 'bound', got 't2t'"):
        beam_search(make_model(), padded_sources(), stop="t2t")


def test_length_penalty_values():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(1, 1.0) == 1.0  # (5 + 1) / 6
    assert length_penalty(7, 0.5) == pytest.approx(2**0.5)  # ((5 + 7) / 6) ** 0.5


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m, s: beam_search(m, s, beam_size=0), ValueError, r"beam_size must be >= 1, got 0"),
        (lambda m, s: beam_search(m, s, beam_size=2.0), TypeError, r"beam_size must be an int, got float"),
        (lambda m, s: greedy_decode(m, s, max_len=0), ValueError, r"max_len must be >= 1, got 0"),
        (lambda m, s: beam_search(m, s, max_len=-1), ValueError, r"max_len must be >= 1, got -1"),
        (lambda m, s: beam_search(m, s, length_penalty_alpha=-0.5), ValueError, r"alpha must be a finite number >= 0, got -0.5"),
        (lambda m, s: greedy_decode(torch.nn.Linear(2, 2), s), TypeError, r"model must be a companion.model.Transformer, got Linear"),
        (lambda m, s: greedy_decode(m, s.float()), TypeError, r"src must be an integer tensor"),
        (lambda m, s: greedy_decode(m, s[0]), ValueError, r"src must have shape \(batch, src_len\)"),
        (lambda m, s: greedy_decode(m, s, use_cache=1), TypeError, r"use_cache must be a bool"),
        (lambda m, s: length_penalty(0, 0.6), ValueError, r"length must be >= 1, got 0"),
        (lambda m, s: greedy_decode(m, s, max_len=[3, 3]), ValueError, r"max_len must be an int or hold one limit per sentence, shape \(4,\), got shape \(2,\)"),
        (lambda m, s: beam_search(m, s, max_len=[3, 0, 3, 3]), ValueError, r"max_len must be >= 1 for every sentence, got 0"),
        (lambda m, s: greedy_decode(m, s, max_len=2.5), TypeError, r"max_len must be an int or one int per sentence, got float"),
    ],
)  # fmt: skip
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(make_model(), padded_sources())


# ---------------------------------------------------------------------- companion.decode: sampling (temperature, top-k) and the beam


BOS, EOS, PAD = 1, 2, 0


def make_sampling_model(seed: int = 0, vocab: int = 12) -> Transformer:
    return tiny_transformer(vocab, seed=seed).eval()


def sources(seed: int = 1, vocab: int = 12) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (3, 6), generator=generator)  # (3, 6)
    src[1, 4:] = PAD
    return src


def first_step_logits(model: Transformer, src: torch.Tensor) -> torch.Tensor:
    """The logits of the first generated token, ``(batch, vocab)``."""
    with torch.no_grad():
        memory = model.encode(src)
        bos = torch.full((src.shape[0], 1), BOS)
        return model.decode(bos, memory, model.make_src_mask(src))[:, -1]


def test_temperature_zero_and_top_1_are_greedy():
    model, src = make_sampling_model(), sources()
    greedy = greedy_decode(model, src, max_len=10)
    assert torch.equal(sample_decode(model, src, max_len=10, temperature=0), greedy)
    generator = torch.Generator().manual_seed(3)
    top1 = sample_decode(model, src, max_len=10, top_k=1, generator=generator)
    assert torch.equal(top1, greedy)


def test_same_generator_seed_same_samples_and_different_seeds_differ():
    model, src = make_sampling_model(), sources()
    runs = [
        sample_decode(
            model, src, max_len=10, temperature=2.0, generator=torch.Generator().manual_seed(s)
        )
        for s in (5, 5, 6)
    ]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.5, None), (2.0, 4)])
def test_first_token_frequencies_follow_the_tempered_distribution(temperature, top_k):
    model = make_sampling_model(seed=2)
    src = sources()[:1].repeat(4000, 1)  # one sentence, 4000 times: (4000, 6)
    logits = first_step_logits(model, src[:1])[0]  # (vocab,)
    logits[[PAD, BOS]] = -math.inf
    if top_k is not None:
        logits[logits < logits.topk(top_k).values[-1]] = -math.inf
    expected = torch.softmax(logits / temperature, dim=-1)  # (vocab,)
    out = sample_decode(
        model, src, max_len=1, temperature=temperature, top_k=top_k,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    counts = torch.bincount(out[:, 0], minlength=expected.numel()).double()
    observed = counts / counts.sum()
    # 4000 draws: a frequency's standard error is at most 0.008; 0.035 is > 4 of them
    assert (observed - expected).abs().max() < 0.035
    assert observed[expected == 0].sum() == 0  # never outside the top-k, never <pad>/<bos>


def test_sampling_format_and_limits():
    model, src = make_sampling_model(), sources()
    out = sample_decode(
        model, src, max_len=[3, 5, 7], temperature=1.5, generator=torch.Generator().manual_seed(1)
    )
    assert out.shape[0] == 3 and out.shape[1] <= 7
    for row, limit in zip(out.tolist(), (3, 5, 7)):
        end = row.index(EOS) + 1 if EOS in row else len([t for t in row if t != PAD])
        assert end <= limit
        assert all(t == PAD for t in row[end:])


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"temperature": math.nan}, ValueError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"top_k": 0}, ValueError, "top_k"),
        ({"generator": 3}, TypeError, "generator"),
        ({"max_len": 0}, ValueError, "max_len"),
    ],
)
def test_sampling_bad_input(kwargs, error, words):
    with pytest.raises(error, match=words):
        sample_decode(make_sampling_model(), sources(), **kwargs)


# ------------------------------------------------------------------ beam history


def test_history_replays_the_beams_and_their_scores():
    model, src = make_sampling_model(seed=4), sources()
    history: list[BeamStep] = []
    out = beam_search(model, src, beam_size=3, max_len=8, history=history)
    assert len(history) >= 1 and all(isinstance(h, BeamStep) for h in history)
    assert torch.equal(out, beam_search(model, src, beam_size=3, max_len=8))  # no side effect
    # Follow each open beam of sentence 0 back to the root, then score its tokens by hand.
    steps = [h for h in history if h.parents[0, 0] >= 0]
    last = steps[-1]
    for j in range(3):
        if not math.isfinite(float(last.scores[0, j])):
            continue
        path, beam = [], j
        for h in reversed(steps):
            path.append(int(h.tokens[0, beam]))
            beam = int(h.parents[0, beam])
        path.reverse()
        tgt = torch.tensor([[BOS, *path]])  # (1, len + 1)
        with torch.no_grad():
            memory = model.encode(src[:1])
            logits = model.decode(tgt[:, :-1], memory, model.make_src_mask(src[:1]))[0]
        logits[:, [PAD, BOS]] = -math.inf
        log_probs = torch.log_softmax(logits, dim=-1)  # (len, vocab)
        by_hand = log_probs.gather(1, tgt[0, 1:, None]).sum()
        assert abs(float(by_hand) - float(last.scores[0, j])) < 1e-4


def test_history_scores_never_increase_and_first_step_has_one_parent():
    model, src = make_sampling_model(seed=5), sources()
    history: list[BeamStep] = []
    beam_search(model, src, beam_size=4, max_len=6, history=history)
    assert torch.all(history[0].parents[history[0].parents >= 0] == 0)  # only beam 0 alive
    for h in history:
        open_scores = h.scores[torch.isfinite(h.scores)]
        assert torch.all(open_scores <= 1e-6)  # log-probabilities
        assert torch.all(h.scores[:, :-1] >= h.scores[:, 1:])  # sorted, best first
        for sentence, parent, log_prob, score in h.finished:
            assert 0 <= sentence < 3 and 0 <= parent < 4 and log_prob <= 0
            assert score >= log_prob  # dividing a negative number by lp >= 1


def test_history_must_be_a_list():
    with pytest.raises(TypeError, match="history"):
        beam_search(make_sampling_model(), sources(), beam_size=2, max_len=4, history=())


# ------------------------------------------------------------------ devices


class _Stop(Exception):
    """Raised by a patched ``encode`` once it has seen its inputs."""


@pytest.mark.parametrize("decode", [greedy_decode, beam_search, sample_decode])
def test_inputs_are_moved_to_the_model_device(decode, monkeypatch):
    """A model on another device (``meta`` here, a GPU on Colab) gets its inputs there."""
    with torch.device("meta"):
        model = Transformer(
            TransformerConfig(
                12, 12, d_model=16, num_heads=2, num_layers=1, d_ff=16, src_pad_id=PAD
            )
        )
    seen = {}

    def encode(src, src_mask=None, need_weights=False):
        seen["src"], seen["src_mask"] = src.device.type, src_mask.device.type
        raise _Stop

    monkeypatch.setattr(model, "encode", encode)
    src = torch.randint(3, 12, (2, 5))  # (2, 5) on the CPU
    src_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)  # on the CPU
    with pytest.raises(_Stop):
        decode(model, src, max_len=4, src_mask=src_mask)
    assert seen == {"src": "meta", "src_mask": "meta"}


def test_sampling_generator_must_be_on_the_model_device():
    with torch.device("meta"):
        model = Transformer(
            TransformerConfig(12, 12, d_model=16, num_heads=2, num_layers=1, d_ff=16)
        )
    with pytest.raises(ValueError, match=r"generator must be on the model's device \(meta\)"):
        sample_decode(model, sources(), generator=torch.Generator())


def test_sampling_distribution_needs_a_positive_temperature_and_k():
    from companion.decode import sampling_distribution

    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sampling_distribution(logits, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        sampling_distribution(logits, 1.0, top_k=0)
    assert torch.equal(sampling_distribution(logits, 1.0, top_k=9), torch.softmax(logits, -1))


@pytest.mark.parametrize("decode", [greedy_decode, beam_search, sample_decode])
def test_decoding_checks_the_source_once_with_a_mask_cross_attention_can_use(decode):
    """The loops run unchecked, so the source mask is checked up front against what the
    decoder's cross-attention needs, ``(batch, heads, 1, src_len)``, not the encoder's."""
    model = make_sampling_model()
    src = sources()  # (3, 6)
    square = torch.ones(3, 1, 6, 6, dtype=torch.bool)  # fine for the encoder only
    with pytest.raises(ValueError, match=r"src_mask of shape \(3, 1, 6, 6\) does not broadcast"):
        decode(model, src, max_len=4, src_mask=square)
    with pytest.raises(ValueError, match=r"src must hold ids in \[0, 11\]"):
        decode(model, src + 20, max_len=4)


# --------------------------------------------------------------------------------------------
# top_p_distribution (nucleus sampling)
# --------------------------------------------------------------------------------------------


def nucleus_by_loop(logits: torch.Tensor, top_p: float, temperature: float) -> torch.Tensor:
    """One row at a time, in plain Python: add the most likely tokens until the mass reaches
    top_p, then renormalise."""
    out = torch.zeros_like(logits)
    for row, row_logits in enumerate(logits):
        probs = torch.softmax(row_logits / temperature, dim=-1).tolist()
        order = sorted(range(len(probs)), key=lambda j: -probs[j])
        mass, kept = 0.0, []
        for j in order:
            if mass >= top_p:
                break
            kept.append(j)
            mass += probs[j]
        for j in kept:
            out[row, j] = probs[j] / mass
    return out


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_top_p_matches_a_loop_and_keeps_the_smallest_nucleus(top_p, temperature):
    gen = torch.Generator().manual_seed(11)
    logits = 2.0 * torch.randn(6, 15, generator=gen, dtype=torch.float64)  # (batch, vocab)
    got = top_p_distribution(logits, top_p, temperature)  # (batch, vocab)
    torch.testing.assert_close(got, nucleus_by_loop(logits, top_p, temperature))
    torch.testing.assert_close(got.sum(-1), torch.ones(6, dtype=torch.float64))
    full = torch.softmax(logits / temperature, dim=-1)  # (batch, vocab)
    kept = got > 0  # (batch, vocab)
    mass = (full * kept).sum(-1)  # (batch,)
    assert bool((mass >= top_p - 1e-12).all()), "the nucleus holds at least top_p"
    smallest_kept = full.masked_fill(~kept, math.inf).amin(-1)  # (batch,)
    assert bool((mass - smallest_kept < top_p).all()), "without its least likely token, < top_p"
    dropped_best = full.masked_fill(kept, -math.inf).amax(-1)  # (batch,)
    assert bool((dropped_best <= smallest_kept).all()), "the kept tokens are the most likely"


def test_top_p_adapts_where_top_k_cannot():
    sure = torch.tensor([8.0, 1.0, 0.5, 0.0, -0.5, -1.0])  # (vocab,): one clear winner
    unsure = torch.zeros(6)  # (vocab,): all equally likely
    assert int(top_p_distribution(sure, 0.9).gt(0).sum()) == 1
    assert int(top_p_distribution(unsure, 0.9).gt(0).sum()) == 6
    assert int(top_p_distribution(unsure, 0.5).gt(0).sum()) == 3  # 3 × 1/6 = 0.5 exactly


def test_top_p_edges_and_leading_axes():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 9, generator=gen)  # (..., vocab)
    every = top_p_distribution(logits, 1.0)
    torch.testing.assert_close(every, torch.softmax(logits, -1))  # top_p = 1: all tokens
    one = top_p_distribution(logits, 1e-6)  # only the best token of each row
    assert torch.equal(one, one_hot_best(logits))
    forbidden = logits.clone()
    forbidden[..., 0] = -math.inf  # never drawn
    assert bool((top_p_distribution(forbidden, 0.95)[..., 0] == 0).all())
    huge = torch.tensor([[1e4, 0.0, -1e4]])  # no NaN from an extreme logit
    assert torch.equal(top_p_distribution(huge, 0.5), torch.tensor([[1.0, 0.0, 0.0]]))


def one_hot_best(logits: torch.Tensor) -> torch.Tensor:
    """One-hot of each row's largest logit, as floats."""
    best = logits.argmax(-1, keepdim=True)  # (..., 1)
    return torch.zeros_like(logits).scatter(-1, best, 1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"logits": torch.zeros(4, dtype=torch.long), "top_p": 0.9}, TypeError, "logits"),
        ({"logits": torch.tensor(1.0), "top_p": 0.9}, ValueError, "logits"),
        ({"logits": torch.zeros(4), "top_p": 0.0}, ValueError, "top_p must be in (0, 1]"),
        ({"logits": torch.zeros(4), "top_p": 1.5}, ValueError, "top_p must be in (0, 1], got 1.5"),
        ({"logits": torch.zeros(4), "top_p": True}, TypeError, "top_p"),
        ({"logits": torch.zeros(4), "top_p": "0.9"}, TypeError, "got str"),
        ({"logits": torch.zeros(4), "top_p": 0.9, "temperature": 0}, ValueError, "temperature"),
        ({"logits": torch.zeros(4), "top_p": 0.9, "temperature": -1.0}, ValueError, "temperature"),
    ],
)
def test_top_p_bad_input(kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)):
        top_p_distribution(**kwargs)


# ------------------------------------------------------------------ sample_decode(top_p=)


def test_sampling_top_p_none_and_one_change_nothing():
    model, src = make_sampling_model(), sources()

    def draw(**kwargs: object) -> torch.Tensor:
        generator = torch.Generator().manual_seed(7)
        return sample_decode(model, src, max_len=10, temperature=1.5, generator=generator, **kwargs)

    plain = draw()
    assert torch.equal(draw(top_p=None), plain), "top_p=None must keep the old samples"
    assert torch.equal(draw(top_p=1.0), plain), "top_p=1 keeps every token: same samples"
    assert torch.equal(draw(top_p=1.0, top_k=4), draw(top_k=4)), "top_p=1 composes as no-op"
    assert not torch.equal(draw(top_p=0.3), plain), "a small nucleus must change the samples"


def test_sampling_tiny_top_p_and_temperature_zero_are_greedy():
    model, src = make_sampling_model(), sources()
    greedy = greedy_decode(model, src, max_len=10)
    generator = torch.Generator().manual_seed(3)
    tiny = sample_decode(model, src, max_len=10, temperature=2.0, top_p=1e-6, generator=generator)
    assert torch.equal(tiny, greedy), "a nucleus of mass 1e-6 holds only the best token"
    cold = sample_decode(model, src, max_len=10, temperature=0, top_p=0.5)
    assert torch.equal(cold, greedy), "temperature 0 is greedy whatever top_p is"


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, None, 0.7), (2.0, 6, 0.8)])
def test_first_token_frequencies_follow_the_nucleus(temperature, top_k, top_p):
    model = make_sampling_model(seed=2)
    src = sources()[:1].repeat(4000, 1)  # one sentence, 4000 times: (4000, 6)
    logits = first_step_logits(model, src[:1])[0]  # (vocab,)
    logits[[PAD, BOS]] = -math.inf
    if top_k is not None:  # top-k first, then the temperature, then the nucleus
        logits[logits < logits.topk(top_k).values[-1]] = -math.inf
    expected = top_p_distribution(logits, top_p, temperature)  # (vocab,)
    assert 1 < int(expected.gt(0).sum()) < int(logits.isfinite().sum()), "a real nucleus"
    out = sample_decode(
        model, src, max_len=1, temperature=temperature, top_k=top_k, top_p=top_p,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    counts = torch.bincount(out[:, 0], minlength=expected.numel()).double()
    observed = counts / counts.sum()
    assert (observed - expected).abs().max() < 0.035  # > 4 standard errors, as above
    assert observed[expected == 0].sum() == 0, "never a token outside the nucleus"


@pytest.mark.parametrize(
    ("top_p", "error"),
    [(0.0, ValueError), (-0.2, ValueError), (1.5, ValueError), (math.nan, ValueError),
     ("0.9", TypeError), (True, TypeError)],
)  # fmt: skip
def test_sampling_bad_top_p(top_p, error):
    with pytest.raises(error, match="top_p"):
        sample_decode(make_sampling_model(), sources(), top_p=top_p)
