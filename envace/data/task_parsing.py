"""One task record validated and converted into a ``Task``: ``parse_task``.

This module owns the parsing of a record (the decoded JSON object of one line of a task file): its top-level keys,
``id``, ``metadata``, the messages (``messages``, ``user_turns``, assistant ``tool_calls`` normalised so that
``arguments`` is a dict), ``tool_unlocks``, the ``success`` specification and the ``reference`` trajectory (each
call answered in order, valid against its tool, its recorded response safe to decode). The tools and environment are
checked by ``envace.data.task_tools``, the checklists by ``envace.data.task_checklists``. Every problem is one
``TaskFormatError`` line ``{where}: field '{field}': {problem}``. See ``docs/task-format.md``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from envace.data.task_checklists import parse_checklists
from envace.data.task_schema import (
    ANSWER_KEYS,
    CALL_KEYS,
    ROLES,
    STATE_KEYS,
    SUCCESS_KEYS,
    TOP_KEYS,
    TaskFormatError,
    _FieldError,
    _one_line,
    _optional_str,
    _parse_bool,
    _parse_weight,
    _require_object,
)
from envace.data.task_tools import _parse_environment, _parse_tools
from envace.envs.sqlite_state import SeedError, seed_database
from envace.roles.parsing import json_type_name, loads_json, validate_call
from envace.types import EnvSpec, ExpectedAnswer, ExpectedCall, ExpectedState, SuccessSpec, Task, ToolCall


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
        success=_parse_success(record.get("success", {}), tools, allow_empty=bool(checklists), environment=environment),
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


# --- success ---------------------------------------------------------------------------------------------------------


def _parse_success(value: Any, tools: tuple[dict[str, Any], ...], *, allow_empty: bool = False,
                   environment: EnvSpec | None = None) -> SuccessSpec:
    """The success specification; ``allow_empty`` (a task with checklists): it may have no items at all."""
    _require_object(value, "success", SUCCESS_KEYS)
    calls_value = value.get("calls", [])
    if not isinstance(calls_value, list):
        raise _FieldError("success.calls", "must be a list")
    calls = tuple(_parse_expected_call(c, f"success.calls[{i}]", tools) for i, c in enumerate(calls_value))
    answer = _parse_answer(value["answer"], "success.answer") if value.get("answer") is not None else None
    state = _parse_state(value["state"], tools, environment) if value.get("state") is not None else None
    if not calls and answer is None and state is None:
        if allow_empty:
            return SuccessSpec(
                ordered=_parse_bool(value.get("ordered", False), "success.ordered"),
                forbid_extra_calls=_parse_bool(value.get("forbid_extra_calls", False), "success.forbid_extra_calls"),
            )
        raise _FieldError("success", "needs at least one of 'calls' (non-empty), 'answer' or 'state'")
    if sum(c.weight for c in calls) + (answer.weight if answer else 0.0) + (state.weight if state else 0.0) <= 0:
        raise _FieldError("success", "the weights sum to 0")
    return SuccessSpec(
        calls=calls,
        ordered=_parse_bool(value.get("ordered", False), "success.ordered"),
        answer=answer,
        forbid_extra_calls=_parse_bool(value.get("forbid_extra_calls", False), "success.forbid_extra_calls"),
        state=state,
    )


def _parse_state(value: Any, tools: tuple[dict[str, Any], ...], environment: EnvSpec | None) -> ExpectedState:
    """``success.state``: the tables expected, the write tools and their SQL argument, on a seeded database."""
    _require_object(value, "success.state", STATE_KEYS, required=("tables",))
    seed = environment.init_args.get("seed_sql") if environment is not None else None
    if not isinstance(seed, str):
        raise _FieldError("success.state", "needs the task's initial database: an 'environment' whose init_args "
                          "have a 'seed_sql' script")
    tables = value["tables"]
    if not isinstance(tables, dict) or not all(
            isinstance(rows, list) and all(isinstance(row, list) for row in rows) for rows in tables.values()):
        raise _FieldError("success.state.tables", "must map each table name to a list of rows (lists of values)")
    writes = value.get("writes", ExpectedState(tables={}).writes)
    schemas = {spec["function"]["name"]: spec["function"]["parameters"] for spec in tools}
    if not isinstance(writes, dict) or not writes:
        raise _FieldError("success.state.writes", "must map each writing tool to the argument holding its SQL")
    for name, argument in writes.items():
        properties = schemas.get(name, {}).get("properties", {})
        if name in schemas and (not isinstance(argument, str) or argument not in properties):
            raise _FieldError(f"success.state.writes.{name}", f"'{name}' has no parameter {json.dumps(argument)}")
    try:
        seed_database(seed)
    except SeedError as exc:
        raise _FieldError("environment.init_args.seed_sql", str(exc)) from exc
    weight = _parse_weight(value.get("weight", 1.0), "success.state.weight")
    return ExpectedState(tables=tables, writes=dict(writes), weight=weight)


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

