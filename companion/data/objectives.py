"""Training objectives: what a model reads, what it must predict, and what it may attend to
(chapter 10).

Each function turns token ids into an :class:`ObjectiveExample`, the triple
``(inputs, targets, mask)`` a model trains on:

====================================  ==========================  ==============================
objective                             model                       mask
====================================  ==========================  ==============================
:func:`causal_lm_example`             decoder-only (GPT)          causal
:func:`masked_lm_example`             encoder-only (BERT)         bidirectional (padding only)
:func:`span_corruption_example`       encoder-decoder (T5)        bidirectional over the input
:func:`prefix_lm_example`             decoder-only, prefix LM     bidirectional prefix, causal
====================================  ==========================  ==============================

Conventions shared by all four:

- ``tokens`` is one sentence ``(len,)`` or a batch ``(batch, len)`` of integer ids, padded at
  the end with ``pad_id``; the result has the same number of dimensions (a batch of one is not
  squeezed, a single sentence gets no batch dimension).
- **A target equal to** ``pad_id`` **carries no loss**. That is the id
  :func:`companion.train.sequence_loss` ignores (``sequence_loss(logits, targets, pad_id)``),
  and ``F.cross_entropy(..., ignore_index=pad_id)`` too. ``<pad>`` is never a real target, so
  it can mark "nothing to predict here" without a second id.
- ``mask`` follows the package's convention (``True`` = may attend) and has its full shape,
  ``(batch, 1, len, len)`` for a batch (it broadcasts over the heads) and ``(len, len)`` for
  one sentence, so it can be drawn as it is. Padding keys are always blocked.
- Span corruption is also available in its two steps, :func:`random_spans` (where to drop,
  random) and :func:`corrupt_spans` (the two sequences, given the spans), to build an
  example by hand.
- Random objectives (masked LM, span corruption) draw every random number from ``generator``
  (the global generator when ``None``): the same seed gives the same example.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from companion._validation import (
    check_finite_float,
    check_instance,
    check_integer,
    check_ndim,
    check_positive_float,
    check_positive_int,
    shape_str,
)
from companion.data.vocab import EOS_ID, PAD_ID
from companion.masking import causal_mask, padding_mask, prefix_lm_mask

__all__ = [
    "ObjectiveExample",
    "MASK_FRACTION",
    "RANDOM_FRACTION",
    "causal_lm_example",
    "masked_lm_example",
    "random_spans",
    "corrupt_spans",
    "span_corruption_example",
    "prefix_lm_example",
]

#: BERT's split of the selected positions (Devlin et al. 2019, section 3.1): 80% become
#: ``[MASK]``, 10% a random ordinary token, the remaining 10% keep their token.
MASK_FRACTION = 0.8
#: The fraction of the selected positions that get a random ordinary token.
RANDOM_FRACTION = 0.1


class ObjectiveExample(NamedTuple):
    """What a model trains on: read ``inputs``, predict ``targets``, attend where ``mask`` allows.

    Unpacks as a triple: ``inputs, targets, mask = causal_lm_example(tokens)``.

    Attributes:
        inputs: ids the model reads, ``(batch, in_len)`` or ``(in_len,)``.
        targets: ids it must predict, ``pad_id`` where there is nothing to predict; the same
            shape as ``inputs`` except for span corruption, whose targets are the decoder's
            ``(batch, tgt_len)``.
        mask: boolean, ``True`` = may attend: ``(batch, 1, in_len, in_len)`` or
            ``(in_len, in_len)``, the self-attention mask over ``inputs``.
    """

    inputs: Tensor
    targets: Tensor
    mask: Tensor


# ---------------------------------------------------------------------------------------------
# Input checks shared by the objectives
# ---------------------------------------------------------------------------------------------


def _as_batch(tokens: object, min_len: int = 1) -> tuple[Tensor, bool]:
    """``tokens`` checked and as a batch ``(batch, len)``, and whether it was one sentence."""
    ids = check_integer("tokens", tokens)
    check_ndim("tokens", ids, (1, 2), "(len,) or (batch, len)")
    single = ids.dim() == 1
    batch = ids[None, :] if single else ids  # (batch, len)
    if batch.shape[1] < min_len:
        raise ValueError(
            f"tokens must hold at least {min_len} positions, got shape {shape_str(ids.shape)}"
        )
    return batch.long(), single  # (batch, len)


def _check_id(name: str, value: object, vocab_size: int | None = None) -> int:
    """An id: an int ``>= 0`` (and ``< vocab_size`` when given)."""
    value = check_positive_int(name, value, minimum=0)
    if vocab_size is not None and value >= vocab_size:
        raise ValueError(f"{name} must be an id in [0, {vocab_size - 1}], got {value}")
    return value


def _check_ids(name: str, value: object, vocab_size: int | None = None) -> list[int]:
    """A sequence of ids (ints ``>= 0``, a tensor allowed), returned as a list."""
    if isinstance(value, Tensor):
        check_integer(name, value)
        check_ndim(name, value, 1, "(count,)")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ids (ints), got {type(value).__name__}")
    return [_check_id(f"{name}[{i}]", item, vocab_size) for i, item in enumerate(value)]


def _check_generator(generator: object) -> torch.Generator | None:
    if generator is not None:
        check_instance("generator", generator, torch.Generator, "a torch.Generator or None")
    return generator  # type: ignore[return-value]


def _bidirectional_mask(inputs: Tensor, pad_id: int) -> Tensor:
    """Every query may attend to every real key: ``(batch, 1, len, len)``."""
    keys = padding_mask(inputs, pad_id)  # (batch, 1, 1, len)
    return keys.expand(-1, -1, inputs.shape[1], -1).clone()  # (batch, 1, len, len)


def _result(inputs: Tensor, targets: Tensor, mask: Tensor, single: bool) -> ObjectiveExample:
    """Drop the batch dimension again when the caller gave one sentence."""
    if single:
        return ObjectiveExample(inputs[0], targets[0], mask[0, 0])  # (len,), (len,), (len, len)
    return ObjectiveExample(inputs, targets, mask)


# ---------------------------------------------------------------------------------------------
# 1. Causal language modelling (GPT)
# ---------------------------------------------------------------------------------------------


def causal_lm_example(tokens: Tensor, *, pad_id: int = PAD_ID) -> ObjectiveExample:
    """Next-token prediction: read ``tokens[:-1]``, predict ``tokens[1:]``, never look ahead.

    With a row ``<bos> a b c <eos> <pad>`` the model reads ``<bos> a b c <eos>`` and must
    predict ``a b c <eos> <pad>``: position ``t`` predicts the token after it, and the
    ``<pad>`` target carries no loss. ``<bos>`` is read but never predicted, ``<eos>`` is
    predicted: the tokens a language model's perplexity counts.

    Args:
        tokens: ``(len,)`` or ``(batch, len)`` ids, ``len >= 2``, padded with ``pad_id``.
        pad_id: the padding id (padding keys are masked, padding targets ignored).

    Returns:
        ``inputs`` and ``targets`` of shape ``(batch, len - 1)`` (or ``(len - 1,)``), and the
        causal mask with padding keys blocked, ``(batch, 1, len - 1, len - 1)`` (or
        ``(len - 1, len - 1)``).
    """
    batch, single = _as_batch(tokens, min_len=2)  # (batch, len)
    pad_id = _check_id("pad_id", pad_id)
    inputs = batch[:, :-1]  # (batch, len - 1)
    targets = batch[:, 1:]  # (batch, len - 1): padding targets are pad_id, ignored
    keys = padding_mask(inputs, pad_id)  # (batch, 1, 1, len - 1)
    causal = causal_mask(inputs.shape[1], device=inputs.device)  # (len - 1, len - 1)
    return _result(inputs, targets, keys & causal, single)  # mask (batch, 1, len-1, len-1)


# ---------------------------------------------------------------------------------------------
# 2. Masked language modelling (BERT)
# ---------------------------------------------------------------------------------------------


def masked_lm_example(
    tokens: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    probability: float = 0.15,
    pad_id: int = PAD_ID,
    generator: torch.Generator | None = None,
) -> ObjectiveExample:
    """BERT's masked language model (Devlin et al. 2019): hide some tokens, predict them back.

    1. **Select**: each position whose token is real (not ``pad_id``, not in ``special_ids``,
       not ``mask_id``) is selected independently with ``probability`` (15% in BERT). Padding
       and special tokens (``<bos>``, ``<eos>``, ``<unk>``, ``[MASK]``, ...) are never
       selected. A sentence may get no selected position (no loss for it this time).
    2. **Corrupt** the selected positions: 80% (:data:`MASK_FRACTION`) become ``mask_id``,
       10% (:data:`RANDOM_FRACTION`) a token drawn uniformly from the *ordinary* vocabulary
       (every id in ``[0, vocab_size)`` that is not special, not ``pad_id`` and not
       ``mask_id``; it may happen to be the original token), and 10% keep their token. The
       last two keep the model honest: it cannot assume that an unmasked token is right,
       and it sees real tokens in the positions it predicts, as it will after pre-training,
       when ``[MASK]`` never appears.
    3. **Targets** are the original tokens at the selected positions and ``pad_id`` (no loss)
       everywhere else.

    The mask is bidirectional: every position attends to every real token.

    Randomness: three draws from ``generator``, in this order, each of the shape of
    ``tokens`` (on the generator's device, the CPU when ``None``): ``torch.rand`` for the
    selection, ``torch.rand`` for the 80/10/10 split, ``torch.randint`` for the random tokens.

    Args:
        tokens: ``(len,)`` or ``(batch, len)`` ids in ``[0, vocab_size)``, padded with
            ``pad_id``.
        mask_id: the id of ``[MASK]``.
        vocab_size: number of ids the model predicts over.
        special_ids: ids never selected and never drawn as random tokens (at least the
            vocabulary's special tokens).
        probability: chance that a real position is selected, in ``(0, 1]``.
        pad_id: the padding id.
        generator: source of the random numbers (``None``: the global generator).

    Returns:
        ``inputs`` (the corrupted ids) and ``targets``, both the shape of ``tokens``, and the
        bidirectional mask ``(batch, 1, len, len)`` (or ``(len, len)``).
    """
    batch, single = _as_batch(tokens)  # (batch, len)
    vocab_size = check_positive_int("vocab_size", vocab_size)
    mask_id = _check_id("mask_id", mask_id, vocab_size)
    pad_id = _check_id("pad_id", pad_id, vocab_size)
    specials = _check_ids("special_ids", special_ids, vocab_size)
    probability = check_finite_float("probability", probability, "a probability in (0, 1]")
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"probability must be in (0, 1], got {probability}")
    generator = _check_generator(generator)
    if batch.numel() > 0:
        low, high = int(batch.min()), int(batch.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"tokens must hold ids in [0, {vocab_size - 1}] (vocab_size={vocab_size}), "
                f"got min {low}, max {high}"
            )
    never = torch.tensor(sorted({*specials, pad_id, mask_id}))  # (num_special,)
    is_ordinary = torch.ones(vocab_size, dtype=torch.bool)  # (vocab_size,)
    is_ordinary[never] = False
    ordinary = is_ordinary.nonzero().flatten()  # (num_ordinary,) ids a random token comes from
    if len(ordinary) == 0:
        raise ValueError(
            f"the vocabulary has no ordinary token to draw a random replacement from: all "
            f"{vocab_size} ids are special, padding or mask_id"
        )

    here = generator.device if generator is not None else torch.device("cpu")  # draw there
    shape = tuple(batch.shape)
    select_draw = torch.rand(shape, generator=generator, device=here)  # (batch, len)
    split_draw = torch.rand(shape, generator=generator, device=here)  # (batch, len)
    random_draw = torch.randint(  # (batch, len) indices into `ordinary`
        len(ordinary), shape, generator=generator, device=here
    )
    select_draw = select_draw.to(batch.device)  # (batch, len)
    split_draw = split_draw.to(batch.device)  # (batch, len)
    random_tokens = ordinary.to(batch.device)[random_draw.to(batch.device)]  # (batch, len)

    real = ~torch.isin(batch, never.to(batch.device))  # (batch, len) may be selected
    selected = real & (select_draw < probability)  # (batch, len)
    to_mask = selected & (split_draw < MASK_FRACTION)  # (batch, len) 80%
    to_random = (  # (batch, len) 10%
        selected & (split_draw >= MASK_FRACTION) & (split_draw < MASK_FRACTION + RANDOM_FRACTION)
    )
    inputs = batch.masked_fill(to_mask, mask_id)  # (batch, len)
    inputs = torch.where(to_random, random_tokens, inputs)  # (batch, len); the rest unchanged
    targets = batch.masked_fill(~selected, pad_id)  # (batch, len): loss at selected only
    return _result(inputs, targets, _bidirectional_mask(batch, pad_id), single)


# ---------------------------------------------------------------------------------------------
# 3. Span corruption (T5)
# ---------------------------------------------------------------------------------------------


def _random_composition(
    total: int, parts: int, minimum: int, generator: torch.Generator | None
) -> list[int]:
    """``parts`` lengths summing to ``total``, each ``>= minimum``, every composition equally
    likely (stars and bars: ``parts - 1`` bars placed among the units left free)."""
    free = total - parts * minimum  # units left after giving each part its minimum
    slots = torch.randperm(free + parts - 1, generator=generator)[: parts - 1]  # (parts - 1,)
    edges = [-1, *sorted(slots.tolist()), free + parts - 1]
    return [edges[i + 1] - edges[i] - 1 + minimum for i in range(parts)]


def random_spans(
    length: int,
    *,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    generator: torch.Generator | None = None,
) -> list[tuple[int, int]]:
    """Where T5's span corruption drops tokens in a sentence of ``length`` tokens.

    1. ``num_noise = round(length · noise_density)``, kept within ``[1, length - 1]``;
       ``num_spans = round(num_noise / mean_span_length)``, kept within
       ``[1, min(num_noise, length - num_noise + 1)]`` (Python's ``round``: halves to even,
       as T5's ``tf.round``).
    2. The noise tokens are cut into ``num_spans`` non-empty spans, every way of cutting
       equally likely; the kept tokens are spread around them, every arrangement equally
       likely, with at least one kept token between two spans (spans never touch) and
       possibly none before the first or after the last. (T5's code always starts with kept
       tokens and ends with a span; harmless on the long chunks it corrupts, but on one
       sentence it would always hide the final full stop.)

    Randomness: two ``torch.randperm`` draws from ``generator``, span lengths then gaps.

    Args:
        length: number of tokens, at least 2 (one dropped, one kept).
        noise_density: fraction of the tokens to drop, in ``(0, 1)``.
        mean_span_length: average span length, ``> 0``.
        generator: source of the random numbers (``None``: the global generator).

    Returns:
        The spans as ``(start, stop)`` pairs (``stop`` excluded), in order.
    """
    check_positive_int("length", length, minimum=2)
    noise_density = check_finite_float("noise_density", noise_density, "a number in (0, 1)")
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    mean_span_length = check_positive_float("mean_span_length", mean_span_length)
    generator = _check_generator(generator)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_kept = length - num_noise
    num_spans = max(round(num_noise / mean_span_length), 1)
    num_spans = min(num_spans, num_noise, num_kept + 1)  # a kept token between two spans
    span_lengths = _random_composition(num_noise, num_spans, 1, generator)
    # kept tokens before the first span (>= 0), between spans (>= 1), after the last (>= 0)
    free = _random_composition(num_kept - (num_spans - 1), num_spans + 1, 0, generator)
    gaps = [free[0], *(gap + 1 for gap in free[1:-1]), free[-1]]
    spans, position = [], gaps[0]
    for span_length, gap_after in zip(span_lengths, gaps[1:]):
        spans.append((position, position + span_length))
        position += span_length + gap_after
    return spans


def corrupt_spans(
    words: Sequence[int] | Tensor,
    spans: Sequence[tuple[int, int]],
    *,
    sentinel_ids: Sequence[int],
    eos_id: int | None = EOS_ID,
) -> tuple[list[int], list[int]]:
    """T5's inputs and targets of one sentence, given the spans to drop.

    ``inputs``: ``words`` with span ``i`` replaced by the single token ``sentinel_ids[i]``,
    then ``eos_id``. ``targets``: for each span ``i`` in order, ``sentinel_ids[i]`` followed
    by the span's tokens, then the closing sentinel ``sentinel_ids[len(spans)]`` and
    ``eos_id``. Putting span ``i`` of the targets in place of sentinel ``i`` of the inputs
    gives ``words`` back.

    Args:
        words: the sentence's ids ``(len,)``, without padding.
        spans: ``(start, stop)`` pairs in increasing order, non-empty, not overlapping, not
            touching (as :func:`random_spans` gives them).
        sentinel_ids: distinct ids, at least ``len(spans) + 1``.
        eos_id: appended to both; ``None`` appends nothing.

    Returns:
        ``(inputs, targets)`` as lists of ids.
    """
    if isinstance(words, Tensor):
        check_integer("words", words)
        check_ndim("words", words, 1, "(len,)")
    tokens = _check_ids("words", words)
    sentinels = _check_ids("sentinel_ids", sentinel_ids)
    if eos_id is not None:
        eos_id = _check_id("eos_id", eos_id)
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
        raise TypeError(f"spans must be a sequence of (start, stop) pairs, got {spans!r:.80}")
    if len(sentinels) < len(spans) + 1:
        raise ValueError(
            f"{len(spans)} spans need {len(spans) + 1} sentinel ids (one per span and a "
            f"closing one), got {len(sentinels)}"
        )
    previous_stop = -1
    for index, span in enumerate(spans):
        ok = isinstance(span, (tuple, list)) and len(span) == 2
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
        if not ok or not previous_stop < span[0] < span[1] <= len(tokens):
            raise ValueError(
                f"spans[{index}] must be a (start, stop) pair with start < stop <= "
                f"{len(tokens)} (the sentence's length), after the previous span with at least "
                f"one kept token between them, got {span!r}"
            )
        previous_stop = span[1]
    end = [] if eos_id is None else [eos_id]
    inputs, targets, kept_from = [], [], 0
    for index, (start, stop) in enumerate(spans):
        inputs += [*tokens[kept_from:start], sentinels[index]]
        targets += [sentinels[index], *tokens[start:stop]]
        kept_from = stop
    return inputs + tokens[kept_from:] + end, targets + [sentinels[len(spans)]] + end


def span_corruption_example(
    tokens: Tensor,
    *,
    sentinel_ids: Sequence[int],
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    pad_id: int = PAD_ID,
    eos_id: int | None = EOS_ID,
    generator: torch.Generator | None = None,
) -> ObjectiveExample:
    """T5's span corruption (Raffel et al. 2020, section 3.1.4): drop spans, predict them.

    Example with the spans ``for inviting`` and ``last`` (the paper's Figure 2), ``<X> <Y>
    <Z>`` standing for ``sentinel_ids[0], [1], [2]``::

        tokens:  Thank you for inviting me to your party last week .
        inputs:  Thank you <X> me to your party <Y> week . <eos>
        targets: <X> for inviting <Y> last <Z> <eos>

    For each sentence (its non-pad tokens, at least 2), :func:`random_spans` draws the spans
    (how many and how long: the exact rule is there) and :func:`corrupt_spans` builds the two
    sequences (the exact layout is there). A batch is padded with ``pad_id`` to its longest
    input and its longest target (padded targets carry no loss).

    The model is an encoder-decoder: the encoder reads ``inputs`` with ``mask``
    (bidirectional, padding blocked); the decoder reads ``<bos>`` followed by
    ``targets[:, :-1]`` causally and predicts ``targets`` (teacher forcing, as in chapter 7).

    Args:
        tokens: ``(len,)`` or ``(batch, len)`` ids of the sentences' words, without ``<bos>``
            or ``<eos>`` (any non-pad token may be dropped), padded with ``pad_id``.
        sentinel_ids: distinct ids of the sentinel tokens (T5's ``<extra_id_0>``, ...), at
            least one more than the spans of any sentence; none of them may occur in
            ``tokens``.
        noise_density: fraction of the tokens to drop, in ``(0, 1)``.
        mean_span_length: average span length, ``> 0``.
        pad_id: the padding id.
        eos_id: appended to inputs and targets; ``None`` appends nothing.
        generator: source of the random numbers (``None``: the global generator); the rows
            draw their spans one after the other.

    Returns:
        ``inputs`` ``(batch, in_len)``, ``targets`` ``(batch, tgt_len)`` and the encoder's
        mask ``(batch, 1, in_len, in_len)``; without the batch dimension for one sentence.
    """
    batch, single = _as_batch(tokens)  # (batch, len)
    if batch.shape[0] == 0:
        raise ValueError(
            f"tokens must hold at least one sentence, got shape {shape_str(batch.shape)}"
        )
    sentinels = _check_ids("sentinel_ids", sentinel_ids)
    if len(set(sentinels)) != len(sentinels):
        raise ValueError(f"sentinel_ids must be distinct, got {sentinels}")
    pad_id = _check_id("pad_id", pad_id)
    if pad_id in sentinels:
        raise ValueError(f"sentinel_ids must not contain pad_id ({pad_id}), got {sentinels}")
    clash = torch.isin(batch, torch.tensor(sentinels, device=batch.device))  # (batch, len)
    if bool(clash.any()):
        row, column = (int(i) for i in clash.nonzero()[0])
        raise ValueError(
            f"tokens must not contain a sentinel id: tokens[{row}, {column}] is "
            f"{int(batch[row, column])}, one of sentinel_ids"
        )
    rows_in, rows_out = [], []
    for row, sentence in enumerate(batch.tolist()):
        words = [token for token in sentence if token != pad_id]
        if len(words) < 2:
            raise ValueError(
                f"each sentence needs at least 2 real tokens (one to drop, one to keep), "
                f"row {row} has {len(words)}"
            )
        spans = random_spans(
            len(words),
            noise_density=noise_density,
            mean_span_length=mean_span_length,
            generator=generator,
        )
        corrupted, answer = corrupt_spans(words, spans, sentinel_ids=sentinels, eos_id=eos_id)
        rows_in.append(corrupted)
        rows_out.append(answer)
    inputs = _pad_rows(rows_in, pad_id, batch.device)  # (batch, in_len)
    targets = _pad_rows(rows_out, pad_id, batch.device)  # (batch, tgt_len)
    return _result(inputs, targets, _bidirectional_mask(inputs, pad_id), single)


def _pad_rows(rows: list[list[int]], pad_id: int, device: torch.device) -> Tensor:
    """Lists of ids padded at the end into one ``(len(rows), longest)`` LongTensor."""
    longest = max(len(row) for row in rows)
    padded = torch.full((len(rows), longest), pad_id, dtype=torch.long)  # (batch, longest)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = torch.tensor(row, dtype=torch.long)  # (len(row),)
    return padded.to(device)  # (batch, longest)


# ---------------------------------------------------------------------------------------------
# 4. Prefix language modelling (T5's prefix LM, UniLM)
# ---------------------------------------------------------------------------------------------


def _check_prefix_lengths(prefix_len: object, batch: int, in_len: int) -> int | list[int]:
    """``prefix_len`` as an int or a list of one int per row, each in ``[0, in_len]``."""
    if isinstance(prefix_len, int) and not isinstance(prefix_len, bool):
        lengths = [prefix_len]
    else:
        lengths = _check_ids("prefix_len", prefix_len)
        if len(lengths) != batch:
            raise ValueError(
                f"prefix_len must be an int or hold one length per sentence ({batch}), "
                f"got {len(lengths)}"
            )
    for index, length in enumerate(lengths):
        name = "prefix_len" if isinstance(prefix_len, int) else f"prefix_len[{index}]"
        check_positive_int(name, length, minimum=0)
        if length > in_len:
            raise ValueError(f"{name} must be <= the input length len - 1 = {in_len}, got {length}")
    return lengths[0] if isinstance(prefix_len, int) else lengths


def prefix_lm_example(
    tokens: Tensor, prefix_len: int | Sequence[int] | Tensor, *, pad_id: int = PAD_ID
) -> ObjectiveExample:
    """A prefix language model (Raffel et al. 2020; Dong et al. 2019): the first ``prefix_len``
    input positions see each other both ways, the rest is predicted causally.

    Inputs and targets are shifted as in :func:`causal_lm_example` (read ``tokens[:-1]``,
    predict ``tokens[1:]``), and the mask is :func:`companion.masking.prefix_lm_mask` with
    padding keys blocked. Because position ``i < prefix_len`` sees the whole prefix, the
    tokens *inside* the prefix cannot be targets (they would be copied, not predicted): the
    targets of positions ``0 .. prefix_len - 2`` are ``pad_id`` (no loss). The last prefix
    position predicts the first token after the prefix, from the whole prefix.

    Example: tokens ``<bos> ein hund <sep> a dog <eos>`` with ``prefix_len = 4``: the model
    reads ``<bos> ein hund <sep> a dog``; the first four read each other freely; the targets
    are ``<pad> <pad> <pad> a dog <eos>``.

    Args:
        tokens: ``(len,)`` or ``(batch, len)`` ids, ``len >= 2``, padded with ``pad_id``.
        prefix_len: the number of prefix positions among the ``len - 1`` inputs, from 0 (a
            plain causal LM) to ``len - 1``: an int for every sentence, or one per sentence
            (a sequence or a ``(batch,)`` integer tensor).
        pad_id: the padding id.

    Returns:
        ``inputs`` and ``targets`` ``(batch, len - 1)`` and the mask
        ``(batch, 1, len - 1, len - 1)``; without the batch dimension for one sentence.
    """
    batch, single = _as_batch(tokens, min_len=2)  # (batch, len)
    pad_id = _check_id("pad_id", pad_id)
    in_len = batch.shape[1] - 1
    lengths = _check_prefix_lengths(prefix_len, batch.shape[0], in_len)
    inputs = batch[:, :-1]  # (batch, in_len)
    positions = torch.arange(in_len, device=batch.device)  # (in_len,)
    if isinstance(lengths, int):
        attend = prefix_lm_mask(in_len, lengths, device=batch.device)  # (in_len, in_len)
        prefix = torch.full((batch.shape[0], 1), lengths, device=batch.device)  # (batch, 1)
    else:
        prefix = torch.tensor(lengths, device=batch.device)[:, None]  # (batch, 1)
        causal = causal_mask(in_len, device=batch.device)  # (in_len, in_len)
        in_prefix = positions[None, None, :] < prefix[:, :, None]  # (batch, 1, in_len) keys
        attend = (causal[None] | in_prefix)[:, None]  # (batch, 1, in_len, in_len)
    inside = positions[None, :] < prefix - 1  # (batch, in_len) targets inside the prefix
    targets = batch[:, 1:].masked_fill(inside, pad_id)  # (batch, in_len)
    mask = padding_mask(inputs, pad_id) & attend  # (batch, 1, in_len, in_len)
    return _result(inputs, targets, mask, single)
