"""Static checks of the book: stored without outputs, setup cell, table of contents, URL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import companion

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def test_there_are_chapters():
    assert NOTEBOOKS, "book/ holds no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), (
                f"{path.name} cell {i} has stored outputs; run .ci/strip_notebooks.py"
            )
            assert cell.get("execution_count") is None, (
                f"{path.name} cell {i} has an execution count"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_installs_from_the_configured_repository(path):
    first_code = next(c for c in _cells(path) if c["cell_type"] == "code")
    src = _source(first_code)
    url = CONFIG["repository"]["url"]
    assert f'REPO = "{url}"' in src, f"{path.name}: setup cell must define REPO = {url!r}"
    assert 'f"git+{REPO}"' in src and 'find_spec("companion")' in src
    assert "set_seed(" in src, f"{path.name}: setup cell must fix the seeds"


def test_package_knows_the_same_repository_url():
    assert companion.REPOSITORY_URL == CONFIG["repository"]["url"]


def test_toc_lists_every_notebook_in_order():
    listed = [entry["file"] for entry in TOC["chapters"]]
    on_disk = [f"book/{p.stem}" for p in NOTEBOOKS]
    assert listed == on_disk, "every chapter notebook must be in _toc.yml, in file-name order"
    assert TOC["root"] == "book/intro"
    numbers = [int(re.match(r"book/(\d\d)_", f).group(1)) for f in listed]
    assert numbers == list(range(1, len(numbers) + 1)), (
        "chapters are numbered 01, 02, ... without gaps"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_structure(path):
    cells = _cells(path)
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    assert re.match(r"#\s+\S", _source(cells[0])), (
        f"{path.name} must open with a '# Title' markdown cell"
    )
    assert "## Exercises" in markdown, f"{path.name} must end with an Exercises section"
    assert code.count("assert ") >= 5, f"{path.name}: claims must be checked with asserts"
    assert "inspect.getsource" in code, (
        f"{path.name}: show companion's real source, do not re-type it"
    )
    kernel = json.loads(path.read_text())["metadata"].get("kernelspec", {})
    assert kernel.get("name") == "python3", f"{path.name}: kernelspec must be python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_widget_has_a_static_figure(path):
    code = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "code")
    if "ipywidgets" in code:
        assert "plt.show()" in code or "savefig" in code, (
            f"{path.name}: pair each widget with a static figure"
        )
