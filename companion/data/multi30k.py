"""Multi30k, task 1, German→English: where the files are, checksums, download, loading (chapter 8).

Multi30k has 29,000 / 1,014 / 1,000 sentence pairs (train / val / test_2016_flickr), six
``.gz`` files (:data:`MULTI30K_SHA256`). In reading order:

1. **The files**: :data:`MULTI30K_URL`, :data:`MULTI30K_SPLITS`, :data:`MULTI30K_NUM_PAIRS`,
   :data:`MULTI30K_SHA256`, the environment variables :data:`ROOT_ENV_VAR` and
   :data:`BASE_URL_ENV_VAR`, the cache folder (:func:`default_cache_dir`) and
   :func:`check_split`.
2. **Getting them**: :func:`multi30k_files` finds a local copy (``root=`` or
   ``$MULTI30K_ROOT``) or downloads the files once into the cache folder
   (:func:`companion.data.download.download_file`, atomic). Every file is checked against its
   SHA-256 before it is read, so a corrupt, truncated or half-downloaded file is never
   parsed.
3. **Reading them**: :func:`read_parallel` reads two line-aligned files into sentence pairs,
   and :func:`load_multi30k` returns the raw ``(de, en)`` pairs of one split.

:func:`companion.data.prepare_multi30k` (in :mod:`companion.data.prepare`) turns the three
splits into vocabularies and datasets ready for training.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

from companion._validation import check_bool, check_positive_float
from companion.data.download import download_file, verify_checksum

__all__ = [
    "MULTI30K_URL",
    "MULTI30K_SPLITS",
    "MULTI30K_NUM_PAIRS",
    "MULTI30K_SHA256",
    "ROOT_ENV_VAR",
    "BASE_URL_ENV_VAR",
    "default_cache_dir",
    "check_split",
    "multi30k_files",
    "read_parallel",
    "load_multi30k",
]

# ---------------------------------------------------------------------------------------------
# 1. The files
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


def check_split(split: object) -> str:
    """Return the canonical name of a Multi30k split; ``"test"`` means ``"test_2016_flickr"``.

    Raises:
        TypeError: ``split`` is not a str.
        ValueError: ``split`` is not one of :data:`MULTI30K_SPLITS` (or ``"test"``).
    """
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


def default_cache_dir() -> Path:
    """The folder downloads go to: ``$XDG_CACHE_HOME/transformer-step-by-step/multi30k``.

    ``XDG_CACHE_HOME`` defaults to ``~/.cache`` (when unset, empty or not an absolute path).
    """
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "transformer-step-by-step" / "multi30k"


def _as_path(name: str, value: object) -> Path:
    """``value`` (a str or a path, ``~`` expanded) as a :class:`~pathlib.Path`."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or a path, got {type(value).__name__}")
    return Path(value).expanduser()


# ---------------------------------------------------------------------------------------------
# 2. Getting them: a local copy, the cache, or a download
# ---------------------------------------------------------------------------------------------


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
    split = check_split(split)
    check_bool("download", download)
    timeout = check_positive_float("timeout", timeout)
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
        paths[lang] = download_file(
            url,
            path,
            MULTI30K_SHA256[name],
            timeout=timeout,
            progress=progress,
            what_to_do=what_to_do,
        )
    return paths


# ---------------------------------------------------------------------------------------------
# 3. Reading them
# ---------------------------------------------------------------------------------------------


def read_parallel(
    src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str]
) -> list[tuple[str, str]]:
    """Read two line-aligned text files (plain or ``.gz``, UTF-8) into sentence pairs.

    Line ``i`` of ``src_path`` pairs with line ``i`` of ``tgt_path``. Lines keep their text
    exactly; only the line break is removed (``\\n``; a ``\\r`` before it too).

    Raises:
        ValueError: the two files have different numbers of lines, or a file is truncated,
            damaged or not UTF-8 text (the message names it).
    """
    sides = []
    for path in (Path(src_path), Path(tgt_path)):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rb") as file:
                text = file.read().decode("utf-8")
        except (EOFError, gzip.BadGzipFile, UnicodeDecodeError, zlib.error) as error:
            kind = "gzip-compressed " if path.suffix == ".gz" else ""
            raise ValueError(
                f"{path} is not a readable {kind}UTF-8 text file ({type(error).__name__}: "
                f"{error}); it is truncated or damaged: delete it and download or copy it again"
            ) from None
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
    expected = MULTI30K_NUM_PAIRS[check_split(split)]
    if len(pairs) != expected:  # cannot happen with verified files; a guard all the same
        raise ValueError(f"Multi30k {split} should have {expected} pairs, read {len(pairs)}")
    return pairs
