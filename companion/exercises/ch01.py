"""Exercises of chapter 1, "Attention, the intuition".

Each ``check_*`` function runs *your* function next to the reference solution kept in this
module, on random cases drawn from a seeded generator (several shapes, plus edge cases), and
returns a :class:`~companion.exercises._checker.CheckResult` that is truthy when every case
matches. The checks call your function with keyword arguments, so keep the parameter names of
the stub in the notebook.

- a numerically safe softmax: :func:`check_row_softmax`
- dot-product scores, batched: :func:`check_relevance_scores`
- self-attention from scratch: :func:`check_self_attention` (not in the chapter; for practice)
- a permutation-equivariance test of your own: :func:`check_is_permutation_equivariant`
- additive relevance scores for every pair: :func:`check_additive_scores`
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from companion.exercises._checker import Case, CheckResult, run_check, seeded_generator

__all__ = [
    "check_row_softmax",
    "check_relevance_scores",
    "check_self_attention",
    "check_additive_scores",
    "check_is_permutation_equivariant",
    "NamedLayer",
    "equivariance_test_layers",
]

# --------------------------------------------------------------------------------------------
# Exercise 1: softmax over the last dimension, safe for large scores
# --------------------------------------------------------------------------------------------


def reference_row_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dimension with the max-subtraction trick.

    Args:
        scores: shape ``(..., n)``, any finite values (even ±1000).

    Returns:
        Weights of shape ``(..., n)``: positive, each row sums to 1.
    """
    shifted = scores - scores.amax(dim=-1, keepdim=True)  # (..., n), largest entry is 0
    exp = shifted.exp()  # (..., n), in (0, 1]: cannot overflow
    return exp / exp.sum(dim=-1, keepdim=True)  # (..., n)


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
    return cases


