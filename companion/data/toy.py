"""The toy task: copy or reverse a random digit sequence (chapters 3, 5, 6 and 7).

:class:`CopyReverseDataset` makes random digit sequences whose target is the source copied or
reversed: a task a small Transformer learns on a CPU in seconds, to debug a model before it
meets real sentences. Its ids follow :class:`~companion.data.vocab.Vocab`'s layout (the four
special tokens first) and its items collate with :func:`companion.data.collate_batch`, like
Multi30k's.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from companion._validation import check_positive_int
from companion.data.vocab import SPECIAL_TOKENS, Vocab

__all__ = ["CopyReverseDataset"]


class CopyReverseDataset(Dataset):
    """Random digit sequences whose target is the source copied (``"copy"``) or reversed.

    Token ids follow :class:`~companion.data.vocab.Vocab`'s layout: the four special tokens
    take ids 0-3 and symbol ``d`` (a digit for ``num_symbols <= 10``) has id ``4 + d``;
    :attr:`vocab` is the matching :class:`~companion.data.vocab.Vocab`, so ``dataset.vocab.decode(ids)`` shows a sequence as digits. The examples
    are drawn once, from ``torch.Generator().manual_seed(seed)``, so the same arguments always
    give the same data: use different seeds for the training and the validation set.

    An item is a pair of plain lists ``(src_ids, tgt_ids)`` without special tokens;
    :func:`~companion.data.collate_batch` pads a batch and wraps the targets in ``<bos> … <eos>``::

        train = CopyReverseDataset("reverse", num_examples=10_000, seed=0)
        loader = DataLoader(train, batch_size=64, shuffle=True, collate_fn=collate_batch,
                            generator=torch.Generator().manual_seed(0))
        src, tgt = next(iter(loader))  # (64, src_len), (64, tgt_len + 2)

    The defaults (lengths 1-10, 10 symbols) are sized for a small Transformer (2 layers,
    d_model 64) to learn either task on a CPU in a few epochs of 10,000 examples; a smaller
    ``max_len`` makes it quicker still.

    Args:
        task: ``"copy"`` or ``"reverse"``.
        num_examples: how many sequence pairs to draw.
        min_len: shortest sequence length (>= 1).
        max_len: longest sequence length (>= ``min_len``).
        num_symbols: size of the alphabet (10 = the digits 0-9).
        seed: seed of the generator that draws lengths and symbols.
    """

    TASKS = ("copy", "reverse")

    def __init__(
        self,
        task: str = "copy",
        num_examples: int = 10_000,
        *,
        min_len: int = 1,
        max_len: int = 10,
        num_symbols: int = 10,
        seed: int = 0,
    ) -> None:
        if not isinstance(task, str):
            raise TypeError(f"task must be a str, one of {self.TASKS}, got {type(task).__name__}")
        if task not in self.TASKS:
            raise ValueError(f"task must be one of {self.TASKS}, got {task!r}")
        check_positive_int("num_examples", num_examples)
        check_positive_int("min_len", min_len)
        check_positive_int("max_len", max_len)
        check_positive_int("num_symbols", num_symbols)
        check_positive_int("seed", seed, minimum=0)
        if max_len < min_len:
            raise ValueError(f"max_len must be >= min_len = {min_len}, got {max_len}")
        self.task = task
        self.min_len, self.max_len, self.num_symbols, self.seed = (
            min_len,
            max_len,
            num_symbols,
            seed,
        )
        symbols = [str(d) for d in range(num_symbols)]
        self.vocab = Vocab(list(SPECIAL_TOKENS) + symbols)
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(  # (num_examples,)
            min_len, max_len + 1, (num_examples,), generator=generator
        )
        first_symbol = len(SPECIAL_TOKENS)
        symbol_ids = torch.randint(  # (num_examples, max_len)
            first_symbol, first_symbol + num_symbols, (num_examples, max_len), generator=generator
        )
        self.sources: list[list[int]] = [
            row[:length].tolist() for row, length in zip(symbol_ids, lengths.tolist())
        ]

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        """``(src_ids, tgt_ids)``: two lists of ``length`` ids, no special tokens."""
        src = self.sources[index]
        tgt = list(src) if self.task == "copy" else src[::-1]
        return list(src), tgt

    @property
    def vocab_size(self) -> int:
        """Number of token ids: the 4 special tokens plus ``num_symbols``."""
        return len(self.vocab)

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """Collated length of every example: ``(src_len, tgt_len + 2)`` (``<bos>``, ``<eos>``)."""
        return [(len(src), len(src) + 2) for src in self.sources]
