"""Chapter 7 exercise checks: right answers pass, plausible wrong answers (an own logit read at
the next token or left with the factor changed, a top-p mask that drops the token crossing top_p,
splits ties or drops a tiny tail at top_p = 1, a beam step that multiplies log-probabilities or
picks per beam, a decoding step at position 0, ...) fail, calling the model itself instead of
building from the parts fails, stubs are reported without raising."""

from __future__ import annotations

import math

import pytest
import torch

from companion.data import BOS_ID, PAD_ID
from companion.decode import beam_search
from companion.exercises import ch07
from companion.model import Decoder, Transformer, TransformerConfig
from companion.positional import sinusoidal_table

# --------------------------------------------------------------------------------------------
# beam_step
# --------------------------------------------------------------------------------------------


def beam_correct(scores, log_probs, beam_size):
    batch, beams, vocab = log_probs.shape
    candidates = (scores.unsqueeze(-1) + log_probs).reshape(batch, beams * vocab)
    values, order = candidates.sort(dim=-1, descending=True)
    index = order[:, :beam_size]
    return values[:, :beam_size], torch.div(index, vocab, rounding_mode="floor"), index % vocab


def _beam_from(candidates, vocab, beam_size):
    top, index = candidates.reshape(candidates.shape[0], -1).topk(beam_size, dim=-1)
    return top, index // vocab, index % vocab


def beam_not_accumulated(scores, log_probs, beam_size):
    return _beam_from(log_probs, log_probs.shape[-1], beam_size)


def beam_multiplied(scores, log_probs, beam_size):
    return _beam_from(scores[..., None] * log_probs, log_probs.shape[-1], beam_size)


def beam_probability_space(scores, log_probs, beam_size):
    # multiplies probabilities: right in exact arithmetic, but exp(-300) is 0 in float32
    products = scores.exp()[..., None] * log_probs.exp()
    top, beams, tokens = _beam_from(products, log_probs.shape[-1], beam_size)
    return top.log(), beams, tokens


def beam_probability_space_float64(scores, log_probs, beam_size):
    products = scores.double().exp()[..., None] * log_probs.double().exp()
    top, beams, tokens = _beam_from(products, log_probs.shape[-1], beam_size)
    return top.log().float(), beams, tokens


def beam_per_beam(scores, log_probs, beam_size):
    # every beam keeps its own best token
    batch = scores.shape[0]
    best, tokens = (scores[..., None] + log_probs).max(dim=-1)  # (batch, beam_size)
    top, order = best.sort(dim=-1, descending=True)
    beams = torch.arange(beam_size).expand(batch, -1).gather(1, order)
    return top, beams, tokens.gather(1, order)


def beam_index_mod_beam_size(scores, log_probs, beam_size):
    vocab = log_probs.shape[-1]
    top, index = (scores[..., None] + log_probs).reshape(scores.shape[0], -1).topk(beam_size)
    return top, index % beam_size, index % vocab


def test_beam_step_accepts_correct():
    assert ch07.check_beam_step(beam_correct, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        beam_not_accumulated,
        beam_multiplied,
        beam_probability_space,
        beam_probability_space_float64,
        beam_per_beam,
        beam_index_mod_beam_size,
    ],
)
def test_beam_step_rejects_wrong(wrong):
    assert not ch07.check_beam_step(wrong, verbose=False)


@pytest.mark.parametrize("wrong", [beam_probability_space, beam_probability_space_float64])
def test_probability_space_passes_short_hypotheses(wrong):
    """Multiplying probabilities is only wrong through underflow: the long cases catch it."""
    short = [c for c in ch07._beam_cases() if bool((c["scores"] > -50).all())]
    assert ch07.run_check("t", wrong, ch07.reference_beam_step, short, verbose=False)


def test_beam_cases_have_no_ties_and_a_first_step():
    cases = ch07._beam_cases()
    for case in cases:
        scores, log_probs, k = case["scores"], case["log_probs"], case["beam_size"]
        assert log_probs.shape[-1] >= k
        candidates = (scores[..., None] + log_probs).view(scores.shape[0], -1)
        top = candidates.topk(min(k + 1, candidates.shape[1]), dim=-1).values
        finite = top[torch.isfinite(top)]
        gaps = (top[:, :-1] - top[:, 1:])[torch.isfinite(top[:, 1:])]
        assert finite.numel() and bool((gaps > 1e-4).all()), "a near-tie could flip the order"
    first = [c for c in cases if bool(torch.isinf(c["scores"]).any())]
    assert first and any(c["beam_size"] == 1 for c in cases)


