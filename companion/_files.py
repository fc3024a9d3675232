"""Atomic file writing, shared by checkpoints, run logs and downloads.

A file that is being written is never visible under its final name: the bytes go to a
temporary file in the same folder, which is renamed over the destination with
:func:`os.replace` (atomic on one file system) only once it is complete. A crash, an
exception or Ctrl-C leaves the old file (or no file) behind, never a half-written one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write"]


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[BinaryIO], None], *, suffix: str = ".tmp"
) -> Path:
    """Call ``write(file)`` on a temporary binary file next to ``path``, then rename it to ``path``.

    ``write`` may raise (e.g. a checksum that does not match): the temporary file is then
    removed and ``path`` is left as it was. The new file gets the usual permissions
    (``0o666`` minus the umask), not the private ``0o600`` of a temporary file.

    Args:
        path: the destination; its folder is created if needed.
        write: called once with the open temporary file.
        suffix: suffix of the temporary file's name (e.g. ``".part"`` for downloads).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path
