"""Exercises of chapter 7, "The whole Transformer".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several shapes and settings, including the
edge cases where a plausible wrong answer gives itself away), and returns a
:class:`~companion.exercises._checker.CheckResult` that is truthy when every case matches.
The checks call your function with keyword arguments, so keep the parameter names of the stub
in the notebook.

==============================================  =====================================
exercise                                        check
==============================================  =====================================
the fed token's own logit, with a given factor  :func:`check_own_logit`
the top-p mask, from sorted cumulative sums     :func:`check_top_p_mask`
one step of beam search                         :func:`check_beam_step`
one incremental decoding step, from the parts  :func:`check_decode_step`
may a beam search stop (``stop="bound"``)?      :func:`check_may_stop`
==============================================  =====================================
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from companion._validation import check_callable as _check_callable
from companion.cache import DecoderCache
from companion.data import PAD_ID
from companion.decode import length_penalty
from companion.exercises._checker import (
    Case,
    CheckResult,
    lengths_mask,
    run_check,
    seeded_generator,
)
from companion.layers import DecoderLayer
from companion.masking import padding_mask
from companion.model import Transformer, TransformerConfig

__all__ = [
    "check_own_logit",
    "check_top_p_mask",
    "check_beam_step",
    "check_decode_step",
    "check_may_stop",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: the fed token's own logit, with a given factor
# --------------------------------------------------------------------------------------------


def reference_own_logit(model: Transformer, src: Tensor, tgt_in: Tensor, scale: float) -> float:
    """The mean logit that ``model`` gives each fed token at its own position, with both
    embeddings' factor set to ``scale``; the model is left as it was found.

    ``logits[b, t]`` scores the token after ``tgt_in[b, t]``; its entry at ``tgt_in[b, t]``
    itself is the fed token's own logit, the one that section 7.4 finds on top at
    initialisation in a tied model.

    Args:
        model: a :class:`~companion.model.Transformer` in eval mode (no padding in the cases).
        src: ``(batch, src_len)`` source ids.
        tgt_in: ``(batch, tgt_len)`` decoder input ids.
        scale: the factor both embeddings multiply their rows by (``√d_model`` by default).
    """
    saved = model.src_embedding.scale, model.tgt_embedding.scale
    model.src_embedding.scale = model.tgt_embedding.scale = scale
    try:
        with torch.no_grad():
            logits = model(src, tgt_in)  # (batch, tgt_len, vocab)
    finally:
        model.src_embedding.scale, model.tgt_embedding.scale = saved
    return logits.gather(-1, tgt_in.unsqueeze(-1)).mean().item()  # the fed tokens' own logits


def _own_logit_cases() -> list[Case]:
    cases: list[Case] = []
    for seed, (norm_first, layers, tied) in enumerate(
        [(True, 1, True), (False, 1, True), (True, 2, True), (True, 1, False)]
    ):
        torch.manual_seed(700 + seed)  # the package initialises from the global generator
        config = TransformerConfig(
            src_vocab=60, tgt_vocab=60, d_model=32, num_heads=4, num_layers=layers, d_ff=64,
            dropout=0.0, norm_first=norm_first, tie_embeddings=tied,
        )  # fmt: skip
        model = _ReportedModel(config).eval()
        g = seeded_generator(710 + seed)
        if seed == 2:  # a trained generator has a bias: an answer that drops it must show
            with torch.no_grad():
                model.generator.bias.copy_(torch.randn(60, generator=g))
        src = torch.randint(4, 60, (3, 7), generator=g)  # (batch, src_len): no padding
        tgt_in = torch.randint(4, 60, (3, 5), generator=g)  # (batch, tgt_len)
        scales = (math.sqrt(32), 1.0, 3.0) if seed == 0 else (math.sqrt(32), 1.0)
        cases += [{"model": model, "src": src, "tgt_in": tgt_in, "scale": s} for s in scales]
    return cases


def _model_left_alone(own_logit: Callable[..., Any]) -> Callable[..., Any]:
    """``own_logit`` that must leave the model's factors and weights as it found them, and
    return a number (a one-element tensor is read as its value)."""

    @functools.wraps(own_logit)
    def wrapper(**kwargs: Any) -> Any:
        model = kwargs["model"]
        scales = model.src_embedding.scale, model.tgt_embedding.scale
        weights = {name: p.detach().clone() for name, p in model.named_parameters()}
        result = own_logit(**kwargs)
        now = model.src_embedding.scale, model.tgt_embedding.scale
        if now != scales:
            model.src_embedding.scale, model.tgt_embedding.scale = scales  # for the next cases
            raise RuntimeError(
                f"own_logit left the embeddings' scale at {now}, not the {scales} it found: set "
                "the factor back after the forward pass (try/finally)"
            )
        changed = [n for n, p in model.named_parameters() if not torch.equal(p, weights[n])]
        if changed:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(weights[name])
            raise RuntimeError(
                f"own_logit changed the model's weights ({', '.join(changed)}): change the "
                "embeddings' `scale` instead, and leave the parameters alone"
            )
        if isinstance(result, Tensor) and result.numel() == 1:
            result = result.item()
        if isinstance(result, bool) or not isinstance(result, (int, float, np.floating)):
            raise TypeError(f"own_logit should return a number, got {result!r}")
        return float(result)

    return wrapper


def check_own_logit(own_logit: Callable[..., float], verbose: bool = True) -> CheckResult:
    """Check ``own_logit(model, src, tgt_in, scale)`` → the mean logit of each fed token at its
    own position, with both embeddings' factor set to ``scale``, the model left unchanged."""
    _check_callable("the function to check", own_logit)
    return run_check(
        "own_logit",
        _model_left_alone(own_logit),
        reference_own_logit,
        _own_logit_cases(),
        atol=1e-4,
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: the top-p mask, from sorted cumulative sums
# --------------------------------------------------------------------------------------------


def reference_top_p_mask(probs: Tensor, top_p: float) -> Tensor:
    """Which tokens top-p keeps: the fewest most likely tokens whose probabilities add up to at
    least ``top_p``, and every token tied with the least likely of them; ``top_p = 1`` keeps
    every token (a rounded cumulative sum can reach 1 before the last, tiny probabilities).

    Args:
        probs: ``(..., vocab)`` probabilities, each row summing to 1.
        top_p: in ``(0, 1]``.

    Returns:
        ``(..., vocab)`` bool, ``True`` for the kept tokens, in the tokens' own order.
    """
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, _ = probs.sort(dim=-1, descending=True)  # (..., vocab)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (..., vocab): the better ones' mass
    needed = mass_before < top_p  # (..., vocab): the nucleus, in sorted order
    least = sorted_probs.masked_fill(~needed, math.inf).amin(dim=-1, keepdim=True)  # (..., 1)
    return probs >= least  # (..., vocab): ties with the least likely kept token kept too


def _top_p_cases() -> list[Case]:
    def row(*values: float) -> Tensor:
        return torch.tensor([values], dtype=torch.float32)  # (1, vocab)

    g = seeded_generator(720)
    random_rows = (torch.randn(2, 3, 12, generator=g) * 2).softmax(-1)  # (2, 3, 12)
    tiny_tail = torch.tensor([[0.0] * 40 + [30.0] + [0.0] * 9]).softmax(-1)  # (1, 50)
    return [
        # one token above top_p: it alone (cumsum < top_p keeps nothing)
        {"probs": row(0.03, 0.92, 0.05), "top_p": 0.9},
        # the token that crosses top_p is kept: 0.5 + 0.3 reaches 0.7
        {"probs": row(0.1, 0.5, 0.1, 0.3), "top_p": 0.7},
        # exactly reached: 0.5 + 0.25 = 0.75 (binary fractions, no rounding), nothing more
        {"probs": row(0.125, 0.5, 0.125, 0.25), "top_p": 0.75},
        # ties at the edge of the nucleus: the three 0.2s stay together
        {"probs": row(0.2, 0.4, 0.2, 0.2), "top_p": 0.5},
        {"probs": row(0.25, 0.25, 0.25, 0.25), "top_p": 0.3},
        # top_p = 1: every token, also where the float cumulative sum reaches 1 early
        {"probs": tiny_tail, "top_p": 1.0},
        {"probs": row(0.1, 0.6, 0.3), "top_p": 1.0},
        # a batch of rows in several dimensions, the tokens in random order
        {"probs": random_rows, "top_p": 0.3},
        {"probs": random_rows, "top_p": 0.9},
    ]


def _bool_mask(top_p_mask: Callable[..., Any]) -> Callable[..., Any]:
    """``top_p_mask`` whose answer must be a bool tensor of the probabilities' shape."""

    @functools.wraps(top_p_mask)
    def wrapper(**kwargs: Any) -> Any:
        result = top_p_mask(**kwargs)
        if not isinstance(result, Tensor) or result.dtype != torch.bool:
            raise TypeError(
                "top_p_mask should return a bool tensor (True = kept), got "
                + (f"a {result.dtype} tensor" if isinstance(result, Tensor) else repr(result))
            )
        return result

    return wrapper


def check_top_p_mask(top_p_mask: Callable[..., Tensor], verbose: bool = True) -> CheckResult:
    """Check ``top_p_mask(probs, top_p)`` → the bool mask of the tokens top-p keeps (ties with
    the least likely kept token kept too; every token at ``top_p = 1``)."""
    _check_callable("the function to check", top_p_mask)
    return run_check(
        "top_p_mask", _bool_mask(top_p_mask), reference_top_p_mask, _top_p_cases(), verbose=verbose
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: one step of beam search
# --------------------------------------------------------------------------------------------


def reference_beam_step(
    scores: Tensor, log_probs: Tensor, beam_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Keep the ``beam_size`` best one-token extensions of the beams, over all beams at once.

    A candidate "beam ``j`` + token ``w``" scores ``scores[b, j] + log_probs[b, j, w]`` (log
    probabilities add: probabilities multiply). All ``beam_size · vocab`` candidates of a
    sentence compete together, so one strong beam may supply several of the new beams.

    Args:
        scores: ``(batch, beam_size)`` cumulative log-probabilities of the beams; ``-inf`` for
            a beam that does not exist (at the first step only beam 0 does).
        log_probs: ``(batch, beam_size, vocab)`` log-probabilities of the next token.
        beam_size: number of beams kept.

    Returns:
        ``(new_scores, beams, tokens)``, each ``(batch, beam_size)``, best first:
        ``new_scores`` the candidates' scores, ``beams`` (long) which beam each extends,
        ``tokens`` (long) with which token.
    """
    batch, _, vocab = log_probs.shape
    candidates = scores[..., None] + log_probs  # (batch, beam_size, vocab)
    new_scores, index = candidates.view(batch, -1).topk(beam_size, dim=-1)  # (batch, beam_size)
    beams = index // vocab  # (batch, beam_size)
    tokens = index % vocab  # (batch, beam_size)
    return new_scores, beams, tokens


def _beam_cases() -> list[Case]:
    g = seeded_generator(714)

    def log_probs(batch: int, beam: int, vocab: int) -> Tensor:
        logits = 2.0 * torch.randn(batch, beam, vocab, generator=g)  # (batch, beam, vocab)
        return torch.log_softmax(logits, dim=-1)  # (batch, beam, vocab)

    def first_step(batch: int, beam: int) -> Tensor:
        scores = torch.full((batch, beam), -math.inf)  # (batch, beam)
        scores[:, 0] = 0.0
        return scores

    def running(batch: int, beam: int, low: float, high: float) -> Tensor:
        scores = low + (high - low) * torch.rand(batch, beam, generator=g)  # (batch, beam)
        return scores.sort(dim=-1, descending=True).values

    cases: list[Case] = [
        # the first step: only beam 0 exists, the others are -inf
        {"scores": first_step(2, 3), "log_probs": log_probs(2, 3, 7), "beam_size": 3},
        # vocab = beam_size at the first step: every token of beam 0 is kept
        {"scores": first_step(1, 4), "log_probs": log_probs(1, 4, 4), "beam_size": 4},
        # one sentence at its first step, the other in the middle of its search
        {
            "scores": torch.cat([first_step(1, 4), running(1, 4, -6.0, -2.0)]),
            "log_probs": log_probs(2, 4, 6),
            "beam_size": 4,
        },
        # beam_size = 1: greedy decoding
        {"scores": running(3, 1, -5.0, -1.0), "log_probs": log_probs(3, 1, 5), "beam_size": 1},
        # one dominant beam supplies several new beams
        {
            "scores": torch.tensor([[-1.0, -6.0, -7.5], [-2.0, -2.5, -9.0]]),
            "log_probs": log_probs(2, 3, 10),
            "beam_size": 3,
        },
        {"scores": running(2, 3, -8.0, -3.0), "log_probs": log_probs(2, 3, 10), "beam_size": 3},
        # long hypotheses: exp(scores) is 0 in float32
        {"scores": running(2, 3, -320.0, -280.0), "log_probs": log_probs(2, 3, 8), "beam_size": 3},
        # very long hypotheses: exp(scores) is 0 even in float64
        {"scores": running(1, 2, -900.0, -780.0), "log_probs": log_probs(1, 2, 6), "beam_size": 2},
    ]
    return cases


def _long_indices(beam_step: Callable[..., Any]) -> Callable[..., Any]:
    """``beam_step`` that raises when its ``beams`` or ``tokens`` are not ``torch.long``.

    Both are indices (``gather`` and ``index_select`` want ``long``); a float ``beams`` from
    ``(index / vocab).floor()`` has the right values but cannot index the cache."""

    @functools.wraps(beam_step)
    def wrapper(**kwargs: Any) -> Any:
        result = beam_step(**kwargs)
        if isinstance(result, tuple) and len(result) == 3:
            for name, value in zip(("beams", "tokens"), result[1:]):
                if isinstance(value, Tensor) and value.dtype != torch.long:
                    advice = (
                        "use // on the long index of topk, not / and floor"
                        if value.is_floating_point()
                        else "topk's index is already long: keep its dtype, without .int() or .to()"
                    )
                    raise TypeError(
                        f"{name} must be a torch.long tensor of indices, got dtype {value.dtype} "
                        f"({advice})"
                    )
        return result

    return wrapper


def check_beam_step(
    beam_step: Callable[..., tuple[Tensor, Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``beam_step(scores, log_probs, beam_size)`` →
    ``(new_scores, beams, tokens)``, each ``(batch, beam_size)``, best first; ``beams`` and
    ``tokens`` must be ``torch.long``."""
    _check_callable("the function to check", beam_step)
    return run_check(
        "beam_step", _long_indices(beam_step), reference_beam_step, _beam_cases(), verbose=verbose
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: one incremental decoding step, from the model's parts
# --------------------------------------------------------------------------------------------


def _refuse(what: str, parts: str) -> Callable[..., Any]:
    """A stand-in for ``what``'s own forward: the exercise asks for it built from ``parts``."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{what} refuses to run in this check: build it from the parts ({parts})"
        )

    return refused


def reference_decode_step(
    model: Transformer, token: Tensor, memory: Tensor, memory_mask: Tensor, cache: DecoderCache
) -> Tensor:
    """The logits of the newest target token, computed from the cache and the model's parts.

    ``cache`` holds the keys and values of the ``n = cache.length`` tokens decoded so far; the
    new token sits at position ``n`` (``<bos>`` is position 0). Written out::

        y = tgt_positions(tgt_embedding(token), n)       # × √d_model inside; position n, not 0
        for layer, kept in zip(decoder.layers, cache.layers):
            y = layer(y, memory, None, memory_mask, cache=kept)   # appends this step's k, v
        logits = generator(decoder.final_norm(y))        # final norm: Pre-LN only

    No target mask is needed: the one new query may see every cached key (all earlier).

    Args:
        model: a :class:`~companion.model.Transformer` with sinusoidal positions, dropout 0,
            in evaluation mode.
        token: the newest target ids ``(batch, 1)``.
        memory: the encoder output ``(batch, src_len, d_model)``.
        memory_mask: source padding ``(batch, 1, 1, src_len)`` (``True`` = a real token).
        cache: ``model.new_cache()`` after ``t`` earlier steps, updated in place.

    Returns:
        logits ``(batch, 1, tgt_vocab)``.
    """
    y = model.tgt_positions(model.tgt_embedding(token), cache.length)  # (batch, 1, d_model)
    for layer, kept in zip(model.decoder.layers, cache.layers):
        y = DecoderLayer.forward(layer, y, memory, None, memory_mask, cache=kept)  # (batch, 1, d)
    if model.decoder.final_norm is not None:  # Pre-LN only
        y = model.decoder.final_norm(y)
    return model.generator(y)  # (batch, 1, tgt_vocab)


class _ReportedModel(Transformer):
    """A :class:`~companion.model.Transformer` whose repr fits on one line of a report (which
    writes the type name before it)."""

    def __repr__(self) -> str:
        c = self.config
        return (
            f"(src_vocab={c.src_vocab}, tgt_vocab={c.tgt_vocab}, d_model={c.d_model}, "
            f"num_heads={c.num_heads}, num_layers={c.num_layers}, norm_first={c.norm_first})"
        )


_ReportedModel.__name__ = _ReportedModel.__qualname__ = "Transformer"


def _randomize_model(model: Transformer, g: torch.Generator) -> Transformer:
    """Random matrices, biases and norm gains/shifts (the final norms included), so that
    leaving out any part changes the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:  # (out, in) matrices and embedding tables
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _padded_ids(
    lengths: list[int], seq_len: int, vocab: int, g: torch.Generator, bos: bool
) -> Tensor:
    """Word ids (4 and up) ``(batch, seq_len)``, padded with ``PAD_ID`` after each length."""
    ids = torch.randint(4, vocab, (len(lengths), seq_len), generator=g)  # (batch, seq_len)
    if bos:
        ids[:, 0] = 1  # BOS_ID
    return ids.masked_fill(~lengths_mask(lengths, seq_len), PAD_ID)  # (batch, seq_len)


def _decode_cases() -> list[Case]:
    """Models and (source, target) pairs; the target has no padding (it is being generated)."""
    g = seeded_generator(716)
    settings = [
        # (src_vocab, tgt_vocab, d_model, heads, layers, d_ff, norm_first, tie,
        #  source lengths, src_len, tgt_len)
        (20, 25, 16, 4, 2, 32, True, False, [7, 4], 7, 5),  # Pre-LN: a final norm
        (20, 25, 16, 2, 2, 32, False, False, [6, 3], 6, 4),  # Post-LN: none
        (30, 30, 24, 3, 1, 48, True, True, [5, 2, 5], 5, 6),
        (18, 22, 8, 2, 3, 16, True, False, [3], 4, 7),  # one sentence, one pad
        (25, 20, 32, 8, 2, 64, False, True, [9, 1], 9, 3),  # a one-token source
    ]
    cases: list[Case] = []
    with torch.random.fork_rng(devices=[]):  # building models must not move the global seed
        for (src_vocab, tgt_vocab, d_model, heads, layers, d_ff, norm_first, tie,
             src_lengths, src_len, tgt_len) in settings:  # fmt: skip
            config = TransformerConfig(
                src_vocab=src_vocab,
                tgt_vocab=tgt_vocab,
                d_model=d_model,
                num_heads=heads,
                num_layers=layers,
                d_ff=d_ff,
                dropout=0.0,
                norm_first=norm_first,
                tie_embeddings=tie,
                src_pad_id=PAD_ID,
                tgt_pad_id=PAD_ID,
            )
            model = _randomize_model(_ReportedModel(config), g)
            batch = len(src_lengths)
            cases.append(
                {
                    "model": model,
                    "src": _padded_ids(src_lengths, src_len, src_vocab, g, bos=False),
                    "tgt_in": _padded_ids([tgt_len] * batch, tgt_len, tgt_vocab, g, bos=True),
                }
            )
    return cases


def _full_decode(model: Transformer, src: Tensor, tgt_in: Tensor) -> Tensor:
    """What every step must give: the whole prefix decoded at once, without a cache
    (``(batch, tgt_len, tgt_vocab)``; row ``t`` is the logits after ``tgt_in[:, : t + 1]``)."""
    src_mask = padding_mask(src, PAD_ID)  # (batch, 1, 1, src_len)
    with torch.no_grad():
        memory = Transformer.encode(model, src, src_mask)  # (batch, src_len, d_model)
        return Transformer.decode(model, tgt_in, memory, src_mask)  # (batch, tgt_len, vocab)


def _step_by_step(
    decode_step: Callable[..., Tensor], seen: dict[str, int] | None = None
) -> Callable[..., Any]:
    """``(model, src, tgt_in)`` → the logits of ``decode_step`` called once per target token
    with one cache, stacked ``(batch, tgt_len, tgt_vocab)``. While it runs, the model's own
    ``forward``, ``decode`` and ``decoder`` refuse: the step must be built from the parts.
    ``seen``, when given, receives the number of steps run and the cache's final length."""

    def run(model: Transformer, src: Tensor, tgt_in: Tensor) -> Any:
        src_mask = padding_mask(src, PAD_ID)  # (batch, 1, 1, src_len)
        with torch.no_grad():
            memory = Transformer.encode(model, src, src_mask)  # (batch, src_len, d_model)
        cache = model.new_cache()
        parts = "tgt_embedding, tgt_positions, decoder.layers, decoder.final_norm, generator"
        refused = {
            (model, "forward"): "model(...)",
            (model, "decode"): "model.decode",
            (model.decoder, "forward"): "model.decoder(...)",
        }
        for (owner, attribute), what in refused.items():
            setattr(owner, attribute, _refuse(what, parts))
        decoder_class = type(model.decoder)  # type(model.decoder).forward(...) refuses too
        class_forward = vars(decoder_class)["forward"]
        decoder_class.forward = _refuse(f"{decoder_class.__name__}.forward(...)", parts)  # type: ignore[method-assign]
        rows = []
        try:
            for t in range(tgt_in.shape[1]):
                with torch.no_grad():
                    out = decode_step(
                        model=model,
                        token=tgt_in[:, t : t + 1],  # (batch, 1)
                        memory=memory,
                        memory_mask=src_mask,
                        cache=cache,
                    )
                expected = (tgt_in.shape[0], 1, model.config.tgt_vocab)
                if not isinstance(out, Tensor) or tuple(out.shape) != expected:
                    return out  # the check reports the wrong type or shape
                rows.append(out)
                if seen is not None:
                    seen.update(steps=t + 1, cache_length=cache.length)
        finally:
            for owner, attribute in refused:
                delattr(owner, attribute)
            decoder_class.forward = class_forward  # type: ignore[method-assign]
        return torch.cat(rows, dim=1)  # (batch, tgt_len, tgt_vocab)

    return run


def check_decode_step(decode_step: Callable[..., Tensor], verbose: bool = True) -> CheckResult:
    """Check ``decode_step(model, token, memory, memory_mask, cache)`` → logits
    ``(batch, 1, tgt_vocab)`` of the newest token. The check feeds every token of ``tgt_in``
    in turn through one cache and compares the stacked logits with the whole prefix decoded
    at once, without a cache; ``model(...)``, ``model.decode`` and ``model.decoder(...)``
    raise while it runs."""
    _check_callable("the function to check", decode_step)
    seen: dict[str, int] = {}  # the last case's steps and final cache length, for the hint
    return run_check(
        "decode_step (every step of tgt_in, one cache)",
        _step_by_step(decode_step, seen),
        _full_decode,
        _decode_cases(),
        verbose=verbose,
        hint=lambda case, got: _first_wrong_step(case, got, seen),
    )


def _first_wrong_step(case: Case, got: Any, seen: dict[str, int] | None = None) -> str:
    """Name the first decoding step whose logits differ: the stacked rows are steps, so a
    wrong row ``t`` is a wrong step ``t`` (row 0 is the step fed ``<bos>``). When the cache
    did not grow by one token per step, say that instead: the layers were not given it."""
    if not isinstance(got, Tensor):
        return ""
    if seen and seen.get("cache_length") != seen.get("steps"):
        return (
            f"\n   After {seen['steps']} steps the cache holds {seen['cache_length']} token(s), not "
            f"{seen['steps']}: pass each layer its own cache (cache=cache.layers[i]), which it "
            f"extends by one token per step."
        )
    expected = _full_decode(**case)  # (batch, tgt_len, tgt_vocab)
    if got.shape != expected.shape:
        return ""
    wrong = ~torch.isclose(got, expected, atol=1e-5, rtol=1e-4).all(dim=-1).all(dim=0)  # (tgt_len,)
    if not bool(wrong.any()):
        return ""
    step = int(wrong.nonzero()[0])
    before = "every earlier step matches" if step else "it is the first step, fed <bos>"
    return (
        f"\n   The first wrong step is step {step} (the call that fed token {step} of tgt_in, "
        f"with {step} token(s) already cached); {before}."
    )


# --------------------------------------------------------------------------------------------
# Exercise 5: may a beam search stop? (stop="bound")
# --------------------------------------------------------------------------------------------


def reference_may_stop(
    finished: list[tuple[float, int]], open_log_probs: list[float], max_len: int, alpha: float
) -> bool:
    """Whether one sentence's beam search may stop under ``stop="bound"``.

    A finished hypothesis scores ``log P / lp(length)``. An open one's log P only falls as it
    grows, while ``lp`` grows with the length up to ``lp(max_len)``; so the best it can ever
    score is ``log P / lp(max_len)`` (log P <= 0). The search may stop once the best finished
    score is at least that bound for every open hypothesis; never without a finished one.

    Args:
        finished: ``(log_prob, length)`` of each finished hypothesis (``length`` counts ``<eos>``).
        open_log_probs: the running log-probability of each open hypothesis.
        max_len: the most tokens a hypothesis may reach.
        alpha: the length penalty's exponent (:func:`companion.decode.length_penalty`).
    """
    if not finished:
        return False
    best_finished = max(log_prob / length_penalty(length, alpha) for log_prob, length in finished)
    if not open_log_probs:
        return True
    return best_finished >= max(open_log_probs) / length_penalty(max_len, alpha)


def _may_stop_cases() -> list[Case]:
    # lp at alpha 0.6: lp(4) = 1.276, lp(5) = 1.359, lp(6) = 1.439, lp(12) = 1.868
    return [
        # no finished hypothesis: never stop (and max() of nothing must not be reached)
        {"finished": [], "open_log_probs": [-9.0, -12.0], "max_len": 12, "alpha": 0.6},
        # every hypothesis finished: stop
        {"finished": [(-3.0, 6)], "open_log_probs": [], "max_len": 12, "alpha": 0.6},
        # -2.0 / lp(5) = -1.47 < -2.5 / lp(12) = -1.34: the open one can still win
        # (raw log P: -2.0 > -2.5 would stop)
        {"finished": [(-2.0, 5)], "open_log_probs": [-2.5], "max_len": 12, "alpha": 0.6},
        # -1.47 >= -3.0 / lp(12) = -1.61: stop (without the finished side's lp, -2.0 < -1.61 would not)
        {"finished": [(-2.0, 5)], "open_log_probs": [-3.0], "max_len": 12, "alpha": 0.6},
        # the best finished decides, not the worst (-4.0 / lp(6) = -2.78) nor the last
        {
            "finished": [(-2.0, 5), (-4.0, 6)],
            "open_log_probs": [-3.0, -3.5],
            "max_len": 12,
            "alpha": 0.6,
        },
        {
            "finished": [(-4.0, 6), (-2.0, 5)],
            "open_log_probs": [-3.5, -3.0],
            "max_len": 12,
            "alpha": 0.6,
        },
        # the best open decides, not the first nor the worst: -2.2 / lp(12) = -1.18 > -1.47
        {
            "finished": [(-2.0, 5)],
            "open_log_probs": [-5.0, -2.2, -6.0],
            "max_len": 12,
            "alpha": 0.6,
        },
        # one finished, three open that cannot win: stop (fairseq's count would wait for 3)
        {
            "finished": [(-0.5, 4)],
            "open_log_probs": [-3.0, -4.0, -5.0],
            "max_len": 12,
            "alpha": 0.6,
        },
        # three finished, but an open one can still win: do not stop (fairseq's count would)
        {
            "finished": [(-2.0, 5), (-2.4, 5), (-2.6, 6)],
            "open_log_probs": [-2.3, -7.0, -8.0],
            "max_len": 12,
            "alpha": 0.6,
        },
        # the finished one's own length, not max_len: -2.0 / lp(12) = -1.07 would stop here
        {"finished": [(-2.0, 5)], "open_log_probs": [-2.3], "max_len": 12, "alpha": 0.6},
        # the bound is lp(max_len) exactly, in both directions (-2.0 / lp(5) = -1.472):
        # -2.7 / lp(12) = -1.445 can still win: go on (lp(11) or lp(10) would stop too early)
        {"finished": [(-2.0, 5)], "open_log_probs": [-2.7], "max_len": 12, "alpha": 0.6},
        # -2.8 / lp(12) = -1.499 cannot win: stop (lp(13) or lp(14) would wait needlessly)
        {"finished": [(-2.0, 5)], "open_log_probs": [-2.8], "max_len": 12, "alpha": 0.6},
        # alpha = 0: plain log P on both sides
        {"finished": [(-2.0, 5)], "open_log_probs": [-2.1], "max_len": 12, "alpha": 0.0},
        {"finished": [(-2.0, 5)], "open_log_probs": [-1.9], "max_len": 12, "alpha": 0.0},
        # alpha = 1 and a longer limit: -3.0 / lp(5) = -1.8 < -6.0 / lp(30) = -1.03: go on
        {"finished": [(-3.0, 5)], "open_log_probs": [-6.0], "max_len": 30, "alpha": 1.0},
        {"finished": [(-3.0, 5)], "open_log_probs": [-12.0], "max_len": 30, "alpha": 1.0},
        # the best finished AFTER the penalty: raw log P picks (-2.0, 3), -2.0 / lp(3) = -1.68,
        # which -2.5 / lp(12) = -1.34 could beat; (-2.1, 12) gives -1.12, which it cannot: stop
        {
            "finished": [(-2.0, 3), (-2.1, 12)],
            "open_log_probs": [-2.5],
            "max_len": 12,
            "alpha": 0.6,
        },
    ]


def _boolean(may_stop: Callable[..., Any]) -> Callable[..., Any]:
    """``may_stop`` whose answer must be a bool (or a NumPy bool, or a one-element bool tensor)."""

    @functools.wraps(may_stop)
    def wrapper(**kwargs: Any) -> Any:
        result = may_stop(**kwargs)
        if isinstance(result, Tensor) and result.numel() == 1:
            result = bool(result)
        if isinstance(result, np.bool_):
            result = bool(result)  # np.all(...) returns np.True_ / np.False_
        if not isinstance(result, bool):
            raise TypeError(f"may_stop should return True or False, got {result!r}")
        return result

    return wrapper


def check_may_stop(may_stop: Callable[..., bool], verbose: bool = True) -> CheckResult:
    """Check ``may_stop(finished, open_log_probs, max_len, alpha)`` → ``True`` when no open
    hypothesis can still beat the best finished one under the length penalty (``stop="bound"``)."""
    _check_callable("the function to check", may_stop)
    return run_check(
        "may_stop", _boolean(may_stop), reference_may_stop, _may_stop_cases(), verbose=verbose
    )
