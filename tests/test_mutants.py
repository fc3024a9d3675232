"""The bug museum (issue #18): every mutant of ``companion`` must be caught by a named test.

Each mutant of :mod:`mutants.catalogue` is applied to a fresh copy of the package in a
temporary folder, and its named tests run there in a subprocess whose ``companion`` is the
mutated copy (a small pytest plugin records ``companion.__file__`` to prove it). The mutant is
*caught* when that run fails because a test failed (pytest exit code 1 and a ``failed`` in the
summary), not because something could not be collected or imported (exit codes 2-5).
The same named tests must pass on an unmutated copy, otherwise "caught" would mean nothing.

The subprocesses run two at a time (:data:`WORKERS`), started when the first museum test
needs them; ``-k`` selects single mutants, e.g.
``pytest tests/test_mutants.py -k cache_offset``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from mutants.catalogue import MUTANTS, Mutant, apply_mutant

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "companion"
#: Subprocesses at a time: the CI machine has 2 cores, and each run uses one torch thread.
WORKERS = 2
#: Seconds one run may take before it counts as a failure of the museum.
TIMEOUT = 300
#: The unmutated copy's run, which every mutant's tests must pass first.
BASELINE = "unmutated"

#: A pytest plugin loaded into every run: it records which ``companion`` the tests imported.
PROBE = '''"""Record the file of the companion package that this pytest run imported."""
import os
import sys


def pytest_sessionfinish(session, exitstatus):
    module = sys.modules.get("companion")
    where = "not imported" if module is None else module.__file__
    with open(os.environ["MUSEUM_PROBE_OUT"], "w", encoding="utf-8") as out:
        out.write(where)
'''


@dataclass(frozen=True)
class Run:
    """What one pytest subprocess on a copy of the package gave."""

    returncode: int
    imported: str  #: ``companion.__file__`` as seen by the tests
    expected: str  #: the copy's ``companion/__init__.py``
    output: str  #: stdout and stderr of the run

    @property
    def summary(self) -> str:
        """The last line of pytest's report (``1 failed, 2 passed in 3.4s``)."""
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def node_path(node_id: str) -> Path:
    """``tests/test_x.py::test_y`` → the absolute path of the test file."""
    return ROOT / node_id.split("::")[0]


def run_tests(folder: Path, node_ids: list[str], mutant: Mutant | None) -> Run:
    """Copy ``companion`` into ``folder``, apply ``mutant`` (if any), run ``node_ids`` there."""
    copy = folder / "companion"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if mutant is not None:
        apply_mutant(mutant, copy)
    (folder / "museum_probe.py").write_text(PROBE, encoding="utf-8")
    probe_out = folder / "imported.txt"
    env = dict(os.environ)
    # The copy first on the path (the run's working folder is first anyway with `python -m`),
    # ahead of the editable install of the repository's own package.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    env["MUSEUM_PROBE_OUT"] = str(probe_out)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p"]
    command += ["museum_probe", "--no-header", "-rfE"]
    command += ["-x"] if mutant is not None else []
    command += [str(ROOT / node) for node in node_ids]
    try:
        done = subprocess.run(
            command, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as error:
        return Run(-1, "timed out", "", f"{error}")
    imported = probe_out.read_text(encoding="utf-8") if probe_out.exists() else "no record"
    return Run(done.returncode, imported, str(copy / "__init__.py"), done.stdout + done.stderr)


def all_node_ids() -> list[str]:
    """Every node id the catalogue names, once, in catalogue order."""
    return list(dict.fromkeys(node for mutant in MUTANTS for node in mutant.tests))


@pytest.fixture(scope="session")
def museum(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """Start the runs of the museum tests selected in this session, ``WORKERS`` at a time;
    ``{mutant id or BASELINE: Future[Run]}``."""
    wanted = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.path == Path(__file__) and callspec is not None and "mutant" in callspec.params:
            wanted.append(callspec.params["mutant"])
        elif item.path == Path(__file__) and item.name == "test_named_tests_pass_unmutated":
            wanted.insert(0, None)  # the longest run starts first
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures = {}
    for mutant in wanted:
        name = BASELINE if mutant is None else mutant.id
        nodes = all_node_ids() if mutant is None else list(mutant.tests)
        folder = tmp_path_factory.mktemp(name)
        futures[name] = pool.submit(run_tests, folder, nodes, mutant)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_catalogue_is_well_formed() -> None:
    """At least 25 mutants with unique ids; every snippet occurs exactly once in the package
    and every named test exists (so a renamed test or an edited line fails loudly)."""
    assert len(MUTANTS) >= 25, f"the museum needs at least 25 mutants, has {len(MUTANTS)}"
    ids = [mutant.id for mutant in MUTANTS]
    assert len(set(ids)) == len(ids), "mutant ids must be unique"
    for mutant in MUTANTS:
        text = (PACKAGE / mutant.path).read_text(encoding="utf-8")
        assert mutant.tests, f"mutant {mutant.id} names no test"
        for original, _ in mutant.edits:
            count = text.count(original)
            assert count == 1, f"{mutant.id}: snippet found {count} times in {mutant.path}"
    for node in all_node_ids():
        assert re.fullmatch(r"tests/test_\w+\.py::test_\w+", node), f"not a test node id: {node}"
        tree = ast.parse(node_path(node).read_text(encoding="utf-8"))
        names = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert node.split("::")[1] in names, f"{node}: no such test function"


def test_readme_states_the_catalogue_size() -> None:
    """README's museum paragraph counts the mutants and the score: both follow the catalogue."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    n = len(MUTANTS)
    assert re.search(rf"`tests/mutants/catalogue\.py` lists {n}\s", readme), f"README: lists {n}"
    assert f"**Mutation score: {n}/{n} (100 %).**" in readme, f"README: score {n}/{n}"


def test_named_tests_pass_unmutated(museum: dict[str, Future]) -> None:
    """The tests that catch the mutants pass on an unmutated copy of the package."""
    run = museum[BASELINE].result()
    assert run.imported == run.expected, f"the tests imported {run.imported}, not the copy"
    assert run.returncode == 0, f"the named tests fail without any mutant:\n{run.output[-3000:]}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.id for mutant in MUTANTS])
def test_mutant_is_caught(mutant: Mutant, museum: dict[str, Future]) -> None:
    """The mutated copy makes one of the mutant's named tests fail."""
    run = museum[mutant.id].result()
    where = f"the tests imported {run.imported}; the mutated copy is {run.expected}"
    assert run.returncode != 0, (
        f"mutant {mutant.id} survived {list(mutant.tests)}: a test is missing ({where})"
    )
    assert run.returncode == 1 and " failed" in run.summary, (
        f"mutant {mutant.id} broke the run itself (exit code {run.returncode}), not a test: "
        f"a mutant must be a bug the tests see, not an import error\n{run.output[-3000:]}"
    )
    assert run.imported == run.expected, where
