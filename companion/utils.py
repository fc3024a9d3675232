"""Small helpers used throughout the book: reproducible seeds and d2l-style shape checks."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from companion._validation import check_tensor, shape_str

__all__ = ["set_seed", "check_shape", "count_parameters"]


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
