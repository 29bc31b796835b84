"""Real environments: a plain Python class whose public methods are the tools.

This module owns turning such a class into OpenAI function schemas (with ``transformers.utils.get_json_schema``,
so each public method needs type hints and a Google-style docstring with an ``Args:`` section) and executing parsed
tool calls against an instance. Any class works; nothing in envace has to change to bring your own.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
from typing import Any

from envace.types import EnvSpec, ToolCall


class EnvironmentClassError(ValueError):
    """An environment class cannot be imported or turned into tool schemas."""


def import_class(class_path: str) -> type:
    """Import ``package.module.ClassName``.

    Args:
        class_path: dotted path of the class.

    Raises:
        EnvironmentClassError: the module or the class does not exist, or the object is not a class.
    """
    module_name, _, class_name = class_path.rpartition(".")
    if not module_name:
        raise EnvironmentClassError(f"environment class '{class_path}' not found: expected 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentClassError(f"environment class '{class_path}' not found: {exc}") from exc
    cls = vars(module).get(class_name)
    if not inspect.isclass(cls):
        raise EnvironmentClassError(
            f"environment class '{class_path}' not found: module '{module_name}' has no class '{class_name}'"
        )
    return cls


def public_methods(cls: type) -> list[str]:
    """Names of the public plain methods of ``cls`` (own and inherited), in definition order, base classes first."""
    names: list[str] = []
    for klass in reversed(cls.__mro__[:-1]):  # skip ``object``
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value) and name not in names:
                names.append(name)
    return names


@functools.lru_cache(maxsize=64)
def _schemas(cls: type) -> tuple[dict[str, Any], ...]:
    from transformers.utils import get_json_schema  # heavy import: only when a schema is derived

    schemas = []
    for name in public_methods(cls):
        try:
            schemas.append(get_json_schema(inspect.getattr_static(cls, name)))
        except Exception as exc:  # noqa: BLE001 - transformers raises several types; all mean "not convertible"
            message = " ".join(str(exc).split())
            raise EnvironmentClassError(
                f"tool method '{cls.__qualname__}.{name}' cannot be converted to a JSON schema (it needs type hints "
                f"and a Google-style docstring with an 'Args:' section): {message}"
            ) from exc
    return tuple(schemas)


def tool_schemas_from_class(cls: type) -> list[dict[str, Any]]:
    """OpenAI function schemas (``{"type": "function", "function": {...}}``) of the public methods of ``cls``.

    Args:
        cls: the environment class.

    Raises:
        EnvironmentClassError: a public method lacks type hints or a docstring describing its arguments.
    """
    return copy.deepcopy(list(_schemas(cls)))


class RealEnvironment:
    """One live instance of an environment class, executing tool calls.

    Only the class's public methods (its tools) can be called, or, for a toolbox (``is_toolbox``), the names its
    ``tool_names()`` lists; any other name is refused with an error observation.
    A tool that raises produces a normal error observation ``{"error": "<ExcType>: <message>"}``.

    Attributes:
        spec: the environment spec.
        tool_names: names of the callable tools.
        calls_made: number of calls executed (refused names excluded).
    """

    def __init__(self, spec: EnvSpec) -> None:
        """Import the class and instantiate it with a deep copy of ``spec.init_args``.

        Args:
            spec: class path and constructor arguments.
        """
        self.spec = spec
        cls = import_class(spec.class_path)
        self._instance = cls(**copy.deepcopy(spec.init_args))
        self.toolbox = is_toolbox(self._instance)
        names = self._instance.tool_names() if self.toolbox else public_methods(cls)
        self.tool_names: tuple[str, ...] = tuple(names)
        self.calls_made = 0

    @property
    def instance(self) -> Any:
        """The live environment object (for reading its state after an episode, e.g. a benchmark's final orders)."""
        return self._instance

    def execute(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call.

        Args:
            call: the tool call.

        Returns:
            ``(content, ok)``: the JSON text of the return value and True, or an error object's JSON text and False.
        """
        if call.name not in self.tool_names:
            available = ", ".join(self.tool_names)
            return _error_content(f"unknown tool '{call.name}'; available: {available}"), False
        self.calls_made += 1
        if self.toolbox:  # it serialises its own results (and reports its own errors in them)
            return self._instance.call_tool(call.name, copy.deepcopy(call.arguments)), True
        method = getattr(self._instance, call.name)  # safe: the name is one of the class's public methods
        try:
            value = method(**copy.deepcopy(call.arguments))  # the instance may keep (and mutate) what it is given
        except Exception as exc:  # noqa: BLE001 - a tool error is a normal observation
            return _error_content(f"{type(exc).__name__}: {exc}"), False
        return json.dumps(value, ensure_ascii=False, default=str), True


def is_toolbox(instance: Any) -> bool:
    """Whether an environment instance lists and runs its tools itself (a toolbox) rather than as public methods.

    A toolbox defines ``tool_names() -> list[str]`` and ``call_tool(name, arguments) -> str`` (the response text):
    for tool sets known only per instance, such as a benchmark entry's classes or a remote tool server. Its task must
    list its ``tools`` (they cannot be derived from the class).
    """
    return callable(getattr(instance, "tool_names", None)) and callable(getattr(instance, "call_tool", None))


def _error_content(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)
