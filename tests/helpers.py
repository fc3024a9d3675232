"""Helpers shared by several test files: parity and property tests, Multi30k tests."""

from __future__ import annotations

from pathlib import Path

import pytest
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


#: The shared local copy of Multi30k (outside the repository); tests never download it.
SHARED_MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
#: Skips a test when the shared copy of Multi30k is absent.
needs_multi30k = pytest.mark.skipif(
    not SHARED_MULTI30K.is_dir(),
    reason=f"the shared Multi30k copy is not at {SHARED_MULTI30K} (tests never download it)",
)
