"""book/_ext/merged_streams.py: the page merges a cell's stream blocks, the executed notebook
keeps them as they ran (myst-nb 1.4.0's coalesce_streams appended to the first block itself,
which duplicated the tail of a print that arrived in two messages)."""

from __future__ import annotations

import copy

from helpers import load_book_module
from myst_nb.core import render
from myst_nb.core.utils import coalesce_streams
from nbformat import NotebookNode


def _load():
    return load_book_module("book/_ext/merged_streams.py")


def _outputs() -> list[NotebookNode]:
    # what the kernel sent for print("Q =", Q, sep="\n") when its I/O thread flushed mid-print
    return [
        NotebookNode(output_type="stream", name="stdout", text="Q =\n"),
        NotebookNode(output_type="stream", name="stdout", text="tensor([[0.796, -0.241]])\n"),
    ]


def test_myst_nbs_merge_changes_the_executed_outputs():
    """The defect itself (if a later myst-nb fixes it, this test says so and the extension can
    go): the first block swallows the second, which stays in the notebook too."""
    outputs = _outputs()
    coalesce_streams(outputs)
    texts = [o["text"] for o in outputs]
    assert texts == ["Q =\ntensor([[0.796, -0.241]])\n", "tensor([[0.796, -0.241]])\n"], texts


def test_merging_copies_leaves_the_executed_outputs_as_they_ran(monkeypatch):
    module = _load()
    monkeypatch.setattr(render, "coalesce_streams", coalesce_streams)
    assert module.patch() is True
    assert module.patch() is False, "patching twice must not wrap twice"
    outputs = _outputs()
    before = copy.deepcopy(outputs)
    merged = render.coalesce_streams(outputs)
    assert outputs == before, "the executed notebook's outputs must not change"
    assert [o["text"] for o in merged] == ["Q =\ntensor([[0.796, -0.241]])\n"]


def test_merging_twice_shows_the_text_once(monkeypatch):
    """A page that merges the same cell twice (as myst-nb's renderer can) shows one copy."""
    module = _load()
    monkeypatch.setattr(render, "coalesce_streams", coalesce_streams)
    module.patch()
    outputs = _outputs()
    render.coalesce_streams(outputs)
    merged = render.coalesce_streams(outputs)
    assert [o["text"] for o in merged] == ["Q =\ntensor([[0.796, -0.241]])\n"]
