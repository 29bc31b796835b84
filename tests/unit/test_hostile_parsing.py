"""Hostile model output: property-based tests of every parser of model-written text.

Model output is data. The act role's tool calls (``parse_act_output``), the rehearse role's execution results
(``parse_execution_result``), the reasoning split, call validation (``validate_call``) and the ViTA judge's reply
(``parse_judge_reply``) must never raise on any text and must never execute it: problems come back as structured
errors. Decoded JSON that would break a later step (tokenizer, canonical JSON, jsonschema) is refused as invalid
JSON: nesting deeper than ``MAX_JSON_DEPTH``, lone surrogates (``\\ud800`` escapes), ``NaN``/``Infinity`` and
numbers outside the finite double range.

Duplicate keys in a JSON object: the last one wins, as in Python's ``json`` (documented in ``envace.roles.parsing``).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from envace.benchmarks.vita_scoring import parse_judge_reply
from envace.data.task_parsing import parse_task
from envace.roles.parsing import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_JSON_DEPTH,
    RESULT_CLOSE,
    RESULT_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    CallError,
    ParsedTurn,
    check_json_value,
    parse_act_output,
    parse_execution_result,
    split_reasoning,
    validate_call,
)
from envace.roles.rehearse import build_rehearse_messages, serialize_history
from envace.types import Task, ToolCall

ROOT = Path(__file__).resolve().parents[2]
MARKER = Path("/tmp/pwned_envace")
INJECTIONS = (
    "__import__('os').system('touch /tmp/pwned_envace')",
    "eval(\"__import__('os').system('touch /tmp/pwned_envace')\")",
    "exec(compile(\"import os; os.system('touch /tmp/pwned_envace')\", 'x', 'exec'))",
    "$(touch /tmp/pwned_envace)",
    "`touch /tmp/pwned_envace`",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "!!python/object/apply:os.system ['touch /tmp/pwned_envace']",
    "cos\nsystem\n(S'touch /tmp/pwned_envace'\ntR.",  # a protocol-0 pickle
)
TAGS = (CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE, RESULT_OPEN, RESULT_CLOSE)
ODD_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", str(10**400), "9" * 5000)

TRANSFER = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "multipleOf": 0.01, "minimum": 0, "exclusiveMaximum": 1e6},
        "count": {"type": "integer", "multipleOf": 3},
        "to": {"type": "string", "enum": ["A1", "A2"]},
        "memo": {"type": ["string", "null"], "maxLength": 20},
    },
    "required": ["amount", "to"],
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "get_balance": {
        "type": "object",
        "properties": {"account": {"type": "string", "pattern": "^A[0-9]+$"}},
        "required": ["account"],
        "additionalProperties": False,
    },
    "transfer": TRANSFER,
    "tree": {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/node"}},
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    "tags": {"type": "array", "uniqueItems": True},
                },
            }
        },
    },
    "anything": {"type": "object"},
}


def _make_task() -> Task:
    tools = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
    record = {
        "id": "hostile",
        "messages": [{"role": "user", "content": "Move money."}],
        "tools": tools,
        "success": {"calls": [{"name": "transfer", "arguments": {"to": "A1"}}]},
        "world_context": "A1 holds 100.",
    }
    return parse_task(record)


TASK = _make_task()

# --- strategies ------------------------------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(INJECTIONS)
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
tool_names = (st.sampled_from([*SCHEMAS, "missing_tool"]) | st.text(min_size=1, max_size=12)
              | st.sampled_from(INJECTIONS))
arguments = st.dictionaries(st.sampled_from(["account", "amount", "to", "count", "memo", "node"]) | st.text(max_size=8),
                            json_values, max_size=4)
surrogate_escapes = st.integers(0xD800, 0xDFFF).map(lambda c: f'"\\u{c:04x}"')
raw_surrogates = st.integers(0xD800, 0xDFFF).map(chr)


def _nested(depth: int, kind: str = "list") -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


fragments = st.one_of(
    st.sampled_from([*TAGS, "{", "}", "[", "]", '"', "\\", ",", ":", '"name":', '"arguments":', '"parameters":',
                     '"function":', "null", "\x00", "\u2028", "\ufeff", '"\\ud83d\\ude00"', *ODD_NUMBERS, *INJECTIONS]),
    st.text(max_size=30),
    raw_surrogates,
    surrogate_escapes,
    json_values.map(json.dumps),
    st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}, ensure_ascii=False), tool_names, arguments),
    st.integers(1, 3000).map(_nested),
    st.integers(1, 3000).map(lambda d: _nested(d, "dict")),
)
hostile_text = st.lists(fragments, max_size=10).map("".join)


def _call_text(name: str, args: str) -> str:
    return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {args}}}{CALL_CLOSE}'


@st.composite
def hostile_calls(draw: st.DrawFn) -> str:
    """One or more tool call blocks whose names and arguments are hostile but mostly decodable."""
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        args = draw(arguments.map(json.dumps) | st.sampled_from(ODD_NUMBERS).map(lambda n: f'{{"amount": {n}}}')
                    | surrogate_escapes.map(lambda s: f'{{"to": {s}}}') | st.integers(1, 300).map(
                        lambda d: f'{{"node": {_nested(d)}}}'))
        blocks.append(_call_text(draw(tool_names), args))
    return draw(st.text(max_size=10)) + "".join(blocks)


# --- helpers ---------------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_marker() -> Iterator[None]:
    assert not MARKER.exists(), f"{MARKER} exists before the test: remove it"
    yield
    assert not MARKER.exists(), "model text was executed"


def _assert_safe_error(error: CallError) -> None:
    content = error.to_content()
    content.encode("utf-8")  # a lone surrogate here would crash the tokenizer
    assert json.loads(content) == {"error": {"code": error.code, "message": error.message}}


def _assert_safe_turn(turn: ParsedTurn, text: str) -> None:
    assert isinstance(turn, ParsedTurn)
    assert turn.content in text
    assert turn.malformed == any(isinstance(c, CallError) for c in turn.calls)
    for call in turn.calls:
        if isinstance(call, CallError):
            _assert_safe_error(call)
            continue
        assert isinstance(call, ToolCall) and isinstance(call.arguments, dict)
        assert call.name and call.name == call.name.strip()
        check_json_value({"name": call.name, "arguments": call.arguments})
        json.dumps([call.name, call.arguments], ensure_ascii=False).encode("utf-8")
        call.key()


# --- act role --------------------------------------------------------------------------------------------------------


@settings(max_examples=300)
@given(hostile_text)
def test_act_parser_never_raises_on_arbitrary_text(text: str) -> None:
    """Any text parses to a ParsedTurn; calls are ToolCalls with safe JSON or CallErrors with UTF-8 content."""
    _assert_safe_turn(parse_act_output(text), text)


@settings(max_examples=150)
@given(hostile_calls())
def test_act_parser_and_validator_never_raise_on_hostile_calls(text: str) -> None:
    """Hostile names and arguments: parsing and validation return structured results, never raise."""
    turn = parse_act_output(text)
    _assert_safe_turn(turn, text)
    for call in turn.calls:
        if isinstance(call, ToolCall):
            error = validate_call(call, TASK)
            assert error is None or error.code in ("UNKNOWN_TOOL", "INVALID_ARGUMENTS")
            if error is not None:
                _assert_safe_error(error)


@settings(max_examples=100)
@given(st.fixed_dictionaries({"name": tool_names, "arguments": arguments}), st.booleans(), st.booleans())
def test_well_formed_calls_round_trip(call: dict[str, Any], ensure_ascii: bool, as_string: bool) -> None:
    """A well-formed call (arguments as an object or as a JSON string) parses back to the same ToolCall."""
    body = dict(call, arguments=json.dumps(call["arguments"])) if as_string else call
    text = f"{CALL_OPEN}{json.dumps(body, ensure_ascii=ensure_ascii)}{CALL_CLOSE}"
    assume(call["name"].strip() and not any(tag in text[len(CALL_OPEN) : -len(CALL_CLOSE)] for tag in TAGS))
    turn = parse_act_output(text)
    assert turn.calls == [ToolCall(call["name"].strip(), call["arguments"])] and not turn.malformed


@settings(max_examples=60)
@given(st.integers(1, 5000), st.sampled_from(["list", "dict"]), st.sampled_from(["block", "arguments", "string"]))
def test_deep_nesting_is_an_error_not_a_crash(depth: int, kind: str, where: str) -> None:
    """Nesting beyond MAX_JSON_DEPTH is refused as data (never RecursionError); within it, calls parse."""
    nested = _nested(depth, kind)
    if where == "block":
        text, total = f"{CALL_OPEN}{nested}{CALL_CLOSE}", depth
    elif where == "arguments":  # the call object and its arguments object hold the nested value
        text, total = _call_text("anything", f'{{"x": {nested}}}'), depth + 2
    else:  # arguments given as a JSON string: decoded on their own
        text, total = _call_text("anything", json.dumps(f'{{"x": {nested}}}')), depth + 1
    turn = parse_act_output(text)
    _assert_safe_turn(turn, text)
    first = turn.calls[0]
    if total <= MAX_JSON_DEPTH:
        assert where == "block" or first == ToolCall("anything", {"x": json.loads(nested)})
    elif where == "string":
        assert isinstance(first, CallError) and first.code == "INVALID_ARGUMENTS_TYPE"
    else:
        assert isinstance(first, CallError) and first.code == "JSON_DECODE_ERROR"
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in first.message


@settings(max_examples=60)
@given(surrogate_escapes, st.sampled_from(["name", "key", "value", "nested"]))
def test_lone_surrogate_escapes_are_refused(escape: str, where: str) -> None:
    """A ``\\ud800``-style escape anywhere in a call is a JSON_DECODE_ERROR naming the lone surrogate."""
    body = {
        "name": f'{{"name": {escape}, "arguments": {{}}}}',
        "key": f'{{"name": "anything", "arguments": {{{escape}: 1}}}}',
        "value": f'{{"name": "anything", "arguments": {{"x": {escape}}}}}',
        "nested": f'{{"name": "anything", "arguments": {{"x": [1, {{"y": {escape}}}]}}}}',
    }[where]
    (call,) = parse_act_output(f"{CALL_OPEN}{body}{CALL_CLOSE}").calls
    assert isinstance(call, CallError) and call.code == "JSON_DECODE_ERROR" and "lone surrogate" in call.message
    _assert_safe_error(call)


@settings(max_examples=30)
@given(st.sampled_from(ODD_NUMBERS), st.booleans())
def test_non_finite_and_out_of_range_numbers_are_refused(number: str, nested: bool) -> None:
    """NaN, Infinity, 1e400, 10**400 and over-long integers in arguments are JSON_DECODE_ERRORs."""
    value = f"[{number}]" if nested else number
    (call,) = parse_act_output(_call_text("transfer", f'{{"amount": {value}, "to": "A1"}}')).calls
    assert isinstance(call, CallError) and call.code == "JSON_DECODE_ERROR"


@settings(max_examples=50)
@given(json_values, st.dictionaries(st.text(max_size=5), json_scalars, max_size=3))
def test_duplicate_keys_last_wins(first: Any, last: dict[str, Any]) -> None:
    """Duplicate keys in a call object: the last value wins (as in ``json``), for ``name`` and ``arguments``."""
    text = (f'{CALL_OPEN}{{"name": {json.dumps(first)}, "arguments": {json.dumps(first)}, '
            f'"name": "anything", "arguments": {json.dumps(last)}}}{CALL_CLOSE}')
    assume(not any(tag in text[len(CALL_OPEN) : -len(CALL_CLOSE)] for tag in TAGS))
    assert parse_act_output(text).calls == [ToolCall("anything", last)]


# --- validation ------------------------------------------------------------------------------------------------------

WRONG_TYPE = {
    "number": st.text(max_size=5) | st.booleans() | st.none() | st.lists(json_scalars, max_size=2),
    "string": st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False) | st.booleans()
    | st.none() | st.dictionaries(st.text(max_size=3), json_scalars, max_size=2),
    "integer": st.text(max_size=5) | st.booleans() | st.none() | st.floats(0.1, 0.9),
}


@st.composite
def violations(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """``(tool, field, arguments)`` where only ``field`` breaks the tool's schema (a wrong JSON type)."""
    tool, field, kind = draw(st.sampled_from([("transfer", "amount", "number"), ("transfer", "to", "string"),
                                              ("transfer", "count", "integer"), ("get_balance", "account", "string")]))
    args: dict[str, Any] = {"amount": 5, "to": "A1"} if tool == "transfer" else {"account": "A1"}
    args[field] = draw(WRONG_TYPE[kind])
    return tool, field, args


