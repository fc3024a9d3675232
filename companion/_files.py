"""Atomic file writing, shared by checkpoints, run logs and downloads.

A file that is being written is never visible under its final name: the bytes go to a
temporary file in the same folder, which is renamed over the destination with
:func:`os.replace` (atomic on one file system) only once it is complete. A crash, an
exception or Ctrl-C leaves the old file (or no file) behind, never a half-written one.

:func:`check_output_folder` tells, before a long job starts, whether its output folder can be
written and has room, so a read-only or full folder fails at once with a clear message
(:class:`OutputFolderError`), not when the first checkpoint is saved.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["OutputFolderError", "atomic_write", "check_output_folder"]


class OutputFolderError(OSError):
    """An output folder that cannot be created or written, or lacks the room needed."""


def check_output_folder(
    folder: str | os.PathLike[str], *, needed_bytes: int = 0, name: str = "out_dir"
) -> Path:
    """Create ``folder`` if needed and check that a file can be written in it and that it has
    ``needed_bytes`` free; raise :class:`OutputFolderError` (naming ``name`` and the folder)
    otherwise.

    The check writes and removes a small temporary file (permissions, read-only file
    systems, quotas and a full disk all show up there).
    """
    path = Path(folder)
    advice = f"choose another {name} or make this one writable"
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-test.", dir=path)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(b"\0" * 4096)
                file.flush()
                os.fsync(file.fileno())
        finally:
            with contextlib.suppress(OSError):
                os.unlink(probe)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise OutputFolderError(
            error.errno, f"{name} {path} cannot be written ({reason}); {advice}"
        ) from None
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise OutputFolderError(
            f"{name} {path} has {free / 2**20:.1f} MiB free, but the run needs about "
            f"{needed_bytes / 2**20:.1f} MiB (checkpoints are written next to the previous "
            f"one before replacing it); free some space or choose another {name}"
        )
    return path


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
