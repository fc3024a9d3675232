"""Training, one step at a time: teacher forcing, the label-smoothed loss, the
inverse-square-root warm-up schedule and one optimiser step.

These are the pieces every chapter that trains a model uses (chapters 3, 5, 6, 7 and 8; the
book prints them with ``inspect.getsource``):

- :func:`shift_targets` splits a target batch ``<bos> y1 … yn <eos>`` into the decoder input
  ``<bos> y1 … yn`` and the labels ``y1 … yn <eos>`` (teacher forcing);
- :func:`sequence_loss` is the cross-entropy over non-padding positions, with label smoothing;
- :func:`inverse_sqrt_warmup` is the learning-rate schedule of "Attention Is All You Need";
- :func:`adam` is the optimiser, with its update fused into one kernel where torch has one;
- :func:`compile_model` wraps a model in ``torch.compile`` the way a training run uses it,
  :func:`allow_tf32` sets the GPU matrix-product precision a training run uses, and
  :func:`autocast_dtype` turns a configuration's ``precision`` into the type of mixed precision;
- :func:`train_step` does one forward + backward + clipped optimiser step and returns its
  :class:`StepStats`.

The rest of chapter 8's training code builds on these, from parts to the whole:
:mod:`companion.checkpoint` (checkpoint files), :mod:`companion.history` (what a run
measured), :mod:`companion.distributed` (process groups), :mod:`companion.trainer` (the
training loop) and :mod:`companion.run` (a whole run from a configuration, and the command
line). ``python -m companion.train --config cpu --out runs/cpu`` is the same command as
``python -m companion.run`` (``--help`` lists the options).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import (
    check_choice,
    check_floating,
    check_index_range,
    check_integer,
    check_ndim,
    check_positive_int,
    check_probability,
    check_tensor,
    checks_enabled,
    shape_str,
)

__all__ = [
    "StepStats",
    "adam",
    "allow_tf32",
    "autocast_dtype",
    "compile_model",
    "grad_scaler",
    "inverse_sqrt_warmup",
    "sequence_loss",
    "shift_targets",
    "train_step",
]


def shift_targets(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Teacher forcing: ``tgt (batch, tgt_len)`` → decoder input and labels, each
    ``(batch, tgt_len - 1)``. Position ``t`` of the input predicts position ``t`` of the labels.
    """
    check_tensor("tgt", tgt)
    check_ndim("tgt", tgt, 2, "(batch, tgt_len)")
    if tgt.shape[1] < 2:
        raise ValueError(
            f"tgt needs at least 2 positions (<bos> and one token), got shape {shape_str(tgt.shape)}"
        )
    return tgt[:, :-1], tgt[:, 1:]  # (batch, tgt_len - 1) each


