"""What an executed chapter may not contain: the checks behind tests/test_executed_notebooks.py.

Shared with ``benchmarks/execute_chapters.py``, which executes the chapters repeatedly. Each
check takes an executed notebook (``nbformat`` JSON as a dict) and returns readable problems,
one string per offending cell, naming the chapter's cell index; an empty list means clean.

* :func:`repeated_stream_blocks` - a cell whose stream output arrives in two blocks of the same
  stream where the second repeats text already shown (the duplicated-output defect of
  ipykernel 7: a ``print`` then ``glue`` cell showing its table twice).
* :func:`foreign_stderr` - stderr lines that are not the chapter's own: the torch profiler's
  ``USDT``/kineto lines, C++ warnings (``[W…]``), kernel and ZMQ messages, Python warnings.
* :func:`unexpected_tracebacks` - an error output, or a traceback printed to a stream, in a
  cell that is not tagged ``raises-exception``.
"""

from __future__ import annotations

import re
from typing import Any

#: stderr lines that come from the machinery (profiler, C++ runtime, kernel), never from a
#: chapter: each is a problem wherever it appears.
FOREIGN_STDERR = re.compile(
    r"USDT:|SyncActivityProfilerHandler|ActivityProfilerController|profiler_start|"
    r"STAGE:\d{4}|kineto|^\[[WEI]\d{4} |IOStream\.flush timed out|"
    r"Exception in thread|zmq\.|Warning: |(User|Deprecation|Future|Runtime)Warning",
    re.MULTILINE,
)

TRACEBACK = re.compile(r"Traceback \(most recent call last\)")

#: A repeated block counts when the repeated text has at least this many non-blank characters
#: (so a second "\n" or a short separator printed twice is not flagged).
MIN_REPEATED_CHARS = 8


def _text(output: dict[str, Any]) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def _code_cells(nb: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, c) for i, c in enumerate(nb["cells"]) if c.get("cell_type") == "code"]


def _tags(cell: dict[str, Any]) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def repeated_stream_blocks(nb: dict[str, Any]) -> list[str]:
    """Cells where a later block of a stream repeats text an earlier block of it showed.

    A cell may legitimately print, display something, then print again: those are two
    ``stdout`` blocks with different text. The defect is a second block whose text (all of it,
    at least :data:`MIN_REPEATED_CHARS` visible characters) already appeared in an earlier block
    of the same stream in the same cell.
    """
    problems = []
    for index, cell in _code_cells(nb):
        seen: dict[str, str] = {}
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream":
                continue
            name, text = output.get("name", "stdout"), _text(output)
            visible = "".join(text.split())
            if name in seen and len(visible) >= MIN_REPEATED_CHARS and text.strip() in seen[name]:
                first_line = text.strip().splitlines()[0][:60]
                problems.append(f"cell {index}: a second {name} block repeats {first_line!r}")
            seen[name] = seen.get(name, "") + text
    return problems


def foreign_stderr(nb: dict[str, Any]) -> list[str]:
    """Cells whose stderr carries lines from the profiler, the C++ runtime or the kernel."""
    problems = []
    for index, cell in _code_cells(nb):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                lines = [line for line in _text(output).splitlines() if FOREIGN_STDERR.search(line)]
                if lines:
                    problems.append(
                        f"cell {index}: {len(lines)} stderr line(s) not from the chapter, "
                        f"first {lines[0][:80]!r}"
                    )
    return problems


def unexpected_tracebacks(nb: dict[str, Any]) -> list[str]:
    """Cells not tagged ``raises-exception`` that show an error or print a traceback."""
    problems = []
    for index, cell in _code_cells(nb):
        if "raises-exception" in _tags(cell):
            continue
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "error":
                problems.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
            elif kind == "stream" and TRACEBACK.search(_text(output)):
                problems.append(f"cell {index}: a traceback printed to {output.get('name')}")
    return problems


def output_problems(nb: dict[str, Any]) -> list[str]:
    """All three checks at once."""
    return repeated_stream_blocks(nb) + foreign_stderr(nb) + unexpected_tracebacks(nb)
