"""BFCL-v4 multi-turn calls and the environment that runs them: a safe reader of call text and a safe executor.

envace never ``eval``s model output:

- ``parse_calls`` reads BFCL's Python-call syntax (``[f(a=1), g('x')]``) with ``ast``: every call must be a plain
  function name with literal arguments, anything else is refused (``UnsafeCallError``); ``canonical_call`` writes
  a parsed call back as the only form handed to BFCL's ``eval``-based checker;
- ``BFCLEnvironment`` holds one fresh instance of each involved class per rollout; a decoded call runs as BFCL's
  executor runs its text (``envace.benchmarks.bfcl_exec``: the same observation, read with ``ast``, never
  ``eval``-ed), a ground-truth call by method name, and results are serialised as BFCL does;
- ``bind_arguments`` names a parsed call's positional arguments from the method's signature.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from envace.benchmarks.bfcl_data import BFCLEntry, require_bfcl

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


class BFCLEnvironment:
    """Fresh instances of an entry's classes, loaded with its initial configuration.

    ``execute_decoded`` runs a decoded call as BFCL's executor runs its text (``envace.benchmarks.bfcl_exec``);
    ``execute`` runs a parsed ground-truth call by method name.

    Attributes:
        instances: BFCL's instance name (``bfcl_exec.instance_name``) -> instance.
        methods: public method name -> bound method (a later class's method wins, as in BFCL's executor).
        method_instances: public method name -> instance name.
    """

    def __init__(self, entry: BFCLEntry) -> None:
        require_bfcl()
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        from envace.benchmarks.bfcl_exec import instance_name

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        self.method_instances: dict[str, str] = {}
        for name in entry.involved_classes:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
            instance = cls()
            if name not in STATELESS_CLASSES:
                config = copy.deepcopy(entry.raw["initial_config"].get(name, {}))
                instance._load_scenario(config, long_context=entry.long_context)
            key = instance_name(entry.id, name)
            self.instances[key] = instance
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self.methods[method_name] = method
                    self.method_instances[method_name] = key

    def execute(self, call: PyCall) -> str:
        """Run one parsed call by method name.

        A refused or unknown name, or a raising tool, gives BFCL's ``Error during execution``.
        """
        from envace.benchmarks.bfcl_exec import FORBIDDEN_NAMES, serialise

        if call.name in FORBIDDEN_NAMES:  # refused by name before anything runs, as BFCL's executor does
            return f"Error during execution: Function call {call.name} is not allowed."
        method = self.methods.get(call.name)
        if method is None:
            return f"Error during execution: name '{call.name}' is not defined"
        args, kwargs = copy.deepcopy((call.args, dict(call.kwargs)))  # the environment may keep (and mutate) them
        try:
            return serialise(method(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - a tool error is an observation, as in BFCL
            return f"Error during execution: {exc}"

    def execute_decoded(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one decoded call as BFCL's executor runs its text (``bfcl_exec.run_text``).

        Text that would do more than call with literal arguments under ``eval`` is not run: it is answered as a
        call of an undefined name (``bfcl_exec.REFUSED``).
        """
        from envace.benchmarks.bfcl_exec import Refused, official_text, refused_observation, run_text

        text = official_text(name, copy.deepcopy(arguments))
        try:
            return run_text(text, self.instances, self.method_instances)
        except Refused as exc:
            return refused_observation(exc)


def bind_arguments(env: BFCLEnvironment, call: PyCall) -> dict[str, Any]:
    """The call's arguments by parameter name (positional ones named from the method's signature)."""
    method = env.methods.get(call.name)
    if method is None:
        return dict(call.kwargs)
    bound = inspect.signature(method).bind_partial(*call.args, **dict(call.kwargs))
    return dict(bound.arguments)
