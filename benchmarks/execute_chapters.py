"""Execute every chapter N times in a row, as the book build and nbval do, and report stalls,
duplicated output blocks, foreign stderr and per-chapter times.

    .venv/bin/python benchmarks/execute_chapters.py --runs 5            # all chapters
    .venv/bin/python benchmarks/execute_chapters.py --runs 3 --chapters 04 09
    .venv/bin/python benchmarks/execute_chapters.py --runs 10 --chapters 04 --unpatched

Each chapter runs in a fresh kernel through ``nbclient`` (the library myst-nb and nbval use),
from ``book/`` as working directory, with the per-cell timeout the build gives it (its own
``mystnb.execution_timeout``, else ``--cell-timeout``, 300 s like ``_config.yml``); its stream
blocks are then merged as myst-nb's renderer merges them for the page. The build's two fixes
(``book/_ext/kernel_reply_poll.py``, ``book/_ext/merged_streams.py``) are applied unless
``--unpatched``. A chapter **stalled** when a cell timed out or when no cell ran for more than
30 s (before the first cell, between two cells or after the last: where a lost kernel reply
shows); a chapter more than twice its median time over the runs is flagged too. The checks
on the outputs are those of ``tests/test_executed_notebooks.py`` (``tests/executed_outputs.py``).

Writes a JSON record (``--out``, default ``_build/execute_chapters.json``), optionally every
executed notebook (``--save-dir``), and prints a table. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import kernel_reply_poll  # noqa: E402
import merged_streams  # noqa: E402
from executed_outputs import (  # noqa: E402
    foreign_stderr,
    repeated_stream_blocks,
    unexpected_tracebacks,
)


def chapter_timeout(path: Path, default: int) -> int:
    """The per-cell timeout the build gives this chapter: its own ``mystnb.execution_timeout``
    metadata when it sets one (chapter 8, for its training cell), else ``default``."""
    nb = nbformat.read(path, as_version=4)
    return int(nb.metadata.get("mystnb", {}).get("execution_timeout", default))


def execute(path: Path, timeout: int, save_as: Path | None = None) -> dict:
    """Execute one chapter in a fresh kernel; return its record (and save the executed
    notebook as ``save_as`` when given)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=True,
    )
    start, started_at = time.perf_counter(), datetime.now(timezone.utc)
    record: dict = {"chapter": path.stem, "timeout": timeout}
    try:
        client.execute()
        record["status"] = "ok"
    except CellTimeoutError as error:
        record["status"] = "stall"
        record["error"] = str(error).splitlines()[0][:200]
    except DeadKernelError as error:
        record["status"] = "dead kernel"
        record["error"] = str(error)[:200]
    except CellExecutionError as error:
        record["status"] = "error"
        record["error"] = str(error).strip().splitlines()[-1][:200]
    record["seconds"] = round(time.perf_counter() - start, 1)
    # what myst-nb's renderer then does for the page (nb_merge_streams: true): merge each cell's
    # stream blocks (with the build's fix, copies of them; unpatched, the notebook's own)
    from myst_nb.core import render

    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("outputs"):
            render.coalesce_streams(cell.outputs)
    if save_as is not None:
        nbformat.write(nb, save_as)
    nb_dict = json.loads(nbformat.writes(nb))
    record["duplicated"] = repeated_stream_blocks(nb_dict)
    record["foreign_stderr"] = foreign_stderr(nb_dict)
    record["tracebacks"] = unexpected_tracebacks(nb_dict)
    record["slowest_cells"] = slowest_cells(nb_dict)
    record["idle"] = idle_gaps(nb_dict, started_at, datetime.now(timezone.utc))
    return record


def _cell_times(nb: dict) -> list[tuple[int, datetime, datetime]]:
    """``(cell index, sent, idle)`` of every executed cell: when the kernel said it was busy
    with the cell, and when it said it was idle again (nbclient's timing metadata)."""
    times = []
    for index, cell in enumerate(nb["cells"]):
        timing = cell.get("metadata", {}).get("execution", {})
        busy, idle = timing.get("iopub.status.busy"), timing.get("iopub.status.idle")
        if busy and idle:
            times.append((index, datetime.fromisoformat(busy), datetime.fromisoformat(idle)))
    return times


def idle_gaps(nb: dict, started: datetime, ended: datetime) -> dict[str, float]:
    """Seconds when no cell ran: before the first cell (kernel start), the longest gap between
    two cells (and the cell after it), and after the last cell (kernel shutdown). A stall of
    the kernel stack shows here, not in any cell's own time."""
    times = _cell_times(nb)
    if not times:
        return {}
    gaps = [((b[1] - a[2]).total_seconds(), b[0]) for a, b in zip(times, times[1:])]
    longest, before_cell = max(gaps, default=(0.0, None))
    return {
        "before_first": round((times[0][1] - started).total_seconds(), 1),
        "longest_between": round(longest, 1),
        "before_cell": before_cell,
        "after_last": round((ended - times[-1][2]).total_seconds(), 1),
    }