@settings(max_examples=80)
@given(violations(), st.booleans())
def test_schema_violations_are_reported_with_the_field(violation: tuple[str, str, dict[str, Any]], parse: bool) -> None:
    """A schema-violating argument is INVALID_ARGUMENTS naming ``$.field``, whether parsed from text or built."""
    tool, field, args = violation
    call = ToolCall(tool, args)
    if parse:
        (call,) = parse_act_output(_call_text(tool, json.dumps(args))).calls
    error = validate_call(call, TASK)
    assert error is not None and error.code == "INVALID_ARGUMENTS"
    assert f"arguments of '{tool}' invalid at $.{field}:" in error.message


@settings(max_examples=40)
@given(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: k != "account"), json_values)
def test_unknown_argument_is_named(key: str, value: Any) -> None:
    """An undeclared argument of a closed schema is INVALID_ARGUMENTS quoting the key."""
    error = validate_call(ToolCall("get_balance", {"account": "A1", key: value}), TASK)
    assert error is not None and error.code == "INVALID_ARGUMENTS" and f"'{key}'" in error.message


@settings(max_examples=40)
@given(st.text(min_size=1, max_size=20).filter(lambda n: n.strip() and n not in SCHEMAS) | st.sampled_from(INJECTIONS))
def test_unknown_tool_is_named(name: str) -> None:
    """A call to a tool the task lacks is UNKNOWN_TOOL listing the available tools; the name is never run."""
    error = validate_call(ToolCall(name, {}), TASK)
    assert error is not None and error.code == "UNKNOWN_TOOL" and "get_balance, transfer" in error.message
    _assert_safe_error(error)


