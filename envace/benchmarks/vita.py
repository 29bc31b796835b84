"""VitaBench (Meituan LongCat): task files, the benchmark's own environments, and envace tasks for a simulated user.

No package ships VitaBench: the user supplies the task files (``tasks.json`` / ``tasks_en.json``) and, to run the
environments, a checkout of the benchmark's repository installed with ``pip install -e <vitabench checkout>`` (module
``vita``; its ``vita.config`` wants a ``models.yaml`` next to it). ``docs/benchmarks.md`` section 3 describes both.

- ``load_vita`` reads and validates a task file (errors name the file, the index or line, and the field).
- ``VitaToolbox`` is a task's environment as an envace real environment (a toolbox: ``envace.envs.real.is_toolbox``):
  VitaBench's ``get_environment(task["environment"], language)`` answering ``get_response(ToolCall(...))``, as
  ``tau2_world.Tau2World`` does with tau^2 (VitaBench's code is adapted from tau^2-bench). Where it finds
  these names is the ``BINDINGS`` seam. **Responses are not deterministic**: VitaBench hashes the wall clock into new
  order ids, so two runs of the same calls differ in those ids (normalise them before comparing responses).
- ``to_task`` turns a task into an envace ``Task`` for a simulated user (``Task.user``): the agent greets, the user
  opens the conversation.

The official score (the rubric judge) and the unofficial order proxy live in ``envace.benchmarks.vita_scoring``;
running episodes end to end (policy, simulated user, judge) in ``envace.benchmarks.vita_eval``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace.data.jsonl import json_lines
from envace.errors import UserError

if TYPE_CHECKING:
    from envace.types import Task

DOMAINS = ("delivery", "instore", "ota", "cross_domain")
"""The task domains (``cross_domain`` is the main leaderboard)."""

SINGLE_DOMAINS = ("delivery", "instore", "ota")
"""The domains with an environment module of their own; a task may also name several, comma-separated."""

LANGUAGES = ("english", "chinese")

INSTALL_HINT = ("VitaBench's code is not on PyPI: clone the benchmark's repository (meituan-longcat/vitabench) and "
                "install your checkout with `pip install -e <vitabench checkout>` (module `vita`)")

GREETINGS = {
    "english": "Hello, how can I help you?",
    "chinese": "\u4f60\u597d\uff0c\u8bf7\u95ee\u9700\u8981\u4ec0\u4e48\u670d\u52a1\uff1f",  # "Hello, what do you need?"
}
"""VitaBench's default first agent message: the agent greets, then the simulated user speaks."""

DEFAULT_SYSTEM_PROMPT = """You are a service assistant for {domain}. Current time: {time}.
- Use the tools to find information and to place orders; ask the user for anything you need and cannot look up.
- Use only information from the conversation and from tool results; never make anything up.
- When the user's needs are met, ask whether they need anything else."""
"""The system message when the environment exposes no policy (``get_policy``); ``{domain}`` and ``{time}`` filled."""

USER_GUIDELINES = """You are playing a user talking to a service assistant, as the persona below, to get what your \
instructions describe.
- Write only the user's next message, one short message at a time, in the persona's style.
- Reveal the details of your instructions a few at a time, but make sure every one of them is said at some point.
- Let the assistant do the work: when it offers to place an order, accept. Do not make up facts that are not in your \
instructions; if asked for something you do not know, say so.
- Keep your requirements even if the assistant suggests changing them.
- When everything is done correctly, or the assistant says it cannot be done, write ###STOP###."""
"""Simulation guidelines after VitaBench's user simulator prompt (``envace.worlds.users.ModelUser(guidelines=...)``)."""


# ---------------------------------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------------------------------


class VitaFormatError(UserError, ValueError):
    """A VitaBench task file that cannot be read, or a task with a missing or malformed field."""


