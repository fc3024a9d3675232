"""companion.dropout: the CPU dropout with cheap random numbers behaves like torch's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.dropout import (
    Dropout,
    dropout,
    dropout_factor,
    keep_mask,
    realised_probability,
    survivor_scale,
)


def five_sigma(p: float, n: int) -> float:
    return 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
def test_keep_rate_matches_the_realised_probability(p: float) -> None:
    torch.manual_seed(0)
    n = 400_000
    keep = keep_mask((n,), p)
    assert keep.dtype == torch.bool and keep.shape == (n,)
    rate = keep.float().mean().item()
    assert abs(rate - (1 - realised_probability(p))) < five_sigma(p, n)
    # every lane of a random word keeps with the same probability (all 64 bits are random)
    per_lane = keep.view(-1, 4).float().mean(0)  # (4,)
    assert (per_lane - (1 - p)).abs().max().item() < five_sigma(p, n // 4)


@pytest.mark.parametrize("p", [1.0, 1 - 1e-6])  # both realised as 1
def test_keep_mask_keeps_nothing_when_p_is_one(p: float) -> None:
    assert realised_probability(p) == 1.0
    assert not keep_mask((1000,), p).any()
    assert keep_mask((1000,), 0.0).all()
    assert not dropout(torch.ones(1000), p).any()


def test_neighbouring_decisions_are_independent() -> None:
    torch.manual_seed(1)
    keep = keep_mask((400_000,), 0.5).float()
    both = (keep[:-1] * keep[1:]).mean().item()  # within a word and across words
    assert abs(both - 0.25) < five_sigma(0.25, keep.numel())


def test_realised_probability_is_p_rounded_to_1_over_65536() -> None:
    assert realised_probability(0.1) == round(0.1 * 65536) / 65536
    assert abs(realised_probability(0.1) - 0.1) < 1 / 131072
    assert realised_probability(0.0) == 0.0 and realised_probability(1.0) == 1.0


def test_dropout_is_unbiased_and_scales_the_survivors() -> None:
    torch.manual_seed(2)
    x = torch.randn(300, 1000, dtype=torch.float64)
    out = dropout(x, 0.3)
    kept = out != 0
    scale = 1 / (1 - realised_probability(0.3))
    torch.testing.assert_close(out[kept], x[kept] * scale, rtol=1e-15, atol=0)
    ones = dropout(torch.ones(1_000_000), 0.3)
    assert abs(ones.mean().item() - 1.0) < 5 * math.sqrt(0.3 / 0.7 / 1_000_000)


def test_gradient_is_the_mask_times_the_scale() -> None:
    torch.manual_seed(3)
    x = torch.randn(64, 257, requires_grad=True)  # 257: a size that is not a multiple of 4
    out = dropout(x, 0.2)
    out.backward(torch.ones_like(out))
    scale = 1 / (1 - realised_probability(0.2))
    expected = (out != 0).float() * scale
    torch.testing.assert_close(x.grad, expected)

    def same_mask_each_call(t: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(4)  # gradcheck calls the function many times: one mask for all
        return dropout(t, 0.2)

    t = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(same_mask_each_call, (t,))


def test_set_seed_reproduces_and_calls_differ() -> None:
    x = torch.ones(10_000)
    torch.manual_seed(5)
    first, second = dropout(x, 0.1), dropout(x, 0.1)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.1), first)
    assert not torch.equal(first, second)


def test_edge_cases_match_torch() -> None:
    x = torch.randn(3, 4)
    assert dropout(x, 0.0) is x
    assert dropout(x, 0.7, training=False) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    empty = torch.empty(0, 5)
    assert dropout(empty, 0.5).shape == (0, 5)
    assert dropout(torch.randn(()), 0.5).shape == ()


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.1", True])
def test_bad_probability_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="dropout probability p"):
        dropout(torch.ones(3), bad)  # type: ignore[arg-type]


def test_meta_and_integer_tensors_use_torchs_kernel() -> None:
    meta = torch.empty(4, 8, device="meta")
    assert dropout(meta, 0.5).shape == (4, 8)
    torch.manual_seed(6)
    x = torch.ones(1000, dtype=torch.float64)
    assert dropout(x, 0.5).dtype == torch.float64


def test_module_is_an_nn_dropout() -> None:
    module = Dropout(0.25)
    assert isinstance(module, nn.Dropout) and module.p == 0.25
    assert repr(module) == "Dropout(p=0.25, inplace=False)"
    x = torch.ones(2000)
    torch.manual_seed(7)
    dropped = module(x)
    assert 0 < (dropped == 0).sum() < 2000
    assert module.eval()(x) is x
    in_place = Dropout(0.5, inplace=True).train()
    y = torch.ones(100)
    in_place(y)
    assert (y == 0).any()  # torch's in-place kernel


def test_compiled_dropout_uses_the_fused_kernel() -> None:
    compiled = torch.compile(lambda t: dropout(t, 0.5), fullgraph=True, backend="eager")
    out = compiled(torch.ones(4000))
    assert 1000 < (out == 0).sum() < 3000
    assert set(out.unique().tolist()) <= {0.0, 2.0}


def test_matches_torch_dropout_in_distribution() -> None:
    """Same keep rate and scale as F.dropout (p = 0.1) over a million elements."""
    torch.manual_seed(8)
    ours = dropout(torch.ones(1_000_000), 0.1)
    theirs = F.dropout(torch.ones(1_000_000), 0.1)
    assert abs((ours == 0).float().mean() - (theirs == 0).float().mean()) < 2 * five_sigma(
        0.1, 1_000_000
    )
    assert abs(ours.max().item() - theirs.max().item()) < 1e-4


def test_dropout_factor_is_zero_or_the_scale_and_dropout_multiplies_by_it() -> None:
    x = torch.randn(400, 1000, dtype=torch.float64).mT  # not contiguous: the factor is
    torch.manual_seed(3)
    factor = dropout_factor(x, 0.25)
    assert factor.shape == x.shape and factor.dtype == x.dtype and factor.is_contiguous()
    scale = 1 / (1 - realised_probability(0.25))
    assert survivor_scale(0.25) == scale and survivor_scale(1 - 1e-6) == 0.0
    assert set(factor.unique().tolist()) == {0.0, scale}
    assert abs((factor == 0).double().mean().item() - 0.25) < five_sigma(0.25, x.numel())
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.25), x * factor)  # the same decisions from the same seed
    assert torch.equal(dropout_factor(x, 0.0), torch.ones_like(x))
    assert not dropout_factor(x, 1.0).any()


@pytest.mark.parametrize("bad", [torch.ones(3, dtype=torch.long), [1.0, 2.0]])
def test_dropout_factor_names_a_bad_x(bad: object) -> None:
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        dropout_factor(bad, 0.1)
    with pytest.raises(ValueError, match="dropout probability p"):
        dropout_factor(torch.ones(3), 1.5)


def test_keep_mask_as_floats_is_the_same_decisions_as_zeros_and_ones() -> None:
    torch.manual_seed(4)
    as_bool = keep_mask((3, 1000), 0.3)
    torch.manual_seed(4)
    as_float = keep_mask((3, 1000), 0.3, dtype=torch.float64)
    assert as_float.dtype == torch.float64 and torch.equal(as_float, as_bool.double())
    assert not keep_mask((10,), 1.0, dtype=torch.float32).any()
    with pytest.raises(TypeError, match="dtype must be torch.bool or a floating dtype"):
        keep_mask((3,), 0.1, dtype=torch.int64)
