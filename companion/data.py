"""Data for the course (chapter 8): a toy copy/reverse task and Multi30k German→English.

The pieces, in the order a training script uses them:

1. **A toy task** to debug a model in seconds: :class:`CopyReverseDataset` makes random digit
   sequences whose target is the source copied or reversed.
2. **Multi30k**, task 1, German→English (29,000 / 1,014 / 1,000 sentence pairs):
   :func:`load_multi30k` returns the raw ``(de, en)`` sentence pairs of one split. The six
   ``.gz`` files are downloaded once into a cache folder (:func:`default_cache_dir`), or read
   from a local copy (``root=`` or the environment variable ``MULTI30K_ROOT``). Every file is
   checked against the SHA-256 checksums in :data:`MULTI30K_SHA256` before it is read, and a
   download is written atomically, so a corrupt, truncated or half-downloaded file is never
   parsed.
3. **Tokens and ids**: :class:`WordTokenizer` splits a sentence into words and punctuation and
   puts it back together (:meth:`WordTokenizer.detokenize`), so a model's output can be scored
   with sacreBLEU against the raw references. :class:`Vocab` maps tokens to ids, with the
   special tokens ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``. Anything with ``tokenize`` and
   ``detokenize`` methods (the :class:`Tokenizer` protocol), e.g. a subword (BPE) tokenizer,
   can take the word tokenizer's place.
4. **Batches**: :class:`TokenBatchSampler` groups sentence pairs of similar length into
   batches of at most ``max_tokens`` tokens (padding included), and :func:`collate_batch`
   pads them into ``src (batch, src_len)`` and ``tgt (batch, tgt_len)`` tensors, the target
   wrapped in ``<bos> … <eos>``. :func:`padding_waste` measures how much of a batch is padding.

:func:`prepare_multi30k` does 2-4 in one call and returns a :class:`Multi30kData` whose
:meth:`~Multi30kData.loader` gives ready-made batches.

Conventions: a source sequence carries no special tokens; a target sequence gets ``<bos>`` in
front and ``<eos>`` at the end when it is collated, so a model reads ``tgt[:, :-1]`` and
predicts ``tgt[:, 1:]``. Padding is always :data:`PAD_ID` (0).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import re
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from companion._validation import check_positive_int

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
    "CopyReverseDataset",
    "MULTI30K_URL",
    "MULTI30K_SPLITS",
    "MULTI30K_NUM_PAIRS",
    "MULTI30K_SHA256",
    "ROOT_ENV_VAR",
    "BASE_URL_ENV_VAR",
    "ChecksumError",
    "DownloadError",
    "default_cache_dir",
    "sha256_of_file",
    "verify_checksum",
    "multi30k_files",
    "read_parallel",
    "load_multi30k",
    "Tokenizer",
    "WordTokenizer",
    "Vocab",
    "TranslationDataset",
    "collate_batch",
    "TokenBatchSampler",
    "padding_waste",
    "Multi30kData",
    "prepare_multi30k",
]

# ---------------------------------------------------------------------------------------------
# Special tokens
# ---------------------------------------------------------------------------------------------

PAD = "<pad>"  #: padding, id 0
BOS = "<bos>"  #: beginning of a target sentence, id 1
EOS = "<eos>"  #: end of a target sentence, id 2
UNK = "<unk>"  #: a token that is not in the vocabulary, id 3
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def _check_id_sequence(name: str, value: object) -> list[int]:
    """Return ``value`` (a sequence of ints or a 1-D integer tensor) as a list of ints."""
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


# ---------------------------------------------------------------------------------------------
# 1. The toy task: copy or reverse a random digit sequence
# ---------------------------------------------------------------------------------------------


class CopyReverseDataset(Dataset):
    """Random digit sequences whose target is the source copied (``"copy"``) or reversed.

    Token ids follow :class:`Vocab`'s layout: the four special tokens take ids 0-3 and symbol
    ``d`` (a digit for ``num_symbols <= 10``) has id ``4 + d``; :attr:`vocab` is the matching
    :class:`Vocab`, so ``dataset.vocab.decode(ids)`` shows a sequence as digits. The examples
    are drawn once, from ``torch.Generator().manual_seed(seed)``, so the same arguments always
    give the same data: use different seeds for the training and the validation set.

    An item is a pair of plain lists ``(src_ids, tgt_ids)`` without special tokens;
    :func:`collate_batch` pads a batch and wraps the targets in ``<bos> … <eos>``::

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
        lengths = torch.randint(min_len, max_len + 1, (num_examples,), generator=generator)
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


