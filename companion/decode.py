"""Decoding (built step by step in chapter 7, used by the translator of chapter 8): turn a
trained model's logits into output sentences.

* :func:`greedy_decode` - batched greedy decoding: at every step take the most likely token.
  With ``use_cache=True`` (default) the decoder keeps a **key/value cache**: each layer's
  self-attention keys and values of the tokens generated so far, and the cross-attention keys
  and values of the encoder output (``memory``), computed once. A step then feeds only the
  newest token through the decoder instead of the whole prefix: ``O(t)`` work for step ``t``
  instead of ``O(t²)``, with exactly the same tokens (``benchmarks/kv_cache.py`` measures the
  speed-up).
* :func:`beam_search` - keeps the ``beam_size`` best partial translations per sentence and
  ranks finished ones with the GNMT length penalty (:func:`length_penalty`), so that short
  translations are not favoured just because they multiply fewer probabilities. Pass a list
  as ``history`` to see every step's beams (:class:`BeamStep`), e.g. to draw the beam tree.
* :func:`sample_decode` - draw each next token at random from the model's distribution,
  sharpened or flattened by a ``temperature`` and optionally restricted to the ``top_k`` most
  likely tokens; ``temperature=0`` is greedy decoding.
* :func:`top_p_distribution` - the distribution of top-p (nucleus) sampling (Holtzman et al.,
  2020): the smallest set of most likely tokens whose probabilities reach ``top_p``.

All three stop a sentence at ``<eos>`` and never generate more than ``max_len`` tokens; neither ever
generates ``<pad>`` or ``<bos>`` (their scores are set to ``-inf``). Both return
the generated ids ``(batch, out_len)``, without ``<bos>``, each row ending with ``<eos>`` (unless
it ran out of ``max_len``) followed by ``pad_id``: ``vocab.decode(row)`` gives the tokens.
They switch the model to evaluation mode (no dropout) for the call, run under
``torch.no_grad()`` and restore the model's mode afterwards. ``src`` and ``src_mask`` may be on
any device (a CPU tensor for a model on a GPU, say): they are moved to the model's device,
and the output is on the model's device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from companion._validation import (
    check_bool,
    check_floating,
    check_instance,
    check_integer,
    check_min_ndim,
    check_nonnegative_float,
    check_positive_int,
    inputs_checked,
    shape_str,
)
from companion.data import BOS_ID, EOS_ID, PAD_ID
from companion.model import Transformer

__all__ = [
    "greedy_decode",
    "beam_search",
    "best_hypotheses",
    "BeamStep",
    "length_penalty",
    "sampling_distribution",
    "sample_decode",
    "top_p_distribution",
]


def length_penalty(length: int, alpha: float) -> float:
    r"""The GNMT length penalty (Wu et al., 2016, eq. 14):

    .. math:: \text{lp}(Y) = \left(\frac{5 + |Y|}{6}\right)^{\alpha}

    A finished hypothesis ``Y`` (its ``|Y|`` tokens include ``<eos>``) is ranked by
    ``log P(Y) / lp(Y)``. ``alpha = 0`` gives ``lp = 1``: plain log-probability, which favours
    short outputs; ``alpha = 1`` is close to dividing by the length (the mean log-probability
    per token); GNMT used 0.6-0.7.
    """
    check_positive_int("length", length)
    check_nonnegative_float("alpha", alpha)
    return ((5.0 + length) / 6.0) ** alpha


def _check_model(model: object) -> Transformer:
    if not isinstance(model, Transformer):
        raise TypeError(
            f"model must be a companion.model.Transformer, got {type(model).__name__} "
            "(unwrap a DistributedDataParallel model with .module)"
        )
    return model


def _check_source(model: Transformer, src: Tensor, src_mask: Tensor | None) -> None:
    """:meth:`Transformer.check_source`, and at least one sentence: a decoder has nothing to
    return for an empty batch (``batch = 0``), which is a clear ``ValueError``."""
    model.check_source(src, src_mask)
    if src.shape[0] == 0:
        raise ValueError(
            f"src must hold at least one sentence to decode, got shape {shape_str(src.shape)}"
        )


def _to_model_device(
    model: Transformer, src: Tensor, src_mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """``src`` and ``src_mask`` on the device of the model's parameters."""
    device = next(model.parameters()).device
    src = src.to(device)  # (batch, src_len)
    if src_mask is not None:
        src_mask = src_mask.to(device)  # (batch or 1, heads or 1, 1, src_len)
    return src, src_mask