def test_beam_reference_matches_companion_beam_search_first_step():
    """The same lines as beam_search: with one sentence, the first step's beams agree."""
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(20, 20, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
    )
    history = []
    src = torch.tensor([[5, 6, 7, 8]])
    beam_search(model, src, beam_size=3, max_len=3, length_penalty_alpha=0.0, history=history)
    model.eval()
    with torch.no_grad():
        memory = model.encode(src)
        logits = model.decode(torch.tensor([[1]]), memory)[:, -1]  # BOS_ID = 1
    logits[:, [0, 1]] = -math.inf  # beam_search never generates <pad> or <bos>
    log_probs = logits.log_softmax(-1)[:, None].expand(1, 3, 20)
    scores = torch.tensor([[0.0, -math.inf, -math.inf]])
    new_scores, beams, tokens = ch07.reference_beam_step(scores, log_probs, 3)
    assert torch.equal(tokens, history[0].tokens) and torch.equal(beams, history[0].parents)
    torch.testing.assert_close(new_scores, history[0].scores)


# --------------------------------------------------------------------------------------------
# reproducibility (stubs, crashes and references: the generic tests in test_exercises.py)
# --------------------------------------------------------------------------------------------


def test_cases_are_reproducible():
    first, second = ch07._own_logit_cases(), ch07._own_logit_cases()
    for a, b in zip(first, second):
        assert torch.equal(a["tgt_in"], b["tgt_in"]) and a["scale"] == b["scale"]
        for p, q in zip(a["model"].parameters(), b["model"].parameters()):
            assert torch.equal(p, q)
    for a, b in zip(ch07._top_p_cases(), ch07._top_p_cases()):
        assert torch.equal(a["probs"], b["probs"]) and a["top_p"] == b["top_p"]
    for a, b in zip(ch07._beam_cases(), ch07._beam_cases()):
        assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


# --------------------------------------------------------------------------------------------
# decode_step (one incremental decoding step, from the parts)
# --------------------------------------------------------------------------------------------


def _step(model, token, memory, memory_mask, cache, *, position="cache", scale=True, use_cache=True,
          final=True, cross_mask=True):  # fmt: skip
    """A decoding step written out, with switches for the classic mistakes."""
    d_model = model.config.d_model
    t = {"cache": cache.length, "zero": 0, "one_late": cache.length + 1}[position]
    y = model.tgt_embedding.weight[token] * (math.sqrt(d_model) if scale else 1.0)  # (batch, 1, d)
    y = y + sinusoidal_table(t + 1, d_model)[t]  # position t: the number of cached tokens
    for layer, kept in zip(model.decoder.layers, cache.layers):
        y = layer(y, memory, None, memory_mask if cross_mask else None,
                  cache=kept if use_cache else None)  # fmt: skip
    if final and model.decoder.final_norm is not None:
        y = model.decoder.final_norm(y)
    return model.generator(y)  # (batch, 1, tgt_vocab)


def step_correct(model, token, memory, memory_mask, cache):
    return _step(model, token, memory, memory_mask, cache)


def step_with_the_position_module(model, token, memory, memory_mask, cache):
    y = model.tgt_positions(model.tgt_embedding(token), offset=cache.length)  # (batch, 1, d)
    for layer, kept in zip(model.decoder.layers, cache.layers):
        y = layer(y, memory, None, memory_mask, cache=kept)
    if model.decoder.final_norm is not None:
        y = model.decoder.final_norm(y)
    return model.generator(y)


def step_at_position_zero(model, token, memory, memory_mask, cache):
    return _step(model, token, memory, memory_mask, cache, position="zero")


def step_one_position_late(model, token, memory, memory_mask, cache):
    return _step(model, token, memory, memory_mask, cache, position="one_late")


def step_unscaled(model, token, memory, memory_mask, cache):
    return _step(model, token, memory, memory_mask, cache, scale=False)


def step_without_the_cache(model, token, memory, memory_mask, cache):
    """The new token attends only to itself: the earlier tokens are forgotten."""
    return _step(model, token, memory, memory_mask, cache, use_cache=False)