# ---------------------------------------------------------------------------------------------
# 2. Multi30k: files, checksums, download
# ---------------------------------------------------------------------------------------------

#: Where the raw files are downloaded from (``<MULTI30K_URL>/train.de.gz`` etc.).
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
#: The three splits of Multi30k task 1 (``"test"`` is accepted for ``"test_2016_flickr"``).
MULTI30K_SPLITS: tuple[str, ...] = ("train", "val", "test_2016_flickr")
#: Number of sentence pairs in each split.
MULTI30K_NUM_PAIRS: dict[str, int] = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
#: SHA-256 of each raw file, as served at :data:`MULTI30K_URL`.
MULTI30K_SHA256: dict[str, str] = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
#: Environment variable naming a folder that holds a local copy of the six files.
ROOT_ENV_VAR = "MULTI30K_ROOT"
#: Environment variable that replaces :data:`MULTI30K_URL` (a mirror, or a test server).
BASE_URL_ENV_VAR = "MULTI30K_BASE_URL"
_LANGUAGES = ("de", "en")
_CHUNK_BYTES = 64 * 1024


class ChecksumError(ValueError):
    """A file's SHA-256 differs from the expected one: it is corrupt, truncated or different."""


class DownloadError(OSError):
    """A download failed (no network, server error, connection closed early, timeout)."""


def _check_split(split: object) -> str:
    """Return the canonical split name; ``"test"`` means ``"test_2016_flickr"``."""
    if not isinstance(split, str):
        raise TypeError(
            f"split must be a str, one of {MULTI30K_SPLITS}, got {type(split).__name__}"
        )
    if split == "test":
        return "test_2016_flickr"
    if split not in MULTI30K_SPLITS:
        raise ValueError(
            f"split must be one of {MULTI30K_SPLITS} (or 'test' for 'test_2016_flickr'), "
            f"got {split!r}"
        )
    return split


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    return float(timeout)


def _as_path(name: str, value: object) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or a path, got {type(value).__name__}")
    return Path(value).expanduser()


def default_cache_dir() -> Path:
    """The folder downloads go to: ``$XDG_CACHE_HOME/transformer-step-by-step/multi30k``.

    ``XDG_CACHE_HOME`` defaults to ``~/.cache`` (when unset, empty or not an absolute path).
    """
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "transformer-step-by-step" / "multi30k"


def sha256_of_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 digest of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksum(path: str | os.PathLike[str], expected: str, hint: str = "") -> Path:
    """Raise :class:`ChecksumError` unless the file's SHA-256 is ``expected``; return the path.

    The message gives the path, the expected and the actual hash, and ``hint`` (what to do).
    """
    path = Path(path)
    actual = sha256_of_file(path)
    if actual != expected:
        raise ChecksumError(
            f"checksum mismatch for {path}: expected SHA-256 {expected}, got {actual} "
            f"({path.stat().st_size} bytes). The file is corrupt, truncated or not the "
            f"expected one, and was not read.{' ' + hint if hint else ''}"
        )
    return path