def _max_lengths(max_len: object, batch: int, device: torch.device) -> Tensor:
    """``max_len`` (an int, or one int per sentence) as a ``(batch,)`` LongTensor, checked."""
    if isinstance(max_len, int) and not isinstance(max_len, bool):
        check_positive_int("max_len", max_len)
        return torch.full((batch,), max_len, dtype=torch.long, device=device)  # (batch,)
    if isinstance(max_len, Tensor):
        check_integer("max_len", max_len)
        limits = max_len
    elif isinstance(max_len, Sequence) and not isinstance(max_len, str):
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in max_len):
            raise TypeError(f"max_len must be an int or a sequence of ints, got {max_len!r:.80}")
        limits = torch.tensor(list(max_len), dtype=torch.long)  # (batch,)
    else:
        raise TypeError(
            f"max_len must be an int or one int per sentence, got {type(max_len).__name__}"
        )
    if limits.shape != (batch,):
        raise ValueError(
            f"max_len must be an int or hold one limit per sentence, shape ({batch},), "
            f"got shape {tuple(limits.shape)}"
        )
    if batch and int(limits.min()) < 1:
        raise ValueError(f"max_len must be >= 1 for every sentence, got {int(limits.min())}")
    return limits.to(device=device, dtype=torch.long)  # (batch,)


def _check_ids(**ids: int) -> None:
    for name, value in ids.items():
        check_positive_int(name, value, minimum=0)


def _forbid(logits: Tensor, ids: tuple[int, ...]) -> Tensor:
    """``logits (rows, vocab)`` with the (in-vocabulary) ``ids`` set to ``-inf``: tokens that
    must never be generated (``<pad>``, ``<bos>``)."""
    blocked = [i for i in ids if i < logits.shape[-1]]
    if not blocked:
        return logits
    return logits.index_fill(-1, torch.tensor(blocked, device=logits.device), -math.inf)


class _EvalMode:
    """Context for a decoding loop: ``model.eval()`` + ``torch.no_grad()`` (the previous mode
    restored on exit), and the model's input checks off - the caller has validated the
    source with ``model.check_source`` once, and the loop feeds back ids it chose itself."""

    def __init__(self, model: Transformer) -> None:
        self.model, self.was_training = model, model.training
        self.no_grad, self.checked = torch.no_grad(), inputs_checked()

    def __enter__(self) -> None:
        self.model.eval()
        self.no_grad.__enter__()
        self.checked.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.checked.__exit__(*exc)
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)


