"""Helpers shared by the parity and property tests."""

from __future__ import annotations

import torch
from torch import nn


def randomize_(module: nn.Module, generator: torch.Generator, std: float = 0.3) -> nn.Module:
    """Give every parameter (biases and LayerNorm affine included) random values, in place."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std)
    return module


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference (0 for empty selections)."""
    return (a - b).abs().max().item() if a.numel() else 0.0