def step_no_final_norm(model, token, memory, memory_mask, cache):
    return _step(model, token, memory, memory_mask, cache, final=False)


def step_no_cross_mask(model, token, memory, memory_mask, cache):
    return _step(model, token, memory, memory_mask, cache, cross_mask=False)


def step_calls_decode(model, token, memory, memory_mask, cache):
    return model.decode(token, memory, memory_mask, cache=cache)


def step_calls_the_decoder(model, token, memory, memory_mask, cache):
    y = model.tgt_positions(model.tgt_embedding(token), offset=cache.length)
    return model.generator(model.decoder(y, memory, None, memory_mask, cache=cache))


def step_full_forward_last_row(model, token, memory, memory_mask, cache):
    return model(token, token)[:, -1:]


def step_with_is_causal(model, token, memory, memory_mask, cache):
    y = model.tgt_positions(model.tgt_embedding(token), offset=cache.length)  # (batch, 1, d)
    for layer, kept in zip(model.decoder.layers, cache.layers):
        y = layer(y, memory, None, memory_mask, cache=kept, is_causal=True)
    if model.decoder.final_norm is not None:
        y = model.decoder.final_norm(y)
    return model.generator(y)


def test_decode_step_accepts_correct():
    assert ch07.check_decode_step(step_correct, verbose=False)
    assert ch07.check_decode_step(step_with_the_position_module, verbose=False)


def test_decode_step_with_is_causal_is_accepted_and_torch_aligns_it_top_left():
    """The solution says: is_causal=True is right with the package's cache (the causal mask is
    aligned bottom-right, the new query sees every cached key), while PyTorch's fused kernel aligns
    it top-left (a query of length 1 sees only key 0)."""
    assert ch07.check_decode_step(step_with_is_causal, verbose=False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 1, 1, 8, generator=g),
        torch.randn(1, 1, 4, 8, generator=g),
        torch.randn(1, 1, 4, 8, generator=g),
    )
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(top_left, v[:, :, :1])  # only key 0


@pytest.mark.parametrize(
    "wrong",
    [
        step_at_position_zero,
        step_one_position_late,
        step_unscaled,
        step_without_the_cache,
        step_no_final_norm,
        step_no_cross_mask,
    ],
)
def test_decode_step_rejects_wrong(wrong):
    assert not ch07.check_decode_step(wrong, verbose=False)


@pytest.mark.parametrize(
    "cheat", [step_calls_decode, step_calls_the_decoder, step_full_forward_last_row]
)
def test_decode_step_rejects_calling_the_model_itself(cheat):
    result = ch07.check_decode_step(cheat, verbose=False)
    assert not result and "build it from the parts" in result.message


def step_calls_the_decoder_class(model, token, memory, memory_mask, cache):
    """type(model.decoder).forward gets past the instance's refusal unless the class refuses too."""
    y = model.tgt_positions(model.tgt_embedding(token), offset=cache.length)
    decoded = type(model.decoder).forward(model.decoder, y, memory, None, memory_mask, cache=cache)
    return model.generator(decoded)


def test_decode_step_rejects_the_decoder_class_forward_and_restores_it():
    decoder_forward = vars(Decoder)["forward"]
    result = ch07.check_decode_step(step_calls_the_decoder_class, verbose=False)
    assert not result and "build it from the parts" in result.message, result.message
    assert vars(Decoder)["forward"] is decoder_forward, "the check must restore Decoder.forward"


def test_decode_step_leaves_the_models_whole_after_a_check():
    ch07.check_decode_step(step_calls_decode, verbose=False)
    case = ch07._decode_cases()[0]
    model = case["model"]
    for owner in (model, model.decoder):
        assert "forward" not in vars(owner) and "decode" not in vars(owner)
    assert model(case["src"], case["tgt_in"]).shape[-1] == model.config.tgt_vocab


