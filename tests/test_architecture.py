"""The module stack of ARCHITECTURE.md holds: no import cycle inside ``companion``, no import
from a higher layer, no private name imported from another module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "companion"

#: Each module's layer, lowest first; a module may import only from lower layers. The same
#: table, drawn, is in ARCHITECTURE.md: a new module gets a row in both.
LAYERS: dict[str, int] = {
    "companion._validation": 0,
    "companion._files": 0,
    "companion.dropout": 0,
    "companion.distributed": 0,
    "companion.masking": 1,
    "companion.positional": 1,
    "companion.cache": 1,
    "companion.utils": 1,
    "companion.reference_runs": 1,
    "companion.viz": 1,
    "companion.data.vocab": 1,
    "companion.exercises._checker": 1,
    "companion.data.induction": 1,
    "companion.kernels": 2,
    "companion.baselines": 2,
    "companion._attention_checks": 2,
    "companion.attention": 3,
    "companion.efficient_attention": 3,
    "companion.data.toy": 3,
    "companion.data.objectives": 3,
    "companion.data.batching": 3,
    "companion.data.download": 3,
    "companion.exercises": 3,
    "companion.exercises.ch05": 3,
    "companion.exercises.ch08": 3,
    "companion.exercises.ch09": 3,
    "companion.layers": 4,
    "companion.exercises.ch04": 4,
    "companion.exercises.ch02": 4,  # refuses calls into companion.efficient_attention (layer 3)
    "companion.exercises.ch03": 4,  # checks a trained companion.attention.MultiHeadAttention (layer 3)
    "companion.exercises.ch01": 4,  # refuses calls into companion.attention (layer 3)
    "companion.clinic.patient": 4,
    "companion.measure": 4,
    "companion.latent_attention": 4,
    "companion.data.multi30k": 4,
    "companion.model": 5,
    "companion.clinic.ward1": 5,
    "companion.clinic.ward2": 5,
    "companion.data.prepare": 5,
    "companion.data.lm": 5,
    "companion.moe": 5,
    "companion.data": 6,
    "companion.interop": 6,
    "companion.checkpoint": 6,
    "companion.configs": 6,
    "companion.clinic.toolkit": 6,
    "companion.clinic.registry": 6,
    "companion.clinic": 7,
    "companion.decode": 7,
    "companion.train": 7,
    "companion.history": 8,
    "companion.metrics": 8,
    "companion.exercises.ch07": 8,
    "companion.exercises.ch11": 8,
    "companion.families": 8,
    "companion.norm_study": 8,
    "companion.exercises.ch06": 9,  # measures with companion.norm_study's setup (layer 8)
    "companion.exercises.ch10": 9,  # uses companion.metrics.clustered_se (layer 8)
    "companion.trainer": 9,
    "companion.run": 10,
    "companion": 11,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every ``companion`` import in the file, lazy ones and those of a
    script's ``if __name__ == "__main__":`` block included (a module's command line that
    imports a higher layer is a cycle too: ``train -> run -> trainer -> train``)."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "companion":
                found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "companion":
                    found.append((alias.name, []))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        targets = set()
        for module, names in imports(path):
            targets.add(module)
            for imported in names:  # `from companion import viz` imports the module viz
                if f"{module}.{imported}" in LAYERS:
                    targets.add(f"{module}.{imported}")
                    targets.discard(module)
        edges[name] = targets - {name}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(graph()) - set(LAYERS))
    assert not missing, f"add these modules to LAYERS here and to ARCHITECTURE.md: {missing}"


def test_no_import_cycle() -> None:
    assert find_cycle(graph()) is None, f"import cycle: {' -> '.join(find_cycle(graph()))}"


def test_find_cycle_finds_one() -> None:  # the detector itself can fail
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_imports_only_from_lower_layers(module: str) -> None:
    upward = sorted(
        target
        for target in graph().get(module, ())
        if target in LAYERS and LAYERS[target] >= LAYERS[module]
    )
    assert not upward, (
        f"{module} (layer {LAYERS[module]}) imports from layer >= its own: "
        + ", ".join(f"{t} (layer {LAYERS[t]})" for t in upward)
    )


def test_no_private_name_imported_from_another_module() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for module, names in imports(path):
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if private and module not in ("companion._validation", "companion._files"):
                offenders.append(f"{module_name(path)}: from {module} import {', '.join(private)}")
    assert not offenders, offenders


def test_imports_in_a_main_block_count(tmp_path: Path) -> None:
    """The detector sees the import of a script's entry point (it used to skip it, and the
    cycle history -> train -> run -> trainer -> history went unnoticed)."""
    script = tmp_path / "script.py"
    script.write_text('if __name__ == "__main__":\n    from companion.run import main\n')
    assert imports(script) == [("companion.run", ["main"])]


def test_train_runs_nothing_above_it_from_the_command_line() -> None:
    assert find_cycle(graph()) is None
    assert "companion.run" not in graph()["companion.train"]
