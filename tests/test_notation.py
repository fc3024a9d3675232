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
    ("superscript feed-forward weight", re.compile(r"W\^\{?[12]"), "both",
     "the feed-forward matrices are $W_1$, $W_2$ (chapter 7); layer l's is $W_2^{(l)}$"),
    ("scaled s_ij", re.compile(r"s_\{?ij\}?(?:\^\{?\(r\)\}?)?\s*=\s*\\frac\s*\{\s*q_i"), "prose",
     "$s_{ij} = q_i \\cdot k_j$ is the raw dot product; the softmax's input is $s_{ij}/\\sqrt{d_k}$"),
    ("len in a shape", re.compile(r"\((?:[^()\n,]+, )+len\b(?!\()"), "both",
     "a sequence length in a shape is seq_len (q_len, k_len, src_len, tgt_len), never len"),
    ("LEN constant", re.compile(r"\bLEN_[A-Z0-9_]+\b"), "code",
     "a sequence-length constant is SEQ_LEN (or SRC_LEN, TRAIN_LEN, ...), never LEN_..."),
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
        ("the gradient of $W^{2,N}$, the second weight matrix", "superscript feed-forward weight"),
        ("$\\partial \\mathcal{L} / \\partial W^2$", "superscript feed-forward weight"),
        ("\\qquad s_{ij} = \\frac{q_i \\cdot k_j}{\\sqrt{d_k}} .", "scaled s_ij"),
        ("s_{ij}^{(r)} = \\frac{q_i \\cdot k_j}{\\sqrt{d_{\\text{head}}}} - m_r", "scaled s_ij"),
        ("x = torch.randn(2, 16, 64)  # (batch, len, d_model)", "len in a shape"),
        ("selected = targets != PAD_ID  # (batch, len - 1)", "len in a shape"),
        ("`(batch, len)` padded with 0", "len in a shape"),
        ("BATCH_INIT, LEN_INIT = 8, 16", "LEN constant"),
    ],
)
def test_the_rules_catch_the_old_spellings(line, rule):
    name, pattern, *_ = next(r for r in RULES if r[0] == rule)
    assert pattern.search(line), f"rule {name!r} misses {line!r}"


@pytest.mark.parametrize(
    "line",
    [
        "$W_Q$ and $W_O^{(r)}$", "$d_\\text{head} = d_\\text{model}/h$", "head_dim = 64", "seq_len = 12",
        "$\\partial \\mathcal{L} / \\partial W_2^{(N)}$", "$x W_1 + b_1$", "$\\mathrm{PE}(i)^{2}$",
        "\\qquad s_{ij} = q_i \\cdot k_j .", "\\alpha_{ij} = \\frac{e^{s_{ij}/\\sqrt{d_k}}}{Z_i}",
        "x = torch.randn(2, 16, 64)  # (batch, seq_len, d_model)", "lengths = [len(s) for s in ids]",
        "print(f'{len(runs)} runs')", "SRC_LEN, TRAIN_LEN, SEQ_LEN = 9, 16, 12",
    ],
)  # fmt: skip
def test_the_rules_pass_the_new_spellings(line):
    hits = [r[0] for r in RULES if r[1].search(line)]
    assert not hits, f"{line!r} is the new notation but {hits} flag it"
