"""Exercises of chapter 1, "Attention, the intuition".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on random cases drawn from a seeded generator (several shapes, plus edge cases), and
returns a :class:`~companion.exercises._checker.CheckResult` that is truthy when every case
matches. The checks call your function with keyword arguments, so keep the parameter names of
the stub in the notebook.

- exercise 1, a numerically safe softmax: :func:`check_row_softmax`
- exercise 2, dot-product scores, batched: :func:`check_relevance_scores`
- exercise 3, a hand-set head that looks ``offset`` positions away: :func:`check_offset_head`
  (graded by what the head does, not by comparison with one answer: many matrices are right)
- exercise 4, a permutation-equivariance test of your own: :func:`check_is_permutation_equivariant`
- exercise 5, additive relevance scores for every pair: :func:`check_additive_scores`
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from companion import attention as _attention_module  # AdditiveScore.forward: exercise 5's answer
from companion._validation import check_callable as _check_callable
from companion.exercises._checker import (
    Case,
    CheckResult,
    as_verdict,
    call_reader,
    refusing_calls,
    report,
    run_check,
    run_verdict_check,
    seeded_generator,
)

__all__ = [
    "check_row_softmax",
    "check_relevance_scores",
    "check_additive_scores",
    "check_is_permutation_equivariant",
    "check_offset_head",
    "ADDITIVE_MAX_TORCH_CALLS",
    "NamedLayer",
    "equivariance_test_layers",
    "equivariance_gap",
    "equivariance_check_inputs",
    "probe_permutations",
    "adaptive_case_problem",
    "adaptive_false_reject_probability",
    "OFFSET_HEAD_MIN_WEIGHT",
    "angle_positions",
    "offset_head_weights",
]


class ShapeMismatch(RuntimeError):
    """A PyTorch shape error in the reader's function, re-raised with the shapes it got and owes."""


#: The advice a shape error gets by default: every exercise but the first pairs dimensions
#: in a product.
_PRODUCT_ADVICE = "check which dimensions each product pairs"


def _with_shape_hint(
    fn: Callable[..., Tensor], returns: str, advice: str = _PRODUCT_ADVICE
) -> Callable[..., Tensor]:
    """Wrap the reader's ``fn`` so that a raw PyTorch shape error (``RuntimeError`` or
    ``IndexError``, not the check's own subclasses such as a refused call) comes back as
    :class:`ShapeMismatch`, one line naming the shapes the function received, the shape
    ``returns`` it must produce and the ``advice`` that fits the exercise."""

    @functools.wraps(fn)
    def hinted(**kwargs: Tensor) -> Tensor:
        try:
            return fn(**kwargs)
        except (RuntimeError, IndexError) as exc:
            if type(exc) not in (RuntimeError, IndexError):
                raise  # the check's own reports (a forbidden call, a loop) stay as they are
            got = ", ".join(f"{name} {tuple(value.shape)}" for name, value in kwargs.items())
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            first_line = re.sub(r"\((?:sparse|strided)\w*\)", "", first_line)  # permute(sparse_coo)
            raise ShapeMismatch(
                f"{first_line}. Your function received {got} and must return {returns}: {advice}"
            ) from exc

    return hinted


# --------------------------------------------------------------------------------------------
# Exercise 1: softmax over the last dimension, safe for large scores
# --------------------------------------------------------------------------------------------


def reference_row_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dimension with the max-subtraction trick.

    Args:
        scores: shape ``(..., k_len)``, any finite values (even ±1000).

    Returns:
        Weights of shape ``(..., k_len)``: positive, each row sums to 1.
    """
    shifted = scores - scores.amax(dim=-1, keepdim=True)  # (..., k_len), largest entry is 0
    exp = shifted.exp()  # (..., k_len), in (0, 1]: cannot overflow
    return exp / exp.sum(dim=-1, keepdim=True)  # (..., k_len)


def _row_softmax_cases() -> list[Case]:
    g = seeded_generator(101)
    cases: list[Case] = [
        {"scores": 3 * torch.randn(shape, generator=g)}
        for shape in [(5,), (3, 4), (4, 4), (2, 3, 6), (6, 1)]
    ]
    # Edge cases: ties (uniform rows), huge positive scores (exp overflows to inf) and huge
    # negative scores (exp underflows to 0), both of which turn a naive softmax into NaN.
    cases.append({"scores": torch.full((2, 4), 50.0)})
    cases.append({"scores": torch.tensor([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]])})
    cases.append({"scores": 1000 * torch.randn(3, 5, generator=g)})
    cases.append({"scores": 200 * torch.randn(2, 3, 4, generator=g) + 500})
    # float64 scores: an answer that casts to float32 first (.float()) returns another dtype
    cases.append({"scores": 3 * torch.randn(3, 4, generator=g, dtype=torch.float64)})
    # scores inside a graph (a non-leaf that requires grad): an answer that leaves PyTorch
    # (NumPy, SciPy) returns weights no gradient can flow through
    cases.append({"scores": torch.randn(2, 5, generator=g).requires_grad_() * 3})
    return cases


class BuiltinSoftmaxCalled(RuntimeError):
    """Raised when the reader's ``row_softmax`` calls one of PyTorch's softmax functions."""


class GraphLeft(TypeError):
    """Raised when the reader's ``row_softmax`` returns weights without a gradient for scores
    that require one: it left PyTorch (NumPy or SciPy, say), so training cannot learn through it."""


class DtypeChanged(TypeError):
    """Raised when the reader's ``row_softmax`` (or ``relevance_scores``) returns another dtype
    than its input's (float64 weights for float32 scores, say): both keep their input's
    precision."""


#: The functions exercise 1 asks the reader not to call: (owner, attribute name). ``logsumexp``
#: is on the list because ``(scores - scores.logsumexp(-1, keepdim=True)).exp()`` is the
#: softmax with the max-subtraction done inside PyTorch, the very step the exercise asks for;
#: ``softmin`` is the softmax of ``-scores``. The private ``torch._softmax`` and the raw
#: operators under ``torch.ops.aten`` are the same kernels by other names, and so are the
#: sparse ones (``torch.sparse.softmax(scores.to_sparse(), -1).to_dense()``).
_BUILTIN_SOFTMAXES = (
    (torch, "softmax"),
    (torch, "log_softmax"),
    (torch, "logsumexp"),
    (torch, "logcumsumexp"),  # its last column is the log-sum-exp
    (torch, "_softmax"),
    (torch, "_log_softmax"),
    (torch.sparse, "softmax"),
    (torch.sparse, "log_softmax"),
    (torch.ops.aten, "softmax"),
    (torch.ops.aten, "_softmax"),
    (torch.ops.aten, "log_softmax"),
    (torch.ops.aten, "_log_softmax"),
    (torch.ops.aten, "logsumexp"),
    (torch.ops.aten, "logcumsumexp"),
    (torch.ops.aten, "_sparse_softmax"),
    (torch.ops.aten, "_sparse_log_softmax"),
    (torch.nn.functional, "softmax"),
    (torch.nn.functional, "log_softmax"),
    (torch.nn.functional, "softmin"),
    (torch.special, "softmax"),
    (torch.special, "log_softmax"),
    (torch.special, "logsumexp"),
    (torch.Tensor, "softmax"),
    (torch.Tensor, "log_softmax"),
    (torch.Tensor, "logsumexp"),
    (torch.Tensor, "logcumsumexp"),
)

#: The same functions in ``torch._C._VariableFunctions``, the C namespace behind ``torch.*``
#: (``torch.softmax`` is its ``softmax``). Its type is immutable, so while the reader's code runs
#: the check puts a stand-in in its place that refuses these names and hands over every other.
_VARIABLE_FUNCTIONS_SOFTMAXES = (
    "softmax",
    "log_softmax",
    "logsumexp",
    "logcumsumexp",
    "_softmax",
    "_log_softmax",
)


@contextlib.contextmanager
def _builtin_softmax_forbidden() -> Iterator[None]:
    """While active, PyTorch's softmax functions raise :class:`BuiltinSoftmaxCalled`."""

    class forbidden:  # noqa: N801 - stands in for a function
        """Raises when called; its attributes too (``torch.ops.aten._softmax.default``)."""

        def __init__(self, name: str) -> None:
            self.name = name

        def __getattr__(self, attr: str) -> forbidden:
            return forbidden(f"{self.name}.{attr}")

        def __call__(self, *args: object, **kwargs: object) -> Tensor:
            raise BuiltinSoftmaxCalled(
                f"{self.name} was called: the exercise asks for the softmax written with exp, "
                "a maximum and a sum, without PyTorch's softmax, logsumexp or logcumsumexp functions"
            )

    real_variable_functions = torch._C._VariableFunctions

    class variable_functions:  # noqa: N801 - stands in for torch._C._VariableFunctions
        """Refuses the softmax names, hands over every other attribute."""

        def __getattr__(self, attr: str) -> object:
            if attr in _VARIABLE_FUNCTIONS_SOFTMAXES:
                return forbidden(f"torch._C._VariableFunctions.{attr}")
            return getattr(real_variable_functions, attr)

    saved = [(owner, attr, owner.__dict__.get(attr)) for owner, attr in _BUILTIN_SOFTMAXES]
    try:
        for owner, attr in _BUILTIN_SOFTMAXES:
            prefix = "Tensor." if owner is torch.Tensor else f"{owner.__name__}."
            setattr(owner, attr, forbidden(prefix + attr))
        torch._C._VariableFunctions = variable_functions()
        yield
    finally:
        torch._C._VariableFunctions = real_variable_functions
        for owner, attr, original in saved:
            if original is None:  # inherited (Tensor's methods come from its C base class)
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


