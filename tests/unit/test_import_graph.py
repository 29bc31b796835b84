"""envace's modules import each other without a circle (every import counts, also one inside a function)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("envace", "callbacks")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (a name imported from a package counts as its submodule if one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_the_import_graph_has_no_circle() -> None:
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


def test_the_checker_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"a"}}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError:
        return
    raise AssertionError("graphlib missed a circle")
