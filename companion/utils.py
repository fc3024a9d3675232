"""Small helpers used throughout the book: reproducible seeds, the thread policy every chapter
and the command line use, d2l-style shape checks, parameter counts, and a trace of the shapes
every sub-module sees (chapter 7)."""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from companion._validation import check_callable, check_instance, check_tensor, shape_str

__all__ = [
    "set_seed",
    "ThreadChoice",
    "busy_cores",
    "set_threads",
    "check_shape",
    "count_parameters",
    "ShapeRecord",
    "trace_shapes",
    "glue",
    "enable_colab_widgets",
]


def set_seed(seed: int = 0) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators so a run reproduces."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


#: torch's own choice of intra-op threads when ``companion.utils`` was first imported (one per
#: core this process may use, or ``OMP_NUM_THREADS``): the most :func:`set_threads` uses.
TORCH_DEFAULT_THREADS: int = torch.get_num_threads()


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]] | None:
    """``{cpu: (busy ticks, all ticks)}`` from Linux's ``/proc/stat`` for ``cpus``; ``None``
    where there is no such file (macOS, Windows)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    times = {}
    for line in lines:
        name, *ticks = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(t) for t in ticks[:8])
        busy = user + nice + system + irq + softirq + steal
        times[int(name[3:])] = (busy, busy + idle + iowait)
    return times or None


def busy_cores(interval: float = 0.3) -> float | None:
    """How many of this process's cores other work kept busy during the next ``interval``
    seconds (this process sleeps meanwhile), e.g. ``1.0`` beside one CPU-bound process;
    ``None`` where it cannot be measured (no ``/proc/stat``: macOS, Windows)."""
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    before = _cpu_times(cpus)
    if before is None:
        return None
    time.sleep(interval)
    after = _cpu_times(cpus) or {}
    busy = 0.0
    for cpu, (busy_then, total_then) in before.items():
        busy_now, total_now = after.get(cpu, (busy_then, total_then))
        if total_now > total_then:
            busy += (busy_now - busy_then) / (total_now - total_then)
    return busy


@dataclass(frozen=True)
class ThreadChoice:
    """What :func:`set_threads` decided.

    Attributes:
        threads: the intra-op threads torch uses from now on.
        cores: the most it would use (:data:`TORCH_DEFAULT_THREADS`).
        busy: cores kept busy by other work when it looked (``None``: not measured).
        reason: the rule that decided, in words.
    """

    threads: int
    cores: int
    busy: float | None
    reason: str

    def __str__(self) -> str:
        return f"torch uses {self.threads} of {self.cores} threads: {self.reason}"


def set_threads(limit: int | None = None, *, interval: float = 0.3) -> ThreadChoice:
    """The course's one thread policy: give torch the cores that are free now, at least one.

    torch's default is one thread per core. Its threads wait for each other at the end of every
    operation, so when another program takes one of the cores, a two-thread training step waits
    for the slower thread again and again: on the course's 2-core machine, beside one busy
    process, a ``cpu`` step took 3.2 times as long with 2 threads and 1.16 times with 1
    (``benchmarks/README.md``). So this counts the cores other work keeps busy (for
    ``interval`` seconds, from ``/proc/stat``) and uses the rest: on a quiet 2-core machine
    2 threads, beside one busy process 1. The count is taken once; work that starts later
    is not seen.

    Args:
        limit: use at most this many threads (the chapters with tiny tensors pass 1: there
            a second thread costs more in waiting than it gains).
        interval: how long to watch the other work, in seconds.

    The environment variable ``COMPANION_THREADS`` (a positive integer) overrides the rule.
    Where the load cannot be measured (macOS, Windows), torch's default is kept (within
    ``limit``).

    Returns:
        a :class:`ThreadChoice`; ``print`` it to say what was chosen.
    """
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    cores = TORCH_DEFAULT_THREADS
    forced = os.environ.get("COMPANION_THREADS")
    if forced is not None:
        if not forced.strip().isdigit() or int(forced) < 1:
            raise ValueError(f"COMPANION_THREADS must be a positive integer, got {forced!r}")
        threads, busy, reason = int(forced), None, "COMPANION_THREADS is set"
    elif limit is not None and limit <= 1:
        threads, busy, reason = 1, None, "one is enough for this chapter's small tensors"
    else:
        busy = busy_cores(interval)
        if busy is None:
            threads, reason = cores, "torch's default (the load cannot be measured here)"
        else:
            free = len(os.sched_getaffinity(0)) - busy
            threads = max(1, min(cores, math.floor(free + 0.3)))
            reason = f"{busy:.1f} of the cores busy with other work"
        if limit is not None and threads > limit:
            threads, reason = limit, f"{reason}; at most {limit}"
    torch.set_num_threads(threads)
    return ThreadChoice(threads=threads, cores=cores, busy=busy, reason=reason)


def check_shape(tensor: Tensor, shape: Sequence[int | None], name: str = "tensor") -> Tensor:
    """Assert that ``tensor`` has ``shape`` (``None`` matches any size) and return it.

    Example: ``check_shape(scores, (batch, 7, 7), "scores")``.
    """
    check_tensor(name, tensor)
    expected = tuple(shape)
    ok = tensor.dim() == len(expected) and all(
        e is None or e == s for e, s in zip(expected, tensor.shape)
    )
    if not ok:
        raise AssertionError(
            f"{name} should have shape {shape_str(expected)}, got {shape_str(tensor.shape)}"
        )
    return tensor


def count_parameters(module: torch.nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@dataclass(frozen=True)
class ShapeRecord:
    """One call of one sub-module during :func:`trace_shapes`.

    Attributes:
        name: the sub-module's dotted name in the model, e.g. ``"encoder.layers.0.feed_forward"``.
        kind: its class name, e.g. ``"FeedForward"``.
        inputs: the shapes of the tensors passed to it, in order (masks included).
        output: the shape of its output (for a module returning a tuple, of the first element).
    """

    name: str
    kind: str
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]


def _default_include(name: str, module: nn.Module) -> bool:
    """Every sub-module except containers and dropout (they only pass shapes through)."""
    return not isinstance(module, (nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.Dropout))


def trace_shapes(
    model: nn.Module,
    *args: object,
    include: Callable[[str, nn.Module], bool] | None = None,
    **kwargs: object,
) -> list[ShapeRecord]:
    """Run ``model(*args, **kwargs)`` once and record what every sub-module received and
    returned, in the order the calls happened.

    Args:
        model: any ``nn.Module``; it is run under ``torch.no_grad()``, in its current mode.
        args, kwargs: the inputs of one forward call.
        include: ``include(name, module)`` picks the sub-modules to record; default: all but
            containers (``ModuleList``, ...) and ``Dropout``.

    Returns:
        One :class:`ShapeRecord` per call (a module called twice appears twice).
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    if include is not None:
        check_callable("include", include, "a function (name, module) -> bool")
    choose = _default_include if include is None else include
    records: list[ShapeRecord] = []

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple, kw: dict, output: object) -> None:
            given = [*inputs, *kw.values()]
            shapes = tuple(tuple(t.shape) for t in given if isinstance(t, Tensor))
            first = output[0] if isinstance(output, (tuple, list)) and output else output
            out_shape = tuple(first.shape) if isinstance(first, Tensor) else ()
            records.append(ShapeRecord(name, type(module).__name__, shapes, out_shape))

        return record

    handles = [
        module.register_forward_hook(hook(name), with_kwargs=True)
        for name, module in model.named_modules()
        if name and choose(name, module)
    ]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return records


