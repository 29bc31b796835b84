"""Real environments: a plain Python class whose public methods are the tools.

This module owns turning such a class into OpenAI function schemas (with ``transformers.utils.get_json_schema``,
so each public method needs type hints and a Google-style docstring with an ``Args:`` section) and executing parsed
tool calls against an instance. Any class works; nothing in envace has to change to bring your own.

Tool calls run with a timeout (``timeout_s``): the instance is built and every call runs on one worker thread of its
own (so thread-bound state, such as a ``sqlite3`` connection made in the constructor, keeps working), and the caller
waits at most ``timeout_s`` for each. A hung Python thread cannot be killed, so a call that times out is answered with
an error observation and the instance is marked unusable: the hung call may still finish later and change its state.
Any later call on it raises ``EnvironmentUnusable`` (the worlds then fail that episode). The worker is a daemon thread,
so a call that never returns never blocks the interpreter's exit. Signals are never used (not thread-safe, and not
available on every platform).
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import importlib
import inspect
import json
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from envace.errors import UserError
from envace.types import EnvSpec, ToolCall, is_error_text, is_error_value

DEFAULT_TOOL_TIMEOUT_S = 30.0
"""Seconds a real tool call (or an environment's constructor) may take before it is answered with a timeout error."""


class EnvironmentClassError(UserError, ValueError):
    """An environment class cannot be imported or turned into tool schemas."""


class EnvironmentTimeoutError(TimeoutError):
    """An environment's constructor took longer than the tool timeout."""


class EnvironmentUnusable(RuntimeError):
    """A call on an environment instance whose earlier call timed out (its state is unknown)."""


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
    ``tool_names()`` lists (every name, for one with ``accepts_any_name``); any other name is refused with an error
    observation.
    A tool that raises produces a normal error observation ``{"error": "<ExcType>: <message>"}``. A tool that returns
    an error object instead (``{"error": ...}`` with a truthy value, ``envace.types.is_error_value``) is passed on as
    it is, and is an error too (``execute`` says so), as is a toolbox result text holding one. A toolbox's
    ``call_tool`` reports its tools' errors in its results, so an exception escaping it is raised to the caller (a
    world fails the episode), as is an exception of the constructor.

    A call that takes longer than ``timeout_s`` is answered with
    ``{"error": "TimeoutError: tool '<name>' took longer than <N> s"}`` and counted in ``timeouts``; the instance is
    then unusable (``unusable`` says why) and later calls raise ``EnvironmentUnusable`` (see the module docstring).

    Attributes:
        spec: the environment spec.
        tool_names: names of the callable tools.
        calls_made: number of calls executed (refused names excluded).
        timeout_s: the tool timeout in seconds (0: none; calls then run on the caller's thread).
        timeouts: calls that timed out (at most 1: the instance is unusable after the first).
        unusable: why the instance can no longer be called, or None.
    """

    def __init__(self, spec: EnvSpec, timeout_s: float = DEFAULT_TOOL_TIMEOUT_S) -> None:
        """Import the class and instantiate it with a deep copy of ``spec.init_args``.

        Args:
            spec: class path and constructor arguments.
            timeout_s: most seconds the constructor and each tool call may take (0: no limit, no worker thread).

        Raises:
            EnvironmentTimeoutError: the constructor took longer than ``timeout_s``.
            ValueError: a negative ``timeout_s``.
        """
        if not timeout_s >= 0:
            raise ValueError(f"tool timeout must be >= 0 seconds (0: none), got {timeout_s}")
        self.spec = spec
        self.timeout_s = float(timeout_s)
        self.timeouts = 0
        self.unusable: str | None = None
        self._worker = _Worker(f"envace-env-{spec.class_path}") if self.timeout_s > 0 else None
        if self._worker is not None:
            weakref.finalize(self, self._worker.close)  # the thread ends with the instance (or its hung call)
        cls = import_class(spec.class_path)
        args = copy.deepcopy(spec.init_args)
        try:
            built, value = self._run(lambda: cls(**args))
        except concurrent.futures.TimeoutError:
            self._abandon(f"environment '{spec.class_path}' took longer than {self.timeout_s:g} s to construct")
            raise EnvironmentTimeoutError(self.unusable) from None
        if not built:
            raise value
        self._instance = value
        self.toolbox = is_toolbox(self._instance)
        names = self._instance.tool_names() if self.toolbox else public_methods(cls)
        self.tool_names: tuple[str, ...] = tuple(names)
        self.any_name = self.toolbox and bool(getattr(self._instance, "accepts_any_name", False))
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
            ``(content, ok)``: the JSON text of the return value and True, or an error object's JSON text and False
            (the tool raised, timed out or is unknown, or it returned an error object itself).

        Raises:
            EnvironmentUnusable: an earlier call timed out.
            Exception: whatever a toolbox's ``call_tool`` raised (its errors belong in its results).
        """
        if self.unusable is not None:
            raise EnvironmentUnusable(self.unusable)
        if call.name not in self.tool_names and not self.any_name:
            available = ", ".join(self.tool_names)
            return _error_content(f"unknown tool '{call.name}'; available: {available}"), False
        self.calls_made += 1
        arguments = copy.deepcopy(call.arguments)  # the instance may keep (and mutate) what it is given
        if self.toolbox:  # it serialises its own results (and reports its own errors in them)
            run: Callable[[], Any] = functools.partial(self._instance.call_tool, call.name, arguments)
        else:
            run = functools.partial(getattr(self._instance, call.name), **arguments)  # a public method: safe
        try:
            returned, value = self._run(run)
        except concurrent.futures.TimeoutError:
            self.timeouts += 1
            self._abandon(f"tool '{call.name}' of '{self.spec.class_path}' timed out after {self.timeout_s:g} s; "
                          "the instance's state is unknown")
            return _error_content(f"TimeoutError: tool '{call.name}' took longer than {self.timeout_s:g} s"), False
        if self.toolbox:
            if not returned:
                raise value
            return value, not is_error_text(value)
        if not returned:  # a tool error is a normal observation
            return _error_content(f"{type(value).__name__}: {value}"), False
        return json.dumps(value, ensure_ascii=False, default=str), not is_error_value(value)

    def close(self) -> None:
        """Let the worker thread end (it also ends when the instance is garbage-collected)."""
        if self._worker is not None:
            self._worker.close()

    def _run(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """``(True, fn())`` or ``(False, the exception it raised)``, on the worker with the timeout.

        Raises:
            concurrent.futures.TimeoutError: ``fn`` took longer than ``timeout_s`` (only then: an exception ``fn``
                raises, a ``TimeoutError`` included, is returned).
        """
        if self._worker is None:
            return _outcome(fn)
        return self._worker.run(fn, self.timeout_s)

    def _abandon(self, reason: str) -> None:
        self.unusable = reason
        self.close()


class _Worker:
    """One daemon thread running an environment's constructor and calls, in order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable[[], Any]] | None] = (
            queue.SimpleQueue())
        threading.Thread(target=_serve, args=(self._queue,), name=name, daemon=True).start()

    def run(self, fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
        future: concurrent.futures.Future[tuple[bool, Any]] = concurrent.futures.Future()
        self._queue.put((future, fn))
        return future.result(timeout=timeout_s)

    def close(self) -> None:
        self._queue.put(None)


def _serve(jobs: queue.SimpleQueue) -> None:
    """The worker's loop: holds no reference to the environment object between calls."""
    while (job := jobs.get()) is not None:
        future, fn = job
        if future.set_running_or_notify_cancel():
            future.set_result(_outcome(fn))
        del job, future, fn


def _outcome(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as exc:  # noqa: BLE001 - returned to the caller, who decides
        return False, exc


def is_toolbox(instance: Any) -> bool:
    """Whether an environment instance lists and runs its tools itself (a toolbox) rather than as public methods.

    A toolbox defines ``tool_names() -> list[str]`` and ``call_tool(name, arguments) -> str`` (the response text):
    for tool sets known only per instance, such as a benchmark entry's classes or a remote tool server. Its task must
    list its ``tools`` (they cannot be derived from the class). A toolbox with ``accepts_any_name = True`` gets every
    call, whatever its name (a benchmark whose own executor answers unknown names in its own words).
    """
    return callable(getattr(instance, "tool_names", None)) and callable(getattr(instance, "call_tool", None))


def _error_content(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)