def test_missing_required_argument_is_named() -> None:
    error = validate_call(ToolCall("get_balance", {}), TASK)
    assert error is not None and "'account' is a required property" in error.message


# --- rehearse role ---------------------------------------------------------------------------------------------------

result_bodies = st.one_of(
    hostile_text,
    json_values.map(json.dumps),
    st.sampled_from(ODD_NUMBERS).map(lambda n: f'{{"balance": {n}}}'),
    surrogate_escapes.map(lambda s: f'{{"balance": {s}}}'),
    st.integers(1, 3000).map(_nested),
)


@settings(max_examples=200)
@given(st.text(max_size=10), result_bodies, st.sampled_from(["", RESULT_CLOSE, RESULT_CLOSE + "tail"]),
       st.booleans())
def test_execution_result_parser_never_raises(prefix: str, body: str, close: str, think: bool) -> None:
    """Any rehearse output parses: ok results hold a safe non-empty object or array; errors have UTF-8 content."""
    text = (f"{THINK_OPEN}x{THINK_CLOSE}" if think else "") + prefix + RESULT_OPEN + body + close
    result = parse_execution_result(text)
    if result.ok:
        assert isinstance(result.value, list) or (isinstance(result.value, dict) and result.value)
        check_json_value(result.value)
        assert result.content == json.dumps(result.value, ensure_ascii=False) and result.error is None
        result.content.encode("utf-8")
    else:
        assert result.error is not None and result.value is None and result.content == result.error.to_content()
        _assert_safe_error(result.error)


