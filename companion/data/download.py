"""Checked downloads: SHA-256 checksums and one file fetched atomically over HTTP (chapter 8).

In reading order:

1. :class:`ChecksumError` and :class:`DownloadError`, the two ways getting a file can fail.
2. :func:`sha256_of_file` and :func:`verify_checksum`: a file is read only once its SHA-256
   is the expected one, so a corrupt or truncated file is never parsed.
3. :func:`download_file` fetches one URL with a progress bar and writes it through
   :func:`companion._files.atomic_write`: the file appears under its name only when every
   byte has arrived and the checksum matches; a failure, even Ctrl-C, leaves nothing behind.

:mod:`companion.data.multi30k` uses these for the six Multi30k files of chapter 8.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

from companion._files import atomic_write
from companion._validation import check_positive_float

__all__ = [
    "ChecksumError",
    "DownloadError",
    "sha256_of_file",
    "verify_checksum",
    "download_file",
]

_CHUNK_BYTES = 64 * 1024

# ---------------------------------------------------------------------------------------------
# 1. Errors
# ---------------------------------------------------------------------------------------------


class ChecksumError(ValueError):
    """A file's SHA-256 differs from the expected one: it is corrupt, truncated or different."""


class DownloadError(OSError):
    """A download failed (no network, server error, connection closed early, timeout)."""


# ---------------------------------------------------------------------------------------------
# 2. Checksums
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# 3. Downloading one file
# ---------------------------------------------------------------------------------------------


def _fetch(
    url: str, file: BinaryIO, *, timeout: float, progress: bool, desc: str, see: str
) -> tuple[int, str]:
    """Copy the body of ``url`` into ``file``; return ``(bytes received, hex SHA-256)``.

    Raises :class:`DownloadError` (its message ending with ``see``) when the request fails or
    fewer bytes arrive than the server's ``Content-Length`` announced.
    """
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    received = 0
    expected_size: int | None = None

    def cut_short() -> DownloadError:
        return DownloadError(
            f"the download of {url} stopped after {received} of {expected_size or '?'} bytes "
            f"(the connection was closed early); nothing was saved. Try again.{see}"
        )

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            expected_size = int(length) if length and length.isdigit() else None
            with tqdm(
                total=expected_size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=desc,
                disable=not progress,
                leave=False,
            ) as bar:
                while chunk := response.read(_CHUNK_BYTES):
                    file.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
    except http.client.IncompleteRead as error:  # raised by some Python versions
        raise cut_short() from error
    except urllib.error.HTTPError as error:
        raise DownloadError(
            f"could not download {url}: the server answered {error.code} {error.reason}.{see}"
        ) from error
    except (
        urllib.error.URLError,  # no network, DNS failure, connection refused
        http.client.HTTPException,  # a malformed answer
        ConnectionError,  # connection reset while reading
        TimeoutError,  # no byte for `timeout` seconds
    ) as error:
        reason = getattr(error, "reason", None) or error
        raise DownloadError(
            f"could not download {url} ({type(error).__name__}: {reason}).{see}"
        ) from error
    if expected_size is not None and received != expected_size:
        raise cut_short()
    return received, digest.hexdigest()


def download_file(
    url: str,
    destination: str | os.PathLike[str],
    expected_sha256: str,
    *,
    timeout: float = 30.0,
    progress: bool = True,
    what_to_do: str = "",
) -> Path:
    """Download ``url`` to ``destination`` atomically and verify its SHA-256; return the path.

    The bytes go to a temporary ``.part`` file in the destination's folder
    (:func:`companion._files.atomic_write`); only when the whole file has arrived
    (``Content-Length`` bytes, when the server sends one) and its checksum matches is it
    renamed to ``destination``. On any failure, even Ctrl-C, the temporary file is deleted,
    so the folder never holds a partial file.

    Args:
        url: what to download (``http(s)://``, or ``file://`` for a local file).
        destination: where the file goes; its folder is created if needed.
        expected_sha256: the hex SHA-256 the file must have.
        timeout: seconds to wait for the server (to connect, and for each read); > 0.
        progress: show a progress bar (tqdm), removed when the download is done.
        what_to_do: instructions appended, on a new line, to every error message.

    Raises:
        DownloadError: no network, a server error, a timeout, or the connection closed early.
        ChecksumError: the downloaded bytes have another SHA-256; nothing is written to
            ``destination``.
    """
    timeout = check_positive_float("timeout", timeout)
    destination = Path(destination)
    see = f"\n{what_to_do}" if what_to_do else ""

    def write(file: BinaryIO) -> None:
        received, actual = _fetch(
            url, file, timeout=timeout, progress=progress, desc=destination.name, see=see
        )
        if actual != expected_sha256:
            raise ChecksumError(
                f"checksum mismatch for the download of {url}: expected SHA-256 "
                f"{expected_sha256}, got {actual} ({received} bytes). The download is corrupt "
                f"and was discarded; nothing was written to {destination}. Try again"
                + (f", or see below.{see}" if see else ".")
            )

    return atomic_write(destination, write, suffix=".part")
