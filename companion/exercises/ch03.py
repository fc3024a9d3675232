"""Exercises of chapter 3, "Multi-head attention".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on cases drawn from a seeded generator (several shapes, including the ones where a
wrong reshape still produces the right shape), and returns a
:class:`~companion.exercises._checker.CheckResult` that is truthy when every case matches.
The checks call your function with keyword arguments, so keep the parameter names of the stub
in the notebook.

=====================================  ============================================
exercise                               check
=====================================  ============================================
1. multi-head attention, head gates    :func:`check_multi_head_attention`
2. reorder the heads, same layer       :func:`check_permute_heads`
3. can one head's blend be taken apart :func:`check_blend_separable`
4. split a per-head fused projection   :func:`check_split_fused_qkv`
5. what each head compares             :func:`check_head_score_matrices`
6. grouped-query attention             :func:`check_grouped_query_attention`
=====================================  ============================================

Exercises 1 to 3 use only the main path (sections 3.1 to 3.6); exercise 2's check runs
exercise 1's reference. When a tensor differs, the message of exercises 1, 2 and 6 shows the
entry with the *largest* difference (the first differing entry can look like rounding).

Weight matrices follow the *math* convention of the chapter, ``y = x W`` with ``W`` of shape
``(in, out)`` - the transpose of what ``nn.Linear`` stores in ``.weight``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from companion._validation import check_callable as _require_callable
from companion.exercises._checker import (
    Case,
    CheckResult,
    as_verdict,
    call_reader,
    compare,
    report,
    run_check,
    run_verdict_check,
    seeded_generator,
)

__all__ = [
    "check_split_fused_qkv",
    "check_multi_head_attention",
    "check_grouped_query_attention",
    "check_permute_heads",
    "check_head_score_matrices",
    "check_blend_separable",
]

# --------------------------------------------------------------------------------------------
# Exercise 4: split a fused projection laid out head by head
# --------------------------------------------------------------------------------------------


def reference_split_fused_qkv(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Split the output of one fused projection whose features are grouped **per head**.

    The layout of each position's ``3·d_model`` features is
    ``[q_0 | k_0 | v_0 | q_1 | k_1 | v_1 | ...]``, each block ``head_dim`` wide (the layout of
    the UvA deep-learning tutorials), not ``[all queries | all keys | all values]``.

    Args:
        qkv: shape ``(batch, len, 3·d_model)``.
        num_heads: number of heads; ``d_model = num_heads · head_dim``.

    Returns:
        ``(q, k, v)``, each of shape ``(batch, num_heads, len, head_dim)``.
    """
    batch, seq_len, width = qkv.shape
    head_dim = width // (3 * num_heads)
    per_head = qkv.view(
        batch, seq_len, num_heads, 3 * head_dim
    )  # (batch, seq_len, heads, 3·head_dim)
    per_head = per_head.transpose(1, 2)  # (batch, heads, len, 3·head_dim)
    q, k, v = per_head.chunk(3, dim=-1)  # each (batch, heads, len, head_dim)
    return q, k, v


def _fused_cases() -> list[Case]:
    g = seeded_generator(301)
    shapes = [
        # (batch, len, num_heads, head_dim)
        (2, 5, 3, 4),  # the chapter's walk-through sizes
        (1, 3, 2, 4),
        (3, 4, 4, 4),  # len = heads: even a split with no transpose at all has the right shape
        (2, 2, 2, 2),  # likewise
        (2, 6, 1, 6),  # one head: the two layouts coincide
        (2, 1, 6, 1),  # head_dim = 1
    ]
    return [
        {"qkv": torch.randn(batch, seq_len, 3 * heads * dim, generator=g), "num_heads": heads}
        for batch, seq_len, heads, dim in shapes
    ]


