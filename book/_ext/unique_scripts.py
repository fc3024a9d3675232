"""Write each ``<script>`` of a page once.

Sphinx 7.4 re-adds the inline scripts that extensions register after the builder has started
(``app.add_js_file(None, body=...)``) under the file name ``''`` instead of ``None``, so they
are not recognised as already there and every page carries them twice. For sphinx-thebe's
``const THEBE_JS_URL = ...`` that is a JavaScript error on every page ("Identifier
'THEBE_JS_URL' has already been declared"), which tests/test_browser.py reports. This
extension drops the second copy of each script just before a page is written.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def script_key(script: Any) -> tuple[object, ...]:
    """What makes two scripts the same: file (``None`` = ``''``), priority and attributes."""
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", {})
    return (str(filename), getattr(script, "priority", 500), *sorted(attributes.items()))


def drop_repeated_scripts(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: object
) -> None:
    """Keep the first of each group of equal scripts in the page's ``script_files``."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[object, ...]] = set()
    unique = []
    for script in scripts:
        if (key := script_key(script)) not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app: Sphinx) -> dict[str, object]:
    """Run after the other extensions have added their per-page scripts."""
    app.connect("html-page-context", drop_repeated_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