def check_row_softmax(row_softmax: Callable[[Tensor], Tensor], verbose: bool = True) -> CheckResult:
    """Check ``row_softmax(scores)``: softmax over the last dimension of ``(..., k_len)`` scores.

    The cases include scores of magnitude 1000, where ``exp`` overflows unless the row
    maximum is subtracted first. While the reader's function runs, PyTorch's softmax
    functions (``torch.softmax``, ``F.softmax``, ``Tensor.softmax``, their ``log_softmax``
    siblings and ``F.softmin``) and ``logsumexp`` (which does the max-subtraction itself)
    raise, so calling one of them is reported instead of passing.
    """

    @functools.wraps(row_softmax)
    def without_builtin_softmax(**kwargs: Tensor) -> Tensor:
        with _builtin_softmax_forbidden():
            try:
                got = row_softmax(**kwargs)
            except TypeError as exc:
                if "return_types" not in str(exc):
                    raise
                raise TypeError(  # scores - scores.max(dim=-1): a (values, indices) pair
                    f"{str(exc).splitlines()[0]}. With a dim, max returns a pair (values, "
                    "indices): use .values, or torch.amax"
                ) from exc
        scores = kwargs["scores"]
        if isinstance(got, Tensor) and scores.requires_grad and not got.requires_grad:
            raise GraphLeft(
                "your weights carry no gradient for scores that require one: the function left "
                "PyTorch (NumPy or SciPy?), so backpropagation cannot reach the scores; use "
                "torch operations"
            )
        if isinstance(got, Tensor) and got.dtype != scores.dtype:
            raise DtypeChanged(
                f"your function returned {got.dtype} weights for {scores.dtype} scores: keep "
                "the scores' dtype (no .double(), .half() or dtype= argument)"
            )
        return got

    return run_check(
        "row_softmax",
        _with_shape_hint(
            without_builtin_softmax,
            "scores' shape (..., k_len)",
            advice="check which dimension each maximum and sum reduces over, and whether it "
            "keeps that dimension (keepdim=True) so that it lines up with the scores",
        ),
        reference_row_softmax,
        _row_softmax_cases(),
        verbose=verbose,
        hint=_row_softmax_hint,
    )


