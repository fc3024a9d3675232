"""Serve MathJax 3 from the built book, so formulas render without internet access.

``_config.yml`` sets ``mathjax_path: mathjax/tex-chtml.js`` (a path relative to ``_static``),
and this Sphinx extension copies the MathJax files there at the end of every HTML build.
The files come from the PyPI package ``sphinx-mathjax-offline`` (MathJax 3.2.2's ``es5``
bundle, pinned in ``requirements.txt``), so README's setup command brings them and the book
renders the same online and offline. Only what ``tex-chtml.js`` can load is copied: the
combined TeX→CHTML bundle, the TeX extensions it autoloads, the CHTML fonts and the menu's
accessibility and speech components (about 7 MB instead of 24 MB).
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

#: The PyPI distribution that ships the MathJax files.
DISTRIBUTION = "sphinx-mathjax-offline"
#: The folder of MathJax's ``es5`` bundle inside that distribution.
MATHJAX_FOLDER = "sphinx-mathjax-offline/static/mathjax"
#: The MathJax component the book loads (TeX input, CommonHTML output).
COMPONENT = "tex-chtml.js"
#: What ``tex-chtml.js`` never loads: the other combined bundles, SVG and MathML output,
#: MathML/AsciiMath input and the server-side adaptors.
SKIP = [
    "*svg*",
    "mml-chtml.js",
    "tex-mml-*.js",
    "tex-*-full*.js",
    "node-main.js",
    "adaptors",
    "asciimath.js",
    "mml",
    "mml.js",
]


def mathjax_source() -> Path:
    """The installed ``es5`` folder of MathJax 3 (holds ``tex-chtml.js``).

    Raises:
        ExtensionError: the ``sphinx-mathjax-offline`` package is not installed.
    """
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError as error:
        raise ExtensionError(
            f"offline_mathjax: the PyPI package {DISTRIBUTION!r} (MathJax 3 files) is not "
            "installed; run README's setup command (pip install -r requirements.txt)"
        ) from error
    folder = Path(str(dist.locate_file(MATHJAX_FOLDER)))
    if not (folder / COMPONENT).is_file():
        raise ExtensionError(
            f"offline_mathjax: expected {COMPONENT} in {folder} (package {DISTRIBUTION} "
            f"{dist.version}), found no such file"
        )
    return folder


def copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    """Copy MathJax into ``<outdir>/_static/mathjax`` after a successful HTML build."""
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "mathjax"
    shutil.copytree(
        mathjax_source(),
        target,
        ignore=shutil.ignore_patterns(*SKIP),
        dirs_exist_ok=True,
    )


def check_mathjax_path(app: Sphinx) -> None:
    """Fail early when ``mathjax_path`` does not point at the copied files."""
    if app.builder.format != "html":
        return
    mathjax_source()  # a missing package fails here, before any notebook is executed
    expected = f"mathjax/{COMPONENT}"
    if app.config.mathjax_path != expected:
        raise ExtensionError(
            f"offline_mathjax: mathjax_path must be {expected!r} (relative to _static) so the "
            f"book loads the copied files, got {app.config.mathjax_path!r}"
        )


def setup(app: Sphinx) -> dict[str, object]:
    """Register the check (when the builder starts) and the copy (when the build ends)."""
    app.connect("builder-inited", check_mathjax_path)
    app.connect("build-finished", copy_mathjax)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
