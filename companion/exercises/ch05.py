"""Exercises of chapter 5, "Masking: padding, look-ahead, and the two conventions".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several shapes, plus the edge cases where
masks usually go wrong), and returns a :class:`~companion.exercises._checker.CheckResult`
that is truthy when every case matches. The checks call your function with keyword
arguments, so keep the parameter names of the stub in the notebook.

Boolean masks follow the package convention - ``True`` where a query **may attend** - except
the result of :func:`check_mha_attn_mask`, in PyTorch's ``True`` = *blocked*.

=====================================================  ==================================
exercise                                               check
=====================================================  ==================================
padding mask from lengths, right or left padding       :func:`check_lengths_padding_mask`
causal sliding-window mask, also with a cache          :func:`check_causal_window_mask`
prefix-LM mask: prefix both ways, then causal          :func:`check_prefix_lm_mask`
mask → ``nn.MultiheadAttention``'s (batch·heads, q, k)  :func:`check_mha_attn_mask`
a leak test that names the first leaking pair          :func:`check_first_leak`
=====================================================  ==================================
"""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from companion import masking
from companion.exercises._checker import (
    Case,
    CheckResult,
    causal_bool_mask,
    random_bool_mask,
    refusing_calls,
    report,
    run_check,
    seeded_generator,
)

__all__ = [
    "check_lengths_padding_mask",
    "check_causal_window_mask",
    "check_prefix_lm_mask",
    "check_mha_attn_mask",
    "check_first_leak",
]


# companion.interop (a higher layer, which this module does not import) holds exercise 4's
# answer, to_torch_attn_mask: it is refused by its file, as calls_into identifies a module
_INTEROP = types.SimpleNamespace(
    __file__=importlib.util.find_spec("companion.interop").origin, __name__="companion.interop"
)


_WRONG_RETURN = "\x00"  # marks a wrong returned type, reported as a wrong answer, not a crash


def _returning(
    dtype_kind: str, name: str, fn: Callable[..., Any], convention: str = "True = may attend"
) -> Callable[..., Any]:
    """Wrap ``fn`` so that a result of the wrong kind of dtype is reported as a wrong answer.

    ``compare`` treats a 0/1 integer tensor like a boolean one and compares every number in
    ``float64``, so the dtype is checked here: ``"bool"`` (a boolean mask, ``convention``
    naming what ``True`` means). :func:`_run` turns the ``TypeError`` into "case N is wrong".
    """

    def wrapped(**kwargs: Any) -> Any:
        result = fn(**kwargs)
        if not isinstance(result, Tensor):
            raise TypeError(
                f"{_WRONG_RETURN}{name} returned a {type(result).__name__}, not a tensor"
            )
        if dtype_kind == "bool" and result.dtype != torch.bool:
            raise TypeError(
                f"{_WRONG_RETURN}{name} returned dtype {result.dtype}; expected a boolean "
                f"tensor (torch.bool, {convention})"
            )
        return result

    return wrapped


def _run(name: str, *args: Any, verbose: bool, **kwargs: Any) -> CheckResult:
    """``run_check``, with a wrong returned type reported as a wrong answer."""
    result = run_check(name, *args, verbose=False, **kwargs)
    result.message = result.message.replace(f"raised TypeError: {_WRONG_RETURN}", "is wrong: ")
    if verbose:
        report(result)
    return result


def _by_hand(
    fn: Callable[..., Any], what: str, how: str = "from torch.arange comparisons"
) -> Callable[..., Any]:
    """``fn``, refused (``RuntimeError``) when it calls into :mod:`companion.masking` or
    :mod:`companion.interop`, which hold the answers of this chapter; the message ends with
    ``how`` to build the answer instead."""
    return refusing_calls(
        fn,
        f"build the {what}",
        (masking, _INTEROP),
        why=f": companion.masking and companion.interop hold the answers; build it {how}",
    )


# --------------------------------------------------------------------------------------------
# Exercise 1: padding mask from the lengths, right or left padding
# --------------------------------------------------------------------------------------------


def reference_lengths_padding_mask(lengths: Tensor, k_len: int, left: bool) -> Tensor:
    """Which keys are real tokens, from the sequence lengths, for right or left padding.

    Args:
        lengths: number of real tokens of each sequence, integer tensor of shape ``(batch,)``.
        k_len: the padded length.
        left: ``False`` when the padding follows the tokens (right padding), ``True`` when it
            precedes them (left padding, as for a batch of prompts).

    Returns:
        Boolean mask ``(batch, 1, 1, k_len)``, ``True`` where the key is a real token: key ``j``
        of sequence ``b`` is real when ``j < lengths[b]`` (right padding) or
        ``j >= k_len - lengths[b]`` (left padding).
    """
    positions = torch.arange(k_len)[None, :]  # (1, k_len)
    first_real = (k_len - lengths)[:, None] if left else torch.zeros_like(lengths)[:, None]
    real = (positions >= first_real) & (positions < first_real + lengths[:, None])  # (batch, k_len)
    return real[:, None, None, :]  # (batch, 1, 1, k_len)


def _lengths_cases() -> list[Case]:
    # batch != k_len everywhere, so a transposed mask cannot pass by accident
    return [
        {"lengths": torch.tensor([5, 3]), "k_len": 5, "left": False},
        {"lengths": torch.tensor([2, 7, 4]), "k_len": 7, "left": True},
        {"lengths": torch.tensor([6, 1, 3, 6]), "k_len": 6, "left": False},
        {"lengths": torch.tensor([1, 6, 5, 2]), "k_len": 6, "left": True},
        # no padding at all, and a row that is only padding
        {"lengths": torch.tensor([4, 4, 4]), "k_len": 4, "left": True},
        {"lengths": torch.tensor([3, 0]), "k_len": 3, "left": False},
        {"lengths": torch.tensor([0, 2]), "k_len": 3, "left": True},
        {"lengths": torch.tensor([1]), "k_len": 9, "left": True},
    ]