def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    max_len: int | Sequence[int] | Tensor = 100,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Tensor:
    """Batched greedy decoding: at each step append every sentence's most likely next token.

    Args:
        model: a :class:`~companion.model.Transformer`.
        src: source ids ``(batch, src_len)`` (padded with the model's ``src_pad_id``).
        max_len: the most tokens generated per sentence, ``<eos>`` included: one int for
            every sentence, or one per sentence (a list or a ``(batch,)`` tensor).
        src_mask: boolean mask over the source, ``True`` = may attend, broadcastable to
            ``(batch, heads, 1, src_len)``; default ``model.make_src_mask(src)``.
        use_cache: reuse the decoder's keys and values between steps (fast); ``False``
            re-runs the decoder on the whole prefix at every step (the reference).
        bos_id, eos_id, pad_id: the special ids; finished rows are filled with ``pad_id``.

    Returns:
        ``(batch, out_len)`` generated ids without ``<bos>``, ``out_len <= max(max_len)``: each
        row is its tokens, ``<eos>``, then ``pad_id``. A row that reached its ``max_len``
        without ``<eos>`` has none.
    """
    model = _check_model(model)
    _check_source(model, src, src_mask)  # once, where src is; the loops below run unchecked
    src, src_mask = _to_model_device(model, src, src_mask)
    limits = _max_lengths(max_len, src.shape[0], src.device)  # (batch,)
    check_bool("use_cache", use_cache)
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    with _EvalMode(model):
        if src_mask is None:
            src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        memory = model.encode(src, src_mask)  # (batch, src_len, d_model)
        batch = memory.shape[0]
        cache = model.new_cache() if use_cache else None
        ys = torch.full((batch, 1), bos_id, dtype=torch.long, device=memory.device)  # (batch, 1)
        limits = limits.to(memory.device)  # (batch,)
        finished = torch.zeros(batch, dtype=torch.bool, device=memory.device)  # (batch,)
        for step in range(int(limits.max())):
            if cache is not None:
                # only the newest token; the cache holds the keys/values of the earlier ones
                # logits: (batch, 1, vocab)
                logits = model.decode(ys[:, -1:], memory, src_mask, cache=cache)
            else:
                logits = model.decode(ys, memory, src_mask)  # (batch, t, vocab)
            next_token = _forbid(logits[:, -1], (pad_id, bos_id)).argmax(dim=-1)  # (batch,)
            next_token = next_token.masked_fill(finished, pad_id)  # (batch,)
            ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)  # (batch, t + 1)
            # a row is finished at <eos> or at its length limit
            finished = finished | (next_token == eos_id) | (limits == step + 1)  # (batch,)
            if bool(finished.all()):
                break
    return ys[:, 1:]  # (batch, out_len)


@dataclass
class BeamStep:
    """One step of :func:`beam_search`, recorded when a ``history`` list is passed.

    Row ``b`` describes sentence ``b``; column ``j`` is beam ``j`` after this step.

    Attributes:
        step: 0 for the first generated token.
        parents: ``(batch, beam_size)`` the beam (of the previous step) each beam extends.
        tokens: ``(batch, beam_size)`` the token each beam appended.
        scores: ``(batch, beam_size)`` each beam's log-probability so far (``-inf``: no beam).
        finished: ``(sentence, parent, log_prob, score)`` for every hypothesis that ended
            here with ``<eos>``, ``score = log_prob / length_penalty``.

    When the search ends because every sentence has enough finished hypotheses, the last
    step has no open beams: its ``parents`` and ``tokens`` are ``-1`` and its scores ``-inf``.
    """

    step: int
    parents: Tensor
    tokens: Tensor
    scores: Tensor
    finished: list[tuple[int, int, float, float]] = field(default_factory=list)


