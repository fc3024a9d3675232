"""companion.decode: sampling (temperature, top-k) and the beam-search history."""

from __future__ import annotations

import math

import pytest
import torch

from companion.decode import BeamStep, beam_search, greedy_decode, sample_decode
from companion.model import Transformer, TransformerConfig

BOS, EOS, PAD = 1, 2, 0


def make_model(seed: int = 0, vocab: int = 12) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(
        vocab, vocab, d_model=32, num_heads=4, num_layers=1, d_ff=48, dropout=0.0,
        src_pad_id=PAD, tgt_pad_id=PAD,
    )).eval()  # fmt: skip


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
    model, src = make_model(), sources()
    greedy = greedy_decode(model, src, max_len=10)
    assert torch.equal(sample_decode(model, src, max_len=10, temperature=0), greedy)
    generator = torch.Generator().manual_seed(3)
    top1 = sample_decode(model, src, max_len=10, top_k=1, generator=generator)
    assert torch.equal(top1, greedy)


def test_same_generator_seed_same_samples_and_different_seeds_differ():
    model, src = make_model(), sources()
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
    model = make_model(seed=2)
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
    model, src = make_model(), sources()
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
        sample_decode(make_model(), sources(), **kwargs)


# ------------------------------------------------------------------ beam history


def test_history_replays_the_beams_and_their_scores():
    model, src = make_model(seed=4), sources()
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
    model, src = make_model(seed=5), sources()
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
        beam_search(make_model(), sources(), beam_size=2, max_len=4, history=())


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
