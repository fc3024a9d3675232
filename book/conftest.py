"""nbval over the chapters: the same per-cell timeout as the book build.

The build (myst-nb) gives every cell ``execute.timeout`` seconds from ``_config.yml``, and a
chapter that needs longer says so in its own metadata (``"mystnb": {"execution_timeout": N}``,
chapter 8 for its training cell). nbval has one global ``--nbval-cell-timeout`` (2,000 s by
default), so a stalled kernel would cost half an hour of CI. This hook gives each chapter's
cells the build's timeout instead, so a stall fails within minutes, naming the cell, under
nbval as in the build. An explicit ``--nbval-cell-timeout`` on the command line still wins.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@cache
def _build_timeout() -> int:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return int(config["execute"]["timeout"])


@cache
def chapter_timeout(path: Path) -> int:
    """Seconds per cell the build gives this chapter: its own ``mystnb.execution_timeout``,
    else ``_config.yml``'s ``execute.timeout``."""
    metadata = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    return int(metadata.get("mystnb", {}).get("execution_timeout", _build_timeout()))


def _explicit(config: pytest.Config) -> bool:
    return any(arg.startswith("--nbval-cell-timeout") for arg in config.invocation_params.args)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb" and hasattr(item.config.option, "nbval_cell_timeout"):
        if not _explicit(item.config):
            item.config.option.nbval_cell_timeout = chapter_timeout(path)
