"""Wait for a kernel's replies in one-second slices, so a widget cell cannot stall the build.

**The stall.** nbclient (which myst-nb uses to execute the chapters) waits for a cell's
``execute_reply`` with one ``get_msg(timeout=T)`` on the shell channel, ``T`` being the cell
timeout. While it waits, its mimic of the ipywidgets ``Output`` widget (every
``widgets.interact`` has one) *sends* state updates to the kernel on that same ZeroMQ socket.
ZeroMQ tells asyncio about new messages through an edge-triggered descriptor, and the send
can consume the edge that announced the reply: the reply then sits in the socket unseen until
the poll times out, ``T`` seconds later, when it is read and execution goes on as if nothing
happened. This is jupyter/nbclient#312 (open, no release fixes it). Measured here with
``benchmarks/execute_chapters.py``: chapter 4 (a two-slider ``interact``) sat idle for the
whole cell timeout between two cells in 3 of 10 executions on a busy machine (39 s of a 40-s
timeout; 299 s of 300 in single runs, under ipykernel 6.17 and 7.4 alike; the 2026-11-26 book
build spent 609 s on it with its 600-s timeout), and in 0 of 10 with this fix.

**The fix.** :func:`patch` makes ``get_msg`` of jupyter_client's asyncio channels poll in
slices of at most :data:`SLICE` seconds until the caller's timeout: a new poll looks at the
socket afresh, so a missed edge costs at most one slice. Messages, timeouts and ``Empty`` are
unchanged for every caller. As a Sphinx extension it is applied in the process that executes
the chapters (``_config.yml``); ``benchmarks/execute_chapters.py`` applies it too.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

#: The longest single poll, in seconds: the most a lost wake-up can cost.
SLICE = 1.0


def patch() -> bool:
    """Make ``AsyncZMQSocketChannel.get_msg`` poll in slices; return ``False`` if it already
    does (calling twice is harmless) or if this jupyter_client has no such channel (before 8.0,
    e.g. Colab's 7.4.9, whose channels differ: nothing is changed there)."""
    try:
        from jupyter_client.channels import AsyncZMQSocketChannel
    except ImportError:
        return False

    original = AsyncZMQSocketChannel.get_msg
    if getattr(original, "_sliced", False):
        return False

    async def get_msg(self: Any, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await original(self, timeout=min(SLICE, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    get_msg._sliced = True  # type: ignore[attr-defined]
    get_msg.__doc__ = original.__doc__
    AsyncZMQSocketChannel.get_msg = get_msg  # type: ignore[method-assign]
    return True


def setup(app: Any) -> dict[str, Any]:
    patch()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
