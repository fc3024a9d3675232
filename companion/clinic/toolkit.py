"""The toy task and the toolkit of chapter 11's bug clinic: what examines the patient.

:func:`toy_batch` (reverse 12 symbols), :func:`train_toy`, :func:`greedy_accuracy`, and the
tests that find the bugs of the clinic's own model: :func:`parity` with the package's model
(:func:`reference_model` copies the weights), :func:`causal_leak`,
:func:`is_permutation_equivariant` and :func:`overfit_one_batch`; :func:`nan_positions`
shows where NaN starts and how it spreads.

**Diagnostics for any model.** The second half works on any ``nn.Module`` through a small
adapter, a *logits function*: a callable from token ids to logits,

* decoder-only: ``logits_fn(ids)``, ``ids (batch, len)`` → ``(batch, len, vocab)``;
* encoder-decoder: ``logits_fn(src, tgt_in)``, ``(batch, src_len)`` and ``(batch, tgt_len)``
  → ``(batch, tgt_len, vocab)``.

:func:`as_logits_fn` builds one from a module (evaluation mode, no gradient; a tuple output or
a ``.logits`` attribute is unwrapped). Each diagnostic takes the adapter, the ``inputs`` (one
id tensor or a tuple of them, in the adapter's order) and the vocabulary size and padding id
where it needs them; none reads a parameter name or a constant of the clinic. Each returns a
:class:`Finding`: ``passed``, a one-line ``summary`` with the numbers, ``details``; ``str()``
reads ``PASS  causal leak: ...``, and ``bool(finding)`` is ``finding.passed``.

====================================  =====================================================
diagnostic                            catches
====================================  =====================================================
:func:`causal_leak_check`             a decoder output that reads a later token (mask off by
                                      one, softmax over the queries, a missing causal mask);
                                      :func:`causal_leak_gradient` by gradients
:func:`permutation_equivariance`      a layer that mixes tokens by index (heads split
                                      without a transpose)
:func:`batch_independence`            a sentence's output that depends on the others or on
                                      its row (batch_first confusion, a batch-axis slip)
:func:`padding_invariance`            outputs that move when pads are appended (no padding
                                      mask, a mask on the query axis); a causal decoder-only
                                      model needs the pads prepended (``side="left"``)
:func:`initial_loss_check`            a loss at initialisation far from ``ln V`` (scale slips
                                      of the embedding or the tied output)
:func:`overfit_check`                 a model that cannot learn one batch (double softmax)
:func:`registration_check`            layers or weights kept in plain Python containers
:func:`deterministic_check`           two evaluation calls that differ (``model.eval()``
                                      forgotten: dropout on)
:func:`loss_padding_check`            a loss that counts the padding positions
:func:`label_shift_check`             labels not shifted (the model may copy its input)
:func:`parity_with_torch`             any difference from ``torch.nn.Transformer`` after
                                      mapping the ``state_dict`` (:func:`clinic_key_map`)
====================================  =====================================================

:func:`examine` runs all of them but :func:`permutation_equivariance` (it needs an attention
module), :func:`overfit_check` (it trains), :func:`parity_with_torch` (it needs a key map) and
:func:`causal_leak_gradient`, on a :class:`~companion.clinic.patient.Patient`. More
patients: the bug museum of the repository, ``tests/mutants/catalogue.py``, lists the bugs
planted in the package itself and the test that catches each (``tests/test_mutants.py``).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import (
    check_callable,
    check_choice,
    check_floating,
    check_instance,
    check_ndim,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_token_ids,
    shape_str,
)
from companion.clinic.patient import (
    BOS_ID,
    EOS_ID,
    SEQ_LEN,
    VOCAB_SIZE,
    Patient,
    Transformer,
    greedy_decode,
    sequence_loss,
)
from companion.model import Transformer as ReferenceTransformer
from companion.model import TransformerConfig
from companion.positional import sinusoidal_table

__all__ = [
    "toy_batch",
    "train_toy",
    "teacher_forced_accuracy",
    "StepTrace",
    "greedy_accuracy",
    "reference_model",
    "parity",
    "gradient_parity",
    "first_mismatch",
    "nan_positions",
    "causal_leak",
    "is_permutation_equivariant",
    "overfit_one_batch",
    "LogitsFn",
    "Finding",
    "as_logits_fn",
    "causal_leak_check",
    "causal_leak_gradient",
    "permutation_equivariance",
    "batch_independence",
    "padding_invariance",
    "initial_loss_check",
    "overfit_check",
    "registration_check",
    "deterministic_check",
    "loss_padding_check",
    "label_shift_check",
    "TorchReference",
    "clinic_key_map",
    "apply_key_map",
    "parity_with_torch",
    "examine",
]


def toy_batch(
    batch_size: int, generator: torch.Generator, seq_len: int = SEQ_LEN
) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of the reverse task: ``(src, tgt_in, tgt_out)``, each ``(batch, seq_len + 1)``.

    ``src`` is ``seq_len`` random symbols (ids 4-10) and ``<eos>``; ``tgt_out`` the symbols
    reversed and ``<eos>``; ``tgt_in`` is ``tgt_out`` shifted right behind ``<bos>`` (teacher
    forcing). Source and target have the same length, as in many toy tasks: the case where a
    bug that mixes them up still runs.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    shape = (batch_size, seq_len)
    symbols = torch.randint(4, VOCAB_SIZE, shape, generator=generator)  # (batch, seq_len)
    eos = torch.full((batch_size, 1), EOS_ID)  # (batch, 1)
    bos = torch.full((batch_size, 1), BOS_ID)  # (batch, 1)
    src = torch.cat([symbols, eos], dim=1)  # (batch, seq_len + 1)
    tgt_out = torch.cat([symbols.flip(1), eos], dim=1)  # (batch, seq_len + 1)
    tgt_in = torch.cat([bos, symbols.flip(1)], dim=1)  # (batch, seq_len + 1)
    return src, tgt_in, tgt_out


def _adam_steps(
    model: nn.Module,
    steps: int,
    lr: float,
    next_batch: Callable[[], tuple[Tensor, Tensor, Tensor]],
    callback: Callable[[int, nn.Module, float], None] | None = None,
) -> list[float]:
    """``steps`` Adam steps on the batches ``next_batch()`` returns; the loss of every step.
    ``callback(step, model, loss)``, when given, runs after each step (``step`` from 1; the
    parameters' ``.grad`` still hold that step's gradient); training mode is restored after it."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        src, tgt_in, tgt_out = next_batch()  # (batch, len) each
        loss = sequence_loss(model(src, tgt_in), tgt_out)  # a scalar
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, model, losses[-1])
            model.train()
    model.eval()
    return losses


def train_toy(
    model: nn.Module,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    callback: Callable[[int, nn.Module, float], None] | None = None,
) -> list[float]:
    """Train ``model`` on fresh :func:`toy_batch` batches with Adam; the loss of every step.

    ``callback(step, model, loss)``, when given, runs after every step (``step`` counted from
    1), e.g. a :class:`StepTrace`; it may switch the model to evaluation mode, and training
    mode is restored after it. It does not change the steps taken."""
    check_positive_int("steps", steps)
    if callback is not None:
        check_callable("callback", callback)
    generator = torch.Generator().manual_seed(seed)
    return _adam_steps(model, steps, lr, lambda: toy_batch(batch_size, generator), callback)


