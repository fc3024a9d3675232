"""Merge a cell's stream outputs for the page without changing the executed notebook.

**The duplicated output.** With ``nb_merge_streams: true`` (``_config.yml``) myst-nb joins a
cell's ``stdout`` blocks into one box on the page with ``myst_nb.core.utils.coalesce_streams``.
That function (myst-nb 1.4.0) builds its merged list by *appending the later blocks' text to
the first block itself*, a ``NotebookNode`` shared with the executed notebook, while the later
blocks stay in the notebook's own list. Whenever the kernel happens to send a cell's printed
text in two messages (its I/O thread flushes on a timer, so this depends on timing and is more
frequent on a busy machine), the executed notebook then holds the first block with everything
in it *and* the second block again: "the second block repeats the tail of the first", in the
saved notebook and, once the cell's outputs are merged a second time, on the page (chapter 6's
loss table printed twice). The kernel version does not matter: reproduced with ipykernel 6.31
and 7.4 alike.

**The fix.** :func:`coalesce_copies` merges copies of the blocks and leaves the notebook's
outputs as executed; :func:`setup` puts it where myst-nb's renderer looks the function up.
"""

from __future__ import annotations

import copy
from typing import Any


def coalesce_copies(outputs: list[Any]) -> list[Any]:
    """myst-nb's ``coalesce_streams`` applied to deep copies of ``outputs``: the same merged
    list, and ``outputs`` (the executed notebook's) unchanged."""
    from myst_nb.core.utils import coalesce_streams

    return coalesce_streams(copy.deepcopy(outputs))


def patch() -> bool:
    """Make myst-nb's renderer merge copies; ``False`` if it already does or if this myst-nb
    renders differently (nothing to change)."""
    try:
        from myst_nb.core import render
    except ImportError:
        return False
    if getattr(render, "coalesce_streams", None) in (None, coalesce_copies):
        return False
    render.coalesce_streams = coalesce_copies
    return True


def setup(app: Any) -> dict[str, Any]:
    patch()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
