"""Static checks of the book: stored without outputs, setup cell, table of contents, URL."""

from __future__ import annotations

import ast
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


def _toc_files() -> list[str]:
    """The chapter files of ``_toc.yml`` in reading order, part after part."""
    assert "parts" in TOC and "chapters" not in TOC, "_toc.yml lists its chapters in parts"
    files = []
    for part in TOC["parts"]:
        assert part.get("caption"), f"every part of _toc.yml needs a caption: {part}"
        files += [entry["file"] for entry in part["chapters"]]
    return files


def test_toc_lists_every_notebook_in_order():
    listed = _toc_files()
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


def _is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; dunders such as ``__init__`` and ``__name__`` are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names(code: str) -> list[str]:
    """The private names a code cell uses, each as ``"line N: name"``.

    Flagged: an attribute ``obj._name`` (so also ``obj._name(...)`` and
    ``inspect.getsource(module._helper)``), an import of a private module or name, and a
    private bare name passed to ``inspect.getsource``. Dunders are allowed.
    """
    # IPython magics and shell escapes are not Python; blank them, keeping the line numbers.
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines()]
    tree = ast.parse("\n".join(lines))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found += [
                    (node.lineno, part) for part in alias.name.split(".") if _is_private(part)
                ]
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") + [alias.name for alias in node.names]
            found += [(node.lineno, part) for part in parts if _is_private(part)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getsource"
        ):
            for arg in node.args:
                found += [
                    (sub.lineno, sub.id)
                    for sub in ast.walk(arg)
                    if isinstance(sub, ast.Name) and _is_private(sub.id)
                ]
    return [f"line {line}: {name}" for line, name in sorted(set(found))]


def test_private_names_are_found():
    code = (
        "%matplotlib inline\n"
        "print(inspect.getsource(companion.attention._fused_linear))\n"
        "print(inspect.getsource(companion.layers._ResidualLayer._layer_norm))\n"
        "heads = mha._split_heads(q)\n"
        "from companion._validation import check_bool\n"
        "from companion.positional import _frequencies\n"
        "print(inspect.getsource(_helper))\n"
    )
    assert private_names(code) == [
        "line 2: _fused_linear",
        "line 3: _ResidualLayer",
        "line 3: _layer_norm",
        "line 4: _split_heads",
        "line 5: _validation",
        "line 6: _frequencies",
        "line 7: _helper",
    ]
    public = (
        "print(inspect.getsource(MultiHeadAttention.split_heads))\n"
        "print(inspect.getsource(EncoderLayer.__init__), type(x).__name__)\n"
        "_, weights = mha(x, x, x, need_weights=True)\n"
        "def _local(): pass\n"
    )
    assert private_names(public) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapters_use_and_print_no_private_names(path):
    """A chapter shows and calls only public API: what it prints is what a reader may use."""
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] == "code":
            names = private_names(_source(cell))
            assert not names, (
                f"{path.name} cell {i} uses private names {names}; make them public in "
                "companion (type hints, a docstring with shapes) or show the public API instead"
            )