def test_decode_cases_have_what_each_wrong_answer_needs():
    cases = ch07._decode_cases()
    assert any(c["model"].config.norm_first for c in cases)  # final norms exist
    assert any(not c["model"].config.norm_first for c in cases)
    assert all(c["tgt_in"].shape[1] > 2 for c in cases)  # several steps: positions matter
    assert all(bool((c["tgt_in"][:, 0] == BOS_ID).all()) for c in cases)
    assert all(not bool((c["tgt_in"] == PAD_ID).any()) for c in cases)  # generated: no padding
    assert any(bool((c["src"] == PAD_ID).any()) for c in cases)  # source padding
    for case in cases:
        model = case["model"]
        assert not model.training and model.config.dropout == 0.0
        assert bool((case["src"] != PAD_ID).any(dim=-1).all()), "every source has a real token"


def test_decode_step_expected_is_the_full_forward():
    """What the steps are compared with is model(src, tgt_in): row t after t + 1 tokens."""
    for case in ch07._decode_cases():
        expected = case["model"](case["src"], case["tgt_in"])
        torch.testing.assert_close(ch07._full_decode(**case), expected)


def test_decode_stub_is_not_attempted_and_cases_leave_the_seed_alone():
    def stub(model, token, memory, memory_mask, cache):
        raise NotImplementedError

    result = ch07.check_decode_step(stub, verbose=False)
    assert not result and "not attempted" in result.message
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    ch07._decode_cases()
    assert torch.equal(torch.rand(3), expected)


# --------------------------------------------------------------------------------------------
# round 3: float beam indices are refused
# --------------------------------------------------------------------------------------------


def beam_float_indices(scores, log_probs, beam_size):
    """The right values, but ``beams`` is float: ``(index / vocab).floor()``."""
    vocab = log_probs.shape[-1]
    top, index = (scores[..., None] + log_probs).reshape(scores.shape[0], -1).topk(beam_size)
    return top, (index / vocab).floor(), index % vocab


def test_beam_step_rejects_float_beams_with_a_clear_message(capsys):
    result = ch07.check_beam_step(beam_float_indices, verbose=False)
    assert not result
    assert "beams must be a torch.long tensor" in result.message and "float32" in result.message


def test_beam_step_rejects_float_tokens():
    def float_tokens(scores, log_probs, beam_size):
        top, beams, tokens = ch07.reference_beam_step(scores, log_probs, beam_size)
        return top, beams, tokens.float()

    result = ch07.check_beam_step(float_tokens, verbose=False)
    assert not result and "tokens must be a torch.long tensor" in result.message


def test_beam_step_int32_indices_get_advice_for_an_integer_dtype():
    """``(index // vocab).int()`` uses // already: the message must not tell the reader to."""

    def int32_indices(scores, log_probs, beam_size):
        top, beams, tokens = ch07.reference_beam_step(scores, log_probs, beam_size)
        return top, beams.int(), tokens

    result = ch07.check_beam_step(int32_indices, verbose=False)
    assert not result and "int32" in result.message and "already long" in result.message, (
        result.message
    )
    assert "not / and floor" not in result.message, result.message


def test_decode_step_without_the_cache_gets_a_hint_to_pass_it():
    """Layers called without ``cache=``: the cache never grows, and the hint says so."""
    result = ch07.check_decode_step(step_without_the_cache, verbose=False)
    assert not result and "the cache holds 0 token(s)" in result.message, result.message
    assert (
        "cache=cache.layers[i]" in result.message and "The first wrong step" not in result.message
    )


@pytest.mark.parametrize(
    ("wrong", "first_step"),
    [(step_at_position_zero, 1), (step_one_position_late, 0), (step_no_final_norm, 0)],
)
def test_decode_step_report_names_the_first_wrong_step(wrong, first_step):
    """A wrong row t of the stacked logits is a wrong step t: the report says which."""
    result = ch07.check_decode_step(wrong, verbose=False)
    assert not result and f"The first wrong step is step {first_step} " in result.message, (
        result.message
    )


# --------------------------------------------------------------------------------------------
# may_stop (exercise 5): the bound rule of beam search
# --------------------------------------------------------------------------------------------


def _lp(length, alpha):
    return ((5 + length) / 6) ** alpha


def stop_correct(finished, open_log_probs, max_len, alpha):
    if not finished:
        return False
    best = max(log_p / _lp(n, alpha) for log_p, n in finished)
    return all(best >= log_p / _lp(max_len, alpha) for log_p in open_log_probs)


