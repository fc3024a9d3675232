"""Small helpers used throughout the book: reproducible seeds, d2l-style shape checks,
parameter counts, and a trace of the shapes every sub-module sees (chapter 7)."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from companion._validation import check_callable, check_instance, check_tensor, shape_str

__all__ = [
    "set_seed",
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
    installed (Colab), nothing is displayed and the converted value is just returned.

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
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # Colab, plain Python: nothing to record
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
