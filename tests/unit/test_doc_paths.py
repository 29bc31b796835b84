"""Every dotted envace name the configs, the docs and the README use resolves: a class path, a module, a function.

A config's ``class_path``, a command line's ``--key=envace.x.Y`` and a doc's ``envace.x.y`` all name code by where it
lives; after code moves, a stale one would send a user to nothing. Each name is imported (its longest importable
module prefix) and the rest read as attributes; names in ``NOT_CODE`` are not Python paths.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FILES = sorted([*ROOT.glob("lit_configs/*.yaml"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
                ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"])
NAME = re.compile(r"(?<![\w./-])((?:envace|callbacks)(?:\.[A-Za-z_]\w*)+)")
NOT_CODE = {"envace.log"}
"""Dotted words that are not code paths (a file name)."""


def _resolve(name: str) -> str | None:
    """None when ``name`` resolves, else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            fields = getattr(target, "__dataclass_fields__", {})
            if attribute in fields:  # a dataclass field without a class-level default
                return None
            if not hasattr(target, attribute):
                return f"{'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}"
            target = getattr(target, attribute)
        return None
    return "no such module"


def _names() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in FILES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in NAME.finditer(line):
                name = match.group(1).rstrip(".")
                if name.endswith((".py", ".md", ".yaml", ".json", ".jsonl", ".txt")) or name in NOT_CODE:
                    continue
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_the_files_name_code() -> None:
    names = _names()
    assert len(names) > 50 and "envace.training.sft.SFTModule" in names


@pytest.mark.parametrize("name", sorted(_names()))
def test_a_named_path_resolves(name: str) -> None:
    reason = _resolve(name)
    assert reason is None, f"{name} ({', '.join(_names()[name][:3])}): {reason}"
