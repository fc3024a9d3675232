"""The toy task and the toolkit of chapter 11's bug clinic: what examines the patient.

:func:`toy_batch` (reverse 12 symbols), :func:`train_toy`, :func:`greedy_accuracy`, and the
tests that find the bugs: :func:`parity` with the package's model (:func:`reference_model`
copies the weights), :func:`causal_leak`, :func:`is_permutation_equivariant` and
:func:`overfit_one_batch`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from companion._validation import check_positive_int
from companion.clinic.patient import (
    BOS_ID,
    EOS_ID,
    SEQ_LEN,
    VOCAB_SIZE,
    Transformer,
    greedy_decode,
    sequence_loss,
)
from companion.model import Transformer as ReferenceTransformer
from companion.model import TransformerConfig

__all__ = [
    "toy_batch",
    "train_toy",
    "greedy_accuracy",
    "reference_model",
    "parity",
    "causal_leak",
    "is_permutation_equivariant",
    "overfit_one_batch",
]


def toy_batch(
    batch_size: int, generator: torch.Generator, seq_len: int = SEQ_LEN
) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of the reverse task: ``(src, tgt_in, tgt_out)``, each ``(batch, seq_len + 1)``.

    ``src`` is ``seq_len`` random symbols (ids 4-10) and ``<eos>``; ``tgt_out`` the symbols
    reversed and ``<eos>``; ``tgt_in`` is ``tgt_out`` shifted right behind ``<bos>`` (teacher
    forcing). Source and target have the same length, as in many toy tasks: the case where a
    bug that mixes them up still runs.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    shape = (batch_size, seq_len)
    symbols = torch.randint(4, VOCAB_SIZE, shape, generator=generator)  # (batch, seq_len)
    eos = torch.full((batch_size, 1), EOS_ID)  # (batch, 1)
    bos = torch.full((batch_size, 1), BOS_ID)  # (batch, 1)
    src = torch.cat([symbols, eos], dim=1)  # (batch, seq_len + 1)
    tgt_out = torch.cat([symbols.flip(1), eos], dim=1)  # (batch, seq_len + 1)
    tgt_in = torch.cat([bos, symbols.flip(1)], dim=1)  # (batch, seq_len + 1)
    return src, tgt_in, tgt_out


def _adam_steps(
    model: nn.Module, steps: int, lr: float, next_batch: Callable[[], tuple[Tensor, Tensor, Tensor]]
) -> list[float]:
    """``steps`` Adam steps on the batches ``next_batch()`` returns; the loss of every step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        src, tgt_in, tgt_out = next_batch()  # (batch, seq) each
        loss = sequence_loss(model(src, tgt_in), tgt_out)  # a scalar
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def train_toy(
    model: nn.Module, steps: int, *, batch_size: int = 64, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Train ``model`` on fresh :func:`toy_batch` batches with Adam; the loss of every step."""
    check_positive_int("steps", steps)
    generator = torch.Generator().manual_seed(seed)
    return _adam_steps(model, steps, lr, lambda: toy_batch(batch_size, generator))


def greedy_accuracy(
    model: nn.Module,
    decode: Callable[..., Tensor] = greedy_decode,
    *,
    batch_size: int = 200,
    seed: int = 1,
    one_by_one: bool = False,
) -> float:
    """Share of target tokens (``<eos>`` included) that ``decode(model, src, max_len)`` gets
    right on a fresh toy batch; ``one_by_one`` calls it on one sentence at a time."""
    src, _, tgt_out = toy_batch(batch_size, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if one_by_one:
            rows = [decode(model, src[b : b + 1], tgt_out.shape[1]) for b in range(batch_size)]
            out = torch.cat(rows)  # (batch, len)
        else:
            out = decode(model, src, tgt_out.shape[1])  # (batch, len)
    return (out == tgt_out).float().mean().item()


def reference_model(model: Transformer) -> ReferenceTransformer:
    """A :class:`companion.model.Transformer` of the same sizes with ``model``'s weights.

    The parameters of the clinic model carry the package's names, so this is one
    ``load_state_dict`` (``strict``: a missing, extra or differently shaped weight raises).
    """
    sizes = model.sizes
    config = TransformerConfig(
        src_vocab=sizes["vocab_size"], tgt_vocab=sizes["vocab_size"], d_model=sizes["d_model"],
        num_heads=sizes["num_heads"], num_layers=sizes["num_layers"], d_ff=sizes["d_ff"],
        dropout=0.0, max_len=sizes["max_len"], src_pad_id=sizes["pad_id"],
        tgt_pad_id=sizes["pad_id"], norm_first=False,
    )  # fmt: skip
    reference = ReferenceTransformer(config)
    reference.load_state_dict(model.state_dict())
    return reference.eval()


def parity(model: Transformer, src: Tensor, tgt: Tensor) -> float:
    """Largest difference between ``model(src, tgt)`` and the package's model with the same
    weights (:func:`reference_model`); about ``1e-6`` for a correct model."""
    reference = reference_model(model)
    model.eval()
    with torch.no_grad():
        return (model(src, tgt) - reference(src, tgt)).abs().max().item()


def causal_leak(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    """``(tgt_len, tgt_len)`` boolean: ``[i, j]`` is ``True`` when changing decoder input token
    ``j`` changes the logits at position ``i``. A decoder that does not leak gives the lower
    triangle (``j <= i``) at most; anything above the diagonal is a leak from the future.

    Args:
        model: maps ``(src (1, src_len), tgt (1, tgt_len))`` to ``(1, tgt_len, vocab)``.
        src, tgt: one example, shapes ``(1, src_len)`` and ``(1, tgt_len)``.
    """
    model.eval()
    with torch.no_grad():
        base = model(src, tgt)  # (1, tgt_len, vocab)
        seen = torch.zeros(tgt.shape[1], tgt.shape[1], dtype=torch.bool)  # (tgt_len, tgt_len)
        for j in range(tgt.shape[1]):
            changed = tgt.clone()
            changed[0, j] = 4 + (changed[0, j] - 3) % (VOCAB_SIZE - 4)  # another symbol
            seen[:, j] = (model(src, changed) - base).abs().amax(dim=-1)[0] > 1e-5  # (tgt_len,)
    return seen


def is_permutation_equivariant(fn: Callable[[Tensor], Tensor], x: Tensor, seed: int = 0) -> bool:
    """Whether permuting the tokens of ``x (batch, seq, d)`` permutes ``fn(x)`` the same way, as
    self-attention without positions must."""
    order = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(seed))  # (seq,)
    with torch.no_grad():
        return torch.allclose(fn(x[:, order]), fn(x)[:, order], atol=1e-5)


def overfit_one_batch(
    model: nn.Module, steps: int = 100, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Train on one fixed batch of 16 toy examples: a correct model drives the loss towards 0."""
    batch = toy_batch(16, torch.Generator().manual_seed(seed))
    return _adam_steps(model, steps, lr, lambda: batch)
