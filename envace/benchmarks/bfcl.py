"""BFCL-v4 multi-turn: the entries of the pinned ``bfcl-eval`` package, a safe executor, and BFCL's own checker.

The four multi-turn categories run on BFCL's executable Python environments (file system, trading bot, travel,
vehicle, messages, posting, tickets, math). envace never ``eval``s model output:

- ``parse_calls`` reads BFCL's Python-call syntax (``[f(a=1), g('x')]``) with ``ast``: every call must be a plain
  function name with literal arguments, anything else is refused (``UnsafeCallError``);
- ``BFCLEnvironment`` holds one fresh instance of each involved class per rollout and calls the method by name
  (``getattr`` on a public method of an involved class), serialising results as BFCL does;
- scoring uses BFCL's ``multi_turn_checker`` (state check and response check per turn, as the benchmark authors
  score it). That checker ``eval``s call strings, so it only ever gets ``canonical_call`` strings rebuilt from parsed,
  literal-only calls; its module-level instance cache is cleared after every check.

The package is an optional dependency (installed by ``scripts/setup_env.sh``); ``require_bfcl`` names it when it is
missing. Importing ``bfcl_eval``'s configuration writes folders under ``BFCL_PROJECT_ROOT``, which is pointed at a
temporary folder unless the user set it.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
"""The multi-turn categories (each 200 entries in bfcl-eval 2026.3.23)."""

PACKAGE_HINT = "pip install --no-deps bfcl-eval==2026.3.23 (scripts/setup_env.sh installs it with its light needs)"


def require_bfcl() -> Any:
    """Import ``bfcl_eval`` (with ``BFCL_PROJECT_ROOT`` outside site-packages), or say how to install it.

    Raises:
        ImportError: the package is missing, in one line naming the install.
    """
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "envace-bfcl"))
    try:
        return importlib.import_module("bfcl_eval")
    except ImportError as exc:
        raise ImportError(f"BFCL needs the optional package bfcl-eval: {PACKAGE_HINT}") from exc


def _data_dir() -> Path:
    return Path(require_bfcl().__file__).parent / "data"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BFCLEntry:
    """One multi-turn entry with its ground truth.

    Attributes:
        id: e.g. ``multi_turn_base_0``.
        category: one of ``MULTI_TURN``.
        turns: the user messages of each turn (a turn may be empty in ``miss_func``).
        ground_truth: the gold calls of each turn, in BFCL's Python-call syntax.
        raw: the entry as the package ships it (``initial_config``, ``involved_classes``, ``excluded_function``,
            ``missed_function``, ...): BFCL's checker reads it.
    """

    id: str
    category: str
    turns: tuple[tuple[dict[str, Any], ...], ...]
    ground_truth: tuple[tuple[str, ...], ...]
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def involved_classes(self) -> list[str]:
        """The environment classes the entry uses."""
        return list(self.raw["involved_classes"])

    @property
    def long_context(self) -> bool:
        """The long-context variant of the environments (BFCL's own rule)."""
        return "long_context" in self.category


@cache
def _category_files(category: str) -> tuple[tuple[dict[str, Any], ...], dict[str, list[list[str]]]]:
    data = _data_dir()
    entries = tuple(_jsonl(data / f"BFCL_v4_{category}.json"))
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return entries, answers


def load_multi_turn(category: str, ids: list[str] | None = None, limit: int | None = None) -> list[BFCLEntry]:
    """The entries of a multi-turn category (all, the given ``ids``, or the first ``limit``).

    Raises:
        ValueError: an unknown category or id (the valid ones are listed).
        ImportError: bfcl-eval is not installed.
    """
    if category not in MULTI_TURN:
        raise ValueError(f"unknown BFCL multi-turn category '{category}'; valid: {', '.join(MULTI_TURN)}")
    raws, answers = _category_files(category)
    by_id = {raw["id"]: raw for raw in raws}
    if ids is not None:
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            sample = ", ".join(list(by_id)[:3])
            raise ValueError(f"unknown {category} id(s) {unknown}; valid ids are {category}_0 to "
                             f"{category}_{len(by_id) - 1} (e.g. {sample})")
        raws = tuple(by_id[i] for i in ids)
    raws = raws[:limit] if limit is not None else raws
    return [
        BFCLEntry(raw["id"], category, tuple(tuple(t) for t in raw["question"]),
                  tuple(tuple(calls) for calls in answers[raw["id"]]), raw)
        for raw in raws
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Safe calls
# ---------------------------------------------------------------------------------------------------------------------


class UnsafeCallError(ValueError):
    """Text that is not a list of plain function calls with literal arguments."""


@dataclass(frozen=True)
class PyCall:
    """A parsed call: a function name, literal positional arguments and literal keyword arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as exc:
        raise UnsafeCallError(f"not a literal argument in {text!r}: {ast.unparse(node)}") from exc


def _call(node: ast.expr, text: str) -> PyCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise UnsafeCallError(f"not a plain function call in {text!r}: {ast.unparse(node)}")
    if any(k.arg is None for k in node.keywords):
        raise UnsafeCallError(f"**kwargs are not allowed in {text!r}")
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise UnsafeCallError(f"*args are not allowed in {text!r}")
    args = tuple(_literal(a, text) for a in node.args)
    kwargs = tuple((k.arg, _literal(k.value, text)) for k in node.keywords if k.arg is not None)
    return PyCall(node.func.id, args, kwargs)


def parse_calls(text: str) -> list[PyCall]:
    """Calls from BFCL's Python syntax: one call ``f(a=1)`` or a list ``[f(a=1), g('x')]``.

    Raises:
        UnsafeCallError: not Python, or something other than plain calls with literal arguments.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise UnsafeCallError(f"not Python call syntax: {text!r}") from exc
    nodes = tree.elts if isinstance(tree, ast.List | ast.Tuple) else [tree]
    return [_call(node, text) for node in nodes]


def canonical_call(call: PyCall) -> str:
    """``name(arg, key=value)`` with ``repr`` literals: the only form handed to BFCL's ``eval``-based checker."""
    parts = [repr(a) for a in call.args] + [f"{k}={v!r}" for k, v in call.kwargs]
    return f"{call.name}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------------------------------------
# The executable environment
# ---------------------------------------------------------------------------------------------------------------------


def _serialise(value: Any) -> str:
    """BFCL's serialisation of a result: strings as they are, dicts as JSON (``str`` if not JSON), else ``str``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class BFCLEnvironment:
    """Fresh instances of an entry's classes, loaded with its initial configuration; calls run by method name."""

    def __init__(self, entry: BFCLEntry) -> None:
        require_bfcl()
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for name in entry.involved_classes:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
            instance = cls()
            if name not in STATELESS_CLASSES:
                config = copy.deepcopy(entry.raw["initial_config"].get(name, {}))
                instance._load_scenario(config, long_context=entry.long_context)
            self.instances[name] = instance
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self.methods[method_name] = method

    def execute(self, call: PyCall) -> str:
        """Run one call; an unknown function or a raising tool gives BFCL's ``Error during execution: ...``."""
        method = self.methods.get(call.name)
        if method is None:
            return f"Error during execution: name '{call.name}' is not defined"
        try:
            return _serialise(method(*call.args, **dict(call.kwargs)))
        except Exception as exc:  # noqa: BLE001 - a tool error is an observation, as in BFCL
            return f"Error during execution: {exc}"


# ---------------------------------------------------------------------------------------------------------------------
# Scoring with BFCL's checker
# ---------------------------------------------------------------------------------------------------------------------


def check_multi_turn(entry: BFCLEntry, calls: list[list[list[PyCall]]]) -> dict[str, Any]:
    """BFCL's verdict on a rollout's calls (``calls[turn][step]``): ``{"valid": bool, ...}``.

    Turns the ground truth leaves empty must have no call (``multi_turn_irrelevance_checker``); every other turn is
    checked by ``multi_turn_checker``. Only ``canonical_call`` strings reach the checker's ``eval``.
    """
    require_bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    if len(calls) != len(entry.ground_truth):
        raise ValueError(f"{entry.id}: {len(calls)} turns of calls for {len(entry.ground_truth)} turns")
    decoded = [[[canonical_call(c) for c in step] for step in turn] for turn in calls]
    truth = [list(turn) for turn in entry.ground_truth]
    irrelevance = checker.multi_turn_irrelevance_checker(decoded, truth)
    if not irrelevance["valid"]:
        return irrelevance
    model_name = f"envace_{uuid.uuid4().hex}"  # BFCL caches instances in module globals, keyed by model name
    try:
        return checker.multi_turn_checker(decoded, truth, entry.raw, entry.category, model_name)
    finally:
        cache_globals = vars(multi_turn_utils)
        for key in [k for k in cache_globals if k.startswith(model_name)]:
            del cache_globals[key]


def gold_calls(entry: BFCLEntry) -> list[list[list[PyCall]]]:
    """The ground truth as a rollout: each turn's gold calls in one step (no step for an empty turn)."""
    return [[[c for text in turn for c in parse_calls(text)]] if turn else [] for turn in entry.ground_truth]