@settings(max_examples=100)
@given(hostile_text)
def test_execution_result_parser_never_raises_on_arbitrary_text(text: str) -> None:
    """Arbitrary text, tags and all, never makes the rehearse parser raise."""
    result = parse_execution_result(text)
    assert result.ok == (result.error is None)


@settings(max_examples=100)
@given(hostile_text)
def test_split_reasoning_never_raises(text: str) -> None:
    """The split returns two strings; with a closing tag, no think tag is left in the reasoning or the rest."""
    reasoning, rest = split_reasoning(text)
    assert rest in text and THINK_CLOSE not in reasoning
    if THINK_CLOSE in text:
        assert THINK_OPEN not in reasoning and THINK_CLOSE not in rest


@settings(max_examples=60)
@given(hostile_calls(), st.booleans())
def test_accepted_calls_render_into_the_rehearse_prompt(text: str, show_reasoning: bool) -> None:
    """Whatever the act parser accepts renders into the rehearse prompt as UTF-8 text; nothing is executed."""
    turn = parse_act_output(text)
    calls = [c for c in turn.calls if isinstance(c, ToolCall)]
    assume(calls)
    history = [
        {"role": "user", "content": "Move money."},
        {"role": "assistant", "content": turn.content, "reasoning": turn.reasoning, "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]},
        *({"role": "tool", "name": c.name, "content": "{}"} for c in calls),
    ]
    assert serialize_history(history, show_reasoning=show_reasoning).count(CALL_OPEN) >= len(calls)
    messages = build_rehearse_messages(TASK, calls[0], history, system_prompt="Play the bank.",
                                       show_reasoning=show_reasoning, reasoning=turn.reasoning, all_tools=True)
    for message in messages:
        message["content"].encode("utf-8")


# --- judge reply (ViTA rubric scoring) -------------------------------------------------------------------------------


@settings(max_examples=150)
@given(hostile_text | st.builds(lambda v: json.dumps({"met": v}), json_values)
       | st.sampled_from(ODD_NUMBERS).map(lambda n: f'{{"met": [{n}]}}'))
def test_judge_reply_parser_never_raises(text: str) -> None:
    """A judge reply is a subset of the offered rubric numbers, or None; it never raises."""
    met = parse_judge_reply(text, [1, 2, 3])
    assert met is None or met <= {1, 2, 3}


# --- nothing executes ------------------------------------------------------------------------------------------------

FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__", "breakpoint", "import_module"}
FORBIDDEN_METHODS = {"literal_eval", "system", "popen", "import_module", "Popen", "run_path", "run_module"}
FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "yaml", "subprocess", "runpy", "dill", "cloudpickle"}


