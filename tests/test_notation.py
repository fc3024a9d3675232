"""One notation in every chapter (the table in ``book/intro.md``): the old spellings fail here.

Each rule names a spelling the chapters used before the notation was unified, where it may not
appear, and what to write instead. A rule is checked in every notebook and in the book's
Markdown pages, prose (Markdown cells) and code (code cells) as the rule says. The intro's table
itself names the forbidden spellings once (``never $W^Q$``); a line that says ``never`` is the
table's warning and is not checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))

#: (name, pattern, where: "prose" | "code" | "both", what to write instead)
RULES = [
    ("superscript projection", re.compile(r"W\^\{?[QKVO]\b"), "both",
     "write the projections with subscripts, $W_Q$, $W_K$, $W_V$, $W_O$ (head r: $W_Q^{(r)}$)"),
    ("d_head in code", re.compile(r"(?<![\\{])\bd_head\b"), "code",
     "the package calls one head's width head_dim; the symbol is $d_\\text{head}$"),
    ("d_head in backticks", re.compile(r"`[^`\n]*\bd_head\b[^`\n]*`"), "prose",
     "`head_dim` is the code name of one head's width; $d_\\text{head}$ is the symbol"),
    ("LENGTH", re.compile(r"\bLENGTH\b"), "both",
     "a sequence length is seq_len (q_len, k_len where they differ), its symbol n"),
    ("dk spelled d_k in text mode", re.compile(r"\$d_\{?\\text\{k\}"), "prose",
     "the key width is $d_k$"),
]  # fmt: skip


def _texts(path: Path) -> list[tuple[str, str, str]]:
    """(kind, where, text) of every cell of a notebook, or the whole of a Markdown page."""
    if path.suffix == ".md":
        return [("prose", path.name, path.read_text(encoding="utf-8"))]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    out = []
    for i, cell in enumerate(cells):
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        kind = "code" if cell["cell_type"] == "code" else "prose"
        out.append((kind, f"{path.name} cell {i}", source))
    return out


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_one_notation(path):
    found = []
    for kind, where, text in _texts(path):
        for line in text.splitlines():
            if "never" in line:  # the table's own warning names the old spelling
                continue
            for name, pattern, scope, instead in RULES:
                if scope in ("both", kind) and pattern.search(line):
                    found.append(f"{where}: {name} in {line.strip()[:90]!r}: {instead}")
    assert not found, "old notation (see the table in book/intro.md):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, rule",
    [
        ("the projection $W^Q$ maps", "superscript projection"),
        ("$W^{K}_i$", "superscript projection"),
        ("q = x.view(batch, seq, heads, d_head)", "d_head in code"),
        ("LENGTH = 12", "LENGTH"),
    ],
)
def test_the_rules_catch_the_old_spellings(line, rule):
    name, pattern, *_ = next(r for r in RULES if r[0] == rule)
    assert pattern.search(line), f"rule {name!r} misses {line!r}"


@pytest.mark.parametrize(
    "line",
    ["$W_Q$ and $W_O^{(r)}$", "$d_\\text{head} = d_\\text{model}/h$", "head_dim = 64", "seq_len = 12"],
)
def test_the_rules_pass_the_new_spellings(line):
    hits = [r[0] for r in RULES if r[1].search(line)]
    assert not hits, f"{line!r} is the new notation but {hits} flag it"