def stop_tensor(finished, open_log_probs, max_len, alpha):
    """A right answer as a 0-d bool tensor, through torch."""
    if not finished:
        return torch.tensor(False)
    done = torch.tensor([log_p / _lp(n, alpha) for log_p, n in finished]).max()
    bound = torch.tensor(open_log_probs + [-math.inf]).max() / _lp(max_len, alpha)
    return done >= bound


def stop_raw_log_p(finished, open_log_probs, max_len, alpha):
    """No length penalty on either side."""
    return bool(finished) and max(lp for lp, _ in finished) >= max(
        open_log_probs, default=-math.inf
    )


def stop_open_not_penalised(finished, open_log_probs, max_len, alpha):
    """The open hypotheses' log P as their best score: too eager."""
    if not finished:
        return False
    best = max(lp / _lp(n, alpha) for lp, n in finished)
    return best >= max(open_log_probs, default=-math.inf)


def stop_finished_not_penalised(finished, open_log_probs, max_len, alpha):
    if not finished:
        return False
    return max(lp for lp, _ in finished) >= max(open_log_probs, default=-math.inf) / _lp(
        max_len, alpha
    )


def stop_best_by_raw_log_p(finished, open_log_probs, max_len, alpha):
    """The best finished picked by raw log P, then penalised (review s10rvF07b)."""
    if not finished:
        return False
    log_p, n = max(finished)
    return log_p / _lp(n, alpha) >= max(open_log_probs, default=-math.inf) / _lp(max_len, alpha)


def stop_worst_finished(finished, open_log_probs, max_len, alpha):
    if not finished:
        return False
    worst = min(lp / _lp(n, alpha) for lp, n in finished)
    return worst >= max(open_log_probs, default=-math.inf) / _lp(max_len, alpha)


def stop_first_open(finished, open_log_probs, max_len, alpha):
    if not finished:
        return False
    if not open_log_probs:
        return True
    best = max(lp / _lp(n, alpha) for lp, n in finished)
    return best >= open_log_probs[0] / _lp(max_len, alpha)


def stop_worst_open(finished, open_log_probs, max_len, alpha):
    if not finished:
        return False
    best = max(lp / _lp(n, alpha) for lp, n in finished)
    return best >= min(open_log_probs, default=-math.inf) / _lp(max_len, alpha)


def stop_fairseq_count(finished, open_log_probs, max_len, alpha):
    """fairseq's rule: as many finished hypotheses as the beam holds (here 3)."""
    return len(finished) >= 3 or not open_log_probs


def stop_finished_at_max_len(finished, open_log_probs, max_len, alpha):
    """The finished ones also divided by lp(max_len), not lp(their own length)."""
    if not finished:
        return False
    best = max(lp for lp, _ in finished) / _lp(max_len, alpha)
    return best >= max(open_log_probs, default=-math.inf) / _lp(max_len, alpha)


def stop_open_at_finished_length(finished, open_log_probs, max_len, alpha):
    """The open bound at the best finished one's length instead of max_len."""
    if not finished:
        return False
    best_lp, best_n = max(finished, key=lambda f: f[0] / _lp(f[1], alpha))
    return best_lp / _lp(best_n, alpha) >= max(open_log_probs, default=-math.inf) / _lp(
        best_n, alpha
    )


def stop_fixed_alpha(finished, open_log_probs, max_len, alpha):
    """alpha ignored: always 0.6."""
    return stop_correct(finished, open_log_probs, max_len, 0.6)


def stop_when_nothing_finished(finished, open_log_probs, max_len, alpha):
    """Stops although no hypothesis has finished: there would be nothing to return."""
    if not finished:
        return True
    return stop_correct(finished, open_log_probs, max_len, alpha)


def stop_numpy_no_guard(finished, open_log_probs, max_len, alpha):
    """A right answer through NumPy: returns np.True_ / np.False_ (np.all of no open one: True)."""
    import numpy as np

    if not finished:
        return np.False_
    best = max(log_p / _lp(n, alpha) for log_p, n in finished)
    return np.all([best >= log_p / _lp(max_len, alpha) for log_p in open_log_probs])


def _stop_bound_at(shift):
    """A may_stop whose open-side bound uses lp(max_len + shift) instead of lp(max_len)."""

    def may_stop(finished, open_log_probs, max_len, alpha):
        if not finished:
            return False
        best = max(log_p / _lp(n, alpha) for log_p, n in finished)
        return all(best >= log_p / _lp(max_len + shift, alpha) for log_p in open_log_probs)

    return may_stop


