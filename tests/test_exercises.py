"""Every chapter's hidden solutions pass their own checks; the checker engine reports clearly."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import torch

from companion.exercises import CheckResult, compare, run_check

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
# A solution is a markdown cell that is collapsed in Jupyter, Colab and the HTML book alike:
# <details class="solution"><summary>Solution</summary> ... ```python ...``` ... </details>
SOLUTION = re.compile(
    r'<details class="solution">\s*<summary>Solution</summary>\s*```python\n(.*?)\n```.*?</details>',
    re.DOTALL,
)


def _solutions(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    found = []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            found += SOLUTION.findall(src)
    return found


SOLUTIONS = [(p, i, code) for p in NOTEBOOKS for i, code in enumerate(_solutions(p))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_at_least_three_checked_exercises(path):
    solutions = _solutions(path)
    assert len(solutions) >= 3, f"{path.name}: at least three exercises with a hidden solution"
    for code in solutions:
        assert re.search(r"^assert \w+\.check_\w+\(", code, re.MULTILINE), (
            "a solution ends with its check"
        )


@pytest.mark.parametrize(
    "path,index,code", SOLUTIONS, ids=[f"{p.stem}-{i}" for p, i, _ in SOLUTIONS]
)
def test_hidden_solution_passes_its_check(path, index, code, capsys):
    exec(compile(code, f"{path.name}:solution{index}", "exec"), {"__name__": "__solution__"})
    assert "✅" in capsys.readouterr().out


def _reference(x):
    return x * 2


def _cases():
    gen = torch.Generator().manual_seed(0)
    return [dict(x=torch.randn(3, 4, generator=gen)) for _ in range(3)]


def test_engine_passes_correct_function(capsys):
    result = run_check("double", lambda x: x + x, _reference, _cases())
    assert result and result.cases_run == 3
    assert "all 3 cases" in capsys.readouterr().out


def test_engine_reports_the_largest_mismatch(capsys):
    def wrong(x):
        y = x * 2
        y[1, 2] += 1
        return y

    result = run_check("double", wrong, _reference, _cases())
    assert not result
    out = capsys.readouterr().out
    assert (
        "1 of 12 entries differ; the largest difference is at index (1, 2)" in out
        and "inputs: x: tensor of shape (3, 4)" in out
    )


def test_engine_reports_shape_errors_exceptions_and_stubs():
    assert (
        "wrong shape - expected (3, 4), got (4, 3)"
        in run_check("t", lambda x: (x * 2).T, _reference, _cases(), verbose=False).message
    )
    crashed = run_check("t", lambda x: x @ x, _reference, _cases(), verbose=False)
    assert not crashed and "raised RuntimeError" in crashed.message

    def stub(x):
        raise NotImplementedError

    assert "not attempted yet" in run_check("t", stub, _reference, _cases(), verbose=False).message


def test_engine_does_not_let_the_reader_mutate_inputs():
    def mutating(x):
        x.mul_(2)
        return x

    assert run_check("t", mutating, _reference, _cases(), verbose=False)


def test_compare_rules():
    assert compare((torch.ones(2), 3.0), (torch.ones(2), 3.0)) is None
    assert "expected a tuple of 2 items" in compare((1.0, 2.0), 1.0)
    assert "expected 3" in compare(3.0, 3.5)
    assert (
        compare(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is not None
    )  # NaN never matches
    assert isinstance(run_check("t", _reference, _reference, _cases(), verbose=False), CheckResult)
    with pytest.raises(TypeError, match="must be callable"):
        run_check("t", 3, _reference, _cases())
    with pytest.raises(ValueError, match="no test cases"):
        run_check("t", _reference, _reference, [])


# ---------------------------------------------------------------- every chapter's checks

CHAPTER_MODULES = [
    importlib.import_module(f"companion.exercises.{path.stem}")
    for path in sorted((ROOT / "companion" / "exercises").glob("ch[0-9][0-9].py"))
]
CHECKS = [
    (module, name)
    for module in CHAPTER_MODULES
    for name in sorted(dir(module))
    if name.startswith("check_") and callable(getattr(module, name))
]
CHECK_IDS = [f"{module.__name__.rsplit('.', 1)[1]}.{name}" for module, name in CHECKS]


def test_every_chapter_has_an_exercise_module():
    chapters = {p.stem[:2] for p in NOTEBOOKS}
    modules = {m.__name__[-2:] for m in CHAPTER_MODULES}
    assert chapters <= modules, (
        f"chapters without companion/exercises/chNN.py: {chapters - modules}"
    )


def _exempt(module, name):
    """A check the generic tests cannot run (listed with its reason in the module's
    ``GENERIC_TEST_EXEMPT``; its chapter's own test file covers it)."""
    reason = getattr(module, "GENERIC_TEST_EXEMPT", {}).get(name)
    if reason:
        pytest.skip(f"{module.__name__}.{name}: {reason}")


@pytest.mark.parametrize("module,name", CHECKS, ids=CHECK_IDS)
def test_reference_passes_its_own_check(module, name):
    _exempt(module, name)
    reference = getattr(module, "reference_" + name.removeprefix("check_"), None)
    assert reference is not None, f"{module.__name__}.{name} needs reference_{name[6:]}"
    result = getattr(module, name)(reference, verbose=False)
    assert result and result.cases_run >= 3, result.message


@pytest.mark.parametrize("module,name", CHECKS, ids=CHECK_IDS)
def test_stub_and_crash_are_reported_not_raised(module, name):
    def stub(*args, **kwargs):
        raise NotImplementedError  # your code here

    def crashes(*args, **kwargs):
        raise RuntimeError("boom")

    _exempt(module, name)

    check = getattr(module, name)
    stubbed = check(stub, verbose=False)
    assert not stubbed and "not attempted yet" in stubbed.message
    crashed = check(crashes, verbose=False)
    assert not crashed and "boom" in crashed.message


def test_a_renamed_parameter_gets_a_message_not_a_bare_type_error():
    """The checks pass arguments by name; a reader who renamed the stub's parameters is told
    which names the check passes and what the function has, instead of a bare TypeError."""
    from companion.exercises import ch08

    def noam_lr(s, d_model, warmup):  # `step` renamed
        return 0.0

    result = ch08.check_noam_lr(noam_lr, verbose=False)
    assert not result
    assert "passes the arguments by name (step, d_model, warmup)" in result.message
    assert "(s, d_model, warmup)" in result.message and "keep the parameter names" in result.message

    def flexible(**kwargs):  # binds anything: judged on its values, as before
        return 0.0

    assert "is wrong" in ch08.check_noam_lr(flexible, verbose=False).message


def test_checks_print_only_through_report():
    """A check's message goes out in one write (``_checker.report``): a bare ``print`` in a
    chapter's checks can reach the notebook as two stream messages and show the text twice."""
    import ast

    offenders = []
    for path in sorted((ROOT / "companion" / "exercises").glob("ch*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"print outside _checker.report in: {offenders}"


@pytest.mark.parametrize("number", [f"{n:02d}" for n in range(1, 12)])
def test_every_public_check_is_an_exercise_of_its_chapter(number):
    """A ``check_*`` in ``companion.exercises.chNN`` that the chapter no longer calls is dead
    code that still has to be maintained: drop it with its tests when its exercise goes."""
    module = importlib.import_module(f"companion.exercises.ch{number}")
    (notebook,) = (ROOT / "book").glob(f"{number}_*.ipynb")
    text = notebook.read_text(encoding="utf-8")
    unused = [
        name
        for name in module.__all__
        if name.startswith("check_") and not re.search(rf"\b{name}\(", text)
    ]
    assert not unused, f"{notebook.name} calls none of {unused}"
