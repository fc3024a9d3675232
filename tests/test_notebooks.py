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
    assert "enable_colab_widgets()" in src, (
        f"{path.name}: setup cell must call enable_colab_widgets() so Colab shows the widgets"
    )
    assert "set_threads(" in src, (
        f"{path.name}: setup cell must choose torch's threads with companion.utils.set_threads, "
        "the course's one thread policy"
    )
    setup_rest = "".join(_source(c) for c in _cells(path)[:4] if c["cell_type"] == "code")
    assert "torch.set_num_threads(" not in setup_rest, (
        f"{path.name}: the setup cells set threads only through set_threads"
    )


def test_the_translator_knows_its_own_cell_limit():
    """Chapter 8 warns up front when its training run would not fit the build's cell timeout:
    the limit it quotes must be the one its metadata gives the build and nbval."""
    path = BOOK / "08_translator.ipynb"
    timeout = json.loads(path.read_text(encoding="utf-8"))["metadata"]["mystnb"][
        "execution_timeout"
    ]
    code = "".join(_source(c) for c in _cells(path) if c["cell_type"] == "code")
    assert f"CELL_LIMIT = {timeout} " in code, f"chapter 8 should set CELL_LIMIT = {timeout}"


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
    listed = [f for f in _toc_files() if re.match(r"book/\d\d_", f)]  # the chapters
    on_disk = [f"book/{p.stem}" for p in NOTEBOOKS]
    assert listed == on_disk, "every chapter notebook must be in _toc.yml, in file-name order"
    assert TOC["root"] == "book/intro"
    numbers = [int(re.match(r"book/(\d\d)_", f).group(1)) for f in listed]
    assert numbers == list(range(1, len(numbers) + 1)), (
        "chapters are numbered 01, 02, ... without gaps"
    )


def test_toc_ends_with_the_reference_pages():
    """After the chapters, a last part lists the glossary and the bibliography (.md pages)."""
    last = TOC["parts"][-1]
    assert last["caption"] == "Reference", "the last part of _toc.yml is the Reference part"
    assert [entry["file"] for entry in last["chapters"]] == ["book/glossary", "book/bibliography"]
    for name in ("glossary", "bibliography"):
        assert (BOOK / f"{name}.md").is_file(), f"book/{name}.md is listed in _toc.yml but missing"
    for entry in _toc_files():
        assert re.match(r"book/\d\d_", entry) or (ROOT / f"{entry}.md").is_file(), entry


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
    if "import ipywidgets" in code:
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


# --- Conventions of the website (issue 16): solutions, page opening, glue, citations, terms ---

