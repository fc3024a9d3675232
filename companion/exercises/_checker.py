"""The engine behind every exercise check.

A check runs the reader's function and the reference solution on the same random cases and
compares the results. It never raises on a wrong answer: it prints what is wrong (expected
vs got, shapes, the first mismatching entry) and returns a :class:`CheckResult`, so a
notebook keeps running while the reader works.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from companion._validation import check_callable

__all__ = [
    "Case",
    "CheckResult",
    "calls_into",
    "CallRefused",
    "refusing_calls",
    "compare",
    "as_verdict",
    "report",
    "run_check",
    "seeded_generator",
    "random_bool_mask",
    "lengths_mask",
    "causal_bool_mask",
    "ngram_counts",
]

#: One test case: the keyword arguments of one call of the reader's function.
Case = dict[str, Any]


@dataclass
class CheckResult:
    """Outcome of one exercise check; truthy when every case passed."""

    name: str
    passed: bool
    cases_run: int
    message: str
    details: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        """A one-line status, e.g. ``✓ row_softmax: all 12 cases pass`` (shown by Jupyter)."""
        cases = f"{self.cases_run} case{'s' if self.cases_run != 1 else ''}"
        if self.passed:
            return f"✓ {self.name}: all {cases} pass"
        return f"✗ {self.name}: not yet ({cases} run; see the message above)"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"array of shape {value.shape}, dtype {value.dtype}"
    if isinstance(value, torch.nn.Module) and "\n" in repr(value):  # every sub-module, one a line
        count = sum(p.numel() for p in value.parameters())
        return f"{type(value).__name__} module with {count:,} parameters"
    return f"{type(value).__name__} {value!r}"[:200]


def compare(
    expected: Any, got: Any, atol: float = 1e-5, rtol: float = 1e-4, path: str = "result"
) -> str | None:
    """Return ``None`` when ``got`` matches ``expected``, else a one-paragraph explanation.

    Tensors/arrays are compared by shape and value (``atol``/``rtol``, NaN never matches);
    tuples and lists element by element; numbers with the same tolerances; anything else
    with ``==``.
    """
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"{path}: expected a {type(expected).__name__} of {len(expected)} items, got {_describe(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = compare(e, g, atol, rtol, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, (torch.Tensor, np.ndarray)):
        if not isinstance(got, (torch.Tensor, np.ndarray)):
            return f"{path}: expected {_describe(expected)}, got {_describe(got)}"
        e = torch.as_tensor(np.asarray(expected) if isinstance(expected, np.ndarray) else expected)
        g = torch.as_tensor(np.asarray(got) if isinstance(got, np.ndarray) else got)
        if tuple(e.shape) != tuple(g.shape):
            return f"{path}: wrong shape - expected {tuple(e.shape)}, got {tuple(g.shape)}"
        if e.dtype == torch.bool or g.dtype == torch.bool:
            bad = e.to(torch.bool) != g.to(torch.bool)
        else:
            e64, g64 = e.detach().double(), g.detach().double()
            bad = ~torch.isclose(g64, e64, atol=atol, rtol=rtol)
        if bool(bad.any()):
            # the entry with the LARGEST difference (NaN counts as largest): the first differing
            # entry of a wrong answer can be off by 1e-4 and look like rounding
            e64, g64 = e.detach().double(), g.detach().double()
            gap = (
                (g64 - e64).abs().nan_to_num(nan=math.inf, posinf=math.inf).masked_fill(~bad, -1.0)
            )
            index = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
            want, have = e64[index].item(), g64[index].item()
            digits = 6 if f"{want:.6g}" != f"{have:.6g}" else 12  # a tiny gap needs more digits
            return (
                f"{path}: {int(bad.sum())} of {bad.numel()} entries differ; the largest difference "
                f"is at index {index}: expected {want:.{digits}g}, got {have:.{digits}g}"
                + ("" if e.dtype == torch.bool else f" (off by {gap[index].item():.3g})")
            )
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if not isinstance(got, (int, float, np.floating, np.integer, torch.Tensor)) or (
            isinstance(got, torch.Tensor) and got.numel() != 1
        ):
            return f"{path}: expected the number {expected:.6g}, got {_describe(got)}"
        g = float(got)
        if not np.isclose(g, expected, atol=atol, rtol=rtol):
            return f"{path}: expected {expected:.6g}, got {g:.6g}"
        return None
    if expected != got:
        return f"{path}: expected {_describe(expected)}, got {_describe(got)}"
    return None


def _inputs(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {_describe(v)}" for k, v in kwargs.items())


def _parameter_mismatch(user_fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> str | None:
    """Why ``user_fn(**kwargs)`` cannot bind, in the reader's terms, or ``None`` when it can
    (or when the function has no signature to read, e.g. a builtin)."""
    try:
        signature = inspect.signature(user_fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**kwargs)
    except TypeError:
        wanted = ", ".join(kwargs)
        return (
            f"the check passes the arguments by name ({wanted}), but your function's parameters "
            f"are {signature}: keep the parameter names of the exercise's stub."
        )
    return None


def call_reader(
    name: str, count: int, user_fn: Callable[..., Any], kwargs: Mapping[str, Any]
) -> tuple[Any, CheckResult | None]:
    """Call the reader's function on case ``count``: ``(value, None)``, or ``(None, result)``
    with a failed :class:`CheckResult` when it is not written yet or raises (the notebook
    never crashes on the reader's code)."""
    mismatch = _parameter_mismatch(user_fn, kwargs)
    if mismatch:
        return None, CheckResult(name, False, count, f"❌ {name}: {mismatch}")
    try:
        return user_fn(**kwargs), None
    except NotImplementedError:
        message = f"⏳ {name}: not attempted yet (the function raises NotImplementedError)."
    except Exception as exc:  # the reader's code: report any error, do not crash the notebook
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        message = f"❌ {name}: case {count} raised {last}"
    return None, CheckResult(name, False, count, message)


@contextlib.contextmanager
def calls_into(
    *modules: object, functions: tuple[Callable[..., Any], ...] = ()
) -> Iterator[list[str]]:
    """Record the functions of ``modules``, and the ``functions`` themselves, entered while the
    block runs (``sys.setprofile``), as ``"module (qualname)"``: a check uses it to refuse an
    answer that calls the package function the exercise asks the reader to write. ``functions``
    serves where a module holds both the answer and what the reader must call (a model and its
    decoding loop), and also holds builtin (C) functions such as
    ``torch.nn.functional.scaled_dot_product_attention``, seen through ``c_call`` events."""
    names = {getattr(m, "__file__", None): getattr(m, "__name__", "?") for m in modules}
    codes: dict[object, str] = {}
    builtins: dict[int, str] = {}  # id of a C function -> its dotted name
    for function in functions:
        code = getattr(inspect.unwrap(function), "__code__", None)
        if code is not None:
            codes[code] = getattr(function, "__module__", "?")
        elif inspect.isbuiltin(function):
            functional = sys.modules.get("torch.nn.functional")
            public = getattr(functional, function.__name__, None) is function
            module = "torch.nn.functional" if public else function.__module__
            builtins[id(function)] = f"{module}.{function.__name__}"
        else:
            raise TypeError(
                f"functions must hold Python or builtin functions, got {type(function).__name__}"
            )
    calls: list[str] = []
    previous = sys.getprofile()  # an enclosing calls_into keeps seeing every event

    def profiler(frame: object, event: str, arg: object) -> None:
        if previous is not None:
            previous(frame, event, arg)
        code = frame.f_code  # type: ignore[attr-defined]
        if event == "call" and (code.co_filename in names or code in codes):
            qualname = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
            module = codes[code] if code in codes else names[code.co_filename]
            calls.append(f"{module} ({qualname})")
        elif event == "c_call" and id(arg) in builtins:
            calls.append(builtins[id(arg)])

    sys.setprofile(profiler)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


class CallRefused(RuntimeError):
    """Raised by a function wrapped with :func:`refusing_calls` when the reader's code calls
    what the exercise asks them to write (a ``RuntimeError``, so older ``except`` clauses still
    catch it; its own class, so that a check can tell it from a PyTorch error)."""


def refusing_calls(
    fn: Callable[..., Any],
    task: str,
    modules: tuple[object, ...],
    why: str = "",
    functions: tuple[Callable[..., Any], ...] = (),
) -> Callable[..., Any]:
    """``fn``, failing (:class:`CallRefused`) when it calls into one of ``modules`` or one of
    ``functions``: the exercise asks for ``task`` by hand, and those hold the answer. ``why`` is
    appended to the message. ``functions`` refuses single functions of a module whose other
    names the reader must use (the model beside its healthy decoding loop).
    ``functools.wraps`` keeps the signature, so that the checker still names missing
    parameters; arguments are passed on as given."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with calls_into(*modules, functions=functions) as calls:
            value = fn(*args, **kwargs)
        if calls:
            raise CallRefused(
                f"your code called {calls[0]}; this exercise asks you to {task} yourself{why}"
            )
        return value

    return run


def report(result: CheckResult) -> None:
    """Print a check's message in one write, so the kernel sends one stream message (two
    writes can reach a notebook's output as two messages and show the text twice)."""
    print(result.message + "\n", end="")


def run_check(
    name: str,
    user_fn: Callable[..., Any],
    reference_fn: Callable[..., Any],
    cases: Iterable[Mapping[str, Any]],
    atol: float = 1e-5,
    rtol: float = 1e-4,
    verbose: bool = True,
    hint: Callable[[Mapping[str, Any], Any], str] | None = None,
) -> CheckResult:
    """Run ``user_fn`` and ``reference_fn`` on each case (keyword arguments) and compare.

    Inputs are cloned before each call so a function that modifies its arguments in place
    cannot corrupt the comparison. On a wrong (not raising) answer, ``hint(case, got)`` may
    append a diagnosis of the classic mistake it matches (an empty string when none does).
    Prints a short report unless ``verbose=False``.
    """
    check_callable("the function to check", user_fn)

    def clone(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    count = 0
    result: CheckResult | None = None
    for count, case in enumerate(cases, start=1):
        expected = reference_fn(**clone(case))
        got, result = call_reader(name, count, user_fn, clone(case))
        if result is not None:
            if result.message.startswith("❌"):  # raised: show the inputs that made it raise
                result.message += f"\n   inputs: {_inputs(case)}"
            break
        problem = compare(expected, got, atol, rtol)
        if problem:
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: case {count} is wrong.\n   {problem}\n   inputs: {_inputs(case)}"
                + (hint(case, got) if hint is not None else ""),
            )
            break
    if result is None:
        if count == 0:
            raise ValueError(f"{name}: no test cases were generated")
        result = CheckResult(
            name, True, count, f"✅ {name}: all {count} cases match the reference."
        )
    if verbose:
        report(result)
    return result


def run_verdict_check(
    name: str,
    user_fn: Callable[..., Any],
    cases: Sequence[Mapping[str, Any]],
    arguments: Callable[[Mapping[str, Any]], dict[str, Any]],
    problem: Callable[[Any, Mapping[str, Any]], str | None],
    what: str = "cases",
    verbose: bool = True,
) -> CheckResult:
    """Run the reader's *test* (a function that returns a verdict) on each case and stop at
    the first wrong verdict.

    ``arguments(case)`` builds the keyword arguments of one call (fresh copies, so the reader
    cannot change the case); ``problem(verdict, case)`` says what is wrong with the verdict, or
    returns ``None``. A stub or an exception is reported as :func:`call_reader` does.
    """
    result: CheckResult | None = None
    for count, case in enumerate(cases, start=1):
        got, result = call_reader(name, count, user_fn, arguments(case))
        if result is not None:
            break
        wrong = problem(got, case)
        if wrong:
            result = CheckResult(name, False, count, f"❌ {name}: case {count}: {wrong}.")
            break
    if result is None:
        result = CheckResult(
            name, True, len(cases), f"✅ {name}: the right verdict on all {len(cases)} {what}."
        )
    if verbose:
        report(result)
    return result


# --------------------------------------------------------------------------------------------
# Helpers shared by the chapters' case builders and reference solutions
# --------------------------------------------------------------------------------------------


def as_verdict(got: object) -> object:
    """A reader's True/False answer as a Python ``bool`` when it came as another boolean type: a
    one-element bool tensor, or NumPy's bool (what ``np.all`` returns). Anything else comes back
    unchanged, for the caller's "return True or False" message."""
    if isinstance(got, Tensor) and got.numel() == 1 and got.dtype == torch.bool:
        return bool(got)
    if isinstance(got, np.bool_):
        return bool(got)
    return got


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator of its own, seeded with ``seed``.

    Cases drawn from it are the same on every call and every machine, and drawing them
    neither reads nor moves the global random state.
    """
    return torch.Generator().manual_seed(seed)


def random_bool_mask(
    shape: Sequence[int], probability: float, generator: torch.Generator
) -> Tensor:
    """A boolean tensor of ``shape``, each entry ``True`` with ``probability``.

    Draws ``torch.rand(shape)`` from ``generator`` (one uniform number per entry) and keeps
    the entries below ``probability``.
    """
    return torch.rand(tuple(shape), generator=generator) < probability  # shape


def lengths_mask(lengths: Sequence[int], max_len: int) -> Tensor:
    """``(batch, max_len)`` boolean, ``True`` for the first ``lengths[b]`` positions of row ``b``.

    Index the result to add broadcast axes, e.g. ``[:, None, None, :]`` for a
    ``(batch, 1, 1, max_len)`` key-padding mask.
    """
    positions = torch.arange(max_len)  # (max_len,)
    return positions[None, :] < torch.tensor(list(lengths))[:, None]  # (batch, max_len)


def causal_bool_mask(size: int, diagonal: int = 0) -> Tensor:
    """``(size, size)`` boolean, ``True`` on and below the ``diagonal``-th diagonal.

    ``diagonal=0`` is the causal mask (query ``i`` may attend to keys ``0 .. i``); ``1`` also
    lets every query see the next key, ``-1`` only the strictly earlier ones.
    """
    return torch.ones(size, size, dtype=torch.bool).tril(diagonal)  # (size, size)


def ngram_counts(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    """How often each n-gram (a tuple of ``n`` consecutive tokens) of ``tokens`` occurs.

    Empty when ``tokens`` has fewer than ``n`` tokens.
    """
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