def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    beam_size: int = 4,
    max_len: int | Sequence[int] | Tensor = 100,
    length_penalty_alpha: float = 0.6,
    src_mask: Tensor | None = None,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
    history: list[BeamStep] | None = None,
    hypotheses: list[list[tuple[float, int, list[int]]]] | None = None,
    stop: str = "fairseq",
) -> Tensor:
    """Batched beam search with the GNMT length penalty; the decoder uses the key/value cache.

    For each sentence, the ``beam_size`` highest-scoring partial translations (score = sum of
    the tokens' log-probabilities) are extended by every token, and the best ``2·beam_size``
    extensions are kept as candidates. A candidate ending in ``<eos>`` that ranks among the
    top ``beam_size`` is *finished*: it is stored with the score
    ``log P(Y) / lp(|Y|)`` (:func:`length_penalty`); the best ``beam_size`` candidates that do
    not end in ``<eos>`` form the next beam. A sentence is done once it has ``beam_size``
    finished hypotheses (fairseq's rule, ``stop="fairseq"``) or, with ``stop="bound"``
    (a bound in the style of tensor2tensor's 2018 code, which waits for the *worst* of its ``beam_size``
    kept finished ones instead), once no open hypothesis can still beat its best finished one; at its
    ``max_len`` the hypotheses still open are finished as they are. The output is the finished
    hypothesis with the best score.

    With ``beam_size=1`` this is exactly greedy decoding (:func:`greedy_decode`).

    Args:
        model: a :class:`~companion.model.Transformer`.
        src: source ids ``(batch, src_len)``.
        beam_size: hypotheses kept per sentence (>= 1).
        max_len: the most tokens generated per sentence, ``<eos>`` included (an int, or one
            per sentence).
        length_penalty_alpha: α of :func:`length_penalty` (0 = no length normalisation).
        src_mask, bos_id, eos_id, pad_id: as in :func:`greedy_decode`.
        history: a list to which one :class:`BeamStep` per step is appended (for plots).
        hypotheses: a list that receives, for each sentence, its finished hypotheses as
            ``(log_prob, length, ids)``. The search never looks at α (it ranks partial
            translations by log-probability), so :func:`best_hypotheses` with another α gives
            exactly what a search with that α returns: several α for the price of one search
            (:func:`companion.metrics.length_penalty_sweep`). With ``stop="bound"`` the stop
            depends on α, so this holds for ``stop="fairseq"`` only.
        stop: when a sentence's search ends. ``"fairseq"`` (the default): once it has
            ``beam_size`` finished hypotheses. ``"bound"``: once its best finished score is at
            least every open hypothesis's ``log P / lp(max_len)``, a bound no extension can pass
            (log P only falls as a hypothesis grows, and ``lp`` grows with the length up to
            ``lp(max_len)``); the output is then what running to ``max_len`` would return.

    Returns:
        ``(batch, out_len)`` ids in the format of :func:`greedy_decode`.
    """
    model = _check_model(model)
    _check_source(model, src, src_mask)  # once, where src is; the loops below run unchecked
    src, src_mask = _to_model_device(model, src, src_mask)
    check_positive_int("beam_size", beam_size)
    if stop not in ("fairseq", "bound"):
        raise ValueError(f"stop must be 'fairseq' or 'bound', got {stop!r}")
    if history is not None:
        check_instance("history", history, list, "a list (or None)")
    if hypotheses is not None:
        check_instance("hypotheses", hypotheses, list, "a list (or None)")
    limits = _max_lengths(max_len, src.shape[0], src.device)  # (batch,)
    length_penalty(1, length_penalty_alpha)  # checks alpha
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    k = beam_size
    with _EvalMode(model):
        if src_mask is None:
            src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        memory = model.encode(src, src_mask)  # (batch, src_len, d_model)
        batch, device = memory.shape[0], memory.device
        # every sentence gets k rows: row b*k + j is beam j of sentence b
        memory = memory.repeat_interleave(k, dim=0)  # (batch * k, src_len, d_model)
        if src_mask is not None and src_mask.shape[0] == batch and batch > 1:
            src_mask = src_mask.repeat_interleave(k, dim=0)  # (batch * k, 1, 1, src_len)
        cache = model.new_cache()
        tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)  # (batch*k, 1)
        # only beam 0 is alive at the start, so the first step does not pick k copies of one token
        scores = torch.full((batch, k), -math.inf, device=device)  # (batch, k)
        scores[:, 0] = 0.0
        # per sentence: (log_prob, length, ids) of each finished hypothesis
        finished: list[list[tuple[float, int, list[int]]]] = [[] for _ in range(batch)]
        done = torch.zeros(batch, dtype=torch.bool, device=device)  # (batch,)
        row_offset = torch.arange(batch, device=device).unsqueeze(1) * k  # (batch, 1)
        limits = limits.to(device)  # (batch,)
        for step in range(int(limits.max())):
            logits = model.decode(tokens[:, -1:], memory, src_mask, cache=cache)  # (batch*k, 1, V)
            vocab = logits.shape[-1]
            allowed = _forbid(logits[:, -1].float(), (pad_id, bos_id))  # (batch * k, V)
            log_probs = torch.log_softmax(allowed, dim=-1)  # (batch * k, V)
            candidates = scores.unsqueeze(-1) + log_probs.view(batch, k, vocab)  # (batch, k, V)
            n_best = min(2 * k, k * vocab)
            top_scores, top_index = candidates.view(batch, k * vocab).topk(n_best, dim=1)
            # top_scores, top_index: (batch, n_best)
            top_beam = top_index // vocab  # (batch, n_best) which beam it extends
            top_token = top_index % vocab  # (batch, n_best) with which token
            is_eos = top_token == eos_id  # (batch, n_best)

            # finished hypotheses: <eos> among the top k candidates of a sentence not yet done
            ends = is_eos[:, :k] & ~done.unsqueeze(1) & torch.isfinite(top_scores[:, :k])
            penalty = length_penalty(step + 1, length_penalty_alpha)
            ended: list[tuple[int, int, float, float]] = []
            for b, j in ends.nonzero().tolist():
                row = b * k + int(top_beam[b, j])
                hypothesis = tokens[row, 1:].tolist() + [eos_id]
                log_prob = float(top_scores[b, j])
                finished[b].append((log_prob, step + 1, hypothesis))
                ended.append((b, int(top_beam[b, j]), log_prob, log_prob / penalty))
                if stop == "fairseq" and len(finished[b]) >= k:
                    done[b] = True
            if bool(done.all()):
                if history is not None:
                    nothing = torch.full((batch, k), -1, dtype=torch.long, device=device)
                    no_scores = torch.full((batch, k), -math.inf, device=device)
                    history.append(BeamStep(step, nothing, nothing.clone(), no_scores, ended))
                break

            # the next beam: the best k candidates that do not end in <eos>
            open_scores = top_scores.masked_fill(is_eos, -math.inf)  # (batch, n_best)
            scores, pick = open_scores.topk(k, dim=1)  # (batch, k) each
            source_rows = (row_offset + top_beam.gather(1, pick)).view(-1)  # (batch * k,)
            new_tokens = top_token.gather(1, pick).view(-1, 1)  # (batch * k, 1)
            tokens = torch.cat([tokens[source_rows], new_tokens], dim=1)  # (batch*k, step + 2)
            cache.reorder(source_rows)
            if history is not None:
                parents = top_beam.gather(1, pick)  # (batch, k)
                history.append(BeamStep(step, parents, new_tokens.view(batch, k), scores, ended))
            if stop == "bound":  # done once no open hypothesis can still beat the best finished one
                best_open = scores.max(dim=1).values  # (batch,) the best open log P
                alpha = length_penalty_alpha
                for b in (~done).nonzero().flatten().tolist():
                    if finished[b]:
                        best_done = max(lp / length_penalty(n, alpha) for lp, n, _ in finished[b])
                        ceiling = float(best_open[b]) / length_penalty(int(limits[b]), alpha)
                        done[b] = best_done >= ceiling

            # sentences at their length limit: the open hypotheses finish as they are
            for b in ((limits == step + 1) & ~done).nonzero().flatten().tolist():
                for j in range(k):
                    if math.isfinite(float(scores[b, j])):
                        hypothesis = tokens[b * k + j, 1:].tolist()
                        finished[b].append((float(scores[b, j]), step + 1, hypothesis))
                done[b] = True
            if bool(done.all()):
                break

    if hypotheses is not None:
        hypotheses.extend(finished)
    return best_hypotheses(finished, length_penalty_alpha, pad_id=pad_id, device=device)