def sequence_loss(
    logits: Tensor, labels: Tensor, pad_id: int | None = None, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy per non-padding token.

    Args:
        logits: ``(batch, tgt_len, vocab)``, unnormalised scores from the model.
        labels: ``(batch, tgt_len)`` integer token ids in ``[0, vocab)``; positions equal to
            ``pad_id`` are ignored (and may hold any value).
        pad_id: padding id, or ``None`` when nothing is padded.

    Raises:
        TypeError: ``labels`` is not an integer tensor, ``logits`` not a float tensor.
        ValueError: a shape does not match, or a label (other than ``pad_id``) is outside
            ``[0, vocab)``.
        label_smoothing: ε of label smoothing (Szegedy et al., 2016): the target puts
            ``1 - ε`` on the right token and spreads ``ε`` uniformly over the vocabulary.
    """
    check_floating("logits", logits)
    check_ndim("logits", logits, 3, "(batch, tgt_len, vocab)")
    check_integer("labels", labels)
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape {shape_str(logits.shape[:2])} to match logits "
            f"{shape_str(logits.shape)}, got {shape_str(labels.shape)}"
        )
    if pad_id is not None:
        check_positive_int("pad_id", pad_id, minimum=0)
    label_smoothing = check_probability("label_smoothing", label_smoothing)
    if checks_enabled():  # reads the ids (a host sync): not under torch.compile
        real = labels if pad_id is None else labels[labels != pad_id]  # (tokens,)
        check_index_range("labels", real, logits.shape[-1], "vocab, the size of logits")
    ignore_index = -100 if pad_id is None else pad_id
    # (N, vocab) and (N,) int64 ids, what cross_entropy takes
    flat_logits, flat_labels = logits.flatten(0, 1), labels.flatten().long()
    if logits.device.type == "cpu" and not torch.compiler.is_compiling():
        return _SmoothedCrossEntropy.apply(flat_logits, flat_labels, ignore_index, label_smoothing)
    return F.cross_entropy(
        flat_logits, flat_labels, ignore_index=ignore_index, label_smoothing=label_smoothing
    )


class _SmoothedCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(logits, labels, ignore_index, label_smoothing)`` (mean over the
    labels that are not ignored), with the gradient written in one expression.

    Per token, the loss is ``-(1 - ε)·log p[label] - ε·mean(log p)``; its gradient with respect
    to the logits is ``softmax - (1 - ε)·onehot(label) - ε/vocab``. torch's CPU autograd
    reaches the same numbers through the log-softmax, NLL and smoothing backwards (a zero
    fill, a scatter, a broadcast add and a log-softmax backward over the whole
    ``(N, vocab)``); here it is one exponential and two in-place passes.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, ignore_index: int, eps: float) -> Tensor:  # noqa: ANN001
        log_probs = torch.log_softmax(logits, dim=-1)  # (N, vocab)
        counted = labels != ignore_index  # (N,)
        safe_labels = labels.masked_fill(~counted, 0)  # (N,) any valid index where ignored
        nll = -log_probs.gather(1, safe_labels[:, None]).squeeze(1)  # (N,)
        per_token = nll if eps == 0 else (1 - eps) * nll - eps * log_probs.mean(dim=-1)  # (N,)
        weight = (
            counted.to(logits.dtype) / counted.sum()
        )  # (N,) 1/count where counted (NaN if none)
        ctx.save_for_backward(log_probs, safe_labels, weight)
        ctx.eps = eps
        return (per_token * weight).sum()  # ()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # noqa: ANN001
        log_probs, safe_labels, weight = ctx.saved_tensors
        eps, vocab = ctx.eps, log_probs.shape[-1]
        grad_logits = log_probs.exp()  # (N, vocab) softmax
        if eps:
            grad_logits.sub_(eps / vocab)
        grad_logits.scatter_add_(
            1, safe_labels[:, None], torch.full_like(weight[:, None], eps - 1)
        )  # (N, vocab) minus (1 - ε) at each label
        grad_logits.mul_((weight * grad)[:, None])  # (N, vocab) ignored rows become 0
        return grad_logits, None, None, None


def inverse_sqrt_warmup(
    d_model: int, warmup_steps: int, factor: float = 1.0, *, ramp: bool = True
) -> Callable[[int], float]:
    r"""The paper's schedule as a function of the step (for ``torch.optim.lr_scheduler.LambdaLR``
    with a base learning rate of 1):

    .. math:: \text{lr}(s) = \text{factor} \cdot d_\text{model}^{-1/2}
              \cdot \min(s^{-1/2},\; s \cdot \text{warmup}^{-3/2}),

    a linear warm-up for ``warmup_steps`` steps, then decay as :math:`1/\sqrt{s}`. Step ``0``
    (before the first update) is treated as step 1. ``ramp=False`` removes the warm-up and
    nothing else: the rate holds its peak, ``lr(warmup_steps)``, from the first step, then
    decays exactly as with the ramp.
    """
    check_positive_int("d_model", d_model)
    check_positive_int("warmup_steps", warmup_steps)
    if not (isinstance(factor, (int, float)) and factor > 0 and math.isfinite(factor)):
        raise ValueError(f"factor must be a positive finite number, got {factor!r}")
    if not isinstance(ramp, bool):
        raise TypeError(f"ramp must be a bool, got {type(ramp).__name__}")
    first = 1 if ramp else warmup_steps  # without the ramp, earlier steps get the peak

    def lr_at(step: int) -> float:
        step = max(step, first)
        return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    return lr_at


@dataclass
class StepStats:
    """What one training step measured."""

    loss: float  #: mean loss per non-padding target token
    tokens: int  #: non-padding target tokens in the batch
    grad_norm: float  #: gradient norm before clipping
    lr: float  #: learning rate used for this step


def adam(
    parameters: Iterable[nn.Parameter],
    *,
    lr: float = 1.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
) -> torch.optim.Adam:
    """``torch.optim.Adam`` (the paper's β₁ = 0.9, β₂ = 0.98, ε = 1e-9 by default), with its
    update fused into one kernel where torch has one.

    Since torch 2.4, ``fused=True`` updates every parameter in a single kernel on a CPU or a
    GPU. Without it, Adam on a CPU loops over the parameters in Python, a dozen small
    operations each: for the ``cpu`` configuration's 133 parameter tensors, 12.8 ms a step
    against 4.6 ms fused (one thread; ``benchmarks/README.md``). Where torch has no fused
    kernel (an older torch, another device) this is the ordinary ``torch.optim.Adam``; the
    arithmetic is Adam's either way.

    Args:
        parameters: the tensors to train (e.g. ``model.parameters()``).
        lr: learning rate (1.0 when a schedule such as :func:`inverse_sqrt_warmup` multiplies it).
        betas: decay rates of the first and second moment estimates.
        eps: added to the denominator.
    """
    params = list(parameters)
    try:
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, fused=True)
    except RuntimeError as error:  # no fused kernel for these tensors (or this torch)
        if "fused" not in str(error):
            raise
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)


def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile(model, fullgraph=True)``: the whole forward as one graph.

    The model compiles without a graph break (``fullgraph=True`` raises if one appears).
    Bucketed batches change shape at every step: torch compiles for the first shape, once more
    with symbolic sizes at the first new one, and then reuses that graph (a batch of one
    sequence, or of length 1, gets its own). Asking for symbolic sizes from the start
    (``dynamic=True``) made the first compilation of the ``gpu`` configuration take 184 s on
    an H100 against 55 s + 68 s for the two of the default (2026-11-25), so this keeps the
    default. The returned module shares the model's parameters.
    """
    return torch.compile(model, fullgraph=True)


def allow_tf32(device: torch.device | str) -> None:
    """On a CUDA device, let matrix products and convolutions use TensorFloat-32 (much faster,
    accurate enough for training), as :func:`companion.run.train` does; elsewhere nothing.

    A process-wide torch setting: it changes every later CUDA product, not only the model's.
    """
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast_dtype(precision: str, device: torch.device | str) -> torch.dtype | None:
    """The ``torch.autocast`` type of a training step for a configuration's ``precision``
    (:data:`companion.configs.PRECISIONS`) on ``device``; ``None`` means plain float32.

    ``"bf16"`` → ``torch.bfloat16``, ``"fp16"`` → ``torch.float16`` (train it with a
    ``torch.amp.GradScaler``), ``"fp32"`` → ``None``. ``"auto"``: on a CUDA GPU bf16 where it
    supports bf16 (A100, H100, L4) and fp16 where not (T4, V100); on a CPU ``None``.
    """
    check_choice("precision", precision, ("fp32", "bf16", "fp16", "auto"))
    device = torch.device(device)
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def grad_scaler(
    dtype: torch.dtype | None, device: torch.device | str
) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 training on ``device`` (``None`` for float32 and bf16, whose
    range needs none)."""
    if dtype != torch.float16:
        return None
    device_type = torch.device(device).type
    if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        return torch.amp.GradScaler(device_type)
    if device_type != "cuda":
        raise ValueError(f"fp16 training on {device_type} needs torch >= 2.3 (a GradScaler there)")
    return torch.cuda.amp.GradScaler()


def train_step(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    pad_id: int | None = None,
    label_smoothing: float = 0.0,
    clip_norm: float | None = 1.0,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    whole_batch: Callable[[Tensor, Tensor | int], tuple[Tensor, Tensor, Tensor]] | None = None,
) -> StepStats:
    """One step of teacher-forced training of an encoder-decoder.

    Args:
        model: called as ``model(src, decoder_input)`` and returning logits
            ``(batch, tgt_len - 1, vocab)`` (e.g. :class:`companion.model.Transformer`, or
            one wrapped in ``DistributedDataParallel``).
        src: ``(batch, src_len)`` source ids.
        tgt: ``(batch, tgt_len)`` target ids including ``<bos>`` … ``<eos>``.
        optimizer, scheduler: the scheduler (if any) is stepped after the optimiser.
        pad_id: target padding id, ignored by the loss.
        label_smoothing: see :func:`sequence_loss`.
        clip_norm: maximum gradient norm, or ``None`` for no clipping.
        amp_dtype: run the forward pass under ``torch.autocast`` in this type
            (``torch.bfloat16`` or ``torch.float16``, :func:`autocast_dtype`); ``None``: as is.
        scaler: a ``torch.amp.GradScaler`` (fp16): the loss is scaled before the backward
            pass, the gradients unscaled before clipping, and a step whose gradients
            overflowed is skipped.
        whole_batch: only when several processes share each batch (``DistributedDataParallel``):
            maps this process's mean loss and target tokens to the loss to back-propagate and
            the whole batch's mean loss and target tokens
            (:func:`companion.distributed.whole_batch_loss`).
    """
    if amp_dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError(
            f"amp_dtype must be None, torch.bfloat16 or torch.float16, got {amp_dtype}"
        )
    model.train()
    decoder_input, labels = shift_targets(tgt)  # (batch, tgt_len - 1) each
    with torch.autocast(src.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        logits = model(src, decoder_input)  # (batch, tgt_len - 1, vocab)
    if amp_dtype is not None:
        logits = logits.float()  # (batch, tgt_len - 1, vocab) the loss in float32
    loss = sequence_loss(logits, labels, pad_id=pad_id, label_smoothing=label_smoothing)
    tokens = labels.numel() if pad_id is None else (labels != pad_id).sum()
    batch_loss, batch_tokens = loss.detach(), tokens  # what the step reports
    if whole_batch is not None:  # this process holds a share of the batch
        loss, batch_loss, batch_tokens = whole_batch(loss, tokens)
    if not torch.isfinite(batch_loss):
        raise FloatingPointError(f"the loss is {batch_loss.item()}: training diverged")
    lr = optimizer.param_groups[0]["lr"]
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
    else:  # fp16: scaled so that small gradients do not flush to zero
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # the true gradients, for clipping
    max_norm = float("inf") if clip_norm is None else clip_norm
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)  # skipped if a gradient overflowed
        scaler.update()
    if scheduler is not None:
        scheduler.step()
    return StepStats(
        loss=batch_loss.item(), tokens=int(batch_tokens), grad_norm=float(grad_norm), lr=lr
    )


if __name__ == "__main__":
    # ``python -m companion.train`` is the same command line as ``python -m companion.run``. It
    # is run, not imported: this module sits below companion.run, which imports it, and importing
    # companion.train never loads anything above it (tests/test_architecture.py).
    import runpy

    runpy.run_module("companion.run", run_name="__main__", alter_sys=True)
