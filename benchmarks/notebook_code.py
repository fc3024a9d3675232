"""Run a chapter's own definitions in a benchmark script, so the script cannot drift from the book.

A benchmark that records what a chapter would show with more seeds or steps imports nothing the
chapter defines: the definitions live in a notebook cell. :func:`chapter_code` executes that
cell's source up to a marker line (the definitions come first, the chapter's own runs after it)
and returns the resulting namespace.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import torch


def chapter_code(notebook: Path, cell_id: str, marker: str, prelude: str) -> dict:
    """Execute ``prelude`` (the imports the chapter's setup cell made), then the source of the
    cell ``cell_id`` of ``notebook`` up to the first line containing ``marker``; return the
    namespace. Raises ``ValueError`` when the cell is missing or no longer contains ``marker``
    (the script needs updating)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [c for c in cells if c.get("id") == cell_id]
    if len(found) != 1:
        raise ValueError(
            f"{notebook.name}: expected one cell with id {cell_id!r}, found {len(found)}"
        )
    source = "".join(found[0]["source"])
    if marker not in source:
        raise ValueError(f"cell {cell_id} no longer contains {marker!r}: update this script")
    namespace: dict = {}
    exec(prelude, namespace)  # noqa: S102 - the course's own notebook code
    exec(compile(source.split(marker)[0], f"{notebook.name}:{cell_id}", "exec"), namespace)  # noqa: S102
    return namespace


def write_record(out: Path, record: dict, cpu_start: float, threads: int = 1) -> None:
    """Write ``record`` to ``out`` as indented JSON, with what a reader needs to judge it: the
    torch version, the machine, the thread count, the CPU-seconds since ``cpu_start`` (a
    ``time.process_time()`` reading) and the date."""
    record = record | {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": threads,
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


def head_commit() -> str:
    """The commit the benchmarks' checkout is at (``git rev-parse HEAD``), recorded with a run."""
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