@dataclass(frozen=True)
class VitaTask:
    """One VitaBench task.

    Attributes:
        id: the task id (as a string).
        domain: ``delivery``, ``instore``, ``ota``, ``cross_domain``, or several single domains comma-separated.
        instructions: what the simulated user wants (also shown to the judge).
        raw: the task object as the file holds it (``environment``, ``user_scenario``, ``evaluation_criteria``, ...).
        source: the task file it was loaded from (what ``VitaToolbox`` reloads it from).
    """

    id: str
    domain: str
    instructions: str
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)
    source: str = ""

    @property
    def environment(self) -> dict[str, Any]:
        """The task's own environment database (stores, orders, time, user id, ...)."""
        return self.raw["environment"]

    @property
    def time(self) -> str:
        """The environment's current time (``environment.time``), or an empty string."""
        return str(self.environment.get("time") or "")

    @property
    def expected_states(self) -> list[dict[str, Any]]:
        """The evaluation criteria's expected states."""
        return self.raw["evaluation_criteria"].get("expected_states") or []

    @property
    def rubrics(self) -> tuple[str, ...]:
        """Every rubric the judge checks: the states' ``state_rubrics`` then ``overall_rubrics``, duplicates once."""
        states = [r for s in self.expected_states for r in s.get("state_rubrics") or []]
        overall = self.raw["evaluation_criteria"].get("overall_rubrics") or []
        return tuple(dict.fromkeys(states + list(overall)))

    @property
    def required_orders(self) -> list[dict[str, Any]]:
        """The union of the expected states' ``required_orders`` (identical orders once)."""
        orders = [o for s in self.expected_states for o in s.get("required_orders") or []]
        unique = {json.dumps(o, sort_keys=True, ensure_ascii=False): o for o in orders}
        return list(unique.values())


def _fail(where: str, name: str, problem: str) -> VitaFormatError:
    return VitaFormatError(f"{where}: field '{name}': {problem}")


