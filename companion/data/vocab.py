"""Tokens and ids: the special tokens, a word tokenizer and the vocabulary (chapters 5 and 8).

In reading order:

1. **Special tokens**: ``<pad>=0, <bos>=1, <eos>=2, <unk>=3`` (:data:`SPECIAL_TOKENS`,
   :data:`PAD_ID` …), the first four ids of every vocabulary, and :func:`check_id_sequence`,
   the input check of everything that takes a row of ids.
2. **Tokenizer**: :class:`WordTokenizer` splits a sentence into words and punctuation and puts
   it back together (:meth:`WordTokenizer.detokenize`), so a model's output can be scored with
   sacreBLEU against the raw references. Anything with ``tokenize`` and ``detokenize``
   methods (the :class:`Tokenizer` protocol), e.g. a subword (BPE) tokenizer, can take its
   place.
3. **Vocabulary**: :class:`Vocab` maps tokens to ids and back.

Chapter 5 builds a :class:`Vocab` by hand to show padding; chapter 8 builds one per language
from Multi30k's training split (:func:`companion.data.prepare_multi30k`). The toy task
(:mod:`companion.data.toy`) and batching (:mod:`companion.data.batching`) build on this module.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from companion._validation import check_bool, check_positive_int

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "SPECIAL_TOKENS",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "check_id_sequence",
    "check_sentences",
    "Tokenizer",
    "WordTokenizer",
    "Vocab",
]

# ---------------------------------------------------------------------------------------------
# 1. Special tokens
# ---------------------------------------------------------------------------------------------

PAD = "<pad>"  #: padding, id 0
BOS = "<bos>"  #: beginning of a target sentence, id 1
EOS = "<eos>"  #: end of a target sentence, id 2
UNK = "<unk>"  #: a token that is not in the vocabulary, id 3
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def check_id_sequence(name: str, value: object) -> list[int]:
    """Return ``value``, a sequence of ints or a 1-D integer tensor ``(seq_len,)``, as a list.

    The input check of everything that takes one row of token ids (or of example indices):
    :meth:`Vocab.decode`, :func:`companion.data.collate_batch`,
    :func:`companion.data.padding_waste`. NumPy integers count as ints; bools, floats and
    strings do not.

    Raises:
        TypeError: ``value`` is not a sequence of ints or a 1-D integer tensor; the message
            names the argument (``name``) and what it got.
    """
    if isinstance(value, Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.dtype == torch.bool:
            raise TypeError(
                f"{name} must be a 1-D integer tensor or a sequence of ints, "
                f"got a {value.dim()}-D tensor of dtype {value.dtype}"
            )
        return value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise TypeError(
                f"{name} must contain only ints, got an item of type {type(item).__name__} "
                f"({item!r})"
            )
    return [int(item) for item in value]


def check_sentences(name: str, sentences: object, vocab_size: int) -> list[list[int]]:
    """Return ``sentences``, a list of sentences of token ids, as lists of ints.

    The input check of the count models (:mod:`companion.baselines`,
    :func:`companion.data.lm.ngram_perplexity`): every id lies in ``[0, vocab_size)`` and is
    neither ``<pad>`` nor ``<bos>`` (the models count and predict real tokens and ``<eos>``).

    Raises:
        TypeError: ``sentences`` is not a list of id sequences (see :func:`check_id_sequence`).
        ValueError: an id is out of range or a ``<pad>``/``<bos>``; the message names the
            sentence (``name[index]``) and the first bad id.
    """
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        raise TypeError(
            f"{name} must be a list of sentences (lists of ids), got {type(sentences).__name__}"
        )
    checked = []
    for index, sentence in enumerate(sentences):
        ids = check_id_sequence(f"{name}[{index}]", sentence)
        bad = [i for i in ids if not 0 <= i < vocab_size or i in (PAD_ID, BOS_ID)]
        if bad:
            raise ValueError(
                f"{name}[{index}] must hold ids in [0, {vocab_size - 1}] other than <pad> "
                f"({PAD_ID}) and <bos> ({BOS_ID}), got {bad[0]}"
            )
        checked.append(list(ids))
    return checked


# ---------------------------------------------------------------------------------------------
# 2. Tokenizer
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Tokenizer(Protocol):
    """What :class:`Vocab`, :class:`~companion.data.TranslationDataset` and
    :func:`~companion.data.prepare_multi30k` need.

    ``tokenize`` turns a sentence into a list of string tokens and ``detokenize`` turns such a
    list back into a sentence. :class:`WordTokenizer` is one; a subword (BPE) tokenizer with
    the same two methods can replace it without changing anything else.
    """

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into tokens."""
        ...

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Join ``tokens`` back into a sentence."""
        ...


# One token is, in this order of preference:
#   - a word: letters/digits, with inner hyphens, apostrophes, slashes, ampersands and dots, or
#     commas and colons between digits ("T-shirt", "man's", "A&M", "U.S", "2.52", "11:27"); a
#     hyphen at its start or end next to a space ("Limonade- und -tassen", "rot-, weiß-"); a
#     plural possessive apostrophe ("girls'");
#   - a German closing quote glued to a compound, as in „Open“-Schild: "“-";
#   - an HTML entity such as "&amp;" (the English side has a few);
#   - "..." or any other single non-space character (punctuation, quotes, symbols).
_TOKEN_RE = re.compile(
    r"""
    (?:(?<!\S)-)? \#? \w+ (?: (?: &amp; | [-'’‘/&.] | (?<=\d)[,:](?=\d) ) \w+ )*
        (?: (?<=s)'(?!\w) | -(?![^\s,]) )?
    | “-(?=\w)
    | &[a-zA-Z]+;
    | \.\.\.
    | \S
    """,
    re.VERBOSE,
)
# Detokenizing: these attach to the token before them (no space in front) ...
_ATTACH_LEFT = frozenset({".", ",", ";", ":", "!", "?", ")", "]", "}", "...", "“", "”", "“-"})
# ... these to the token after them (no space behind) ...
_ATTACH_RIGHT = frozenset({"(", "[", "{", "„", "“-"})
# ... and these alternate: the 1st, 3rd, ... open (attach right), the others close (attach left).
_STRAIGHT_QUOTES = frozenset({'"', "'"})


class WordTokenizer:
    """Word-level tokenizer: words and punctuation marks become separate tokens.

    ``tokenize("A man's T-shirt, (red).")`` → ``["A", "man's", "T-shirt", ",", "(", "red",
    ")", "."]``. Hyphenated words, apostrophes inside words and numbers like ``2.52`` stay
    whole. :meth:`detokenize` undoes it with English/German spacing rules (no space before
    ``. , ; : ! ? ) “``, none after ``( „``, straight double quotes alternate between opening
    and closing), so that ``detokenize(tokenize(s)) == s`` for over 99% of Multi30k's
    sentences, and a model's detokenized output can be scored with sacreBLEU against the raw
    references.

    Args:
        lowercase: lowercase every token (a smaller vocabulary; detokenize cannot restore case).
    """

    def __init__(self, lowercase: bool = False) -> None:
        self.lowercase = check_bool("lowercase", lowercase)

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into words and punctuation marks (whitespace is dropped)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.lowercase:
            text = text.lower()
        return _TOKEN_RE.findall(text)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Join ``tokens`` with single spaces, except around punctuation (see the class)."""
        if isinstance(tokens, str) or not isinstance(tokens, Sequence):
            raise TypeError(f"tokens must be a sequence of str, got {type(tokens).__name__}")
        pieces: list[str] = []
        glue_next = True  # no space before the first token
        open_quotes: set[str] = set()
        for token in tokens:
            if not isinstance(token, str):
                raise TypeError(f"tokens must contain only str, got {type(token).__name__}")
            if token in _STRAIGHT_QUOTES:
                closing = token in open_quotes
                glue = glue_next or closing  # a closing quote attaches to the left,
                glue_next = not closing  # an opening one to the right
                open_quotes ^= {token}
            else:
                glue = glue_next or token in _ATTACH_LEFT
                glue_next = token in _ATTACH_RIGHT
            pieces.append(token if glue else " " + token)
        return "".join(pieces)

    def to_dict(self) -> dict[str, Any]:
        """Settings as plain Python types (to store with a checkpoint)."""
        return {"type": "word", "lowercase": self.lowercase}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> WordTokenizer:
        """Rebuild a tokenizer from :meth:`to_dict`'s output."""
        if not isinstance(state, Mapping) or state.get("type") != "word":
            raise ValueError(f"state must be WordTokenizer.to_dict()'s output, got {state!r}")
        return cls(lowercase=state.get("lowercase", False))

    def __repr__(self) -> str:
        return f"WordTokenizer(lowercase={self.lowercase})"


class Vocab:
    """Two-way map between tokens and integer ids.

    ``tokens[i]`` is the token of id ``i``. The first four are always the special tokens
    ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``; :meth:`encode` maps a token it does not know to
    ``<unk>``. Build one from the *training* sentences with :meth:`build`, store it with a
    checkpoint as :meth:`to_dict` (plain lists and strings, loadable with
    ``torch.load(..., weights_only=True)``) and restore it with :meth:`from_dict`.

    Args:
        tokens: every token, specials first, no duplicates.
    """

    def __init__(self, tokens: Sequence[str]) -> None:
        if isinstance(tokens, str) or not isinstance(tokens, Sequence):
            raise TypeError(f"tokens must be a sequence of str, got {type(tokens).__name__}")
        tokens = list(tokens)
        bad = [t for t in tokens if not isinstance(t, str)]
        if bad:
            raise TypeError(f"tokens must contain only str, got {type(bad[0]).__name__}")
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(
                f"tokens must start with the special tokens {list(SPECIAL_TOKENS)}, "
                f"got {tokens[: len(SPECIAL_TOKENS)]}"
            )
        duplicates = sorted(t for t, n in Counter(tokens).items() if n > 1)
        if duplicates:
            raise ValueError(f"tokens must be unique, got duplicates {duplicates[:5]}")
        self._tokens = tokens
        self._ids = {token: index for index, token in enumerate(tokens)}

    @classmethod
    def build(
        cls,
        sentences: Iterable[Sequence[str]],
        min_freq: int = 2,
        max_size: int | None = None,
    ) -> Vocab:
        """Vocabulary of the tokens that occur at least ``min_freq`` times in ``sentences``.

        Pass the **training** sentences only (already tokenized), so that validation and test
        words the model never saw in training become ``<unk>``, as they would at test time.
        Tokens are ordered by decreasing count, ties alphabetically, after the four specials;
        ``max_size`` (specials included) keeps only the most frequent.
        """
        check_positive_int("min_freq", min_freq)
        if max_size is not None:
            check_positive_int("max_size", max_size, minimum=len(SPECIAL_TOKENS))
        counts: Counter[str] = Counter()
        for sentence in sentences:
            if isinstance(sentence, str):
                raise TypeError(
                    "sentences must be tokenized (a list of tokens per sentence), got a str; "
                    "use [tokenizer.tokenize(s) for s in texts]"
                )
            counts.update(sentence)
        for special in SPECIAL_TOKENS:
            counts.pop(special, None)
        kept = sorted(
            (t for t, n in counts.items() if n >= min_freq), key=lambda t: (-counts[t], t)
        )
        if max_size is not None:
            kept = kept[: max_size - len(SPECIAL_TOKENS)]
        return cls(list(SPECIAL_TOKENS) + kept)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._tokens == other._tokens

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, tokens={self._tokens[4:9]}...)"

    @property
    def tokens(self) -> list[str]:
        """All tokens; ``tokens[i]`` has id ``i``."""
        return list(self._tokens)

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def token_to_id(self, token: str) -> int:
        """Id of ``token``, or :data:`UNK_ID` if it is not in the vocabulary."""
        return self._ids.get(token, UNK_ID)

    def id_to_token(self, index: int) -> str:
        """Token of id ``index`` (``0 <= index < len(self)``)."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        if not 0 <= index < len(self._tokens):
            raise ValueError(f"index must be in [0, {len(self._tokens)}), got {index}")
        return self._tokens[index]

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens`` (unknown ones → :data:`UNK_ID`); no special tokens are added."""
        if isinstance(tokens, str) or not isinstance(tokens, Sequence):
            raise TypeError(
                f"tokens must be a sequence of str (tokenize the text first), "
                f"got {type(tokens).__name__}"
            )
        return [self._ids.get(token, UNK_ID) for token in tokens]

    def decode(self, ids: Sequence[int] | Tensor, *, strip_special: bool = True) -> list[str]:
        """Tokens of ``ids``, a sequence of ints or a 1-D tensor ``(seq_len,)``.

        With ``strip_special`` (the default) decoding stops at the first ``<eos>`` and drops
        ``<pad>`` and ``<bos>``, which turns a model's output row into the sentence's tokens.
        ``<unk>`` is kept.
        """
        ids = check_id_sequence("ids", ids)
        bad = [i for i in ids if not 0 <= i < len(self._tokens)]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self._tokens)}), got {bad[0]}")
        if not strip_special:
            return [self._tokens[i] for i in ids]
        tokens = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                tokens.append(self._tokens[i])
        return tokens

    def to_dict(self) -> dict[str, Any]:
        """``{"tokens": [...]}``: plain Python types, safe for ``torch.load(weights_only=True)``."""
        return {"tokens": list(self._tokens)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Vocab:
        """Rebuild a vocabulary from :meth:`to_dict`'s output."""
        if not isinstance(state, Mapping) or "tokens" not in state:
            raise ValueError(
                "state must be Vocab.to_dict()'s output, a dict with a 'tokens' list, "
                f"got {type(state).__name__}"
            )
        return cls(state["tokens"])