def teacher_forced_accuracy(model: nn.Module, *, batch_size: int = 200, seed: int = 1) -> float:
    """Share of target tokens predicted right when the decoder reads the true previous tokens
    (teacher forcing), on the fresh toy batch that :func:`greedy_accuracy` decodes."""
    src, tgt_in, tgt_out = toy_batch(batch_size, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (model(src, tgt_in).argmax(-1) == tgt_out).float().mean().item()


class StepTrace:
    """A ``callback`` for :func:`train_toy` that records every step's gradient norm
    (``grad``) and update norm (``update``: how far the optimiser moved the weights, both over
    all parameters), and every ``every`` steps, in evaluation mode, ``measure(model)`` in
    ``checkpoints[step]``. Build it before training: it keeps the weights to measure the first
    update from."""

    def __init__(
        self,
        model: nn.Module,
        *,
        every: int = 50,
        measure: Callable[[nn.Module], Any] | None = None,
    ) -> None:
        check_positive_int("every", every)
        self.every, self.measure = every, measure
        self.grad: list[float] = []
        self.update: list[float] = []
        self.checkpoints: dict[int, Any] = {}
        self._previous = [p.detach().clone() for p in model.parameters()]

    def __call__(self, step: int, model: nn.Module, loss: float) -> None:
        with torch.no_grad():
            params = [p.detach() for p in model.parameters()]
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            self.grad.append(math.sqrt(sum((g**2).sum().item() for g in grads)))
            moved = sum(((p - b) ** 2).sum().item() for p, b in zip(params, self._previous))
            self.update.append(math.sqrt(moved))
            self._previous = [p.clone() for p in params]
        if self.measure is not None and step % self.every == 0:
            model.eval()
            self.checkpoints[step] = self.measure(model)


def greedy_accuracy(
    model: nn.Module,
    decode: Callable[..., Tensor] = greedy_decode,
    *,
    batch_size: int = 200,
    seed: int = 1,
    one_by_one: bool = False,
) -> float:
    """Share of target tokens (``<eos>`` included) that ``decode(model, src, max_len)`` gets
    right on a fresh toy batch; ``one_by_one`` calls it on one sentence at a time."""
    src, _, tgt_out = toy_batch(batch_size, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if one_by_one:
            rows = [decode(model, src[b : b + 1], tgt_out.shape[1]) for b in range(batch_size)]
            out = torch.cat(rows)  # (batch, len)
        else:
            out = decode(model, src, tgt_out.shape[1])  # (batch, len)
    return (out == tgt_out).float().mean().item()


def reference_model(model: Transformer) -> ReferenceTransformer:
    """A :class:`companion.model.Transformer` of the same sizes with ``model``'s weights.

    The parameters of the clinic model carry the package's names, so this is one
    ``load_state_dict`` (``strict``: a missing, extra or differently shaped weight raises).
    """
    sizes = model.sizes
    config = TransformerConfig(
        src_vocab=sizes["vocab_size"], tgt_vocab=sizes["vocab_size"], d_model=sizes["d_model"],
        num_heads=sizes["num_heads"], num_layers=sizes["num_layers"], d_ff=sizes["d_ff"],
        dropout=0.0, max_len=sizes["max_len"], src_pad_id=sizes["pad_id"],
        tgt_pad_id=sizes["pad_id"], norm_first=False,
    )  # fmt: skip
    reference = ReferenceTransformer(config)
    reference.load_state_dict(model.state_dict())
    return reference.eval()


def parity(model: Transformer, src: Tensor, tgt: Tensor) -> float:
    """Largest difference between ``model(src, tgt)`` and the package's model with the same
    weights (:func:`reference_model`); about ``1e-6`` for a correct model, ``inf`` when either
    output holds a NaN (so ``gap < tol`` fails on it)."""
    reference = reference_model(model)
    model.eval()
    with torch.no_grad():
        return (model(src, tgt) - reference(src, tgt)).abs().max().nan_to_num(float("inf")).item()


def gradient_parity(
    model: Transformer, src: Tensor, tgt_in: Tensor, tgt_out: Tensor
) -> tuple[float, str | None]:
    """Parity of the backward pass: after one ``backward()`` of :func:`sequence_loss` on the same
    batch in ``model`` and in :func:`reference_model` (evaluation mode, the same weights), the
    largest difference between a parameter's gradient in the two models, and the name of the
    trusted parameter where it is largest (``None`` when every gradient agrees exactly).

    A missing gradient counts as zeros, so a parameter the model detaches shows its whole
    trusted gradient. A module the model shares under two names gets the sum of both uses'
    gradients, where the trusted model has two modules: forward parity passes on both bugs,
    this test does not. About ``1e-7`` for a correct model. The model's gradients are cleared
    before and after."""
    trusted = reference_model(model).train(False)
    was_training = model.training
    model.eval()
    try:
        for net in (model, trusted):
            net.zero_grad(set_to_none=True)
            sequence_loss(net(src, tgt_in), tgt_out).backward()
        ours = dict(model.named_parameters(remove_duplicate=False))  # a shared module: both names
        gaps = {}
        for name, theirs in trusted.named_parameters():
            mine = ours[name].grad if name in ours else None
            mine = torch.zeros_like(theirs) if mine is None else mine
            other = torch.zeros_like(theirs) if theirs.grad is None else theirs.grad
            gaps[name] = (mine - other).abs().max().nan_to_num(float("inf")).item()
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    worst = max(gaps, key=gaps.get)
    return gaps[worst], (worst if gaps[worst] > 0 else None)


def first_mismatch(
    model: nn.Module, trusted: nn.Module, *inputs: Tensor, tol: float = 1e-5
) -> str | None:
    """Where a parity gap starts: the name of the first module of ``model`` (in the order the
    modules finish their forward pass) whose tensor inputs agree with the module of the same
    name in ``trusted`` and whose output differs by more than ``tol``; ``""`` names the whole
    model, ``None`` means that no module differs. Both models run once on ``inputs`` in
    evaluation mode; forward hooks keep each module's first inputs and output (of a tuple
    output, its first entry)."""
    # (0 for model or 1 for trusted, module name) -> (inputs, output) of the module's first call
    calls: dict[tuple[int, str], tuple[tuple, Any]] = {}

    def keeper(key: tuple[int, str]) -> Callable[..., None]:
        def keep(module: nn.Module, args: tuple, output: Any) -> None:  # None: output unchanged
            calls.setdefault(key, (args, output))

        return keep

    hooks = [
        module.register_forward_hook(keeper((which, name)))
        for which, net in enumerate((model, trusted))
        for name, module in net.named_modules()
    ]
    try:
        with torch.no_grad():
            model.eval()(*inputs)
            trusted.eval()(*inputs)
    finally:
        for hook in hooks:
            hook.remove()

    def differ(a: Any, b: Any) -> bool:
        a, b = (x[0] if isinstance(x, tuple) else x for x in (a, b))
        return a.shape != b.shape or not torch.allclose(a.float(), b.float(), rtol=0, atol=tol)

    for (which, name), (args, out) in calls.items():  # the model's modules, in finishing order
        if which == 1 or (1, name) not in calls:
            continue
        trusted_args, trusted_out = calls[(1, name)]
        ours = [a for a in args if torch.is_tensor(a)]
        theirs = [a for a in trusted_args if torch.is_tensor(a)]
        if (
            len(ours) == len(theirs)
            and not any(map(differ, ours, theirs))
            and differ(out, trusted_out)
        ):
            return name
    return None


def nan_positions(
    model: Transformer, src: Tensor, tgt: Tensor, row: int = 0
) -> dict[str, list[int]]:
    """Where NaN appears and how it spreads: for each decoder layer of a clinic
    :class:`Transformer` (``"decoder layer 1"``, ...) and for the ``"logits"``, the target
    positions of sentence ``row`` whose vector holds a NaN. One forward pass in evaluation
    mode; forward hooks keep each decoder layer's output."""
    outputs: dict[str, Tensor] = {}
    hooks = [
        layer.register_forward_hook(
            lambda module, args, out, key=f"decoder layer {k + 1}": outputs.update({key: out})
        )
        for k, layer in enumerate(model.decoder.layers)
    ]
    try:
        with torch.no_grad():
            outputs["logits"] = model.eval()(src, tgt)  # (batch, tgt_len, vocab)
    finally:
        for hook in hooks:
            hook.remove()
    return {
        key: torch.isnan(out[row]).any(dim=-1).nonzero().flatten().tolist()  # (tgt_len,) -> ids
        for key, out in outputs.items()
    }


def causal_leak(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    """``(tgt_len, tgt_len)`` boolean: ``[i, j]`` is ``True`` when changing decoder input token
    ``j`` changes the logits at position ``i``. A decoder that does not leak gives the lower
    triangle (``j <= i``) at most; anything above the diagonal is a leak from the future.

    The dependence matrix of :func:`causal_leak_check` on ``as_logits_fn(model)``: each token
    is replaced by a random other id of the model's output vocabulary (never the model's
    ``pad_id``), so any vocabulary works.

    Args:
        model: maps ``(src (batch, src_len), tgt (batch, tgt_len))`` to ``(batch, tgt_len,
            vocab)``.
        src, tgt: shapes ``(batch, src_len)`` and ``(batch, tgt_len)`` (one example is enough).
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    pad_id = getattr(model, "pad_id", None)
    finding = causal_leak_check(
        as_logits_fn(model), (src, tgt), pad_id=pad_id if isinstance(pad_id, int) else None
    )
    return finding.details["dependence"]


def is_permutation_equivariant(fn: Callable[[Tensor], Tensor], x: Tensor, seed: int = 0) -> bool:
    """Whether permuting the tokens of ``x (batch, len, d)`` permutes ``fn(x)`` the same way, as
    self-attention without positions must (:func:`permutation_equivariance`, as a bool)."""
    return permutation_equivariance(fn, x, seed=seed).passed


def overfit_one_batch(
    model: nn.Module, steps: int = 100, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Train on one fixed batch of 16 toy examples: a correct model drives the loss towards 0."""
    batch = toy_batch(16, torch.Generator().manual_seed(seed))
    return _adam_steps(model, steps, lr, lambda: batch)


# --------------------------------------------------------------------------------------------
# Diagnostics for any model: the adapter and the result
# --------------------------------------------------------------------------------------------

#: The adapter every diagnostic takes: token ids → logits. Decoder-only, ``fn(ids)`` with
#: ``ids (batch, len)`` → ``(batch, len, vocab)``; encoder-decoder, ``fn(src, tgt_in)`` with
#: ``(batch, src_len)`` and ``(batch, tgt_len)`` → ``(batch, tgt_len, vocab)``.
LogitsFn = Callable[..., Tensor]

Inputs = Tensor | Sequence[Tensor]


@dataclass(frozen=True)
class Finding:
    """What one diagnostic found.

    Attributes:
        test: the diagnostic's name, as chapter 11 names its tests, e.g. ``"causal leak"``,
            ``"batch independence"``.
        passed: whether the model passed.
        summary: one line with the numbers.
        details: the measurements behind it (tensors, floats), for a closer look.
    """

    test: str
    passed: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.test}: {self.summary}"

    def __repr__(self) -> str:
        return f"Finding({self})"


def as_logits_fn(model: nn.Module, *, eval_mode: bool = True) -> LogitsFn:
    """The adapter of a module: ``fn(*ids)`` calls ``model(*ids)`` under ``torch.no_grad()``,
    after ``model.eval()`` when ``eval_mode`` (the default: dropout off), restores the model's
    training mode afterwards, and returns the
    logits ``(batch, len, vocab)``. A tuple or list output gives its first element, an output
    with a ``.logits`` attribute (Hugging Face style) that attribute.

    For a model with another calling convention, write the adapter yourself, e.g.
    ``lambda src, tgt: model(src, tgt, src_mask=None)[0]`` or, for a model that takes
    ``(len, batch)`` ids, ``lambda ids: model(ids.T).transpose(0, 1)``.
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    if not isinstance(eval_mode, bool):
        raise TypeError(f"eval_mode must be a bool, got {type(eval_mode).__name__}")

    def logits_fn(*ids: Tensor) -> Tensor:
        was_training = model.training
        if eval_mode:
            model.eval()
        try:
            with torch.no_grad():
                out = model(*ids)
        finally:
            model.train(was_training)  # a call mid-training leaves dropout as it was
        if isinstance(out, (tuple, list)):
            out = out[0]
        elif not isinstance(out, Tensor) and hasattr(out, "logits"):
            out = out.logits
        return out

    return logits_fn


def _inputs(inputs: object) -> tuple[Tensor, ...]:
    """One id tensor or a sequence of them → a tuple of ``(batch, len)`` id tensors, one batch."""
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)) or not inputs:
        raise TypeError(
            "inputs must be a (batch, seq) tensor of token ids or a tuple of them (e.g. "
            f"(src, tgt_in)), got {type(inputs).__name__}"
        )
    checked = []
    for i, ids in enumerate(inputs):
        name = f"inputs[{i}]"
        check_token_ids(name, ids)
        check_ndim(name, ids, 2, "(batch, seq)")
        if ids.shape[0] != inputs[0].shape[0]:
            raise ValueError(
                f"every input must have the batch size of inputs[0], {inputs[0].shape[0]}; "
                f"{name} has shape {shape_str(ids.shape)}"
            )
        checked.append(ids)
    return tuple(checked)


def _logits(fn: LogitsFn, inputs: tuple[Tensor, ...]) -> Tensor:
    """``fn(*inputs)`` checked: a floating ``(batch, len, vocab)`` tensor."""
    out = fn(*inputs)
    check_floating("the logits function's output", out)
    check_ndim("the logits function's output", out, 3, "(batch, seq, vocab)")
    if out.shape[0] != inputs[0].shape[0]:
        raise ValueError(
            f"the logits function's output must have the inputs' batch size "
            f"{inputs[0].shape[0]} first, got shape {shape_str(out.shape)}"
        )
    return out.detach().float()


def _vary_index(inputs: tuple[Tensor, ...], vary: object) -> int:
    if isinstance(vary, bool) or not isinstance(vary, int):
        raise TypeError(f"vary must be an int (an index into inputs), got {type(vary).__name__}")
    if not -len(inputs) <= vary < len(inputs):
        raise ValueError(f"vary must index one of the {len(inputs)} input(s), got {vary}")
    return vary % len(inputs)


def _replace(inputs: tuple[Tensor, ...], index: int, ids: Tensor) -> tuple[Tensor, ...]:
    return inputs[:index] + (ids,) + inputs[index + 1 :]


def _check_pad(pad_id: object, vocab_size: int, optional: bool = True) -> int | None:
    if pad_id is None and optional:
        return None
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"pad_id must be an int{' or None' if optional else ''}, got {pad_id!r}")
    if not 0 <= pad_id < vocab_size:
        raise ValueError(f"pad_id must be in 0 … {vocab_size - 1} (the vocabulary), got {pad_id}")
    return pad_id


def _other_ids(
    current: Tensor, vocab_size: int, pad_id: int | None, generator: torch.Generator
) -> Tensor:
    """``current (batch,)`` → random ids ``(batch,)`` of ``range(vocab_size)``, each different
    from its current id and from ``pad_id``."""
    allowed = [i for i in range(vocab_size) if i != pad_id]
    picks = []
    for token in current.tolist():
        choices = [i for i in allowed if i != token]
        if not choices:
            raise ValueError(
                f"vocab_size={vocab_size} leaves no other id to substitute for {token}"
            )
        picks.append(choices[int(torch.randint(len(choices), (), generator=generator))])
    return torch.tensor(picks, dtype=current.dtype, device=current.device)  # (batch,)


# --------------------------------------------------------------------------------------------
# Diagnostics for any model
# --------------------------------------------------------------------------------------------


def causal_leak_check(
    fn: LogitsFn,
    inputs: Inputs,
    *,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    vary: int = -1,
    atol: float = 1e-5,
    seed: int = 0,
) -> Finding:
    """Whether any output of a causal decoder reads a later token, by perturbation.

    For each position ``j`` of ``inputs[vary]`` (default: the last input, the decoder's), the
    token of every row is replaced by a random other id of ``range(vocab_size)`` (never
    ``pad_id``), and the outputs are compared: output ``i < j`` must not move by more than
    ``atol``. Cost: ``len + 1`` calls of ``fn``.

    Args:
        fn: the adapter; its output ``(batch, len, vocab)`` must be aligned with
            ``inputs[vary]`` (output ``i`` predicts from tokens ``≤ i``).
        inputs: ``(batch, len)`` ids, or a tuple in ``fn``'s order, e.g. ``(src, tgt_in)``.
        vocab_size: the ids to draw from; default the logits' last axis.
        pad_id: an id never drawn (a model may treat it specially); ``None``: none.
        vary: which input to perturb.
        atol: the change that counts as a dependence.
        seed: the substitutes' generator.

    Returns:
        A :class:`Finding`; ``details["dependence"]`` is the ``(len, len)`` boolean matrix
        ``[i, j]`` = output ``i`` moved when token ``j`` changed, ``details["change"]`` the
        largest change.

    Limits: a perturbation only shows the dependences that the substitutes reveal. A leak
    that reads a property the substitute shares with the original token (for instance, only
    whether the later token is padding, which the substitutes never are), or a leak smaller
    than ``atol``, passes. It also does not see a leak on a path that ``fn`` never runs: a
    key/value cache it does not use, or a statistic computed only in training mode (BatchNorm
    over the sequence) when ``fn`` runs the model in ``eval()``. The gradient test (``∂ logits[:, t] / ∂ embeddings[:, t']`` must be
    zero for ``t' > t``) sees every differentiable dependence but needs the embeddings, that
    is, the model's internals; this one needs only the adapter.
    """
    check_callable("fn", fn, "a logits function (ids → logits)")
    inputs = _inputs(inputs)
    index = _vary_index(inputs, vary)
    check_nonnegative_float("atol", atol)
    base = _logits(fn, inputs)  # (batch, seq_out, vocab)
    ids = inputs[index]  # (batch, len)
    seq_len = ids.shape[1]
    if base.shape[1] != seq_len:
        raise ValueError(
            f"the logits must have one position per token of inputs[{vary}] ({seq_len}) to compare "
            f"output i with token j, got logits of shape {shape_str(base.shape)}"
        )
    vocab = (
        base.shape[-1] if vocab_size is None else check_positive_int("vocab_size", vocab_size, 2)
    )
    pad = _check_pad(pad_id, vocab)
    generator = torch.Generator().manual_seed(seed)
    change = torch.zeros(seq_len, seq_len)  # (len, len): [i, j] largest change of output i, token j
    for j in range(seq_len):
        changed = ids.clone()  # (batch, len)
        changed[:, j] = _other_ids(ids[:, j], vocab, pad, generator)
        out = _logits(fn, _replace(inputs, index, changed))  # (batch, len, vocab)
        change[:, j] = (out - base).abs().amax(dim=(0, 2)).nan_to_num(float("inf")).cpu()
    dependence = change > atol  # (len, len)
    future = dependence.triu(1)
    pairs = seq_len * (seq_len - 1) // 2
    details = {"dependence": dependence, "change": change}
    if future.any():
        i, j = (int(v) for v in future.nonzero()[0])
        worst = change.triu(1).max().item()
        summary = (
            f"{int(future.sum())} of {pairs} (output, later token) pairs leak, e.g. output {i} "
            f"moves when token {j} changes; largest change {worst:.2g}"
        )
        return Finding("causal leak", False, summary, details)
    own = int(dependence.diagonal().sum())
    summary = (
        f"no output moved when a later token changed ({pairs} pairs, largest change "
        f"{change.triu(1).max().item() if seq_len > 1 else 0.0:.1g}); {own} of {seq_len} outputs "
        f"read their own token"
    )
    return Finding("causal leak", True, summary, details)


def causal_leak_gradient(
    model: nn.Module,
    inputs: Inputs,
    embedding: nn.Module,
    *,
    vary: int = -1,
    forward: Callable[..., Tensor] | None = None,
    atol: float = 0.0,
    seed: int = 0,
) -> Finding:
    """Whether any output of a causal decoder reads a later token, by gradients:
    ``∂ logits[:, t] / ∂ e[:, t']`` must be zero for every ``t' > t``, where ``e`` is the output
    of ``embedding`` on ``inputs[vary]``.

    A forward hook on ``embedding`` (the module that turns the ids of ``inputs[vary]`` into
    vectors, e.g. ``model.tgt_embedding``; a table shared with the source is fine, the call on
    ``inputs[vary]`` is the one used) makes its output a leaf of the graph. For each output
    position ``t``, one backward pass of ``logits[:, t] @ r`` (``r`` a fixed random vector:
    a plain sum would miss outputs that always sum to a constant, such as probabilities)
    gives the gradient at every input position. It sees every differentiable dependence,
    however small, with no choice of substitute tokens; it needs the embedding module, and
    ``len`` backward passes.

    Args:
        model: the module (put in eval mode).
        inputs: ``(batch, len)`` ids or a tuple in ``forward``'s order, e.g. ``(src, tgt_in)``.
        embedding: the sub-module whose output is differentiated against.
        vary: which input's embedding (default the last input, the decoder's).
        forward: ``forward(*inputs)`` → logits ``(batch, len, vocab)`` with gradients; default
            ``model`` itself.
        atol: the gradient size that counts as a dependence.

    Returns:
        A :class:`Finding`; ``details["dependence"]`` is the ``(len, len)`` boolean matrix,
        ``details["gradient"]`` the largest gradient entry of each pair.
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    check_instance("embedding", embedding, nn.Module, "a torch.nn.Module (the embedding)")
    inputs = _inputs(inputs)
    index = _vary_index(inputs, vary)
    check_nonnegative_float("atol", atol)
    forward = model if forward is None else check_callable("forward", forward)
    ids = inputs[index]  # (batch, len)
    captured: dict[str, Tensor] = {}

    def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        given = args[0] if args else None
        if "e" not in captured and isinstance(given, Tensor) and given.shape == ids.shape:
            if given is ids or torch.equal(given, ids):
                captured["e"] = output.detach().requires_grad_(True)  # (batch, len, d)
                return captured["e"]
        return None

    handle = embedding.register_forward_hook(hook)
    try:
        model.eval()
        with torch.enable_grad():
            out = forward(*inputs)  # (batch, len, vocab)
    finally:
        handle.remove()
    if "e" not in captured:
        raise ValueError(
            f"embedding was never called on inputs[{vary}] of shape {shape_str(ids.shape)}: "
            "pass the module that embeds those ids"
        )
    check_floating("the model's output", out)
    check_ndim("the model's output", out, 3, "(batch, seq, vocab)")
    seq_len = ids.shape[1]
    if out.shape[1] != seq_len:
        raise ValueError(
            f"the logits must have one position per token of inputs[{vary}] ({seq_len}), got "
            f"shape {shape_str(out.shape)}"
        )
    probe = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(seed))  # (vocab,)
    probe = probe.to(out.device, out.dtype)
    gradient = torch.zeros(seq_len, seq_len)  # (len, len): [t, t'] largest |∂ out_t / ∂ e_t'|
    for t in range(seq_len):
        (grad,) = torch.autograd.grad((out[:, t] @ probe).sum(), captured["e"], retain_graph=True,
                                      allow_unused=True)  # fmt: skip
        if grad is not None:
            gradient[t] = grad.abs().amax(dim=(0, 2)).nan_to_num(float("inf")).float().cpu()
    dependence = gradient > atol  # (len, len)
    future = dependence.triu(1)
    pairs = seq_len * (seq_len - 1) // 2
    details = {"dependence": dependence, "gradient": gradient}
    if future.any():
        t, later = (int(v) for v in future.nonzero()[0])
        summary = (
            f"{int(future.sum())} of {pairs} (output, later token) pairs have a gradient, e.g. "
            f"output {t} on token {later}; largest {gradient.triu(1).max().item():.2g}"
        )
        return Finding("causal leak (gradient)", False, summary, details)
    largest = gradient.triu(1).max().item() if seq_len > 1 else 0.0
    summary = f"no output has a gradient on a later token ({pairs} pairs, largest {largest:.2g})"
    return Finding("causal leak (gradient)", True, summary, details)


def permutation_equivariance(
    fn: Callable[[Tensor], Tensor], x: Tensor, *, axis: int = 1, seed: int = 0, atol: float = 1e-5
) -> Finding:
    """Whether permuting the tokens of ``x`` permutes ``fn(x)`` the same way, as self-attention
    (and any layer without positions) must: ``fn(x[:, order]) == fn(x)[:, order]``.

    Args:
        fn: a function of vectors, e.g. ``lambda t: attention(t, t, t)``; ``x (batch, len,
            d)`` → ``(batch, len, d_out)``.
        x: ``(batch, len, d)`` floating.
        axis: the token axis (1 for batch-first tensors).
        seed: the permutation's generator.
        atol: the largest difference allowed.
    """
    check_callable("fn", fn, "a function of a (batch, seq, d) tensor")
    check_floating("x", x)
    check_ndim("x", x, 3, "(batch, seq, d)")
    if axis not in (0, 1, -3, -2):
        raise ValueError(f"axis must be the token axis of x, 0 or 1, got {axis}")
    check_nonnegative_float("atol", atol)
    seq_len = x.shape[axis]
    order = torch.randperm(seq_len, generator=torch.Generator().manual_seed(seed))  # (len,)
    with torch.no_grad():
        out = fn(x)  # (batch, len, d_out)
        permuted = fn(x.index_select(axis, order))  # (batch, len, d_out)
    if permuted.shape != out.shape or out.shape[axis] != seq_len:
        raise ValueError(
            f"fn must keep the token axis: x {shape_str(x.shape)} gave {shape_str(out.shape)}"
        )
    gap = (permuted - out.index_select(axis, order)).abs().max().item()
    passed = gap <= atol
    verdict = "permutes with its input" if passed else "does not permute with its input"
    summary = f"the output {verdict} ({seq_len} tokens, largest difference {gap:.2g})"
    return Finding("permutation equivariance", passed, summary, {"gap": gap, "order": order})


def batch_independence(fn: LogitsFn, inputs: Inputs, *, atol: float = 1e-4) -> Finding:
    """Whether each sentence's logits depend on that sentence only: not on its row, not on
    the other rows. Every sentence is run alone (a batch of one), and its logits must equal
    its row of the batched logits to within ``atol``: ``batch + 1`` calls of ``fn``.

    Running every row alone is what it takes: reversing the batch misses a mix that is
    symmetric in the rows (a batch mean, rows 1 and 3 reading each other), running one or two
    rows alone misses a mix among the others, and redrawing the other rows misses a code of
    the row index. Catches attention or a position table along the batch axis
    (``batch_first`` confusion), and BatchNorm in training mode. ``atol`` is ``1e-4``: a
    batch of one may take other float32 kernels.

    Args:
        fn: the adapter, ``fn(*inputs)`` → ``(batch, len, vocab)``.
        inputs: ``(batch, len)`` ids (batch ≥ 2), or a tuple in ``fn``'s order.
        atol: the largest difference allowed between a sentence alone and in the batch.
    """
    check_callable("fn", fn, "a logits function (ids → logits)")
    inputs = _inputs(inputs)
    check_nonnegative_float("atol", atol)
    batch = inputs[0].shape[0]
    if batch < 2:
        raise ValueError(f"batch_independence needs a batch of at least 2, got {batch}")
    base = _logits(fn, inputs)  # (batch, len, vocab)
    gaps = {}
    for row in range(batch):
        alone = _logits(fn, tuple(ids[row : row + 1] for ids in inputs))  # (1, len, vocab)
        gaps[f"sentence {row} alone"] = (alone[0] - base[row]).abs().max().item()
    failed = [row for row, gap in enumerate(gaps.values()) if not gap <= atol]
    largest = max(gaps.values())
    if failed:
        summary = (
            f"the logits of sentences {failed} of {batch} depend on the batch "
            f"(largest gap {largest:.2g})"
        )
    else:
        summary = (
            f"each of the {batch} sentences' logits depends on that sentence only "
            f"(largest gap {largest:.2g})"
        )
    return Finding("batch independence", not failed, summary, {"gaps": gaps, "largest": largest})


def padding_invariance(
    fn: LogitsFn,
    inputs: Inputs,
    *,
    pad_id: int,
    vary: int = 0,
    extra: int = 3,
    atol: float = 1e-5,
    side: str = "right",
) -> Finding:
    """Whether adding ``extra`` pads to ``inputs[vary]`` (default the first input: the source
    of an encoder-decoder) leaves the logits of the original positions unchanged, as a correct
    padding mask guarantees. The pads are appended (``side="right"``) or prepended
    (``side="left"``).

    Catches a missing key padding mask (``padding_idx`` taken for a mask), a mask on the
    query axis and a loss of position information at the pads. When the output has one
    position per token of ``inputs[vary]`` (a decoder-only model), the original positions are
    the last ``seq_out`` after left pads, else the first ``seq_out``.

    A causal decoder-only model needs ``side="left"``: appended pads come after every real
    token, where the causal mask already hides them, so the right-side test cannot fail there,
    even without any padding mask. Left pads also test the positions and the fill value: a
    model that numbers its positions from the first pad fails, as left-padded batched
    generation would (chapter 5, section 5.7), and so does a mask filled with ``-inf``, which
    leaves a leading pad query no key (its NaN spreads); a model only ever padded on the right
    may accept these.

    Args:
        fn: the adapter, ``fn(*inputs)`` → ``(batch, seq_out, vocab)``.
        inputs: ``(batch, len)`` ids or a tuple in ``fn``'s order.
        pad_id: the padding id.
        vary: which input gets the pads.
        extra: how many pads to add.
        atol: the largest change allowed.
        side: ``"right"`` (append) or ``"left"`` (prepend).
    """
    check_callable("fn", fn, "a logits function (ids → logits)")
    inputs = _inputs(inputs)
    index = _vary_index(inputs, vary)
    check_positive_int("extra", extra)
    check_nonnegative_float("atol", atol)
    check_choice("side", side, ("right", "left"))
    base = _logits(fn, inputs)  # (batch, seq_out, vocab)
    pad = _check_pad(pad_id, base.shape[-1], optional=False)
    ids = inputs[index]  # (batch, len)
    pads = torch.full((ids.shape[0], extra), pad, dtype=ids.dtype, device=ids.device)
    longer = torch.cat([ids, pads] if side == "right" else [pads, ids], dim=1)
    padded = _logits(fn, _replace(inputs, index, longer))
    if padded.shape[1] < base.shape[1]:
        raise ValueError(
            f"the padded call returned fewer positions ({padded.shape[1]}) than the unpadded "
            f"one ({base.shape[1]})"
        )
    # left pads shift the outputs only when they follow the padded input (decoder-only)
    shift = extra if side == "left" and padded.shape[1] == base.shape[1] + extra else 0
    kept = padded[:, shift : shift + base.shape[1]]  # (batch, seq_out, vocab)
    gap = (kept - base).abs().max().nan_to_num(float("inf")).item()
    passed = gap <= atol
    verdict = "unchanged" if passed else "changed"
    where = "more pads on" if side == "right" else "pads before"
    summary = f"{extra} {where} inputs[{vary}]: logits {verdict}, largest change {gap:.2g}"
    return Finding("padding invariance", passed, summary, {"gap": gap})


def initial_loss_check(
    fn: LogitsFn,
    inputs: Inputs,
    labels: Tensor,
    *,
    pad_id: int | None = None,
    vocab_size: int | None = None,
    tolerance: float = 0.5,
) -> Finding:
    """Whether the cross-entropy of a freshly initialised model is near ``ln V``, the loss of
    a uniform guess. Much above: the logits start too large (a scale slip in the embedding or
    the tied output, a missing ``1/√d_k``); much below: the labels leak into the input.

    Args:
        fn: the adapter, ``fn(*inputs)`` → ``(batch, len, vocab)``.
        inputs: ids or a tuple in ``fn``'s order.
        labels: ``(batch, len)`` ids; ``pad_id`` labels are ignored.
        pad_id: the padding id, or ``None``.
        vocab_size: ``V``; default the logits' last axis.
        tolerance: the largest ``|loss - ln V|`` (nats) that passes.
    """
    check_callable("fn", fn, "a logits function (ids → logits)")
    inputs = _inputs(inputs)
    check_token_ids("labels", labels)
    check_positive_float("tolerance", tolerance)
    logits = _logits(fn, inputs)  # (batch, len, vocab)
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape {shape_str(logits.shape[:2])} (batch, seq) to match the "
            f"logits {shape_str(logits.shape)}, got {shape_str(labels.shape)}"
        )
    vocab = (
        logits.shape[-1] if vocab_size is None else check_positive_int("vocab_size", vocab_size, 2)
    )
    pad = _check_pad(pad_id, logits.shape[-1])
    loss = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100 if pad is None else pad
    ).item()
    expected = math.log(vocab)
    passed = abs(loss - expected) <= tolerance
    summary = (
        f"loss {loss:.3f} at initialisation, ln(vocabulary size {vocab}) = {expected:.3f}: "
        f"{'within' if passed else 'outside'} ±{tolerance:g}"
    )
    return Finding("loss at initialisation", passed, summary, {"loss": loss, "ln_v": expected})


def overfit_check(
    model: nn.Module,
    inputs: Inputs,
    labels: Tensor,
    *,
    pad_id: int | None = None,
    steps: int = 100,
    lr: float = 3e-3,
    threshold: float = 0.05,
    forward: Callable[..., Tensor] | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> Finding:
    """Whether ``steps`` Adam steps on one fixed batch drive the loss below ``threshold``: a
    model that cannot memorise a few examples will not learn from many. **Trains** ``model``
    (train mode during the steps, eval mode after).

    Args:
        model: the module whose ``parameters()`` Adam updates.
        inputs: ids or a tuple, ``forward(*inputs)`` → ``(batch, len, vocab)`` logits.
        labels: ``(batch, len)`` ids.
        pad_id: labels ignored by the default loss; ``None``: none.
        steps, lr: the optimisation.
        threshold: the final loss that passes.
        forward: default ``model`` itself (with gradients, unlike an adapter).
        loss_fn: ``(logits, labels)`` → scalar; default cross-entropy ignoring ``pad_id``.

    Returns:
        A :class:`Finding`; ``details["losses"]`` is the loss of every step.
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    inputs = _inputs(inputs)
    check_token_ids("labels", labels)
    check_positive_int("steps", steps)
    check_positive_float("lr", lr)
    check_positive_float("threshold", threshold)
    forward = model if forward is None else check_callable("forward", forward)
    if loss_fn is None:
        ignore = -100 if pad_id is None else pad_id

        def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
            return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=ignore)

    check_callable("loss_fn", loss_fn)
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("model has no trainable parameters: model.parameters() is empty")
    optimizer = torch.optim.Adam(parameters, lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        loss = loss_fn(forward(*inputs), labels)  # a scalar
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    passed = losses[-1] < threshold
    summary = (
        f"one batch, {steps} steps: loss {losses[0]:.3f} → {losses[-1]:.4f} "
        f"({'below' if passed else 'not below'} {threshold:g})"
    )
    return Finding("overfit one batch", passed, summary, {"losses": losses})


def registration_check(model: nn.Module) -> Finding:
    """Whether every sub-module and weight of ``model`` is registered: no ``nn.Module``,
    ``nn.Parameter`` or tensor that requires a gradient hides in a plain ``list``, ``tuple``
    or ``dict`` attribute. A hidden one is not in ``parameters()`` (the optimiser never
    updates it), not in ``state_dict()`` (never saved) and not moved by ``.to()``. Use
    ``nn.ModuleList``, ``nn.ModuleDict``, ``nn.ParameterList``.

    Returns:
        A :class:`Finding`; ``details["hidden"]`` lists the attribute paths,
        ``details["hidden_parameters"]`` the number of weights they hold.
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    registered = {id(p) for p in model.parameters()}
    hidden: list[str] = []
    hidden_parameters = 0
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_") or not isinstance(value, (list, tuple, dict)):
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                path = f"{prefix + '.' if prefix else ''}{attr}[{key!r}]"
                if isinstance(item, nn.Module):
                    missing = [p for p in item.parameters() if id(p) not in registered]
                    hidden.append(path)
                    hidden_parameters += sum(p.numel() for p in missing)
                elif isinstance(item, Tensor) and item.requires_grad:
                    hidden.append(path)
                    hidden_parameters += item.numel() if id(item) not in registered else 0
    if hidden:
        summary = (
            f"{len(hidden)} module(s) or weight(s) in plain containers, e.g. {hidden[0]}: "
            f"{hidden_parameters:,} weights missing from parameters() and state_dict()"
        )
        return Finding("registration", False, summary, {"hidden": hidden,
                                                          "hidden_parameters": hidden_parameters})  # fmt: skip
    count = sum(p.numel() for p in model.parameters())
    summary = f"every sub-module is registered ({count:,} parameters)"
    return Finding("registration", True, summary, {"hidden": [], "hidden_parameters": 0})


def deterministic_check(fn: LogitsFn, inputs: Inputs, *, atol: float = 0.0) -> Finding:
    """Whether two calls of the evaluation adapter on the same ids give the same logits. They
    differ when dropout (or any sampling) is still on: ``model.eval()`` forgotten.

    Args:
        fn: the adapter as the reader evaluates with it (not :func:`as_logits_fn`, which calls
            ``model.eval()`` itself).
        inputs: ids or a tuple in ``fn``'s order.
        atol: the largest difference allowed (0: bit for bit).
    """
    check_callable("fn", fn, "a logits function (ids → logits)")
    inputs = _inputs(inputs)
    check_nonnegative_float("atol", atol)
    first, second = _logits(fn, inputs), _logits(fn, inputs)
    gap = (first - second).abs().max().item()
    passed = gap <= atol
    hint = (
        ""
        if passed
        else ": dropout still on at evaluation? (model.eval() missing, or dropout that eval() cannot reach)"
    )
    summary = f"two calls on the same ids differ by {gap:.2g}{hint}"
    return Finding("deterministic evaluation", passed, summary, {"gap": gap})


def loss_padding_check(
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    logits: Tensor,
    labels: Tensor,
    *,
    pad_id: int,
    seed: int = 0,
    rtol: float = 1e-5,
) -> Finding:
    """Whether a loss function ignores the padding: (a) changing the logits at the positions
    whose label is ``pad_id`` must not change the loss, (b) appending three padded positions
    to every row must not change it either (a mean over the real tokens, not over all).

    Args:
        loss_fn: ``(logits (batch, len, vocab), labels (batch, len))`` → a scalar.
        logits: ``(batch, len, vocab)`` floating.
        labels: ``(batch, len)`` ids, with some ``pad_id`` for test (a).
        pad_id: the padding id.
        rtol: the relative change allowed.
    """
    check_callable("loss_fn", loss_fn, "a function (logits, labels) → scalar loss")
    check_floating("logits", logits)
    check_ndim("logits", logits, 3, "(batch, seq, vocab)")
    check_token_ids("labels", labels)
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape {shape_str(logits.shape[:2])}, got {shape_str(labels.shape)}"
        )
    pad = _check_pad(pad_id, logits.shape[-1], optional=False)
    check_nonnegative_float("rtol", rtol)
    generator = torch.Generator().manual_seed(seed)
    logits = logits.detach()
    with torch.no_grad():
        base = float(loss_fn(logits, labels))
        noise = torch.randn(logits.shape, generator=generator) * 3  # (batch, len, vocab)
        at_pads = (labels == pad)[..., None]  # (batch, len, 1)
        moved = float(loss_fn(torch.where(at_pads, logits + noise, logits), labels))
        extra_logits = torch.randn(logits.shape[0], 3, logits.shape[-1], generator=generator)
        extra_labels = torch.full((labels.shape[0], 3), pad, dtype=labels.dtype)
        longer = float(
            loss_fn(torch.cat([logits, extra_logits], 1), torch.cat([labels, extra_labels], 1))
        )
    scale = max(abs(base), 1e-12)
    gaps = {
        "pad logits changed": abs(moved - base) / scale,
        "3 pads appended": abs(longer - base) / scale,
    }
    failed = [name for name, gap in gaps.items() if not gap <= rtol]
    pads = int(at_pads.sum())
    verdict = "the loss counts the padding" if failed else "the loss ignores the padding"
    summary = (
        f"{verdict} ({pads} pad labels; the loss changes by {gaps['pad logits changed']:.2%} "
        f"when the pad logits change, by {gaps['3 pads appended']:.2%} when 3 pads are appended)"
    )
    return Finding("loss ignores padding", not failed, summary, {"loss": base, "gaps": gaps})


def label_shift_check(inputs: Tensor, labels: Tensor, *, pad_id: int | None = None) -> Finding:
    """Whether the labels are the decoder input shifted by one: the label of position ``t``
    must be the token read at ``t + 1``, not the token read at ``t``. When ``labels ==
    inputs`` at most positions, the "model" that copies its input scores perfectly and
    training teaches nothing.

    Args:
        inputs: ``(batch, len)`` the ids the decoder reads (``tgt_in``).
        labels: ``(batch, len)`` the ids it is trained to predict.
        pad_id: positions whose label is ``pad_id`` are not counted.

    Returns:
        A :class:`Finding` with ``details["same"]``, the share of labels equal to the input at
        the same position (fails above 0.5), and ``details["next"]``, the share equal to the
        next input.
    """
    check_token_ids("inputs", inputs)
    check_token_ids("labels", labels)
    check_ndim("inputs", inputs, 2, "(batch, seq)")
    if labels.shape != inputs.shape:
        raise ValueError(
            f"labels must have the shape of inputs {shape_str(inputs.shape)}, got "
            f"{shape_str(labels.shape)}"
        )
    real = torch.ones_like(labels, dtype=torch.bool) if pad_id is None else labels != pad_id
    if not real.any():
        raise ValueError("labels has no position that is not pad_id")
    same = ((labels == inputs) & real).sum().item() / real.sum().item()
    real_next = real[:, :-1]  # (batch, len - 1)
    following = ((labels[:, :-1] == inputs[:, 1:]) & real_next).sum().item()
    next_share = following / max(int(real_next.sum()), 1)
    passed = same <= 0.5
    summary = (
        f"labels equal the input at the same position for {same:.0%} of the real tokens and "
        f"the next input for {next_share:.0%}"
        + ("" if passed else ": the labels are not shifted, copying the input wins")
    )
    return Finding("labels shifted", passed, summary, {"same": same, "next": next_share})


# --------------------------------------------------------------------------------------------
# Parity with torch.nn.Transformer after mapping the state_dict
# --------------------------------------------------------------------------------------------


class TorchReference(nn.Module):
    """``torch.nn.Transformer`` (``batch_first=True``, dropout 0) with the parts it lacks: two
    embeddings (``× √d_model`` when ``scale_embedding``), the sinusoidal positions of the paper
    and a generator. Its ``state_dict`` keys, the targets of a key map:

    * ``src_embedding.weight``, ``tgt_embedding.weight`` ``(vocab, d_model)``;
    * ``transformer.encoder.layers.{l}.`` + ``self_attn.in_proj_weight`` ``(3·d_model,
      d_model)`` (query, key, value rows stacked), ``self_attn.in_proj_bias``,
      ``self_attn.out_proj.{weight,bias}``, ``linear1.*`` ``(d_ff, d_model)``, ``linear2.*``,
      ``norm1.*`` (after self-attention), ``norm2.*`` (after the feed-forward network);
    * ``transformer.decoder.layers.{l}.`` + the same with ``multihead_attn.*`` (cross-attention)
      and ``norm1`` / ``norm2`` / ``norm3`` after self-attention / cross-attention / FFN;
    * ``transformer.encoder.norm.*`` and ``transformer.decoder.norm.*`` only when
      ``final_norm``;
    * ``generator.weight`` ``(vocab, d_model)``, and ``generator.bias`` when
      ``generator_bias``.

    ``forward(src (batch, src_len), tgt_in (batch, tgt_len))`` → logits ``(batch, tgt_len,
    tgt_vocab)``, with causal and key padding masks built from ``pad_id``.
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int,
        num_heads: int,
        num_encoder_layers: int,
        num_decoder_layers: int,
        d_ff: int,
        *,
        pad_id: int | None = None,
        norm_first: bool = False,
        final_norm: bool = False,
        activation: str = "relu",
        layer_norm_eps: float = 1e-5,
        scale_embedding: bool = True,
        max_len: int = 512,
        generator_bias: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("d_model", d_model),
                            ("num_heads", num_heads), ("d_ff", d_ff), ("max_len", max_len)):  # fmt: skip
            check_positive_int(name, value)
        check_positive_int("num_encoder_layers", num_encoder_layers, minimum=0)
        check_positive_int("num_decoder_layers", num_decoder_layers, minimum=0)
        check_choice("activation", activation, ("relu", "gelu"))
        self.pad_id, self.d_model, self.scale_embedding = pad_id, d_model, scale_embedding
        self.src_embedding = nn.Embedding(src_vocab, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab, d_model)
        with warnings.catch_warnings():  # the nested-tensor fast path is switched off below
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                d_model=d_model, nhead=num_heads, num_encoder_layers=num_encoder_layers,
                num_decoder_layers=num_decoder_layers, dim_feedforward=d_ff, dropout=0.0,
                activation=activation, layer_norm_eps=layer_norm_eps, batch_first=True,
                norm_first=norm_first,
            )  # fmt: skip
        self.transformer.encoder.enable_nested_tensor = False  # the slow path, exact at pads
        self.transformer.encoder.use_nested_tensor = False
        if not final_norm:
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None
        self.generator = nn.Linear(d_model, tgt_vocab, bias=generator_bias)
        self.register_buffer("positions", sinusoidal_table(max_len, d_model), persistent=False)

    def embed(self, embedding: nn.Embedding, ids: Tensor) -> Tensor:
        """``(batch, len)`` → ``(batch, len, d_model)``: scaled embedding plus positions."""
        scale = math.sqrt(self.d_model) if self.scale_embedding else 1.0
        return embedding(ids) * scale + self.positions[: ids.shape[1]]  # (batch, len, d_model)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """``src (batch, src_len)``, ``tgt_in (batch, tgt_len)`` → ``(batch, tgt_len, vocab)``."""
        tgt_len = tgt_in.shape[1]
        blocked = torch.triu(torch.ones(tgt_len, tgt_len, dtype=torch.bool), 1)  # True: blocked
        src_pads = None if self.pad_id is None else src == self.pad_id  # (batch, src_len)
        tgt_pads = None if self.pad_id is None else tgt_in == self.pad_id  # (batch, tgt_len)
        hidden = self.transformer(
            self.embed(self.src_embedding, src), self.embed(self.tgt_embedding, tgt_in),
            tgt_mask=blocked.to(src.device), src_key_padding_mask=src_pads,
            tgt_key_padding_mask=tgt_pads, memory_key_padding_mask=src_pads,
        )  # fmt: skip
        return self.generator(hidden)  # (batch, tgt_len, vocab)


KeyMap = Mapping[str, str | Sequence[str]] | Callable[[dict[str, Tensor]], Mapping[str, Tensor]]


def clinic_key_map(
    num_layers: int,
    *,
    encoder_prefix: str = "encoder.layers",
    decoder_prefix: str = "decoder.layers",
    src_embedding: str = "src_embedding.embedding.weight",
    tgt_embedding: str = "tgt_embedding.embedding.weight",
    generator_weight: str = "generator.weight",
    generator_bias: str | None = "generator.bias",
) -> dict[str, str | tuple[str, ...]]:
    """The key map of the clinic's layer names (``self_attention.query_proj``, ``feed_forward.
    hidden_proj``, ``self_attention_norm``, ...) onto :class:`TorchReference`: ``{reference key:
    model key}``, a tuple of model keys where the reference stacks several (query, key and
    value into ``in_proj_weight``). The defaults fit :class:`~companion.clinic.patient.
    Transformer`; the prefixes and embedding names adapt it to another model with the same
    layers (:class:`~companion.clinic.patient.ReaderTransformer`: ``encoder_prefix=
    "encoder_layers"``, every embedding and the generator ``"embed.weight"``, no bias). A
    model of other layer names needs its own map: a dict of the same form, or a function
    ``state_dict → {reference key: tensor}``."""
    check_positive_int("num_layers", num_layers)
    for name, value in (("encoder_prefix", encoder_prefix), ("decoder_prefix", decoder_prefix),
                        ("src_embedding", src_embedding), ("tgt_embedding", tgt_embedding),
                        ("generator_weight", generator_weight)):  # fmt: skip
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str (a state_dict key), got {type(value).__name__}")
    if generator_bias is not None and not isinstance(generator_bias, str):
        raise TypeError(
            f"generator_bias must be a str or None, got {type(generator_bias).__name__}"
        )
    key_map: dict[str, str | tuple[str, ...]] = {
        "src_embedding.weight": src_embedding,
        "tgt_embedding.weight": tgt_embedding,
        "generator.weight": generator_weight,
    }
    if generator_bias is not None:
        key_map["generator.bias"] = generator_bias

    def attention(theirs: str, ours: str) -> None:
        for kind in ("weight", "bias"):
            key_map[f"{theirs}.in_proj_{kind}"] = tuple(
                f"{ours}.{proj}_proj.{kind}" for proj in ("query", "key", "value")
            )
            key_map[f"{theirs}.out_proj.{kind}"] = f"{ours}.out_proj.{kind}"

    def others(theirs: str, ours: str, norms: tuple[str, ...]) -> None:
        for kind in ("weight", "bias"):
            key_map[f"{theirs}.linear1.{kind}"] = f"{ours}.feed_forward.hidden_proj.{kind}"
            key_map[f"{theirs}.linear2.{kind}"] = f"{ours}.feed_forward.output_proj.{kind}"
            for number, norm in enumerate(norms, start=1):
                key_map[f"{theirs}.norm{number}.{kind}"] = f"{ours}.{norm}.{kind}"

    for layer in range(num_layers):
        theirs, ours = f"transformer.encoder.layers.{layer}", f"{encoder_prefix}.{layer}"
        attention(f"{theirs}.self_attn", f"{ours}.self_attention")
        others(theirs, ours, ("self_attention_norm", "feed_forward_norm"))
        theirs, ours = f"transformer.decoder.layers.{layer}", f"{decoder_prefix}.{layer}"
        attention(f"{theirs}.self_attn", f"{ours}.self_attention")
        attention(f"{theirs}.multihead_attn", f"{ours}.cross_attention")
        others(theirs, ours, ("self_attention_norm", "cross_attention_norm", "feed_forward_norm"))
    return key_map


def apply_key_map(state: Mapping[str, Tensor], key_map: KeyMap) -> dict[str, Tensor]:
    """``state`` (a model's ``state_dict``) mapped by ``key_map``: ``{reference key: tensor}``.

    ``key_map`` is a dict ``{reference key: model key}`` (a tuple of model keys is concatenated
    along the first axis) or a function ``state_dict → {reference key: tensor}``. A function
    map can start from a dict one and fix a few tensors, e.g. a tied output that the model
    rescales: ``lambda sd: {**apply_key_map(sd, names), "generator.weight": sd["embed.weight"]
    * d_model**-0.5}``.

    Raises:
        ValueError: listing the model keys the map names that ``state`` does not have.
    """
    return _mapped_state(dict(state), key_map)


def _mapped_state(state: dict[str, Tensor], key_map: object) -> dict[str, Tensor]:
    """Apply ``key_map`` to ``state``; a ``ValueError`` lists the model keys it names that the
    model does not have."""
    if callable(key_map):
        mapped = key_map(dict(state))
        if not isinstance(mapped, Mapping):
            raise TypeError(f"key_map(state_dict) must return a dict, got {type(mapped).__name__}")
        return dict(mapped)
    if not isinstance(key_map, Mapping):
        raise TypeError(
            "key_map must be a dict {reference key: model key or tuple of keys} or a function "
            f"state_dict → dict, got {type(key_map).__name__}"
        )
    mapped, absent = {}, []
    for theirs, ours in key_map.items():
        names = (ours,) if isinstance(ours, str) else tuple(ours)
        missing = [name for name in names if name not in state]
        if missing:
            absent.extend(missing)
            continue
        parts = [state[name] for name in names]
        mapped[theirs] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    if absent:
        raise ValueError(
            f"key_map names {len(absent)} key(s) the model's state_dict does not have: "
            f"{', '.join(absent[:6])}{' …' if len(absent) > 6 else ''}"
        )
    return mapped


def _layer_count(mapped: Mapping[str, Tensor], stack: str) -> int:
    prefix = f"transformer.{stack}.layers."
    found = {int(key[len(prefix) :].split(".")[0]) for key in mapped if key.startswith(prefix)}
    return max(found) + 1 if found else 0


def parity_with_torch(
    model: nn.Module,
    key_map: KeyMap,
    src: Tensor,
    tgt_in: Tensor,
    *,
    num_heads: int,
    pad_id: int | None = None,
    forward: LogitsFn | None = None,
    atol: float = 1e-5,
    norm_first: bool = False,
    final_norm: bool = False,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    scale_embedding: bool = True,
) -> Finding:
    """Parity of a plain-PyTorch encoder-decoder with ``torch.nn.Transformer``: map the
    model's ``state_dict`` onto a :class:`TorchReference`, load it strictly, compare logits.

    The sizes (vocabularies, ``d_model``, layers, ``d_ff``) come from the mapped weights;
    ``num_heads`` cannot, so it is an argument. The reference follows the paper: sinusoidal
    positions added to the embeddings ``× √d_model``, Post-LN (``norm_first=False``), ReLU, no
    final norms (``torch.nn.Transformer`` adds them; ``final_norm=True`` keeps them).

    Args:
        model: the module whose ``state_dict()`` is mapped.
        key_map: ``{reference key: model key}`` (a tuple of model keys is concatenated along
            the first axis: query, key, value into ``in_proj_weight``), e.g.
            :func:`clinic_key_map`; or a function ``state_dict → {reference key: tensor}``.
        src, tgt_in: ``(batch, src_len)`` and ``(batch, tgt_len)`` ids.
        num_heads: heads per attention module.
        pad_id: the padding id both models mask (``None``: no padding mask).
        forward: the model's adapter; default :func:`as_logits_fn`\\ ``(model)``.
        atol: the largest logit difference that passes.

    Raises:
        ValueError: the mapped weights do not fit the reference; the message lists the
            reference keys no weight was mapped to, the mapped keys the reference does not
            have, the shape mismatches, and the model's keys the map did not use.
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    check_token_ids("src", src)
    check_token_ids("tgt_in", tgt_in)
    check_ndim("src", src, 2, "(batch, src_len)")
    check_ndim("tgt_in", tgt_in, 2, "(batch, tgt_len)")
    check_positive_int("num_heads", num_heads)
    check_nonnegative_float("atol", atol)
    state = model.state_dict()
    mapped = _mapped_state(state, key_map)
    for needed in ("src_embedding.weight", "tgt_embedding.weight", "generator.weight"):
        if needed not in mapped:
            raise ValueError(
                f"key_map must map {needed!r} (the sizes are read from it); it maps "
                f"{sorted(mapped)[:4]}{' …' if len(mapped) > 4 else ''}"
            )
    src_vocab, d_model = mapped["src_embedding.weight"].shape
    tgt_vocab = mapped["tgt_embedding.weight"].shape[0]
    widths = Counter(v.shape[0] for k, v in mapped.items() if k.endswith("linear1.weight"))
    d_ff = widths.most_common(1)[0][0] if widths else 4 * d_model  # the majority's width
    if d_model % num_heads:
        raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
    reference = TorchReference(
        src_vocab, tgt_vocab, d_model, num_heads, _layer_count(mapped, "encoder"),
        _layer_count(mapped, "decoder"), d_ff, pad_id=pad_id, norm_first=norm_first,
        final_norm=final_norm, activation=activation, layer_norm_eps=layer_norm_eps,
        scale_embedding=scale_embedding, max_len=max(512, src.shape[1], tgt_in.shape[1]),
        generator_bias="generator.bias" in mapped,
    )  # fmt: skip
    expected = reference.state_dict()
    missing = sorted(set(expected) - set(mapped))
    unexpected = sorted(set(mapped) - set(expected))
    mismatched = [
        f"{key}: reference {shape_str(expected[key].shape)}, mapped {shape_str(mapped[key].shape)}"
        for key in sorted(set(expected) & set(mapped))
        if expected[key].shape != mapped[key].shape
    ]
    if missing or unexpected or mismatched:
        used = set()
        if isinstance(key_map, Mapping):
            for ours in key_map.values():
                used.update((ours,) if isinstance(ours, str) else ours)
        unused = sorted(k for k in state if k not in used) if isinstance(key_map, Mapping) else []
        lines = ["the mapped state_dict does not fit torch.nn.Transformer:"]
        for title, keys in (("reference keys with no weight mapped", missing),
                            ("mapped keys the reference does not have", unexpected),
                            ("shape mismatches", mismatched),
                            ("model keys the map does not use", unused)):  # fmt: skip
            if keys:
                shown = "; ".join(keys[:8]) + (f"; … ({len(keys)} in all)" if len(keys) > 8 else "")
                lines.append(f"  {title}: {shown}")
        raise ValueError("\n".join(lines))
    reference.load_state_dict({k: v.detach().to(expected[k].dtype) for k, v in mapped.items()})
    reference.eval()
    fn = as_logits_fn(model) if forward is None else check_callable("forward", forward)
    ours = _logits(fn, (src, tgt_in))  # (batch, tgt_len, vocab)
    with torch.no_grad():
        theirs = reference(src, tgt_in).float()  # (batch, tgt_len, vocab)
    if ours.shape != theirs.shape:
        raise ValueError(
            f"the model gives logits {shape_str(ours.shape)}, torch.nn.Transformer "
            f"{shape_str(theirs.shape)}"
        )
    gap = (ours - theirs).abs().max().nan_to_num(float("inf")).item()
    passed = gap <= atol
    summary = (
        f"largest logit difference {gap:.2g} "
        f"({_layer_count(mapped, 'encoder')}+{_layer_count(mapped, 'decoder')} layers, d_model "
        f"{d_model}, {len(expected)} tensors mapped)"
    )
    return Finding("parity with torch.nn.Transformer", passed, summary,
                   {"gap": gap, "reference": reference})  # fmt: skip


# --------------------------------------------------------------------------------------------
# Examine a patient
# --------------------------------------------------------------------------------------------


def examine(
    patient: Patient, *, batch_size: int = 8, seed: int = 0, decoder_only: bool = False
) -> list[Finding]:
    """Run the diagnostics that need no training on ``patient``
    (:class:`~companion.clinic.patient.Patient`), in this order: deterministic evaluation,
    registration, causal leak, batch independence, padding invariance (of the source),
    loss at initialisation, loss ignores padding, labels shifted (named as in
    chapter 11; deterministic evaluation first, since dropout noise fails every comparison), on a padded batch of
    ``batch_size`` sentences; about half a second on a laptop. The patient's adapter feeds
    every check that calls the model, its loss function only "loss ignores padding" (the loss
    at initialisation is plain cross-entropy with the pads ignored, whatever the patient's
    loss), its label shift only the last. The batch is the patient's own
    (:meth:`~companion.clinic.patient.Patient.batch`: the clinic's padded task, written in the
    patient's ``pad_id``, ``bos_id`` and ``eos_id``), not the reader's data. Read them in order: when two evaluations differ (dropout on), the
    comparisons after it differ too, so the first failure is the one to explain.
    :func:`overfit_check` and :func:`parity_with_torch` are left to the reader (one trains,
    the other needs a key map).

    ``decoder_only=True`` tests a decoder-only model: the patient's adapter takes one input,
    ``ids (batch, len)`` → logits ``(batch, len, vocab)``. The batch is each source of
    :meth:`~companion.clinic.patient.Patient.batch` after a ``<bos>`` (``<bos>``, the symbols,
    ``<eos>``, right pads), split by the patient's ``shift`` into the input ids and the
    labels. The checks are the same, on that one input, except that padding invariance
    prepends the pads (``side="left"``): a causal mask already hides appended pads, so
    appending them cannot fail (:func:`padding_invariance`)."""
    check_instance("patient", patient, Patient, "a clinic Patient")
    check_positive_int("batch_size", batch_size, minimum=2)
    if not isinstance(decoder_only, bool):
        raise TypeError(f"decoder_only must be a bool, got {type(decoder_only).__name__}")
    src, tgt_in, labels = patient.batch(batch_size, seed)  # (batch, src_len), (batch, tgt_len) x2
    fn, vocab, pad = patient.logits, patient.vocab_size, patient.pad_id
    if decoder_only:  # one sequence per sentence: <bos>, symbols, <eos>, pads
        bos = torch.full((src.shape[0], 1), patient.bos_id, dtype=src.dtype)  # (batch, 1)
        tgt_in, labels = patient.shift(torch.cat([bos, src], dim=1))  # (batch, src_len) each
        inputs: tuple[Tensor, ...] = (tgt_in,)
        first_two: tuple[Tensor, ...] = (tgt_in[:2],)
    else:
        inputs, first_two = (src, tgt_in), (src[:2], tgt_in[:2])
    logits = _logits(fn, inputs)  # (batch, tgt_len, vocab)
    side = "left" if decoder_only else "right"
    return [
        deterministic_check(fn, inputs),
        registration_check(patient.model),
        causal_leak_check(fn, first_two, vocab_size=vocab, pad_id=pad),
        batch_independence(fn, inputs),
        padding_invariance(fn, inputs, pad_id=pad, vary=0, side=side),
        initial_loss_check(fn, inputs, labels, pad_id=pad, vocab_size=vocab),
        loss_padding_check(patient.loss, logits, labels, pad_id=pad),
        label_shift_check(tgt_in, labels, pad_id=pad),
    ]
