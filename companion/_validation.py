"""Input checks shared by every module of :mod:`companion`.

Every public function validates its arguments with these helpers, so a wrong input fails
early with a message that names the argument, what was expected and what was given, instead
of broadcasting silently or producing NaN deep inside a matrix product.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")
Method = TypeVar("Method", bound=Callable[..., object])

# ---------------------------------------------------------------------------------------------
# Checks at the edge: a public call validates its inputs once; the calls it makes inside skip
# their own checks (their inputs come from code that has been checked).
# ---------------------------------------------------------------------------------------------

_edge = threading.local()  # _edge.inside: a checked call is running in this thread


def checked(check: str) -> Callable[[Method], Method]:
    """Decorate a public method so that ``self.<check>(*args, **kwargs)`` validates its inputs,
    but only at the **outermost** checked call.

    ``Transformer.forward`` checks ``src`` and ``tgt`` once; the encoder, its layers and their
    attention modules, called from inside, skip their own checks, although each of them checks
    its inputs when a user calls it directly. Under ``torch.compile`` no check runs (a check
    that reads tensor values would synchronise with the host and break the graph): compile a
    model whose inputs you have validated, e.g. by one eager call.

    Args:
        check: name of the method with the same signature that raises on bad input.
    """

    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        def run(self: object, *args: object, **kwargs: object) -> object:
            if not checks_enabled():
                return method(self, *args, **kwargs)
            getattr(self, check)(*args, **kwargs)
            with inputs_checked():
                return method(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def checks_enabled() -> bool:
    """``False`` inside a checked call (its inputs are known to be good) and under
    ``torch.compile``; public functions that are also called from inside the package
    (``fused_linear``, ``causal_mask``) run their checks only when this is ``True``."""
    return not (torch.compiler.is_compiling() or getattr(_edge, "inside", False))


@contextmanager
def inputs_checked() -> Iterator[None]:
    """Inside this block, methods decorated with :func:`checked` skip their checks.

    For loops that call a checked method many times with inputs they built themselves (a
    decoding loop feeding back the ids it chose): validate once, then loop inside the block.
    """
    outer = getattr(_edge, "inside", False)
    _edge.inside = True
    try:
        yield
    finally:
        _edge.inside = outer


def shape_str(shape: Sequence[int | str | None]) -> str:
    """Format a shape like ``(batch, 7, 64)``; strings and ``None`` stand for free sizes."""
    parts = ["?" if s is None else str(s) for s in shape]
    return "(" + ", ".join(parts) + (",)" if len(parts) == 1 else ")")


def check_tensor(name: str, value: object) -> Tensor:
    """Raise ``TypeError`` unless ``value`` is a ``torch.Tensor``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating(name: str, value: object) -> Tensor:
    """Raise ``TypeError`` unless ``value`` is a floating-point tensor."""
    tensor = check_tensor(name, value)
    if not tensor.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (e.g. torch.float32), got dtype {tensor.dtype}"
        )
    return tensor


def check_finite(name: str, tensor: Tensor) -> Tensor:
    """Raise ``ValueError`` if ``tensor`` contains NaN or infinity."""
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s); expected finite values")
    return tensor


def check_ndim(name: str, tensor: Tensor, ndim: int | Sequence[int], layout: str) -> Tensor:
    """Raise ``ValueError`` unless ``tensor.dim()`` is ``ndim`` (or one of several)."""
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if tensor.dim() not in allowed:
        raise ValueError(
            f"{name} must have shape {layout} ({' or '.join(map(str, allowed))}-D), "
            f"got a {tensor.dim()}-D tensor of shape {shape_str(tensor.shape)}"
        )
    return tensor


def check_min_ndim(name: str, tensor: Tensor, ndim: int, layout: str) -> Tensor:
    """Raise ``ValueError`` unless ``tensor`` has at least ``ndim`` dimensions."""
    if tensor.dim() < ndim:
        raise ValueError(
            f"{name} must have shape {layout} (at least {ndim}-D), "
            f"got a {tensor.dim()}-D tensor of shape {shape_str(tensor.shape)}"
        )
    return tensor


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """Raise unless ``value`` is an ``int`` (not bool) that is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_probability(name: str, value: object) -> float:
    """Raise unless ``value`` is a real number in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(value).__name__}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_bool_mask(name: str, mask: object, target_shape: Sequence[int], target: str) -> Tensor:
    """Check a boolean attention mask that must broadcast to ``target_shape``.

    The mask may have fewer dimensions than the target (leading dimensions are added) and
    size-1 dimensions that broadcast, but broadcasting must never *enlarge* the target.
    """
    tensor = check_tensor(name, mask)
    if tensor.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a boolean tensor (True = may attend), got dtype {tensor.dtype}; "
            "convert an additive float mask with companion.masking.from_additive_mask"
        )
    target_shape = tuple(target_shape)
    ok = tensor.dim() <= len(target_shape)
    if ok:
        padded = (1,) * (len(target_shape) - tensor.dim()) + tuple(tensor.shape)
        ok = all(m in (1, t) for m, t in zip(padded, target_shape))
    if not ok:
        raise ValueError(
            f"{name} of shape {shape_str(tensor.shape)} does not broadcast to {target} "
            f"{shape_str(target_shape)}; each mask dimension must be 1 or equal to the target's"
        )
    return tensor