REFERENCES = ROOT / "references.bib"
GLOSSARY = BOOK / "glossary.md"
SOLUTION_OPENING = '<details class="solution">\n<summary>Solution</summary>\n\n'
CITE_ROLE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]*)`")
TERM_ROLE = re.compile(r"\{term\}`([^`]*)`")
GLUE_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`([A-Za-z0-9_]+)")
GLUE_DIRECTIVE = re.compile(r"^[`:]{3,}\{glue(?::[a-z]+)?\}\s+([A-Za-z0-9_]+)", re.MULTILINE)
# glue("ch02_loss", ...) or, in a loop, glue(f"ch06_{key}_min", ...)
GLUE_CALL = re.compile(r"\bglue\(\s*f?[\"']([A-Za-z0-9_{}]+)[\"']")
# "(Vaswani et al., 2017)", "(Press & Wolf, 2017; Ba et al., 2016)", "Xiong et al. (2020)",
# "Press and Wolf (2017)": a citation written by hand instead of with {cite:p}/{cite:t}
PLAIN_CITATIONS = (
    re.compile(r"\([^()]*\b[A-Z][\w'\-]+(?: et al\.)?,\s+(?:1[89]|20)\d\d[a-z]?\b[^()]*\)"),
    re.compile(r"\b[A-Z][\w'\-]+ et al\.\s+\((?:1[89]|20)\d\d"),
    re.compile(r"\b[A-Z][\w'\-]+,? (?:and|&) [A-Z][\w'\-]+\s+\((?:1[89]|20)\d\d"),
)


def _markdown_cells(path: Path) -> list[str]:
    return [_source(c) for c in _cells(path) if c["cell_type"] == "markdown"]


def _code_cells(path: Path) -> list[dict]:
    return [c for c in _cells(path) if c["cell_type"] == "code"]


def _prose(markdown: str) -> str:
    """Markdown without code blocks, inline code, math and roles: the text a reader reads."""
    markdown = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    markdown = re.sub(r"\$\$.*?\$\$", " ", markdown, flags=re.DOTALL)
    markdown = re.sub(r"\{[a-z:]+\}`[^`]*`", " ", markdown)
    markdown = re.sub(r"`[^`\n]*`", " ", markdown)
    return re.sub(r"\$[^$\n]+\$", " ", markdown)


def plain_citations(markdown: str) -> list[str]:
    """Hand-written "(Author, year)" / "Author et al. (year)" citations in markdown."""
    prose = _prose(markdown)
    return [m.group(0) for pattern in PLAIN_CITATIONS for m in pattern.finditer(prose)]


def solution_problems(markdown_cells: list[str]) -> list[str]:
    """Solutions must be collapsed everywhere: <details class="solution">, never {dropdown}."""
    problems = []
    for i, text in enumerate(markdown_cells):
        if re.search(r"\{dropdown\}\s*Solution", text):
            problems.append(f"markdown cell {i}: a {{dropdown}} solution (only hidden in the HTML)")
        if "<details" in text and "Solution" in text:
            if not text.startswith(SOLUTION_OPENING):
                problems.append(f"markdown cell {i}: must start with {SOLUTION_OPENING!r}")
            if not re.search(r"\n\n</details>\s*(\n|$)", text):
                problems.append(f"markdown cell {i}: needs a blank line before </details>")
    return problems


def glue_problems(markdown: str, code: str, chapter: str) -> list[str]:
    """Glued keys the prose shows but no code cell records, or keys without the chapter prefix."""
    shown = set(GLUE_ROLE.findall(markdown)) | set(GLUE_DIRECTIVE.findall(markdown))
    recorded = set(GLUE_CALL.findall(code))  # keys, or f-string templates such as ch06_{key}_min
    patterns = [
        re.compile(re.sub(r"\\\{[^}]*\\\}", "[A-Za-z0-9_]+", re.escape(k))) for k in recorded
    ]
    problems = [
        f"{key!r} is shown but never glue()d in a code cell"
        for key in sorted(shown)
        if not any(pattern.fullmatch(key) for pattern in patterns)
    ]
    problems += [
        f"{key!r} lacks the chapter prefix {chapter}_"
        for key in sorted(shown | recorded)
        if not key.startswith(f"{chapter}_")
    ]
    return problems


def bib_keys(text: str) -> list[str]:
    """The entry keys of a BibTeX file, in order (duplicates kept)."""
    return re.findall(r"^\s*@\w+\s*\{\s*([^,\s]+)\s*,", text, re.MULTILINE)


def glossary_terms(text: str) -> set[str]:
    """The terms of the {glossary} directive of a MyST page, lowercased."""
    block = re.search(r"^```\{glossary\}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert block, "no {glossary} block"
    return {
        line.strip().lower()
        for line in block.group(1).splitlines()
        if line and not line[0].isspace()
    }


def term_targets(markdown: str) -> list[str]:
    """The glossary terms that {term} roles point to: `text <Term>` or `Term`."""
    targets = []
    for content in TERM_ROLE.findall(markdown):
        explicit = re.fullmatch(r"(?s).*<([^<>]+)>\s*", content)
        targets.append((explicit.group(1) if explicit else content).strip())
    return targets


def xmode_is_minimal_and_silent(code: str) -> bool:
    """The imports cell switches to short tracebacks without printing the magic's notice."""
    if re.search(r"run_line_magic\(\s*[\"']xmode[\"'],\s*[\"']Minimal[\"']\s*\)", code):
        return "redirect_stdout" in code  # the notice goes to stdout: swallowed
    return bool(re.search(r"^%xmode Minimal\s*$", code, re.MULTILINE)) and code.startswith(
        "%%capture"
    )


def test_convention_checkers_reject_what_they_should():
    # solutions
    dropdown = "````{dropdown} Solution\n```python\nassert ch01.check_x(x)\n```\n````"
    good = SOLUTION_OPENING + "```python\nassert ch01.check_x(x)\n```\n\nWhy.\n\n</details>"
    assert solution_problems([good]) == []
    assert solution_problems([dropdown])
    assert solution_problems([good.replace("\n\n</details>", "\n</details>")])
    assert solution_problems(["<details>\n<summary>Solution</summary>\n\ncode\n\n</details>"])
    # glue
    assert glue_problems("{glue:text}`ch02_loss:.2f`", 'glue("ch02_loss", loss)', "ch02") == []
    assert glue_problems("{glue:text}`ch02_loss:.2f`", 'glue("ch02_lost", loss)', "ch02")
    assert glue_problems("{glue}`ch03_loss`", 'glue("ch03_loss", x)', "ch02")
    assert glue_problems("{glue:text}`ch06_pre_min`", 'glue(f"ch06_{key}_min", x)', "ch06") == []
    assert glue_problems("{glue:text}`ch06_pre_max`", 'glue(f"ch06_{key}_min", x)', "ch06")
    # citations
    assert (
        plain_citations("as shown {cite:p}`vaswani2017attention`; (Machine Learning 2021, NTU)")
        == []
    )
    assert plain_citations("`f(2000, 1)` and $x (2017)$ and (see section 2)") == []
    for text in ("(Vaswani et al., 2017)", "(Press & Wolf, 2017)", "(Sutskever et al., 2014; Cho et al., 2014)",
                 "Xiong et al. (2020) showed", "Press and Wolf (2017) tie", "(MQA; Shazeer, 2019)",
                 "(Cho et al., 2014b, \"On the properties\")"):  # fmt: skip
        assert plain_citations(text), text
    assert bib_keys("@misc{a2020x,\n title={T}}\n@article{ b2021y ,\n}") == ["a2020x", "b2021y"]
    # glossary terms
    page = "# G\n\n```{glossary}\nsoftmax\n  Def.\n\nPre-LN\n  Def.\n```\n"
    assert glossary_terms(page) == {"softmax", "pre-ln"}
    assert term_targets("a {term}`softmax` and the {term}`Pre-LN <Pre-LN>` and {term}`heads <attention head>`") == [
        "softmax", "Pre-LN", "attention head"
    ]  # fmt: skip
    # xmode
    silent = 'import io\nwith contextlib.redirect_stdout(io.StringIO()):\n    get_ipython().run_line_magic("xmode", "Minimal")'
    assert xmode_is_minimal_and_silent(silent)
    assert not xmode_is_minimal_and_silent(
        'get_ipython().run_line_magic("xmode", "Minimal")'
    )  # prints
    assert not xmode_is_minimal_and_silent("import math\n%xmode Minimal")  # prints its notice
    assert xmode_is_minimal_and_silent("%%capture\n%xmode Minimal")
    assert not xmode_is_minimal_and_silent("%%capture\n%xmode Context")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solutions_are_collapsed_everywhere(path):
    """Solutions are <details class="solution"> cells: collapsed in Jupyter, Colab and the HTML."""
    cells = _markdown_cells(path)
    assert solution_problems(cells) == [], f"{path.name}: {solution_problems(cells)}"
    assert sum(c.startswith(SOLUTION_OPENING) for c in cells) >= 3, (
        f'{path.name}: every exercise needs its solution in a <details class="solution"> cell'
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_and_imports_cells_are_hidden_in_the_html(path):
    setup, imports = _code_cells(path)[:2]
    for name, cell in (("setup", setup), ("imports", imports)):
        assert "hide-cell" in cell.get("metadata", {}).get("tags", []), (
            f"{path.name}: the {name} cell needs the tag hide-cell"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_imports_cell_sets_short_tracebacks(path):
    imports = _source(_code_cells(path)[1])
    assert xmode_is_minimal_and_silent(imports), (
        f"{path.name}: the imports cell must switch to %xmode Minimal without printing its notice "
        "(run_line_magic under contextlib.redirect_stdout, or %%capture)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_page_opens_with_what_you_learn_and_the_run_time(path):
    chapter = path.name[:2]
    first = _markdown_cells(path)[0]
    assert re.search(r"^\s*[-*] ", first, re.MULTILINE), (
        f"{path.name}: the first cell lists what the reader will learn"
    )
    assert re.search(rf"Run time\b[^\n]*\{{glue:text\}}`ch{chapter}_seconds", first), (
        f"{path.name}: the first cell quotes the run time with {{glue:text}}`ch{chapter}_seconds...`"
    )
    timing = [c for c in _code_cells(path) if f'glue("ch{chapter}_seconds"' in _source(c)]
    assert len(timing) == 1 and "time.process_time()" in _source(timing[0]), (
        f"{path.name}: one cell measures the chapter's CPU time and glues ch{chapter}_seconds"
    )
    assert "hide-input" in timing[0].get("metadata", {}).get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glued_number_is_recorded_by_the_chapter(path):
    markdown = "\n".join(_markdown_cells(path))
    code = "\n".join(_source(c) for c in _code_cells(path))
    problems = glue_problems(markdown, code, f"ch{path.name[:2]}")
    assert problems == [], f"{path.name}: {problems}"


def test_references_bib_has_no_duplicate_keys():
    keys = bib_keys(REFERENCES.read_text(encoding="utf-8"))
    assert keys, "references.bib has no entries"
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    assert not duplicates, f"references.bib: duplicate keys {duplicates}"


PAGES = NOTEBOOKS + sorted(BOOK.glob("*.md"))


def _page_markdown(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(_markdown_cells(path))
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_citation_is_in_references_bib(path):
    known = set(bib_keys(REFERENCES.read_text(encoding="utf-8")))
    cited = [
        k.strip() for group in CITE_ROLE.findall(_page_markdown(path)) for k in group.split(",")
    ]
    missing = sorted({k for k in cited if k not in known})
    assert not missing, f"{path.name} cites keys missing from references.bib: {missing}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_hand_written_citations(path):
    found = plain_citations(_page_markdown(path))
    assert not found, f"{path.name}: write these with {{cite:p}}/{{cite:t}}: {found}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_term_is_in_the_glossary(path):
    terms = glossary_terms(GLOSSARY.read_text(encoding="utf-8"))
    unknown = sorted({t for t in term_targets(_page_markdown(path)) if t.lower() not in terms})
    assert not unknown, f"{path.name}: {{term}} targets missing from book/glossary.md: {unknown}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_glue_key_is_written_twice(path):
    """myst-nb warns on a key glued twice in one page, and the build runs with -W: a literal
    key must appear in one glue(...) call only."""
    code = "\n".join(_source(c) for c in _code_cells(path))
    keys = re.findall(r"""glue\(\s*["']([A-Za-z0-9_]+)["']""", code)
    twice = sorted({k for k in keys if keys.count(k) > 1})
    assert twice == [], f"{path.name}: glued more than once: {twice}"


def _ends_with_bare_glue(source: str) -> bool:
    """True when a cell's last statement is a ``glue(...)`` call without a trailing ``;``:
    Jupyter would then print the glued value's repr under the cell (a stray output)."""
    lines = [
        "pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    ]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return False
    if not tree.body:
        return False
    last = tree.body[-1]
    if not (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and getattr(last.value.func, "id", None) == "glue"
    ):
        return False
    tail = lines[last.end_lineno - 1].encode()[last.end_col_offset :].decode()  # a byte offset
    return not tail.lstrip().startswith(";")


def test_bare_glue_detector():
    assert _ends_with_bare_glue('x = 1\nglue("a", x)')
    assert _ends_with_bare_glue('glue(\n    "a",\n    2,\n)  # comment')
    assert not _ends_with_bare_glue('glue("a", 1);')
    assert not _ends_with_bare_glue('glue("a", 1)  ;  # quiet')
    assert not _ends_with_bare_glue('glue("a", 1)\nprint("done")')
    assert not _ends_with_bare_glue('%matplotlib inline\nglue("a", 1);')
    assert not _ends_with_bare_glue('glue("√ × τ", 1);')  # non-ASCII before the end


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_ends_with_a_bare_glue(path):
    """A glue(...) that ends a cell prints its value's repr on the page unless it ends with ';'."""
    bare = [
        i
        for i, c in enumerate(_cells(path))
        if c["cell_type"] == "code" and _ends_with_bare_glue(_source(c))
    ]
    assert bare == [], f"{path.name}: cells {bare} end with glue(...) and no ';' (a stray output)"


def _heading_jumps(markdown_cells: list[str]) -> list[str]:
    """Headings that go down more than one level at once (## then ####): MyST warns, and the
    build runs with -W. Fenced code blocks are skipped."""
    jumps, last = [], None
    for text in markdown_cells:
        fenced = False
        for line in text.splitlines():
            if line.startswith("```"):
                fenced = not fenced
            match = None if fenced else re.match(r"^(#+) ", line)
            if match:
                level = len(match.group(1))
                if last is not None and level > last + 1:
                    jumps.append(f"H{last} to H{level}: {line[:60]}")
                last = level
    return jumps


def test_heading_jump_detector():
    assert _heading_jumps(["## A", "#### B"]) == ["H2 to H4: #### B"]
    assert _heading_jumps(["## A\n### B\n#### C\n## D"]) == []
    assert _heading_jumps(["## A\n```\n#### not a heading\n```"]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_headings_go_down_one_level_at_a_time(path):
    jumps = _heading_jumps(_markdown_cells(path))
    assert jumps == [], f"{path.name}: {jumps}"


def hidden_cell_problems(cells: list[dict]) -> list[str]:
    """Code cells the book hides (tags hide-input or hide-cell) that Colab or Jupyter would show:
    each needs a '# @title' first line and metadata cellView 'form' (Colab collapses it to its
    title) and jupyter.source_hidden (JupyterLab, Notebook 7 and VS Code collapse the input)."""
    problems = []
    for i, cell in enumerate(cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or not {"hide-input", "hide-cell"} & set(tags):
            continue
        meta = cell["metadata"]
        if not _source(cell).startswith("# @title "):
            problems.append(f"cell {i}: no '# @title' first line")
        if meta.get("cellView") != "form":
            problems.append(f"cell {i}: metadata cellView is not 'form'")
        if meta.get("jupyter", {}).get("source_hidden") is not True:
            problems.append(f"cell {i}: metadata jupyter.source_hidden is not true")
    return problems


def test_hidden_cell_detector():
    shown = {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "source": "x = 1\n"}
    hidden = {
        "cell_type": "code",
        "metadata": {"tags": ["hide-cell"], "cellView": "form", "jupyter": {"source_hidden": True}},
        "source": "# @title Checks\nx = 1\n",
    }
    plain = {"cell_type": "code", "metadata": {}, "source": "x = 1\n"}
    assert len(hidden_cell_problems([shown])) == 3
    assert hidden_cell_problems([hidden, plain]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_hidden_cells_are_collapsed_in_colab_and_jupyter_too(path):
    """Readers run the chapters in Colab and Jupyter, which ignore the book's hide-* tags."""
    problems = hidden_cell_problems(_cells(path))
    assert problems == [], f"{path.name}: {problems[:5]} (run python .ci/colab_forms.py on it)"


def _names(code: str) -> tuple[set[str], set[str]]:
    """The names a cell binds and the names it reads (IPython magics skipped)."""
    lines = ["pass" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines()]
    bound, read = set(), set()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read


def optional_dependencies(cells: list[dict]) -> list[str]:
    """Cells that read a name only a cell titled 'Optional...' defines: a reader who skips the
    optional cell (its title invites it) gets a NameError there."""
    from_optional: dict[str, int] = {}
    defined: set[str] = set()
    problems = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        code = _source(cell)
        bound, read = _names(code)
        if code.startswith("# @title Optional"):
            from_optional.update({name: i for name in bound - defined if name not in from_optional})
            continue
        needed = sorted(n for n in read - bound - defined if n in from_optional)
        if needed:
            problems.append(
                f"cell {i} reads {needed} from optional cell(s) "
                f"{sorted({from_optional[n] for n in needed})}"
            )
        defined |= bound
    return problems


def test_optional_dependency_detector():
    def code(source: str) -> dict:
        return {"cell_type": "code", "metadata": {}, "source": source}

    optional = code("# @title Optional: a check\nlimit = 3\n")
    assert optional_dependencies([optional, code("print(limit)\n")]) != []
    assert optional_dependencies([optional, code("limit = 4\nprint(limit)\n")]) == []
    assert optional_dependencies([code("limit = 1\n"), optional, code("print(limit)\n")]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_needs_an_optional_cell(path):
    """A cell titled 'Optional' may be skipped in Colab or Jupyter; nothing after it may need it."""
    problems = optional_dependencies(_cells(path))
    assert problems == [], f"{path.name}: {problems[:5]} (retitle the cell, or move the names)"
