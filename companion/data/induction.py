"""Sequences for watching induction heads form (chapter 10, section 10.6).

An induction head (Olsson et al., 2022) completes a pattern it has seen earlier in its
context: after ``… A B … A`` it predicts ``B``. The cleanest data to train and measure it is a
random segment followed by the same segment again: the first half cannot be predicted (its
tokens are drawn uniformly), the second half can be predicted exactly, but only by a model
that looks back to where the current token occurred before and copies the token that followed
it there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion._validation import check_instance, check_positive_int

__all__ = ["repeated_segments"]


def repeated_segments(
    batch: int,
    seq_len: int,
    vocab_size: int,
    generator: torch.Generator,
    *,
    min_segment: int = 4,
    first_id: int = 1,
) -> tuple[Tensor, Tensor]:
    """``batch`` rows of ``seq_len`` tokens: a random segment, the same segment again, then
    random tokens up to ``seq_len``.

    Each row's segment length ``n_rep`` is drawn uniformly from
    ``[min_segment, seq_len // 2]``, so the distance between a token and its repeat changes
    from row to row: a model cannot predict the repeat by looking a fixed number of positions
    back, it must find the earlier occurrence by its content. Tokens are drawn uniformly and independently from
    ``[first_id, vocab_size)`` (ids below ``first_id``, e.g. ``<pad>`` = 0, never occur);
    every random number comes from ``generator``.

    Args:
        batch: number of rows, ``>= 1``.
        seq_len: length of a row, ``>= 2 * min_segment``.
        vocab_size: size of the vocabulary, ``> first_id``.
        generator: a seeded ``torch.Generator``.
        min_segment: the shortest segment, ``>= 1``.
        first_id: the smallest id drawn, ``>= 0``.

    Returns:
        ``rows`` ``(batch, seq_len)`` long, with ``rows[b, n_rep:2 * n_rep] == rows[b, :n_rep]``
        for the row's ``n_rep``; and ``lengths`` ``(batch,)`` long, each row's ``n_rep``.
    """
    check_positive_int("batch", batch)
    check_positive_int("min_segment", min_segment)
    check_positive_int("seq_len", seq_len, minimum=2 * min_segment)
    check_positive_int("first_id", first_id, minimum=0)
    check_positive_int("vocab_size", vocab_size, minimum=first_id + 1)
    check_instance("generator", generator, torch.Generator)
    longest = seq_len // 2
    lengths = torch.randint(min_segment, longest + 1, (batch,), generator=generator)  # (batch,)
    shape = (batch, seq_len)
    rows = torch.randint(first_id, vocab_size, shape, generator=generator)  # (batch, seq_len)
    position = torch.arange(seq_len)  # (seq_len,)
    start, stop = lengths[:, None], 2 * lengths[:, None]  # (batch, 1) each: the repeat's bounds
    in_repeat = (position >= start) & (position < stop)  # (batch, seq_len)
    source = torch.where(in_repeat, position - start, position)  # (batch, seq_len)
    return rows.gather(1, source), lengths