def glue(name: str, value: object) -> int | float | str:
    """Record a number computed in a chapter so that the book's prose can quote it.

    In the built book, ``{glue:text}`name:.1f``` in a markdown cell shows the value recorded
    here (MyST-NB's glue), so the text a reader sees is the number the cell computed, never a
    copy that can drift. The value is converted to a plain Python ``int``/``float``/``str``
    first (a 0-d tensor or NumPy scalar would otherwise be stored as its repr, which the
    ``glue:text`` format spec cannot read). Outside Jupyter, or where MyST-NB is not
    installed, nothing is displayed and the converted value is just returned.

    On Google Colab the markdown shows the raw placeholder (``{glue:text}`name```), not the
    number, so there the value is also printed under the cell as ``name = value`` (floats to 4
    significant digits): the reader finds the number the prose quotes by its key.

    Args:
        name: the key the prose uses, letters, digits and ``_`` only.
        value: a Python/NumPy number, a one-element tensor, or a string.

    Returns:
        The value as a plain ``int``, ``float`` or ``str``.
    """
    check_instance("name", name, str)
    if not name or not all(ch.isalnum() or ch == "_" for ch in name):
        raise ValueError(f"name must be letters, digits and '_' only (a glue key), got {name!r}")
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"value must be a single number, got a tensor of shape {shape_str(tuple(value.shape))}"
            )
        value = value.item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(
            f"value must be an int, float, str or a one-element tensor, got {type(value).__name__}"
        )
    if "google.colab" in sys.modules:  # Colab renders no glue: show the number by its key
        print(f"{name} = {value:.4g}" if isinstance(value, float) else f"{name} = {value}")
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # plain Python, or Colab without MyST-NB: nothing to record
        return value
    myst_glue(name, value, display=False)
    return value


def enable_colab_widgets() -> bool:
    """Make a chapter's widgets display on Google Colab, whatever ipywidgets it has.

    Colab's own front end renders the widgets of ipywidgets 7, the version it preinstalls
    (7.7.1 in its 2026 runtime); widgets of ipywidgets 8 show only through its "custom widget
    manager", which must be switched on in every session. The chapters' setup cell calls this
    function: on Colab with ipywidgets 8 or later it switches the manager on; anywhere else
    (Jupyter, VS Code, the book build) it does nothing. The package never upgrades ipywidgets
    itself: it asks for ``ipywidgets>=7.7``, which Colab's version satisfies.

    Returns:
        ``True`` when it switched Colab's custom widget manager on, else ``False``.
    """
    if "google.colab" not in sys.modules:
        return False
    try:
        import ipywidgets
    except ImportError:  # no widgets installed: nothing to display
        return False
    if int(ipywidgets.__version__.split(".")[0]) < 8:
        return False
    from google.colab import output  # type: ignore[import-not-found]

    output.enable_custom_widget_manager()
    return True