def check_row_softmax(row_softmax: Callable[[Tensor], Tensor], verbose: bool = True) -> CheckResult:
    """Check ``row_softmax(scores)``: softmax over the last dimension of ``(..., n)`` scores.

    The cases include scores of magnitude 1000, where ``exp`` overflows unless the row
    maximum is subtracted first.
    """
    return run_check(
        "row_softmax", row_softmax, reference_row_softmax, _row_softmax_cases(), verbose=verbose
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
    return [
        {"q": torch.randn(q_shape, generator=g), "k": torch.randn(k_shape, generator=g)}
        for q_shape, k_shape in shapes
    ]


def check_relevance_scores(
    relevance_scores: Callable[[Tensor, Tensor], Tensor], verbose: bool = True
) -> CheckResult:
    """Check ``relevance_scores(q, k)``: ``(..., q_len, d_k)``, ``(..., k_len, d_k)`` →
    ``(..., q_len, k_len)``."""
    return run_check(
        "relevance_scores",
        relevance_scores,
        reference_relevance_scores,
        _relevance_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 3: self-attention from scratch (no scaling yet - that is chapter 2)
# --------------------------------------------------------------------------------------------


def reference_self_attention(
    x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor
) -> tuple[Tensor, Tensor]:
    """Self-attention of chapter 1: ``softmax(Q Kᵀ) V`` with ``Q, K, V = X W_Q, X W_K, X W_V``.

    Args:
        x: input vectors, shape ``(..., seq_len, d_model)``.
        w_q: query projection, shape ``(d_model, d_k)``.
        w_k: key projection, shape ``(d_model, d_k)``.
        w_v: value projection, shape ``(d_model, d_v)``.

    Returns:
        ``(output, weights)`` of shapes ``(..., seq_len, d_v)`` and ``(..., seq_len, seq_len)``.
    """
    q = x @ w_q  # (..., seq_len, d_k)
    k = x @ w_k  # (..., seq_len, d_k)
    v = x @ w_v  # (..., seq_len, d_v)
    scores = reference_relevance_scores(q, k)  # (..., seq_len, seq_len)
    weights = reference_row_softmax(scores)  # (..., seq_len, seq_len)
    output = weights @ v  # (..., seq_len, d_v)
    return output, weights


def _self_attention_cases() -> list[Case]:
    g = seeded_generator(103)
    shapes = [
        # (x shape, d_k, d_v)
        ((7, 4), 3, 3),  # the chapter's worked example
        ((5, 6), 4, 2),  # d_k != d_v
        ((1, 4), 3, 5),  # a single token: its only weight is 1
        ((2, 5, 4), 3, 3),  # a batch of 2 sentences
        ((3, 6, 8), 8, 8),  # square projections
    ]
    cases: list[Case] = []
    for x_shape, d_k, d_v in shapes:
        d_model = x_shape[-1]
        std = 1 / math.sqrt(d_model)
        cases.append(
            {
                "x": torch.randn(x_shape, generator=g),
                "w_q": std * torch.randn(d_model, d_k, generator=g),
                "w_k": std * torch.randn(d_model, d_k, generator=g),
                "w_v": std * torch.randn(d_model, d_v, generator=g),
            }
        )
    return cases


def check_self_attention(
    self_attention: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
    verbose: bool = True,
) -> CheckResult:
    """Check ``self_attention(x, w_q, w_k, w_v) -> (output, weights)`` (unscaled scores)."""
    return run_check(
        "self_attention",
        self_attention,
        reference_self_attention,
        _self_attention_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise 4: additive relevance scores from explicit weight matrices
# --------------------------------------------------------------------------------------------


def reference_additive_scores(q: Tensor, k: Tensor, w_q: Tensor, w_k: Tensor, w: Tensor) -> Tensor:
    """Additive (Bahdanau) scores ``α_ij = w · tanh(q_i W_q + k_j W_k)`` for every pair.

    Args:
        q: queries, shape ``(..., q_len, d_q)``.
        k: keys, shape ``(..., k_len, d_k)``, same leading dimensions as ``q``.
        w_q: shape ``(d_q, d_hidden)``.
        w_k: shape ``(d_k, d_hidden)``.
        w: shape ``(d_hidden,)``.

    Returns:
        Scores of shape ``(..., q_len, k_len)``.
    """
    hq = (q @ w_q).unsqueeze(-2)  # (..., q_len, 1, d_hidden)
    hk = (k @ w_k).unsqueeze(-3)  # (..., 1, k_len, d_hidden)
    return torch.tanh(hq + hk) @ w  # (..., q_len, k_len)


def _additive_cases() -> list[Case]:
    g = seeded_generator(104)
    shapes = [
        # (q shape, k shape, d_hidden)
        ((3, 4), (5, 4), 6),
        ((4, 3), (4, 3), 5),  # q_len == k_len: pairing q_i with k_i only gives no error
        ((3, 2), (5, 4), 3),  # d_q != d_k
        ((1, 3), (1, 3), 4),  # one query, one key
        ((2, 3, 4), (2, 6, 4), 3),  # a batch of 2
    ]
    cases: list[Case] = []
    for q_shape, k_shape, d_hidden in shapes:
        cases.append(
            {
                "q": torch.randn(q_shape, generator=g),
                "k": torch.randn(k_shape, generator=g),
                "w_q": torch.randn(q_shape[-1], d_hidden, generator=g),
                "w_k": torch.randn(k_shape[-1], d_hidden, generator=g),
                "w": torch.randn(d_hidden, generator=g),
            }
        )
    return cases


def check_additive_scores(
    additive_scores: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor],
    verbose: bool = True,
) -> CheckResult:
    """Check ``additive_scores(q, k, w_q, w_k, w)``: ``(..., q_len, d_q)``,
    ``(..., k_len, d_k)`` → ``(..., q_len, k_len)``."""
    return run_check(
        "additive_scores",
        additive_scores,
        reference_additive_scores,
        _additive_cases(),
        verbose=verbose,
    )


# --------------------------------------------------------------------------------------------
# Exercise: a permutation-equivariance test written by the reader
# --------------------------------------------------------------------------------------------


class NamedLayer:
    """A sequence layer ``(n, d_in) → (n, d_out)`` with a readable name.

    The equivariance check hands these to the reader's test; the name is what a failed check
    prints, e.g. ``NamedLayer('causal self-attention')``.
    """

    def __init__(self, name: str, fn: Callable[[Tensor], Tensor]) -> None:
        self.name = name
        self.fn = fn

    def __call__(self, x: Tensor) -> Tensor:
        """``x (n, d_in)`` → ``(n, d_out)``."""
        return self.fn(x)

    def __repr__(self) -> str:
        return f"NamedLayer({self.name!r})"


def reference_is_permutation_equivariant(layer: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    """Whether ``layer(x[perm]) == layer(x)[perm]`` (to float tolerance) for every ``perm`` tried.

    Tries the reversal, a cyclic shift, a swap of the first two tokens and 20 random
    permutations (from a generator of its own), comparing with ``torch.allclose``
    (``atol=1e-5``, ``rtol=1e-4``): a reordered sum differs in its last bits, so exact
    equality would reject a truly equivariant layer.

    Args:
        layer: maps ``(n, d_in)`` to ``(n, d_out)``.
        x: one sequence, shape ``(n, d_in)``.

    Returns:
        ``True`` when every permutation tried commutes with ``layer``.
    """
    n = x.shape[-2]
    output = layer(x)  # (n, d_out)
    generator = seeded_generator(7)
    swap = torch.arange(n)  # (n,)
    swap[[0, -1]] = swap[[-1, 0]]
    perms = [torch.arange(n - 1, -1, -1), torch.roll(torch.arange(n), 1), swap]
    perms += [torch.randperm(n, generator=generator) for _ in range(20)]
    for perm in perms:  # each (n,)
        if not torch.allclose(layer(x[perm]), output[perm], atol=1e-5, rtol=1e-4):
            return False
    return True


def _attention(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, causal: bool = False) -> Tensor:
    """Unscaled self-attention of one sequence: ``x (n, d)`` → ``(n, d_v)``."""
    scores = (x @ w_q) @ (x @ w_k).T  # (n, n)
    if causal:
        n = x.shape[0]
        blocked = torch.ones(n, n, dtype=torch.bool).triu(1)  # (n, n), keys after the query
        scores = scores.masked_fill(blocked, float("-inf"))  # (n, n)
    return torch.softmax(scores, dim=-1) @ (x @ w_v)  # (n, d_v)


def _position_codes(positions: Tensor, d: int) -> Tensor:
    """Sinusoidal codes ``(n, d)`` for the (float) ``positions`` ``(n,)`` (chapter 4)."""
    rates = 1.0 / 10.0 ** (torch.arange(d, dtype=torch.float32) / d)  # (d,)
    phases = (torch.arange(d) % 2) * (math.pi / 2)  # (d,): sin, cos, sin, ...
    return torch.sin(positions[:, None] * rates + phases)  # (n, d)


def equivariance_test_layers(d: int = 4) -> dict[str, NamedLayer]:
    """The layers the equivariance check feeds to the reader's test, by name.

    Equivariant: self-attention, a per-token linear layer, attention plus the mean token.
    Not equivariant: attention with added position codes (large, small, or symmetric under
    reversal), causal attention, a window layer over the flattened sequence, and a circular
    convolution along the sequence (which commutes with cyclic shifts only).

    Args:
        d: width of a token vector, ``d_in = d_out = d``.
    """
    g = seeded_generator(110)
    std = 1 / math.sqrt(d)
    w_q, w_k, w_v = (std * torch.randn(d, d, generator=g) for _ in range(3))
    token_layer = std * torch.randn(d, d, generator=g)  # (d, d)
    kernel = std * torch.randn(3, d, d, generator=g)  # (3, d, d): offsets -1, 0, +1

    def attention(x: Tensor) -> Tensor:
        return _attention(x, w_q, w_k, w_v)  # (n, d)

    def with_positions(scale: float, symmetric: bool = False) -> Callable[[Tensor], Tensor]:
        def layer(x: Tensor) -> Tensor:
            n = x.shape[0]
            positions = torch.arange(n, dtype=torch.float32)  # (n,)
            if symmetric:  # position i and position n-1-i get the same code
                positions = (positions - (n - 1) / 2).abs()  # (n,)
            return attention(x + scale * _position_codes(positions, d))  # (n, d)

        return layer

    def window(x: Tensor) -> Tensor:
        n = x.shape[0]
        weight = torch.randn(n * d, n * d, generator=seeded_generator(111 + n)) / n  # fixed per n
        return (x.reshape(-1) @ weight).reshape(n, d)  # (n, d)

    def circular_conv(x: Tensor) -> Tensor:
        return sum(torch.roll(x, shift, dims=0) @ kernel[shift + 1] for shift in (-1, 0, 1))

    return {
        "self-attention": NamedLayer("self-attention", attention),
        "per-token linear layer": NamedLayer("per-token linear layer", lambda x: x @ token_layer),
        "attention plus the mean token": NamedLayer(
            "attention plus the mean token", lambda x: attention(x) + x.mean(0, keepdim=True)
        ),
        "attention with position codes": NamedLayer(
            "attention with position codes", with_positions(1.0)
        ),
        "attention with small position codes": NamedLayer(
            "attention with small position codes", with_positions(0.02)
        ),
        "attention with reversal-symmetric codes": NamedLayer(
            "attention with reversal-symmetric codes", with_positions(1.0, symmetric=True)
        ),
        "causal self-attention": NamedLayer(
            "causal self-attention", lambda x: _attention(x, w_q, w_k, w_v, causal=True)
        ),
        "window layer": NamedLayer("window layer", window),
        "circular convolution": NamedLayer("circular convolution", circular_conv),
    }


def _equivariance_cases() -> list[Case]:
    g = seeded_generator(112)
    layers = equivariance_test_layers()
    x7 = torch.randn(7, 4, generator=g)  # (7, 4)
    x7[6] = x7[3]  # two equal tokens, like the two "learning"s
    cases: list[Case] = [{"layer": layers["self-attention"], "x": x7}]
    for name in layers:
        if name != "self-attention":
            cases.append({"layer": layers[name], "x": torch.randn(6, 4, generator=g)})
    # two tokens: the only reordering is the swap
    cases.append(
        {"layer": layers["attention with position codes"], "x": torch.randn(2, 4, generator=g)}
    )
    cases.append({"layer": layers["self-attention"], "x": 3 * torch.randn(9, 4, generator=g)})
    return cases


def check_is_permutation_equivariant(
    is_permutation_equivariant: Callable[[Callable[[Tensor], Tensor], Tensor], bool],
    verbose: bool = True,
) -> CheckResult:
    """Check the reader's test ``is_permutation_equivariant(layer, x) -> bool``.

    The test gets a layer ``(n, d) → (n, d)`` and one sequence ``x (n, d)`` and must say
    whether reordering the tokens reorders the outputs the same way. The check hands it
    equivariant layers (self-attention, a per-token layer) and layers that are not
    (positions added, a causal mask, a window layer, a circular convolution), and compares
    its verdicts with the reference test.
    """
    return run_check(
        "is_permutation_equivariant",
        is_permutation_equivariant,
        reference_is_permutation_equivariant,
        _equivariance_cases(),
        verbose=verbose,
    )
