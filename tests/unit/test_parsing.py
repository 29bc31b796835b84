"""Parsing of act and rehearse outputs, and call validation: never raises, returns structured errors."""

from __future__ import annotations

import json

import pytest

from envace.data.task_parsing import parse_task
from envace.roles.parsing import (
    CallError,
    ExecutionResult,
    parse_act_output,
    parse_execution_result,
    validate_call,
)
from envace.types import SuccessSpec, Task, ToolCall


def codes(text: str) -> list[str]:
    return [c.code if isinstance(c, CallError) else "OK" for c in parse_act_output(text).calls]


def test_plain_answer() -> None:
    turn = parse_act_output("  The balance is 120.\n")
    assert turn.content == "The balance is 120." and turn.calls == [] and not turn.malformed and turn.reasoning == ""


def test_single_call_with_reasoning_and_leading_text() -> None:
    call = '{"name": "get_balance", "arguments": {"account": "A1"}}'
    text = f"<think>I need the balance.</think>Let me check.<tool_call>{call}</tool_call>"
    turn = parse_act_output(text)
    assert turn.reasoning == "I need the balance." and turn.content == "Let me check."
    assert turn.calls == [ToolCall("get_balance", {"account": "A1"})] and not turn.malformed


def test_whitespace_tolerant_and_multiple_blocks() -> None:
    text = '<tool_call>  \n\n {"name": "a", "arguments": {}}\t</tool_call> between <tool_call>{"name":"b"}</tool_call>'
    assert parse_act_output(text).calls == [ToolCall("a", {}), ToolCall("b", {})]


def test_list_of_calls_in_one_block() -> None:
    text = '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}, 3]</tool_call>'
    turn = parse_act_output(text)
    assert turn.calls[:2] == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert isinstance(turn.calls[2], CallError) and turn.calls[2].code == "MALFORMED_TOOL_CALL" and turn.malformed


def test_arguments_as_json_string_and_parameters_key() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"y": "z"}}</tool_call>'
        '<tool_call>{"type": "function", "function": {"name": "c", "arguments": null}}</tool_call>'
    )
    assert parse_act_output(text).calls == [ToolCall("a", {"x": 2}), ToolCall("b", {"y": "z"}), ToolCall("c", {})]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "a", "arguments": {}}', ["MALFORMED_TOOL_CALL"]),  # missing close tag
        ('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"', ["OK", "MALFORMED_TOOL_CALL"]),
        ('{"name": "a"}</tool_call>', ["MALFORMED_TOOL_CALL"]),  # close without open
        ("<tool_call>{name: a}</tool_call>", ["JSON_DECODE_ERROR"]),
        ('<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>', ["JSON_DECODE_ERROR"]),
        ("<tool_call></tool_call>", ["JSON_DECODE_ERROR"]),
        ("<tool_call>[]</tool_call>", ["MALFORMED_TOOL_CALL"]),
        ('<tool_call>"get_balance"</tool_call>', ["MALFORMED_TOOL_CALL"]),
        ('<tool_call>{"arguments": {}}</tool_call>', ["INVALID_TOOL_NAME"]),
        ('<tool_call>{"name": "  ", "arguments": {}}</tool_call>', ["INVALID_TOOL_NAME"]),
        ('<tool_call>{"name": 7}</tool_call>', ["INVALID_TOOL_NAME"]),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', ["INVALID_ARGUMENTS_TYPE"]),
        ('<tool_call>{"name": "a", "arguments": "not json"}</tool_call>', ["INVALID_ARGUMENTS_TYPE"]),
        ('<tool_call>{"name": "a", "arguments": "[1, 2]"}</tool_call>', ["INVALID_ARGUMENTS_TYPE"]),
    ],
)
def test_malformed_calls(text: str, expected: list[str]) -> None:
    turn = parse_act_output(text)
    assert codes(text) == expected
    assert turn.malformed


def test_nested_think_and_calls_inside_reasoning_ignored() -> None:
    text = '<think>a <think>b</think> maybe <tool_call>{"name": "x"}</tool_call></think>Done: 5'
    turn = parse_act_output(text)
    assert turn.calls == [] and turn.content == "Done: 5"
    assert turn.reasoning == 'a b maybe <tool_call>{"name": "x"}</tool_call>'