def _what_to_do(base_url: str, cache_dir: Path) -> str:
    """The instructions appended to every 'could not get Multi30k' error."""
    names = ", ".join(MULTI30K_SHA256)
    return (
        "To use Multi30k without downloading it here, do one of:\n"
        f"  - download the six files ({names}) from {MULTI30K_URL}/<name> into a folder and "
        f'pass root="/that/folder" (load_multi30k(split, root=...), prepare_multi30k(root=...)) '
        f"or set the environment variable {ROOT_ENV_VAR}=/that/folder;\n"
        f"  - or put them into the cache folder {cache_dir} (where downloads go);\n"
        f"  - or, with a mirror, pass base_url= or set {BASE_URL_ENV_VAR} "
        f"(the download was tried from {base_url}).\n"
        "Every file is checked against the SHA-256 checksums in companion.data.MULTI30K_SHA256."
    )


def _download(
    url: str,
    destination: Path,
    expected_sha256: str,
    *,
    timeout: float,
    progress: bool,
    what_to_do: str,
) -> Path:
    """Download ``url`` to ``destination`` atomically and verify its SHA-256.

    The bytes go to a temporary file in the destination's folder; only when the whole file has
    arrived (``Content-Length`` bytes, when the server sends one) and its checksum matches is
    it renamed to ``destination`` with :func:`os.replace`. On any failure, even Ctrl-C, the
    temporary file is deleted, so the folder never holds a partial file.
    """
    from tqdm.auto import tqdm

    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(
        prefix=f".{destination.name}.", suffix=".part", dir=destination.parent
    )
    temp_path = Path(temp_name)
    received = 0

    def cut_short(expected_size: int | None) -> str:
        return (
            f"the download of {url} stopped after {received} of {expected_size or '?'} bytes "
            f"(the connection was closed early); nothing was saved. Try again.\n{what_to_do}"
        )

    try:
        digest = hashlib.sha256()
        expected_size: int | None = None
        with os.fdopen(handle, "wb") as temp_file:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    length = response.headers.get("Content-Length")
                    expected_size = int(length) if length and length.isdigit() else None
                    with tqdm(
                        total=expected_size,
                        unit="B",
                        unit_scale=True,
                        unit_divisor=1024,
                        desc=destination.name,
                        disable=not progress,
                        leave=False,
                    ) as bar:
                        while chunk := response.read(_CHUNK_BYTES):
                            temp_file.write(chunk)
                            digest.update(chunk)
                            received += len(chunk)
                            bar.update(len(chunk))
            except http.client.IncompleteRead as error:  # raised by some Python versions
                raise DownloadError(cut_short(expected_size)) from error
            except urllib.error.HTTPError as error:
                raise DownloadError(
                    f"could not download {url}: the server answered {error.code} {error.reason}.\n"
                    + what_to_do
                ) from error
            except (
                urllib.error.URLError,  # no network, DNS failure, connection refused
                http.client.HTTPException,  # a malformed answer
                ConnectionError,  # connection reset while reading
                TimeoutError,  # no byte for `timeout` seconds
            ) as error:
                reason = getattr(error, "reason", None) or error
                raise DownloadError(
                    f"could not download {url} ({type(error).__name__}: {reason}).\n" + what_to_do
                ) from error
            if expected_size is not None and received != expected_size:
                raise DownloadError(cut_short(expected_size))
            temp_file.flush()
            os.fsync(temp_file.fileno())
        actual = digest.hexdigest()
        if actual != expected_sha256:
            raise ChecksumError(
                f"checksum mismatch for the download of {url}: expected SHA-256 "
                f"{expected_sha256}, got {actual} ({received} bytes). The download is corrupt "
                f"and was discarded; nothing was written to {destination}. Try again, or see "
                f"below.\n{what_to_do}"
            )
        os.replace(temp_path, destination)
    except BaseException:
        temp_path.unlink(missing_ok=True)
        raise
    return destination