def best_hypotheses(
    hypotheses: Sequence[Sequence[tuple[float, int, Sequence[int]]]],
    alpha: float,
    *,
    pad_id: int = PAD_ID,
    device: torch.device | str | None = None,
) -> Tensor:
    """Each sentence's best finished hypothesis under the length penalty α, padded into
    ``(batch, out_len)`` ids as :func:`beam_search` returns them.

    Args:
        hypotheses: per sentence, ``(log_prob, length, ids)`` of its finished hypotheses (what
            :func:`beam_search` puts into its ``hypotheses`` list); the best has the highest
            ``log_prob / length_penalty(length, alpha)``, the first of equals.
        alpha: α of :func:`length_penalty`.
        pad_id: fills the rows after each hypothesis; ``device``: where the output goes.
    """
    best = [
        max(hyps, key=lambda h: h[0] / length_penalty(h[1], alpha))[2] if hyps else []
        for hyps in hypotheses
    ]
    out_len = max((len(hypothesis) for hypothesis in best), default=0)
    output = torch.full((len(best), out_len), pad_id, dtype=torch.long, device=device)
    # output: (batch, out_len)
    for b, hypothesis in enumerate(best):
        output[b, : len(hypothesis)] = torch.tensor(list(hypothesis), dtype=torch.long)  # (len,)
    return output