def check_bool(name: str, value: object) -> bool:
    """Raise ``TypeError`` unless ``value`` is a ``bool``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return value


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """Raise ``ValueError`` unless ``value`` is one of the strings in ``choices``."""
    if not isinstance(value, str) or value not in choices:
        expected = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {expected}, got {value!r}")
    return value


def check_divisible(name: str, value: int, divisor_name: str, divisor: int) -> int:
    """Raise ``ValueError`` unless ``value`` is a multiple of ``divisor``."""
    if value % divisor != 0:
        raise ValueError(
            f"{name} must be divisible by {divisor_name}: got {name}={value} and "
            f"{divisor_name}={divisor} ({value} / {divisor} = {value / divisor:.4g})"
        )
    return value


def check_size(name: str, tensor: Tensor, dim: int, expected: int, layout: str) -> Tensor:
    """Raise ``ValueError`` unless ``tensor.shape[dim] == expected``.

    ``layout`` is the expected shape written with names, e.g. ``"(batch, q_len, 64)"``.
    """
    if tensor.shape[dim] != expected:
        raise ValueError(
            f"{name} must have shape {layout} (size {expected} in dimension {dim}), "
            f"got shape {shape_str(tensor.shape)}"
        )
    return tensor


def check_sequence(name: str, x: object, d_model: int, length: str = "len") -> Tensor:
    """Check a batch of vector sequences: a float tensor ``(batch, <length>, d_model)`` without
    NaN or infinity (the input of a layer, a stack or a position encoding)."""
    layout = f"(batch, {length}, {d_model})"
    tensor = check_floating(name, x)
    check_ndim(name, tensor, 3, layout)
    check_size(name, tensor, 2, d_model, layout)
    return check_finite(name, tensor)


def check_integer(name: str, value: object) -> Tensor:
    """Raise ``TypeError`` unless ``value`` is an integer tensor (token ids, positions)."""
    tensor = check_tensor(name, value)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(
            f"{name} must be an integer tensor (e.g. torch.long), got dtype {tensor.dtype}"
        )
    return tensor


def check_index_range(name: str, tensor: Tensor, size: int, what: str) -> Tensor:
    """Raise ``ValueError`` unless every entry of the integer ``tensor`` is in ``[0, size)``.

    ``what`` names the table being indexed, e.g. ``"src_vocab"``.
    """
    if tensor.numel() > 0:
        low, high = int(tensor.min()), int(tensor.max())
        if low < 0 or high >= size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name} must hold ids in [0, {size - 1}] ({what}={size}), got {bad} "
                f"(min {low}, max {high})"
            )
    return tensor


def check_same_dtype(name: str, tensor: Tensor, dtype: torch.dtype, owner: str) -> Tensor:
    """Raise ``TypeError`` unless ``tensor.dtype`` matches ``dtype`` (e.g. a module's weights)."""
    if tensor.dtype != dtype:
        raise TypeError(
            f"{name} must have dtype {dtype} to match {owner}, got dtype {tensor.dtype}"
        )
    return tensor


def check_same_device(name: str, tensor: Tensor, reference: Tensor) -> Tensor:
    """Raise ``ValueError`` unless ``tensor`` is on ``reference``'s device (e.g. a cache kept
    for a module: it is never moved, as the inputs are)."""
    if tensor.device != reference.device:
        raise ValueError(
            f"{name} must be on the module's device {reference.device}, got {tensor.device}"
        )
    return tensor


def check_module_dtype(name: str, tensor: Tensor, module: torch.nn.Module) -> Tensor:
    """Raise ``TypeError`` unless ``tensor`` has the dtype of ``module``'s floating-point
    parameters (e.g. a float64 input to a float32 layer). Skipped under autocast, which mixes
    dtypes on purpose, and for a module without floating-point parameters."""
    if torch.is_autocast_enabled(tensor.device.type):
        return tensor
    for parameter in module.parameters():
        if parameter.is_floating_point():
            owner = f"the parameters of {type(module).__name__}"
            return check_same_dtype(name, tensor, parameter.dtype, owner)
    return tensor


def check_token_ids(name: str, value: object) -> Tensor:
    """Raise ``TypeError`` unless ``value`` is a tensor of ids an embedding can index with:
    dtype ``torch.long`` or ``torch.int32`` (``nn.Embedding`` takes no other)."""
    tensor = check_integer(name, value)
    if tensor.dtype not in (torch.long, torch.int32):
        raise TypeError(
            f"{name} must be a torch.long (or torch.int32) tensor of token ids, got dtype "
            f"{tensor.dtype}; convert it with {name}.long()"
        )
    return tensor


def _check_real(name: str, value: object, expected: str) -> float:
    """Raise ``TypeError`` unless ``value`` is an ``int`` or ``float`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} ({value!r})")
    return float(value)


def check_finite_float(name: str, value: object, expected: str = "a finite number") -> float:
    """Raise unless ``value`` is a finite real number; return it as a ``float``.

    ``bool`` is rejected (``TypeError``) although it is an ``int`` subclass; NaN and
    ±infinity are rejected (``ValueError``). ``expected`` words what is wanted in the
    messages, e.g. ``"a finite number"``.
    """
    number = _check_real(name, value, expected)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be {expected}, got {value}")
    return number


def check_nonnegative_float(
    name: str, value: object, expected: str = "a finite number >= 0"
) -> float:
    """Raise unless ``value`` is a finite real number ``>= 0``; return it as a ``float``.

    ``0`` is accepted; ``bool`` is rejected (``TypeError``); negative numbers, NaN and
    ±infinity are rejected (``ValueError``). ``expected`` words what is wanted in the messages.
    """
    number = check_finite_float(name, value, expected)
    if number < 0:
        raise ValueError(f"{name} must be {expected}, got {value}")
    return number


def check_positive_float(
    name: str, value: object, expected: str = "a positive finite number"
) -> float:
    """Raise unless ``value`` is a finite real number ``> 0``; return it as a ``float``.

    ``0`` is rejected, as are ``bool`` (``TypeError``), negative numbers, NaN and ±infinity
    (``ValueError``). ``expected`` words what is wanted in the messages, e.g.
    ``"a positive number of seconds or None"``.
    """
    number = check_finite_float(name, value, expected)
    if number <= 0:
        raise ValueError(f"{name} must be {expected}, got {value}")
    return number


def check_instance(name: str, value: object, kind: type[T], expected: str | None = None) -> T:
    """Raise ``TypeError`` unless ``value`` is an instance of ``kind``; return it.

    ``expected`` words what is wanted in the message (default: ``"a <kind's name>"``), e.g.
    ``"a companion.model.Transformer"`` or ``"a list (or None)"``.
    """
    if not isinstance(value, kind):
        wanted = expected if expected is not None else f"a {kind.__qualname__}"
        raise TypeError(f"{name} must be {wanted}, got {type(value).__name__}")
    return value


def check_callable(name: str, value: object, expected: str = "callable") -> Callable[..., Any]:
    """Raise ``TypeError`` unless ``value`` can be called; return it.

    ``expected`` words what is wanted in the message, e.g. ``"a function (name, module) -> bool"``.
    """
    if not callable(value):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} ({value!r:.80})")
    return value


def check_bool_tensor(name: str, value: object) -> Tensor:
    """Raise ``TypeError`` unless ``value`` is a tensor of dtype ``torch.bool``; return it."""
    tensor = check_tensor(name, value)
    if tensor.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean tensor, got dtype {tensor.dtype}")
    return tensor


def check_qkv(q: object, k: object, v: object) -> None:
    """Check attention inputs ``q (..., q_len, d_k)``, ``k (..., k_len, d_k)`` and
    ``v (..., k_len, d_v)``: floating, one dtype and one device, matching sizes, identical
    leading dimensions (nothing is broadcast). Values are not read (no host synchronisation)."""
    check_floating("q", q)
    check_floating("k", k)
    check_floating("v", v)
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    check_min_ndim("q", q, 2, "(..., q_len, d_k)")
    check_min_ndim("k", k, 2, "(..., k_len, d_k)")
    check_min_ndim("v", v, 2, "(..., k_len, d_v)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k must have the same last dimension d_k as q: q has shape {shape_str(q.shape)}, "
            f"so k must be (..., k_len, {q.shape[-1]}), got {shape_str(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key: k has shape {shape_str(k.shape)}, so v must be "
            f"(..., {k.shape[-2]}, d_v), got {shape_str(v.shape)}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "q, k and v must have identical leading (batch) dimensions - nothing is broadcast: "
            f"got q {shape_str(q.shape)}, k {shape_str(k.shape)}, v {shape_str(v.shape)}"
        )