def multi30k_files(
    split: str,
    root: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    base_url: str | None = None,
    timeout: float = 30.0,
    progress: bool = True,
) -> dict[str, Path]:
    """Paths of the verified ``.de.gz`` and ``.en.gz`` files of one split: ``{"de": …, "en": …}``.

    Where the files come from, first match wins:

    1. ``root`` (a folder holding the raw ``.gz`` files), if given;
    2. the folder named by the environment variable ``MULTI30K_ROOT``, if set;
    3. the cache folder (``cache_dir``, default :func:`default_cache_dir`); files missing there
       are downloaded from ``base_url`` (default ``$MULTI30K_BASE_URL`` or
       :data:`MULTI30K_URL`) unless ``download=False``.

    Every file is checked against :data:`MULTI30K_SHA256` before its path is returned.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: a file is missing from a local copy (1, 2), or from the cache with
            ``download=False``.
        ChecksumError: a file (local, cached or downloaded) has the wrong SHA-256.
        DownloadError: the download failed (offline, server error, cut off, timeout).
    """
    split = _check_split(split)
    if not isinstance(download, bool):
        raise TypeError(f"download must be a bool, got {type(download).__name__}")
    timeout = _check_timeout(timeout)
    if base_url is None:
        base_url = os.environ.get(BASE_URL_ENV_VAR) or MULTI30K_URL
    elif not isinstance(base_url, str):
        raise TypeError(f"base_url must be a str, got {type(base_url).__name__}")
    cache = default_cache_dir() if cache_dir is None else _as_path("cache_dir", cache_dir)
    what_to_do = _what_to_do(base_url, cache)

    env_root = os.environ.get(ROOT_ENV_VAR)
    if root is not None or env_root:
        where = "root" if root is not None else f"${ROOT_ENV_VAR}"
        folder = _as_path("root", root) if root is not None else Path(env_root or "")
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{where} = {str(folder)!r} is not a folder; it should hold the Multi30k "
                f"files {', '.join(MULTI30K_SHA256)} from {MULTI30K_URL}."
            )
        paths = {}
        for lang in _LANGUAGES:
            name = f"{split}.{lang}.gz"
            path = folder / name
            if not path.is_file():
                raise FileNotFoundError(
                    f"{where} = {str(folder)!r} has no file {name}. Put the six Multi30k files "
                    f"there (download them from {MULTI30K_URL}/<name>), or call without "
                    f"root= and with {ROOT_ENV_VAR} unset to download them into the cache."
                )
            hint = f"Replace it with a fresh copy from {MULTI30K_URL}/{name}."
            paths[lang] = verify_checksum(path, MULTI30K_SHA256[name], hint)
        return paths

    paths = {}
    for lang in _LANGUAGES:
        name = f"{split}.{lang}.gz"
        path = cache / name
        if path.is_file():
            hint = "Delete it, and it will be downloaded again on the next call."
            paths[lang] = verify_checksum(path, MULTI30K_SHA256[name], hint)
            continue
        if not download:
            raise FileNotFoundError(f"{path} does not exist and download=False.\n" + what_to_do)
        url = f"{base_url.rstrip('/')}/{name}"
        paths[lang] = _download(
            url,
            path,
            MULTI30K_SHA256[name],
            timeout=timeout,
            progress=progress,
            what_to_do=what_to_do,
        )
    return paths


def read_parallel(
    src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str]
) -> list[tuple[str, str]]:
    """Read two line-aligned text files (plain or ``.gz``, UTF-8) into sentence pairs.

    Line ``i`` of ``src_path`` pairs with line ``i`` of ``tgt_path``. Lines keep their text
    exactly; only the line break is removed (``\\n``; a ``\\r`` before it too).

    Raises:
        ValueError: the two files have different numbers of lines.
    """
    sides = []
    for path in (Path(src_path), Path(tgt_path)):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as file:
            text = file.read().decode("utf-8")
        lines = text.split("\n")  # not splitlines(): it also splits at U+2028, U+0085, ...
        if lines and lines[-1] == "":
            lines.pop()
        sides.append([line.removesuffix("\r") for line in lines])
    src_lines, tgt_lines = sides
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"parallel files must have the same number of lines: {src_path} has "
            f"{len(src_lines)}, {tgt_path} has {len(tgt_lines)}"
        )
    return list(zip(src_lines, tgt_lines))


