"""Strip outputs, execution counts and volatile metadata from notebooks, in place.

Usage: python .ci/strip_notebooks.py book/*.ipynb
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def strip(path: Path) -> bool:
    """Strip one notebook; return True when the file changed."""
    original = path.read_text(encoding="utf-8")
    nb = json.loads(original)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    nb.get("metadata", {}).pop("widgets", None)
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if text != original:
        path.write_text(text, encoding="utf-8")
        return True
    return False


if __name__ == "__main__":
    changed = [p for p in map(Path, sys.argv[1:]) if strip(p)]
    for p in changed:
        print(f"stripped {p}")