@pytest.mark.parametrize("module", ["envace/roles/parsing.py", "envace/roles/rehearse.py",
                                    "envace/benchmarks/vita_scoring.py"])
def test_parsers_use_no_eval_exec_or_pickle(module: str) -> None:
    """The parsers' source calls no eval/exec/compile/pickle/subprocess/dynamic import (only ``json`` reads text)."""
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = {(node.module or "") if isinstance(node, ast.ImportFrom) else a.name for a in node.names}
            assert not {n.split(".")[0] for n in names} & FORBIDDEN_MODULES, (module, node.lineno)
        if isinstance(node, ast.Call):
            func = node.func
            assert not (isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS), (module, node.lineno)
            assert not (isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_METHODS), (module, node.lineno)


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injected_code_is_never_executed(payload: str) -> None:
    """Code in names, arguments, keys, reasoning and results stays text: the marker file is never created."""
    text = (f"{THINK_OPEN}{payload}{THINK_CLOSE}{payload}"
            + _call_text(payload, json.dumps({payload: payload, "account": payload}))
            + _call_text("get_balance", json.dumps({"account": payload})))
    turn = parse_act_output(text)
    _assert_safe_turn(turn, text)
    for call in turn.calls:
        assert isinstance(call, ToolCall)
        assert validate_call(call, TASK) is not None  # unknown tool / pattern mismatch, reported as data
    result = parse_execution_result(f"{RESULT_OPEN}{json.dumps({'result': payload})}{RESULT_CLOSE}")
    assert result.ok and result.value == {"result": payload}
    assert parse_judge_reply(payload, [1]) is None


