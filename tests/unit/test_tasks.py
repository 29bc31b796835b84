"""Task file loader: happy path, the built-in file, and one-line errors naming file, line and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from envace.builtin.task_sets import load_task_set, resolve_task_path
from envace.data.task_parsing import parse_task
from envace.data.task_records import task_to_record
from envace.data.task_reference import reference_calls
from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks
from envace.types import EnvSpec, ExpectedAnswer, ExpectedCall, ToolCall

BALANCE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_balance",
        "description": "Get a balance.",
        "parameters": {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]},
    },
}


def make_record(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": "bank-0001",
        "messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Balance of A1?"}],
        "tools": [copy.deepcopy(BALANCE_TOOL)],
        "success": {
            "calls": [{"name": "get_balance", "arguments": {"account": "A1"}, "weight": 2}],
            "ordered": True,
            "answer": {"equals": "120", "contains": [], "weight": 1.0},
            "forbid_extra_calls": False,
        },
        "reference": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_balance", "arguments": '{"account": "A1"}'}}
                ],
            },
            {"role": "tool", "name": "get_balance", "content": '{"balance": 120}'},
            {"role": "assistant", "content": "120"},
        ],
        "world_context": "Accounts: A1 balance 120",
    }
    record.update(overrides)
    return record


def write_lines(tmp_path: Path, lines: list[str], name: str = "tasks.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load_error(tmp_path: Path, records: list[Any]) -> str:
    """Load a file made of ``records`` (strings written verbatim) and return the one-line error."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    with pytest.raises(TaskFormatError) as info:
        load_tasks(write_lines(tmp_path, lines))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_load_happy_path(tmp_path: Path) -> None:
    second = make_record(id="bank-0002")
    del second["reference"]
    path = write_lines(tmp_path, [json.dumps(make_record()), "", "   ", json.dumps(second)])
    tasks = load_tasks(path)
    assert [t.id for t in tasks] == ["bank-0001", "bank-0002"]
    task = tasks[0]
    assert isinstance(task.messages, tuple) and task.messages[1]["content"] == "Balance of A1?"
    assert task.success.calls == (ExpectedCall("get_balance", {"account": "A1"}, 2.0),)
    assert task.success.answer == ExpectedAnswer(equals="120", contains=(), weight=1.0)
    assert task.success.ordered is True and task.world_context == "Accounts: A1 balance 120"
    # the JSON string arguments of the reference were normalised to a dict
    assert task.reference[0]["tool_calls"][0]["function"]["arguments"] == {"account": "A1"}
    assert tasks[1].reference == () and task.environment is None


def test_round_trip(tmp_path: Path) -> None:
    task = parse_task(make_record())
    assert parse_task(task_to_record(task)) == task
    assert parse_task(json.loads(json.dumps(task_to_record(task)))) == task


def test_reference_calls_pairs_calls_with_responses() -> None:
    record = make_record()
    record["reference"] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}},
                {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "B2"}}},
            ],
        },
        {"role": "tool", "content": '{"balance": 1}'},
        {"role": "tool", "content": '{"balance": 2}'},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_balance", "arguments": '{"account": "C3"}'}}],
        },
        {"role": "tool", "content": '{"error": "x"}'},
    ]
    pairs = reference_calls(parse_task(record))
    assert pairs == [
        (ToolCall("get_balance", {"account": "A1"}), '{"balance": 1}'),
        (ToolCall("get_balance", {"account": "B2"}), '{"balance": 2}'),
        (ToolCall("get_balance", {"account": "C3"}), '{"error": "x"}'),
    ]


def test_tools_derived_from_environment() -> None:
    record = make_record(environment={"class_path": "envace.builtin.bank.Bank", "init_args": {"balances": {"A1": 1}}})
    del record["tools"]
    task = parse_task(record)
    assert [t["function"]["name"] for t in task.tools] == ["get_balance", "deposit", "withdraw", "transfer"]
    assert task.environment == EnvSpec("envace.builtin.bank.Bank", {"balances": {"A1": 1}})


def test_builtin_bank_loads() -> None:
    path = resolve_task_path("builtin:bank")
    assert path.name == "bank_tasks.jsonl" and path.is_file()
    tasks = load_task_set("builtin:bank")
    assert len(tasks) == 160
    assert len({t.id for t in tasks}) == 160
    assert all(t.environment is not None and t.reference for t in tasks)


def test_resolve_plain_path_and_unknown_builtin() -> None:
    assert resolve_task_path("some/file.jsonl") == Path("some/file.jsonl")
    with pytest.raises(TaskFormatError, match="builtin:nope.*available: bank"):
        resolve_task_path("builtin:nope")


def test_malformed_json(tmp_path: Path) -> None:
    message = load_error(tmp_path, [make_record(), '{"id": "x", '])
    assert "tasks.jsonl:2:" in message and "invalid JSON" in message


def test_missing_id(tmp_path: Path) -> None:
    record = make_record()
    del record["id"]
    message = load_error(tmp_path, [record])
    assert "tasks.jsonl:1: field 'id': is required" in message


def test_duplicate_id(tmp_path: Path) -> None:
    message = load_error(tmp_path, [make_record(), "", make_record()])
    assert "tasks.jsonl:3: field 'id': duplicate task id 'bank-0001' (first on line 1)" in message


def test_invalid_json_schema_in_tools(tmp_path: Path) -> None:
    record = make_record()
    record["tools"][0]["function"]["parameters"] = {"type": "object", "properties": {"account": {"type": 12}}}
    message = load_error(tmp_path, [record])
    assert "tasks.jsonl:1: field 'tools[0].function.parameters': not a valid JSON schema" in message


