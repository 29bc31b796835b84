"""The task file format (JSONL, one task per line) and its loader.

This module owns reading and writing task files and converting records into the frozen ``envace.types.Task``
dataclasses. Every problem is reported as one ``TaskFormatError`` line naming the file, the line and the field, e.g.
``tasks.jsonl:3: field 'tools[0].function.parameters': not a valid JSON schema: ...``. See ``docs/task-format.md``.

Lines are split on ``\\n`` only (a JSON string may hold U+2028 or U+0085 raw). Lines are read with
``envace.roles.parsing.loads_json``: nesting deeper than ``MAX_JSON_DEPTH``, lone surrogates, ``NaN``/``Infinity`` and
out-of-range numbers are refused with the field named. Duplicate keys in an object: the last one wins, as in ``json``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from envace.envs.real import EnvironmentClassError, import_class, is_toolbox, public_methods, tool_schemas_from_class
from envace.errors import UserError
from envace.roles.parsing import UnsafeJSONError, json_type_name, loads_json, validate_call
from envace.types import (
    Checklist,
    EnvSpec,
    ExpectedAnswer,
    ExpectedCall,
    Standard,
    SuccessSpec,
    Task,
    ToolCall,
    canonical_json,
)

TOP_KEYS = (
    "id", "messages", "tools", "success", "reference", "world_context", "environment", "user_turns", "tool_unlocks",
    "user", "checklists", "metadata",
)
STANDARD_KEYS = (
    "question", "focus_on", "pass_condition", "failure_examples", "evidence", "weight", "required_for_next_turn",
)
SUCCESS_KEYS = ("calls", "ordered", "answer", "forbid_extra_calls")
CALL_KEYS = ("name", "arguments", "weight")
ANSWER_KEYS = ("equals", "contains", "weight")
ENV_KEYS = ("class_path", "init_args")
ROLES = ("system", "user", "assistant", "tool")
_DATA_KEYWORDS = ("const", "default", "enum", "examples")  # schema keywords whose values are data, not schemas


class TaskFormatError(UserError, ValueError):
    """A task file or record is invalid. The message is one line naming file, line and field."""


class _FieldError(Exception):
    """Internal: a problem at ``field``; ``parse_task`` prefixes the location."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------------


def load_tasks(path: str | Path, *, limit: int | None = None) -> list[Task]:
    """Load and validate a JSONL task file (blank lines skipped).

    Args:
        path: the file (``envace.builtin.task_sets.load_task_set`` also reads ``builtin:NAME``, ``reference:PATH`` and
            ``PATH:N``).
        limit: stop after this many tasks (the lines after them are neither read nor checked); None reads all.

    Raises:
        TaskFormatError: the file is missing, empty, or a line is invalid (one line naming file, line and field).
    """
    path = Path(path)
    if not path.is_file():
        named = str(path).startswith(("builtin:", "reference:", "reference-lenient:"))
        raise TaskFormatError(f"task file not found: {path}" + (
            " (a task set name: envace.builtin.task_sets.load_task_set reads it)" if named else ""))
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").split("\n")  # not splitlines(): JSON strings may hold U+2028, U+0085 raw
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise TaskFormatError(f"{path}:{lineno}: not UTF-8 text: {exc.reason} (byte {exc.start})") from exc
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        task = parse_task(decode_json(line, f"{path}:{lineno}"), where=f"{path}:{lineno}")
        if task.id in first_line:
            raise TaskFormatError(
                f"{path}:{lineno}: field 'id': duplicate task id '{task.id}' (first on line {first_line[task.id]})"
            )
        first_line[task.id] = lineno
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise TaskFormatError(f"{path}: no tasks (the file is empty)")
    return tasks