def slowest_cells(nb: dict, top: int = 3) -> list[tuple[int, float]]:
    """``(cell index, seconds)`` of the slowest cells, from nbclient's timing metadata."""
    times = []
    for index, cell in enumerate(nb["cells"]):
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("iopub.status.idle")
        if start and end:
            seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
            times.append((index, round(seconds, 1)))
    return sorted(times, key=lambda t: -t[1])[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="executions of every chapter")
    parser.add_argument("--chapters", nargs="*", help="chapter number prefixes (default: all)")
    parser.add_argument("--cell-timeout", type=int, default=300, help="seconds per cell")
    parser.add_argument(
        "--save-dir", type=Path, help="keep every executed notebook here (RUN_CHAPTER.ipynb)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "execute_chapters.json")
    parser.add_argument(
        "--unpatched",
        action="store_true",
        help="leave nbclient's reply wait and myst-nb's stream merge as released (to reproduce "
        "nbclient#312's stall and the repeated output blocks)",
    )
    args = parser.parse_args()
    # as the book build does (_config.yml); False where this jupyter_client has no such channel
    sliced = False if args.unpatched else kernel_reply_poll.patch()
    merged_copies = False if args.unpatched else merged_streams.patch()

    chapters = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    if args.chapters:
        chapters = [p for p in chapters if p.name[:2] in {c.zfill(2) for c in args.chapters}]
    if not chapters:
        parser.error("no chapter matches --chapters")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = {
        name: version(name)
        for name in ("ipykernel", "jupyter_client", "nbclient", "pyzmq", "tornado")
    } | {
        "python": platform.python_version(),
        "reply poll": "sliced" if sliced else "as released",
        "stream merge": "copies" if merged_copies else "as released",
    }
    print("versions:", env, flush=True)
    records: list[dict] = []
    for run in range(1, args.runs + 1):
        for path in chapters:
            save_as = None
            if args.save_dir:
                args.save_dir.mkdir(parents=True, exist_ok=True)
                save_as = args.save_dir / f"{run}_{path.name}"
            record = execute(path, chapter_timeout(path, args.cell_timeout), save_as)
            record["run"] = run
            records.append(record)
            flags = [
                f"{len(record[k])} {k}"
                for k in ("duplicated", "foreign_stderr", "tracebacks")
                if record[k]
            ]
            idle = record["idle"]
            waits = (
                f" (idle: {idle['before_first']:.0f} s before, {idle['longest_between']:.0f} s "
                f"between, {idle['after_last']:.0f} s after the cells)"
                if idle
                else ""
            )
            print(
                f"run {run} {path.stem:28s} {record['status']:6s} {record['seconds']:7.1f} s{waits}  "
                + ("; ".join(flags) or "clean")
                + (f"  [{record.get('error')}]" if record.get("error") else ""),
                flush=True,
            )
            args.out.write_text(json.dumps({"versions": env, "records": records}, indent=1))
    return report(records, chapters)


#: Seconds without a running cell that count as a stall: the kernel starts and stops in
#: 2-3 s and passes from one cell to the next in well under one.
STALL_SECONDS = 30


def stalled(record: dict) -> bool:
    """A chapter stalled: a cell timed out, or the kernel stack sat idle between, before or
    after the cells for longer than :data:`STALL_SECONDS`."""
    idle = record.get("idle") or {}
    waits = (idle.get(k, 0) for k in ("before_first", "longest_between", "after_last"))
    return record["status"] != "ok" or max(waits, default=0) > STALL_SECONDS


def report(records: list[dict], chapters: list[Path]) -> int:
    """Print the per-chapter table; return 1 if anything was found."""
    bad = 0
    print(f"\n{'chapter':28s} {'runs':>4s} {'median s':>9s} {'max/median':>10s} {'times (s)':s}")
    for path in chapters:
        mine = [r for r in records if r["chapter"] == path.stem]
        seconds = [r["seconds"] for r in mine]
        median = statistics.median(seconds)
        ratio = max(seconds) / median
        stalls = sum(stalled(r) for r in mine)
        found = sum(len(r[k]) for r in mine for k in ("duplicated", "foreign_stderr", "tracebacks"))
        bad += stalls + found + (ratio > 2)
        print(
            f"{path.stem:28s} {len(mine):4d} {median:9.1f} {ratio:10.2f} "
            f"{', '.join(f'{s:.0f}' for s in seconds)}"
            + (f"  stalled or failed: {stalls}" if stalls else "")
            + (f"  output problems: {found}" if found else "")
        )
    print(
        "\nclean: no stall, no chapter over 2x its median, no duplicated block, no foreign stderr"
        if not bad
        else f"\n{bad} problem(s), see above"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
