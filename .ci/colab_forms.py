"""Collapse the book's hidden code cells in Colab and Jupyter too.

Colab and Jupyter ignore the book's ``hide-input``/``hide-cell`` tags, so a reader who runs a
chapter there would meet every checks and plotting cell in full. This gives each such cell a
``# @title`` first line and the metadata ``cellView: form`` (Colab shows the title, double-click
opens the code) and ``jupyter.source_hidden`` (JupyterLab, Notebook 7 and VS Code collapse the
input). Idempotent; ``tests/test_notebooks.py`` checks the result.

A cell whose code opens with a one-line comment (a whole line, not the start of a longer
comment) takes that comment as its title; the others get a title from their tag.

Usage: python .ci/colab_forms.py book/*.ipynb
"""

import json
import sys

TITLES = {
    "hide-input": "Checks and plotting code for this step (double-click to read it)",
    "hide-cell": "A measurement or check the text refers to (double-click to read it)",
}
#: earlier titles, replaced by the current ones when the script runs again ("Optional" went: later
#: cells may need what such a cell computes, so a reader must not skip it)
RETIRED = {
    "Code behind the output below: checks and plotting (double-click to read it)": "hide-input",
    "Optional: a measurement or check the text refers to (double-click to read it)": "hide-cell",
}
GENERIC = set(TITLES.values()) | set(RETIRED)


def own_title(code: str) -> str | None:
    """The cell's opening one-line comment, if it has one short enough for a title."""
    lines = code.splitlines()
    if len(lines) < 2 or not lines[0].startswith("# ") or lines[0].startswith("# @title"):
        return None
    if lines[1].startswith("#"):
        return None
    text = lines[0][2:].strip()
    if not 15 <= len(text) <= 110:
        return None
    first_word = text.split()[0]
    return text[0].upper() + text[1:] if first_word.isalpha() else text  # keep paths and names


SETUP = "Setup: installs the companion package on Colab, fixes the seeds and threads"
IMPORTS = "Imports and display settings"
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    changed, k = 0, 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        k += 1
        tags = cell.get("metadata", {}).get("tags", [])
        kind = (
            "hide-cell" if "hide-cell" in tags else "hide-input" if "hide-input" in tags else None
        )
        if kind is None:
            continue
        src = "".join(cell["source"])
        first, _, rest = src.partition("\n")
        if first.removeprefix("# @title ") in GENERIC:
            src = rest  # a title from the tag: look again for the cell's own
        title = SETUP if k == 1 else IMPORTS if k == 2 else own_title(src)
        if title and k > 2:
            src = src.partition("\n")[2]  # the comment becomes the title line
        title = title or TITLES[kind]
        if not src.startswith("# @title"):
            src = f"# @title {title}\n" + src
        if src != "".join(cell["source"]):
            cell["source"] = src.splitlines(keepends=True)
            changed += 1
        md = cell.setdefault("metadata", {})
        md["cellView"] = "form"
        md.setdefault("jupyter", {})["source_hidden"] = True
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"{path}: {changed} cells given a new title")