def decode_json(text: str, where: str, whole: str = "<record>") -> Any:
    """``loads_json`` of a task-file text, every problem a ``TaskFormatError`` that starts with ``where``.

    ``whole`` names the top-level value in an error about it; a multi-line text's errors name the line too.
    """
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if "\n" in text else f"column {exc.colno}"
        raise TaskFormatError(f"{where}: invalid JSON: {exc.msg} ({at})") from exc
    except UnsafeJSONError as exc:
        raise TaskFormatError(f"{where}: field '{_one_line(exc.path) or whole}': {exc.problem}") from exc
    except ValueError as exc:  # NaN/Infinity, an integer too long to convert
        raise TaskFormatError(f"{where}: invalid JSON: {_one_line(str(exc))}") from exc


# ---------------------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------------------


def parse_task(record: dict[str, Any], *, where: str = "<task>") -> Task:
    """Validate one record and convert it into a ``Task``.

    Args:
        record: the decoded JSON object of one line.
        where: location prefix for errors (``file:line``).

    Raises:
        TaskFormatError: one line ``{where}: field '{field}': {problem}``.
    """
    try:
        return _parse_task(record)
    except _FieldError as exc:
        raise TaskFormatError(f"{where}: field '{_one_line(exc.field)}': {_one_line(exc.message)}") from exc


def _parse_task(record: Any) -> Task:
    _require_object(record, "<record>", TOP_KEYS, required=("id", "messages"))
    task_id = _parse_id(record["id"])
    env_value = record.get("environment")
    environment = _parse_environment(env_value, "environment") if env_value is not None else None
    tools = _parse_tools(record.get("tools"), environment)
    user_turns = _parse_user_turns(record.get("user_turns", []))
    checklists = parse_checklists(record.get("checklists", []), "checklists", 1 + len(user_turns))
    if "success" not in record and not checklists:
        raise _FieldError("success", "is required (unless the task has 'checklists')")
    task = Task(
        id=task_id,
        messages=_parse_messages(record["messages"], "messages", allow_empty=False),
        tools=tools,
        success=_parse_success(record.get("success", {}), tools, allow_empty=bool(checklists)),
        world_context=_optional_str(record.get("world_context"), "world_context"),
        environment=environment,
        user_turns=user_turns,
        user=_optional_str(record.get("user"), "user"),
        checklists=checklists,
        metadata=_parse_metadata(record.get("metadata")),
    )
    task = replace(task, tool_unlocks=_parse_tool_unlocks(record.get("tool_unlocks", []), task))
    if record.get("reference") is None:
        return task
    reference = _parse_messages(record["reference"], "reference", allow_empty=True)
    _check_reference(reference, task)
    return replace(task, reference=reference)