def load_multi30k(
    split: str,
    root: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    base_url: str | None = None,
    timeout: float = 30.0,
    progress: bool = True,
) -> list[tuple[str, str]]:
    """The ``(german, english)`` sentence pairs of one Multi30k split, raw text.

    ``split`` is ``"train"`` (29,000 pairs), ``"val"`` (1,014) or ``"test_2016_flickr"``
    (1,000; ``"test"`` also works). The files are found, downloaded and verified as described
    in :func:`multi30k_files`, which takes the same keyword arguments: a local copy via
    ``root=`` or ``$MULTI30K_ROOT``, otherwise a download into ``cache_dir``.

    Example::

        pairs = load_multi30k("val")
        pairs[0]  # ('Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen',
                  #  'A group of men are loading cotton onto a truck')
    """
    paths = multi30k_files(
        split,
        root,
        cache_dir=cache_dir,
        download=download,
        base_url=base_url,
        timeout=timeout,
        progress=progress,
    )
    pairs = read_parallel(paths["de"], paths["en"])
    expected = MULTI30K_NUM_PAIRS[_check_split(split)]
    if len(pairs) != expected:  # cannot happen with verified files; a guard all the same
        raise ValueError(f"Multi30k {split} should have {expected} pairs, read {len(pairs)}")
    return pairs