def _row_softmax_hint(case: Mapping[str, Tensor], got: object) -> str:
    """The hint of an answer that returned NaN or inf: an exponent overflowed or a whole row
    underflowed, the sign of a subtraction that is not each row's own maximum."""
    if not isinstance(got, Tensor) or torch.isfinite(got).all():
        return ""
    return (
        "\n   Your output has NaN or inf here: an exponent overflowed (inf / inf), or a row far "
        "below the number you subtracted underflowed to 0 / 0. Subtract each row's own maximum."
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: dot-product relevance scores for a batch
# --------------------------------------------------------------------------------------------


def reference_relevance_scores(q: Tensor, k: Tensor) -> Tensor:
    """Dot product of every query with every key.

    Args:
        q: queries, shape ``(..., q_len, d_k)``.
        k: keys, shape ``(..., k_len, d_k)``, same leading dimensions as ``q``.

    Returns:
        Scores of shape ``(..., q_len, k_len)``; entry ``[..., i, j]`` is ``q_i · k_j``.
    """
    return q @ k.transpose(-2, -1)  # (..., q_len, k_len)


def _relevance_cases() -> list[Case]:
    g = seeded_generator(102)
    shapes = [
        ((4, 3), (6, 3)),  # one sentence, more keys than queries
        ((5, 5), (5, 5)),  # square, d_k = len: forgetting the transpose gives no error
        ((1, 3), (7, 3)),  # a single query
        ((2, 4, 3), (2, 5, 3)),  # a batch of 2 sentences
        ((3, 2, 6, 4), (3, 2, 6, 4)),  # batch × heads
    ]
    cases: list[Case] = [
        {"q": torch.randn(q_shape, generator=g), "k": torch.randn(k_shape, generator=g)}
        for q_shape, k_shape in shapes
    ]
    # float64 queries and keys: an answer that casts to float32 first (.float()) changes dtype
    cases.append(
        {
            "q": torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
            "k": torch.randn(2, 5, 4, generator=g, dtype=torch.float64),
        }
    )
    return cases


def _keeping_dtype(relevance_scores: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Wrap the reader's ``relevance_scores`` so that scores in another dtype than the queries'
    are reported as :class:`DtypeChanged`, as exercise 1's check does for weights."""

    @functools.wraps(relevance_scores)
    def checked(**kwargs: Tensor) -> Tensor:
        got = relevance_scores(**kwargs)
        q = kwargs["q"]
        if isinstance(got, Tensor) and got.dtype != q.dtype:
            raise DtypeChanged(
                f"your function returned {got.dtype} scores for {q.dtype} queries and keys: "
                "keep their dtype (no .float(), .double() or dtype= argument)"
            )
        return got

    return checked


def check_relevance_scores(
    relevance_scores: Callable[[Tensor, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``relevance_scores(q, k)``: ``(..., q_len, d_k)``, ``(..., k_len, d_k)`` →
    ``(..., q_len, k_len)``."""
    return run_check(
        "relevance_scores",
        _with_shape_hint(_keeping_dtype(relevance_scores), "(..., q_len, k_len)"),
        reference_relevance_scores,
        _relevance_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 5: additive relevance scores from explicit weight matrices
# --------------------------------------------------------------------------------------------


def reference_additive_scores(
    x_q: Tensor, x_k: Tensor, w_q: Tensor, w_k: Tensor, w_a: Tensor
) -> Tensor:
    """Additive (Bahdanau) scores ``e_ij = tanh(a_i W_q + a_j W_k) w_a`` for every pair.

    ``a_i`` is row ``i`` of ``x_q`` (the vector that asks) and ``a_j`` row ``j`` of ``x_k`` (the
    vector that is scored): the inputs themselves, not projected queries and keys.

    Args:
        x_q: the query-side inputs, shape ``(..., q_len, d_query)``.
        x_k: the key-side inputs, shape ``(..., k_len, d_key)``, same leading dimensions as
            ``x_q`` (input widths, not the projected width ``d_k``).
        w_q: shape ``(d_query, d_hidden)``.
        w_k: shape ``(d_key, d_hidden)``.
        w_a: shape ``(d_hidden,)``.

    Returns:
        Scores of shape ``(..., q_len, k_len)``.
    """
    hq = (x_q @ w_q).unsqueeze(-2)  # (..., q_len, 1, d_hidden)
    hk = (x_k @ w_k).unsqueeze(-3)  # (..., 1, k_len, d_hidden)
    return torch.tanh(hq + hk) @ w_a  # (..., q_len, k_len)


def _additive_cases() -> list[Case]:
    g = seeded_generator(104)
    shapes = [
        # (x_q shape, x_k shape, d_hidden)
        ((3, 4), (5, 4), 6),
        ((4, 3), (4, 3), 5),  # q_len == k_len: pairing q_i with k_i only gives no error
        ((3, 2), (5, 4), 3),  # d_query != d_key
        ((1, 3), (1, 3), 4),  # one query, one key
        ((2, 3, 4), (2, 6, 4), 3),  # a batch of 2
        ((12, 4), (10, 4), 3),  # 120 pairs: a Python loop over queries or pairs shows here
        ((6, 4), (64, 4), 32),  # 64 keys, 32 hidden units: a loop over either shows here
        ((64, 4), (3, 4), 4),  # 64 queries: even one call per query passes the cap of 40
    ]
    cases: list[Case] = []
    for q_shape, k_shape, d_hidden in shapes:
        cases.append(
            {
                "x_q": torch.randn(q_shape, generator=g),
                "x_k": torch.randn(k_shape, generator=g),
                "w_q": torch.randn(q_shape[-1], d_hidden, generator=g),
                "w_k": torch.randn(k_shape[-1], d_hidden, generator=g),
                "w_a": torch.randn(d_hidden, generator=g),
            }
        )
    return cases


#: The most PyTorch calls (functions, tensor methods and operators) exercise 5's answer may
#: make on one case. A broadcast answer makes about 8 whatever the sizes; a Python loop makes
#: at least one per iteration and usually three or more: over the 64 queries of one case (even
#: at one call per query), the 120 pairs of another, the 64 keys or the 32 hidden units of a
#: third, it passes 40.
ADDITIVE_MAX_TORCH_CALLS = 40


class PythonLoopSuspected(RuntimeError):
    """Raised when the reader's ``additive_scores`` makes too many PyTorch calls for one case."""


class ComputedOutsidePyTorch(RuntimeError):
    """Raised when the reader's scores carry no autograd history back to every input: they
    were computed from Python numbers (``.tolist()``, ``.item()``) or detached."""


class _TorchCallCounter(TorchFunctionMode):
    """Counts the PyTorch functions, tensor methods and operators called from Python."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.calls += 1
        return func(*args, **(kwargs or {}))


def check_additive_scores(
    additive_scores: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor],
    verbose: bool = True,
) -> CheckResult:
    """Check ``additive_scores(x_q, x_k, w_q, w_k, w_a)``: ``(..., q_len, d_query)``,
    ``(..., k_len, d_key)`` → ``(..., q_len, k_len)``.

    The exercise asks for every pair at once, without a Python loop: the check counts the
    PyTorch calls the reader's function makes on each case and reports a count above
    :data:`ADDITIVE_MAX_TORCH_CALLS` (one case has 64 queries, another 12 queries and 10 keys,
    another 64 keys and 32 hidden units). The inputs require gradients, and scores that do not
    depend on every input through autograd (a loop over Python floats after ``.tolist()``, which makes
    few PyTorch calls) are reported too. So is a call into :mod:`companion.attention`, whose
    ``AdditiveScore.forward`` holds the answer (e.g. through ``torch.func.functional_call``).
    """
    guarded = refusing_calls(
        additive_scores,
        "pair every query with every key",
        (_attention_module,),
        why=": companion.attention.AdditiveScore.forward holds the answer",
    )

    @functools.wraps(additive_scores)
    def counted(**kwargs: Tensor) -> Tensor:
        leaves = {name: value.detach().requires_grad_(True) for name, value in kwargs.items()}
        inputs = {name: leaf.clone() for name, leaf in leaves.items()}  # in-place ops allowed
        with _TorchCallCounter() as counter:
            result = _with_shape_hint(guarded, "(..., q_len, k_len)")(**inputs)
        if counter.calls > ADDITIVE_MAX_TORCH_CALLS:
            q_len, k_len = kwargs["x_q"].shape[-2], kwargs["x_k"].shape[-2]
            d_hidden = kwargs["w_a"].shape[-1]
            raise PythonLoopSuspected(
                f"your function made {counter.calls} PyTorch calls for {q_len} queries, "
                f"{k_len} keys and {d_hidden} hidden units (a broadcast answer makes about 8, "
                "whatever the sizes): it loops in Python, and each iteration (over queries, "
                "keys, pairs or hidden units) adds calls. Give every projected query a new axis for the keys, and "
                "every projected key one for the queries, and add them once"
            )
        if isinstance(result, Tensor) and result.is_floating_point():
            if result.grad_fn is None:
                missing = list(leaves)
            else:
                grads = torch.autograd.grad(result.sum(), list(leaves.values()), allow_unused=True)
                missing = [name for name, grad in zip(leaves, grads) if grad is None]
            if missing:
                raise ComputedOutsidePyTorch(
                    f"your scores do not depend on {', '.join(missing)} through PyTorch "
                    "operations (autograd finds no path back): either the formula leaves "
                    "it out, or the scores were built from Python numbers (.tolist() or "
                    ".item() and a loop) or detached. Compute them with tensor operations "
                    "on x_q, x_k, w_q, w_k and w_a (the result must stay differentiable: no copy "
                    "into a module under torch.no_grad())"
                )
            result = result.detach()
        return result

    return run_check(
        "additive_scores",
        counted,
        reference_additive_scores,
        _additive_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: a permutation-equivariance test written by the reader
# --------------------------------------------------------------------------------------------


class NamedLayer:
    """A sequence layer ``(seq_len, d_in) → (seq_len, d_out)`` with a readable name.

    The equivariance check hands these to the reader's test; the name is what a failed check
    prints, e.g. ``NamedLayer('causal self-attention')``.
    """

    def __init__(self, name: str, fn: Callable[[Tensor], Tensor]) -> None:
        self.name = name
        self.fn = fn

    def __call__(self, x: Tensor) -> Tensor:
        """``x (seq_len, d_in)`` → ``(seq_len, d_out)``."""
        return self.fn(x)

    def __repr__(self) -> str:
        return f"NamedLayer({self.name!r})"


def probe_permutations(seq_len: int) -> list[Tensor]:
    """The permutations an equivariance test tries, each ``(seq_len,)``: the reversal, one
    cyclic shift, the swap of the ends, then 20 seeded random ones."""
    generator = seeded_generator(7)
    swap = torch.arange(seq_len)  # (seq_len,)
    swap[[0, -1]] = swap[[-1, 0]]
    perms = [torch.arange(seq_len - 1, -1, -1), torch.roll(torch.arange(seq_len), 1), swap]
    return perms + [torch.randperm(seq_len, generator=generator) for _ in range(20)]


def reference_is_permutation_equivariant(layer: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    """Whether ``layer(x[perm]) == layer(x)[perm]`` (to float tolerance) for every ``perm`` tried.

    Tries the reversal, a cyclic shift, the swap of the first and last tokens and 20 random
    permutations from a generator of its own (the same on every call: the check's cases are
    built so that these see every change), then 20 fresh draws from PyTorch's global generator
    (different on every call: no fixed list catches a layer built to change only under the
    reorderings the list leaves out, as the check's last case is). It compares with
    ``torch.allclose`` (``atol=1e-5`` and its default ``rtol=1e-5``): a reordered sum differs in
    its last bits, so exact equality would reject a truly equivariant layer, while a change of
    :data:`EQUIVARIANCE_SMALLEST_CHANGE` on outputs of size 1 is real and must be caught.

    Args:
        layer: maps ``(seq_len, d_in)`` to ``(seq_len, d_out)``.
        x: one sequence, shape ``(seq_len, d_in)``.

    Returns:
        ``True`` when every permutation tried commutes with ``layer``.
    """
    seq_len = x.shape[-2]
    output = layer(x)  # (seq_len, d_out)
    perms = probe_permutations(seq_len) + [torch.randperm(seq_len) for _ in range(20)]
    for perm in perms:  # each (seq_len,)
        if not torch.allclose(layer(x[perm]), output[perm], atol=1e-5, rtol=1e-5):
            return False
    return True


def _attention(
    x: Tensor, query_weight: Tensor, key_weight: Tensor, value_weight: Tensor, causal: bool = False
) -> Tensor:
    """Unscaled self-attention of one sequence: ``x (seq_len, d)`` → ``(seq_len, d_v)``."""
    scores = (x @ query_weight) @ (x @ key_weight).T  # (seq_len, seq_len)
    if causal:
        seq_len = x.shape[0]
        # (seq_len, seq_len), True for the keys after the query
        blocked = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(blocked, float("-inf"))  # (seq_len, seq_len)
    return torch.softmax(scores, dim=-1) @ (x @ value_weight)  # (seq_len, d_v)


def _position_codes(positions: Tensor, d: int) -> Tensor:
    """Sinusoidal codes ``(seq_len, d)`` for the (float) ``positions`` ``(seq_len,)`` (chapter 4)."""
    rates = 1.0 / 10.0 ** (torch.arange(d, dtype=torch.float32) / d)  # (d,)
    phases = (torch.arange(d) % 2) * (math.pi / 2)  # (d,): sin, cos, sin, ...
    return torch.sin(positions[:, None] * rates + phases)  # (seq_len, d)


def _order_parity_sign(values: Tensor) -> Tensor:
    """``+1`` when ``values (seq_len,)`` has an even number of inversions (pairs ``i < j`` with
    ``values[i] > values[j]``), else ``-1``: reordering the tokens by a permutation multiplies it
    by that permutation's sign."""
    inversions = (values[:, None] > values[None, :]).triu(1).sum()  # pairs out of order
    return 1.0 - 2.0 * (inversions % 2).float()  # scalar tensor: +1 or -1


def _forwards_minus_backwards(x: Tensor) -> Tensor:
    """Σ_i x_i added in token order minus the same sum in reverse order, on every output row.

    Plain float32 additions one row at a time (no library reduction, whose order or
    accumulator could differ between machines), so the rounding is the same on every CPU.
    """
    forwards, backwards = x[0], x[-1]  # (d,) each
    for i in range(1, x.shape[0]):
        forwards = forwards + x[i]  # (d,)
        backwards = backwards + x[-1 - i]  # (d,)
    return (forwards - backwards).expand_as(x)  # (seq_len, d)


def equivariance_test_layers(d: int = 4) -> dict[str, NamedLayer]:
    """The layers the equivariance check feeds to the reader's test, by name.

    Equivariant: self-attention, a per-token linear layer, attention plus the mean token, and
    the tokens summed forwards minus backwards (0 up to float32 rounding, which moves with them).
    Not equivariant: the signs of the tokens with a mark of just under
    :data:`EQUIVARIANCE_SMALLEST_CHANGE` at each position (every reordering that moves a token
    changes an output of size 1 by that much), attention with added position codes (large,
    small, or symmetric under
    reversal, or alike at positions 0 and 1, or only on the middle positions and alike under the
    reversal), causal attention, a window layer over the
    flattened sequence, two circular convolutions along the sequence (one commutes with
    cyclic shifts only; the other, with a symmetric kernel, also with the reversal), and
    attention whose output rows are then put in a wrong order (reversed, shifted by one,
    each column sorted): the right rows, so only a comparison row by row catches them; and
    attention plus ±0.5 by the parity of the tokens' order, changed only by odd reorderings.

    Args:
        d: width of a token vector, ``d_in = d_out = d``.
    """
    g = seeded_generator(110)
    std = 1 / math.sqrt(d)
    query_weight, key_weight, value_weight = (
        std * torch.randn(d, d, generator=g) for _ in range(3)
    )
    token_layer = std * torch.randn(d, d, generator=g)  # (d, d)
    kernel = std * torch.randn(3, d, d, generator=g)  # (3, d, d): offsets -1, 0, +1
    direction = torch.randn(d, generator=seeded_generator(114))  # (d,): reads one number per token

    def attention(x: Tensor) -> Tensor:
        return _attention(x, query_weight, key_weight, value_weight)  # (seq_len, d)

    def with_positions(
        scale: float,
        symmetric: bool = False,
        first_two_alike: bool = False,
        middle_only: bool = False,
    ) -> Callable[[Tensor], Tensor]:
        def layer(x: Tensor) -> Tensor:
            seq_len = x.shape[0]
            positions = torch.arange(seq_len, dtype=torch.float32)  # (seq_len,)
            if symmetric:  # position i and position seq_len-1-i get the same code
                positions = (positions - (seq_len - 1) / 2).abs()  # (seq_len,)
            if first_two_alike:  # positions 0 and 1 get the same code: swapping them is harmless
                positions = positions.clamp(min=1.0)  # (seq_len,)
            codes = _position_codes(positions, d)  # (seq_len, d)
            if middle_only:  # no code on the first two and last two positions
                inner = torch.zeros(seq_len, 1)  # (seq_len, 1)
                inner[2 : seq_len - 2] = 1.0
                codes = codes * inner  # (seq_len, d)
            return attention(x + scale * codes)  # (seq_len, d)

        return layer

    def window(x: Tensor) -> Tensor:
        seq_len = x.shape[0]
        weight = (
            torch.randn(seq_len * d, seq_len * d, generator=seeded_generator(111 + seq_len))
            / seq_len
        )  # fixed per seq_len
        return (x.reshape(-1) @ weight).reshape(seq_len, d)  # (seq_len, d)

    def circular_conv(x: Tensor) -> Tensor:
        return sum(torch.roll(x, shift, dims=0) @ kernel[shift + 1] for shift in (-1, 0, 1))

    def symmetric_circular_conv(x: Tensor) -> Tensor:
        # the same matrix for both neighbours: commutes with every cyclic shift AND the reversal
        neighbours = torch.roll(x, 1, dims=0) + torch.roll(x, -1, dims=0)  # (seq_len, d)
        return x @ kernel[1] + neighbours @ kernel[0]  # (seq_len, d)

    return {
        "self-attention": NamedLayer("self-attention", attention),
        "per-token linear layer": NamedLayer("per-token linear layer", lambda x: x @ token_layer),
        "attention plus the mean token": NamedLayer(
            "attention plus the mean token", lambda x: attention(x) + x.mean(0, keepdim=True)
        ),
        # 0 in exact arithmetic and equivariant; in float32 the two sums round differently, so
        # its outputs are rounding noise near 0 (about 1e-7) that moves when the tokens move:
        # torch.allclose's default atol=1e-8 rejects it on any machine, atol=1e-5 accepts it
        "the tokens summed forwards minus backwards": NamedLayer(
            "the tokens summed forwards minus backwards", _forwards_minus_backwards
        ),
        "attention with position codes": NamedLayer(
            "attention with position codes", with_positions(1.0)
        ),
        "attention with small position codes": NamedLayer(
            "attention with small position codes", with_positions(0.02)
        ),
        # the smallest change the check plants, the same under every reordering that moves a
        # token: a tolerance of 1e-4 or more on outputs of size 1 (atol=1e-4, or rtol=1e-4)
        # hides it whatever the draws, while atol=1e-5 with rtol=1e-5 (2e-5 there) sees it
        _MARKED_SIGNS_NAME: NamedLayer(_MARKED_SIGNS_NAME, _marked_signs),
        "attention with reversal-symmetric codes": NamedLayer(
            "attention with reversal-symmetric codes", with_positions(1.0, symmetric=True)
        ),
        "causal self-attention": NamedLayer(
            "causal self-attention",
            lambda x: _attention(x, query_weight, key_weight, value_weight, causal=True),
        ),
        "window layer": NamedLayer("window layer", window),
        "circular convolution": NamedLayer("circular convolution", circular_conv),
        "circular convolution with a symmetric kernel": NamedLayer(
            "circular convolution with a symmetric kernel", symmetric_circular_conv
        ),
        "attention with codes alike at positions 0 and 1": NamedLayer(
            "attention with codes alike at positions 0 and 1",
            with_positions(1.0, first_two_alike=True),
        ),
        # codes on the middle positions only, alike under the reversal: the reversal and any
        # swap among the first two or the last two positions leave it unchanged
        "attention with codes on the middle positions only": NamedLayer(
            "attention with codes on the middle positions only",
            with_positions(1.0, symmetric=True, middle_only=True),
        ),
        # the right output rows in a wrong order: the same multiset of rows as an equivariant
        # layer's, so a test that compares sorted outputs cannot tell them apart
        "attention, then the output rows reversed": NamedLayer(
            "attention, then the output rows reversed", lambda x: attention(x).flip(0)
        ),
        "attention, then the output rows shifted by one": NamedLayer(
            "attention, then the output rows shifted by one",
            lambda x: torch.roll(attention(x), 1, dims=0),
        ),
        "attention, then each output column sorted": NamedLayer(
            "attention, then each output column sorted", lambda x: attention(x).sort(0).values
        ),
        # changed only by the odd reorderings (an odd number of swaps): half of all
        # permutations are even, so one random permutation misses it half of the time
        "attention plus the parity of the tokens' order": NamedLayer(
            "attention plus the parity of the tokens' order",
            lambda x: attention(x) + 0.5 * _order_parity_sign(x @ direction),
        ),
    }


#: The smallest change exercise 4's check plants (rounded; exactly 1677 * 2**-24, just under
#: 1e-4 and exact in float32), on outputs of size 1: a test must catch it, so its tolerance on
#: outputs of size 1 must stay below 1e-4. Float32 rounding on the check's cases stays under 1e-5.
EQUIVARIANCE_SMALLEST_CHANGE = 1e-4
_MARK = 1677 * 2.0**-24  # 9.9957e-5: 1 - _MARK is exact in float32, and so is 1 - (1 - _MARK)
_MARKED_SIGNS_NAME = "the signs of the tokens, then a 1e-4 mark at each position"


def _marked_signs(x: Tensor) -> Tensor:
    """``x (seq_len, d)`` → ``(seq_len, d + seq_len)``: the sign of every entry (±1, which
    reorders with the tokens), then ``1 - I * _MARK``, whose mark stays at the position.

    A reordering that moves token ``i`` changes row ``i``'s mark columns by exactly ``_MARK`` on
    entries of size 1 (or ``1 - _MARK``), and nothing else: every reordering except the identity
    shows the same change, so a tolerance's verdict on this layer does not depend on the draws.
    """
    seq_len = x.shape[0]
    marks = torch.ones(seq_len, seq_len) - _MARK * torch.eye(seq_len)  # (seq_len, seq_len)
    return torch.cat([x.sign(), marks], dim=-1)  # (seq_len, d + seq_len)


def _one_token_layer(position: int, d: int = 4) -> NamedLayer:
    """Self-attention plus a fixed vector on output row ``position`` (from 0; -1 is the last).

    It commutes with exactly the reorderings that leave the token at ``position`` in place: on
    two tokens that is the identity only, so each random draw misses it with probability 1/2.
    """
    layers = equivariance_test_layers(d)
    marker = torch.randn(d, generator=seeded_generator(115))  # (d,)

    def layer(x: Tensor) -> Tensor:
        out = layers["self-attention"](x)  # (seq_len, d)
        bump = torch.zeros_like(out)  # (seq_len, d)
        bump[position] = marker
        return out + bump

    row = "the last output row" if position == -1 else f"output row {position}"
    name = f"attention plus a fixed vector on {row} only" + (
        "" if position == -1 else " (counting from 0)"
    )
    return NamedLayer(name, layer)


def _largest_first_layer(d: int = 4) -> NamedLayer:
    """Self-attention plus a fixed vector on output row 0 when token 0 has the largest first
    feature of the sequence.

    On a sequence whose largest first feature is at index 2 of 4, the reversal, the cyclic
    shifts by one and the swap of the ends all leave that token off row 0, so each commutes
    with the layer at this input; a reordering that brings it to row 0 (one random draw in 4)
    does not. Such fixed reorderings generate every other one, yet a test checks them at one
    input only, where they do not compose.
    """
    layers = equivariance_test_layers(d)
    marker = torch.randn(d, generator=seeded_generator(118))  # (d,)

    def layer(x: Tensor) -> Tensor:
        out = layers["self-attention"](x)  # (seq_len, d)
        bump = torch.zeros_like(out)  # (seq_len, d)
        if int(x[:, 0].argmax()) == 0:
            bump[0] = marker
        return out + bump

    return NamedLayer("attention plus a fixed vector on row 0 when token 0 is the largest", layer)


def _cycled_order_layer(d: int = 4) -> NamedLayer:
    """Self-attention plus a fixed vector on output row 0 when the tokens, ranked by their first
    feature, stand in an even order other than sorted (on three tokens: a rotation by one or two).

    On three tokens sorted by their first feature, every swap of two tokens leaves an odd order,
    so each commutes with the layer at this input; the two rotations (a random draw in 3) do
    not. All three swaps generate every reordering, yet checked at one input they do not compose.
    """
    layers = equivariance_test_layers(d)
    marker = torch.randn(d, generator=seeded_generator(120))  # (d,)

    def layer(x: Tensor) -> Tensor:
        out = layers["self-attention"](x)  # (seq_len, d)
        order = x[:, 0].argsort().tolist()  # the ranks' order
        seq_len = len(order)
        inversions = sum(order[i] > order[j] for i in range(seq_len) for j in range(i + 1, seq_len))
        if inversions > 0 and inversions % 2 == 0:
            bump = torch.zeros_like(out)  # (seq_len, d)
            bump[0] = marker
            out = out + bump
        return out

    return NamedLayer("attention plus a fixed vector on row 0 when the tokens are rotated", layer)


#: How many two-token cases of the one-token layers the equivariance check adds: a test that
#: draws k random permutations from the global generator sees only the identity on one of them
#: with probability 2^-k, so it catches all of them, and can pass, with probability under
#: (1 - 2^-k) ** 96 per seed of EQUIVARIANCE_GLOBAL_SEEDS, about 5% for k = 5. (A generator
#: seeded inside the test repeats its draws on every case of one length: the parity layer's
#: many lengths catch such a test instead.)
EQUIVARIANCE_TWO_TOKEN_CASES = 96

#: How many extra three-token cases of the layer that breaks only when the middle token moves
#: (output row 1): the swap of the ends leaves that token in place, and so does one random draw
#: in 3, so a test that tries the swap and one random permutation passes all of them with
#: probability (2/3) ** 21, about 2e-4 (with the case above), whatever its generator.
EQUIVARIANCE_MIDDLE_TOKEN_CASES = 20

#: The longest of the parity layer's cases: it is checked at every length from 4 to this one.
EQUIVARIANCE_PARITY_LONGEST = 40

#: The seeds the equivariance check gives PyTorch's global generator, one full run of the
#: reader's test each: a test drawing unseeded random permutations gets the same verdict every
#: time, and one whose verdict depends on its draws (too few of them) fails under one of them.
#: A test of 7 or 10 unseeded draws passes at seed 0 but not under all five.
EQUIVARIANCE_GLOBAL_SEEDS = (0, 1, 2, 3, 4)


def equivariance_check_inputs() -> list[tuple[NamedLayer, Tensor]]:
    """The ``(layer, x)`` pairs :func:`check_is_permutation_equivariant` runs a reader's test on.

    Each ``x`` is a sequence of shape ``(seq_len, 4)`` and each layer maps it to a tensor of the
    same length; the same pairs, in the same order, on every call (seeded). Chapter 1 measures
    on them the sizes its exercise 4 hint quotes: the float32 rounding of the equivariant layers
    and the smallest change the others plant.
    """
    return [(case["layer"], case["x"]) for case in _equivariance_cases()]


def _equivariance_cases() -> list[Case]:
    g = seeded_generator(112)
    layers = equivariance_test_layers()
    x7 = torch.randn(7, 4, generator=g)  # (7, 4)
    x7[6] = x7[3]  # two equal tokens, like the two "learning"s
    cases: list[Case] = [{"layer": layers["self-attention"], "x": x7}]
    parity = "attention plus the parity of the tokens' order"
    for name in layers:
        if name not in ("self-attention", parity):
            cases.append({"layer": layers[name], "x": torch.randn(6, 4, generator=g)})
    # two tokens: the only reordering is the swap; three tokens: six reorderings, three of
    # them cyclic. A test that draws one random permutation draws the identity (and sees
    # nothing) with probability 1/2 or 1/6 on each of these short cases
    for name, seq_len in (
        ("attention with position codes", 2),
        ("causal self-attention", 2),
        ("window layer", 2),
        ("circular convolution", 3),  # only the three reflections change its outputs
        ("attention with position codes", 3),
    ):
        cases.append({"layer": layers[name], "x": torch.randn(seq_len, 4, generator=g)})
    cases.append({"layer": layers["self-attention"], "x": 3 * torch.randn(9, 4, generator=g)})
    # the parity layer at 37 lengths, 4 to 40 (13 to 40 at the end of the list, from their own
    # generator, so the earlier cases keep their inputs): a test whose k draws per length repeat
    # on every call (a generator seeded inside it) catches it at one length unless all k draws
    # are even, 2^-k, and passes only if it catches it at all 37: (1 - 2^-k) ** 37, under 1%
    # for k = 3 and about 31% for k = 5
    for seq_len in range(4, 13):
        cases.append({"layer": layers[parity], "x": torch.randn(seq_len, 4, generator=g)})
    # layers that break only when one particular token moves, on two tokens (the swap is the
    # only reordering) and on three (a random draw leaves the token in place one time in 3)
    one_token = [_one_token_layer(0), _one_token_layer(1), _one_token_layer(2)]
    for count in range(EQUIVARIANCE_TWO_TOKEN_CASES):
        layer = one_token[count % 2]
        cases.append({"layer": layer, "x": torch.randn(2, 4, generator=g)})
    for layer in one_token:
        cases.append({"layer": layer, "x": torch.randn(3, 4, generator=g)})
    g_parity = seeded_generator(116)
    for seq_len in range(13, EQUIVARIANCE_PARITY_LONGEST + 1):
        cases.append({"layer": layers[parity], "x": torch.randn(seq_len, 4, generator=g_parity)})
    g_middle = seeded_generator(117)  # their own generator: the cases above keep their inputs
    for _ in range(EQUIVARIANCE_MIDDLE_TOKEN_CASES):
        cases.append({"layer": one_token[1], "x": torch.randn(3, 4, generator=g_middle)})
    # four tokens, the largest first feature at index 2: only a reordering that brings it to row
    # 0 moves the layer's bump, and no fixed reversal, shift by one or swap of the ends does
    x4 = torch.randn(4, 4, generator=seeded_generator(119))  # (4, 4)
    x4[2, 0] = x4[:, 0].max() + 1.0
    cases.append({"layer": _largest_first_layer(), "x": x4})
    # three tokens sorted by their first feature: every swap of two leaves an odd order, which
    # the layer ignores; only the two rotations move its bump
    x3 = torch.randn(3, 4, generator=seeded_generator(121))  # (3, 4)
    x3 = x3[x3[:, 0].argsort()]
    cases.append({"layer": _cycled_order_layer(), "x": x3})
    # seven tokens, the layer breaks only when the last token moves: a test that reorders only
    # the first few tokens (a random permutation of x.shape[-1] = 4 rows, say) never moves it
    x7_last = torch.randn(7, 4, generator=seeded_generator(122))  # (7, 4)
    cases.append({"layer": _one_token_layer(-1), "x": x7_last})
    return cases


def equivariance_gap(layer: Callable[[Tensor], Tensor], x: Tensor) -> float:
    """The largest ``|layer(x[perm]) - layer(x)[perm]|`` over the reference's permutations.

    The reversal, a cyclic shift, the swap of the first and last tokens and 20 random
    permutations (the fixed ones :func:`reference_is_permutation_equivariant` tries first). For an
    equivariant layer in float32 it is rounding, about ``1e-7`` times the outputs' size.

    Args:
        layer: maps ``(seq_len, d_in)`` to ``(seq_len, d_out)``.
        x: one sequence, shape ``(seq_len, d_in)``.
    """
    seq_len = x.shape[-2]
    output = layer(x)  # (seq_len, d_out)
    perms = probe_permutations(seq_len)
    return max((layer(x[perm]) - output[perm]).abs().max().item() for perm in perms)


def _rejects_the_identity(test: Callable[[Callable[[Tensor], Tensor], Tensor], object]) -> bool:
    """Does the reader's test reject the identity layer, whose outputs reorder exactly?

    Only a test that compares ``layer(x[perm])`` with something other than ``layer(x)[perm]``
    (the unshuffled ``layer(x)``, or the output reordered by the inverse permutation) does:
    exact equality and any tolerance accept it.
    """
    identity = NamedLayer("identity", lambda x: x.clone())
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4)  # six different tokens
    try:
        verdict = test(identity, x)
    except Exception:  # noqa: BLE001 - the reader's code: any failure means "not accepted"
        return False
    if isinstance(verdict, Tensor) and verdict.numel() == 1:
        verdict = bool(verdict)
    return verdict is False


def _accepts_despite_a_failed_comparison(
    test: Callable[[Callable[[Tensor], Tensor], Tensor], object],
) -> bool:
    """Does the reader's test return True although one of its own comparisons failed (any in
    place of all)?

    It gets a layer that adds a large vector to row 0 (a change of 1 or more: no tolerance
    hides it), on four tokens. A reordering that moves token 0 changes the outputs; one that
    leaves it in place does not. A test that tried a reordering moving token 0 and still
    returns True accepted a failed comparison. (A test that stops at its first passing
    comparison, ``any(...)``, tries only that one on the real case, so the case alone does not
    show the slip.) PyTorch's global generator is given back afterwards.
    """
    x = torch.arange(16, dtype=torch.float32).reshape(4, 4)  # four different tokens
    tried: list[Tensor] = []

    def row_zero_marked(t: Tensor) -> Tensor:
        tried.append(t.detach().clone())
        out = t.clone()  # (seq_len, d)
        out[0] += 10.0
        return out

    with torch.random.fork_rng(devices=[]):
        try:
            verdict = as_verdict(test(NamedLayer("row 0 marked", row_zero_marked), x.clone()))
        except Exception:  # noqa: BLE001 - the reader's code: any failure means "no verdict"
            return False
    perms = _tried_permutations(tried, x)
    return verdict is True and perms is not None and any(int(p[0]) != 0 for p in perms)


def _ignores_row_order(test: Callable[[Callable[[Tensor], Tensor], Tensor], object]) -> bool:
    """Does the reader's test compare outputs in a way blind to which row is which (sorted
    outputs, say)?

    It does when it accepts a layer whose output is the same whatever the order of the tokens
    (each column sorted), which any row-by-row comparison under a real reordering rejects, and
    still rejects a layer that multiplies each row by its position + 1 (so it does reorder):
    a layer whose sorted columns and column sums both change under a reordering, so sorted and
    summed comparisons (invariance in place of equivariance) are both caught.
    """
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4)  # six different tokens

    def verdict(layer: NamedLayer) -> object:
        try:
            got = test(layer, x.clone())
        except Exception:  # noqa: BLE001 - the reader's code: any failure means "no verdict"
            return None
        return bool(got) if isinstance(got, Tensor) and got.numel() == 1 else got

    order_blind = NamedLayer("each column sorted", lambda t: t.sort(0).values)
    positioned = NamedLayer(
        "each row times its position + 1", lambda t: t * (1.0 + torch.arange(t.shape[0]))[:, None]
    )
    return verdict(order_blind) is True and verdict(positioned) is False


def _tried_permutations(inputs: list[Tensor], x: Tensor) -> list[Tensor] | None:
    """The reorderings of ``x (seq_len, d)`` that the reader's test handed the layer, each a
    ``(seq_len,)`` index tensor (``x[perm]`` is that input), read from the layer's recorded
    ``inputs``; ``None`` when an input is not ``x`` with its rows reordered (features shuffled,
    noise added) or the layer was never called, so the reorderings tried are unknown."""
    if not inputs:
        return None
    perms = []
    for t in inputs:
        if t.shape != x.shape:
            return None
        # (seq_len, seq_len): row r of t is row j of x
        same = (t[:, None, :] == x[None, :, :]).all(dim=-1)
        if not same.any(dim=-1).all():
            return None
        perms.append(same.float().argmax(dim=-1))  # (seq_len,): the first matching row of x
    return perms


def _is_transposition(perm: Tensor) -> bool:
    """Does ``perm (seq_len,)`` exchange exactly two tokens?"""
    return int((perm != torch.arange(perm.shape[0])).sum()) == 2


def _swap_two(seq_len: int, i: int, j: int) -> Tensor:
    """``(seq_len,)``: the reordering that exchanges tokens ``i`` and ``j``."""
    perm = torch.arange(seq_len)
    perm[[i, j]] = perm[[j, i]]
    return perm


def _is_even(perm: Tensor) -> bool:
    """Is ``perm (seq_len,)`` an even permutation (an even number of swaps)?"""
    return bool(_order_parity_sign(perm.float()) > 0)


def _reorderings_hint(layer: Callable[[Tensor], Tensor], x: Tensor, perms: list[Tensor]) -> str:
    """What the reorderings the reader's test tried on this case (``perms``, none the identity)
    missed: the hint of a test that accepted a layer that is not equivariant."""
    output = layer(x)  # (seq_len, d_out)
    changes = [(layer(x[perm]) - output[perm]).abs().max().item() for perm in perms]
    tried = f"Your test tried {len(perms)} reordering{'s' if len(perms) > 1 else ''} here"
    none = "none of them changes" if len(perms) > 1 else "it does not change"
    if max(changes) > 0.1:
        return (
            f" {tried}, and one of them changes the outputs by {max(changes):.1e}, yet it "
            "returned True: does it return False as soon as one comparison fails (all, not any)?"
        )
    if max(changes) > 1e-4:
        return (
            f" {tried}; the largest change they make, {max(changes):.1e}, is not rounding: "
            f"{_TOO_LOOSE}"
        )
    kinds = ""
    if all(_is_even(perm) for perm in perms):
        kinds = (
            " (all of them even: an even number of swaps)" if len(perms) > 1 else " (an even one)"
        )
    seq_len = x.shape[0]
    if all(_is_transposition(perm) for perm in perms):
        each = "each of them swaps" if len(perms) > 1 else "it swaps"
        swaps = [_swap_two(seq_len, i, j) for i in range(seq_len) for j in range(i + 1, seq_len)]
        if all(
            torch.allclose(layer(x[perm]), output[perm], atol=1e-5, rtol=1e-5) for perm in swaps
        ):
            found = (
                "At this input no swap of two tokens changes the outputs, but a reordering that "
                "moves three or more tokens does (swaps generate every reordering, but checked "
                "at one input only they do not compose)"
            )
        else:
            found = (
                "Other reorderings do change them (swaps, even a set that generates every "
                "reordering, are checked at this one input only, where they do not compose)"
            )
        return (
            f" {tried}, and {none} this layer's outputs{kinds}: {each} just two tokens. "
            f"{found}: draw random permutations of all the tokens (torch.randperm), not only "
            "swaps"
        )
    never_moved = [t for t in range(seq_len) if all(int(perm[t]) == t for perm in perms)]
    if never_moved and seq_len > 3 and not kinds:
        which = ", ".join(str(t) for t in never_moved)
        plural = "s" if len(never_moved) > 1 else ""
        return (
            f" {tried}, and {none} this layer's outputs. None of them moves token{plural} "
            f"{which} (counting from 0): draw random permutations of all the tokens, "
            "torch.randperm(x.shape[0])"
        )
    if any(_is_transposition(perm) for perm in perms):
        return (
            f" {tried}, and {none} this layer's outputs{kinds}. Your test already "
            "swaps two tokens: draw more random permutations (fixed "
            "reorderings that generate all the others are checked at this one input only, "
            "where they do not compose)"
        )
    return (
        f" {tried}, and {none} this layer's outputs{kinds}. Try more reorderings: "
        "the swap of two tokens, and random permutations"
    )


#: The hint of a test whose tolerance lets a real (if small) change through.
_LOOSE_TOLERANCE = (
    "Your test needs a stricter tolerance: it must catch a change just under 1e-4 on outputs of "
    "size 1, so it must allow less than that there, max|diff| < 1e-4 included (float32 rounding "
    "stays under 1e-5)"
)
_TOO_LOOSE = "your tolerance is too loose"
_TOLERANCE_HINTS = (_LOOSE_TOLERANCE, _TOO_LOOSE)


def _identity_only_hint(seq_len: int) -> str:
    """The hint of a test whose every reordering of this case was the identity."""
    if seq_len > 3:  # not bad luck (1/24 or less per draw): a test that stops too early, say
        return (
            " On this case all your permutations were the identity. Include a permutation that "
            "moves something; if your test stops early, it must stop at the first comparison "
            "that fails (all, not any)"
        )
    chance = "half the time" if seq_len == 2 else "one time in 6"
    return (
        f" On this case all your permutations were the identity: a random permutation of "
        f"{seq_len} tokens is the identity {chance}. Include a permutation that moves "
        "something (such as the swap of two tokens)"
    )


def _equivariance_verdict_problem(
    got: object,
    expected: bool,
    case: Case,
    test: Callable[..., object] | None = None,
    inputs: list[Tensor] | None = None,
) -> str | None:
    """Why the reader's verdict ``got`` on ``case`` is wrong, or ``None`` when it is right.

    ``test`` (the reader's function) is probed on the identity layer when it rejects an
    equivariant layer, to tell a wrong comparison from a too strict tolerance. ``inputs`` are
    what the test handed the layer on this case: when they are not ``x`` with its rows
    reordered (features reordered, say), the message says so; when the test accepts a layer
    that is not equivariant, they say which reorderings it tried (all the identity, say)."""
    layer, x = case["layer"], case["x"]
    got = as_verdict(got)  # a bool tensor or NumPy's bool (np.all's) is a right answer too
    if not isinstance(got, bool):
        return f"your test must return True or False, got {type(got).__name__} {got!r}"[:200]
    if got == expected:
        return None
    gap = equivariance_gap(layer, x)
    size = layer(x).abs().max().item()
    tokens = f"{x.shape[0]} tokens"
    if expected and test is not None and _rejects_the_identity(test):
        return (
            f"your test rejected {layer!r} ({tokens}), a layer that IS permutation-equivariant, "
            "and it even rejects the identity layer, whose outputs reorder exactly: the "
            "tolerance is not the problem, the comparison is. Compare layer(x[perm]) with "
            "layer(x)[perm], the original output reordered by the same perm (not with "
            "layer(x) itself, nor with the output reordered by the inverse permutation)"
        )
    perms = _tried_permutations(inputs or [], x)  # None: not known
    if inputs and perms is None:  # the layer was called, but not on x with its rows reordered
        verdict = "rejected" if expected else "accepted"
        kind = "IS" if expected else "is NOT"
        return (
            f"your test {verdict} {layer!r} ({tokens}), a layer that {kind} "
            "permutation-equivariant. The inputs your test handed the layer are not x with its "
            "rows (tokens) reordered: reorder the rows, x[perm] with perm a permutation of "
            "range(x.shape[0]), not the features (x[:, perm]) and without changing any value"
        )
    if expected:
        return (
            f"your test rejected {layer!r} ({tokens}), a layer that IS permutation-equivariant; "
            f"its outputs differ from the permuted ones by at most {gap:.1e} (on outputs up to "
            f"{size:.1e}), float32 rounding: a reordered sum differs in its last bits. If your "
            "test compares layer(x[perm]) with layer(x)[perm], its comparison is too strict: "
            "exact equality rejects rounding, and so can torch.allclose's default tolerance "
            "(atol=1e-8, plus rtol=1e-5 of each entry: almost nothing where an output is near "
            "0). Compare with a tolerance such as atol=1e-5"
        )
    identity = torch.arange(x.shape[0])  # (seq_len,)
    moved = None if perms is None else [p for p in perms if not torch.equal(p, identity)]
    if moved == []:
        hint = _identity_only_hint(x.shape[0])
    elif test is not None and _ignores_row_order(test):
        hint = (
            " Your comparison ignores which output row is which (sorted or summed outputs, "
            "say: that tests invariance, not equivariance): compare layer(x[perm]) with "
            "layer(x)[perm] row by row"
        )
    elif (
        moved and max((layer(x[perm]) - layer(x)[perm]).abs().max().item() for perm in moved) > 0.1
    ):  # the case itself shows a failed comparison that the test accepted
        hint = _reorderings_hint(layer, x, moved)
    elif test is not None and _accepts_despite_a_failed_comparison(test):
        hint = (
            " Your test returns True even when one of its comparisons fails: on a layer that "
            "adds 10 to row 0, it tried a reordering that moves token 0 and still returned "
            "True. Return False as soon as one comparison fails (all, not any)"
        )
    elif gap < 0.1:
        hint = f" {_LOOSE_TOLERANCE}"
    elif moved:
        hint = _reorderings_hint(layer, x, moved)
    else:
        hint = " Try more reorderings: the swap of two tokens, and random permutations"
    return (
        f"your test accepted {layer!r} ({tokens}), a layer that is NOT permutation-equivariant: "
        f"some reordering changes its outputs by {gap:.1e} beyond the reordering itself.{hint}"
    )


#: The adaptive case: how many tokens its input has, and the two seeds of PyTorch's global
#: generator for the reader's two calls (the second one different: fresh draws change with it).
EQUIVARIANCE_ADAPTIVE_TOKENS = 6
EQUIVARIANCE_ADAPTIVE_SEEDS = (1001, 1002)


def adaptive_false_reject_probability(tried: int, draws: int, seq_len: int | None = None) -> float:
    """How likely the adaptive case rejects a right test that draws ``draws`` fresh random
    permutations: it does when every one of them lands among the ``tried`` reorderings of the
    first call (the identity included), probability ``(tried / n!) ** draws`` for ``n`` tokens
    (:data:`EQUIVARIANCE_ADAPTIVE_TOKENS` unless ``seq_len`` is given).

    A fixed reordering such as the swap of the ends is tried on both calls and counts in
    ``tried`` but not in ``draws``.
    """
    n = EQUIVARIANCE_ADAPTIVE_TOKENS if seq_len is None else seq_len
    return min(1.0, tried / math.factorial(n)) ** draws


def _adaptive_input() -> Tensor:
    """``(EQUIVARIANCE_ADAPTIVE_TOKENS, 4)``: different tokens, so a reordering of them is known
    from the rows alone."""
    return torch.randn(EQUIVARIANCE_ADAPTIVE_TOKENS, 4, generator=seeded_generator(123))


def _adaptive_layer(x: Tensor, allowed: list[Tensor]) -> NamedLayer:
    """Self-attention, plus a fixed vector on output row 0 whenever its input is ``x`` reordered
    by a permutation outside ``allowed`` (each ``(seq_len,)``, the identity among them).

    At ``x`` it commutes with exactly the reorderings in ``allowed``: a reordering ``p`` outside
    them changes row 0 of ``layer(x[p])`` but not of ``layer(x)[p]``, by the vector (size 1 or
    more). On any other input it is self-attention.
    """
    attention = equivariance_test_layers()["self-attention"]
    marker = torch.randn(x.shape[1], generator=seeded_generator(124))  # (d,)
    marker = marker / marker.abs().max()  # largest entry 1: no tolerance hides it
    allowed_keys = {tuple(p.tolist()) for p in allowed}

    def layer(t: Tensor) -> Tensor:
        out = attention(t)  # (seq_len, d)
        perms = _tried_permutations([t], x)
        if perms is not None and tuple(perms[0].tolist()) not in allowed_keys:
            bump = torch.zeros_like(out)  # (seq_len, d)
            bump[0] = marker
            out = out + bump
        return out

    return NamedLayer("attention, changed only by the reorderings your first call left out", layer)


def adaptive_case_problem(
    test: Callable[[Callable[[Tensor], Tensor], Tensor], object],
) -> str | None:
    """The adaptive case: why the reader's test is a fixed list, or ``None`` when it is not.

    1. Call the test on self-attention and a 6-token ``x`` (global seed 1001); record the set S
       of reorderings of ``x`` it hands the layer.
    2. Build a layer that commutes with the reorderings in S at ``x``, and with no other one
       (:func:`_adaptive_layer`).
    3. Call the test on it (global seed 1002). Fresh random draws leave S and return False; a
       fixed list (enumerated, or drawn from a generator seeded inside the test) tries S again
       and returns True. Unless S is all 720 reorderings: then the layer is equivariant at
       ``x`` and True is right.

    A right test of ``k`` fresh draws is wrongly rejected here with probability
    :func:`adaptive_false_reject_probability` (below 1e-30 for the solution's 20).
    """
    x = _adaptive_input()  # (6, 4)
    attention = equivariance_test_layers()["self-attention"]
    inputs: list[Tensor] = []

    def recorded(layer: Callable[[Tensor], Tensor]) -> NamedLayer:
        def fn(t: Tensor) -> Tensor:
            inputs.append(t.detach().clone())
            return layer(t)

        return NamedLayer(getattr(layer, "name", "layer"), fn)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EQUIVARIANCE_ADAPTIVE_SEEDS[0])
        try:
            first = as_verdict(test(recorded(attention), x.clone()))
        except Exception:  # noqa: BLE001 - the reader's code: the other cases explain failures
            return None
    if first is not True:  # the other cases explain a wrong verdict on an equivariant layer
        return None
    tried = [t for t in inputs if t.shape == x.shape]
    perms = [p[0] for p in (_tried_permutations([t], x) for t in tried) if p is not None]
    allowed = {tuple(p.tolist()) for p in perms} | {tuple(range(x.shape[0]))}
    everything = len(allowed) == math.factorial(x.shape[0])
    layer = _adaptive_layer(x, [torch.tensor(p) for p in allowed])
    inputs.clear()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EQUIVARIANCE_ADAPTIVE_SEEDS[1])
        try:
            second = as_verdict(test(recorded(layer), x.clone()))
        except Exception as error:  # noqa: BLE001 - the reader's code
            return f"your test raised {type(error).__name__} on a second call: {error}"[:300]
    if second is not True or everything:  # False is right; with all 720 tried, True is
        return None
    return (
        f"your test accepted {layer!r} ({x.shape[0]} tokens), a layer that is NOT "
        f"permutation-equivariant. On a first call your test tried {len(allowed) - 1} "
        "reorderings of this x; this layer commutes with exactly those and changes (by 1) under "
        "every other one. Called again, with PyTorch's global generator seeded differently, "
        "your test tried only reorderings from that same list: a fixed list (or random draws "
        "from a generator seeded inside your test, which repeat on every call). A layer can "
        "change only under the reorderings a fixed list leaves out: draw fresh random "
        "permutations on every call (torch.randperm without a seeded generator)"
    )


def _expected_equivariance(case: Case) -> bool:
    """The reference's verdict on ``case``, with PyTorch's global generator given back after
    its fresh draws, so that the reader's test sees the same draws as without it."""
    with torch.random.fork_rng(devices=[]):
        return reference_is_permutation_equivariant(case["layer"], case["x"].clone())


def check_is_permutation_equivariant(
    is_permutation_equivariant: Callable[[Callable[[Tensor], Tensor], Tensor], bool],
    verbose: bool = True,
) -> CheckResult:
    """Check the reader's test ``is_permutation_equivariant(layer, x) -> bool``.

    The test gets a layer ``(seq_len, d) → (seq_len, d)`` and one sequence ``x (seq_len, d)``
    and must say whether reordering the tokens reorders the outputs the same way. The check
    hands it equivariant layers (self-attention, a per-token layer, attention plus the mean
    token) and layers that are not (positions added, a causal mask, a window layer, a
    circular convolution), and compares its verdicts with the reference test. A wrong verdict
    is explained: a rejected equivariant layer with the size of its float32 rounding (the
    trap of exact equality and of ``torch.allclose``'s default tolerance), an accepted
    non-equivariant one with the size of the difference it missed and what the test's own
    reorderings of that case were (all the identity, say, or all even). The whole check runs
    once under each of :data:`EQUIVARIANCE_GLOBAL_SEEDS` for PyTorch's global generator (given
    back afterwards): a test that draws unseeded permutations gets the same verdict on every
    call, and it must be right under every seed, not at one lucky seed.
    """
    name = "is_permutation_equivariant"
    _check_callable("the function to check", is_permutation_equivariant)
    cases = _equivariance_cases()
    inputs: list[Tensor] = []  # what the reader's test hands the layer, on the current case

    def arguments(case: Case) -> dict[str, object]:
        layer = case["layer"]
        inputs.clear()

        def recorded(t: Tensor) -> Tensor:
            inputs.append(t.detach().clone())
            return layer(t)

        return {"layer": NamedLayer(layer.name, recorded), "x": case["x"].clone()}

    # A test may draw its permutations from PyTorch's global generator (torch.randperm without
    # a generator). Seeding it here makes the verdict the same on every call for the same test,
    # and running under several seeds rejects a test whose verdict is a matter of seed luck;
    # fork_rng gives the caller's generator back untouched afterwards.
    result: CheckResult | None = None
    for count, seed in enumerate(EQUIVARIANCE_GLOBAL_SEEDS):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            result = run_verdict_check(
                name,
                is_permutation_equivariant,
                cases,
                arguments,
                lambda got, case: _equivariance_verdict_problem(
                    got,
                    _expected_equivariance(case),
                    case,
                    is_permutation_equivariant,
                    list(inputs),
                ),
                what="cases",
                verbose=False,
            )
        if not result:
            if count > 0 and any(hint in result.message for hint in _TOLERANCE_HINTS):
                # the draws decide only whether a change bigger than the loose tolerance was
                # met: one piece of advice, the tolerance
                result.message = (
                    f"{result.message} This happened with PyTorch's global generator seeded "
                    f"with {seed}; under seed {EQUIVARIANCE_GLOBAL_SEEDS[0]} your draws happened "
                    "to include a reordering whose change your tolerance sees. Tighten the "
                    "tolerance rather than counting on the draws."
                )
            elif count > 0:  # right at the earlier seeds: the verdict depends on the draws
                result.message = (
                    f"{result.message} This happened with PyTorch's global generator seeded "
                    f"with {seed}; under seed {EQUIVARIANCE_GLOBAL_SEEDS[0]} every verdict was "
                    "right. Your test's verdict depends on its random draws: try more "
                    "reorderings."
                )
            break
    assert result is not None  # EQUIVARIANCE_GLOBAL_SEEDS is not empty
    if result:
        adaptive = adaptive_case_problem(is_permutation_equivariant)
        if adaptive is not None:
            result = CheckResult(
                name,
                False,
                result.cases_run + 1,
                f"❌ {name}: the last case is wrong.\n   {adaptive}",
            )
    if result and len(EQUIVARIANCE_GLOBAL_SEEDS) > 1:
        result.message = (
            f"✅ {name}: the right verdict on all {len(cases)} cases, under each of "
            f"{len(EQUIVARIANCE_GLOBAL_SEEDS)} seeds of PyTorch's global generator, and on a "
            "layer built from the reorderings your test tried."
        )
    if verbose:
        report(result)
    return result


# --------------------------------------------------------------------------------------------
# Exercise 3: a hand-set head that looks `offset` positions away
# --------------------------------------------------------------------------------------------

#: The least weight every checked query must put on its target key.
OFFSET_HEAD_MIN_WEIGHT = 0.9


def angle_positions(seq_len: int, step_angle: float) -> Tensor:
    """Section 1.6's two position coordinates: position ``i = 1, ..., seq_len`` (row ``i - 1``)
    is ``(cos iθ, sin iθ)``.

    Args:
        seq_len: number of positions, counted from 1 as in section 1.6.
        step_angle: the angle ``θ`` between two neighbouring positions, in radians.

    Returns:
        ``(seq_len, 2)``, float64.
    """
    angles = step_angle * torch.arange(1, seq_len + 1, dtype=torch.float64)  # (seq_len,)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)  # (seq_len, 2)


def offset_head_weights(
    query_weight: Tensor, key_weight: Tensor, content: Tensor, step_angle: float
) -> Tensor:
    """The attention weights of a head on inputs laid out as in section 1.6.

    Position ``i`` (from 1, Python row ``i - 1``) is the word's numbers followed by
    ``(cos iθ, sin iθ)``; the weights are ``softmax(X W_Q (X W_K)ᵀ)``, unscaled as in
    chapter 1, computed in float64.

    Args:
        query_weight: ``(d_content + 2, d_k)``.
        key_weight: ``(d_content + 2, d_k)``.
        content: the words, ``(seq_len, d_content)``.
        step_angle: ``θ`` in radians.

    Returns:
        ``(seq_len, seq_len)``: row ``i - 1`` is query ``i``'s weights over the keys.
    """
    seq_len = content.shape[0]
    x = torch.cat([content.double(), angle_positions(seq_len, step_angle)], dim=-1)
    q = x @ query_weight.detach().double()  # (seq_len, d_k)
    k = x @ key_weight.detach().double()  # (seq_len, d_k)
    return torch.softmax(q @ k.T, dim=-1)  # (seq_len, seq_len)


def reference_offset_head(d_content: int, step_angle: float, offset: int) -> tuple[Tensor, Tensor]:
    """``(query_weight, key_weight)`` = ``(W_Q, W_K)``, each ``(d_content + 2, 2)``: query ``i``
    looks at key ``i + offset``.

    ``W_K`` copies the angle ``jθ``; ``W_Q`` turns the angle ``iθ`` by ``offset · θ`` and
    stretches it by ``κ = 8 / (1 - cos θ)``, so the target key's score leads its neighbours'
    by 8. The rows that read the word are 0.
    """
    turn = offset * step_angle
    rotate = torch.tensor(
        [[math.cos(turn), math.sin(turn)], [-math.sin(turn), math.cos(turn)]]
    )  # (2, 2): the row vector (cos φ, sin φ) becomes (cos(φ + turn), sin(φ + turn))
    stretch = 8 / (1 - math.cos(step_angle))
    query_weight = torch.zeros(d_content + 2, 2)  # (d_content + 2, 2)
    query_weight[d_content:] = stretch * rotate
    key_weight = torch.zeros(d_content + 2, 2)  # (d_content + 2, 2)
    key_weight[d_content:] = torch.eye(2)
    return query_weight, key_weight


def _offset_head_cases() -> list[Case]:
    """(d_content, θ in degrees, offset, seq_len, scale of the word vectors): θ·(seq_len - 1)
    stays within 180°, so that every angle between two positions is seen only once."""
    g = seeded_generator(113)
    settings = [
        (4, 30.0, 1, 7, 1.0),  # the chapter's sentence, the next token
        (4, 30.0, -2, 7, 1.0),  # two back
        (6, 15.0, -1, 12, 1.0),  # small steps: section 1.6's stretch of 30 is not enough
        (3, 36.0, 3, 5, 1.0),
        (5, 20.0, 0, 9, 1.0),  # the token itself
        (4, 22.5, 2, 8, 5.0),  # large word vectors: a head that reads them is pulled away
        (1, 18.0, -3, 10, 3.0),
        (3, 10.0, -1, 10, 1.0),  # fine steps: a fixed stretch of 100 falls short
        (2, 5.0, 2, 12, 1.0),  # ... by far
        (4, 2.0, 1, 8, 1.0),  # a fixed stretch of 1000 falls short
    ]
    cases: list[Case] = []
    for d_content, degrees, offset, seq_len, scale in settings:
        cases.append(
            {
                "d_content": d_content,
                "step_angle": math.radians(degrees),
                "offset": offset,
                "content": scale * torch.randn(seq_len, d_content, generator=g),
            }
        )
    return cases


def _position_turn(query_weight: Tensor, key_weight: Tensor, d_content: int) -> float | None:
    """The angle by which the head turns a query's position relative to a key's, when its
    position block ``W_Q[pos] W_K[pos]ᵀ`` is a stretched rotation; ``None`` otherwise.

    With ``M = W_Q[pos] W_K[pos]ᵀ = κ [[cos t, sin t], [-sin t, cos t]]`` the score of
    positions ``i`` and ``j`` is ``κ cos(iθ + t - jθ)``, so the query looks ``t / θ`` positions
    ahead.
    """
    m = query_weight.detach().double()[d_content:] @ key_weight.detach().double()[d_content:].T
    stretch = math.hypot(m[0, 0].item(), m[0, 1].item())
    is_rotation = torch.allclose(m[1, 1], m[0, 0], atol=1e-4 * stretch) and torch.allclose(
        m[1, 0], -m[0, 1], atol=1e-4 * stretch
    )
    if stretch == 0 or not is_rotation:
        return None
    return math.atan2(m[0, 1].item(), m[0, 0].item())


def _same_angle(a: float, b: float) -> bool:
    """Are the angles ``a`` and ``b`` (radians) equal modulo 2π, up to float32 rounding?"""
    gap = math.remainder(a - b, 2 * math.pi)
    return abs(gap) <= 1e-5 + 1e-3 * abs(b)


def _units_hint(query_weight: Tensor, key_weight: Tensor, case: Case) -> str | None:
    """A hint when the head's turn is ``offset · step_angle`` converted as if it were in the
    wrong unit (``math.radians`` or ``math.degrees`` of a number already in radians)."""
    offset, step_angle = case["offset"], case["step_angle"]
    turn = _position_turn(query_weight, key_weight, case["d_content"])
    if offset == 0 or turn is None:
        return None
    right = offset * step_angle
    for wrong, conversion in (
        (math.radians(right), "math.radians"),
        (math.degrees(right), "math.degrees"),
    ):
        if _same_angle(turn, wrong) and not _same_angle(turn, right):
            return (
                f"your head turns the query by {conversion}(offset · step_angle) = {wrong:.4g} rad, "
                f"not by offset · step_angle = {right:.4g} rad. step_angle is already in radians: "
                "use it as it is"
            )
    return None


def _offset_head_problem(got: object, case: Case) -> str | None:
    """Why the reader's ``(query_weight, key_weight)`` fails ``case``, or ``None`` when it passes."""
    d_content, offset, content = case["d_content"], case["offset"], case["content"]
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return f"return a pair (query_weight, key_weight), got {type(got).__name__}"
    query_weight, key_weight = got
    for name, w in (("query_weight", query_weight), ("key_weight", key_weight)):
        if not isinstance(w, Tensor) or not w.is_floating_point() or w.dim() != 2:
            return f"{name} must be a 2-D float tensor"
        if w.shape[0] != d_content + 2:
            return (
                f"{name} must have d_content + 2 = {d_content + 2} rows (one per input number), "
                f"got shape {tuple(w.shape)}"
            )
    if query_weight.shape[1] != key_weight.shape[1]:
        return (
            "query_weight and key_weight need the same number of columns (d_k), got "
            f"{tuple(query_weight.shape)} and {tuple(key_weight.shape)}"
        )
    weights = offset_head_weights(
        query_weight, key_weight, content, case["step_angle"]
    )  # (seq_len, seq_len)
    if not torch.isfinite(weights).all():
        return "the weights are not finite (NaN or inf in query_weight or key_weight?)"
    seq_len = content.shape[0]
    checked = [i for i in range(seq_len) if 0 <= i + offset < seq_len]  # the others have no key
    tops = {i: int(weights[i].argmax()) for i in checked}
    failing = [i for i in checked if weights[i, i + offset] < OFFSET_HEAD_MIN_WEIGHT]
    if not failing:
        return None
    i = failing[0]
    # messages count positions from 1, as section 1.6 does: query i + 1 is Python row i
    said = (
        f"query {i + 1} puts {weights[i, i + offset].item():.2f} of its weight on key "
        f"{i + offset + 1}"
    )
    mirrored = [j for j in checked if 0 <= j - offset < seq_len]
    units = _units_hint(query_weight, key_weight, case)
    if units:
        return f"{said}; {units}"
    reads_words = bool(query_weight[:d_content].any() or key_weight[:d_content].any())
    words_hint = (
        "your matrices read the word's numbers (their first d_content rows are not 0), and "
        "the check's word vectors are random, some large: set those rows to 0"
    )
    too_close = (
        f"{said}: its largest weight, but under {OFFSET_HEAD_MIN_WEIGHT}. The scores are too "
        "close together: the target's lead over its neighbours must be larger (a larger "
        "stretch; how large depends on the angle step)"
    )
    if all(tops[j] == j + offset for j in checked):
        return f"{too_close}; {words_hint}" if reads_words else too_close
    if offset != 0 and mirrored and all(tops[j] == j - offset for j in mirrored):
        return (
            f"{said}; query {mirrored[0] + 1} looks most at key {mirrored[0] - offset + 1}: the head "
            "looks the other way. Turn by the opposite angle"
        )
    if offset != 0 and all(tops[j] == j for j in checked):
        return (
            f"{said}; every query looks most at itself: the query's angle is not turned "
            "relative to the key's (turning W_Q and W_K by the same angle cancels)"
        )
    if tops[i] == i + offset:  # its target is its top key, only not by enough
        if reads_words:
            return f"{said}: its largest weight, but under {OFFSET_HEAD_MIN_WEIGHT}; {words_hint}"
        return too_close
    hint = f"; {words_hint}" if reads_words else ""
    return f"{said} and most ({weights[i, tops[i]].item():.2f}) on key {tops[i] + 1}{hint}"


def check_offset_head(
    offset_head: Callable[[int, float, int], tuple[Tensor, Tensor]], verbose: bool = True
) -> CheckResult:
    """Check ``offset_head(d_content, step_angle, offset) -> (query_weight, key_weight)``.

    The matrices, each ``(d_content + 2, d_k)``, are graded by what they do: on inputs laid
    out as in section 1.6 (the word's ``d_content`` numbers, then ``cos iθ``, ``sin iθ``) and
    unscaled attention, every query ``i`` whose key ``i + offset`` exists must put at least
    :data:`OFFSET_HEAD_MIN_WEIGHT` of its weight on it (queries without that key are not
    graded; positions and messages count from 1). The cases mix offsets from -3 to +3 (0
    included), angle steps from 2° to 36°, in radians, with ``θ·(seq_len - 1) <= 180°`` so that no angle wraps around (a stretch fixed for
    all of them falls short unless it is huge) and random word vectors, large ones included.
    """
    name = "offset_head"
    result: CheckResult | None = None
    cases = _offset_head_cases()
    for count, case in enumerate(cases, start=1):
        kwargs = {k: case[k] for k in ("d_content", "step_angle", "offset")}
        got, result = call_reader(name, count, offset_head, kwargs)
        if result is not None:
            break
        problem = _offset_head_problem(got, case)
        if problem:
            seq_len = case["content"].shape[0]
            degrees = math.degrees(case["step_angle"])
            result = CheckResult(
                name,
                False,
                count,
                f"❌ {name}: case {count} (d_content={case['d_content']}, step_angle = "
                f"{case['step_angle']:.3f} rad ({degrees:g}°), offset={case['offset']}, "
                f"{seq_len} tokens): {problem}.",
            )
            break
    if result is None:
        result = CheckResult(
            name,
            True,
            len(cases),
            f"✅ {name}: in all {len(cases)} cases every query puts at least "
            f"{OFFSET_HEAD_MIN_WEIGHT:.0%} of its weight on key i + offset.",
        )
    if verbose:
        report(result)
    return result