def _require_object(value: Any, field: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    """``value`` is a JSON object with only ``allowed`` keys and every ``required`` key."""
    if not isinstance(value, dict):
        raise _FieldError(field, f"must be a JSON object, got {json_type_name(value)}")
    prefix = "" if field == "<record>" else field + "."
    for key in value:
        if key not in allowed:
            raise _FieldError(prefix + str(key), f"unknown key (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise _FieldError(prefix + key, "is required")


def _parse_id(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _FieldError("id", f"must be a non-empty string, got {json.dumps(value)}")
    return value


def _parse_metadata(value: Any) -> dict[str, Any]:
    """Free-form labels: a JSON object (null or absent: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _FieldError("metadata", f"must be a JSON object, got {json_type_name(value)}")
    return value


def _optional_str(value: Any, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _FieldError(field, f"must be a string or null, got {json_type_name(value)}")
    return value


def _parse_weight(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise _FieldError(field, f"must be a finite number >= 0, got {json.dumps(value)}")
    return float(value)


def _parse_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _FieldError(field, f"must be true or false, got {json.dumps(value)}")
    return value


# --- messages --------------------------------------------------------------------------------------------------------


def _parse_messages(value: Any, field: str, *, allow_empty: bool) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or (not value and not allow_empty):
        raise _FieldError(field, "must be a non-empty list of messages" if not allow_empty else "must be a list")
    return tuple(_parse_message(m, f"{field}[{i}]") for i, m in enumerate(value))


def _parse_user_turns(value: Any) -> tuple[tuple[dict[str, Any], ...], ...]:
    """Later user turns: a list of turns, each a non-empty list of user messages."""
    if not isinstance(value, list):
        problem = f"must be a list of turns (lists of user messages), got {json_type_name(value)}"
        raise _FieldError("user_turns", problem)
    turns = []
    for i, turn in enumerate(value):
        messages = _parse_messages(turn, f"user_turns[{i}]", allow_empty=False)
        for j, message in enumerate(messages):
            if message["role"] != "user":
                raise _FieldError(f"user_turns[{i}][{j}].role", f"must be 'user', got {json.dumps(message['role'])}")
        turns.append(messages)
    return tuple(turns)


def _parse_tool_unlocks(value: Any, task: Task) -> tuple[tuple[str, ...], ...]:
    """Per later user turn, the names of the tools it makes available."""
    if not isinstance(value, list) or len(value) > len(task.user_turns):
        raise _FieldError("tool_unlocks", f"must be a list of at most {len(task.user_turns)} lists of tool names "
                                          "(one per user turn)")
    unlocks = []
    for i, names in enumerate(value):
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _FieldError(f"tool_unlocks[{i}]", "must be a list of tool names")
        for j, name in enumerate(names):
            if task.tool(name) is None:
                raise _FieldError(f"tool_unlocks[{i}][{j}]", f"'{name}' is not one of the task's tools")
        unlocks.append(tuple(names))
    return tuple(unlocks)


def _parse_message(value: Any, field: str) -> dict[str, Any]:
    """A chat message; assistant ``tool_calls`` are normalised so that ``arguments`` is a dict."""
    if not isinstance(value, dict):
        raise _FieldError(field, f"a message must be a JSON object, got {json_type_name(value)}")
    if value.get("role") not in ROLES:
        raise _FieldError(f"{field}.role", f"must be one of {', '.join(ROLES)}, got {json.dumps(value.get('role'))}")
    if not isinstance(value.get("content"), str):
        raise _FieldError(f"{field}.content", f"must be a string, got {json.dumps(value.get('content'))}")
    message = dict(value)
    if "tool_calls" in value:
        if value["role"] != "assistant":
            raise _FieldError(f"{field}.tool_calls", "only assistant messages may have tool_calls")
        message["tool_calls"] = _parse_tool_calls(value["tool_calls"], f"{field}.tool_calls")
    return message


def _parse_tool_calls(value: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _FieldError(field, "must be a list")
    return [_parse_tool_call(call, f"{field}[{i}]") for i, call in enumerate(value)]


def _parse_tool_call(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("function"), dict):
        raise _FieldError(field, 'must be {"type": "function", "function": {"name": ..., "arguments": ...}}')
    function = value["function"]
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise _FieldError(f"{field}.function.name", "must be a non-empty string")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads_json(arguments)
        except ValueError as exc:
            message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise _FieldError(f"{field}.function.arguments", f"invalid JSON string: {message}") from exc
    if not isinstance(arguments, dict):
        raise _FieldError(f"{field}.function.arguments", "must be a JSON object or a JSON string of one")
    return {**value, "type": "function", "function": {**function, "arguments": arguments}}


def _check_reference(reference: tuple[dict[str, Any], ...], task: Task) -> None:
    """Each assistant message with k tool calls is followed by exactly its k tool responses, and calls are valid."""
    pending: list[tuple[str, str]] = []  # (call name, field of the call) awaiting a tool response
    for i, message in enumerate(reference):
        if message["role"] == "tool":
            if not pending:
                raise _FieldError(f"reference[{i}]", "tool message without a preceding assistant tool call")
            name, _ = pending.pop(0)
            if message.get("name", name) != name:
                raise _FieldError(f"reference[{i}].name", f"expected '{name}' (the call it answers)")
            _check_response_json(message["content"], f"reference[{i}].content")
            if not isinstance(message.get("reasoning", ""), str):
                raise _FieldError(f"reference[{i}].reasoning", "must be a string (the environment's working)")
            continue
        if pending:
            raise _FieldError(pending[0][1], "tool call has no tool response in the reference")
        for j, call in enumerate(message.get("tool_calls", [])):
            pending.append((call["function"]["name"], f"reference[{i}].tool_calls[{j}]"))
            _check_call(call, task, f"reference[{i}].tool_calls[{j}].function")
    if pending:
        raise _FieldError(pending[0][1], "tool call has no tool response in the reference")


def _check_response_json(content: str, field: str) -> None:
    """A recorded response is plain text or JSON that is safe to decode (alignment and rewards decode it)."""
    try:
        loads_json(content, strict_numbers=False)
    except json.JSONDecodeError:
        return  # plain text
    except ValueError as exc:  # too deep, a lone surrogate, an integer too long to convert
        raise _FieldError(field, f"holds JSON that cannot be used: {_one_line(str(exc))}") from exc


def _check_call(call: dict[str, Any], task: Task, field: str) -> None:
    error = validate_call(ToolCall(call["function"]["name"], call["function"]["arguments"]), task)
    if error is not None:
        raise _FieldError(field, f"{error.code}: {error.message}")


# --- tools -----------------------------------------------------------------------------------------------------------


def _parse_tools(value: Any, environment: EnvSpec | None) -> tuple[dict[str, Any], ...]:
    """The task's tools: given explicitly, or derived from the environment class."""
    toolbox = environment is not None and is_toolbox(import_class(environment.class_path))
    if value is None:
        if environment is None or toolbox:
            need = "no 'environment' is given" if environment is None else "the environment is a toolbox"
            raise _FieldError("tools", f"is required when {need}")
        try:
            return tuple(tool_schemas_from_class(import_class(environment.class_path)))
        except EnvironmentClassError as exc:
            raise _FieldError("environment.class_path", str(exc)) from exc
    if not isinstance(value, list):
        raise _FieldError("tools", f"must be a list of tool schemas, got {json_type_name(value)}")
    tools = tuple(_parse_tool(spec, f"tools[{i}]") for i, spec in enumerate(value))
    seen: set[str] = set()
    for i, spec in enumerate(tools):
        name = spec["function"]["name"]
        if name in seen:
            raise _FieldError(f"tools[{i}].function.name", f"duplicate tool name '{name}'")
        seen.add(name)
    if environment is not None and not toolbox:  # a toolbox's tools are known per instance only
        _check_tools_in_environment(tools, environment)
    return tools


def _parse_tool(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(value.get("function"), dict):
        raise _FieldError(field, 'must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
    function = value["function"]
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise _FieldError(f"{field}.function.name", "must be a non-empty string")
    if not isinstance(function.get("description", ""), str):
        raise _FieldError(f"{field}.function.description", "must be a string")
    _check_parameters(function.get("parameters"), f"{field}.function.parameters")
    return value


def _check_parameters(schema: Any, field: str) -> None:
    if not isinstance(schema, dict):
        raise _FieldError(field, "must be a JSON schema object")
    problem = _schema_problem(canonical_json(schema))
    if problem is not None:
        raise _FieldError(field, f"not a valid JSON schema{problem}")
    if schema.get("type") != "object":
        got = json.dumps(schema.get("type"))
        raise _FieldError(field, f'must be an object schema ("type": "object"), got type {got}')


@functools.lru_cache(maxsize=256)
def _schema_problem(schema_json: str) -> str | None:
    """Why a schema (given as canonical JSON; cached, checking is slow) is invalid, or None.

    Every ``$ref`` must resolve within the schema itself: envace never fetches a remote schema, and an unresolvable
    reference would otherwise fail only later, when a call is validated.
    """
    schema = json.loads(schema_json)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "" if not exc.path else f" at {'/'.join(str(p) for p in exc.path)}"
        return f"{where}: {exc.message}"
    resource = DRAFT202012.create_resource(schema)
    uri = resource.id() or "urn:envace:tool"
    resolver = Registry().with_resource(uri, resource).resolver(uri)
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{where}/{i}") for i, item in enumerate(node))
        elif isinstance(node, dict) and (node is schema or "$id" not in node):  # below a nested $id: its own base
            if isinstance(node.get("$ref"), str):
                try:
                    resolver.lookup(node["$ref"])
                except Unresolvable:
                    ref = json.dumps(node["$ref"])
                    return f" at {(where + '/$ref').lstrip('/')}: {ref} does not resolve within the schema"
            stack.extend((value, f"{where}/{key}") for key, value in node.items() if key not in _DATA_KEYWORDS)
    return None


def _check_tools_in_environment(tools: tuple[dict[str, Any], ...], environment: EnvSpec) -> None:
    methods = public_methods(import_class(environment.class_path))
    for i, spec in enumerate(tools):
        name = spec["function"]["name"]
        if name not in methods:
            raise _FieldError(
                f"tools[{i}].function.name",
                f"'{name}' is not a public method of environment class '{environment.class_path}'",
            )


def _parse_environment(value: Any, field: str) -> EnvSpec:
    _require_object(value, field, ENV_KEYS, required=("class_path",))
    class_path, init_args = value["class_path"], value.get("init_args", {})
    if not isinstance(class_path, str) or not all(part.isidentifier() for part in class_path.split(".")):
        got = json.dumps(class_path)
        raise _FieldError(f"{field}.class_path", f"must be a dotted path 'package.module.ClassName', got {got}")
    if not isinstance(init_args, dict):
        raise _FieldError(f"{field}.init_args", "must be a JSON object")
    try:
        import_class(class_path)
    except EnvironmentClassError as exc:
        raise _FieldError(f"{field}.class_path", str(exc)) from exc
    return EnvSpec(class_path=class_path, init_args=init_args)


# --- success ---------------------------------------------------------------------------------------------------------


def _parse_success(value: Any, tools: tuple[dict[str, Any], ...], *, allow_empty: bool = False) -> SuccessSpec:
    """The success specification; ``allow_empty`` (a task with checklists): it may have no items at all."""
    _require_object(value, "success", SUCCESS_KEYS)
    calls_value = value.get("calls", [])
    if not isinstance(calls_value, list):
        raise _FieldError("success.calls", "must be a list")
    calls = tuple(_parse_expected_call(c, f"success.calls[{i}]", tools) for i, c in enumerate(calls_value))
    answer = _parse_answer(value["answer"], "success.answer") if value.get("answer") is not None else None
    if not calls and answer is None:
        if allow_empty:
            return SuccessSpec(
                ordered=_parse_bool(value.get("ordered", False), "success.ordered"),
                forbid_extra_calls=_parse_bool(value.get("forbid_extra_calls", False), "success.forbid_extra_calls"),
            )
        raise _FieldError("success", "needs at least one of 'calls' (non-empty) or 'answer'")
    if sum(c.weight for c in calls) + (answer.weight if answer else 0.0) <= 0:
        raise _FieldError("success", "the weights sum to 0")
    return SuccessSpec(
        calls=calls,
        ordered=_parse_bool(value.get("ordered", False), "success.ordered"),
        answer=answer,
        forbid_extra_calls=_parse_bool(value.get("forbid_extra_calls", False), "success.forbid_extra_calls"),
    )


def _parse_expected_call(value: Any, field: str, tools: tuple[dict[str, Any], ...]) -> ExpectedCall:
    _require_object(value, field, CALL_KEYS, required=("name",))
    schemas = {spec["function"]["name"]: spec["function"]["parameters"] for spec in tools}
    name, arguments = value["name"], value.get("arguments", {})
    if not isinstance(name, str) or name not in schemas:
        raise _FieldError(f"{field}.name", f"unknown tool {json.dumps(name)}; available: {', '.join(schemas)}")
    if not isinstance(arguments, dict):
        raise _FieldError(f"{field}.arguments", "must be a JSON object")
    properties = schemas[name].get("properties")
    for key in arguments:
        if isinstance(properties, dict) and key not in properties:
            raise _FieldError(f"{field}.arguments.{key}", f"'{name}' has no parameter '{key}'")
    weight = _parse_weight(value.get("weight", 1.0), f"{field}.weight")
    return ExpectedCall(name=name, arguments=arguments, weight=weight)


def _parse_answer(value: Any, field: str) -> ExpectedAnswer:
    _require_object(value, field, ANSWER_KEYS)
    equals = _optional_str(value.get("equals"), f"{field}.equals")
    contains = value.get("contains", [])
    if not isinstance(contains, list) or not all(isinstance(c, str) for c in contains):
        raise _FieldError(f"{field}.contains", "must be a list of strings")
    if equals is None and not contains:
        raise _FieldError(field, "needs 'equals' or a non-empty 'contains'")
    weight = _parse_weight(value.get("weight", 1.0), f"{field}.weight")
    return ExpectedAnswer(equals=equals, contains=tuple(contains), weight=weight)


# --- checklists ------------------------------------------------------------------------------------------------------


def parse_checklists(value: Any, field: str, turns: int, *, strict_keys: bool = True) -> tuple[Checklist, ...]:
    """Checklists: a list of checklists, each a list of exactly ``turns`` user turns, each a list of standards.

    Args:
        value: the decoded JSON value.
        field: its field name (for errors).
        turns: the number of user turns of the conversation (the first one included).
        strict_keys: refuse unknown keys in a standard (False: ignore them).

    Raises:
        _FieldError: a problem, naming the field (``checklists[0][1][2].weight``).
    """
    if not isinstance(value, list):
        raise _FieldError(field, f"must be a list of checklists, got {json_type_name(value)}")
    checklists = []
    for i, checklist in enumerate(value):
        if not isinstance(checklist, list):
            raise _FieldError(f"{field}[{i}]", f"must be a list of turns (lists of standards), got "
                                               f"{json_type_name(checklist)}")
        if len(checklist) != turns:
            raise _FieldError(f"{field}[{i}]", f"has {len(checklist)} turns, but the conversation has {turns} user "
                                               "turns (one list of standards per user turn)")
        parsed = []
        for t, standards in enumerate(checklist):
            if not isinstance(standards, list):
                raise _FieldError(f"{field}[{i}][{t}]", f"must be a list of standards, got {json_type_name(standards)}")
            parsed.append(tuple(
                _parse_standard(s, f"{field}[{i}][{t}][{k}]", strict_keys) for k, s in enumerate(standards)
            ))
        checklists.append(tuple(parsed))
    return tuple(checklists)


def _parse_standard(value: Any, field: str, strict_keys: bool) -> Standard:
    required = ("question", "focus_on", "pass_condition")
    if strict_keys:
        _require_object(value, field, STANDARD_KEYS, required=required)
    else:
        _require_object(value, field, tuple(value) if isinstance(value, dict) else STANDARD_KEYS, required=required)
    texts = {}
    for key in required:
        if not isinstance(value[key], str):
            raise _FieldError(f"{field}.{key}", f"must be a string, got {json_type_name(value[key])}")
        texts[key] = value[key]
    examples = value.get("failure_examples", [])
    if not isinstance(examples, list):
        raise _FieldError(f"{field}.failure_examples", f"must be a list, got {json_type_name(examples)}")
    evidence = value.get("evidence", [])
    if not isinstance(evidence, list):
        raise _FieldError(f"{field}.evidence", f"must be a list of {{\"snippet\": ...}} objects, got "
                                               f"{json_type_name(evidence)}")
    snippets = []
    for j, item in enumerate(evidence):
        if not isinstance(item, dict) or not isinstance(item.get("snippet"), str):
            raise _FieldError(f"{field}.evidence[{j}]", 'must be an object {"snippet": "<text>"}')
        snippets.append(item["snippet"])
    return Standard(
        **texts,
        failure_examples=tuple(examples),
        evidence=tuple(snippets),
        weight=_parse_weight(value.get("weight", 1.0), f"{field}.weight"),
        required_for_next_turn=_parse_bool(value.get("required_for_next_turn", False),
                                           f"{field}.required_for_next_turn"),
    )


def standard_to_record(standard: Standard) -> dict[str, Any]:
    """The JSON object of one standard (the inverse of the checklist parser)."""
    return {
        "question": standard.question,
        "focus_on": standard.focus_on,
        "pass_condition": standard.pass_condition,
        "failure_examples": list(standard.failure_examples),
        "evidence": [{"snippet": s} for s in standard.evidence],
        "weight": standard.weight,
        "required_for_next_turn": standard.required_for_next_turn,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Inverse and helpers
# ---------------------------------------------------------------------------------------------------------------------


def task_to_record(task: Task) -> dict[str, Any]:
    """The JSON record of ``task`` (the inverse of ``parse_task``); optional fields are omitted when unset."""
    success: dict[str, Any] = {
        "calls": [{"name": c.name, "arguments": c.arguments, "weight": c.weight} for c in task.success.calls],
        "ordered": task.success.ordered,
        "forbid_extra_calls": task.success.forbid_extra_calls,
    }
    if task.success.answer is not None:
        answer = task.success.answer
        success["answer"] = {"equals": answer.equals, "contains": list(answer.contains), "weight": answer.weight}
    record: dict[str, Any] = {"id": task.id, "messages": list(task.messages), "tools": list(task.tools)}
    record["success"] = success
    if task.reference:
        record["reference"] = list(task.reference)
    if task.world_context is not None:
        record["world_context"] = task.world_context
    if task.environment is not None:
        record["environment"] = {"class_path": task.environment.class_path, "init_args": task.environment.init_args}
    if task.user_turns:
        record["user_turns"] = [list(turn) for turn in task.user_turns]
    if task.tool_unlocks:
        record["tool_unlocks"] = [list(names) for names in task.tool_unlocks]
    if task.user is not None:
        record["user"] = task.user
    if task.checklists:
        record["checklists"] = [
            [[standard_to_record(s) for s in standards] for standards in checklist] for checklist in task.checklists
        ]
    if task.metadata:
        record["metadata"] = task.metadata
    return record


def write_tasks(tasks: Iterable[Task], path: str | Path) -> dict[str, int]:
    """Write ``tasks`` as a task file (JSON Lines), each checked exactly as the loader will read it back.

    A task the loader would refuse (a benchmark's gold call that breaks its own tool schema, say) is left out and
    counted. Returns ``{"written": n, "skipped_schema": n}``.
    """
    counts = {"written": 0, "skipped_schema": 0}
    lines = []
    for task in tasks:
        record = task_to_record(task)
        try:
            parse_task(json.loads(json.dumps(record)))
        except TaskFormatError:
            counts["skipped_schema"] += 1
            continue
        lines.append(json.dumps(record, ensure_ascii=False))
        counts["written"] += 1
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return counts


def reference_calls(task: Task) -> list[tuple[ToolCall, str]]:
    """Each reference tool call paired with its recorded response content, in order.

    The loader guarantees that the tool messages following an assistant message answer its calls in order.
    """
    pairs: list[tuple[ToolCall, str]] = []
    pending: list[ToolCall] = []
    for message in task.reference:
        if message["role"] == "tool":
            pairs.append((pending.pop(0), message["content"]))
        for call in message.get("tool_calls", []):
            pending.append(ToolCall(call["function"]["name"], call["function"]["arguments"]))
    return pairs


def reference_steps(task: Task) -> list[tuple[ToolCall, str, list[dict[str, Any]]]]:
    """``(call, recorded content, history before the calling assistant message)`` for each reference call."""
    steps = []
    history: list[dict[str, Any]] = [dict(m) for m in task.messages]
    pending: list[ToolCall] = []
    before_call: list[dict[str, Any]] = []
    for message in task.reference:
        if message["role"] == "assistant":
            before_call = list(history)
            pending = [_call(tc) for tc in message.get("tool_calls") or []]
        elif message["role"] == "tool" and pending:
            steps.append((pending.pop(0), message["content"], before_call))
        history.append(dict(message))
    return steps


def reference_reasoning(task: Task) -> list[str]:
    """The recorded working of each reference call's response (a tool message's ``reasoning``; "" when none)."""
    return [m.get("reasoning", "") for m in task.reference if m["role"] == "tool"]


def _call(tool_call: dict[str, Any]) -> ToolCall:
    fn = tool_call["function"]
    args = fn["arguments"]
    return ToolCall(fn["name"], json.loads(args) if isinstance(args, str) else dict(args))