def test_missing_think_open_and_unclosed_think() -> None:
    assert parse_act_output("reasoning only</think>42").content == "42"
    turn = parse_act_output("<think>still thinking")
    assert turn.content == "" and turn.reasoning == "still thinking" and turn.calls == []


def test_unicode() -> None:
    text = 'Größe <tool_call>{"name": "suche", "arguments": {"q": "日本語 ✓"}}</tool_call>'
    turn = parse_act_output(text)
    assert turn.content == "Größe" and turn.calls == [ToolCall("suche", {"q": "日本語 ✓"})]


def test_call_error_content() -> None:
    content = CallError("UNKNOWN_TOOL", "tool 'x' ✓").to_content()
    assert json.loads(content) == {"error": {"code": "UNKNOWN_TOOL", "message": "tool 'x' ✓"}}
    assert "✓" in content


# --- validate_call -----------------------------------------------------------------------------------------------


def bank_task() -> Task:
    return parse_task(
        {
            "id": "t",
            "messages": [{"role": "user", "content": "hi"}],
            "environment": {"class_path": "envace.builtin.bank.Bank", "init_args": {"balances": {"A1": 1}}},
            "success": {"answer": {"equals": "1"}},
        }
    )


def test_validate_call() -> None:
    task = bank_task()
    assert validate_call(ToolCall("deposit", {"account": "A1", "amount": 5}), task) is None
    unknown = validate_call(ToolCall("rob", {}), task)
    available = "available: get_balance, deposit, withdraw, transfer"
    assert unknown == CallError("UNKNOWN_TOOL", f"tool 'rob' is not available; {available}")
    bad_type = validate_call(ToolCall("deposit", {"account": "A1", "amount": "5"}), task)
    assert bad_type is not None and bad_type.code == "INVALID_ARGUMENTS"
    assert "$.amount" in bad_type.message and "'5' is not of type 'integer'" in bad_type.message
    missing = validate_call(ToolCall("deposit", {"account": "A1"}), task)
    assert missing is not None and "'amount' is a required property" in missing.message


def test_validate_call_no_tools() -> None:
    task = Task(id="t", messages=({"role": "user", "content": "q"},), tools=(), success=SuccessSpec())
    error = validate_call(ToolCall("a", {}), task)
    assert error is not None and error.message.endswith("available: (none)")


# --- parse_execution_result --------------------------------------------------------------------------------------


def test_execution_result_ok() -> None:
    body = '{"balance": 120, "name": "Ünï"}'
    result = parse_execution_result(f"<think>hmm</think>\n<execution_result>\n{body}\n</execution_result>")
    assert result == ExecutionResult(ok=True, content=body, value={"balance": 120, "name": "Ünï"})
    tight = parse_execution_result('<execution_result>[1, 2]</execution_result> trailing')
    assert tight.ok and tight.value == [1, 2] and tight.content == "[1, 2]"
    assert parse_execution_result("<execution_result>[]</execution_result>").ok  # an empty array is allowed


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "EMPTY_OUTPUT"),
        ("  \n", "EMPTY_OUTPUT"),
        ("<think>only thoughts</think>", "EMPTY_OUTPUT"),
        ('{"balance": 1}', "NO_EXECUTION_RESULT"),
        ('<execution_result>{"balance": 1}', "MALFORMED_EXECUTION_RESULT"),
        ("<execution_result>{balance: 1}</execution_result>", "RESULT_JSON_DECODE_ERROR"),
        ("<execution_result></execution_result>", "RESULT_JSON_DECODE_ERROR"),
        ("<execution_result>{}</execution_result>", "INVALID_RESULT_TYPE"),
        ('<execution_result>"text"</execution_result>', "INVALID_RESULT_TYPE"),
        ("<execution_result>42</execution_result>", "INVALID_RESULT_TYPE"),
    ],
)
def test_execution_result_errors(text: str, code: str) -> None:
    result = parse_execution_result(text)
    assert not result.ok and result.error is not None and result.error.code == code
    assert result.value is None and json.loads(result.content)["error"]["code"] == code