def _object(raw: dict[str, Any], key: str, where: str, prefix: str = "") -> dict[str, Any]:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise _fail(where, prefix + key, f"must be an object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _optional_list(raw: dict[str, Any], key: str, where: str, name: str, item: type, item_kind: str) -> list[Any]:
    """``raw[key]``: missing or null is empty (VitaBench's models make it optional), else a list of ``item``."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
        raise _fail(where, name, f"must be a list of {item_kind}")
    return value


def _check_criteria(raw: dict[str, Any], where: str) -> None:
    criteria = _object(raw, "evaluation_criteria", where)
    states = _optional_list(criteria, "expected_states", where, "evaluation_criteria.expected_states", dict,
                            "objects")
    for index, state in enumerate(states):
        name = f"evaluation_criteria.expected_states[{index}]"
        for key in ("required_orders", "optional_orders"):
            _optional_list(state, key, where, f"{name}.{key}", dict, "objects (orders)")
        _optional_list(state, "state_rubrics", where, f"{name}.state_rubrics", str, "strings")
    _optional_list(criteria, "overall_rubrics", where, "evaluation_criteria.overall_rubrics", str, "strings")


def _check_domain(value: Any, where: str) -> str:
    parts = value.split(",") if isinstance(value, str) else []
    if value in DOMAINS or (parts and all(p.strip() in SINGLE_DOMAINS for p in parts)):
        return value
    raise _fail(where, "domain", f"must be one of {', '.join(DOMAINS)} (or single domains comma-separated), "
                                 f"got {json.dumps(value, ensure_ascii=False)}")


def parse_vita_task(raw: Any, where: str, source: str = "") -> VitaTask:
    """One task from its JSON object, checking the fields this harness uses.

    Args:
        raw: the decoded JSON object.
        where: where it came from, for errors (``file[index]`` or ``file:line``).
        source: the task file, kept on the task.

    Raises:
        VitaFormatError: a missing or malformed field, named with ``where``.
    """
    if not isinstance(raw, dict):
        raise VitaFormatError(f"{where}: a task must be a JSON object, got {_kind(raw)}")
    for key in ("id", "domain", "environment", "instructions", "user_scenario", "evaluation_criteria"):
        if key not in raw:
            raise VitaFormatError(f"{where}: missing field '{key}'")
    if isinstance(raw["id"], bool) or not isinstance(raw["id"], (str, int)) or str(raw["id"]) == "":
        raise _fail(where, "id", "must be a non-empty string or an integer")
    if not isinstance(raw["instructions"], str):
        raise _fail(where, "instructions", f"must be a string, got {_kind(raw['instructions'])}")
    _object(raw, "environment", where)
    _object(_object(raw, "user_scenario", where), "user_profile", where, "user_scenario.")
    _check_criteria(raw, where)
    history = raw.get("message_history")
    if history is not None and not (isinstance(history, list) and all(isinstance(m, dict) and "role" in m
                                                                         for m in history)):
        raise _fail(where, "message_history", "must be a list of messages with a 'role'")
    return VitaTask(str(raw["id"]), _check_domain(raw["domain"], where), raw["instructions"], raw, source)


def _read_records(path: Path) -> list[tuple[str, Any]]:
    """``(where, decoded object)`` per task: a JSON array, or JSON Lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise VitaFormatError(f"{path}: cannot read the task file: {exc}") from exc
    if text.lstrip().startswith("["):
        try:
            return [(f"{path}[{i}]", raw) for i, raw in enumerate(json.loads(text))]
        except json.JSONDecodeError as exc:
            raise VitaFormatError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
    return json_lines(text, path, VitaFormatError)


def _select(tasks: list[VitaTask], ids: Sequence[str], path: Path) -> list[VitaTask]:
    by_id = {t.id: t for t in tasks}
    unknown = [str(i) for i in ids if str(i) not in by_id]
    if unknown:
        raise VitaFormatError(f"{path}: unknown task id(s) {unknown}; {len(by_id)} valid, e.g. {list(by_id)[:3]}")
    return [by_id[str(i)] for i in ids]


def load_vita(path: str | Path, ids: Sequence[str] | None = None) -> list[VitaTask]:
    """Tasks from a VitaBench task file: a JSON array (the released ``tasks.json`` / ``tasks_en.json``) or JSON Lines.

    Args:
        path: the task file.
        ids: only these tasks, in this order (all when None).

    Raises:
        VitaFormatError: unreadable JSON or a malformed task (with the file, the index or line, and the field); a
            duplicate id; an unknown id in ``ids`` (with examples of valid ones).
    """
    path = Path(path)
    tasks: list[VitaTask] = []
    first_seen: dict[str, str] = {}
    for where, raw in _read_records(path):
        task = parse_vita_task(raw, where, str(path))
        if task.id in first_seen:
            raise VitaFormatError(f"{where}: duplicate task id '{task.id}' (first at {first_seen[task.id]})")
        first_seen[task.id] = where
        tasks.append(task)
    return tasks if ids is None else _select(tasks, ids, path)


@functools.lru_cache(maxsize=8)
def _cached_file(path: str, mtime_ns: int, size: int) -> dict[str, VitaTask]:
    return {t.id: t for t in load_vita(path)}


def _task_from_file(path: str | Path, task_id: str) -> VitaTask:
    """One task of a file, the file parsed once per version (environments are built per episode)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    tasks = _cached_file(str(resolved), stat.st_mtime_ns, stat.st_size)
    if str(task_id) not in tasks:
        raise VitaFormatError(f"{path}: unknown task id(s) ['{task_id}']; {len(tasks)} valid, e.g. {list(tasks)[:3]}")
    return tasks[str(task_id)]


# ---------------------------------------------------------------------------------------------------------------------
# The benchmark's environment
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VitaBindings:
    """Where envace finds VitaBench's code: the one seam to change if a checkout moved these names.

    Attributes:
        environment_module: per single domain, the module whose ``get_environment(db, language)`` builds it.
        cross_environment: dotted path of ``get_cross_environment(domains, db, language)``, for several domains.
        cross_domains: the domains a ``cross_domain`` task combines (comma-separated, as VitaBench's CLI takes them).
        tool_call: dotted path of the ``ToolCall(id, name, arguments, requestor)`` class ``get_response`` takes.
    """

    environment_module: str = "vita.domains.{domain}.environment"
    cross_environment: str = "vita.environment.environment.get_cross_environment"
    cross_domains: str = "delivery,instore,ota"
    tool_call: str = "vita.data_model.message.ToolCall"


BINDINGS = VitaBindings()
"""The bindings in use; replace it (``envace.benchmarks.vita.BINDINGS = VitaBindings(...)``) to point elsewhere."""


def require_vita() -> Any:
    """Import VitaBench's package ``vita`` (its per-call logging off), or say how to install it.

    Raises:
        ImportError: the package is missing, in one line saying how to install the user's checkout.
    """
    try:
        vita = importlib.import_module("vita")
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    try:
        from loguru import logger

        logger.disable("vita")  # it logs every tool response
    except ImportError:
        pass
    return vita


def _resolve(dotted: str) -> Any:
    """The object at ``package.module.name`` in the user's VitaBench checkout."""
    require_vita()
    module_name, _, name = dotted.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"your VitaBench checkout has no '{dotted}' ({exc}); point "
                          "envace.benchmarks.vita.BINDINGS at where it lives") from exc
    return found


def build_environment(domain: str, environment: dict[str, Any], language: str = "english") -> Any:
    """VitaBench's environment for one task's database (a fresh one per call).

    Args:
        domain: the task's domain.
        environment: the task's ``environment`` object (VitaBench validates it into its own database models).
        language: ``english`` or ``chinese`` (tool descriptions and the agent policy).

    Raises:
        ImportError: VitaBench's code is not installed, or lacks a bound name.
        ValueError: an unknown language.
    """
    if language not in LANGUAGES:
        raise ValueError(f"unknown VitaBench language '{language}'; valid: {', '.join(LANGUAGES)}")
    domains = BINDINGS.cross_domains if domain == "cross_domain" else domain
    environment = copy.deepcopy(environment)  # the loaded task stays as the file holds it
    if "," in domains:
        return _resolve(BINDINGS.cross_environment)(domains, environment, language)
    return _resolve(BINDINGS.environment_module.format(domain=domains) + ".get_environment")(environment, language)


def _plain(value: Any) -> Any:
    """Pydantic models and containers as plain JSON-like values."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class VitaToolbox:
    """A VitaBench task's environment as an envace real environment (a toolbox: ``envace.envs.real.is_toolbox``).

    Each instance is a fresh environment built from the task's own database. Calls go through VitaBench's
    ``Environment.get_response(ToolCall(...))``, which serialises results and reports tool errors as ``Error: ...``
    contents, exactly as the benchmark's orchestrator sees them. New order ids hash the wall clock, so responses that
    create orders differ between runs.

    Args:
        path: the task file (``VitaTask.source``).
        task_id: the task's id.
        language: ``english`` or ``chinese``.
    """

    def __init__(self, path: str, task_id: str, language: str = "english") -> None:
        self.task = _task_from_file(path, task_id)
        self.env = build_environment(self.task.domain, self.task.environment, language)
        self._tool_call = _resolve(BINDINGS.tool_call)
        self.calls_made = 0

    def tool_names(self) -> list[str]:
        """The names of the environment's tools."""
        return [tool.name for tool in self.env.get_tools()]

    def schemas(self) -> list[dict[str, Any]]:
        """The tools as OpenAI function schemas."""
        return [tool.openai_schema for tool in self.env.get_tools()]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one call as the agent's; the tool message's content."""
        call = self._tool_call(id=f"call_{self.calls_made}", name=name, arguments=dict(arguments),
                               requestor="assistant")
        self.calls_made += 1
        return self.env.get_response(call).content or ""

    def policy(self) -> str | None:
        """The environment's agent policy (its ``{time}`` slot filled), or None when it exposes none."""
        get_policy = getattr(self.env, "get_policy", None)
        return _fill_policy(get_policy(), self.task.time) if callable(get_policy) else None

    def orders(self) -> list[dict[str, Any]]:
        """The orders in the environment's database now, as plain dicts (the final orders ``order_match`` reads).

        VitaBench keeps them in ``env.tools.db.orders`` (order id -> ``Order``); this method is the seam to change if
        a checkout keeps them elsewhere. Orders the task's database started with are included.
        """
        db = getattr(getattr(self.env, "tools", None), "db", None)
        orders = getattr(db, "orders", None) or {}
        return [_plain(order) for order in orders.values()]


def _fill_policy(policy: str | None, time: str) -> str | None:
    return policy.replace("{time}", time) if policy else None


def tool_schemas(task: VitaTask, language: str = "english") -> list[dict[str, Any]]:
    """The task's tools as OpenAI function schemas (from a fresh environment of its database)."""
    return [tool.openai_schema for tool in build_environment(task.domain, task.environment, language).get_tools()]


# ---------------------------------------------------------------------------------------------------------------------
# envace tasks
# ---------------------------------------------------------------------------------------------------------------------


def _weekday(time: str) -> str:
    try:
        return datetime.strptime(time, "%Y-%m-%d %H:%M:%S").strftime("%A")
    except ValueError:
        return ""


def time_with_weekday(time: str) -> str:
    """The task time with its weekday (``2025-06-21 11:20:00 (Saturday)``), as shown to the user and the judge."""
    day = _weekday(time)
    return f"{time} ({day})" if day else time or "unknown"


def _profile_lines(profile: dict[str, Any]) -> list[str]:
    return [f"- {key}: {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
            for key, value in profile.items()]


def user_instructions(task: VitaTask) -> str:
    """The simulated user's instructions: the current time, the persona (``user_profile``) and ``instructions``."""
    profile = task.raw["user_scenario"]["user_profile"]
    return "\n".join([f"Current time: {time_with_weekday(task.time)}", "", "# Persona", *_profile_lines(profile), "",
                      "# Instructions", task.instructions])


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments") or {}
    return {"type": "function", "function": {"name": call.get("name", ""), "arguments": arguments}}


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A VitaBench history message in envace's OpenAI format (content always a string)."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message["role"] == "tool":
        out["name"] = message.get("name", "")
    elif message.get("tool_calls"):
        out["tool_calls"] = [_openai_call(c) for c in message["tool_calls"]]
    return out


def to_task(task: VitaTask, system_prompt: str | None = None, language: str = "english") -> Task:
    """The task as an envace ``Task`` played against a simulated user (``Task.user``).

    ``messages`` is a system message (``system_prompt``, else the environment's agent policy with the time filled,
    else ``DEFAULT_SYSTEM_PROMPT``) followed by the task's ``message_history`` when it has one, else VitaBench's
    greeting, so that the simulated user opens. History tool calls are shown, not replayed: the task's database is
    already the state after them. The environment is this task's ``VitaToolbox``; ``success`` is empty because the
    score is the rubric judge's (``envace.benchmarks.vita_scoring.score_vita``).

    Raises:
        ValueError: a task not loaded from a file (the toolbox reloads it from ``task.source``).
        ImportError: VitaBench's code is not installed (the tools come from its environment).
    """
    from envace.types import EnvSpec, SuccessSpec, Task

    if not task.source:
        raise ValueError(f"VitaBench task {task.id} has no source file: load it with load_vita")
    toolbox = VitaToolbox(task.source, task.id, language)
    default = DEFAULT_SYSTEM_PROMPT.format(domain=task.domain, time=time_with_weekday(task.time))
    system = system_prompt or toolbox.policy() or default
    history = [_openai_message(m) for m in task.raw.get("message_history") or []]
    opening = history or [{"role": "assistant", "content": GREETINGS[language]}]
    return Task(
        id=task.id,
        messages=({"role": "system", "content": system}, *opening),
        tools=tuple(toolbox.schemas()),
        success=SuccessSpec(calls=(), answer=None),
        environment=EnvSpec("envace.benchmarks.vita.VitaToolbox",
                            {"path": task.source, "task_id": task.id, "language": language}),
        user=user_instructions(task),
    )
