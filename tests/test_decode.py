"""companion.decode: greedy decoding with and without the key/value cache, beam search."""

from __future__ import annotations

import itertools

import pytest
import torch

from companion.decode import beam_search, greedy_decode, length_penalty
from companion.model import Transformer, TransformerConfig

EOS, PAD = 2, 0


def make_model(
    norm_first: bool = False, vocab: int = 20, seed: int = 0, eos_bias: float = 2.0
) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(
        vocab, vocab, d_model=32, num_heads=4, num_layers=2, d_ff=48, dropout=0.1,
        norm_first=norm_first, src_pad_id=PAD, tgt_pad_id=PAD,
    ))  # fmt: skip
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
