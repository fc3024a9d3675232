"""Mixture-of-Experts feed-forward (companion.moe): routing conserves tokens, capacity drops
exactly the overflow, the balancing loss is 1 at uniform load, k = E with a zero router is the
dense mean, k = 1 is the argmax expert, parity with a per-token loop, gradients, padding."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import Tensor, nn

from companion.moe import MoEFeedForward, load_balancing_loss, router_z_loss

D_MODEL, D_FF = 6, 10


def make_layer(num_experts=4, top_k=2, capacity_factor=None, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    layer = MoEFeedForward(D_MODEL, D_FF, num_experts, top_k, capacity_factor).to(dtype)
    return layer.eval()


def inputs(batch=3, seq=7, seed=1, dtype=torch.float64) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, D_MODEL, generator=generator, dtype=dtype)


def ragged_mask(lengths: list[int], seq: int) -> Tensor:
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]  # (batch, seq)


def naive_moe(layer: MoEFeedForward, x: Tensor, mask: Tensor | None = None) -> Tensor:
    """The specification, one token at a time: softmax router, top-k (gates renormalised when
    k > 1), first choices served before second choices, each in token order, until an expert
    holds `capacity` assignments."""
    batch, seq, _ = x.shape
    k, num_experts = layer.top_k, layer.num_experts
    real = [(b, t) for b in range(batch) for t in range(seq) if mask is None or bool(mask[b, t])]
    capacity = (
        math.inf
        if layer.capacity_factor is None
        else math.ceil(layer.capacity_factor * len(real) * k / num_experts)
    )
    routes = {}
    for b, t in real:
        probs = torch.softmax(layer.router.weight @ x[b, t], dim=0).tolist()
        best = sorted(range(num_experts), key=lambda e: -probs[e])[:k]
        total = sum(probs[e] for e in best) if k > 1 else 1.0
        routes[b, t] = [(e, probs[e] / total) for e in best]
    out = torch.zeros_like(x)
    load = [0] * num_experts
    for choice in range(k):
        for b, t in real:
            expert, gate = routes[b, t][choice]
            if load[expert] < capacity:
                load[expert] += 1
                out[b, t] += gate * layer.experts[expert](x[b, t][None, None])[0, 0]
    return out


def record_expert_inputs(layer: MoEFeedForward) -> list[list[Tensor]]:
    """Forward hooks that keep the rows each expert receives."""
    seen: list[list[Tensor]] = [[] for _ in layer.experts]
    for e, expert in enumerate(layer.experts):
        expert.register_forward_hook(lambda m, args, out, e=e: seen[e].append(args[0].detach()))
    return seen


# --------------------------------------------------------------------------------------------
# Routing and capacity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_without_capacity_every_real_token_reaches_exactly_k_experts(top_k):
    layer = make_layer(num_experts=4, top_k=top_k)
    x = inputs(batch=3, seq=7)
    mask = ragged_mask([7, 4, 2], 7)
    seen = record_expert_inputs(layer)
    layer(x, mask)
    rows = torch.cat([r for rows in seen for r in rows])  # every row any expert computed
    assert rows.shape[0] == top_k * int(mask.sum()), (rows.shape, top_k, int(mask.sum()))
    for b, t in torch.cartesian_prod(torch.arange(3), torch.arange(7)).tolist():
        hits = int((rows == x[b, t]).all(dim=-1).sum())
        expected = top_k if mask[b, t] else 0
        assert hits == expected, f"token ({b}, {t}) reached {hits} experts, expected {expected}"
    stats = layer.last_aux
    assert int(stats.tokens_per_expert.sum()) == top_k * int(mask.sum())
    assert int(stats.dropped) == 0 and stats.capacity is None
    assert torch.equal(stats.kept, mask[..., None].expand(-1, -1, top_k))
    assert torch.equal(
        stats.tokens_per_expert, torch.bincount(stats.expert_index[mask].flatten(), minlength=4)
    )
    # each token's k experts are distinct
    assert all(len(set(row)) == top_k for row in stats.expert_index.reshape(-1, top_k).tolist())


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25])
def test_capacity_drops_exactly_the_overflow(capacity_factor):
    layer = make_layer(num_experts=4, top_k=2, capacity_factor=capacity_factor)
    with torch.no_grad():
        layer.router.weight[0, 0] = 4.0  # lopsided: x[..., 0] > 0 favours expert 0
    x = inputs(batch=4, seq=9)
    x[..., 0] = x[..., 0].abs() + 0.5
    mask = ragged_mask([9, 9, 5, 3], 9)
    seen = record_expert_inputs(layer)
    layer(x, mask)

    probs = torch.softmax(x[mask] @ layer.router.weight.T, dim=-1)  # (real, E)
    demand = torch.bincount(probs.topk(2, dim=-1).indices.flatten(), minlength=4)  # (E,)
    capacity = math.ceil(capacity_factor * int(mask.sum()) * 2 / 4)
    overflow = int((demand - capacity).clamp(min=0).sum())
    assert overflow > 0, "the test must make some expert overflow"
    stats = layer.last_aux
    assert stats.capacity == capacity
    assert int(stats.dropped) == overflow, (int(stats.dropped), overflow)
    assert torch.equal(stats.tokens_per_expert, demand.clamp(max=capacity))
    computed = [sum(r.shape[0] for r in rows) for rows in seen]
    assert computed == stats.tokens_per_expert.tolist(), computed
    assert max(computed) <= capacity, (computed, capacity)
    assert int((~stats.kept & mask[..., None]).sum()) == overflow


def test_dropped_token_gets_zero_output_and_first_choices_are_served_first():
    layer = make_layer(num_experts=2, top_k=1, capacity_factor=0.5)  # capacity = ceil(n / 4)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 50.0  # every token with x[..., 0] > 0 picks expert 0
    x = inputs(batch=1, seq=8)
    x[..., 0] = 1.0  # all eight pick expert 0; capacity 2
    out = layer(x)
    assert layer.last_aux.capacity == 2 and int(layer.last_aux.dropped) == 6
    assert out[0, :2].abs().sum() > 0, "the first two tokens in order are served"
    assert torch.equal(out[0, 2:], torch.zeros(6, D_MODEL, dtype=x.dtype)), out[0, 2:]


# --------------------------------------------------------------------------------------------
# Balancing losses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [1, 2])
def test_balance_loss_is_one_at_uniform_load_and_larger_when_skewed(top_k):
    num_experts, tokens = 4, 8
    uniform = torch.full((tokens, num_experts), 1 / num_experts, dtype=torch.float64)
    spread = (torch.arange(tokens)[:, None] + torch.arange(top_k)[None, :]) % num_experts
    loss = load_balancing_loss(uniform, spread, num_experts)
    assert torch.isclose(loss, torch.tensor(1.0, dtype=torch.float64)), float(loss)

    everything_to_0 = torch.zeros(tokens, num_experts, dtype=torch.float64)
    everything_to_0[:, 0] = 1.0
    to_0 = torch.zeros(tokens, 1, dtype=torch.long)
    assert float(load_balancing_loss(everything_to_0, to_0, num_experts)) == pytest.approx(4.0)

    skewed = torch.softmax(torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=torch.float64), 0)
    probs = skewed.expand(tokens, -1)  # every token prefers expert 0, then 1, ...
    chosen = probs.topk(top_k, dim=-1).indices  # (tokens, k)
    assert float(load_balancing_loss(probs, chosen, num_experts)) > 1.2


def test_balance_loss_formula_and_mask():
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 5, 3, generator=generator, dtype=torch.float64), -1)
    chosen = probs.topk(2, dim=-1).indices  # (2, 5, 2)
    mask = ragged_mask([5, 2], 5)
    loss = load_balancing_loss(probs, chosen, 3, mask)
    f = torch.bincount(chosen[mask].flatten(), minlength=3).double() / (2 * 7)
    p = probs[mask].mean(0)
    assert torch.isclose(loss, 3 * (f * p).sum()), (float(loss), float(3 * (f * p).sum()))
    garbage = probs.clone()
    garbage[~mask] = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert torch.isclose(load_balancing_loss(garbage, chosen, 3, mask), loss), "padding counted"
    no_tokens = torch.zeros(2, 5, dtype=torch.bool)
    assert float(load_balancing_loss(probs, chosen, 3, no_tokens)) == 0.0


def test_z_loss_is_the_mean_squared_log_partition_of_real_tokens():
    logits = torch.tensor([[[0.0, 0.0], [3.0, 1.0], [9.0, 9.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    expected = (math.log(2) ** 2 + math.log(math.exp(3) + math.exp(1)) ** 2) / 2
    assert float(router_z_loss(logits, mask)) == pytest.approx(expected)


def test_layer_reports_the_losses_of_its_routing():
    layer = make_layer(num_experts=4, top_k=2)
    x, mask = inputs(), ragged_mask([7, 3, 1], 7)
    layer(x, mask)
    logits = x @ layer.router.weight.T  # (batch, seq, E)
    probs = logits.softmax(-1)
    stats = layer.last_aux
    assert torch.equal(stats.expert_index[mask], probs.topk(2, -1).indices[mask])
    assert torch.isclose(
        stats.balance_loss, load_balancing_loss(probs, stats.expert_index, 4, mask)
    )
    assert torch.isclose(stats.z_loss, router_z_loss(logits, mask))


# --------------------------------------------------------------------------------------------
# What the layer computes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_k_equals_e_with_a_zero_router_is_the_dense_mean(capacity_factor):
    layer = make_layer(num_experts=3, top_k=3, capacity_factor=capacity_factor)
    with torch.no_grad():
        layer.router.weight.zero_()  # equal logits: every gate 1/3
    x = inputs()
    dense_mean = torch.stack([expert(x) for expert in layer.experts]).mean(0)
    torch.testing.assert_close(layer(x), dense_mean)
    assert int(layer.last_aux.dropped) == 0


def test_top1_is_the_argmax_expert_times_its_probability():
    layer = make_layer(num_experts=4, top_k=1)
    x = inputs()
    out = layer(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            probs = torch.softmax(layer.router.weight @ x[b, t], dim=0)
            best = int(probs.argmax())
            expected = probs[best] * layer.experts[best](x[b, t][None, None])[0, 0]
            torch.testing.assert_close(out[b, t], expected, msg=f"token ({b}, {t})")


@pytest.mark.parametrize(
    "num_experts, top_k, capacity_factor",
    [(4, 1, None), (4, 2, None), (4, 2, 1.0), (5, 2, 0.75), (3, 3, 1.25), (4, 1, 0.8)],
)
def test_matches_a_per_token_loop(num_experts, top_k, capacity_factor):
    layer = make_layer(num_experts, top_k, capacity_factor, seed=num_experts + top_k)
    x, mask = inputs(batch=3, seq=6, seed=5), ragged_mask([6, 3, 5], 6)
    torch.testing.assert_close(layer(x, mask), naive_moe(layer, x, mask))
    torch.testing.assert_close(layer(x), naive_moe(layer, x))


def test_gradient_reaches_the_router_and_every_used_expert():
    for top_k in (1, 2):
        layer = make_layer(num_experts=6, top_k=top_k)
        layer(inputs(batch=1, seq=3)).pow(2).sum().backward()  # 3 tokens: some experts unused
        grad = layer.router.weight.grad
        assert grad is not None and grad.abs().sum() > 0, f"top_k={top_k}: no router gradient"
        used = layer.last_aux.tokens_per_expert > 0
        assert 0 < int(used.sum()) < 6, used
        for e, expert in enumerate(layer.experts):
            g = expert.hidden_proj.weight.grad
            got = g is not None and bool(g.abs().sum() > 0)
            assert got == bool(used[e]), (
                f"top_k={top_k}, expert {e}: used {bool(used[e])}, grad {got}"
            )
    layer = make_layer(num_experts=4, top_k=2)
    layer(inputs())
    layer.last_aux.balance_loss.backward()
    assert layer.router.weight.grad.abs().sum() > 0, "the balancing loss trains the router"


def test_padding_is_not_routed_and_does_not_change_real_tokens():
    layer = make_layer(num_experts=4, top_k=2, capacity_factor=1.0)
    x, mask = inputs(batch=3, seq=6), ragged_mask([6, 2, 4], 6)
    out = layer(x, mask)
    stats = layer.last_aux
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask])), "padding got an output"
    assert not stats.kept[~mask].any() and stats.capacity == math.ceil(12 * 2 / 4)

    packed = x[mask][None]  # (1, 12, d_model): the real tokens alone, in the same order
    torch.testing.assert_close(layer(packed)[0], out[mask])
    other = x.clone()
    other[~mask] = 100.0
    torch.testing.assert_close(layer(other, mask)[mask], out[mask])


def test_deterministic_and_float32_and_float64():
    for dtype in (torch.float32, torch.float64):
        layer = make_layer(top_k=2, capacity_factor=1.0, dtype=dtype)
        x = inputs(dtype=dtype)
        first, second = layer(x), layer(x)
        assert first.dtype == dtype and first.shape == x.shape
        assert torch.equal(first, second), dtype
    layer64 = make_layer(top_k=2, capacity_factor=1.0)
    x = inputs()
    torch.testing.assert_close(layer64(x), naive_moe(layer64, x), rtol=1e-12, atol=1e-12)


def test_is_a_drop_in_feed_forward_of_an_encoder_layer():
    from companion.layers import EncoderLayer

    layer = EncoderLayer(D_MODEL, 2, D_FF, dropout=0.0, norm_first=True).double()
    layer.feed_forward = make_layer(num_experts=4, top_k=2)
    out = layer(inputs())
    assert out.shape == (3, 7, D_MODEL) and layer.feed_forward.last_aux is not None
    assert isinstance(layer.feed_forward, nn.Module)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(d_model=0), ValueError, "d_model must be >= 1, got 0"),
        (dict(d_ff=2.5), TypeError, "d_ff must be an int, got float"),
        (dict(num_experts=0), ValueError, "num_experts must be >= 1, got 0"),
        (dict(top_k=0), ValueError, "top_k must be >= 1, got 0"),
        (dict(top_k=5), ValueError, "top_k must be between 1 and num_experts = 4, got 5"),
        (dict(capacity_factor=0.0), ValueError, "capacity_factor must be a positive finite"),
        (dict(capacity_factor=-1), ValueError, "capacity_factor must be a positive finite"),
        (dict(capacity_factor=float("nan")), ValueError, "capacity_factor must be"),
        (dict(capacity_factor="1.25"), TypeError, "capacity_factor must be a positive finite"),
        (dict(dropout=1.0), ValueError, "dropout must be in [0, 1), got 1.0"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, message):
    arguments = dict(d_model=D_MODEL, d_ff=D_FF, num_experts=4, top_k=2) | kwargs
    with pytest.raises(error, match=re.escape(message)):
        MoEFeedForward(**arguments)


@pytest.mark.parametrize(
    "x, mask, error, message",
    [
        (torch.randn(2, 3, 5), None, ValueError, r"x must have shape \(batch, seq, 6\)"),
        (torch.randn(3, 6), None, ValueError, r"x must have shape \(batch, seq, 6\) \(3-D\)"),
        (torch.ones(2, 3, 6, dtype=torch.long), None, TypeError, "x must be a floating-point"),
        (
            torch.randn(2, 3, 6, dtype=torch.float64),
            None,
            TypeError,
            "x must have dtype torch.float32",
        ),
        (
            torch.randn(2, 3, 6),
            torch.ones(2, 4, dtype=torch.bool),
            ValueError,
            r"mask must have shape \(2, 3\).*got \(2, 4\)",
        ),
        (
            torch.randn(2, 3, 6),
            torch.ones(2, 3),
            TypeError,
            "mask must be a boolean tensor, got dtype torch.float32",
        ),
        (
            torch.randn(2, 3, 6),
            torch.ones(2, 1, 3, dtype=torch.bool),
            ValueError,
            r"mask must have shape \(2, 3\)",
        ),
    ],
)
def test_bad_forward_inputs(x, mask, error, message):
    layer = MoEFeedForward(D_MODEL, D_FF, 4)
    with pytest.raises(error, match=message):
        layer(x, mask)


def test_bad_balance_loss_inputs():
    probs = torch.full((5, 4), 0.25)
    index = torch.zeros(5, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"router_probs must have shape \(..., num_experts=3\)"):
        load_balancing_loss(probs, index, 3)
    with pytest.raises(TypeError, match="expert_index must be an integer tensor"):
        load_balancing_loss(probs, index.float(), 4)
    with pytest.raises(ValueError, match=r"expert_index must have shape \(5, k\)"):
        load_balancing_loss(probs, index[:4], 4)
    with pytest.raises(ValueError, match=r"expert_index must hold ids in \[0, 3\]"):
        load_balancing_loss(probs, index + 4, 4)
    with pytest.raises(ValueError, match=r"mask must have shape \(5,\)"):
        load_balancing_loss(probs, index, 4, torch.ones(4, dtype=torch.bool))


def test_bad_z_loss_inputs():
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(TypeError, match="router_logits must be a floating-point tensor"):
        router_z_loss(logits.long())
    with pytest.raises(ValueError, match=r"router_logits must have shape \(..., num_experts\)"):
        router_z_loss(torch.tensor(1.0))
    with pytest.raises(TypeError, match="mask must be a boolean tensor, got dtype torch.int64"):
        router_z_loss(logits, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 3\).*got \(3, 2\)"):
        router_z_loss(logits, torch.ones(3, 2, dtype=torch.bool))
