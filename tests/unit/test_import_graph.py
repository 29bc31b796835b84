"""envace's modules import each other without a circle, and its packages only downwards (every import counts, also
one inside a function).

``LAYERS`` is the layering of docs/design.md ("The packages"), bottom first: a package may import its own modules and
the packages of lower layers, never one of its own layer or above. Each package's ``__init__.py`` says the same in its
"May import" line.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("envace", "callbacks")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("types", "errors", "prompts", "templates"),
    ("runtime", "losses"),
    ("envs", "roles"),
    ("data",),
    ("builtin",),
    ("policy",),
    ("engines",),
    ("worlds",),
    ("rewards", "rollout"),
    ("world_model",),
    ("benchmarks",),
    ("evaluation",),
    ("training",),
    ("cli",),
    ("callbacks",),
)
"""envace's packages (and its two top modules, ``types`` and ``errors``) in layers, bottom first; ``callbacks`` is the
repository's callbacks package. ``envace/__init__.py`` and ``envace/__main__.py`` sit outside the layers."""
TOP = ("envace", "envace.__main__")


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


def _unit(module: str) -> str:
    """The layered unit of a module: its package under envace (or types/errors), or ``callbacks``."""
    parts = module.split(".")
    return "callbacks" if parts[0] == "callbacks" else parts[1]


def _climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a package at its own layer or above (other than its own modules)."""
    level = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    found = []
    for name, targets in graph.items():
        if name in TOP:
            continue
        for target in targets:
            if target in TOP:
                found.append(f"{name} imports {target} (the top package's own modules sit outside the layers)")
            elif _unit(target) != _unit(name) and level[_unit(target)] >= level[_unit(name)]:
                found.append(f"{name} imports {target}: {_unit(target)} is not below {_unit(name)}")
    return sorted(found)


def test_every_package_is_in_a_layer() -> None:
    units = {_unit(name) for name in _modules() if name not in TOP}
    placed = {unit for layer in LAYERS for unit in layer}
    assert units == placed, f"packages without a layer: {sorted(units - placed)}; layers without a package: " \
                            f"{sorted(placed - units)}"


def test_packages_import_only_downwards() -> None:
    modules = _modules()
    assert _climbs({name: _imported(name, path, modules) for name, path in modules.items()}) == []


def test_the_layer_check_sees_a_climb() -> None:
    graph = {"envace.policy.hf": {"envace.worlds.base"}, "envace.worlds.base": {"envace.policy.chat"},
             "envace.rewards.base": {"envace.rollout.runner"}, "envace.rollout.runner": {"envace.rollout.rules"}}
    assert _climbs(graph) == [
        "envace.policy.hf imports envace.worlds.base: worlds is not below policy",
        "envace.rewards.base imports envace.rollout.runner: rollout is not below rewards",
    ]


def test_every_package_states_its_role_and_imports() -> None:
    for init in sorted((ROOT / "envace").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import:" in doc, f"{init.relative_to(ROOT)}: its docstring must say what it may import"