def check_split_fused_qkv(
    split_fused_qkv: Callable[[Tensor, int], tuple[Tensor, Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``split_fused_qkv(qkv, num_heads)``: ``(batch, len, 3·d_model)`` with the
    per-head layout → ``(q, k, v)``, each ``(batch, heads, len, head_dim)``."""
    result = run_check(
        "split_fused_qkv",
        split_fused_qkv,
        reference_split_fused_qkv,
        _fused_cases(),
        verbose=verbose,
        hint=_fused_hint,
    )
    return result


def _fused_hint(case: Case, got: object) -> str:
    """Name the classic slip that ``got`` reproduces, if any (empty string otherwise)."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return ""
    if not all(isinstance(part, Tensor) for part in got):
        return ""
    qkv, heads = case["qkv"], case["num_heads"]
    batch, seq_len, width = qkv.shape

    def heads_of(
        part: Tensor,
    ) -> Tensor:  # (batch, seq_len, d_model) → (batch, heads, seq_len, d_k)
        return part.view(batch, seq_len, heads, -1).transpose(1, 2)

    no_transpose = qkv.reshape(batch, heads, seq_len, width // heads).chunk(3, dim=-1)
    slips = {
        "the split of the stacked layout [all q | all k | all v] (chunk into three first): "
        "these features are laid out head by head, [q_0 | k_0 | v_0 | q_1 | ...]": tuple(
            heads_of(part) for part in qkv.chunk(3, dim=-1)
        ),
        "a reshape to (batch, heads, len, 3·d_k) without the transpose: it has the right shape "
        "but moves features between positions; view as (batch, len, heads, 3·d_k), then "
        "transpose(1, 2)": no_transpose,
    }
    if heads == 3:  # only then does swapping the heads and q/k/v axes give three tensors
        slips[
            "the heads axis and the q/k/v axis swapped (with 3 heads the two slips give the same "
            "numbers): in view(batch, len, heads, 3, d_k), the axis of size 3 is q/k/v; it goes "
            "first, then batch, heads, len, d_k"
        ] = qkv.view(batch, seq_len, heads, 3, -1).permute(2, 0, 3, 1, 4).unbind(0)
    matches = [
        slip
        for slip, value in slips.items()
        if all(
            part.shape == right.shape and torch.allclose(part, right)
            for part, right in zip(got, value)
        )
    ]
    if matches:
        return "\n   this looks like " + ";\n   or like ".join(matches) + "."
    right = dict(zip("qkv", reference_split_fused_qkv(qkv, heads)))  # name → (batch, h, len, d_k)
    names = []  # which of q, k, v each returned tensor is
    for part in got:
        names += [n for n, t in right.items() if part.shape == t.shape and torch.equal(part, t)][:1]
    if len(names) == 3 and names != ["q", "k", "v"]:
        return (
            f"\n   the split is right, but you returned ({', '.join(names)}) in place of (q, k, v): "
            "each head's 3·d_k features are [q | k | v], in that order."
        )
    return ""


def _width_hint_if_raised(
    result: CheckResult, cases: list[Case], verbose: bool, grouped: bool = False
) -> CheckResult:
    """Append the "read d_k off the weights" hint when the answer raised on a case whose head
    widths do not come from ``d_model // num_heads``; print the report unless ``verbose=False``.
    ``grouped``: grouped-query attention, whose ``w_v`` has ``num_kv_heads · d_k`` columns."""
    if not result.passed and f"case {result.cases_run} raised" in result.message:
        case = cases[result.cases_run - 1]
        d_model, heads = case["query"].shape[-1], case["num_heads"]
        q_width, v_width = case["w_q"].shape[1], case["w_v"].shape[1]
        if grouped and q_width != d_model:
            result.message += (
                f"\n   in this case d_model = {d_model} but w_q has {q_width} columns for "
                f"{heads} heads: read d_k off the weights (w_q.shape[1] // num_heads), not "
                "d_model // num_heads."
            )
        if not grouped and (q_width != d_model or v_width != d_model):
            result.message += (
                f"\n   in this case d_model = {d_model} but w_q has {q_width} columns and "
                f"w_v {v_width} for {heads} heads: read d_k and d_v off the weights "
                "(w_q.shape[1] // num_heads, w_v.shape[1] // num_heads), not "
                "d_model // num_heads."
            )
    if verbose:
        report(result)
    return result


# --------------------------------------------------------------------------------------------
# Exercise 1: multi-head attention from weight matrices, d_k != d_v (exercise 2's check runs it)
# --------------------------------------------------------------------------------------------


def reference_multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    w_o: Tensor,
    num_heads: int,
    head_gates: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Multi-head attention without biases, weights in the math convention ``y = x W``,
    head ``r``'s output multiplied by ``head_gates[r]`` before ``W_O``.

    Args:
        query: shape ``(batch, q_len, d_model)``.
        key: shape ``(batch, k_len, d_model)``.
        value: shape ``(batch, k_len, d_model)``.
        w_q: shape ``(d_model, num_heads · d_k)``; head ``r`` (0-based) uses columns
            ``r·d_k … (r+1)·d_k - 1``.
        w_k: shape ``(d_model, num_heads · d_k)``.
        w_v: shape ``(d_model, num_heads · d_v)``.
        w_o: shape ``(num_heads · d_v, d_model)``.
        num_heads: number of heads.
        head_gates: shape ``(num_heads,)``; ``0`` removes a head (Michel et al., 2019), ``None``
            keeps every head (all gates 1).

    Returns:
        ``(output, weights)`` of shapes ``(batch, q_len, d_model)`` and
        ``(batch, num_heads, q_len, k_len)``; the weights are the softmax's, before the gates.
    """
    batch, q_len, _ = query.shape
    k_len = key.shape[1]
    d_k = w_q.shape[1] // num_heads
    d_v = w_v.shape[1] // num_heads
    q = (query @ w_q).view(batch, q_len, num_heads, d_k).transpose(1, 2)  # (batch, h, q_len, d_k)
    k = (key @ w_k).view(batch, k_len, num_heads, d_k).transpose(1, 2)  # (batch, h, k_len, d_k)
    v = (value @ w_v).view(batch, k_len, num_heads, d_v).transpose(1, 2)  # (batch, h, k_len, d_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (batch, h, q_len, k_len)
    weights = torch.softmax(scores, dim=-1)  # (batch, h, q_len, k_len)
    heads = weights @ v  # (batch, h, q_len, d_v)
    if head_gates is not None:
        heads = heads * head_gates[:, None, None]  # head r times its gate ζ_r
    merged = heads.transpose(1, 2).reshape(batch, q_len, num_heads * d_v)  # (batch, q_len, h·d_v)
    return merged @ w_o, weights  # (batch, q_len, d_model), (batch, h, q_len, k_len)


def _mha_cases() -> list[Case]:
    g = seeded_generator(303)
    shapes = [
        # (batch, q_len, k_len, d_model, num_heads, d_k, d_v, head_gates)
        (2, 5, 5, 12, 3, 4, 4, (1.0, 0.0, 0.5)),  # the chapter's sizes: every W is square
        (2, 4, 6, 12, 3, 4, 4, (1.0, 1.0, 1.0)),  # cross-attention: q_len != k_len; all heads on
        (1, 4, 4, 8, 2, 3, 5, (0.0, 1.0)),  # d_k != d_v and h·d_v = 10 != d_model: W_O is (10, 8)
        (3, 2, 5, 6, 3, 2, 4, (0.3, 1.0, -2.0)),  # h·d_v = 12 > d_model = 6
        (2, 3, 3, 8, 1, 8, 8, (1.0,)),  # a single head: plain scaled dot-product attention
        (1, 4, 4, 16, 4, 4, 4, (1.0, 1.0, 1.0, 1.0)),  # q_len = heads = d_k: a split without
        # transpose fits
    ]
    cases: list[Case] = []
    for batch, q_len, k_len, d_model, heads, d_k, d_v, gates in shapes:
        std = 1 / math.sqrt(d_model)
        cases.append(
            {
                "query": torch.randn(batch, q_len, d_model, generator=g),
                "key": torch.randn(batch, k_len, d_model, generator=g),
                "value": torch.randn(batch, k_len, d_model, generator=g),
                "w_q": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_k": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_v": std * torch.randn(d_model, heads * d_v, generator=g),
                "w_o": torch.randn(heads * d_v, d_model, generator=g) / math.sqrt(heads * d_v),
                "num_heads": heads,
                "head_gates": torch.tensor(gates),
            }
        )
    return cases


def _mha_variant(
    case: Case,
    scale_width: str = "d_k",
    merge_transposed: bool = True,
    split_transposed: bool = True,
    gates_strided: bool = False,
    gates: str = "heads",
    softmax_dim: int = -1,
) -> Tensor:
    """The output of a classic slip: the scale 1/√width with another width, the softmax
    over the queries (``softmax_dim=-2``), the heads
    split or merged by a reshape without the transpose, the gates spread over the
    concatenation with ``repeat`` (feature ``j`` gets gate ``j mod h``), put on ``W_O``'s
    columns (``gates="w_o columns"``, output feature ``j`` gets gate ``j // d_v``), multiplied
    into the scores before the softmax (``gates="scores"``) or ignored (``gates="ignored"``)."""
    query, key, value, heads = case["query"], case["key"], case["value"], case["num_heads"]
    batch, q_len, d_model = query.shape
    d_k, d_v = case["w_q"].shape[1] // heads, case["w_v"].shape[1] // heads
    width = {"d_k": d_k, "d_v": d_v, "d_model": d_model, "h·d_k": heads * d_k, "1": 1}[scale_width]

    def split(x: Tensor, dim: int) -> Tensor:  # (batch, len, h·dim) → (batch, h, len, dim)
        if split_transposed:
            return x.unflatten(-1, (heads, dim)).transpose(1, 2)
        return x.reshape(x.shape[0], heads, x.shape[1], dim)  # right shape, tokens mixed

    q = split(query @ case["w_q"], d_k)  # (batch, h, q_len, d_k)
    k = split(key @ case["w_k"], d_k)  # (batch, h, k_len, d_k)
    v = split(value @ case["w_v"], d_v)  # (batch, h, k_len, d_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(width)  # (batch, h, q_len, k_len)
    head_gates = case.get("head_gates")
    if head_gates is not None and gates == "scores":
        scores = scores * head_gates[:, None, None]  # head r's scores times ζ_r
    weights = torch.softmax(scores, dim=softmax_dim)  # (batch, h, q_len, k_len)
    per_head = weights @ v  # (batch, h, q_len, d_v)
    if head_gates is not None and not gates_strided and gates == "heads":
        per_head = per_head * head_gates[:, None, None]
    if merge_transposed:
        merged = per_head.transpose(1, 2).reshape(batch, q_len, heads * d_v)
    else:
        merged = per_head.reshape(batch, q_len, heads * d_v)  # right shape, tokens mixed
    if head_gates is not None and gates_strided:
        merged = merged * head_gates.repeat(d_v)  # feature j gets gate j mod h
    w_o = case["w_o"]  # (h·d_v, d_model)
    if head_gates is not None and gates == "w_o columns":  # needs h·d_v = d_model
        w_o = w_o * head_gates.repeat_interleave(d_v)[None, :]  # output feature j: gate j // d_v
    return merged @ w_o  # (batch, q_len, d_model)


def _mha_hint(case: Case, got: object) -> str:
    """Name the classic slip that ``got``'s output reproduces, if any (empty string otherwise)."""
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not isinstance(got[0], Tensor):
        return ""
    heads = case["num_heads"]
    d_k, d_v = case["w_q"].shape[1] // heads, case["w_v"].shape[1] // heads
    d_model = case["query"].shape[-1]
    gates = case.get("head_gates")
    if isinstance(got[1], Tensor) and gates is not None and not bool((gates == 1).all()):
        weights = reference_multi_head_attention(**case)[1]  # (batch, h, q_len, k_len)
        gated = weights * gates[:, None, None]  # head r's weights times ζ_r
        if got[1].shape == gated.shape and torch.allclose(got[1], gated, atol=1e-5, rtol=1e-4):
            return (
                "\n   this looks like the attention weights returned after gating: return the "
                "softmax's weights as they are (each row sums to 1); the gates multiply the "
                "heads' outputs, not the weights that are returned."
            )
    slips = {
        "the heads merged by a reshape without transpose(1, 2): right shape, but it glues "
        "the outputs of different tokens together": {"merge_transposed": False},
        "the heads split by a reshape to (batch, h, len, d_k) without transpose(1, 2): right "
        "shape, but each 'head' gets features of several tokens; view as (batch, len, h, d_k), "
        "then transpose(1, 2)": {"split_transposed": False},
        "the scale 1/√d_v: the scores are dot products of d_k-wide queries and keys, so the "
        "scale is 1/√d_k": {"scale_width": "d_v"},
        (
            "the scale 1/√d_model (= 1/√(h·d_k) in this case, the width of all heads "
            "together): the scale uses the width of one head, d_k"
            if d_model == heads * d_k
            else "the scale 1/√d_model: the scale uses the width of one head, d_k"
        ): {"scale_width": "d_model"},
        "the scale 1/√(h·d_k), the width of all heads together: use one head's d_k": {
            "scale_width": "h·d_k"
        },
        "no scale: chapter 2's 1/√d_k is missing": {"scale_width": "1"},
        "the softmax over dim=-2, the queries: each key's column of a head's map sums to 1; "
        "each query's weights over the keys must, softmax(scores, dim=-1)": {"softmax_dim": -2},
        "the gates spread over the concatenation with repeat(d_v), which gives feature j the "
        "gate j mod h: head r's d_v features are contiguous, so use repeat_interleave(d_v) or "
        "gate the (batch, h, q_len, d_v) outputs with head_gates[:, None, None]": {
            "gates_strided": True
        },
        "the gates put on the columns of W_O (the nn.Linear habit: out_proj.weight's columns "
        "are W_O's rows): in the math convention y = x W, head r owns W_O's rows "
        "r·d_v … (r+1)·d_v - 1, so gate those rows, or the (batch, h, q_len, d_v) outputs": {
            "gates": "w_o columns"
        },
        "the gates multiplied into the scores: the softmax turns a gated row of scores back "
        "into weights that sum to 1, so a gate of 0 gives an even spread, not a removed head; "
        "multiply head r's output (weights @ v) by head_gates[r]": {"gates": "scores"},
        "the gates ignored: multiply head r's output by head_gates[r] before W_O": {
            "gates": "ignored"
        },
    }
    widths = {"d_k": d_k, "d_v": d_v, "d_model": d_model, "h·d_k": heads * d_k, "1": 1}
    for slip, change in slips.items():
        reshaped = (
            change.get("merge_transposed") is False or change.get("split_transposed") is False
        )
        gates = case.get("head_gates")
        strided = change.get("gates_strided", False)
        gate_slip = change.get("gates", "heads") != "heads"
        if strided and (gates is None or bool((gates == gates[0]).all()) or d_v == 1):
            continue  # equal gates (or d_v = 1): repeat and repeat_interleave agree
        if gate_slip and (gates is None or bool((gates == 1).all())):
            continue  # all gates 1: ignoring them changes nothing
        if change.get("gates") == "w_o columns" and heads * d_v != d_model:
            continue  # W_O's columns cannot take h gates of d_v features each
        if (
            widths[change.get("scale_width", "d_k")] == d_k
            and change.get("softmax_dim", -1) == -1
            and not reshaped
            and not strided
            and not gate_slip
        ):
            continue  # this case cannot tell the slip from the right answer
        if change.get("merge_transposed") is False and (heads == 1 or case["query"].shape[1] == 1):
            continue
        seq_lens = (case["query"].shape[1], case["key"].shape[1])
        if change.get("split_transposed") is False and (heads == 1 or seq_lens == (1, 1)):
            continue
        value = _mha_variant(case, **change)
        if got[0].shape == value.shape and torch.allclose(got[0], value, atol=1e-5, rtol=1e-4):
            return f"\n   this looks like {slip}."
    return ""


def check_multi_head_attention(
    multi_head_attention: Callable[..., tuple[Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``multi_head_attention(query, key, value, w_q, w_k, w_v, w_o, num_heads,
    head_gates)`` → ``(output (batch, q_len, d_model), weights (batch, heads, q_len, k_len))``,
    with ``d_k`` and ``d_v`` read off the weights (cases with ``d_k != d_v`` and
    ``h·d_v != d_model``) and head ``r``'s output times ``head_gates[r]`` (cases with gates 0,
    fractional and negative); names a split or merge without the transpose, a wrong scale and
    gates spread with ``repeat`` when the output is one of them."""
    cases = _mha_cases()
    result = run_check(
        "multi_head_attention",
        multi_head_attention,
        reference_multi_head_attention,
        cases,
        verbose=False,
        hint=_mha_hint,
    )
    if result.passed:  # the cases ran on copies: does the function change its inputs in place?
        case = cases[0]
        copies = {k: v.clone() if isinstance(v, Tensor) else v for k, v in case.items()}
        try:
            multi_head_attention(**copies)
        except Exception:  # noqa: BLE001 (it passed on this case; a second call may not)
            copies = case
        changed = [
            k
            for k, v in case.items()
            if isinstance(v, Tensor) and not torch.equal(v, copies[k])  # type: ignore[arg-type]
        ]
        if changed:
            result.message += (
                f"\n   note: your function changed its input {', '.join(changed)} in place "
                "(e.g. w_o *= ...). The output is right, but a caller's weights would change: "
                "compute a new tensor (w_o * ...) instead."
            )
    return _width_hint_if_raised(result, cases, verbose)


# --------------------------------------------------------------------------------------------
# Exercise 6: grouped-query attention
# --------------------------------------------------------------------------------------------


def reference_grouped_query_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    w_o: Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> Tensor:
    """Grouped-query attention (Ainslie et al., 2023) without biases, math convention ``y = x W``.

    ``num_heads`` query heads share ``num_kv_heads`` key/value heads: each group of
    ``num_heads / num_kv_heads`` consecutive query heads shares one key/value head: query head
    ``r`` uses key/value head ``r // (num_heads / num_kv_heads)`` (``repeat_interleave``). ``num_kv_heads == num_heads`` is multi-head attention, 1 is
    multi-query attention.

    Args:
        query: shape ``(batch, q_len, d_model)``.
        key, value: shape ``(batch, k_len, d_model)``.
        w_q: shape ``(d_model, num_heads · d_k)``.
        w_k, w_v: shape ``(d_model, num_kv_heads · d_k)``.
        w_o: shape ``(num_heads · d_k, d_model)``.
        num_heads, num_kv_heads: numbers of query and of key/value heads.

    Returns:
        Shape ``(batch, q_len, d_model)``.
    """
    batch, q_len, _ = query.shape
    k_len = key.shape[1]
    d_k = w_q.shape[1] // num_heads
    group = num_heads // num_kv_heads
    q = (query @ w_q).view(batch, q_len, num_heads, d_k).transpose(1, 2)  # (batch, h, q_len, d_k)
    k = (key @ w_k).view(batch, k_len, num_kv_heads, d_k).transpose(1, 2)  # (batch, g, k_len, d_k)
    v = (
        (value @ w_v).view(batch, k_len, num_kv_heads, d_k).transpose(1, 2)
    )  # (batch, g, k_len, d_k)
    k = k.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k): each kv head for its group
    v = v.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)  # (batch, h, q, k)
    heads = weights @ v  # (batch, h, q_len, d_k)
    merged = heads.transpose(1, 2).reshape(batch, q_len, num_heads * d_k)  # (batch, q_len, h·d_k)
    return merged @ w_o  # (batch, q_len, d_model)


def _gqa_cases() -> list[Case]:
    g = seeded_generator(306)
    shapes = [
        # (batch, q_len, k_len, d_model, num_heads, num_kv_heads, d_k)
        (2, 5, 5, 16, 4, 2, 4),  # two groups of two query heads
        (2, 3, 6, 24, 6, 3, 4),  # cross-attention, groups of two
        (1, 4, 4, 32, 8, 2, 4),  # groups of four: repeat and repeat_interleave differ
        (2, 4, 4, 12, 6, 2, 2),  # groups of three
        (2, 3, 3, 16, 4, 1, 4),  # multi-query attention: one key/value head
        (1, 5, 5, 12, 3, 3, 4),  # groups of one: ordinary multi-head attention
        (2, 4, 4, 8, 4, 2, 5),  # h·d_k = 20 != d_model: d_k must be read off w_q
    ]
    cases: list[Case] = []
    for batch, q_len, k_len, d_model, heads, kv_heads, d_k in shapes:
        std = 1 / math.sqrt(d_model)
        cases.append(
            {
                "query": torch.randn(batch, q_len, d_model, generator=g),
                "key": torch.randn(batch, k_len, d_model, generator=g),
                "value": torch.randn(batch, k_len, d_model, generator=g),
                "w_q": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_k": 2 * std * torch.randn(d_model, kv_heads * d_k, generator=g),
                "w_v": std * torch.randn(d_model, kv_heads * d_k, generator=g),
                "w_o": std * torch.randn(heads * d_k, d_model, generator=g),
                "num_heads": heads,
                "num_kv_heads": kv_heads,
            }
        )
    return cases


def _gqa_with_kv_heads(case: Case, kv_of: list[int], scale_width: int | None = None) -> Tensor:
    """Grouped-query attention where query head ``r`` reads key/value head ``kv_of[r]``, the
    scores scaled by ``1/√scale_width`` (``None``: ``1/√d_k``)."""
    query, key, value = case["query"], case["key"], case["value"]
    heads, kv_heads = case["num_heads"], case["num_kv_heads"]
    batch, q_len, _ = query.shape
    k_len = key.shape[1]
    d_k = case["w_q"].shape[1] // heads
    index = torch.tensor(kv_of)  # (h,)
    q = (query @ case["w_q"]).view(batch, q_len, heads, d_k).transpose(1, 2)  # (batch, h, q, d_k)
    k = (key @ case["w_k"]).view(batch, k_len, kv_heads, d_k).transpose(1, 2)[:, index]
    v = (value @ case["w_v"]).view(batch, k_len, kv_heads, d_k).transpose(1, 2)[:, index]
    scale = 1 / math.sqrt(d_k if scale_width is None else scale_width)
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # (batch, h, q, k)
    merged = (weights @ v).transpose(1, 2).reshape(batch, q_len, heads * d_k)
    return merged @ case["w_o"]  # (batch, q_len, d_model)


def _gqa_hint(case: Case, got: object) -> str:
    """Name the grouping slip that ``got`` reproduces, if any (empty string otherwise): which
    key/value head a query head used, and which one it should have used."""
    if not isinstance(got, Tensor):
        return ""
    heads, kv_heads = case["num_heads"], case["num_kv_heads"]
    group = heads // kv_heads
    right = [r // group for r in range(heads)]
    slips = {
        "`repeat` (it tiles the whole stack of key/value heads; `repeat_interleave(group, "
        "dim=1)`, or `expand` then `reshape`, repeats each head in place)": [
            r % kv_heads for r in range(heads)
        ],
        "r // num_kv_heads, dividing by the number of groups instead of the group size "
        "num_heads / num_kv_heads": [min(r // kv_heads, kv_heads - 1) for r in range(heads)],
        "the first key/value head for every query head": [0] * heads,
    }
    for slip, kv_of in slips.items():
        if kv_of == right:
            continue
        value = _gqa_with_kv_heads(case, kv_of)
        if got.shape == value.shape and torch.allclose(got, value, atol=1e-5, rtol=1e-4):
            r = next(r for r in range(heads) if kv_of[r] != right[r])
            return (
                f"\n   not rounding: your query head {r} used key/value head {kv_of[r]}, but with "
                f"{heads} query heads and {kv_heads} key/value heads it belongs to group "
                f"{right[r]} (query heads {right[r] * group} to {right[r] * group + group - 1} "
                f"share key/value head {right[r]}). This looks like {slip}."
            )
    width, d_model = case["w_q"].shape[1], case["query"].shape[-1]
    d_k = width // heads
    if d_model != d_k:
        scaled = _gqa_with_kv_heads(case, right, scale_width=d_model)
        if got.shape == scaled.shape and torch.allclose(got, scaled, atol=1e-5, rtol=1e-4):
            return (
                "\n   this looks like the scale 1/√d_model: the scores are dot products of one "
                "head's d_k-wide queries and keys, so the scale is 1/√d_k, d_k = "
                "w_q.shape[1] // num_heads."
            )
    if width != d_model:
        return (
            f"\n   in this case num_heads · d_k = {width} is not d_model = {d_model}: read d_k "
            "off the weights, w_q.shape[1] // num_heads, not d_model // num_heads."
        )
    return ""


def check_grouped_query_attention(
    grouped_query_attention: Callable[..., Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``grouped_query_attention(query, key, value, w_q, w_k, w_v, w_o, num_heads,
    num_kv_heads)`` → ``(batch, q_len, d_model)``; when the answer pairs query heads with the
    wrong key/value heads (``repeat`` for ``repeat_interleave``, ...) the message says which
    key/value head a query head used and which it should have used."""
    cases = _gqa_cases()
    result = run_check(
        "grouped_query_attention",
        grouped_query_attention,
        reference_grouped_query_attention,
        cases,
        verbose=False,
        hint=_gqa_hint,
    )
    return _width_hint_if_raised(result, cases, verbose, grouped=True)


# --------------------------------------------------------------------------------------------
# Exercise 2: reorder the heads without changing the layer
# --------------------------------------------------------------------------------------------


def reference_permute_heads(
    w_q: Tensor, w_k: Tensor, w_v: Tensor, w_o: Tensor, num_heads: int, order: list[int]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Reorder the heads of a multi-head attention layer (math convention ``y = x W``).

    Head ``r`` of the result is head ``order[r]`` of the input: its ``d_k`` columns of ``w_q``
    and ``w_k``, its ``d_v`` columns of ``w_v`` and its ``d_v`` **rows** of ``w_o`` move
    together, so the layer computes the same output and its weights are the old ones with the
    head axis reordered.

    Args:
        w_q, w_k: shape ``(d_model, num_heads · d_k)``.
        w_v: shape ``(d_model, num_heads · d_v)``.
        w_o: shape ``(num_heads · d_v, d_model)``.
        num_heads: number of heads.
        order: a permutation of ``0 … num_heads - 1``.

    Returns:
        ``(w_q, w_k, w_v, w_o)`` with the shapes of the inputs.
    """
    index = torch.as_tensor(order)

    def columns(w: Tensor) -> Tensor:  # (d_model, h·d) → the same, head blocks reordered
        return w.unflatten(1, (num_heads, -1))[:, index].flatten(1)

    rows = w_o.unflatten(0, (num_heads, -1))[index].flatten(0, 1)  # (h·d_v, d_model)
    return columns(w_q), columns(w_k), columns(w_v), rows


def _permute_cases() -> list[Case]:
    g = seeded_generator(304)
    settings = [
        # (batch, q_len, k_len, d_model, num_heads, d_k, d_v, order)
        (2, 5, 5, 12, 3, 4, 4, [2, 0, 1]),  # a cycle: applying `order` or its inverse differ
        (2, 4, 6, 12, 4, 3, 3, [1, 0, 3, 2]),  # cross-attention, two swaps
        (1, 4, 4, 8, 2, 3, 5, [1, 0]),  # d_k != d_v, h·d_v = 10 != d_model: W_O is (10, 8)
        (2, 3, 3, 16, 4, 4, 4, [3, 1, 2, 0]),
        (1, 5, 5, 12, 3, 4, 4, [0, 1, 2]),  # the identity: nothing may change
        (2, 4, 4, 24, 6, 4, 4, [5, 3, 1, 4, 2, 0]),
    ]
    cases: list[Case] = []
    for batch, q_len, k_len, d_model, heads, d_k, d_v, order in settings:
        std = 1 / math.sqrt(d_model)
        cases.append(
            {
                "query": torch.randn(batch, q_len, d_model, generator=g),
                "key": torch.randn(batch, k_len, d_model, generator=g),
                "w_q": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_k": 2 * std * torch.randn(d_model, heads * d_k, generator=g),
                "w_v": std * torch.randn(d_model, heads * d_v, generator=g),
                "w_o": torch.randn(heads * d_v, d_model, generator=g) / math.sqrt(heads * d_v),
                "num_heads": heads,
                "order": order,
            }
        )
    return cases


def _permute_hint(case: Case, got: tuple) -> str:
    """Name the classic slip that the four returned matrices reproduce, if any."""
    heads, order = case["num_heads"], case["order"]
    w_q, w_k, w_v, w_o = (case[k] for k in ("w_q", "w_k", "w_v", "w_o"))
    q, k, v, o = reference_permute_heads(w_q, w_k, w_v, w_o, heads, order)
    slips = {
        "only W_Q and W_K moved: each head's map now averages another head's values; a head is "
        "its columns of W_Q, W_K and W_V and its rows of W_O, moved together": (q, k, w_v, w_o),
        "W_O kept as it was: it still expects the head outputs in the old order; move its "
        "blocks of d_v rows too": (q, k, v, w_o),
        "W_V kept as it was: each moved map now averages the values of the head that used to "
        "sit there; move W_V's blocks of d_v columns with W_Q's and W_K's": (q, k, w_v, o),
    }
    d_k, d_v = w_q.shape[1] // heads, w_v.shape[1] // heads
    if d_k != d_v:  # W_O's rows cut in blocks of d_k (the width of W_Q's blocks), rest kept
        moved = torch.cat([w_o[r * d_k : (r + 1) * d_k] for r in order] + [w_o[heads * d_k :]])
        slips[
            f"W_O's rows cut in blocks of d_k = {d_k}: head r owns d_v = {d_v} rows of W_O "
            "(w_v.shape[1] // num_heads), the width of its value block"
        ] = (q, k, v, moved)
    if w_o.shape[1] % heads == 0:
        cols = w_o.unflatten(1, (heads, -1))[:, torch.as_tensor(order)].flatten(1)
        slips[
            "W_O's columns moved: that is nn.Linear's stored (d_model, h·d_v) habit; in the math "
            "convention head r owns d_v **rows** of W_O"
        ] = (q, k, v, cols)
    for slip, value in slips.items():
        if all(
            isinstance(a, Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
            for a, b in zip(got, value)
        ):
            return f"\n   this looks like {slip}."
    return ""


def check_permute_heads(permute_heads: Callable[..., tuple], verbose: bool = True) -> CheckResult:
    """Check ``permute_heads(w_q, w_k, w_v, w_o, num_heads, order)`` → ``(w_q, w_k, w_v, w_o)``.

    Not by comparing matrices but by what the layer computes: with the returned weights,
    multi-head attention must give the **same output** as before, and its weights
    ``(batch, heads, q_len, k_len)`` must be the old ones with head ``r`` = old head
    ``order[r]``.
    """
    name = "permute_heads"
    _require_callable("permute_heads", permute_heads)
    result: CheckResult | None = None
    count = 0
    cases = _permute_cases()
    changed_in_place: set[str] = set()  # inputs the function changed (it ran on copies)
    for count, case in enumerate(cases, start=1):
        query, key, order = case["query"], case["key"], case["order"]
        layer = {k: case[k] for k in ("w_q", "w_k", "w_v", "w_o", "num_heads")}
        args = {k: v.clone() if isinstance(v, Tensor) else v for k, v in layer.items()}
        got, result = call_reader(name, count, permute_heads, {**args, "order": list(order)})
        if result is not None:
            break
        changed_in_place |= {
            k for k, v in args.items() if isinstance(v, Tensor) and not torch.equal(v, layer[k])
        }
        before_out, before_w = reference_multi_head_attention(query, key, key, **layer)
        problem = None
        if not isinstance(got, (tuple, list)) or len(got) != 4:
            problem = f"expected a tuple (w_q, w_k, w_v, w_o), got {type(got).__name__}"
        else:
            shapes = [tuple(w.shape) for w in (case["w_q"], case["w_k"], case["w_v"], case["w_o"])]
            got_shapes = [tuple(w.shape) if isinstance(w, Tensor) else None for w in got]
            if got_shapes != shapes:
                problem = f"the four matrices must keep their shapes {shapes}, got {got_shapes}"
            else:
                w_q, w_k, w_v, w_o = got
                out, weights = reference_multi_head_attention(
                    query, key, key, w_q, w_k, w_v, w_o, case["num_heads"]
                )
                problem = compare(
                    before_w[:, order],
                    weights,
                    path="the weights of new head r (old head order[r])",
                ) or compare(before_out, out, path="the layer's output (it must not change)")
                inverse = torch.argsort(torch.as_tensor(order)).tolist()
                if (
                    problem
                    and inverse != list(order)
                    and torch.allclose(weights, before_w[:, inverse], atol=1e-5)
                ):
                    problem += (
                        "\n   you applied the inverse permutation: old head r went to place "
                        "order[r]; new head r must be old head order[r]"
                    )
                elif problem:
                    problem += _permute_hint(case, got)
        if problem:
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: case {count} is wrong.\n   {problem}\n   inputs: "
                f"num_heads {case['num_heads']}, order {order}, w_q {tuple(case['w_q'].shape)}, "
                f"w_v {tuple(case['w_v'].shape)}, w_o {tuple(case['w_o'].shape)}",
            )
            break
    if result is None:
        result = CheckResult(name, True, count, f"✅ {name}: all {count} cases keep the layer.")
        if changed_in_place:
            result.message += (
                f"\n   note: your function changed its input {', '.join(sorted(changed_in_place))} "
                "in place. The returned weights are right, but a caller's layer would change: "
                "build new tensors (torch.cat, indexing) instead."
            )
    elif result.message.startswith("❌") and result.cases_run > 1:
        # the earlier cases, passed, all have heads d_model // num_heads wide: blocks of that
        # width are the likely slip where this case's heads are narrower or wider
        case = cases[result.cases_run - 1]
        d_model, heads = case["w_q"].shape[0], case["num_heads"]
        q_width, v_width = case["w_q"].shape[1], case["w_v"].shape[1]
        # unless a slip was already named (W_O cut in blocks of d_k is not d_model // num_heads)
        if (q_width != d_model or v_width != d_model) and "this looks like" not in result.message:
            result.message += (
                f"\n   the cases before this one have heads d_model // num_heads wide; here "
                f"d_model = {d_model} but w_q has {q_width} columns and w_v {v_width} for {heads} "
                "heads: cut blocks of d_k = w_q.shape[1] // num_heads and d_v = "
                "w_v.shape[1] // num_heads, not d_model // num_heads."
            )
    if verbose:
        report(result)
    return result


# --------------------------------------------------------------------------------------------
# Exercise 5: what each head compares, its bilinear form W_Q^(r) W_K^(r)T
# --------------------------------------------------------------------------------------------


def reference_head_score_matrices(w_q: Tensor, w_k: Tensor, num_heads: int) -> Tensor:
    """The matrix of each head's raw scores, ``M_r = W_Q^(r) W_K^(r)ᵀ`` (math convention).

    Head ``r`` (0-based) owns columns ``r·d_k … (r+1)·d_k - 1`` of ``w_q`` and ``w_k``; its raw
    score of token rows ``x_i``, ``x_j`` is ``s_ij = (x_i W_Q^(r)) · (x_j W_K^(r)) = x_i M_r x_jᵀ``
    (no ``1/√d_k``). Each ``M_r`` has rank at most ``d_k``, and the ``h`` matrices add up to
    ``W_Q W_Kᵀ``, the matrix of one wide head with the same weights.

    Args:
        w_q, w_k: shape ``(d_model, num_heads · d_k)``.
        num_heads: number of heads.

    Returns:
        Shape ``(num_heads, d_model, d_model)``.
    """
    q_blocks = w_q.unflatten(1, (num_heads, -1)).transpose(0, 1)  # (h, d_model, d_k)
    k_blocks = w_k.unflatten(1, (num_heads, -1)).transpose(0, 1)  # (h, d_model, d_k)
    return q_blocks @ k_blocks.transpose(-2, -1)  # (h, d_model, d_model)


def _score_matrix_cases() -> list[Case]:
    g = seeded_generator(305)
    cases: list[Case] = []
    for d_model, heads, d_k in (
        (12, 3, 4),  # the chapter's sizes
        (8, 2, 3),  # h·d_k = 6 != d_model
        (6, 3, 4),  # h·d_k = 12 > d_model: each M_r still has rank <= 4
        (16, 4, 4),
        (8, 1, 8),  # one head: M = W_Q W_Kᵀ
        (4, 4, 1),  # heads of width 1: every M_r has rank 1
    ):
        cases.append(
            {
                "w_q": torch.randn(d_model, heads * d_k, generator=g) / math.sqrt(d_model),
                "w_k": torch.randn(d_model, heads * d_k, generator=g) / math.sqrt(d_model),
                "num_heads": heads,
            }
        )
    return cases


def _score_matrix_hint(case: Case, got: object) -> str:
    """Name the classic slip that ``got`` reproduces, if any (empty string otherwise)."""
    if not isinstance(got, Tensor):
        return ""
    w_q, w_k, heads = case["w_q"], case["w_k"], case["num_heads"]
    right = reference_head_score_matrices(w_q, w_k, heads)
    d_k = w_q.shape[1] // heads
    strided = w_q.unflatten(1, (-1, heads)).permute(2, 0, 1) @ w_k.unflatten(
        1, (-1, heads)
    ).permute(2, 1, 0)  # (h, d_model, d_model): features r, r + h, ... taken as head r
    narrow = w_q.shape[0] // heads  # TinyMHA's d_model // h, taken as d_k
    from_d_model = torch.stack(  # slices of that width: silently wrong where h·d_k != d_model
        [
            w_q[:, r * narrow : (r + 1) * narrow] @ w_k[:, r * narrow : (r + 1) * narrow].T
            for r in range(heads)
        ]
    )
    slips = {
        "W_K^(r) W_Q^(r)ᵀ, the transpose: its entry (i, j) is the score of query j for key i": (
            right.transpose(-2, -1)
        ),
        "the scores scaled by 1/√d_k: the exercise asks for the raw scores s_ij": right
        / math.sqrt(d_k),
        "W_Q W_Kᵀ of all heads together for every head, not each head's own columns": (
            (w_q @ w_k.T).expand(heads, -1, -1)
        ),
        "strided heads (features r, r + h, r + 2h, ...): head r owns a contiguous block of d_k "
        "columns": strided,
        "w_q.reshape(h, d_model, d_k) (and w_k likewise): right shape, wrong numbers, section "
        "3.3's reshape bug applied to the weights; head r's block is w_q[:, r·d_k:(r+1)·d_k], "
        "i.e. w_q.unflatten(1, (h, d_k)).transpose(0, 1)": (
            w_q.reshape(heads, -1, d_k) @ w_k.reshape(heads, -1, d_k).transpose(-2, -1)
        ),
        f"heads of width d_model // num_heads = {narrow}: here d_k = {d_k}; read d_k off the "
        "weights (w_q.shape[1] // num_heads)": from_d_model,
    }
    for slip, value in slips.items():
        if got.shape == value.shape and torch.allclose(got, value, atol=1e-5, rtol=1e-4):
            return f"\n   this looks like {slip}."
    return ""


def _layer_case(attention: object) -> Case:
    """The case of a trained layer: its stored weights in the math convention, without biases."""
    from companion.attention import MultiHeadAttention

    if not isinstance(attention, MultiHeadAttention):
        raise TypeError(
            "attention: expected a companion MultiHeadAttention (e.g. counters[16].attention), "
            f"got {type(attention).__name__}"
        )
    if attention.num_kv_heads != attention.num_heads:
        raise ValueError(
            "attention: expected one key head per query head (num_kv_heads == num_heads), got "
            f"num_heads={attention.num_heads}, num_kv_heads={attention.num_kv_heads}"
        )
    return {
        "w_q": attention.query_proj.weight.detach().T.contiguous(),  # (d_model, h·d_k)
        "w_k": attention.key_proj.weight.detach().T.contiguous(),
        "num_heads": attention.num_heads,
    }


def check_head_score_matrices(
    head_score_matrices: Callable[[Tensor, Tensor, int], Tensor],
    verbose: bool = True,
    *,
    attention: object = None,
) -> CheckResult:
    """Check ``head_score_matrices(w_q, w_k, num_heads)`` → ``(num_heads, d_model, d_model)``,
    head ``r``'s ``W_Q^(r) W_K^(r)ᵀ``; names the transpose, the scale, the whole-layer product,
    strided heads and heads of width d_model // num_heads when the answer is one of them. ``attention``, a trained
    ``MultiHeadAttention`` (the chapter passes ``counters[16].attention``), adds its weights
    as one more case."""
    cases = _score_matrix_cases()
    if attention is not None:
        cases.append(_layer_case(attention))
    result = run_check(
        "head_score_matrices",
        head_score_matrices,
        reference_head_score_matrices,
        cases,
        verbose=False,
        hint=_score_matrix_hint,
    )
    if not result.passed and f"case {result.cases_run} raised" in result.message:
        w_q, heads = cases[result.cases_run - 1]["w_q"], cases[result.cases_run - 1]["num_heads"]
        if w_q.shape[1] != w_q.shape[0]:  # h·d_k != d_model: d_model // num_heads is not d_k
            result.message += (
                f"\n   in this case d_model = {w_q.shape[0]} but w_q has {w_q.shape[1]} columns "
                f"for {heads} heads: read d_k off the weights (w_q.shape[1] // num_heads), not "
                "d_model // num_heads."
            )
    if verbose:
        report(result)
    return result


# --------------------------------------------------------------------------------------------
# Exercise 3: when can one head's blend be taken apart?
# --------------------------------------------------------------------------------------------


def _subset_totals(weights: Tensor) -> list[tuple[float, tuple[int, ...]]]:
    """Every subset of the lookups (the empty one included) with its total weight, sorted."""
    k = len(weights)
    totals = []
    for members in range(2**k):
        subset = tuple(j for j in range(k) if (members >> j) & 1)
        totals.append((float(sum(float(weights[j]) for j in subset)), subset))
    return sorted(totals)


def reference_blend_separable(weights: Tensor, tol: float) -> bool:
    """True when the ``2**k`` subset totals of ``weights (k,)`` are pairwise more than ``tol``
    apart: then the total weight on a symbol tells which of the lookups hold it."""
    totals = [total for total, _ in _subset_totals(weights)]
    return all(b - a > tol for a, b in zip(totals, totals[1:]))


def _separable_cases() -> list[Case]:
    cases = [
        ([0.25, 0.25, 0.25, 0.25], 0.01),  # equal weights: 1/4 + 1/4 is every pair's total
        ([0.4, 0.3, 0.2, 0.1], 0.01),  # all weights differ, yet 0.4 + 0.1 = 0.3 + 0.2
        # 0.4 + 0.1 = 0.35 + 0.15, two totals that are not neighbours in product order: catches
        # neighbouring totals compared without sorting
        ([0.4, 0.35, 0.15, 0.1], 0.01),
        ([0.52, 0.27, 0.13, 0.08], 0.01),  # each weight outweighs the lighter ones together
        ([0.45, 0.3, 0.17, 0.08], 0.01),  # does not (0.45 < 0.55), yet every total differs
        ([0.5, 0.3, 0.2], 0.01),  # one lookup against two: 0.5 = 0.3 + 0.2
        ([0.5, 0.3, 0.205], 0.01),  # 0.5 and 0.505 lie within tol
        ([0.5, 0.3, 0.205], 0.001),  # ... and not within this tol
        ([0.5, 0.3, 0.206], 0.01),  # 0.5 and 0.506 lie within tol, yet round(t / tol) differs
        ([0.48, 0.26, 0.14, 0.08, 0.04], 0.01),  # graded, but 0.26 = 0.14 + 0.08 + 0.04
        ([0.52, 0.26, 0.13, 0.06, 0.03], 0.005),  # five lookups, every total its own
        ([0.7, 0.3], 0.01),
        ([0.6, 0.4, 0.0], 0.01),  # a lookup with no weight: a symbol there adds nothing
        # weights summing to 0.5 (a head can put the rest on other keys): 0.11 and 0.13 lie 0.02
        # apart, within tol; normalised to sum 1 they would lie 0.04 apart. Catches weights
        # normalised first (before the (0.5, 0.25) case, whose totals a normaliser also stretches)
        ([0.26, 0.13, 0.07, 0.04], 0.025),
        ([0.5, 0.25], 0.25),  # totals 0, 0.25, 0.5, 0.75 exactly tol apart: not MORE than tol
        ([1.0], 0.01),
        # the full set {0.995, 0.005} and {0.995} lie 0.005 apart: catches subsets of sizes
        # 1 to k - 1 only (range(1, k)); with three or more lookups a weight this small also
        # collides with smaller subsets, so only two lookups catch that slip
        ([0.995, 0.005], 0.01),
    ]
    return [{"weights": torch.tensor(w, dtype=torch.float64), "tol": tol} for w, tol in cases]


def _separable_problem(got: object, case: Case) -> str | None:
    """What is wrong with the verdict ``got`` on ``case`` (None when it is right)."""
    weights, tol = case["weights"], case["tol"]
    shown = "(" + ", ".join(f"{w:g}" for w in weights.tolist()) + f"), tol {tol:g}"
    if isinstance(got, Tensor) and got.numel() == 1:
        got = got.item()
    got = as_verdict(got)  # NumPy's bool (np.all's) is a right answer too
    if not isinstance(got, (bool, int)):
        return f"weights {shown}: return True or False, got {type(got).__name__} {got!r}"[:300]
    expected = reference_blend_separable(weights, tol)
    if bool(got) == expected:
        return None
    totals = _subset_totals(weights)
    if expected:
        gap = min(b[0] - a[0] for a, b in zip(totals, totals[1:]))
        return (
            f"weights {shown}: expected True, got False. All {len(totals)} subset totals differ, "
            f"the closest two by {gap:.3g} > tol (a weight need not outweigh all lighter ones "
            "together)"
        )
    # the closest two totals, preferring two non-empty subsets (the empty one may be left out)
    (low, a), (high, b) = min(
        zip(totals, totals[1:]),
        key=lambda pair: (pair[1][0] - pair[0][0] > tol, not pair[0][1], pair[1][0] - pair[0][0]),
    )

    def name(subset: tuple[int, ...]) -> str:
        return "{" + ", ".join(f"{weights[j].item():g}" for j in subset) + "}"

    advice = (
        "compare every subset's total with every other's (once sorted, neighbours are enough), "
        "not the weights one by one"
    )
    total = weights.sum().item()
    normalised = not math.isclose(total, 1.0) and reference_blend_separable(weights / total, tol)
    if math.isclose(high - low, tol, rel_tol=1e-9):  # the slip of testing >= tol
        advice = "totals exactly tol apart are not more than tol apart: use >, not >="
    elif normalised:  # the slip of rescaling the weights to sum 1, which stretches every gap
        advice = (
            f"use the weights as given: they sum to {total:.3g}, not 1 (a head can put the rest "
            "on other keys), and dividing by their sum would stretch every gap"
        )
    elif len(b) == len(weights) or len(a) == len(weights):  # the slip of subset sizes 1 to k - 1
        advice = "the full set of lookups is a subset too: a symbol can sit at every lookup"
    # the slip of rounding each total to a multiple of tol
    elif high - low < tol and round(low / tol) != round(high / tol):
        advice += "; two totals within tol can fall into different buckets of width tol"
    return (
        f"weights {shown}: expected False, got True. The subsets {name(a)} and {name(b)} total "
        f"{low:.4g} and {high:.4g}, no more than tol apart: {advice}"
    )


def check_blend_separable(
    blend_separable: Callable[[Tensor, float], bool], verbose: bool = True
) -> CheckResult:
    """Check ``blend_separable(weights, tol)``: ``weights (k,)``, one head's weights on its
    ``k`` lookups → True when every subset of the lookups has a total weight more than ``tol``
    from every other subset's."""
    _require_callable("blend_separable", blend_separable)
    return run_verdict_check(
        "blend_separable",
        blend_separable,
        _separable_cases(),
        lambda case: {"weights": case["weights"].clone(), "tol": case["tol"]},
        _separable_problem,
        what="sets of weights",
        verbose=verbose,
    )