def _lengths_hint(case: Case, got: Any) -> str:
    """Show the case's small inputs by value (the summary line gives only their shapes), and name
    the three classic slips when the answer makes one: a query mask, an inverted mask, a mask one
    key too long."""
    shown = (
        f"\n   lengths = {case['lengths'].tolist()}, k_len = {case['k_len']}, left = {case['left']}"
    )
    if not isinstance(got, Tensor) or got.dtype != torch.bool:
        return shown
    expected = reference_lengths_padding_mask(case["lengths"], case["k_len"], case["left"])
    if got.shape == expected.transpose(-1, -2).shape != expected.shape:
        return shown + (
            "\n   The lengths sit on the query axis, (batch, 1, k_len, 1): that masks queries. A"
            " padding mask hides keys: put k_len last, (batch, 1, 1, k_len)."
        )
    if got.shape != expected.shape:
        return shown
    if torch.equal(got, ~expected):
        return shown + (
            "\n   Every entry is inverted: this course's masks are True where a key MAY be attended"
            " (a real token); PyTorch's key_padding_mask uses the opposite convention."
        )
    if torch.equal(got.sum(-1), expected.sum(-1) + (expected.sum(-1) < case["k_len"]).long()):
        return shown + (
            "\n   Each row lets one key too many through: a sequence of length L has its real"
            " tokens at positions 0 to L - 1, so compare with <, not <=."
        )
    return shown


