"""Measuring attention: peak memory on the CPU, time, and which kernel torch runs.

* :func:`peak_memory_bytes` - the peak of the memory torch allocates on the CPU while a
  function runs (from ``torch.profiler``'s allocation events), to show that
  :func:`companion.efficient_attention.naive_attention` needs memory ``∝ n²`` and
  :func:`companion.efficient_attention.blockwise_attention` ``∝ n``.
* :func:`median_seconds` - the median wall time of a call.
* :func:`sdpa_backend` - which kernel of ``torch.nn.functional.scaled_dot_product_attention``
  runs for given inputs on this machine (FlashAttention proper, memory-efficient, cuDNN or the
  math path); :func:`compare_with_naive` times it against the naive formula.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from companion._validation import (
    check_bool,
    check_callable,
    check_floating,
    check_instance,
    check_positive_int,
    check_probability,
)
from companion.efficient_attention import naive_attention

__all__ = [
    "peak_memory_bytes",
    "median_seconds",
    "SDPA_KERNELS",
    "sdpa_backend",
    "SdpaTiming",
    "compare_with_naive",
]


# ---------------------------------------------------------------------------------------------
# The profiler, without its log lines
# ---------------------------------------------------------------------------------------------

#: Lines torch's profiler (Kineto) writes straight to file descriptor 2 at every start and stop,
#: whatever its log level: ``USDT:… SyncActivityProfilerHandler.cpp:52] profiler_start`` and
#: the like. They are not errors, and in a notebook they would land in the cell's output.
PROFILER_LOG_LINE = re.compile(r"^(USDT|STAGE|INFO|WARNING):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\]")


@contextmanager
def _quiet_profiler() -> Iterator[None]:
    """Run a block with file descriptor 2 sent to a temporary file, then pass on to
    ``sys.stderr`` every line written there that is not one of the profiler's own log lines
    (:data:`PROFILER_LOG_LINE`), so warnings and errors from the block are still seen.

    The profiler writes from C++, below Python's ``sys.stderr``, so only the descriptor can be
    redirected. Where there is no descriptor 2 (an embedded interpreter), the block runs as is.
    """
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as captured:
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            kept = [line for line in text.splitlines(True) if not PROFILER_LOG_LINE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))


# ---------------------------------------------------------------------------------------------
# Measuring memory on the CPU
# ---------------------------------------------------------------------------------------------


def peak_memory_bytes(fn: Callable[..., object], *args: object, **kwargs: object) -> int:
    """Peak of the CPU memory torch allocates while ``fn(*args, **kwargs)`` runs, in bytes.

    Runs ``fn`` once under ``torch.profiler`` with ``profile_memory=True``, which records every
    allocation and free of torch's CPU allocator with its size and time. Replaying them in
    order gives the memory held at each moment relative to the start; the peak is their
    largest running total (0 if ``fn`` allocates nothing). Memory allocated before the call
    (the arguments) does not count; what ``fn`` returns does. Counted: tensors' storage on
    the CPU, autograd's saved tensors and gradients included. Not counted: Python objects and
    GPU memory (use ``torch.cuda.max_memory_allocated``). The allocations are read from the
    profiler's event tree (``kineto_results.experimental_event_tree()``, the data torch's own
    memory profiler uses); they are those of the threads the profiler follows - the calling
    thread and autograd's backward pass, where the operators of
    :mod:`companion.efficient_attention` allocate their results.

    Args:
        fn: the function to measure.
        *args, **kwargs: its arguments.

    Returns:
        The peak, in bytes.
    """
    check_callable("fn", fn)
    with _quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args, **kwargs)
    changes = sorted(_cpu_allocations(prof.profiler.kineto_results.experimental_event_tree()))
    held, peak = 0, 0
    for _, size in changes:
        held += size  # a free has a negative size
        peak = max(peak, held)
    return peak


def _cpu_allocations(nodes: Sequence[Any]) -> Iterator[tuple[int, int]]:
    """``(time_ns, bytes)`` of every CPU allocation (positive) and free (negative) in a
    profiler event tree."""
    for node in nodes:
        kind, fields = node.typed
        if kind.name == "Allocation" and fields.device.type == "cpu":
            yield node.start_time_ns, fields.alloc_size
        yield from _cpu_allocations(node.children)


# ---------------------------------------------------------------------------------------------
# torch's fused kernels: which one runs, and how fast
# ---------------------------------------------------------------------------------------------

#: The operator each backend of ``F.scaled_dot_product_attention`` calls, as the profiler
#: names it.
SDPA_KERNELS: dict[str, SDPBackend] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": SDPBackend.FLASH_ATTENTION,
    "aten::_scaled_dot_product_flash_attention": SDPBackend.FLASH_ATTENTION,
    "aten::_scaled_dot_product_efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
    "aten::_scaled_dot_product_cudnn_attention": SDPBackend.CUDNN_ATTENTION,
    "aten::_scaled_dot_product_fused_attention_overrideable": SDPBackend.OVERRIDEABLE,
    "aten::_scaled_dot_product_attention_math": SDPBackend.MATH,
    "aten::_scaled_dot_product_attention_math_for_mps": SDPBackend.MATH,
}


def sdpa_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    backends: Sequence[SDPBackend] | None = None,
) -> SDPBackend:
    """Which kernel ``torch.nn.functional.scaled_dot_product_attention`` runs for these inputs
    on this machine.

    Calls it once under ``torch.profiler`` and reads the name of the kernel operator it
    dispatched to (:data:`SDPA_KERNELS`). On a CPU, torch 2.x runs its flash-attention CPU
    kernel (``FLASH_ATTENTION``) unless something rules it out - dropout does - and then the
    math path (``MATH``: the formula in separate operators). On a GPU the choice is among
    ``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION`` and ``MATH``, depending
    on the GPU, the dtype, the head size and the mask.

    Args:
        q: ``(batch, heads, q_len, d)`` (any leading dimensions torch accepts).
        k: ``(batch, heads, k_len, d)``.
        v: ``(batch, heads, k_len, d_v)``.
        attn_mask, is_causal, dropout_p: passed to ``scaled_dot_product_attention``.
        backends: if given, only these backends are allowed
            (``torch.nn.attention.sdpa_kernel``); torch raises ``RuntimeError`` when none of
            them can run the inputs.

    Returns:
        The backend that ran, a member of ``torch.nn.attention.SDPBackend``.
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        check_floating(name, tensor)
    check_bool("is_causal", is_causal)
    dropout_p = check_probability("dropout_p", dropout_p)
    with (
        _quiet_profiler(),
        _allowed_backends(backends),
        profile(activities=[ProfilerActivity.CPU]) as prof,
    ):
        F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p
        )  # (..., q_len, d_v)
    names = [event.name for event in prof.events()]
    for name in names:
        if name in SDPA_KERNELS:
            return SDPA_KERNELS[name]
    raise RuntimeError(
        "no known scaled_dot_product_attention kernel among the operators that ran: "
        + ", ".join(sorted(set(names)))
    )