@pytest.mark.parametrize("shift", [-2, -1, 1, 2])
def test_may_stop_rejects_off_by_one_bound(shift):
    """lp(max_len - 1) or - 2 stops while an open hypothesis can still win (unsafe);
    lp(max_len + 1) or + 2 waits when none can (e.g. counting <eos> on top of max_len)."""
    assert not ch07.check_may_stop(_stop_bound_at(shift), verbose=False)
    assert ch07.check_may_stop(_stop_bound_at(0), verbose=False)


def test_may_stop_accepts_correct():
    assert ch07.check_may_stop(stop_correct, verbose=False)
    assert ch07.check_may_stop(stop_numpy_no_guard, verbose=False)
    assert ch07.check_may_stop(stop_tensor, verbose=False)
    assert ch07.check_may_stop(
        lambda finished, open_log_probs, max_len, alpha: ch07.reference_may_stop(
            finished, open_log_probs, max_len, alpha
        ),
        verbose=False,
    )


@pytest.mark.parametrize(
    "wrong",
    [
        stop_raw_log_p,
        stop_best_by_raw_log_p,
        stop_open_not_penalised,
        stop_finished_not_penalised,
        stop_worst_finished,
        stop_first_open,
        stop_worst_open,
        stop_fairseq_count,
        stop_finished_at_max_len,
        stop_open_at_finished_length,
        stop_fixed_alpha,
        stop_when_nothing_finished,
    ],
)
def test_may_stop_rejects_wrong(wrong):
    assert not ch07.check_may_stop(wrong, verbose=False)


def test_may_stop_helper_lp_is_the_package_length_penalty():
    """The wrong answers above use _lp: it must be the package's length penalty."""
    from companion.decode import length_penalty

    for length in (1, 5, 12, 30):
        for alpha in (0.0, 0.6, 1.0):
            assert math.isclose(length_penalty(length, alpha), _lp(length, alpha))


def test_may_stop_rejects_non_bool_and_reports_stub():
    result = ch07.check_may_stop(
        lambda finished, open_log_probs, max_len, alpha: 1.0, verbose=False
    )
    assert not result and "True or False" in result.message

    def stub(finished, open_log_probs, max_len, alpha):
        raise NotImplementedError

    result = ch07.check_may_stop(stub, verbose=False)
    assert not result and "not attempted" in result.message


# ------------------------------------------------------------------------------------------
# own_logit (exercise 1): the fed token's own logit, with a given factor
# ------------------------------------------------------------------------------------------


def _logits_at(model, src, tgt_in, src_scale, tgt_scale):
    saved = model.src_embedding.scale, model.tgt_embedding.scale
    model.src_embedding.scale, model.tgt_embedding.scale = src_scale, tgt_scale
    try:
        with torch.no_grad():
            return model(src, tgt_in)  # (batch, tgt_len, vocab)
    finally:
        model.src_embedding.scale, model.tgt_embedding.scale = saved


def own_correct(model, src, tgt_in, scale):
    logits = _logits_at(model, src, tgt_in, scale, scale)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_tensor_result(model, src, tgt_in, scale):  # a one-element tensor is fine
    logits = _logits_at(model, src, tgt_in, scale, scale)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean()


def own_by_one_hot(model, src, tgt_in, scale):  # another correct form
    logits = _logits_at(model, src, tgt_in, scale, scale)
    one_hot = torch.nn.functional.one_hot(tgt_in, logits.shape[-1]).float()
    return ((logits * one_hot).sum(-1)).mean().item()


def own_next_token(model, src, tgt_in, scale):  # scores the token that follows, not the fed one
    logits = _logits_at(model, src, tgt_in, scale, scale)
    return logits[:, :-1].gather(-1, tgt_in[:, 1:].unsqueeze(-1)).mean().item()


def own_top_logit(model, src, tgt_in, scale):  # the largest logit, whichever token it is
    return _logits_at(model, src, tgt_in, scale, scale).amax(-1).mean().item()


