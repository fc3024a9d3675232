"""A Mixture-of-Experts feed-forward layer: top-k routing, expert capacity, balancing losses.

A dense Transformer layer sends every token through one feed-forward network. A
Mixture-of-Experts (MoE) layer holds ``num_experts`` such networks (the *experts*) and a
*router* that sends each token to only ``top_k`` of them (Shazeer et al., 2017, "Outrageously
Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer"). The layer then has
``num_experts`` times the parameters of one expert but each token pays for ``top_k`` of them:
its *active* parameters.

For a token :math:`x` (one row of ``(batch, seq, d_model)``)::

    p = softmax(x W_r)                          # router probabilities, (num_experts,)
    S = the top_k experts of p                  # k = 1: Switch; k = 2: GShard, Mixtral
    g_i = p_i                  (top_k = 1)      # gates
    g_i = p_i / sum_{j in S} p_j (top_k > 1)
    y = sum_{i in S, kept} g_i * expert_i(x)

**Gates.** With ``top_k > 1`` the gates are renormalised over the chosen experts, so they sum
to 1: Mixtral computes ``softmax(TopK(x W_r))`` over the chosen logits (Jiang et al., 2024,
"Mixtral of Experts", arXiv:2401.04088, section 2.1), which is the same thing, and GShard
divides its two gates by their sum (Lepikhin et al., 2020, arXiv:2006.16668, Algorithm 1).
With ``top_k = 1`` the gate stays ``p_i`` as in the Switch Transformer (Fedus et al., 2021,
arXiv:2101.03961, section 2.1): renormalised it would always be 1, and the router would get
no gradient from the task loss.

**Capacity.** Each expert takes at most ``capacity = ceil(capacity_factor * tokens * top_k /
num_experts)`` assignments, ``tokens`` counting the real (unpadded) tokens of the batch.
Assignments are served first choices first, then second choices, ..., each in token order
(GShard's order); an assignment past its expert's capacity is *dropped*: it contributes
nothing, and a token whose every assignment is dropped gets a zero output from this layer
(the residual connection around the layer still carries it). ``capacity_factor=None`` keeps
every assignment.

**Balancing.** After each call, :attr:`MoEFeedForward.last_aux` holds a :class:`MoEStats`:
the load-balancing loss of the Switch Transformer (:func:`load_balancing_loss`), the router
z-loss of ST-MoE (:func:`router_z_loss`, Zoph et al., 2022, arXiv:2202.08906), the
assignments each expert kept and the number dropped. Add ``coefficient *
last_aux.balance_loss`` (Switch uses 0.01; ST-MoE adds ``0.001 * z_loss``) to the task loss so
that the router spreads the tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import (
    check_bool_tensor,
    check_floating,
    check_index_range,
    check_integer,
    check_min_ndim,
    check_module_dtype,
    check_positive_float,
    check_positive_int,
    check_probability,
    check_sequence,
    checked,
    checks_enabled,
    shape_str,
)
from companion.layers import FeedForward

__all__ = ["MoEStats", "MoEFeedForward", "load_balancing_loss", "router_z_loss"]


@dataclass(frozen=True)
class MoEStats:
    """What one call of :class:`MoEFeedForward` routed (``k = top_k``, ``E = num_experts``).

    Attributes:
        balance_loss: Switch load-balancing loss, scalar, differentiable (1 at uniform load).
        z_loss: router z-loss, scalar, differentiable.
        tokens_per_expert: ``(E,)`` long, assignments each expert computed (after capacity).
        dropped: scalar long, assignments dropped by the capacity (0 without capacity).
        expert_index: ``(batch, seq, k)`` long, each token's chosen experts, best first.
        kept: ``(batch, seq, k)`` bool, whether each assignment was computed (``False`` for
            padding and for dropped assignments).
        capacity: assignments each expert may take, or ``None`` (no limit).
    """

    balance_loss: Tensor
    z_loss: Tensor
    tokens_per_expert: Tensor
    dropped: Tensor
    expert_index: Tensor
    kept: Tensor
    capacity: int | None


def load_balancing_loss(
    router_probs: Tensor, expert_index: Tensor, num_experts: int, mask: Tensor | None = None
) -> Tensor:
    r"""The Switch Transformer's auxiliary loss :math:`E \sum_i f_i P_i` (Fedus et al., 2021,
    eq. 4).

    :math:`f_i` is the fraction of the routing assignments that chose expert ``i`` (each token
    makes ``k`` of them, so :math:`\sum_i f_i = 1`; it is counted before any capacity drops
    and carries no gradient), :math:`P_i` the mean router probability of expert ``i``. Both
    average over the real tokens only. With uniform routing, :math:`f_i = P_i = 1/E`, the loss
    is 1; when :math:`f = P` it is :math:`E\lVert P\rVert^2 \ge 1` (Cauchy-Schwarz). Each
    token's ``k`` experts are distinct, so :math:`f_i \le 1/k` and the loss is at most
    :math:`E/k` (``E`` for the Switch Transformer's ``k = 1``), reached when every token gives
    the same expert probability 1. The gradient pushes down the probabilities of the experts that
    receive the most tokens.

    Args:
        router_probs: ``(..., num_experts)`` softmax of the router logits.
        expert_index: ``(..., k)`` integer, the experts each token was sent to.
        num_experts: ``E``.
        mask: ``(...)`` bool, ``True`` = real token; ``None`` = all real.

    Returns:
        A scalar tensor (0 when there is no real token).
    """
    if checks_enabled():  # skipped when MoEFeedForward.forward calls it
        _check_balance_inputs(router_probs, expert_index, num_experts, mask)
    real = _real_tokens(mask, router_probs.shape[:-1], router_probs.device)  # (...)
    real = real.to(router_probs.dtype)  # (...) 1.0 = real
    num_real = real.sum().clamp(min=1.0)  # () tokens that count
    k = expert_index.shape[-1]
    chosen = F.one_hot(expert_index.long(), num_experts).to(router_probs.dtype)  # (..., k, E)
    chosen = (chosen * real[..., None, None]).flatten(0, -2)  # (tokens * k, E)
    fraction = chosen.sum(0) / (num_real * k)  # (E,) f_i, sums to 1
    mean_prob = (router_probs * real[..., None]).flatten(0, -2).sum(0) / num_real  # (E,) P_i
    return num_experts * (fraction * mean_prob).sum()  # ()


def router_z_loss(router_logits: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""ST-MoE's router z-loss, the mean over real tokens of :math:`(\log\sum_j e^{z_j})^2`
    (Zoph et al., 2022, section 3.1): it keeps the router's logits small, which keeps its softmax
    numerically stable.

    Args:
        router_logits: ``(..., num_experts)``.
        mask: ``(...)`` bool, ``True`` = real token; ``None`` = all real.

    Returns:
        A scalar tensor (0 when there is no real token).
    """
    if checks_enabled():  # skipped when MoEFeedForward.forward calls it
        check_floating("router_logits", router_logits)
        check_min_ndim("router_logits", router_logits, 1, "(..., num_experts)")
        _check_mask(mask, router_logits.shape[:-1])
    real = _real_tokens(mask, router_logits.shape[:-1], router_logits.device)  # (...)
    log_z = torch.logsumexp(router_logits, dim=-1)  # (...)
    squared = log_z.pow(2) * real.to(log_z.dtype)  # (...) 0 on padding
    return squared.sum() / real.sum().clamp(min=1)  # ()


def _real_tokens(mask: Tensor | None, shape: torch.Size, device: torch.device) -> Tensor:
    """``mask``, or all ``True`` when it is ``None``: ``(...)``."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)  # (...)
    return mask


def _check_mask(mask: object, shape: torch.Size) -> None:
    """Raise unless ``mask`` is ``None`` or a bool tensor of exactly ``shape``."""
    if mask is None:
        return
    check_bool_tensor("mask", mask)
    assert isinstance(mask, Tensor)
    if mask.shape != shape:
        raise ValueError(
            f"mask must have shape {shape_str(shape)} (one bool per token, True = real), "
            f"got {shape_str(mask.shape)}"
        )


def _check_balance_inputs(
    router_probs: object, expert_index: object, num_experts: object, mask: object
) -> None:
    """The checks of :func:`load_balancing_loss` (same arguments)."""
    check_positive_int("num_experts", num_experts)
    probs = check_floating("router_probs", router_probs)
    check_min_ndim("router_probs", probs, 1, "(..., num_experts)")
    if probs.shape[-1] != num_experts:
        raise ValueError(
            f"router_probs must have shape (..., num_experts={num_experts}), "
            f"got {shape_str(probs.shape)}"
        )
    index = check_integer("expert_index", expert_index)
    if index.dim() != probs.dim() or index.shape[:-1] != probs.shape[:-1]:
        raise ValueError(
            f"expert_index must have shape {shape_str((*probs.shape[:-1], 'k'))} to match "
            f"router_probs {shape_str(probs.shape)}, got {shape_str(index.shape)}"
        )
    check_index_range("expert_index", index, num_experts, "num_experts")
    _check_mask(mask, probs.shape[:-1])


class MoEFeedForward(nn.Module):
    """A Mixture-of-Experts replacement for :class:`~companion.layers.FeedForward`.

    ``num_experts`` feed-forward networks (each a :class:`~companion.layers.FeedForward` of
    hidden size ``d_ff``) behind a linear router without bias; each token goes to its
    ``top_k`` experts, weighted by its gates (see the module's docstring for the gates, the
    capacity and the order in which assignments are served).

    Args:
        d_model: size of the input and output vectors.
        d_ff: hidden size of each expert.
        num_experts: how many experts (``E``).
        top_k: experts per token, ``1 <= top_k <= num_experts``.
        capacity_factor: capacity per expert in units of the even share
            ``tokens * top_k / num_experts``; ``None`` = no limit, nothing dropped.
        dropout: dropout on the experts' hidden activations (training mode only).

    Attributes:
        router: ``nn.Linear(d_model, num_experts, bias=False)``.
        experts: ``nn.ModuleList`` of ``num_experts`` feed-forward networks.
        last_aux: the :class:`MoEStats` of the latest call (``None`` before the first).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int = 2,
        capacity_factor: float | None = 1.25,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.top_k = check_positive_int("top_k", top_k)
        if top_k > num_experts:
            raise ValueError(
                f"top_k must be between 1 and num_experts = {num_experts}, got {top_k}"
            )
        self.capacity_factor = (
            None
            if capacity_factor is None
            else check_positive_float(
                "capacity_factor", capacity_factor, "a positive finite number or None"
            )
        )
        check_probability("dropout", dropout)
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(
            FeedForward(d_model, d_ff, dropout=dropout) for _ in range(num_experts)
        )
        self.last_aux: MoEStats | None = None

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, capacity_factor={self.capacity_factor}"

    def capacity(self, num_tokens: int) -> int | None:
        """Assignments each expert may take when ``num_tokens`` real tokens are routed."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    @checked("check_inputs")
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Route every real token to its experts and sum their gated outputs.

        Args:
            x: ``(batch, seq, d_model)``.
            mask: ``(batch, seq)`` bool, ``True`` = real token; padding is neither routed nor
                counted (its output is zero). ``None`` = every token is real.

        Returns:
            ``(batch, seq, d_model)``; sets :attr:`last_aux`.
        """
        batch, seq_len, d_model = x.shape
        k, num_experts = self.top_k, self.num_experts
        tokens = x.reshape(-1, d_model)  # (n, d_model), n = batch * seq
        real = _real_tokens(mask, x.shape[:2], x.device).reshape(-1)  # (n,)
        logits = self.router(tokens)  # (n, E)
        probs = logits.softmax(dim=-1)  # (n, E)
        gates, expert_index = probs.topk(k, dim=-1)  # (n, k), (n, k) best first
        if k > 1:  # Mixtral / GShard: the chosen gates sum to 1
            gates = gates / gates.sum(dim=-1, keepdim=True)  # (n, k)

        # One row per assignment, first choices of all tokens first: (k * n,) each.
        flat_expert = expert_index.t().reshape(-1)  # (k*n,)
        flat_gate = gates.t().reshape(-1)  # (k*n,)
        flat_token = torch.arange(tokens.shape[0], device=x.device).repeat(k)  # (k*n,)
        routed = real.repeat(k)  # (k*n,) padding is never routed
        chosen = F.one_hot(flat_expert, num_experts) * routed[:, None]  # (k*n, E)
        slot = ((chosen.cumsum(dim=0) - 1) * chosen).sum(dim=-1)  # (k*n,) place in its queue
        capacity = self.capacity(int(real.sum()))
        kept = routed if capacity is None else routed & (slot < capacity)  # (k*n,)

        out = torch.zeros_like(tokens)  # (n, d_model)
        for e, expert in enumerate(self.experts):
            rows = torch.nonzero(kept & (flat_expert == e)).squeeze(-1)  # (n_e,)
            token = flat_token[rows]  # (n_e,)
            expert_out = expert(tokens[token]) * flat_gate[rows, None]  # (n_e, d_model)
            out = out.index_add(0, token, expert_out)  # (n, d_model)

        demand = chosen.sum(dim=0)  # (E,) assignments before capacity
        served = F.one_hot(flat_expert, num_experts) * kept[:, None]  # (k*n, E)
        tokens_per_expert = served.sum(dim=0)  # (E,)
        self.last_aux = MoEStats(
            balance_loss=load_balancing_loss(probs, expert_index, num_experts, real),
            z_loss=router_z_loss(logits, real),
            tokens_per_expert=tokens_per_expert,
            dropped=(demand - tokens_per_expert).sum(),
            expert_index=expert_index.reshape(batch, seq_len, k),
            kept=kept.reshape(k, batch, seq_len).permute(1, 2, 0),  # (batch, seq, k)
            capacity=capacity,
        )
        return out.reshape(batch, seq_len, d_model)  # (batch, seq, d_model)

    def check_inputs(self, x: Tensor, mask: Tensor | None = None) -> None:
        """Raise a clear error unless ``x`` is ``(batch, seq, d_model)`` float of the module's
        dtype and ``mask`` is ``None`` or bool ``(batch, seq)``."""
        check_sequence("x", x, self.d_model, "seq")
        check_module_dtype("x", x, self)
        _check_mask(mask, x.shape[:2])