def test_parameters_must_be_object_schema(tmp_path: Path) -> None:
    record = make_record()
    record["tools"][0]["function"]["parameters"] = {"type": "string"}
    message = load_error(tmp_path, [record])
    assert "field 'tools[0].function.parameters': must be an object schema" in message


def test_duplicate_tool_name(tmp_path: Path) -> None:
    record = make_record(tools=[BALANCE_TOOL, BALANCE_TOOL])
    assert "tasks.jsonl:1: field 'tools[1].function.name': duplicate tool name 'get_balance'" in load_error(
        tmp_path, [record]
    )


def test_unknown_tool_in_success(tmp_path: Path) -> None:
    record = make_record()
    record["success"]["calls"].append({"name": "teleport", "arguments": {}})
    message = load_error(tmp_path, [record])
    assert "tasks.jsonl:1: field 'success.calls[1].name': unknown tool \"teleport\"" in message


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = load_error(tmp_path, [make_record(), make_record(id="b", sucess={})])
    assert "tasks.jsonl:2: field 'sucess': unknown key" in message


def test_unknown_nested_key(tmp_path: Path) -> None:
    record = make_record()
    record["success"]["anwser"] = {"equals": "1"}
    assert "field 'success.anwser': unknown key" in load_error(tmp_path, [record])


def test_success_needs_calls_or_answer(tmp_path: Path) -> None:
    assert "field 'success': needs at least one" in load_error(tmp_path, [make_record(success={"ordered": True})])


def test_bad_message_role(tmp_path: Path) -> None:
    record = make_record(messages=[{"role": "robot", "content": "hi"}])
    assert "tasks.jsonl:1: field 'messages[0].role': must be one of" in load_error(tmp_path, [record])


def test_reference_call_must_be_valid(tmp_path: Path) -> None:
    record = make_record()
    record["reference"][0]["tool_calls"][0]["function"]["arguments"] = {"account": 5}
    message = load_error(tmp_path, [record])
    assert "field 'reference[0].tool_calls[0].function': INVALID_ARGUMENTS" in message


def test_reference_call_without_response(tmp_path: Path) -> None:
    record = make_record()
    del record["reference"][1]
    message = load_error(tmp_path, [record])
    assert "field 'reference[0].tool_calls[0]': tool call has no tool response" in message


def test_tools_or_environment_required(tmp_path: Path) -> None:
    record = make_record()
    del record["tools"]
    assert "field 'tools': is required when no 'environment' is given" in load_error(tmp_path, [record])


def test_unknown_environment_class(tmp_path: Path) -> None:
    record = make_record(environment={"class_path": "envace.builtin.bank.Nope"})
    message = load_error(tmp_path, [record])
    assert "field 'environment.class_path': environment class 'envace.builtin.bank.Nope' not found" in message


def test_empty_file(tmp_path: Path) -> None:
    path = write_lines(tmp_path, ["", "  "], name="empty.jsonl")
    with pytest.raises(TaskFormatError, match=r"empty\.jsonl: no tasks"):
        load_tasks(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match=r"task file not found: .*missing\.jsonl"):
        load_tasks(tmp_path / "missing.jsonl")


def test_parse_task_default_location() -> None:
    with pytest.raises(TaskFormatError, match=r"^<task>: field 'id': must be a non-empty string"):
        parse_task(make_record(id=""))


def test_user_turns_parse_round_trip_and_refuse_other_roles(tmp_path: Path) -> None:
    turns = [[{"role": "user", "content": "Now deposit 5."}], [{"role": "user", "content": "And withdraw 2."}]]
    task = parse_task(make_record(user_turns=turns))
    assert task.user_turns == tuple(tuple(t) for t in turns)
    assert parse_task(json.loads(json.dumps(task_to_record(task)))) == task
    bad = make_record(user_turns=[[{"role": "assistant", "content": "x"}]])
    assert "tasks.jsonl:1: field 'user_turns[0][0].role': must be 'user'" in load_error(tmp_path, [bad])
    assert "field 'user_turns[1]': must be a non-empty list" in load_error(tmp_path, [make_record(user_turns=[turns[0],
                                                                                                      []])])
    assert "field 'user_turns': must be a list of turns" in load_error(tmp_path, [make_record(user_turns="hi")])


def test_tool_unlocks_name_tools_of_the_task(tmp_path: Path) -> None:
    turns = [[{"role": "user", "content": "Now deposit 5."}]]
    record = make_record(user_turns=turns, tool_unlocks=[["get_balance"]])
    task = parse_task(record)
    assert task.tool_unlocks == (("get_balance",),) and task.visible_tools() == []
    assert parse_task(json.loads(json.dumps(task_to_record(task)))) == task
    bad = make_record(user_turns=turns, tool_unlocks=[["nope"]])
    assert "field 'tool_unlocks[0][0]': 'nope' is not one of the task's tools" in load_error(tmp_path, [bad])
    long = make_record(user_turns=turns, tool_unlocks=[[], []])
    assert "field 'tool_unlocks': must be a list of at most 1" in load_error(tmp_path, [long])


def test_a_recorded_working_is_kept_and_must_be_text(tmp_path: Path) -> None:
    from envace.data.task_reference import reference_reasoning

    record = make_record()
    record["reference"][1]["reasoning"] = "A1 has 120."
    (task,) = load_tasks(write_lines(tmp_path, [json.dumps(record)]))
    assert reference_reasoning(task) == ["A1 has 120."]
    assert reference_reasoning(load_tasks(write_lines(tmp_path, [json.dumps(make_record())]))[0]) == [""]
    record["reference"][1]["reasoning"] = 5
    assert "tasks.jsonl:1: field 'reference[1].reasoning': must be a string" in load_error(tmp_path, [record])