def own_log_prob(model, src, tgt_in, scale):
    logits = _logits_at(model, src, tgt_in, scale, scale).log_softmax(-1)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_probability(model, src, tgt_in, scale):
    logits = _logits_at(model, src, tgt_in, scale, scale).softmax(-1)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_target_factor_only(model, src, tgt_in, scale):  # the source keeps √d_model
    logits = _logits_at(model, src, tgt_in, model.src_embedding.scale, scale)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_scale_not_restored(model, src, tgt_in, scale):
    model.src_embedding.scale = model.tgt_embedding.scale = scale
    with torch.no_grad():
        logits = model(src, tgt_in)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_weights_rescaled(model, src, tgt_in, scale):  # rescales the table in place instead
    factor = scale / model.tgt_embedding.scale
    with torch.no_grad():
        model.tgt_embedding.embedding.weight.mul_(factor)
        model.src_embedding.embedding.weight.mul_(factor)
        logits = model(src, tgt_in)
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_without_bias(model, src, tgt_in, scale):  # x · w_y only: the generator's bias left out
    saved = model.src_embedding.scale, model.tgt_embedding.scale
    model.src_embedding.scale = model.tgt_embedding.scale = scale
    try:
        with torch.no_grad():
            logits = model(src, tgt_in) - model.generator.bias  # (batch, tgt_len, vocab)
    finally:
        model.src_embedding.scale, model.tgt_embedding.scale = saved
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()


def own_source_token(model, src, tgt_in, scale):  # the source's token at the same position
    logits = _logits_at(model, src, tgt_in, scale, scale)
    return logits.gather(-1, src[:, : tgt_in.shape[1]].unsqueeze(-1)).mean().item()


def test_own_logit_accepts_correct():
    assert ch07.check_own_logit(own_correct, verbose=False)
    assert ch07.check_own_logit(own_tensor_result, verbose=False)
    assert ch07.check_own_logit(own_by_one_hot, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        own_next_token,
        own_without_bias,
        own_top_logit,
        own_log_prob,
        own_probability,
        own_target_factor_only,
        own_scale_not_restored,
        own_weights_rescaled,
        own_source_token,
    ],
)
def test_own_logit_rejects_wrong(wrong):
    assert not ch07.check_own_logit(wrong, verbose=False)
    # the check puts the models back, so the reference still passes afterwards
    assert ch07.check_own_logit(own_correct, verbose=False)


def test_own_logit_reports_what_was_left_changed():
    result = ch07.check_own_logit(own_scale_not_restored, verbose=False)
    assert not result and "set the factor back" in result.message
    result = ch07.check_own_logit(own_weights_rescaled, verbose=False)
    assert not result and "weights" in result.message


def test_own_logit_cases_tell_the_factor_apart():
    """Each case model: the factor changes the own logit, and in the tied ones the fed token's
    logit is higher with the factor than without (the chapter's copying, small)."""
    cases = ch07._own_logit_cases()
    by_model = {}
    for case in cases:
        by_model.setdefault(id(case["model"]), []).append(case)
    for group in by_model.values():
        values = [ch07.reference_own_logit(**case) for case in group]
        assert len(set(round(v, 4) for v in values)) == len(values), values
        if group[0]["model"].config.tie_embeddings:
            assert values[0] > values[1], values  # √d_model first, then 1


def test_own_logit_limit_is_the_final_norms_bound():
    """The solution's prediction: with a huge factor, a tied one-layer Pre-LN model's own logit
    tends to √d · ‖e_y − mean(e_y)‖ (the final LayerNorm at its initial gain 1 and shift 0)."""
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab=50, tgt_vocab=50, d_model=64, num_heads=4, num_layers=1, d_ff=128,
        dropout=0.0, norm_first=True, tie_embeddings=True,
    )  # fmt: skip
    model = Transformer(config).eval()
    src, tgt_in = torch.randint(4, 50, (2, 6)), torch.randint(4, 50, (2, 5))
    table = model.tgt_embedding.embedding.weight[tgt_in]  # (2, 5, 64)
    centred = table - table.mean(-1, keepdim=True)
    bound = (math.sqrt(64) * centred.norm(dim=-1)).mean().item()
    assert abs(ch07.reference_own_logit(model, src, tgt_in, 1e6) - bound) < 1e-3 * bound


# ------------------------------------------------------------------------------------------
# top_p_mask (exercise 2): the top-p mask from sorted cumulative sums
# ------------------------------------------------------------------------------------------