def check_lengths_padding_mask(
    lengths_padding_mask: Callable[[Tensor, int, bool], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``lengths_padding_mask(lengths, k_len, left)``: ``(batch,)`` lengths → boolean
    ``(batch, 1, 1, k_len)``, ``True`` where the key is a real token, for right and left
    padding."""
    return _run(
        "lengths_padding_mask",
        _returning("bool", "lengths_padding_mask", _by_hand(lengths_padding_mask, "padding mask")),
        reference_lengths_padding_mask,
        _lengths_cases(),
        verbose=verbose,
        hint=_lengths_hint,
    )


def _padded_batch(g: torch.Generator, lengths: list[int], k_len: int, pad_id: int) -> Tensor:
    """Random ids in ``[4, 20)`` (never ``pad_id``), right-padded to ``k_len`` with ``pad_id``."""
    tokens = torch.randint(4, 20, (len(lengths), k_len), generator=g)  # (batch, k_len)
    tokens[tokens == pad_id] = 4 if pad_id != 4 else 5
    for row, length in enumerate(lengths):
        tokens[row, length:] = pad_id
    return tokens


# --------------------------------------------------------------------------------------------
# Exercise 2: causal sliding-window mask, bottom-right aligned
# --------------------------------------------------------------------------------------------


def reference_causal_window_mask(q_len: int, k_len: int, window: int) -> Tensor:
    """Causal local attention: each query sees itself and the ``window - 1`` keys before it.

    ``window`` counts the query itself: it sees ``window`` positions. (Mistral 7B writes its
    window ``W`` without the query, position ``i`` sees ``i - W .. i``, ``W + 1`` positions, so
    its ``W`` is this ``window - 1``.)

    The queries are the *last* ``q_len`` of the ``k_len`` positions (as when a decoder adds
    ``q_len`` new tokens to ``k_len - q_len`` cached ones), so the query in row ``r`` sits at
    position ``i = r + k_len - q_len``.

    Returns:
        Boolean mask ``(q_len, k_len)``: ``True`` where ``i - window < j <= i`` (key ``j``).
    """
    query_position = torch.arange(q_len)[:, None] + (k_len - q_len)  # (q_len, 1)
    key_position = torch.arange(k_len)[None, :]  # (1, k_len)
    distance = query_position - key_position  # (q_len, k_len): i - j
    return (distance >= 0) & (distance < window)  # (q_len, k_len)


def _causal_window_cases() -> list[Case]:
    return [
        {"q_len": q_len, "k_len": k_len, "window": window}
        for q_len, k_len, window in [
            (4, 4, 2),
            (6, 6, 3),
            (5, 5, 1),  # the diagonal alone
            (1, 5, 2),  # one new token after four cached ones
            (3, 7, 3),
            (2, 9, 4),
            (4, 4, 10),  # a window longer than the sequence: the plain causal mask
        ]
    ]


def _window_hint(case: Case, got: Any) -> str:
    """Name Trap 1 of 5.7: the window aligned top-left, query ``r`` at position ``r``."""
    if not isinstance(got, Tensor) or got.dtype != torch.bool or case["q_len"] == case["k_len"]:
        return ""
    top_left = reference_causal_window_mask(case["q_len"], case["q_len"], case["window"])
    top_left = torch.cat(  # (q_len, k_len): the square window, then keys the queries never see
        [top_left, torch.zeros(case["q_len"], case["k_len"] - case["q_len"], dtype=torch.bool)],
        dim=1,
    )
    if tuple(got.shape) == tuple(top_left.shape) and torch.equal(got, top_left):
        return (
            "\n   Your window is aligned top-left: query row r sits at position r. Here the queries"
            " are the last q_len positions (Trap 1 of 5.7): row r sits at r + k_len - q_len."
        )
    return ""


def check_causal_window_mask(
    causal_window_mask: Callable[[int, int, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``causal_window_mask(q_len, k_len, window)`` → boolean ``(q_len, k_len)``; query
    in row ``r`` sits at position ``i = r + k_len - q_len`` and may attend to the keys ``j``
    with ``i - window < j <= i``."""
    return _run(
        "causal_window_mask",
        _returning("bool", "causal_window_mask", _by_hand(causal_window_mask, "window mask")),
        reference_causal_window_mask,
        _causal_window_cases(),
        verbose=verbose,
        hint=_window_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: the prefix-LM mask (bidirectional over the prefix, causal after it, padding)
# --------------------------------------------------------------------------------------------


def reference_prefix_lm_mask(tokens: Tensor, prefix_lens: Tensor, pad_id: int) -> Tensor:
    """The self-attention mask of a prefix language model, with padding.

    Args:
        tokens: ids, shape ``(batch, n)``, right-padded with ``pad_id``.
        prefix_lens: integer tensor ``(batch,)``: the first ``prefix_lens[b]`` tokens of
            sequence ``b`` are its prefix (the prompt), read in both directions.
        pad_id: the id used for padding.

    Returns:
        Boolean mask ``(batch, 1, n, n)``: query ``i`` of sequence ``b`` may attend to key
        ``j`` when ``tokens[b, j]`` is not padding *and* (``j < prefix_lens[b]`` or
        ``j <= i``). Only keys are masked: a padded query gets the row a real query at its
        position would get, pads still blocked as keys (the check also accepts that row
        blanked, :func:`_blank_padded_queries_allowed`).
    """
    n = tokens.shape[1]
    positions = torch.arange(n)  # (n,)
    keys_real = (tokens != pad_id)[:, None, None, :]  # (batch, 1, 1, n)
    causal = positions[None, :] <= positions[:, None]  # (n, n): j <= i
    in_prefix = (positions[None, :] < prefix_lens[:, None])[:, None, None, :]  # (batch, 1, 1, n)
    return keys_real & (causal | in_prefix)  # (batch, 1, n, n)


def _prefix_lm_cases() -> list[Case]:
    g = seeded_generator(503)
    # prefix lengths differ from row to row, so one prefix for the whole batch is caught; a
    # prefix of 0 is the plain decoder mask, a prefix of the whole sequence an encoder's mask
    return [
        {
            "tokens": _padded_batch(g, [5, 3], 5, 0),
            "prefix_lens": torch.tensor([2, 1]),
            "pad_id": 0,
        },
        {
            "tokens": _padded_batch(g, [6, 4, 2], 6, 0),
            "prefix_lens": torch.tensor([3, 4, 0]),
            "pad_id": 0,
        },
        {
            "tokens": _padded_batch(g, [4, 4], 4, 0),
            "prefix_lens": torch.tensor([0, 2]),
            "pad_id": 0,
        },
        {
            "tokens": _padded_batch(g, [7, 1, 3, 5], 7, 2),
            "prefix_lens": torch.tensor([4, 1, 2, 3]),
            "pad_id": 2,
        },
        # prefixes longer than the real tokens: a real query's prefix reaches padded keys, so
        # only a mask on the keys (not on the queries) hides them
        {
            "tokens": _padded_batch(g, [3, 5, 2], 6, 0),
            "prefix_lens": torch.tensor([5, 2, 6]),
            "pad_id": 0,
        },
        # a row that is only padding: its queries see nothing at all
        {
            "tokens": _padded_batch(g, [3, 0], 5, 0),
            "prefix_lens": torch.tensor([2, 0]),
            "pad_id": 0,
        },
    ]


def _blank_padded_queries_allowed(
    fn: Callable[..., Any], reference: Callable[..., Tensor]
) -> Callable[..., Any]:
    """``fn`` with each padded query's row replaced by the reference's when ``fn`` blanked it.

    A padded query's output is never read (no real query attends to a padded key, and the
    loss skips padded positions), so a mask that also blocks the padded *queries*, an empty
    row for each, is as good as one that keeps them: both are accepted. A padded query that
    sees anything else (a padded key, say) is still compared, and rejected.
    """

    def wrapper(**kwargs: Any) -> Any:
        result = fn(**kwargs)
        expected = reference(**kwargs)  # (batch, 1, n, n)
        if not isinstance(result, Tensor) or result.dtype != torch.bool:
            return result
        if tuple(result.shape) != tuple(expected.shape):
            return result  # a wrong shape: the check reports it
        padded_query = (kwargs["tokens"] == kwargs["pad_id"])[:, None, :, None]  # (batch, 1, n, 1)
        blanked = padded_query & ~result.any(dim=-1, keepdim=True)  # (batch, 1, n, 1)
        return torch.where(blanked, expected, result)  # (batch, 1, n, n)

    return wrapper


def _prefix_hint(case: Case, got: Any) -> str:
    """Name three slips: a prefix query reading a later answer token (the prefix tested on the
    query), padded keys left visible (no key padding mask), and rows that differ only at padded
    queries (they must keep their row or see nothing)."""
    if not isinstance(got, Tensor) or got.dtype != torch.bool:
        return ""
    expected = reference_prefix_lm_mask(**case)  # (batch, 1, n, n)
    if tuple(got.shape) != tuple(expected.shape):
        return ""
    padded_query = (case["tokens"] == case["pad_id"])[:, None, :, None]  # (batch, 1, n, 1)
    differs = got != expected  # (batch, 1, n, n)
    n = expected.shape[-1]
    positions = torch.arange(n)
    in_prefix = positions[None, :] < case["prefix_lens"][:, None]  # (batch, n)
    # keys past the prefix's first answer token (so that j <= prefix, one token too many, is not named)
    past_first_answer = positions[None, :] > case["prefix_lens"][:, None]  # (batch, n)
    after = positions[None, :] > positions[:, None]  # (n, n): key j after query i
    # a prefix query that reads a later answer token: the query was tested, not the key
    reads_answer = (
        got & ~expected & in_prefix[:, None, :, None] & past_first_answer[:, None, None, :] & after
    )
    prefix_query = in_prefix[:, None, :, None]  # (batch, 1, n, 1)
    # named only when the other real queries' rows are right, so a broader mistake is not
    if (reads_answer & ~padded_query).any() and not (differs & ~prefix_query & ~padded_query).any():
        b, _, i, j = (reads_answer & ~padded_query).nonzero()[0].tolist()
        return (
            f"\n   Prefix query {i} of sequence {b} reads answer tokens after it (key {j} among"
            " them). Test the key against the prefix (j < prefix_lens[b]), not the query."
        )
    # every difference is a padded key read: the key padding mask is missing
    padded_key = (case["tokens"] == case["pad_id"])[:, None, None, :]  # (batch, 1, 1, n)
    reads_pad = got & padded_key  # (batch, 1, n, n): the reference never allows these
    if reads_pad.any() and not (differs & ~padded_key).any():
        b, _, i, j = reads_pad.nonzero()[0].tolist()
        return (
            f"\n   Query {i} of sequence {b} reads key {j}, a pad. Mask the keys with"
            " tokens != pad_id, for every query (padded ones too)."
        )
    if not differs.any() or (differs & ~padded_query).any():
        return ""
    b, _, i, _ = differs.nonzero()[0].tolist()
    return (
        f"\n   Only padded queries' rows differ (query {i} of sequence {b} is padding). A padded"
        " query may see what a real query there would (pads still blocked as keys) or see"
        " nothing, nothing in between."
    )


def check_prefix_lm_mask(
    prefix_lm_mask: Callable[[Tensor, Tensor, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``prefix_lm_mask(tokens, prefix_lens, pad_id)``: ``(batch, n)`` ids and
    ``(batch,)`` prefix lengths → boolean ``(batch, 1, n, n)``, key ``j`` real *and*
    (``j < prefix_lens[b]`` or ``j <= i``). A padded query may see what a real query there would
    (pads still blocked as keys) or see nothing. The answer may use ``padding_mask``,
    ``causal_mask`` and ``combine_masks``; a call to ``companion.masking.prefix_lm_mask`` is
    refused."""
    return _run(
        "prefix_lm_mask",
        _blank_padded_queries_allowed(
            _returning(
                "bool",
                "prefix_lm_mask",
                refusing_calls(  # padding_mask, causal_mask and combine_masks are allowed
                    prefix_lm_mask,
                    "build the prefix-LM mask",
                    (_INTEROP,),
                    why=": companion.masking.prefix_lm_mask holds the answer",
                    functions=(masking.prefix_lm_mask,),
                ),
            ),
            reference_prefix_lm_mask,
        ),
        reference_prefix_lm_mask,
        _prefix_lm_cases(),
        verbose=verbose,
        hint=_prefix_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: a package mask → nn.MultiheadAttention's 3-D attn_mask (batch * heads, q, k)
# --------------------------------------------------------------------------------------------


def reference_mha_attn_mask(mask: Tensor, num_heads: int) -> Tensor:
    """A package mask in the layout and convention of ``nn.MultiheadAttention``'s 3-D
    ``attn_mask``.

    Args:
        mask: boolean, ``True`` = may attend, shape ``(batch, 1, q_len, k_len)`` (one mask per
            sequence, as :func:`companion.masking.combine_masks` makes it) or
            ``(batch, num_heads, q_len, k_len)`` (one per sequence and head).
        num_heads: the module's number of heads.

    Returns:
        Boolean ``(batch * num_heads, q_len, k_len)``, ``True`` = **blocked**. The rows are
        batch-major, as PyTorch reads them: row ``b * num_heads + h`` is head ``h`` of sequence
        ``b`` (``mask.repeat`` would give head-major rows, sequence ``b`` at row ``h * batch + b``).
    """
    batch, _, q_len, k_len = mask.shape
    per_head = mask.expand(batch, num_heads, q_len, k_len)  # (batch, heads, q_len, k_len)
    return ~per_head.reshape(batch * num_heads, q_len, k_len)  # (batch * heads, q_len, k_len)


def _mha_cases() -> list[Case]:
    g = seeded_generator(504)

    def per_sequence(lengths: list[int], q_len: int, k_len: int) -> Tensor:
        # (batch, 1, q_len, k_len): bottom-right causal & padding, different in every sequence
        keys_real = torch.arange(k_len)[None, :] < torch.tensor(lengths)[:, None]  # (batch, k)
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)  # (q, k)
        return keys_real[:, None, None, :] & causal  # (batch, 1, q_len, k_len)

    # batch >= 2 with a different mask per sequence and num_heads >= 2 in every case but the
    # last, so that head-major rows (.repeat) differ from batch-major ones; q_len != k_len in
    # two cases, so that a transposed mask fails on its shape
    return [
        {"mask": per_sequence([5, 3], 5, 5), "num_heads": 2},
        {"mask": per_sequence([6, 2, 4], 3, 6), "num_heads": 4},
        {"mask": random_bool_mask((2, 1, 4, 7), 0.6, g), "num_heads": 3},
        # one mask per head: the heads must stay in their order within each sequence
        {"mask": random_bool_mask((3, 2, 4, 4), 0.5, g), "num_heads": 2},
        {"mask": per_sequence([4, 1], 4, 4), "num_heads": 1},
    ]


def _head_major(mask: Tensor, num_heads: int) -> Tensor:
    """The classic wrong layout: the whole batch once per head (``repeat``), inverted."""
    batch, heads, q_len, k_len = mask.shape
    per_head = mask.expand(batch, num_heads, q_len, k_len).transpose(0, 1)  # (heads, batch, q, k)
    return ~per_head.reshape(batch * num_heads, q_len, k_len)


def _mha_hint(case: Case, got: Any) -> str:
    """Name the two silent mistakes: head-major rows and the package's convention kept."""
    if not isinstance(got, Tensor) or got.dtype != torch.bool:
        return ""
    expected = reference_mha_attn_mask(**case)
    if tuple(got.shape) != tuple(expected.shape):
        return ""
    if torch.equal(got, ~expected):
        return (
            "\n   Every entry is inverted: nn.MultiheadAttention reads a boolean attn_mask as"
            " True = blocked, the package as True = may attend."
        )
    if torch.equal(got, _head_major(**case)) or torch.equal(got, ~_head_major(**case)):
        return (
            "\n   Your rows are in head-major order (what .repeat gives: the whole batch once per"
            " head), and nn.MultiheadAttention reads them in another order. Try the other order"
            " in your experiment: does it give the package's outputs?"
        )
    return ""


def check_mha_attn_mask(
    mha_attn_mask: Callable[[Tensor, int], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``mha_attn_mask(mask, num_heads)``: a boolean package mask ``(batch, 1 or
    num_heads, q_len, k_len)``, ``True`` = may attend → boolean ``(batch * num_heads, q_len,
    k_len)``, ``True`` = blocked, row ``b * num_heads + h`` for head ``h`` of sequence ``b``; an
    answer that calls :mod:`companion.interop` or :mod:`companion.masking` is refused."""
    return _run(
        "mha_attn_mask",
        _returning(
            "bool",
            "mha_attn_mask",
            _by_hand(mha_attn_mask, "attn_mask", "with reshape or expand and ~"),
            convention="True = blocked",
        ),
        reference_mha_attn_mask,
        _mha_cases(),
        verbose=verbose,
        hint=_mha_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 5: the leak test
# --------------------------------------------------------------------------------------------


def reference_first_leak(attend: Callable[[Tensor], Tensor], x: Tensor) -> tuple[int, int] | None:
    """The first (output, input) pair through which the future leaks into the past.

    For every later position ``j``, replace the input at ``j`` *alone* by fresh random vectors
    and record which earlier outputs ``i < j`` change (by more than ``1e-5``). The answer is
    the smallest such ``i``, and for it the smallest such ``j``.

    Args:
        attend: a sequence model ``(batch, seq_len, d) → (batch, seq_len, d_out)``.
        x: an input ``(batch, seq_len, d)``.

    Returns:
        ``(i, j)`` with ``i < j``, or ``None`` when no output changes by more than 1e-5 that way.
    """
    g = seeded_generator(505)
    seq_len = x.shape[1]
    leaks = []
    with torch.no_grad():
        before = attend(x)  # (batch, seq_len, d_out)
        for j in range(1, seq_len):
            changed = x.clone()  # (batch, seq_len, d)
            changed[:, j] = torch.randn(changed[:, j].shape, generator=g)  # a new input j only
            after = attend(changed)  # (batch, seq_len, d_out)
            for i in range(j):
                if not torch.allclose(after[:, i], before[:, i], atol=1e-5, rtol=0.0):
                    leaks.append((i, j))
    return min(leaks) if leaks else None


class _MaskedAttention:
    """A single-head self-attention with fixed random projections and a given mask.

    ``attention(x)``: ``(batch, seq_len, d) → (batch, seq_len, d)``; ``mask(seq_len)`` gives
    the boolean mask (``True`` = may attend), ``(seq_len, seq_len)`` for every sequence or
    ``(batch, seq_len, seq_len)``, one per sequence.
    """

    def __init__(self, name: str, mask: Callable[[int], Tensor], d: int, seed: int) -> None:
        g = seeded_generator(seed)
        self.name = name
        self.mask = mask
        self.w_q, self.w_k, self.w_v = (torch.randn(d, d, generator=g) / d**0.5 for _ in range(3))

    def __call__(self, x: Tensor) -> Tensor:
        q, k, v = x @ self.w_q, x @ self.w_k, x @ self.w_v  # each (batch, seq_len, d)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (batch, seq_len, seq_len)
        mask = self.mask(x.shape[1])  # (seq_len, seq_len) or (batch, seq_len, seq_len)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)  # (batch, seq, seq)
        return weights @ v  # (batch, seq_len, d)

    def __repr__(self) -> str:
        return f"<attention: {self.name}>"


class _Elementwise:
    """A position-wise function (no mixing across positions at all)."""

    def __init__(self, name: str, fn: Callable[[Tensor], Tensor]) -> None:
        self.name, self.fn = name, fn

    def __call__(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def __repr__(self) -> str:
        return f"<function: {self.name}>"


def _tril(diagonal: int) -> Callable[[int], Tensor]:
    return lambda n: causal_bool_mask(n, diagonal)


def _first_sees_second(n: int) -> Tensor:
    mask = causal_bool_mask(n)  # (n, n) causal ...
    mask[0, 1] = True  # ... except that position 0 peeks at position 1
    return mask


def _layer_norm(x: Tensor) -> Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:])  # (batch, seq_len, d)


def _with_extra(mask: Callable[[int], Tensor], *pairs: tuple[int, int]) -> Callable[[int], Tensor]:
    """``mask`` with the extra (query, key) ``pairs`` allowed."""

    def build(n: int) -> Tensor:
        allowed = mask(n).clone()  # (n, n)
        for i, j in pairs:
            allowed[i, j] = True
        return allowed

    return build


def _distance_two(n: int) -> Tensor:
    """Causal, plus every query sees the key two steps ahead (never the adjacent one)."""
    two_ahead = torch.ones(n, n, dtype=torch.bool).triu(2).tril(2)  # (n, n): j = i + 2
    return causal_bool_mask(n) | two_ahead  # (n, n)


def _second_sequence_leaks(n: int) -> Tensor:
    """``(2, n, n)``: causal for sequence 0; sequence 1's query 1 also sees key 3."""
    per_sequence = causal_bool_mask(n).repeat(2, 1, 1)  # (2, n, n)
    per_sequence[1, 1, 3] = True
    return per_sequence


def _add_at(
    base: Callable[[Tensor], Tensor], into: int, source: int, fn: Callable[[Tensor], Tensor]
) -> Callable[[Tensor], Tensor]:
    """``base(x)`` with ``fn(x[:, source])`` added to output ``into``: a leak if source > into."""

    def model(x: Tensor) -> Tensor:
        out = base(x).clone()  # (batch, seq_len, d)
        out[:, into] = out[:, into] + fn(x[:, source])  # (batch, d)
        return out

    return model


def _square(v: Tensor) -> Tensor:  # (batch, d): even, so blind to v -> -v
    return v * v


def _gated(v: Tensor) -> Tensor:  # (batch, d): zero while |v| < 0.5, so zero at 0 and nearby
    return (v.norm(dim=-1, keepdim=True) - 0.5).relu().expand_as(v)


def _thousandth(v: Tensor) -> Tensor:  # (batch, d): a leak of about 1e-3, 100 times 1e-5
    return 1e-3 * v


def _below_tolerance(v: Tensor) -> Tensor:  # (batch, d): a change of at most 2e-6 < 1e-5
    return 1e-6 * torch.tanh(v)


def _last_feature_of_sequence_1(v: Tensor) -> Tensor:
    """``(batch, d)``: at most ``5e-5``, in the last feature of sequence 1 only, and ``0`` for a
    zero input; a random input (squared norm about 4) moves it by more than ``1e-5``. Its mean
    over the batch and the features stays under ``1e-5``, and output feature 0 never moves."""
    leak = torch.zeros_like(v)  # (batch, d)
    leak[1, -1] = 5e-5 * torch.tanh(10 * v[1].square().sum())
    return leak


def _batch_centred(v: Tensor) -> Tensor:  # (batch, d): a leak through batch statistics
    """``1e-3 v`` minus its mean over the batch, as batch norm in training mode would: large in
    every sequence, yet zero summed over the batch."""
    return 1e-3 * (v - v.mean(dim=0, keepdim=True))


def _offset_step(v: Tensor) -> Tensor:
    """``(batch, d)``: ``4 + 1.5e-5 tanh(100 |v|^2)`` in every entry. At a zero input the
    step is 0; a random input sets it to about ``1.5e-5``, above ``1e-5`` but below ``atol=1e-5``
    plus the default ``rtol=1e-5`` times the entries it lands on (1.5 or more in size in the
    case below, so at least ``2.5e-5``)."""
    step = 1.5e-5 * torch.tanh(100 * v.square().sum(dim=-1, keepdim=True))  # (batch, 1)
    return (4.0 + step).expand_as(v)


def _spread_below_tolerance(v: Tensor) -> Tensor:
    """``(batch, d)``: ``8e-6 tanh(100 |v|^2)`` in every entry. At a zero input it is 0; a
    random input moves every entry by about ``8e-6``, below ``1e-5``, so no entry counts. The
    L2 norm of the whole change over (batch 2, d 4) is about ``sqrt(8) 8e-6 = 2.3e-5``, over
    one sequence's 4 features about ``1.6e-5``: a test on either norm reports a leak."""
    step = 8e-6 * torch.tanh(100 * v.square().sum(dim=-1, keepdim=True))  # (batch, 1)
    return step.expand_as(v)


def _negative_part(v: Tensor) -> Tensor:  # (batch, d): 1e-3 relu(-v), closed for inputs >= 0
    return 1e-3 * (-v).relu()


def _abs_at(x: Tensor, j: int) -> Tensor:
    """``x`` with input ``j`` made non-negative: where :func:`_negative_part` is closed, as it
    stays for uniform noise in ``[0, 1)``."""
    x = x.clone()  # (batch, seq_len, d)
    x[:, j] = x[:, j].abs()
    return x


def _zero_at(x: Tensor, j: int) -> Tensor:
    """``x`` with input ``j`` set to zero: where :func:`_last_feature_of_sequence_1` is 0."""
    x = x.clone()  # (batch, seq_len, d)
    x[:, j] = 0.0
    return x


def _same_at(x: Tensor, j: int) -> Tensor:
    """``x`` with input ``j`` of sequence 0 copied into every sequence: where
    :func:`_batch_centred` is 0, as it stays for one random vector shared by the batch."""
    x = x.clone()  # (batch, seq_len, d)
    x[:, j] = x[:1, j]
    return x


def _repeated(x: Tensor) -> Tensor:
    """``x`` with position 0's vector at every position, one vector per sequence (a repeated
    token): there, copying another position's input into position ``j``, or the mean over the
    positions, changes nothing, so a test built on either finds no leak at all."""
    return x[:, :1].expand_as(x).clone()  # (batch, seq_len, d)


def _small_at(x: Tensor, j: int) -> Tensor:
    """``x`` with input ``j`` rescaled to norm 0.2: inside the closed gate of :func:`_gated`."""
    x = x.clone()  # (batch, seq_len, d)
    x[:, j] = 0.2 * torch.nn.functional.normalize(x[:, j], dim=-1)
    return x


def _future_leak_cases() -> list[Case]:
    g = seeded_generator(506)
    d = 4

    def x(seq_len: int, batch: int = 2) -> Tensor:
        return torch.randn(batch, seq_len, d, generator=g)

    causal = _MaskedAttention("causal", _tril(0), d, 1)
    full = _MaskedAttention("no mask", lambda n: torch.ones(n, n, dtype=torch.bool), d, 2)

    def direction(v: Tensor) -> Tensor:  # (batch, d): blind to a positive rescale of v
        return torch.nn.functional.normalize(v, dim=-1)

    def centred(v: Tensor) -> Tensor:  # (batch, d): blind to a constant added to v
        return v - v.mean(dim=-1, keepdim=True)

    return [
        {"attend": causal, "x": x(5)},  # None
        {"attend": full, "x": x(5)},  # (0, 1)
        {"attend": _MaskedAttention("diagonal off by one", _tril(1), d, 3), "x": x(6)},
        {"attend": _MaskedAttention("strictly the past", _tril(-1), d, 4), "x": x(5)},
        # a leak from position 1 into position 0 only: changing the last token alone misses it
        {"attend": _MaskedAttention("0 peeks at 1", _first_sees_second, d, 5), "x": x(6)},
        # a leak two steps ahead only: a test of adjacent pairs, or one that changes the whole
        # future at once and reports j = i + 1, gets it wrong
        {"attend": _MaskedAttention(_TWO_AHEAD_CASE, _distance_two, d, 6), "x": x(6)},  # (0, 2)
        # a leak into late positions only: a test that looks at output 0 alone misses it
        {
            "attend": _MaskedAttention("4 peeks at 5", _with_extra(_tril(0), (4, 5)), d, 7),
            "x": x(7),
        },  # (4, 5)
        # leaks blind to a deterministic change: "2 * x" and "x + 1" miss them, random does not
        {
            "attend": _Elementwise("direction of x[3] into 1", _add_at(causal, 1, 3, direction)),
            "x": x(5),
        },  # (1, 3)
        {
            "attend": _Elementwise("centred x[4] into 2", _add_at(causal, 2, 4, centred)),
            "x": x(6),
        },  # (2, 4)
        # a leak through an even function, blind to negating the input: "-x" misses it
        {
            "attend": _Elementwise("square of x[4] into 1", _add_at(causal, 1, 4, _square)),
            "x": x(5),
        },
        # a leak through a gate that is closed at the sample's input 3 and at zero: replacing
        # input 3 by zeros (or 2 * x, or -x) changes nothing, and neither does a derivative
        # taken at the sample; a random vector (norm about 2) opens the gate
        {
            "attend": _Elementwise("gated x[3] into 1", _add_at(causal, 1, 3, _gated)),
            "x": _small_at(x(5), 3),
        },  # (1, 3)
        # a small leak, about 1e-3: a test with a loose tolerance (1e-2) sees no leak at all
        {
            "attend": _Elementwise("1e-3 x[3] into 0", _add_at(causal, 0, 3, _thousandth)),
            "x": x(5),
        },  # (0, 3)
        # layer norm first: it ignores a constant added to a position's vector
        {
            "attend": _Elementwise("layer norm, then no mask", lambda x: full(_layer_norm(x))),
            "x": x(4),
        },
        {
            "attend": _Elementwise("causal, then layer norm", lambda x: _layer_norm(causal(x))),
            "x": x(4),
        },
        {"attend": _Elementwise("layer norm, no mixing", _layer_norm), "x": x(4)},
        # two leaks, (1, 2) and (0, 3): a loop over j that returns the first leak it meets
        # answers (1, 2), the smallest j, not the smallest i
        {
            "attend": _MaskedAttention(
                _TWO_LEAKS_CASE, _with_extra(_tril(0), (1, 2), (0, 3)), d, 8
            ),
            "x": x(5),
        },  # (0, 3)
        # a mask built per sequence (padding, packed documents) that is wrong for the second
        # sequence of the batch only: a test that compares sequence 0 alone misses it
        {
            "attend": _MaskedAttention("sequence 1: 1 peeks at 3", _second_sequence_leaks, d, 9),
            "x": x(5),
        },  # (1, 3)
        {"attend": _Elementwise("cumulative sum", lambda x: x.cumsum(dim=1)), "x": x(5)},
        {
            "attend": _Elementwise(
                "reversed cumulative sum", lambda x: x.flip(1).cumsum(1).flip(1)
            ),
            "x": x(5),
        },
        {
            "attend": _Elementwise(
                "mean over the sequence", lambda x: x.mean(1, keepdim=True).expand_as(x)
            ),
            "x": x(3, batch=1),
        },
        # a change of about 1e-6, below the tolerance of 1e-5: no leak by the specification,
        # so a test of exact equality (torch.equal) answers (0, 3) where None is asked for
        {
            "attend": _Elementwise(
                "1e-6 tanh(x[3]) into 0", _add_at(causal, 0, 3, _below_tolerance)
            ),
            "x": x(5),
        },  # None
        # a leak of about 5e-5 into the last feature of sequence 1 only: a test that reads
        # output feature 0 alone, or the mean change over the batch and features, misses it
        {
            "attend": _Elementwise(
                _LAST_FEATURE_CASE, _add_at(causal, 1, 3, _last_feature_of_sequence_1)
            ),
            "x": _zero_at(x(5), 3),
        },  # (1, 3)
        # a leak through batch statistics: a test that sums the outputs over the batch misses it
        {
            "attend": _Elementwise(
                "batch-centred x[2] into 0", _add_at(causal, 0, 2, _batch_centred)
            ),
            "x": x(4),
        },  # (0, 2)
        # a step of about 1.5e-5 on entries of size 1.5 or more: allclose(atol=1e-5) with its
        # default rtol=1e-5 allows at least 2.5e-5 there and misses it
        {
            "attend": _Elementwise(
                "1.5e-5 step of x[4] into 2", _add_at(causal, 2, 4, _offset_step)
            ),
            "x": _zero_at(x(5), 4),
        },  # (2, 4)
        # a leak only through negative entries, closed at the sample: uniform noise in [0, 1)
        # (torch.rand_like) never opens it; 16 standard-normal entries all >= -0.01 have a
        # chance of about 2e-5
        {
            "attend": _Elementwise(
                "negative part of x[3] into 0", _add_at(causal, 0, 3, _negative_part)
            ),
            "x": _abs_at(x(5, batch=4), 3),
        },  # (0, 3)
        # about 8e-6 in every entry of output 0: below 1e-5 in each, so no leak by the
        # specification; the L2 norm of the whole change (about 2.3e-5) is above 1e-5
        {
            "attend": _Elementwise(
                "8e-6 in every entry, x[3] into 0", _add_at(causal, 0, 3, _spread_below_tolerance)
            ),
            "x": _zero_at(x(5), 3),
        },  # None
        # a leak through batch statistics at an input alike in every sequence: one random
        # vector shared by the batch keeps it alike and misses the leak; torch.randn_like,
        # independent per sequence, finds it
        {
            "attend": _Elementwise(_SHARED_VECTOR_CASE, _add_at(causal, 1, 3, _batch_centred)),
            "x": _same_at(x(5), 3),
        },  # (1, 3)
        # one vector repeated at every position (a repeated token), and one leak, (0, 3):
        # copying another position's input into j, or the mean over positions, changes nothing
        # there; a new random vector does
        {
            "attend": _MaskedAttention(_REPEATED_CASE, _with_extra(_tril(0), (0, 3)), d, 10),
            "x": _repeated(x(5)),
        },  # (0, 3)
    ]


# two cases with a hint of their own: the leak two steps ahead (the "Think first" slip) and the
# 5e-5 leak into one entry (a sound test with a looser tolerance misses it)
_TWO_AHEAD_CASE = "sees 2 ahead"
_LAST_FEATURE_CASE = "sequence 1: 5e-5 into the last feature of 1"

# the cases that test the stated tolerance rule (any entry, absolute 1e-5, rtol=0) rather than
# the idea of a leak test: a learner whose test is sound but reads the tolerance another way
# (exact equality, allclose's default rtol, an L2 norm) fails one of these, and is told so
_TOLERANCE_SPEC_CASES = {
    "1e-6 tanh(x[3]) into 0": "a change of about 1e-6 in each entry, below 1e-5: no leak",
    "1.5e-5 step of x[4] into 2": (
        "a change of about 1.5e-5 on entries of size 1.5 or more: a leak, with rtol=0"
    ),
    "8e-6 in every entry, x[3] into 0": (
        "about 8e-6 in every entry, each below 1e-5 (an L2 norm adds them up): no leak"
    ),
}


# the case with two leaks, (1, 2) and (0, 3), that a loop over j stopping at its first hit misses
_TWO_LEAKS_CASE = "1 peeks at 2, 0 peeks at 3"

# the case that a random vector shared by every sequence of the batch misses
_SHARED_VECTOR_CASE = "batch-centred x[3] into 1, x[3] alike"


# the case whose input repeats one vector at every position, which a copied input misses
_REPEATED_CASE = "0 peeks at 3, one vector at every position"


# the case with a gate closed at the sample, which a derivative or a fixed change misses
_GATED_CASE = "gated x[3] into 1"


# the cases whose model reads no later input: the answer is None
_NO_LEAK_CASES = {"causal", "causal, then layer norm", "layer norm, no mixing", "cumulative sum"}


def _as_pair(got: Any) -> tuple[int, int] | None:
    """``got`` as a pair of ints, or ``None`` when it is not a pair of numbers."""
    try:
        i, j = got
        return int(i), int(j)
    except (TypeError, ValueError):
        return None


def _leak_hint(case: Case, got: Any) -> str:
    """Name the likely slip: the pair order, a changed ``x``, a shared vector, the tolerance."""
    name = getattr(case["attend"], "name", "")
    pair = _as_pair(got)
    if name == _TWO_LEAKS_CASE and pair == (1, 2):
        return (
            "\n   This model leaks twice, (1, 2) and (0, 3). Return the smallest i first, and for"
            " it the smallest j: a loop over j that stops at its first leak finds (1, 2)."
        )
    if name in _NO_LEAK_CASES and pair is not None and pair[1] == pair[0] + 1:
        return (
            "\n   This model reads no later input. Did your test change x in place (no x.clone())?"
            " Then input j - 1 is still changed when you test input j."
        )
    if name == _SHARED_VECTOR_CASE:
        return (
            "\n   Input 3 is alike in every sequence here, and the leak reads batch statistics: a fixed"
            " change (such as -3 * x + 1) or one random vector for the batch keeps it alike. Draw the"
            " new input anew for each sequence (torch.randn_like)."
        )
    if name == _GATED_CASE and got is None:
        return (
            "\n   This leak opens only when input 3's norm exceeds 0.5; here it is 0.2. A derivative"
            " at the sample (a Jacobian), a fixed change (zeros, 2 * x, -x) or a small perturbation"
            " (x + 1e-3 * noise) sees the closed gate as no leak: replace input j by a new"
            " standard-normal vector (torch.randn_like)."
        )
    if name == _TWO_AHEAD_CASE and pair != (0, 2):
        return (
            "\n   Output 0 reads input 2 here, and no input next to it. Did your test change every"
            " later input at once (then it blames j = i + 1), or try only j = i + 1? Change one"
            " input j at a time, for every j > i."
        )
    if name == _LAST_FEATURE_CASE and got is None:
        return (
            "\n   Output 1 moves by about 5e-5, in its last feature and in sequence 1 only. That is"
            " a leak by the stated rule (any single entry, more than 1e-5, absolute): a looser"
            " tolerance such as 1e-4, output feature 0 alone, or a mean over the batch misses it."
        )
    if name == _REPEATED_CASE and got is None:
        return (
            "\n   Every position holds the same vector here (a repeated token). Copying another"
            " position's input into j, or the mean over positions, then changes nothing: replace"
            " input j by a new random vector (torch.randn_like)."
        )
    what = _TOLERANCE_SPEC_CASES.get(name)
    if what is None:
        return ""
    return (
        f"\n   This case tests the stated tolerance, not the idea of your test: {what}. A change"
        " counts when any single entry moves by more than 1e-5, absolute (rtol=0)."
    )


def check_first_leak(
    first_leak: Callable[[Callable[[Tensor], Tensor], Tensor], tuple[int, int] | None],
    verbose: bool = True,
) -> CheckResult:
    """Check ``first_leak(attend, x) -> (i, j) | None`` on causal models (``None``) and on models
    that leak in several ways: full attention, an off-by-one diagonal, a single pair (0, 1), a
    leak two steps ahead only, a leak into a late position only, two leaks whose smallest ``j``
    is not the one with the smallest ``i``, a leak in the second sequence of the batch only,
    a leak of about ``1e-3`` (missed by a loose tolerance), a change of about ``1e-6`` below
    the tolerance (reported by an exact comparison), a leak of about ``5e-5`` into the last
    feature of sequence 1 only (missed by output feature 0 alone and by the mean change), a
    leak that sums to zero over the batch (missed by batch-summed outputs), a step of about
    ``1.5e-5`` on entries of size 1.5 or more (missed by ``allclose`` with its default
    ``rtol``), a leak through negative entries only (missed by uniform noise,
    ``torch.rand_like``), a change of about ``8e-6`` in every entry (no leak by the
    specification, reported by a test on the L2 norm of the change), a leak through batch
    statistics at an input alike in every sequence (missed by one random vector shared by the
    batch), a leak (0, 3) where one vector repeats at every position (missed by copying
    another position's input, or the mean over positions, into ``j``), and leaks that a positive rescale, an added constant, a negation or
    a replacement by zeros cannot reveal. A failure on one of the three cases that test the
    tolerance rule (1e-6, the 1.5e-5 step, 8e-6 in every entry) says that it is such a case."""
    return _run(
        "first_leak",
        first_leak,
        reference_first_leak,
        _future_leak_cases(),
        verbose=verbose,
        hint=_leak_hint,
    )
