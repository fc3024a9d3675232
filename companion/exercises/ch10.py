"""Exercises of chapter 10, "One block, three families": encoders, decoders and their objectives.

Each ``check_*`` function runs *your* function on cases drawn from a seeded generator and
returns a :class:`~companion.exercises._checker.CheckResult` that is truthy when every case
passes. Six compare your result with the reference solution kept in this module; the
masking check cannot (any correct answer draws its own random numbers), so it checks what
every correct answer must do, on every draw and in proportion over many draws. The checks call
your function with keyword arguments, so keep the parameter names of the stub in the notebook.

==============================================  ===================================
exercise                                        check
==============================================  ===================================
a batch of prefix-LM masks                      :func:`check_prefix_lm_mask`
BERT's 80/10/10 masking                         :func:`check_bert_masking`
one sampling step: temperature and top-k        :func:`check_sample_next_token`
a ViT's patches: the patch-embedding reshape    :func:`check_patchify`
three standard errors of one comparison         :func:`check_standard_errors`
an induction score from attention weights       :func:`check_induction_score`
filling a blank with and without the mask       :func:`check_fill_rate`
==============================================  ===================================

The reference solutions (``reference_prefix_lm_mask``, ...) are module-level functions too,
written from the definitions; they are not exported.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from companion import masking
from companion._validation import check_callable as _check_callable
from companion.data import objectives
from companion.exercises._checker import (
    Case,
    CheckResult,
    call_reader,
    refusing_calls,
    report,
    run_check,
    seeded_generator,
)
from companion.metrics import clustered_se

__all__ = [
    "check_prefix_lm_mask",
    "check_bert_masking",
    "check_sample_next_token",
    "check_patchify",
    "check_standard_errors",
    "check_induction_score",
    "check_fill_rate",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: a batch of prefix-LM masks
# --------------------------------------------------------------------------------------------


def reference_prefix_lm_mask(seq_len: int, prefix_lens: Tensor) -> Tensor:
    """The masks of a batch of prefix language models, one prefix length per row, ``True`` =
    may attend.

    In row ``b``, query ``i`` may attend to key ``j`` when ``j`` is in that row's prefix
    (``j < prefix_lens[b]``: the prefix is read both ways, and every later position sees all of
    it) or ``j <= i`` (the causal rule). A prefix of 0 gives the causal mask, a prefix of
    ``seq_len`` an encoder's.

    Args:
        seq_len: number of positions (queries and keys alike), ``>= 1``.
        prefix_lens: ``(batch,)`` integer tensor, each ``0 <= prefix_lens[b] <= seq_len``.

    Returns:
        bool tensor of shape ``(batch, seq_len, seq_len)``, indexed ``[row, query, key]``.
    """
    query = torch.arange(seq_len)[None, :, None]  # (1, seq_len, 1)
    key = torch.arange(seq_len)[None, None, :]  # (1, 1, seq_len)
    in_prefix = key < prefix_lens[:, None, None]  # (batch, 1, seq_len)
    return (key <= query) | in_prefix  # (batch, seq_len, seq_len)


def _prefix_cases() -> list[Case]:
    settings = [
        # (seq_len, prefix length of each row)
        (6, [2, 4, 0]),
        (8, [3, 3]),  # equal prefixes: the single-prefix mask, twice
        (5, [0, 5, 1, 2, 3]),  # batch == seq_len: a wrong broadcast has the right shape
        (7, [1]),  # a prefix of one position: the causal mask
        (4, [4, 0, 3, 1]),
        (10, [4, 9, 7]),
        (1, [0, 1]),
        (9, [8, 2]),
    ]
    return [
        {"seq_len": n, "prefix_lens": torch.tensor(lens, dtype=torch.long)} for n, lens in settings
    ]


def check_prefix_lm_mask(
    prefix_lm_mask: Callable[[int, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``prefix_lm_mask(seq_len, prefix_lens)`` → bool ``(batch, seq_len, seq_len)``, one
    prefix length per row.

    Among the cases are rows with different prefixes in one batch (an answer that uses one
    row's prefix for every row fails), a batch as long as the sequence (a prefix broadcast
    along the query axis instead of the key axis has the right shape there, and fails), and
    prefixes of 0 and of the whole row. The result must be a *boolean* tensor: a float or
    integer 0/1 mask with the right values is rejected: PyTorch's
    ``scaled_dot_product_attention`` reads a float mask as a bias added to the scores (a 0 adds
    nothing, so a 0/1 float mask blocks nothing), and the course's masks are boolean everywhere.
    A call into :mod:`companion.masking` or :mod:`companion.data.objectives` (whose
    ``prefix_lm_mask`` and ``prefix_lm_example`` give the answer row by row) is refused.
    """
    _check_callable("prefix_lm_mask", prefix_lm_mask)

    @functools.wraps(prefix_lm_mask)
    def boolean_only(**kwargs: object) -> Tensor:
        mask = prefix_lm_mask(**kwargs)
        if isinstance(mask, Tensor) and mask.dtype != torch.bool:
            why = (
                "PyTorch adds a float mask to the scores, so a 0/1 float mask blocks nothing"
                if mask.is_floating_point()
                else "scaled_dot_product_attention takes a bool mask, or a float one it adds "
                "to the scores, not integers"
            )
            raise TypeError(
                f"the mask must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
                f"{why}: return the comparison itself, or call .bool()"
            )
        return mask

    by_hand = refusing_calls(
        boolean_only,
        "build the masks",
        (masking, objectives),
        why=": companion.masking and companion.data.objectives hold the answer",
    )
    return run_check(
        "prefix_lm_mask",
        by_hand,
        reference_prefix_lm_mask,
        _prefix_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: BERT's 80/10/10 masking
# --------------------------------------------------------------------------------------------

#: BERT's numbers: the chance that a real token is selected, and the split of the selected
#: positions into [MASK], a random ordinary token and the token itself.
SELECT_PROBABILITY, MASK_SHARE, RANDOM_SHARE, KEEP_SHARE = 0.15, 0.8, 0.1, 0.1
#: How many standard deviations a proportion may stray from its expected value. A correct
#: answer strays further with probability about 6e-7 per proportion (normal approximation of
#: a binomial count over thousands of positions); a wrong split (e.g. 90/5/5 or 80/20/0) or
#: selection rate (e.g. 12% or 20%) is many standard deviations away with these case sizes.
Z_BOUND = 5.0


def reference_bert_masking(
    tokens: Tensor,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """BERT's masking (Devlin et al. 2019): select 15% of the real tokens, then replace 80% of
    the selected ones by ``[MASK]``, 10% by a random ordinary token, and keep 10%.

    * A position may be selected only if its token is not in ``special_ids`` (which holds
      ``<pad>`` = 0, ``<bos>``, ``<eos>``, ``<unk>`` and ``[MASK]``); each such position is
      selected independently with probability 0.15.
    * A random token is drawn uniformly from the ordinary ids: every id in
      ``[0, vocab_size)`` that is not in ``special_ids`` (it may equal the original token).
    * ``targets`` holds the original token at the selected positions and ``0`` (``<pad>``,
      the id the loss ignores) everywhere else.

    Every random number comes from ``generator``: the same seed gives the same result.

    Args:
        tokens: ``(batch, len)`` ids, padded with 0.
        mask_id: the id of ``[MASK]`` (one of ``special_ids``).
        vocab_size: number of ids.
        special_ids: ids that are never selected and never drawn.
        generator: the source of every random number.

    Returns:
        ``(inputs, targets)``, both ``(batch, len)`` integer tensors.
    """
    is_ordinary = torch.ones(vocab_size, dtype=torch.bool)  # (vocab_size,)
    is_ordinary[list(special_ids)] = False
    ordinary = is_ordinary.nonzero().flatten()  # (num_ordinary,)
    real = is_ordinary[tokens]  # (batch, len): may be selected
    chance = torch.rand(tokens.shape, generator=generator)  # (batch, len)
    selected = real & (chance < SELECT_PROBABILITY)  # (batch, len)
    split = torch.rand(tokens.shape, generator=generator)  # (batch, len)
    to_mask = selected & (split < MASK_SHARE)  # (batch, len)
    to_random = selected & (split >= MASK_SHARE) & (split < MASK_SHARE + RANDOM_SHARE)  # (b, len)
    picks = torch.randint(len(ordinary), tokens.shape, generator=generator)  # (batch, len)
    drawn = ordinary[picks]  # (batch, len) random ordinary ids
    inputs = tokens.masked_fill(to_mask, mask_id)  # (batch, len)
    inputs = torch.where(to_random, drawn, inputs)  # (batch, len)
    targets = tokens.masked_fill(~selected, 0)  # (batch, len)
    return inputs, targets


@dataclass
class _MaskingSetting:
    """One vocabulary layout and the batches the reader's function masks."""

    vocab_size: int
    special_ids: tuple[int, ...]
    mask_id: int
    batches: list[Tensor]  # each (batch, len)
    seeds: list[int]  # one generator seed per batch


def _masking_settings() -> list[_MaskingSetting]:
    """Three layouts: [MASK] right after ``<pad> <bos> <eos> <unk>``, [MASK] as the last id
    (so the ordinary ids are not simply ``len(special_ids) .. vocab_size - 1``), and [MASK] as
    the last of 7 ids, with only two ordinary ids (4 and 5). In the last, a random id drawn
    from ``4 .. vocab_size - 1`` ("skip <pad> <bos> <eos> <unk>") is [MASK] one time in three,
    which raises the [MASK] share from 0.8 to 0.833. A fourth layout adds three sentinels
    (T5's ``<X> <Y> <Z>``, ids 21 to 23) to ``special_ids`` and scatters them among the words,
    as in chapter 10's own data: an answer that hard-codes ``<pad> <bos> <eos> <unk>`` and
    ``mask_id`` (or selects ``token > 3``) selects them, or draws them as random tokens.
    Rows are ``<bos> words <eos>`` + padding, with some ``<unk>`` among the words; 100 batches
    of 16 sentences of 3 to 40 words give about 33,000 real tokens in each of the first two
    layouts (and the fourth), and 100 batches of 48 about 100,000 in the third, so that 0.833
    lies well outside its 5-standard-deviation band. A fifth layout, like the first, draws its
    words with skewed (Zipf-like) frequencies, as real text has them."""
    g = seeded_generator(1002)
    settings = []
    layouts = [
        (24, (0, 1, 2, 3, 4), 4, 16),
        (30, (0, 1, 2, 3, 29), 29, 16),
        (7, (0, 1, 2, 3, 6), 6, 48),
        (24, (0, 1, 2, 3, 4, 21, 22, 23), 4, 16),
        (24, (0, 1, 2, 3, 4), 4, 16),  # skewed word frequencies (below)
    ]
    for layout, (vocab_size, special_ids, mask_id, rows) in enumerate(layouts):
        ordinary = torch.tensor([i for i in range(vocab_size) if i not in special_ids])  # (n,)
        # The fifth layout's words are Zipf-like (the k-th ordinary id with weight 1/k^2, so
        # the first is about 60% of the words): a replacement drawn from the batch's or the
        # row's own tokens, or a shuffle of the selected ones, is then far from uniform.
        weights = 1.0 / torch.arange(1, len(ordinary) + 1, dtype=torch.float64) ** 2  # (n,)
        batches = []
        for _ in range(100):
            lengths = torch.randint(3, 41, (rows,), generator=g)  # (rows,) words per sentence
            if layout == 4:
                picks = torch.multinomial(weights, rows * 40, replacement=True, generator=g)
                words = ordinary[picks.reshape(rows, 40)]  # (rows, 40)
            else:
                picks = torch.randint(len(ordinary), (rows, 40), generator=g)  # (rows, 40)
                words = ordinary[picks]  # (rows, 40)
            words = words.masked_fill(torch.rand(rows, 40, generator=g) < 0.05, 3)  # some <unk>
            extra = [i for i in special_ids if i not in (0, 1, 2, 3, mask_id)]  # sentinels
            if extra:  # (only the fourth layout draws these, so the others stay as they were)
                sentinel = torch.tensor(extra)[torch.randint(len(extra), (rows, 40), generator=g)]
                words = torch.where(torch.rand(rows, 40, generator=g) < 0.05, sentinel, words)
            tokens = torch.zeros(rows, int(lengths.max()) + 2, dtype=torch.long)  # (rows, len)
            for row, n in enumerate(lengths.tolist()):
                tokens[row, : n + 2] = torch.tensor([1, *words[row, :n].tolist(), 2])
            batches.append(tokens)
        seeds = [10_000 + 7 * index for index in range(len(batches))]
        settings.append(_MaskingSetting(vocab_size, special_ids, mask_id, batches, seeds))
    return settings


def _first_index(where: Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in where.nonzero()[0])


def _masking_problem(got: object, tokens: Tensor, setting: _MaskingSetting) -> str | None:
    """What is wrong with one result ``(inputs, targets)`` of the reader's function, or None."""
    shape = tuple(tokens.shape)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return f"return a pair (inputs, targets), got {type(got).__name__}"
    inputs, targets = got
    for name, value in (("inputs", inputs), ("targets", targets)):
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            what = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            return f"{name} must be a tensor of the shape of tokens {shape}, got {what}"
        if value.is_floating_point() or value.dtype == torch.bool:
            return f"{name} must hold integer ids, got dtype {value.dtype}"
    inputs, targets = inputs.long(), targets.long()
    for name, value in (("inputs", inputs), ("targets", targets)):
        outside = (value < 0) | (value >= setting.vocab_size)  # (batch, len)
        if bool(outside.any()):
            index = _first_index(outside)
            bad = int(value[index])
            return f"{name}{list(index)} = {bad} is not an id in [0, {setting.vocab_size})"
    special = torch.isin(tokens, torch.tensor(setting.special_ids))  # (batch, len)
    touched = special & ((inputs != tokens) | (targets != 0))  # (batch, len)
    if bool(touched.any()):
        index = _first_index(touched)
        token = int(tokens[index])
        kind = "padding (<pad> = 0)" if token == 0 else "a special token"
        hint = (
            f" (id {token} is in special_ids {list(setting.special_ids)}: take the special "
            "ids from special_ids, not from a fixed list or a threshold)"
            if token > 3 and token != setting.mask_id
            else ""
        )
        return (
            f"position {list(index)} holds {kind}, id {token}, but got input "
            f"{int(inputs[index])} and target {int(targets[index])}: padding and special tokens "
            f"are never selected (input unchanged, target 0){hint}"
        )
    selected = targets != 0  # (batch, len)
    wrong_target = selected & (targets != tokens)  # (batch, len)
    if bool(wrong_target.any()):
        index = _first_index(wrong_target)
        return (
            f"targets{list(index)} = {int(targets[index])} but the token there is "
            f"{int(tokens[index])}: a selected position's target is its original token"
        )
    changed_unselected = ~selected & (inputs != tokens)  # (batch, len)
    if bool(changed_unselected.any()):
        index = _first_index(changed_unselected)
        return (
            f"inputs{list(index)} was changed ({int(tokens[index])} → {int(inputs[index])}) but "
            "its target is 0: every changed position must be selected (target = its original "
            "token), and unselected positions keep their token"
        )
    replaced = selected & (inputs != tokens) & (inputs != setting.mask_id)  # (batch, len)
    drawn_special = replaced & torch.isin(inputs, torch.tensor(setting.special_ids))  # (b, len)
    if bool(drawn_special.any()):
        index = _first_index(drawn_special)
        return (
            f"inputs{list(index)} = {int(inputs[index])}, a special id, as a random replacement: "
            f"random tokens come from the ordinary ids (not {list(setting.special_ids)})"
        )
    return None


def _proportion_problem(what: str, count: int, total: int, expected: float) -> str | None:
    """``None`` when ``count / total`` is within :data:`Z_BOUND` standard deviations of
    ``expected`` (a binomial proportion), else the explanation."""
    spread = Z_BOUND * math.sqrt(expected * (1 - expected) / total)
    low, high = expected - spread, expected + spread
    if low <= count / total <= high:
        return None
    return (
        f"{what}: {count} of {total} = {count / total:.4f}; a correct answer lands in "
        f"[{low:.4f}, {high:.4f}] (expected {expected:.4f} ± {Z_BOUND:g} standard deviations)"
    )


def _dispersion_problem(
    setting: _MaskingSetting, results: list[tuple[Tensor, Tensor]]
) -> str | None:
    """``None`` when the per-row numbers of selected positions spread like independent draws.

    A row with ``n`` real tokens, each selected independently with probability ``p``, has a
    binomial count ``c``: ``z² = (c - n p)² / (n p q)`` (``q = 1 - p``) has mean 1 and variance
    ``2 + (1 - 6 p q) / (n p q)``. Summed over the rows, ``S`` is compared with its mean (the
    number of rows) within :data:`Z_BOUND` standard deviations. A fixed count per row, such as
    BERT's own ``round(15% · n)``, gives almost no spread and lands far below."""
    special = torch.tensor(setting.special_ids)  # (num_special,)
    p, q = SELECT_PROBABILITY, 1 - SELECT_PROBABILITY
    statistic = mean = variance = 0.0
    rows = 0
    for tokens, (_, targets) in zip(setting.batches, results):
        real = (~torch.isin(tokens, special)).sum(dim=1).double()  # (batch,) real tokens per row
        chosen = (targets.long() != 0).sum(dim=1).double()  # (batch,) selected per row
        keep = real > 0  # (batch,)
        n, c = real[keep], chosen[keep]
        statistic += float(((c - n * p) ** 2 / (n * p * q)).sum())
        mean += float(keep.sum())
        variance += float((2 + (1 - 6 * p * q) / (n * p * q)).sum())
        rows += int(keep.sum())
    spread = Z_BOUND * math.sqrt(variance)
    if abs(statistic - mean) <= spread:
        return None
    return (
        f"the number of selected positions per row spreads too {'little' if statistic < mean else 'much'}: "
        f"over {rows} rows the sum of squared standardised counts is {statistic:.0f}, and "
        f"independent 15% draws land in [{mean - spread:.0f}, {mean + spread:.0f}]. Select "
        "each position on its own coin (a binomial count per row), not a fixed number such as "
        "round(15% · n) per row"
    )


def _masking_statistics(
    setting: _MaskingSetting, results: list[tuple[Tensor, Tensor]]
) -> str | None:
    """Check the proportions over every draw of one layout, and that random replacements
    reach every ordinary id."""
    special = torch.tensor(setting.special_ids)  # (num_special,)
    ordinary_count = setting.vocab_size - len(setting.special_ids)
    real = selected = masked = kept = 0
    random_counts = torch.zeros(setting.vocab_size, dtype=torch.long)  # (vocab_size,)
    for tokens, (inputs, targets) in zip(setting.batches, results):
        chosen = targets.long() != 0  # (batch, len)
        inputs = inputs.long()  # (batch, len)
        real += int((~torch.isin(tokens, special)).sum())
        selected += int(chosen.sum())
        masked += int((chosen & (inputs == setting.mask_id)).sum())
        kept += int((chosen & (inputs == tokens)).sum())
        others = inputs[chosen & (inputs != tokens) & (inputs != setting.mask_id)]  # (count,)
        random_counts += torch.bincount(others, minlength=setting.vocab_size)
    problem = _proportion_problem("selected / real tokens", selected, real, SELECT_PROBABILITY)
    if problem is None and selected == 0:
        problem = "no position was ever selected"
    if problem is None:
        problem = _dispersion_problem(setting, results)
    if problem is not None:
        return problem
    is_ordinary = ~torch.isin(torch.arange(setting.vocab_size), special)  # (vocab_size,)
    # Uniformity first: a draw from the batch's own tokens also hits the original too often,
    # and "not uniform" names the slip better than the shares below would.
    problem = _uniformity_problem(setting, results, random_counts[is_ordinary], is_ordinary)
    if problem is not None:
        return problem
    # A random draw equals the original token 1 time in `ordinary_count`: it then looks kept.
    same = 1 / ordinary_count
    replaced = selected - masked - kept
    for what, count, expected in [
        ("[MASK] / selected", masked, MASK_SHARE),
        ("random other token / selected", replaced, RANDOM_SHARE * (1 - same)),
        ("unchanged / selected", kept, KEEP_SHARE + RANDOM_SHARE * same),
    ]:
        problem = _proportion_problem(what, count, selected, expected)
        if problem and what.startswith("[MASK]") and count / selected > expected:
            problem += " (too many: is the split 80/10/10, and can a random draw be mask_id?)"
        if problem and what.startswith("random") and count / selected > expected:
            problem += (
                " (too many: are 10% of the selected tokens kept unchanged? The random token is "
                "uniform over every ordinary id and may happen to be the original; do not redraw "
                "until it differs)"
            )
        if problem:
            return problem
    never = (is_ordinary & (random_counts == 0)).nonzero().flatten().tolist()
    if never:
        return (
            f"the random replacements never used the ordinary id(s) {never} in "
            f"{replaced} draws: draw uniformly from every id in [0, {setting.vocab_size}) that "
            f"is not in special_ids {list(setting.special_ids)}"
        )
    return None


def _uniformity_problem(
    setting: _MaskingSetting,
    results: list[tuple[Tensor, Tensor]],
    counts: Tensor,
    is_ordinary: Tensor,
) -> str | None:
    """A chi-square test that the visible random replacements are uniform over the ordinary
    ids. A uniform draw that hits the original token looks kept, so id v is expected in
    proportion to the number of selected positions whose original is not v (this also holds
    for an answer that redraws until the token differs). The statistic is turned into a
    standard normal deviate (Wilson and Hilferty's cube root) and refused beyond
    :data:`Z_BOUND`."""
    ordinary = is_ordinary.nonzero().flatten()  # (n,)
    originals = torch.zeros(setting.vocab_size, dtype=torch.float64)  # (vocab_size,)
    for tokens, (_, targets) in zip(setting.batches, results):
        originals += torch.bincount(tokens[targets.long() != 0], minlength=setting.vocab_size)
    weight = originals.sum() - originals[ordinary]  # (n,) selected positions not holding v
    total = int(counts.sum())
    if len(ordinary) < 2 or total == 0:
        return None
    expected = total * weight / weight.sum()  # (n,)
    chi2 = float(((counts.double() - expected) ** 2 / expected).sum())
    dof = len(ordinary) - 1
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    if z <= Z_BOUND:
        return None
    top = int(ordinary[counts.argmax()])
    return (
        f"the random replacements are not uniform over the ordinary ids (chi-square "
        f"{chi2:.0f} on {dof} degrees of freedom, {z:.1f} standard deviations; id {top} drawn "
        f"{int(counts.max())} times of {total}, about {expected.mean().item():.0f} expected): "
        f"draw each one uniformly from the ids in [0, {setting.vocab_size}) that are not in "
        f"special_ids, not from the tokens of the batch"
    )


def check_bert_masking(
    bert_mask: Callable[..., tuple[Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``bert_mask(tokens, mask_id, vocab_size, special_ids, generator)`` →
    ``(inputs, targets)``, both ``(batch, len)``, as :func:`reference_bert_masking` describes.

    Your function masks 500 batches (five vocabulary layouts, 33,000 to 100,000 real tokens each),
    each with a fresh generator. Every result must hold on its own: padding and special
    tokens untouched (input unchanged, target 0), the target of a selected position its
    original token, every other position unchanged with target 0, random replacements never
    special. Over each layout, the proportions must be BERT's within :data:`Z_BOUND` standard
    deviations: 15% of the real tokens selected, with the per-row counts spread as
    independent draws give them (a fixed count per row, BERT's own round(15% · n), is
    refused); of those, 80% ``[MASK]``, 10% another token,
    10% unchanged (a random draw that hits the original token counts as unchanged: the
    expected shares allow for it); and random replacements must reach every ordinary id
    (at least about 20 draws of each are expected: a correct answer misses one with probability
    below 1e-7), uniformly (a chi-square test; one layout has skewed word frequencies, so that
    a replacement taken from the batch's own tokens fails it).
    Finally, two calls with generators seeded alike must agree (every random number comes
    from ``generator``). A call into :mod:`companion.data.objectives` (whose
    ``masked_lm_example`` is the answer) is refused.
    """
    _check_callable("bert_mask", bert_mask)
    bert_mask = refusing_calls(
        bert_mask,
        "select and corrupt the tokens",
        (objectives,),
        why=": companion.data.objectives (masked_lm_example) holds the answer",
    )
    name = "bert_mask"
    count = 0
    result: CheckResult | None = None
    for setting in _masking_settings():
        results: list[tuple[Tensor, Tensor]] = []
        for tokens, seed in zip(setting.batches, setting.seeds):
            count += 1
            kwargs = {
                "tokens": tokens.clone(),
                "mask_id": setting.mask_id,
                "vocab_size": setting.vocab_size,
                "special_ids": setting.special_ids,
                "generator": seeded_generator(seed),
            }
            got, result = call_reader(name, count, bert_mask, kwargs)
            if result is not None:
                break
            problem = _masking_problem(got, tokens, setting)
            if problem is None and not torch.equal(kwargs["tokens"], tokens):
                problem = (
                    "bert_mask changed the caller's `tokens` in place (a training loop that "
                    "reuses the batch would lose its originals): start from tokens.clone()"
                )
            if problem:
                result = _failed(name, count, problem, tokens, setting)
                break
            assert isinstance(got, (tuple, list))
            results.append((got[0], got[1]))
        if result is not None:
            break
        problem = _masking_statistics(setting, results)
        if problem is None:
            count += 1
            kwargs = {
                "tokens": setting.batches[0].clone(),
                "mask_id": setting.mask_id,
                "vocab_size": setting.vocab_size,
                "special_ids": setting.special_ids,
                "generator": seeded_generator(setting.seeds[0]),
            }
            again, result = call_reader(name, count, bert_mask, kwargs)
            if result is not None:
                break
            problem = _masking_problem(again, setting.batches[0], setting)
            if problem is None and any(
                not torch.equal(a.long(), b.long()) for a, b in zip(again, results[0])
            ):
                problem = (
                    "two calls with generators seeded alike gave different results: draw "
                    "every random number from `generator` (e.g. torch.rand(shape, "
                    "generator=generator))"
                )
        if problem:
            result = _failed(name, count, problem, None, setting)
            break
    if result is None:
        result = CheckResult(
            name,
            True,
            count,
            f"✅ {name}: all {count} calls pass; the proportions are BERT's 15% and 80/10/10.",
        )
    if verbose:
        report(result)
    return result


def _failed(
    name: str, count: int, problem: str, tokens: Tensor | None, setting: _MaskingSetting
) -> CheckResult:
    where = (
        f"tokens of shape {tuple(tokens.shape)}, "
        if tokens is not None
        else f"over {len(setting.batches)} batches, "
    )
    layout = (
        f"{where}vocab_size={setting.vocab_size}, special_ids={setting.special_ids}, "
        f"mask_id={setting.mask_id}"
    )
    return CheckResult(
        name, False, count, f"❌ {name}: case {count} is wrong.\n   {problem}\n   inputs: {layout}"
    )


# --------------------------------------------------------------------------------------------
# Exercise 7: one sampling step with temperature and top-k
# --------------------------------------------------------------------------------------------

#: No uniform number of a case lies closer than this to a cumulative probability of the
#: reference, so float32 and float64 answers pick the same token.
UNIFORM_MARGIN = 1e-3


def reference_sample_next_token(
    logits: Tensor, temperature: float, top_k: int | None, uniform: Tensor
) -> Tensor:
    """Draw the next token of each row by inverse-CDF sampling from temperature + top-k.

    * ``temperature == 0``: greedy, the id of the largest logit (the lowest such id on a tie);
      ``top_k`` and ``uniform`` play no part.
    * Otherwise: keep every token whose logit is at least the ``top_k``-th largest of its
      row (all of them when ``top_k`` is ``None``; tokens tied with the ``top_k``-th are all
      kept), divide the kept logits by ``temperature``, take the softmax over the kept
      tokens (the others get probability 0), and return the first id, *in id order*, whose
      cumulative probability exceeds the row's ``uniform`` number: the smallest ``t`` with
      ``p_0 + ... + p_t > u``.

    Args:
        logits: ``(batch, vocab)`` float logits; ``-inf`` marks a token that may never be
            drawn (at least one finite logit per row).
        temperature: ``>= 0``.
        top_k: ``1 <= top_k <= vocab``, or ``None``.
        uniform: ``(batch,)`` numbers in ``[0, 1)``, one per row.

    Returns:
        ``(batch,)`` LongTensor of token ids.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)  # (batch,): the first maximum on a tie
    logits = logits.double()  # (batch, vocab)
    if top_k is not None:
        kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]  # (batch, 1)
        logits = logits.masked_fill(logits < kth_largest, -math.inf)  # (batch, vocab)
    probs = torch.softmax(logits / temperature, dim=-1)  # (batch, vocab)
    cumulative = probs.cumsum(dim=-1)  # (batch, vocab)
    below = cumulative <= uniform.double()[:, None]  # (batch, vocab): ids before the draw
    return below.sum(dim=-1).clamp(max=logits.shape[-1] - 1)  # (batch,)


def _keep_away_from_boundaries(
    logits: Tensor, temperature: float, top_k: int | None, g: torch.Generator
) -> Tensor:
    """One uniform number per row, drawn again while it lies within :data:`UNIFORM_MARGIN`
    of a cumulative probability of the reference (or of 0 and 1)."""
    batch = logits.shape[0]
    uniform = torch.rand(batch, generator=g)  # (batch,)
    if temperature == 0:
        return uniform
    scaled = logits.double()  # (batch, vocab)
    if top_k is not None:
        kth_largest = scaled.topk(top_k, dim=-1).values[:, -1:]  # (batch, 1)
        scaled = scaled.masked_fill(scaled < kth_largest, -math.inf)  # (batch, vocab)
    cumulative = torch.softmax(scaled / temperature, dim=-1).cumsum(dim=-1)  # (batch, vocab)
    start = torch.zeros(batch, 1, dtype=torch.float64)  # (batch, 1)
    edges = torch.cat([start, cumulative], dim=-1)  # (batch, vocab + 1)
    while True:
        distance = (edges - uniform.double()[:, None]).abs().min(dim=-1).values  # (batch,)
        close = distance < UNIFORM_MARGIN  # (batch,)
        if not bool(close.any()):
            return uniform
        uniform[close] = torch.rand(int(close.sum()), generator=g)


def _sampling_cases() -> list[Case]:
    g = seeded_generator(1003)
    settings = [
        # (batch, vocab, temperature, top_k, logits)
        (64, 10, 1.0, None, "normal"),  # plain softmax sampling
        (64, 12, 0.5, 3, "normal"),  # a low temperature
        (64, 8, 2.0, 5, "normal"),  # a high temperature
        (48, 20, 0.7, 1, "normal"),  # top-1: greedy, whatever the uniform number
        (48, 6, 1.5, 6, "normal"),  # top_k = vocab: nothing removed
        (64, 50, 3.0, 10, "normal"),  # hot: most of the mass lies outside the top 10
        (32, 10, 0.0, None, "ties"),  # greedy with ties for the largest logit
        (32, 9, 0.0, 4, "normal"),  # greedy: top_k changes nothing
        (64, 10, 1.0, 3, "ties"),  # ties at the top_k-th logit: all kept
        (48, 16, 0.8, 8, "blocked"),  # -inf logits; some rows have fewer than 8 finite
    ]
    cases = []
    for batch, vocab, temperature, top_k, kind in settings:
        if kind == "ties":
            logits = torch.randint(0, 4, (batch, vocab), generator=g).float()  # many ties
        else:
            logits = 2.0 * torch.randn(batch, vocab, generator=g)  # (batch, vocab)
        if kind == "blocked":
            blocked = torch.rand(batch, vocab, generator=g) < 0.6  # (batch, vocab)
            keep = torch.randint(vocab, (batch,), generator=g)  # (batch,) one finite per row
            blocked[torch.arange(batch), keep] = False
            logits = logits.masked_fill(blocked, -math.inf)  # (batch, vocab)
        uniform = _keep_away_from_boundaries(logits, temperature, top_k, g)  # (batch,)
        cases.append(
            {"logits": logits, "temperature": temperature, "top_k": top_k, "uniform": uniform}
        )
    # u = 0 exactly (torch.rand can return it) with id 0 blocked: its cumulative probability is
    # exactly 0, so "the first id whose cumulative probability exceeds u" skips it, while the
    # classic ">= u" slip (searchsorted's default side) draws a token of probability 0
    logits = 2.0 * torch.randn(16, 8, generator=g)  # (16, 8)
    logits[:, 0] = -math.inf
    uniform = _keep_away_from_boundaries(logits, 1.0, None, g)  # (16,)
    uniform[:8] = 0.0
    cases.append({"logits": logits, "temperature": 1.0, "top_k": None, "uniform": uniform})
    return cases


def _sampling_variant(
    logits: Tensor, temperature: float, top_k: int | None, uniform: Tensor, slip: str
) -> Tensor:
    """A classic wrong draw (temperature > 0): ``">="``, ``"probs / tau"``, ``"sorted"``,
    ``"not renormalised"`` (top-k applied after the softmax) or ``"ties dropped"`` (exactly
    ``top_k`` ids kept)."""
    logits = logits.double()  # (batch, vocab)
    full = torch.softmax(logits / temperature, dim=-1)  # (batch, vocab): before any top-k
    if top_k is not None and slip == "ties dropped":
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(
            1, logits.topk(top_k, dim=-1).indices, True
        )
        logits = logits.masked_fill(~keep, -math.inf)
    elif top_k is not None:
        kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]  # (batch, 1)
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    probs = torch.softmax(logits / temperature, dim=-1)  # (batch, vocab)
    if slip == "not renormalised":
        probs = full.masked_fill(probs == 0, 0.0)  # the top-k cut after the softmax, no rescaling
    u = uniform.double()[:, None]  # (batch, 1)
    if slip == "probs / tau":
        probs = torch.softmax(logits, dim=-1) / temperature  # the probabilities, not the logits
    if slip == "sorted":
        probs = probs.sort(dim=-1, descending=True).values  # the position in sorted order
    below = probs.cumsum(dim=-1) < u if slip == ">=" else probs.cumsum(dim=-1) <= u
    return below.sum(dim=-1).clamp(max=logits.shape[-1] - 1)


def _sampling_hint(case: Case, got: object) -> str:
    """Name the classic slip the answer matches, if any."""
    if not isinstance(got, Tensor) or case["temperature"] == 0:
        return ""
    right = reference_sample_next_token(**case)
    slips = {
        ">=": "the first id whose cumulative probability is >= u was drawn: the spec says "
        "EXCEEDS u (searchsorted(..., right=True)); at u = 0 the >= rule draws a blocked token",
        "probs / tau": "the probabilities were divided by the temperature: divide the logits, "
        "then take the softmax",
        "sorted": "the position in sorted order was returned: return the token's id "
        "(accumulate the probabilities in id order)",
        "not renormalised": "the top-k probabilities were not renormalised: they must sum to "
        "1 again (cut the logits, then take the softmax)",
        "ties dropped": "exactly top_k ids were kept: ids tied with the k-th largest logit "
        "are kept too",
    }
    for slip, message in slips.items():
        wrong = _sampling_variant(slip=slip, **case)
        if (
            got.shape == wrong.shape
            and torch.equal(got.long(), wrong)
            and not torch.equal(wrong, right)
        ):
            return f"\n   hint: {message}"
    return ""


def check_sample_next_token(
    sample_next_token: Callable[..., Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``sample_next_token(logits, temperature, top_k, uniform)`` → ``(batch,)`` ids, as
    :func:`reference_sample_next_token` describes (inverse-CDF sampling in id order).

    The uniform numbers are never within :data:`UNIFORM_MARGIN` of a cumulative probability,
    so rounding cannot change the token, except ``u = 0`` exactly on rows whose first id is
    blocked (a cumulative probability of exactly 0, which ``>= u`` would draw); among the
    cases are greedy rows with tied maxima,
    ties at the ``top_k``-th logit, blocked (``-inf``) tokens and a temperature high enough
    that most of the probability lies outside the top ``k``. A wrong answer is told which
    classic slip it matches, if any.
    """
    return run_check(
        "sample_next_token",
        sample_next_token,
        reference_sample_next_token,
        _sampling_cases(),
        verbose=verbose,
        hint=_sampling_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 5: a ViT's patches
# --------------------------------------------------------------------------------------------


def reference_patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into non-overlapping square patches, one flat vector per patch: the tokens
    of a Vision Transformer (Dosovitskiy et al. 2021).

    Patches come in reading order, row of patches by row of patches, left to right
    (patch ``r · (width / p) + c`` is the one in patch row ``r``, patch column ``c``). Each
    patch is flattened channel by channel, each channel row by row: the layout of an
    ``nn.Conv2d`` weight ``(out, channels, p, p)`` and of ``F.unfold``, so that a linear
    layer on the patches equals a convolution with kernel and stride ``p``.

    Args:
        images: ``(batch, channels, height, width)``; ``height`` and ``width`` multiples of
            ``patch_size``.
        patch_size: the side ``p`` of a patch.

    Returns:
        ``(batch, (height / p) · (width / p), channels · p · p)``.
    """
    batch, channels, height, width = images.shape
    p = patch_size
    rows, columns = height // p, width // p
    grid = images.reshape(batch, channels, rows, p, columns, p)  # (b, c, rows, p, cols, p)
    patches = grid.permute(0, 2, 4, 1, 3, 5)  # (batch, rows, cols, channels, p, p)
    return patches.reshape(batch, rows * columns, channels * p * p)  # (b, patches, c·p·p)


def _patch_cases() -> list[Case]:
    g = seeded_generator(1004)
    settings = [
        # (batch, channels, height, width, patch_size)
        (2, 1, 8, 8, 4),  # the chapter's digits: four 4x4 patches
        (3, 1, 8, 8, 2),  # sixteen 2x2 patches
        (2, 3, 8, 8, 4),  # colour: channels inside each patch
        (2, 3, 8, 8, 2),
        (1, 1, 4, 4, 2),  # four patches of four pixels: a transposed answer has the same shape
        (2, 2, 6, 6, 3),
        (2, 1, 4, 8, 2),  # wider than tall: 2 rows of 4 patches
        (1, 1, 8, 8, 8),  # one patch: the whole image
        (2, 1, 8, 8, 1),  # one pixel per patch
    ]
    cases = [
        {"images": torch.randn(b, c, h, w, generator=g), "patch_size": p}
        for b, c, h, w, p in settings
    ]
    # Not contiguous, as after a transpose in a data pipeline: an answer that reads the memory
    # (as_strided, the storage) instead of the shape fails here. (A .view that only splits
    # height and width works on any strides, so it passes, rightly.)
    for b, c, h, w, p in [(2, 3, 8, 8, 2), (2, 1, 4, 8, 2)]:
        cases.append(
            {"images": torch.randn(b, c, w, h, generator=g).transpose(2, 3), "patch_size": p}
        )
    return cases


def check_patchify(patchify: Callable[[Tensor, int], Tensor], verbose: bool = True) -> CheckResult:
    """Check ``patchify(images, patch_size)``: ``(batch, channels, height, width)`` →
    ``(batch, num_patches, channels · p · p)``, patches in reading order, each flattened
    channel by channel, row by row. ``F.unfold`` (the answer section 10.5 shows) is refused:
    the exercise asks for the reshapes and permutations behind it."""
    _check_callable("patchify", patchify)

    def without_f_unfold(images: Tensor, patch_size: int) -> Tensor:
        # F.unfold, and the kernel it calls (so `from torch.nn.functional import unfold` too)
        real, real_im2col = torch.nn.functional.unfold, torch._C._nn.im2col
        torch.nn.functional.unfold = _refuse_f_unfold
        torch._C._nn.im2col = _refuse_f_unfold
        try:
            return patchify(images, patch_size)
        finally:
            torch.nn.functional.unfold, torch._C._nn.im2col = real, real_im2col

    return run_check(
        "patchify",
        without_f_unfold,
        reference_patchify,
        _patch_cases(),
        verbose=verbose,
        hint=_patchify_hint,
    )


def _patchify_variant(images: Tensor, patch_size: int, slip: str) -> Tensor:
    """A classic wrong patch layout: ``"plain reshape"``, ``"columns first"`` or
    ``"channels last"``."""
    b, c, h, w = images.shape
    p = patch_size
    if slip == "plain reshape":
        return images.reshape(b, -1, c * p * p)
    grid = images.reshape(b, c, h // p, p, w // p, p)  # (b, c, rows, p, cols, p)
    order = {"columns first": (0, 4, 2, 1, 3, 5), "channels last": (0, 2, 4, 3, 5, 1)}[slip]
    return grid.permute(*order).reshape(b, -1, c * p * p)


def _patchify_hint(case: Case, got: object) -> str:
    """Name the classic slip the answer matches, if any."""
    if not isinstance(got, Tensor):
        return ""
    right = reference_patchify(**case)
    if not case["images"].is_contiguous():
        return (
            "\n   hint: these images are a transposed view, not contiguous in memory: read "
            "them through their shape (reshape, permute), not through as_strided or the storage"
        )
    slips = {
        "plain reshape": "a plain reshape takes s*s consecutive pixels of one image row as a "
        "patch: split height and width into (patch, pixel) first, then permute",
        "columns first": "the patches run column by column: reading order is patch row by "
        "patch row, left to right within a row",
        "channels last": "each patch holds its channels last: flatten it channel by channel, "
        "then row by row (the layout of F.unfold and of a Conv2d weight)",
    }
    for slip, message in slips.items():
        wrong = _patchify_variant(case["images"], case["patch_size"], slip)
        if got.shape == wrong.shape and torch.equal(got, wrong) and not torch.equal(wrong, right):
            return f"\n   hint: {message}"
    return ""


def _refuse_f_unfold(*args: object, **kwargs: object) -> Tensor:
    raise RuntimeError(
        "patchify called F.unfold: write it with reshape and permute (or Tensor.unfold), "
        "the point of the exercise is the patch order F.unfold hides"
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: three standard errors of one comparison (predict, then measure)
# --------------------------------------------------------------------------------------------


def reference_standard_errors(
    baseline_losses: np.ndarray, model_losses: np.ndarray, clusters: np.ndarray
) -> tuple[float, float, float]:
    """Three standard errors for the mean advantage ``baseline_losses - model_losses``.

    Args:
        baseline_losses, model_losses: ``(items,)`` the two models' losses on the same items.
        clusters: ``(items,)`` the group of each item (a test sentence).

    Returns:
        ``(paired, independent, unpaired)``: the paired difference with each cluster one
        draw (:func:`~companion.metrics.clustered_se`, the chapter's rule); the same
        difference with every item its own draw; and the two models' own clustered standard
        errors combined as if they had been scored on two independent test sets,
        ``sqrt(se_baseline**2 + se_model**2)``.
    """
    baseline = np.asarray(baseline_losses, dtype=float)
    model = np.asarray(model_losses, dtype=float)
    gap = baseline - model  # (items,)
    paired = clustered_se(gap, clusters)
    independent = clustered_se(gap, np.arange(len(gap)))
    unpaired = math.sqrt(clustered_se(baseline, clusters) ** 2 + clustered_se(model, clusters) ** 2)
    return paired, independent, unpaired


def _comparison_cases() -> list[Case]:
    rng = np.random.default_rng(1005)
    cases = []
    # (clusters, items per cluster at most, spread of the clusters' difficulty, advantage)
    for groups, most, spread, advantage in (
        (40, 12, 1.0, 0.1),
        (200, 20, 2.0, 0.05),  # hard and easy sentences: pairing matters a lot
        (60, 1, 1.0, 0.2),  # one item per cluster: paired equals independent
        (30, 30, 0.2, -0.1),  # the model is worse
        (120, 8, 3.0, 0.0),
        (25, 15, 1.0, 0.3),
        (80, 10, 0.5, 0.02),
    ):
        sizes = rng.integers(1, most + 1, size=groups)  # (groups,)
        clusters = np.repeat(rng.permutation(groups * 3)[:groups], sizes)  # (items,) any labels
        difficulty = np.repeat(rng.normal(3.0, spread, size=groups), sizes)  # shared by both
        shared_within = np.repeat(
            rng.normal(0, 0.5, size=groups), sizes
        )  # the model's luck per sentence
        items = len(clusters)
        baseline = difficulty + rng.normal(0, 1, size=items)
        model = difficulty - advantage + shared_within + rng.normal(0, 1, size=items)
        cases.append({"baseline_losses": baseline, "model_losses": model, "clusters": clusters})
    return cases


def _accept_sample_convention(
    got: object, baseline_losses: np.ndarray, model_losses: np.ndarray, clusters: np.ndarray
) -> object:
    """Accept the textbook (ddof=1) convention as well as ``clustered_se``'s (ddof=0).

    Each number may carry the usual small-sample factor sqrt(draws / (draws - 1)), draws being
    the items for the independent number and the clusters for the two others (the ``G/(G-1)``
    of cluster-robust errors; ``std(ddof=1) / sqrt(n)`` with one item per cluster). A number
    that equals the reference times that factor (to 1e-6) is replaced by the reference, so the
    comparison after it stays tight. Why not a blanket tolerance: it would have to be about
    2.1% (the factor at 25 clusters), and the closest classic slip is 8% off in one case
    (the unpaired number taken as the paired one); matching the two conventions exactly
    leaves no such room.
    """
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return got
    try:
        values = [float(x) for x in got]
    except (TypeError, ValueError):
        return got
    reference = reference_standard_errors(baseline_losses, model_losses, clusters)
    items, groups = len(baseline_losses), len(set(np.asarray(clusters).tolist()))
    draws = (groups, items, groups)  # paired, independent, unpaired
    for index, (value, right, n) in enumerate(zip(values, reference, draws)):
        if math.isclose(value, right * math.sqrt(n / (n - 1)), rel_tol=1e-6, abs_tol=1e-12):
            values[index] = right
    return tuple(values)


def _standard_errors_hint(case: Case, got: object) -> str:
    """Name the classic slip the answer matches, if any."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return ""
    try:
        got = tuple(float(x) for x in got)
    except (TypeError, ValueError):
        return ""
    baseline, model = case["baseline_losses"], case["model_losses"]
    clusters, items = case["clusters"], np.arange(len(baseline))
    paired, independent, unpaired = reference_standard_errors(baseline, model, clusters)
    se_b, se_m = clustered_se(baseline, clusters), clustered_se(model, clusters)
    slips = [
        (
            1,
            paired,
            "the second number uses the clusters: with every item its own draw, "
            "pass each item its own label (np.arange(items))",
        ),
        (
            0,
            independent,
            "the first number ignores the clusters: the chapter's rule counts "
            "each cluster (sentence) as one draw",
        ),
        (
            2,
            se_b + se_m,
            "the unpaired standard errors were added: independent errors add in "
            "quadrature, sqrt(se_baseline**2 + se_model**2)",
        ),
        (
            2,
            math.sqrt(clustered_se(baseline, items) ** 2 + clustered_se(model, items) ** 2),
            "the unpaired number ignores the clusters: each model's own standard error counts "
            "each cluster as one draw too",
        ),
        (
            2,
            paired,
            "the third number is still paired: combine the two models' own standard "
            "errors instead, as if each had its own test set",
        ),
        (
            1,
            float(np.std(baseline - model)),
            "the second number is the spread of the differences, not the standard error of "
            "their mean: divide by the square root of the number of draws (or use clustered_se)",
        ),
    ]
    groups = len(set(np.asarray(clusters).tolist()))
    factors = (1.0, math.sqrt(groups / (groups - 1)), math.sqrt(len(items) / (len(items) - 1)))
    for index, wrong, message in slips:  # a slip in either convention (ddof=0 or ddof=1)
        right = (paired, independent, unpaired)[index]
        if not math.isclose(wrong, right, rel_tol=1e-6) and any(
            math.isclose(got[index], wrong * factor, rel_tol=1e-6) for factor in factors
        ):
            return f"\n   hint: {message}"
    return ""


def check_standard_errors(
    standard_errors: Callable[..., tuple[float, float, float]], verbose: bool = True
) -> CheckResult:
    """Check ``standard_errors(baseline_losses, model_losses, clusters)`` →
    ``(paired, independent, unpaired)``, as :func:`reference_standard_errors` describes.

    Seven synthetic comparisons: clusters of unequal size with any labels, a difficulty shared
    by the two models within a cluster (what pairing removes), the model's own luck per cluster
    (what clustering counts), one comparison with one item per cluster, one where the model is
    worse. Each number may follow ``clustered_se`` (no small-sample correction) or the textbook
    ddof=1 convention (:func:`_accept_sample_convention`). A wrong answer is told which classic
    slip it matches, if any.
    """
    _check_callable("standard_errors", standard_errors)

    def on_copies(baseline_losses: np.ndarray, model_losses: np.ndarray, clusters: np.ndarray):
        got = standard_errors(
            baseline_losses=baseline_losses.copy(),
            model_losses=model_losses.copy(),
            clusters=clusters.copy(),
        )
        return _accept_sample_convention(got, baseline_losses, model_losses, clusters)

    return run_check(
        "standard_errors",
        on_copies,
        reference_standard_errors,
        _comparison_cases(),
        rtol=1e-6,
        atol=1e-9,
        verbose=verbose,
        hint=_standard_errors_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 6: an induction score from attention weights
# --------------------------------------------------------------------------------------------


def reference_induction_score(weights: Tensor, rep_len: Tensor) -> Tensor:
    """Each head's induction score on rows whose first ``n_rep`` tokens repeat right after.

    In row ``b`` with ``n_rep = rep_len[b]``, a query ``q`` with ``n_rep <= q <= 2 n_rep - 2``
    holds a copy of token ``q - n_rep``; an induction head attends to the token after that
    earlier occurrence, key ``q - n_rep + 1``. The score is the head's weight on that key,
    averaged over every such (row, query) pair of the batch (rows with a longer repeat count
    more).

    Args:
        weights: ``(batch, heads, seq_len, seq_len)`` attention weights ``[row, head, query, key]``.
        rep_len: ``(batch,)`` each row's ``n_rep``, with ``2 n_rep - 1 <= seq_len``.

    Returns:
        ``(heads,)``.
    """
    rows, queries, keys = [], [], []
    for row, length in enumerate(rep_len.tolist()):
        for q in range(length, 2 * length - 1):
            rows.append(row), queries.append(q), keys.append(q - length + 1)
    picked = weights[
        torch.tensor(rows), :, torch.tensor(queries), torch.tensor(keys)
    ]  # (pairs, heads)
    return picked.mean(dim=0)


def _induction_variant(
    weights: Tensor,
    rep_len: Tensor,
    key_shift: int = 1,
    last_extra: int = 0,
    first_late: int = 0,
    per_row: bool = False,
    transposed: bool = False,
) -> Tensor:
    """A classic wrong induction score (the reference at the defaults)."""
    if transposed:
        weights = weights.transpose(-1, -2)
    scores = []
    for row, length in enumerate(rep_len.tolist()):
        queries = torch.arange(length + first_late, 2 * length - 1 + last_extra)
        keys = (queries - length + key_shift).clamp(min=0)
        scores.append(weights[row][:, queries, keys].T)  # (queries, heads)
    if per_row:
        return torch.stack([s.mean(dim=0) for s in scores]).mean(dim=0)
    return torch.cat(scores).mean(dim=0)


def _induction_cases() -> list[Case]:
    g = seeded_generator(1006)
    cases: list[Case] = []
    settings = (  # (batch, heads, seq_len, shortest and longest n_rep); the chapter's rows: 31, 4-16
        (6, 2, 16, 2, 8),
        (5, 3, 21, 3, 11),
        (8, 1, 12, 2, 6),
        (4, 2, 31, 4, 16),
        (1, 2, 9, 5, 5),  # one row
        (3, 4, 10, 2, 2),  # the shortest repeat: one query per row
    )
    for batch, heads, seq_len, low, high in settings:
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        scores = 3 * torch.randn(batch, heads, seq_len, seq_len, generator=g)
        weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        rep_len = torch.randint(low, high + 1, (batch,), generator=g)  # lengths differ by row
        cases.append({"weights": weights, "rep_len": rep_len})
    # an ideal induction head (head 0) beside a previous-token head (head 1): scores 1 and 0
    batch, seq_len = 4, 20
    rep_len = torch.tensor([4, 7, 10, 5])
    weights = torch.zeros(batch, 2, seq_len, seq_len)
    weights[:, :, 0, 0] = 1
    for row, length in enumerate(rep_len.tolist()):
        for q in range(1, seq_len):
            weights[row, 0, q, q - length + 1 if length <= q <= 2 * length - 2 else q] = 1
            weights[row, 1, q, q - 1] = 1
    cases.append({"weights": weights, "rep_len": rep_len})
    # uniform causal attention: each query q spreads 1 / (q + 1) over its keys
    seq_len = 31
    uniform = torch.ones(seq_len, seq_len).tril()
    uniform = (uniform / uniform.sum(dim=-1, keepdim=True)).expand(3, 2, -1, -1).clone()
    cases.append({"weights": uniform, "rep_len": torch.tensor([4, 9, 16])})
    return cases


def _induction_hint(case: Case, got: object) -> str:
    """Name the classic slip the answer matches, if any."""
    if not isinstance(got, Tensor):
        return ""
    weights, rep_len = case["weights"], case["rep_len"]
    right = reference_induction_score(weights, rep_len)
    slips = [
        (
            dict(key_shift=0),
            "the key is the earlier copy of the query's own token (key "
            "q - n_rep): an induction head looks one further, at the token that FOLLOWED it, "
            "key q - n_rep + 1",
        ),  # fmt: skip
        (
            dict(key_shift=2),
            "the key is two past the earlier occurrence: the token that "
            "followed it is key q - n_rep + 1",
        ),  # fmt: skip
        (
            dict(last_extra=1),
            "the queries run to 2 n_rep - 1: the last token of the repeat "
            "predicts a token after it, outside the repeat; stop at 2 n_rep - 2",
        ),  # fmt: skip
        (
            dict(first_late=1),
            "the queries start at n_rep + 1: the first query of the second copy, q = n_rep, "
            "already holds a repeated token, so start at n_rep",
        ),  # fmt: skip
        (
            dict(per_row=True),
            "each row's mean was averaged: average over all (row, query) "
            "pairs at once, so that a row with a longer repeat counts more",
        ),  # fmt: skip
        (
            dict(transposed=True),
            "the weights were read [key, query]: they are indexed [row, head, query, key]",
        ),  # fmt: skip
    ]
    for options, message in slips:
        wrong = _induction_variant(weights, rep_len, **options)
        if got.shape == wrong.shape and torch.allclose(got.double(), wrong.double(), atol=1e-6):
            if not torch.allclose(wrong, right, atol=1e-6):
                return f"\n   hint: {message}"
    return ""


def check_induction_score(
    induction_score: Callable[[Tensor, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``induction_score(weights, rep_len)`` → ``(heads,)``, as
    :func:`reference_induction_score` describes: random causal weights with repeats of
    different lengths, an ideal induction head beside a previous-token head, and uniform
    attention. A wrong answer is told which classic slip it matches, if any."""
    _check_callable("induction_score", induction_score)
    return run_check(
        "induction_score",
        induction_score,
        reference_induction_score,
        _induction_cases(),
        atol=1e-6,
        rtol=1e-5,
        verbose=verbose,
        hint=_induction_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: the mask at test time, the objective in training
# --------------------------------------------------------------------------------------------


def reference_fill_rate(
    model: Callable[..., Tensor], rows: Tensor, blank: Tensor, mask_id: int, is_causal: bool
) -> float:
    """The share of rows whose hidden symbol ``model`` fills, run with or without the causal mask.

    In row ``b`` the symbol at position ``blank[b]`` is replaced by ``mask_id`` (in a copy:
    ``rows`` is left as it is); the model reads the rows with ``is_causal``, and its guess
    is the largest logit at the blank's own position.

    Args:
        model: called as ``model(inputs, is_causal=is_causal)``, returns ``(batch, seq_len, vocab)``.
        rows: ``(batch, seq_len)`` token ids.
        blank: ``(batch,)`` the position hidden in each row.
        mask_id: the id that hides a symbol.
        is_causal: run the model with the causal mask (``True``) or with none (``False``).

    Returns:
        the share of rows, a float in ``[0, 1]``.
    """
    every = torch.arange(len(rows))
    inputs = rows.clone()
    inputs[every, blank] = mask_id
    with torch.no_grad():
        logits = model(inputs, is_causal=is_causal)  # (batch, seq_len, vocab)
    return (logits[every, blank].argmax(dim=-1) == rows[every, blank]).float().mean().item()


_FILL_SYMBOLS, _FILL_FIRST, _FILL_MASK, _FILL_LEN = 10, 4, 3, 12  # section 10.2's toy rows


class _RuleModel:
    """A model of section 10.2's toy rows that needs no training, so the check runs in milliseconds.

    Where the input is a symbol it predicts that symbol (so a row whose blank was left visible
    is filled every time). At a mask it guesses from the left neighbour alone under the causal
    mask, and from both neighbours without it; a neighbour that is itself hidden gives no help.
    It takes ``is_causal`` by keyword only, as ``DecoderOnlyTransformer`` does after ``mask``.
    """

    def __call__(
        self, tokens: Tensor, mask: Tensor | None = None, *, is_causal: bool = True
    ) -> Tensor:
        if mask is not None:
            raise TypeError(
                "this check's model takes no attention mask: pass is_causal by name, "
                "model(inputs, is_causal=is_causal) (a second positional argument is the mask)"
            )
        batch, length = tokens.shape
        vocab = _FILL_FIRST + _FILL_SYMBOLS
        guess = tokens.clone()  # (batch, length): a visible symbol predicts itself
        symbol = tokens >= _FILL_FIRST
        left = torch.cat([torch.full((batch, 1), _FILL_MASK), tokens[:, :-1]], dim=1)
        right = torch.cat([tokens[:, 1:], torch.full((batch, 1), _FILL_MASK)], dim=1)
        left_ok, right_ok = left >= _FILL_FIRST, right >= _FILL_FIRST

        def shifted(by: int) -> Tensor:
            return (left - _FILL_FIRST + by) % _FILL_SYMBOLS + _FILL_FIRST

        apart = (right - left) % _FILL_SYMBOLS  # 2, 3 or 4 between two symbols
        both = torch.where(apart == 4, shifted(2), torch.where(apart == 3, shifted(2), shifted(1)))
        from_left = torch.where(left_ok, shifted(1), torch.full_like(tokens, _FILL_MASK))
        at_mask = from_left if is_causal else torch.where(left_ok & right_ok, both, from_left)
        guess = torch.where(symbol, guess, at_mask)
        return torch.nn.functional.one_hot(guess, vocab).float()  # (batch, length, vocab)


def _fill_rows(count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` toy rows ``<bos>, x1 … x12`` (steps +1 or +2) and a blank among x2 … x11 of each."""
    first = torch.randint(0, _FILL_SYMBOLS, (count, 1), generator=generator)
    steps = torch.randint(1, 3, (count, _FILL_LEN - 1), generator=generator)
    walk = torch.cat([first, first + steps.cumsum(dim=1)], dim=1) % _FILL_SYMBOLS + _FILL_FIRST
    rows = torch.cat([torch.ones(count, 1, dtype=torch.long), walk], dim=1)  # <bos> is id 1
    blank = torch.randint(2, _FILL_LEN, (count,), generator=generator)
    return rows, blank


def _fill_cases() -> list[Case]:
    g = seeded_generator(1007)
    cases: list[Case] = []
    for count, is_causal in (
        (14, True),  # first: every slip of the tests gives another share here
        (50, False),
        (13, False),
        (200, True),
        (200, False),
        (7, True),
    ):
        rows, blank = _fill_rows(count, g)
        cases.append(
            {
                "model": _RuleModel(),
                "rows": rows,
                "blank": blank,
                "mask_id": _FILL_MASK,
                "is_causal": is_causal,
            }
        )
    return cases


def _fill_variant(case: Case, slip: str) -> float:
    """A classic wrong fill rate (the reference for an unknown ``slip``)."""
    model, rows, blank = case["model"], case["rows"], case["blank"]
    mask_id, is_causal = case["mask_id"], case["is_causal"]
    every = torch.arange(len(rows))
    inputs = rows.clone()
    if slip == "columns":
        inputs[:, blank] = mask_id
    elif slip != "visible":
        inputs[every, blank] = mask_id
    logits = model(inputs) if slip == "default mask" else model(inputs, is_causal=is_causal)
    read = blank - 1 if slip == "before" else blank
    truth = inputs if slip == "inputs" else rows
    hits = logits[every, read].argmax(dim=-1) == truth[every, blank]
    return float(hits.sum()) if slip == "count" else hits.float().mean().item()


_FILL_SLIPS = {
    "visible": "the symbol was never hidden, so the model reads the answer: put mask_id at each "
    "row's blank, in a copy of the rows",
    "columns": "rows[:, blank] = mask_id hides every blank position in EVERY row (a column per "
    "row); hide one position per row: inputs[torch.arange(len(rows)), blank] = mask_id",
    "before": "the guess was read at blank - 1, the causal LM's convention; a masked-LM model "
    "fills the mask at the blank's own position",
    "default mask": "is_causal was not passed on, so the model ran with its default (the causal "
    "mask) every time: call model(inputs, is_causal=is_causal)",
    "inputs": "the guesses were compared with the rows after hiding (always mask_id): compare "
    "with the symbols that were hidden",
    "count": "that is a count of rows: return the share (divide by the number of rows)",
}


def _fill_hint(case: Case, got: object) -> str:
    """Name the classic slips the answer matches, if any (two slips can give the same share)."""
    try:
        value = float(got)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    right = reference_fill_rate(**case)
    matches = []
    for slip, message in _FILL_SLIPS.items():
        wrong = _fill_variant(case, slip)
        if math.isclose(value, wrong, abs_tol=1e-6) and not math.isclose(
            wrong, right, abs_tol=1e-6
        ):
            matches.append(message)
    return "".join(f"\n   {'hint' if k == 0 else 'or'}: {m}" for k, m in enumerate(matches))


def check_fill_rate(fill_rate: Callable[..., float], verbose: bool = True) -> CheckResult:
    """Check ``fill_rate(model, rows, blank, mask_id, is_causal)`` → a share, as
    :func:`reference_fill_rate` describes, on toy rows with a rule-based model that copies a
    visible symbol and guesses a hidden one from one side or both. It also rejects a function
    that hides the blank in the caller's ``rows`` (in place). A wrong answer is told which
    classic slip it matches, if any."""
    _check_callable("fill_rate", fill_rate)
    probe = _fill_cases()[0]
    rows = probe["rows"].clone()
    _, failed = call_reader("fill_rate", 1, fill_rate, {**probe, "rows": rows})
    if failed is None and not torch.equal(rows, probe["rows"]):
        failed = CheckResult(
            "fill_rate",
            False,
            1,
            "❌ fill_rate: your function changed `rows` in place (the blank is now mask_id in "
            "the caller's tensor, so every later call reads rows that are already hidden): "
            "hide the blank in a copy, rows.clone()",
        )
    if failed is not None:
        if verbose:
            report(failed)
        return failed
    return run_check(
        "fill_rate",
        fill_rate,
        reference_fill_rate,
        _fill_cases(),
        atol=1e-6,  # float32 means; two answers differ by 1/200 or more
        rtol=0,
        verbose=verbose,
        hint=_fill_hint,
    )