def _allowed_backends(backends: Sequence[SDPBackend] | None) -> AbstractContextManager[None]:
    """A context that allows only ``backends`` (checked), or changes nothing for ``None``."""
    if backends is None:
        return nullcontext()
    check_instance("backends", backends, Sequence, "a sequence of SDPBackend or None")
    if len(backends) == 0:
        raise ValueError("backends must name at least one SDPBackend, got an empty sequence")
    for index, backend in enumerate(backends):
        check_instance(f"backends[{index}]", backend, SDPBackend, "a torch.nn.attention.SDPBackend")
    return sdpa_kernel(list(backends))


def median_seconds(
    fn: Callable[..., object], *args: object, repeats: int = 5, warmup: int = 1
) -> float:
    """Median wall time of ``fn(*args)`` over ``repeats`` calls after ``warmup`` calls, in
    seconds (waiting for the GPU when an argument is a CUDA tensor)."""
    check_callable("fn", fn)
    check_positive_int("repeats", repeats)
    check_positive_int("warmup", warmup, minimum=0)
    for _ in range(warmup):
        fn(*args)
    return statistics.median(_timed(fn, *args) for _ in range(repeats))


def _timed(fn: Callable[..., object], *args: object) -> float:
    """Seconds for one call of ``fn(*args)``, GPU work included."""
    on_gpu = any(isinstance(a, Tensor) and a.is_cuda for a in args)
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if on_gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - start


@dataclass(frozen=True)
class SdpaTiming:
    """What :func:`compare_with_naive` measured: the backend that ran and the median seconds of
    ``scaled_dot_product_attention`` and of :func:`naive_attention` on the same inputs."""

    backend: SDPBackend
    sdpa_seconds: float
    naive_seconds: float

    @property
    def speedup(self) -> float:
        """How many times faster the fused kernel is (naive seconds ÷ sdpa seconds)."""
        return self.naive_seconds / self.sdpa_seconds


def compare_with_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    is_causal: bool = False,
    repeats: int = 5,
    backends: Sequence[SDPBackend] | None = None,
) -> SdpaTiming:
    """Time ``F.scaled_dot_product_attention`` against :func:`naive_attention` (forward only,
    gradients off), interleaved: each repeat times one call of each, alternating which goes
    first, so a change of load affects both.

    Args:
        q: ``(..., q_len, d)``; k: ``(..., k_len, d)``; v: ``(..., k_len, d_v)``.
        is_causal: causal attention in both.
        repeats: timed calls of each, after one warm-up call of each.
        backends: restrict torch's choice (see :func:`sdpa_backend`).

    Returns:
        An :class:`SdpaTiming` with the backend and both medians.
    """
    check_positive_int("repeats", repeats)

    def fused(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with _allowed_backends(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    def naive(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return naive_attention(q, k, v, is_causal=is_causal)

    times: dict[Callable[..., Tensor], list[float]] = {fused: [], naive: []}
    with torch.no_grad():
        backend = sdpa_backend(q, k, v, is_causal=is_causal, backends=backends)
        for fn in times:  # warm-up
            fn(q, k, v)
        for repeat in range(repeats):
            order = (fused, naive) if repeat % 2 == 0 else (naive, fused)
            for fn in order:
                times[fn].append(_timed(fn, q, k, v))
    return SdpaTiming(backend, statistics.median(times[fused]), statistics.median(times[naive]))