def _nucleus_sorted(probs, top_p):
    sorted_probs, order = probs.sort(-1, descending=True)
    return sorted_probs, order, sorted_probs.cumsum(-1) - sorted_probs  # mass of the better ones


def top_p_correct(probs, top_p):
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, _, mass_before = _nucleus_sorted(probs, top_p)
    least = sorted_probs.masked_fill(mass_before >= top_p, math.inf).amin(-1, keepdim=True)
    return probs >= least


def top_p_float64(probs, top_p):  # sums in float64 (the case's tail then stays below 1)
    return top_p_no_special_case_for_one(probs.double(), top_p)


def top_p_via_count(probs, top_p):  # count the nucleus, then keep by value
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, _, mass_before = _nucleus_sorted(probs, top_p)
    count = (mass_before < top_p).sum(-1, keepdim=True)  # (..., 1)
    return probs >= sorted_probs.gather(-1, count - 1)


def top_p_cumsum_below(probs, top_p):  # drops the token that crosses top_p
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = probs.sort(-1, descending=True)
    keep = sorted_probs.cumsum(-1) < top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_cumsum_at_most(probs, top_p):
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = probs.sort(-1, descending=True)
    keep = sorted_probs.cumsum(-1) <= top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_mass_before_at_most(probs, top_p):  # one token too many when the sum hits top_p exactly
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, _, mass_before = _nucleus_sorted(probs, top_p)
    least = sorted_probs.masked_fill(mass_before > top_p, math.inf).amin(-1, keepdim=True)
    return probs >= least


def top_p_sorted_order(probs, top_p):  # the mask left in sorted order
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    _, _, mass_before = _nucleus_sorted(probs, top_p)
    return mass_before < top_p


def top_p_ties_by_sort_order(probs, top_p):  # the package's sampling rule: ties split by the sort
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    _, order, mass_before = _nucleus_sorted(probs, top_p)
    keep = mass_before < top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_no_special_case_for_one(probs, top_p):  # a float32 sum can reach 1 before the tail
    sorted_probs, _, mass_before = _nucleus_sorted(probs, top_p)
    least = sorted_probs.masked_fill(mass_before >= top_p, math.inf).amin(-1, keepdim=True)
    return probs >= least


def top_p_unsorted_cumsum(probs, top_p):  # sums in the tokens' own order
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    return probs.cumsum(-1) - probs < top_p


def top_p_ascending(probs, top_p):  # the least likely first
    if top_p == 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = probs.sort(-1)
    keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_each_above(probs, top_p):  # tokens whose own probability is at least 1 - top_p
    return probs >= 1 - top_p


def test_top_p_mask_accepts_correct():
    assert ch07.check_top_p_mask(top_p_correct, verbose=False)
    assert ch07.check_top_p_mask(top_p_float64, verbose=False)
    assert ch07.check_top_p_mask(top_p_via_count, verbose=False)


@pytest.mark.parametrize(
    "wrong",
    [
        top_p_cumsum_below,
        top_p_cumsum_at_most,
        top_p_mass_before_at_most,
        top_p_sorted_order,
        top_p_ties_by_sort_order,
        top_p_no_special_case_for_one,
        top_p_unsorted_cumsum,
        top_p_ascending,
        top_p_each_above,
    ],
)
def test_top_p_mask_rejects_wrong(wrong):
    assert not ch07.check_top_p_mask(wrong, verbose=False)


def test_top_p_mask_without_ties_is_the_packages_nucleus():
    """Away from ties and top_p = 1, the mask is where the package's top-p keeps probability."""
    from companion.decode import top_p_distribution

    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(3)) * 2
    for top_p in (0.2, 0.5, 0.9):
        kept = top_p_distribution(logits, top_p) > 0
        assert torch.equal(ch07.reference_top_p_mask(logits.softmax(-1), top_p), kept)


def test_top_p_mask_rejects_a_float_mask_and_reports_stub():
    result = ch07.check_top_p_mask(
        lambda probs, top_p: top_p_correct(probs, top_p).float(), verbose=False
    )
    assert not result and "bool tensor" in result.message

    def stub(probs, top_p):
        raise NotImplementedError

    result = ch07.check_top_p_mask(stub, verbose=False)
    assert not result and "not attempted" in result.message