# --- regressions -----------------------------------------------------------------------------------------------------


def test_bug_deep_nesting_in_a_tool_call_raised_recursion_error() -> None:
    (call,) = parse_act_output(f"{CALL_OPEN}{_nested(100_000)}{CALL_CLOSE}").calls
    assert isinstance(call, CallError) and call.code == "JSON_DECODE_ERROR" and "nested deeper" in call.message
    (call,) = parse_act_output(_call_text("anything", json.dumps("[" * 100_000))).calls
    assert isinstance(call, CallError) and call.code == "INVALID_ARGUMENTS_TYPE"


def test_bug_deep_nesting_in_an_execution_result_raised_recursion_error() -> None:
    result = parse_execution_result(f"{RESULT_OPEN}{_nested(100_000)}{RESULT_CLOSE}")
    assert not result.ok and result.error is not None and result.error.code == "RESULT_JSON_DECODE_ERROR"


def test_nesting_limit_is_exact() -> None:
    ok = parse_execution_result(f"{RESULT_OPEN}{_nested(MAX_JSON_DEPTH)}{RESULT_CLOSE}")
    deep = parse_execution_result(f"{RESULT_OPEN}{_nested(MAX_JSON_DEPTH + 1)}{RESULT_CLOSE}")
    assert ok.ok and not deep.ok


def test_bug_lone_surrogate_escape_reached_the_tokenizer() -> None:
    # before: ToolCall(name='\ud800') and result values with lone surrogates, which crash the tokenizer downstream
    (call,) = parse_act_output(f'{CALL_OPEN}{{"name": "\\ud800", "arguments": {{}}}}{CALL_CLOSE}').calls
    assert isinstance(call, CallError) and call.code == "JSON_DECODE_ERROR" and "\\ud800" in call.message
    result = parse_execution_result(f'{RESULT_OPEN}{{"balance": "\\udfff"}}{RESULT_CLOSE}')
    assert not result.ok and result.error is not None and "balance" in result.error.message
    result.content.encode("utf-8")
    paired = parse_execution_result(f'{RESULT_OPEN}{{"face": "\\ud83d\\ude00"}}{RESULT_CLOSE}')
    assert paired.ok and paired.value == {"face": "\U0001f600"}


def test_bug_out_of_range_number_crashed_validate_call() -> None:
    # before: 1e400 decoded to inf and 10**400 to an int, and jsonschema's multipleOf raised OverflowError
    for number in ("1e400", str(10**400)):
        (call,) = parse_act_output(_call_text("transfer", f'{{"amount": {number}, "to": "A1"}}')).calls
        assert isinstance(call, CallError) and call.code == "JSON_DECODE_ERROR" and "amount" in call.message


def test_bug_judge_reply_deep_nesting_or_long_integer_raised() -> None:
    assert parse_judge_reply(_nested(100_000), [1]) is None  # was RecursionError
    assert parse_judge_reply('{"met": [' + "9" * 5000 + "]}", [1]) is None  # was ValueError (int digit limit)