def sampling_distribution(logits: Tensor, temperature: float, top_k: int | None = None) -> Tensor:
    """The distribution that temperature + top-k sampling draws the next token from.

    Args:
        logits: ``(..., vocab)``; tokens that must never be drawn can be set to ``-inf``.
        temperature: ``> 0``; the logits are divided by it before the softmax.
        top_k: keep only the ``top_k`` largest logits of each row (``>= 1``), or ``None``.

    Returns:
        ``(..., vocab)`` probabilities: ``softmax(logits / temperature)`` over the kept
        tokens, renormalised, exactly 0 elsewhere.
    """
    check_floating("logits", logits)
    check_min_ndim("logits", logits, 1, "(..., vocab)")
    temperature = check_nonnegative_float("temperature", temperature)
    if temperature == 0:
        raise ValueError("temperature must be > 0 for a distribution (0 means greedy: argmax)")
    if top_k is not None:
        check_positive_int("top_k", top_k)
    return _sampling_probs(logits, temperature, top_k)


def _sampling_probs(logits: Tensor, temperature: float, top_k: int | None) -> Tensor:
    """:func:`sampling_distribution` without the checks (``sample_decode`` checks once)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth_best = logits.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth_best, -math.inf)  # (..., vocab)
    # Shifted so the best logit is 0 before dividing: a tiny temperature then sends the others
    # to -inf (probability 0), never the best to +inf (inf - inf = NaN in the softmax).
    best = logits.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(logits.dtype).min)  # (.., 1)
    return torch.softmax((logits - best) / temperature, dim=-1)  # (..., vocab)


def sample_decode(
    model: Transformer,
    src: Tensor,
    *,
    max_len: int | Sequence[int] | Tensor = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    src_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Tensor:
    """Batched sampling: draw every next token from ``softmax(logits / temperature)``.

    ``temperature < 1`` sharpens the distribution towards the most likely token (``0`` *is*
    greedy decoding), ``> 1`` flattens it. ``top_k`` first removes every token but the ``k``
    most likely ones (the rest of the probability is renormalised over those ``k``).
    ``top_p`` then keeps only the nucleus of that tempered distribution, as
    :func:`top_p_distribution` does; the order is top-k, temperature, top-p, and at
    ``temperature=0`` both filters leave the most likely token, so the result is greedy. The
    decoder uses the key/value cache, as :func:`greedy_decode` does.

    Args:
        model, src, max_len, src_mask, bos_id, eos_id, pad_id: as in :func:`greedy_decode`.
        temperature: ``>= 0``; ``0`` takes the most likely token (no randomness).
        top_k: sample among the ``top_k`` most likely tokens only (``>= 1``), or ``None``
            for all of them.
        top_p: sample from the nucleus holding probability mass ``top_p`` (in ``(0, 1]``;
            ``1`` keeps every token), or ``None`` for no nucleus filter.
        generator: a ``torch.Generator`` on the model's device, for reproducible samples.

    Returns:
        ``(batch, out_len)`` ids in the format of :func:`greedy_decode`.
    """
    model = _check_model(model)
    _check_source(model, src, src_mask)  # once, where src is; the loops below run unchecked
    src, src_mask = _to_model_device(model, src, src_mask)
    temperature = check_nonnegative_float("temperature", temperature)
    if top_k is not None:
        check_positive_int("top_k", top_k)
    if top_p is not None:
        top_p = _check_top_p(top_p)
    if generator is not None:
        check_instance("generator", generator, torch.Generator, "a torch.Generator")
    if generator is not None and generator.device.type != src.device.type:
        raise ValueError(
            f"generator must be on the model's device ({src.device}), got a generator on "
            f"{generator.device}: create it with torch.Generator(device={str(src.device)!r})"
        )
    limits = _max_lengths(max_len, src.shape[0], src.device)  # (batch,)
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    with _EvalMode(model):
        if src_mask is None:
            src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len) or None
        memory = model.encode(src, src_mask)  # (batch, src_len, d_model)
        batch, device = memory.shape[0], memory.device
        cache = model.new_cache()
        ys = torch.full((batch, 1), bos_id, dtype=torch.long, device=device)  # (batch, 1)
        limits = limits.to(device)  # (batch,)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (batch,)
        for step in range(int(limits.max())):
            logits = model.decode(ys[:, -1:], memory, src_mask, cache=cache)  # (batch, 1, V)
            logits = _forbid(logits[:, -1].float(), (pad_id, bos_id))  # (batch, V)
            if temperature == 0:
                next_token = logits.argmax(dim=-1)  # (batch,)
            else:
                probs = _sampling_probs(logits, temperature, top_k)  # (batch, V)
                if top_p is not None:
                    probs = _nucleus(probs, top_p)  # (batch, V): 0 outside the nucleus
                next_token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                # next_token: (batch,)
            next_token = next_token.masked_fill(finished, pad_id)  # (batch,)
            ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)  # (batch, t + 1)
            finished = finished | (next_token == eos_id) | (limits == step + 1)  # (batch,)
            if bool(finished.all()):
                break
    return ys[:, 1:]  # (batch, out_len)


def top_p_distribution(logits: Tensor, top_p: float, temperature: float = 1.0) -> Tensor:
    """The distribution that top-p (nucleus) sampling draws the next token from.

    Holtzman et al. (2020): sort the tokens by probability (after the ``temperature``), keep
    the smallest set of most likely tokens whose probabilities add up to at least ``top_p``
    (the *nucleus*), set the others to 0 and renormalise. Unlike top-k, the number of kept
    tokens adapts to the step: one or two where the model is sure, many where it is not. The
    most likely token is always kept; among tied probabilities the sort order decides.

    Args:
        logits: ``(..., vocab)`` next-token logits; ``-inf`` for tokens never to be drawn.
        top_p: the probability mass to keep, in ``(0, 1]``; ``1`` keeps every token.
        temperature: ``> 0``; the logits are divided by it before the softmax.

    Returns:
        ``(..., vocab)`` probabilities, exactly 0 outside each row's nucleus, each row
        summing to 1.
    """
    check_floating("logits", logits)
    check_min_ndim("logits", logits, 1, "(..., vocab)")
    top_p = _check_top_p(top_p)
    temperature = check_nonnegative_float("temperature", temperature)
    if temperature == 0:
        raise ValueError("temperature must be > 0 for a distribution (0 means greedy: argmax)")
    return _nucleus(_sampling_probs(logits, temperature, None), top_p)  # (..., vocab)


def _check_top_p(top_p: object) -> float:
    """``top_p`` as a float in ``(0, 1]``, or a clear error naming it."""
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        raise TypeError(f"top_p must be a float in (0, 1], got {type(top_p).__name__}")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return float(top_p)


def _nucleus(probs: Tensor, top_p: float) -> Tensor:
    """Keep each row's nucleus of ``probs`` (``(..., vocab)``) and renormalise; unchecked."""
    if top_p == 1.0:  # every token (a rounded cumulative sum could drop the tiny ones)
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (..., vocab) each
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (..., vocab): mass of better ones
    keep_sorted = mass_before < top_p  # (..., vocab): the best token always (0 < top_p)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # (..., vocab)
    kept = probs.masked_fill(~keep, 0.0)  # (..., vocab)
    return kept / kept.sum(dim=-1, keepdim=True)  # (..., vocab): renormalised
