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


def tiny_transformer(vocab: int, *, seed: int = 0, pad_id: int | None = 0, **changes):
    """A small ``Transformer`` (d_model 32, 4 heads, 1 + 1 layers, d_ff 48, no dropout)
    with ``vocab`` tokens in both languages, padding ``pad_id`` (``None``: no pad id), initial
    weights from ``seed``; ``changes`` override any ``TransformerConfig`` field."""
    from companion.model import Transformer, TransformerConfig

    settings = dict(d_model=32, num_heads=4, num_layers=1, d_ff=48, dropout=0.0)
    settings |= {"src_pad_id": pad_id, "tgt_pad_id": pad_id} | changes
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(vocab, vocab, **settings))


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


def load_book_module(relative_path: str):
    """A fresh copy of a module of the book's own code that is not on ``sys.path`` (a Sphinx
    extension in ``book/_ext``, ``book/conftest.py``), loaded from its file."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