# ---------------------------------------------------------------------------------------------
# 3. Tokenizer and vocabulary
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Tokenizer(Protocol):
    """What :class:`Vocab`, :class:`TranslationDataset` and :func:`prepare_multi30k` need.

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
        if not isinstance(lowercase, bool):
            raise TypeError(f"lowercase must be a bool, got {type(lowercase).__name__}")
        self.lowercase = lowercase

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
        ids = _check_id_sequence("ids", ids)
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


# ---------------------------------------------------------------------------------------------
# 4. Datasets, batching, padding
# ---------------------------------------------------------------------------------------------


class TranslationDataset(Dataset):
    """Sentence pairs, tokenized and turned into ids once, up front.

    An item is ``(src_ids, tgt_ids)``, two lists of ints without special tokens (as for
    :class:`CopyReverseDataset`), ready for :func:`collate_batch`. The raw text stays available
    as :attr:`pairs` (the references for BLEU).

    Args:
        pairs: ``(source sentence, target sentence)`` pairs.
        tokenizer: a :class:`Tokenizer` used for both languages.
        src_vocab: vocabulary of the source language.
        tgt_vocab: vocabulary of the target language.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        tokenizer: Tokenizer,
        src_vocab: Vocab,
        tgt_vocab: Vocab,
    ) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                "tokenizer must have tokenize() and detokenize() methods (the Tokenizer "
                f"protocol), got {type(tokenizer).__name__}"
            )
        for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
            if not isinstance(vocab, Vocab):
                raise TypeError(f"{name} must be a Vocab, got {type(vocab).__name__}")
        self.pairs = list(pairs)
        self.tokenizer, self.src_vocab, self.tgt_vocab = tokenizer, src_vocab, tgt_vocab
        self.examples: list[tuple[list[int], list[int]]] = [
            (src_vocab.encode(tokenizer.tokenize(src)), tgt_vocab.encode(tokenizer.tokenize(tgt)))
            for src, tgt in self.pairs
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.examples[index]

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """Collated length of every example: ``(src_len, tgt_len + 2)`` (``<bos>``, ``<eos>``)."""
        return [(len(src), len(tgt) + 2) for src, tgt in self.examples]


def collate_batch(
    examples: Sequence[tuple[Sequence[int] | Tensor, Sequence[int] | Tensor]],
    *,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> tuple[Tensor, Tensor]:
    """Pad a list of ``(src_ids, tgt_ids)`` examples into two LongTensors.

    Returns:
        ``src`` of shape ``(batch, src_len)`` and ``tgt`` of shape ``(batch, tgt_len)``, where
        ``src_len`` is the longest source and ``tgt_len`` the longest target plus 2: each
        target row is ``<bos> ids <eos>`` followed by ``pad_id``; sources get no special
        tokens. Use it as a ``DataLoader``'s ``collate_fn``.
    """
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise TypeError(
            f"examples must be a list of (src_ids, tgt_ids) pairs, got {type(examples).__name__}"
        )
    if len(examples) == 0:
        raise ValueError("examples must hold at least one (src_ids, tgt_ids) pair, got none")
    sources, targets = [], []
    for position, example in enumerate(examples):
        if not isinstance(example, (tuple, list)) or len(example) != 2:
            raise TypeError(
                f"examples[{position}] must be a (src_ids, tgt_ids) pair, got {example!r:.80}"
            )
        sources.append(_check_id_sequence(f"examples[{position}][0]", example[0]))
        targets.append(
            [bos_id, *_check_id_sequence(f"examples[{position}][1]", example[1]), eos_id]
        )
    batch = len(examples)
    src_len = max(len(ids) for ids in sources)
    tgt_len = max(len(ids) for ids in targets)
    src = torch.full((batch, src_len), pad_id, dtype=torch.long)  # (batch, src_len)
    tgt = torch.full((batch, tgt_len), pad_id, dtype=torch.long)  # (batch, tgt_len)
    for row, (src_ids, tgt_ids) in enumerate(zip(sources, targets)):
        src[row, : len(src_ids)] = torch.tensor(src_ids, dtype=torch.long)  # (len(src_ids),)
        tgt[row, : len(tgt_ids)] = torch.tensor(tgt_ids, dtype=torch.long)  # (len(tgt_ids),)
    return src, tgt


def _check_lengths(lengths: object) -> list[tuple[int, int]]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError(
            f"lengths must be a sequence of (src_len, tgt_len) pairs, got {type(lengths).__name__}"
        )
    checked = []
    for position, pair in enumerate(lengths):
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2
        ok = ok and all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in pair)
        if not ok or min(pair) < 0:
            raise ValueError(
                f"lengths[{position}] must be a pair of non-negative ints (src_len, tgt_len), "
                f"got {pair!r}"
            )
        checked.append((int(pair[0]), int(pair[1])))
    return checked


def _batch_cost(max_src: int, max_tgt: int, size: int) -> int:
    """Tokens in a padded batch: ``size`` rows of ``max_src + max_tgt``."""
    return size * (max_src + max_tgt)


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of example indices holding at most ``max_tokens`` tokens, padding included.

    A batch of ``n`` examples whose longest source has ``S`` tokens and longest (collated)
    target ``T`` becomes tensors of ``n·S + n·T`` tokens; the sampler keeps that at or below
    ``max_tokens``. The one exception: an example that alone exceeds ``max_tokens`` is not
    dropped but gets a batch of its own.

    Each epoch, with ``bucketing`` (the default):

    1. the indices are shuffled (``shuffle=True``), then stably sorted by
       ``(src_len, tgt_len)``, so examples of similar length sit next to each other (equal
       lengths in a new random order each epoch);
    2. consecutive examples are packed greedily into batches;
    3. the order of the batches is shuffled (``shuffle=True``).

    ``bucketing=False`` packs the (shuffled) examples as they come: the plain random batching
    that :func:`padding_waste` compares against. ``shuffle=False, bucketing=False`` keeps the
    dataset's order, so that translations line up with the references.

    The randomness of epoch ``e`` comes from ``numpy.random.default_rng([seed, e])``: the same
    seed gives the same batches. The epoch counter starts at 0 and advances after every full
    pass of ``iter()``, so each pass of a ``DataLoader`` gets a new shuffle; :meth:`set_epoch`
    sets it explicitly.

    Args:
        lengths: ``(src_len, tgt_len)`` of each example *as collated* (targets with
            ``<bos>``/``<eos>``); a dataset's ``.lengths``.
        max_tokens: the token budget of a batch (source + target, padding included).
        shuffle: shuffle examples and batches each epoch.
        bucketing: sort by length before packing.
        seed: seed of the shuffles.
    """

    def __init__(
        self,
        lengths: Sequence[tuple[int, int]],
        max_tokens: int,
        *,
        shuffle: bool = True,
        bucketing: bool = True,
        seed: int = 0,
    ) -> None:
        self.lengths = _check_lengths(lengths)
        self.max_tokens = check_positive_int("max_tokens", max_tokens)
        for name, flag in (("shuffle", shuffle), ("bucketing", bucketing)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self.shuffle, self.bucketing = shuffle, bucketing
        self.seed = check_positive_int("seed", seed, minimum=0)
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of epoch ``epoch`` for the next pass."""
        self.epoch = check_positive_int("epoch", epoch, minimum=0)

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """The batches of epoch ``epoch`` (default: the current one) as lists of indices."""
        epoch = self.epoch if epoch is None else check_positive_int("epoch", epoch, minimum=0)
        if self._cache is not None and self._cache[0] == epoch:
            return [list(batch) for batch in self._cache[1]]
        rng = np.random.default_rng([self.seed, epoch])
        order = np.arange(len(self.lengths))
        if self.shuffle:
            order = rng.permutation(order)
        if self.bucketing and len(order):
            src_lens = np.array([self.lengths[i][0] for i in order])
            tgt_lens = np.array([self.lengths[i][1] for i in order])
            order = order[np.lexsort((tgt_lens, src_lens))]  # stable: by src_len, then tgt_len
        batches: list[list[int]] = []
        current: list[int] = []
        max_src = max_tgt = 0
        for index in order.tolist():
            src_len, tgt_len = self.lengths[index]
            new_src, new_tgt = max(max_src, src_len), max(max_tgt, tgt_len)
            if current and _batch_cost(new_src, new_tgt, len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, new_src, new_tgt = [], src_len, tgt_len
            current.append(index)
            max_src, max_tgt = new_src, new_tgt
        if current:
            batches.append(current)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return [list(batch) for batch in batches]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        self.epoch += 1
        yield from batches

    def __len__(self) -> int:
        """Number of batches in the current epoch (it can vary slightly between epochs)."""
        return len(self.batches())


def padding_waste(batches: Iterable[Sequence[int]], lengths: Sequence[tuple[int, int]]) -> float:
    """Fraction of the tokens in padded batches that are padding (source and target together).

    ``batches`` holds lists of example indices (e.g. :meth:`TokenBatchSampler.batches`) and
    ``lengths[i]`` the collated ``(src_len, tgt_len)`` of example ``i``. A batch of ``n``
    examples costs ``n · (max src_len + max tgt_len)`` tokens; the waste is
    ``1 - real tokens / padded tokens``, 0 when no padding is needed.
    """
    lengths = _check_lengths(lengths)
    real = padded = 0
    for position, batch in enumerate(batches):
        indices = _check_id_sequence(f"batches[{position}]", batch)
        if not indices:
            continue
        bad = [i for i in indices if not 0 <= i < len(lengths)]
        if bad:
            raise ValueError(
                f"batches[{position}] holds index {bad[0]}, outside [0, {len(lengths)})"
            )
        src_lens = [lengths[i][0] for i in indices]
        tgt_lens = [lengths[i][1] for i in indices]
        real += sum(src_lens) + sum(tgt_lens)
        padded += _batch_cost(max(src_lens), max(tgt_lens), len(indices))
    return 1.0 - real / padded if padded else 0.0


# ---------------------------------------------------------------------------------------------
# Everything for chapter 8 in one call
# ---------------------------------------------------------------------------------------------


@dataclass
class Multi30kData:
    """Multi30k ready for training: tokenizer, vocabularies (from train only) and datasets.

    Attributes:
        tokenizer: the :class:`Tokenizer` of both languages.
        src_vocab: German vocabulary, built from the training split.
        tgt_vocab: English vocabulary, built from the training split.
        datasets: ``{"train": …, "val": …, "test_2016_flickr": …}``
            :class:`TranslationDataset` objects (German → English).
    """

    tokenizer: Tokenizer
    src_vocab: Vocab
    tgt_vocab: Vocab
    datasets: dict[str, TranslationDataset]

    def loader(
        self,
        split: str,
        max_tokens: int = 4096,
        *,
        shuffle: bool | None = None,
        bucketing: bool | None = None,
        seed: int = 0,
        num_workers: int = 0,
    ) -> DataLoader:
        """A ``DataLoader`` of ``(src (batch, src_len), tgt (batch, tgt_len))`` batches.

        Batches come from a :class:`TokenBatchSampler` with ``max_tokens``. For ``"train"``
        the defaults are ``shuffle=True, bucketing=True``; for the other splits
        ``shuffle=False, bucketing=False``, which keeps the dataset order so translations
        line up with ``datasets[split].pairs``.
        """
        split = _check_split(split)
        is_train = split == "train"
        sampler = TokenBatchSampler(
            self.datasets[split].lengths,
            max_tokens,
            shuffle=is_train if shuffle is None else shuffle,
            bucketing=is_train if bucketing is None else bucketing,
            seed=seed,
        )
        return DataLoader(
            self.datasets[split],
            batch_sampler=sampler,
            collate_fn=collate_batch,
            num_workers=num_workers,
        )

    def encode_source(self, sentence: str) -> list[int]:
        """Ids of a German sentence (no special tokens), e.g. to translate a new sentence."""
        return self.src_vocab.encode(self.tokenizer.tokenize(sentence))

    def decode_target(self, ids: Sequence[int] | Tensor) -> str:
        """English sentence of target ids ``(tgt_len,)``: stops at ``<eos>``, detokenized."""
        return self.tokenizer.detokenize(self.tgt_vocab.decode(ids))


def prepare_multi30k(
    root: str | os.PathLike[str] | None = None,
    *,
    min_freq: int = 2,
    lowercase: bool = False,
    tokenizer: Tokenizer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    base_url: str | None = None,
    progress: bool = True,
) -> Multi30kData:
    """Load the three Multi30k splits, build the vocabularies from train, encode everything.

    Args:
        root: folder with a local copy of the raw files (see :func:`multi30k_files`).
        min_freq: keep the tokens seen at least this often in the training split.
        lowercase: lowercase all text (only with the default tokenizer).
        tokenizer: any :class:`Tokenizer`; default ``WordTokenizer(lowercase=lowercase)``.
        cache_dir, download, base_url, progress: as in :func:`multi30k_files`.

    Example::

        data = prepare_multi30k()
        for src, tgt in data.loader("train", max_tokens=4096):
            ...  # src (batch, src_len), tgt (batch, tgt_len)
    """
    if tokenizer is None:
        tokenizer = WordTokenizer(lowercase=lowercase)
    elif not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            "tokenizer must have tokenize() and detokenize() methods (the Tokenizer protocol), "
            f"got {type(tokenizer).__name__}"
        )
    check_positive_int("min_freq", min_freq)
    pairs = {
        split: load_multi30k(
            split,
            root,
            cache_dir=cache_dir,
            download=download,
            base_url=base_url,
            progress=progress,
        )
        for split in MULTI30K_SPLITS
    }
    train = pairs["train"]
    src_vocab = Vocab.build((tokenizer.tokenize(de) for de, _ in train), min_freq=min_freq)
    tgt_vocab = Vocab.build((tokenizer.tokenize(en) for _, en in train), min_freq=min_freq)
    datasets = {
        split: TranslationDataset(split_pairs, tokenizer, src_vocab, tgt_vocab)
        for split, split_pairs in pairs.items()
    }
    return Multi30kData(tokenizer, src_vocab, tgt_vocab, datasets)
