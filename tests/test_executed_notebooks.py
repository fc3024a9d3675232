"""The executed chapters show exactly what ran: no repeated output block, no stderr lines from
the profiler or the kernel, no traceback outside a ``raises-exception`` cell.

The book build (README command 1) leaves every executed chapter in ``_build/jupyter_execute``;
these tests read them. Without a build they are skipped, unless ``COURSE_REQUIRE_EXECUTED=1``
(``.ci/run`` sets it, since its build always runs first), where a missing or stale executed
chapter is a failure. The checks themselves live in ``tests/executed_outputs.py``, shared with
``benchmarks/execute_chapters.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from executed_outputs import (
    foreign_stderr,
    output_problems,
    repeated_stream_blocks,
    unexpected_tracebacks,
)
from helpers import load_book_module

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "_build" / "jupyter_execute" / "book"
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
REQUIRED = os.environ.get("COURSE_REQUIRE_EXECUTED") == "1"


def _executed(chapter: Path) -> dict:
    executed = EXECUTED / chapter.name
    why = None
    if not executed.exists():
        why = (
            f"{executed.relative_to(ROOT)} does not exist: build the book first (README command 1)"
        )
    elif executed.stat().st_mtime < chapter.stat().st_mtime:
        why = f"{executed.relative_to(ROOT)} is older than {chapter.relative_to(ROOT)}: rebuild"
    if why:
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)
    return json.loads(executed.read_text())


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_executed_chapter_shows_exactly_what_ran(chapter):
    problems = output_problems(_executed(chapter))
    assert not problems, f"{chapter.name}, executed by the build:\n" + "\n".join(problems)


# --- the checks reject what they should, and accept a chapter's normal output -------------


def _stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def _glue() -> dict:
    return {"output_type": "display_data", "data": {"text/plain": "1.0"}, "metadata": {}}


def _notebook(*cells: dict) -> dict:
    return {"cells": list(cells)}


def _cell(*outputs: dict, tags: tuple[str, ...] = ()) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "outputs": list(outputs)}


TABLE = "width  512: attention   1,050,624\nwidth 1024: attention   4,198,400\n"


def test_a_repeated_tail_is_found():
    # what ipykernel 7 produced: the table, the glue, then the table's tail once more
    nb = _notebook(_cell(_stream(TABLE), _glue(), _stream("width 1024: attention   4,198,400\n")))
    assert repeated_stream_blocks(nb) == [
        "cell 0: a second stdout block repeats 'width 1024: attention   4,198,400'"
    ]


def test_print_display_print_of_new_text_is_fine():
    nb = _notebook(
        _cell(_stream(TABLE), _glue(), _stream("concatenating costs 4.00x the attention\n")),
        _cell(_stream("---\n"), _glue(), _stream("---\n")),  # a short separator printed twice
        _cell(_stream(TABLE), _stream(TABLE, "stderr")),  # the same text on the other stream
    )
    assert repeated_stream_blocks(nb) == []


def test_profiler_and_runtime_lines_on_stderr_are_found():
    usdt = "USDT:2026-11-26 23:35:22 4292:4292 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    nb = _notebook(
        _cell(_stream("peak 4,000,000 bytes\n"), _stream(usdt, "stderr")),
        _cell(_stream("[W1126 10:00:00.000 Module.cpp:12] Warning: something\n", "stderr")),
        _cell(_stream("IOStream.flush timed out\n", "stderr")),
    )
    found = foreign_stderr(nb)
    assert [p.split(":")[0] for p in found] == ["cell 0", "cell 1", "cell 2"], found


def test_a_chapters_own_stderr_is_fine():
    # e.g. a progress bar the chapter asks for, or a message it prints to stderr on purpose
    nb = _notebook(_cell(_stream("training: 100%|##########| 50/50 [00:02<00:00]\n", "stderr")))
    assert foreign_stderr(nb) == []


def test_tracebacks_are_found_outside_raises_exception_cells_only():
    error = {
        "output_type": "error",
        "ename": "ValueError",
        "evalue": "q has 3 dims",
        "traceback": [],
    }
    printed = _stream("Traceback (most recent call last):\n  File ...\n", "stderr")
    nb = _notebook(
        _cell(error, tags=("raises-exception",)),  # the chapter shows the error on purpose
        _cell(error),
        _cell(printed),
    )
    assert unexpected_tracebacks(nb) == [
        "cell 1: ValueError: q has 3 dims",
        "cell 2: a traceback printed to stderr",
    ]


# --- per-cell timeouts: the build's and nbval's are the same, and bounded -----------------


def _book_conftest():
    return load_book_module("book/conftest.py")


def test_nbval_cells_get_the_timeout_the_build_gives_their_chapter():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    default = config["execute"]["timeout"]
    assert default <= 300, f"the build's per-cell timeout should stay a few minutes, is {default} s"
    conftest = _book_conftest()
    for chapter in CHAPTERS:
        own = json.loads(chapter.read_text())["metadata"].get("mystnb", {}).get("execution_timeout")
        expected = own if own is not None else default
        assert conftest.chapter_timeout(chapter) == expected, chapter.name
        assert 60 <= expected <= 900, f"{chapter.name}: a per-cell timeout of {expected} s"
