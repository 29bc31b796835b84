"""Hostile task files: property-based tests of the JSONL task loader.

Whatever a task file holds (random bytes, truncated JSON, huge strings, deep nesting, lone surrogates as ``\\ud800``
escapes or invalid UTF-8 bytes, wrong types in any field, unknown tools, schema-violating arguments, code), loading
it either succeeds or raises ``TaskFormatError`` (a ``ValueError``) whose one-line message names the file, the line
and, for a record problem, the field. Nothing in the file is executed.

Duplicate keys in a JSON object: the last one wins, as in Python's ``json`` (documented in ``envace.data.tasks``).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.builtin.task_sets import load_task_set
from envace.data.task_parsing import parse_task
from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks, write_tasks
from envace.roles.parsing import MAX_JSON_DEPTH, validate_call
from envace.types import ToolCall

MARKER = Path("/tmp/pwned_envace")
INJECTIONS = (
    "__import__('os').system('touch /tmp/pwned_envace')",
    "eval(\"__import__('os').system('touch /tmp/pwned_envace')\")",
    "$(touch /tmp/pwned_envace)",
    "!!python/object/apply:os.system ['touch /tmp/pwned_envace']",
    "cos\nsystem\n(S'touch /tmp/pwned_envace'\ntR.",
)
BALANCE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_balance",
        "description": "Get a balance.",
        "parameters": {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]},
    },
}
RECORD: dict[str, Any] = {
    "id": "bank-0001",
    "messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Balance of A1?"}],
    "tools": [BALANCE_TOOL],
    "success": {
        "calls": [{"name": "get_balance", "arguments": {"account": "A1"}, "weight": 2}],
        "ordered": True,
        "answer": {"equals": "120", "contains": ["120"], "weight": 1.0},
        "forbid_extra_calls": False,
    },
    "reference": [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}]},
        {"role": "tool", "name": "get_balance", "content": '{"balance": 120}'},
        {"role": "assistant", "content": "120"},
    ],
    "world_context": "Accounts: A1 balance 120",
    "user_turns": [[{"role": "user", "content": "And A2?"}]],
    "tool_unlocks": [["get_balance"]],
    "user": "You are a bank customer.",
}
TASK = parse_task(copy.deepcopy(RECORD))

# every field of the record, as a path; each is replaced by a value of another JSON type
FIELDS: tuple[tuple[str | int, ...], ...] = (
    ("id",), ("messages",), ("messages", 0), ("messages", 0, "role"), ("messages", 1, "content"),
    ("tools",), ("tools", 0), ("tools", 0, "type"), ("tools", 0, "function"), ("tools", 0, "function", "name"),
    ("tools", 0, "function", "description"), ("tools", 0, "function", "parameters"),
    ("tools", 0, "function", "parameters", "properties"), ("tools", 0, "function", "parameters", "required"),
    ("success",), ("success", "calls"), ("success", "calls", 0), ("success", "calls", 0, "name"),
    ("success", "calls", 0, "arguments"), ("success", "calls", 0, "weight"), ("success", "ordered"),
    ("success", "answer"), ("success", "answer", "equals"), ("success", "answer", "contains"),
    ("success", "answer", "weight"), ("success", "forbid_extra_calls"),
    ("reference",), ("reference", 0), ("reference", 0, "tool_calls"), ("reference", 0, "tool_calls", 0),
    ("reference", 0, "tool_calls", 0, "function", "name"), ("reference", 0, "tool_calls", 0, "function", "arguments"),
    ("reference", 1, "content"), ("reference", 1, "name"), ("reference", 1, "role"),
    ("world_context",), ("user_turns",), ("user_turns", 0), ("user_turns", 0, 0, "role"), ("tool_unlocks",),
    ("tool_unlocks", 0), ("user",), ("environment",),
)
# the fields an error may name when a top-level field is broken (others are checked against it)
NAMED_WITH = {
    "tools": ("tools", "success", "reference", "tool_unlocks"),
    "user_turns": ("user_turns", "tool_unlocks"),
    "environment": ("environment", "tools"),
}

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.sampled_from(INJECTIONS)
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=10,
)


def _type(value: Any) -> str:
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__


def _set(record: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    record = copy.deepcopy(record)
    node: Any = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return record


def _get(record: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    node: Any = record
    for key in path:
        node = node[key] if not isinstance(node, dict) or key in node else None
    return node


def _field(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(autouse=True)
def _no_marker() -> Iterator[None]:
    assert not MARKER.exists(), f"{MARKER} exists before the test: remove it"
    yield
    assert not MARKER.exists(), "task file content was executed"


def _load(workdir: Path, data: bytes) -> tuple[Path, str | None]:
    """Write ``data`` as a task file and load it: ``(path, None)`` or ``(path, the one-line error)``."""
    path = workdir / "tasks.jsonl"
    path.write_bytes(data)
    try:
        tasks = load_tasks(path)
    except TaskFormatError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, message
        assert message.startswith(f"{path}:"), message
        message.encode("utf-8")  # printable and loggable
        return path, message
    for task in tasks:  # a loaded task never makes call validation raise
        for spec in task.tools:
            validate_call(ToolCall(spec["function"]["name"], {"account": "A1"}), task)
    return path, None


def _line(record: Any) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"


# --- properties ------------------------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(st.binary(max_size=400) | st.lists(st.sampled_from([b"{", b"}", b"[", b"\n", b'"id"', b":", b"\xff", b"\x80",
                                                            b"\xed\xa0\x80", b"\\ud800", b"NaN", b" "]),
                                          max_size=40).map(b"".join))
def test_random_bytes_raise_only_task_format_error(workdir: Path, data: bytes) -> None:
    """Random bytes load or raise TaskFormatError naming the file and (unless the file is empty) the line."""
    path, message = _load(workdir, data)
    if message is not None:
        assert re.match(rf"{re.escape(str(path))}:(\d+: |\s*no tasks)", message), message


@settings(max_examples=60)
@given(st.data())
def test_truncated_json_names_file_and_line(workdir: Path, data: st.DataObject) -> None:
    """A record cut anywhere is 'invalid JSON' on its own line."""
    line = json.dumps(RECORD)
    cut = data.draw(st.integers(1, len(line) - 1))
    second = {**RECORD, "id": "bank-0002"}
    path, message = _load(workdir, _line(second) + line[:cut].encode() + b"\n")
    assert message is not None and message.startswith(f"{path}:2: invalid JSON"), message


@settings(max_examples=250)
@given(st.sampled_from(FIELDS), json_values)
def test_wrong_type_in_any_field_names_the_field(workdir: Path, path: tuple[str | int, ...], value: Any) -> None:
    """A value of another JSON type in any field loads (optional fields) or is an error naming that field."""
    original = _get(RECORD, path)
    if original is not None and _type(value) == _type(original):
        value = [value] if not isinstance(original, list) else {"x": value}
    file, message = _load(workdir, _line(_set(RECORD, path, value)))
    if message is None:
        return
    assert message.startswith(f"{file}:1: field '"), message
    named = message[len(f"{file}:1: field '") :]
    assert named.startswith(NAMED_WITH.get(str(path[0]), (str(path[0]),))), (path, message)


@settings(max_examples=80)
@given(st.sampled_from(list(RECORD)), json_values)
def test_duplicate_keys_last_wins(workdir: Path, key: str, first: Any) -> None:
    """A duplicated key: the last value wins (as in ``json``); an earlier hostile value is ignored."""
    text = json.dumps(RECORD)
    last_wins = "{" + json.dumps(key) + ": " + json.dumps(first) + ", " + text[1:]
    _, message = _load(workdir, last_wins.encode() + b"\n")
    assert message is None
    assert load_tasks(workdir / "tasks.jsonl") == [TASK]


@settings(max_examples=60)
@given(st.text(min_size=1, max_size=20).filter(lambda n: n != "get_balance") | st.sampled_from(INJECTIONS),
       st.sampled_from(["success", "reference", "unlock"]))
def test_unknown_tools_are_named(workdir: Path, name: str, where: str) -> None:
    """A tool the task lacks, in the success calls, a reference call or the unlocks, is an error at that field."""
    if where == "success":
        record, field = _set(RECORD, ("success", "calls", 0, "name"), name), "success.calls[0].name': unknown tool"
    elif where == "reference":
        record = _set(RECORD, ("reference", 0, "tool_calls", 0, "function", "name"), name)
        field = "reference[0].tool_calls[0].function': UNKNOWN_TOOL"
    else:
        record, field = _set(RECORD, ("tool_unlocks", 0, 0), name), "tool_unlocks[0][0]': "
    file, message = _load(workdir, _line(record))
    assert message is not None and message.startswith(f"{file}:1: field '{field}"), message


@settings(max_examples=60)
@given(json_values.filter(lambda v: not isinstance(v, str)))
def test_schema_violating_reference_arguments_are_named(workdir: Path, value: Any) -> None:
    """A reference call whose argument breaks the tool schema is INVALID_ARGUMENTS at that call, naming $.account."""
    record = _set(RECORD, ("reference", 0, "tool_calls", 0, "function", "arguments"), {"account": value})
    file, message = _load(workdir, _line(record))
    prefix = f"{file}:1: field 'reference[0].tool_calls[0].function': INVALID_ARGUMENTS: "
    assert message is not None and message.startswith(prefix) and "invalid at $.account" in message, message


@settings(max_examples=40)
@given(st.text(min_size=1, max_size=10).filter(lambda k: k != "account"))
def test_undeclared_expected_argument_is_named(workdir: Path, key: str) -> None:
    """An expected-call argument the tool does not declare is an error naming the argument."""
    file, message = _load(workdir, _line(_set(RECORD, ("success", "calls", 0, "arguments"), {key: 1})))
    assert message is not None and message.startswith(f"{file}:1: field 'success.calls[0].arguments."), message
    assert "has no parameter" in message


@settings(max_examples=60)
@given(st.integers(1, 12_000), st.sampled_from([("world_context",), ("success", "calls", 0, "arguments", "account"),
                                                ("reference", 0, "tool_calls", 0, "function", "arguments", "account"),
                                                ("messages", 1, "extra")]))
def test_deep_nesting_is_an_error_naming_the_field(workdir: Path, depth: int, path: tuple[str | int, ...]) -> None:
    """Nesting past MAX_JSON_DEPTH (e.g. 10k nested lists) is a clear error, never RecursionError."""
    text = json.dumps(_set(RECORD, path, "@@deep@@")).replace('"@@deep@@"', "[" * depth + "]" * depth)
    file, message = _load(workdir, text.encode() + b"\n")
    if depth + len(path) > MAX_JSON_DEPTH:  # the record and the containers on the path hold the nested lists
        assert message is not None and message.startswith(f"{file}:1: field '"), message
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in message
    else:  # a wrong type where a type is checked (success-call values are compared, not schema-checked)
        assert message is None or message.startswith(f"{file}:1: field '"), message


STRING_FIELDS: tuple[tuple[str | int, ...], ...] = (
    ("id",), ("messages", 1, "content"), ("world_context",), ("tools", 0, "function", "description"),
    ("success", "answer", "equals"), ("success", "answer", "contains", 0), ("reference", 2, "content"), ("user",),
    ("success", "calls", 0, "arguments", "account"),
)


@settings(max_examples=60)
@given(st.sampled_from(STRING_FIELDS), st.integers(0xD800, 0xDFFF), st.text(max_size=5), st.booleans())
def test_lone_surrogate_escape_is_refused_naming_the_field(workdir: Path, path: tuple[str | int, ...], code: int,
                                                           around: str, as_key: bool) -> None:
    """A ``\\ud800``-style escape in any string (or key) is an error naming that field."""
    text = json.dumps(_set(RECORD, path, "@@s@@"), ensure_ascii=False)
    escape = f"{json.dumps(around)[1:-1]}\\u{code:04x}"
    text = text.replace('"@@s@@"', f'{{"{escape}": 1}}') if as_key else text.replace("@@s@@", escape)
    file, message = _load(workdir, text.encode() + b"\n")
    assert message is not None, text
    assert message.startswith(f"{file}:1: field '{_field(path)}"), message
    assert "lone surrogate" in message


@settings(max_examples=60)
@given(st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"]), st.data())
def test_invalid_utf8_names_the_line(workdir: Path, bad: bytes, data: st.DataObject) -> None:
    """Invalid UTF-8 bytes anywhere are 'not UTF-8 text' naming the line that holds them."""
    lines = [_line({**RECORD, "id": f"t{i}"}) for i in range(3)]
    number = data.draw(st.integers(0, 2))
    at = data.draw(st.integers(1, len(lines[number]) - 2))
    lines[number] = lines[number][:at] + bad + lines[number][at:]
    file, message = _load(workdir, b"".join(lines))
    assert message is not None and message.startswith(f"{file}:{number + 1}: not UTF-8 text"), message


@settings(max_examples=40)
@given(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", str(10**400), "9" * 5000]),
       st.sampled_from([("success", "calls", 0, "arguments", "account"), ("world_context",),
                        ("reference", 0, "tool_calls", 0, "function", "arguments", "account")]))
def test_non_finite_and_huge_numbers_are_refused(workdir: Path, number: str, path: tuple[str | int, ...]) -> None:
    """NaN, Infinity, 1e400, 10**400 and over-long integers are clear errors on their line, not crashes."""
    text = json.dumps(_set(RECORD, path, "@@n@@")).replace('"@@n@@"', number)
    file, message = _load(workdir, text.encode() + b"\n")
    assert message is not None and message.startswith(f"{file}:1: "), message


@settings(max_examples=40)
@given(st.sampled_from(INJECTIONS), st.sampled_from([*FIELDS, ("environment", "class_path")]))
def test_code_in_any_field_is_never_executed(workdir: Path, payload: str, path: tuple[str | int, ...]) -> None:
    """Code strings in any field (the environment class path included) stay data."""
    record = _set(RECORD, path, payload) if path != ("environment", "class_path") else {
        **RECORD, "environment": {"class_path": payload}}
    _load(workdir, _line(record))


@settings(max_examples=60)
@given(st.sampled_from(["²", "0", "-1", "1e3", "", " 1"]) | st.text(max_size=20).filter(lambda t: not t.isascii()),
       st.sampled_from(["", "bank:", "x:"]))
def test_task_set_specs_raise_only_task_format_error(spec: str, middle: str) -> None:
    """A bad ``builtin:`` spec (name or count) is a TaskFormatError (quoting the spec), never another exception."""
    try:
        load_task_set(f"builtin:{middle}{spec}")
    except TaskFormatError as exc:
        assert f"builtin:{middle}{spec}" in str(exc)


# --- regressions -----------------------------------------------------------------------------------------------------


def test_bug_deeply_nested_line_raised_recursion_error(workdir: Path) -> None:
    file, message = _load(workdir, b"[" * 10_000 + b"]" * 10_000 + b"\n")
    assert message == f"{file}:1: field '<record>': nested deeper than {MAX_JSON_DEPTH} levels"


def test_bug_lone_surrogate_escape_was_accepted(workdir: Path) -> None:
    text = json.dumps(RECORD).replace('"bank-0001"', '"bank-\\ud800"')
    file, message = _load(workdir, text.encode() + b"\n")
    assert message is not None and message.startswith(f"{file}:1: field 'id': a string holds a lone surrogate")


def test_bug_unhashable_expected_call_name_raised_type_error(workdir: Path) -> None:
    file, message = _load(workdir, _line(_set(RECORD, ("success", "calls", 0, "name"), ["get_balance"])))
    assert message is not None and message.startswith(f"{file}:1: field 'success.calls[0].name': unknown tool")


def test_bug_relative_class_path_raised_type_error(workdir: Path) -> None:
    file, message = _load(workdir, _line({**RECORD, "environment": {"class_path": "..x"}}))
    assert message is not None and message.startswith(f"{file}:1: field 'environment.class_path': must be a dotted")


def test_bug_line_separator_inside_a_string_split_the_record(workdir: Path) -> None:
    task = parse_task({**copy.deepcopy(RECORD), "world_context": "a\u2028b\u2029c\x85d"})
    assert write_tasks([task], workdir / "round.jsonl") == {"written": 1, "skipped_schema": 0}
    assert load_tasks(workdir / "round.jsonl") == [task]


def test_bug_invalid_utf8_error_named_no_line(workdir: Path) -> None:
    file, message = _load(workdir, _line(RECORD) + b'{"id": "\xff"}\n')
    assert message is not None and message.startswith(f"{file}:2: not UTF-8 text")


def test_bug_long_integer_raised_a_plain_value_error(workdir: Path) -> None:
    # before: json's int digit limit raised a ValueError that named neither file nor line
    record = _set(RECORD, ("reference", 0, "tool_calls", 0, "function", "arguments"), '{"account": ' + "9" * 5000 + "}")
    file, message = _load(workdir, _line(record))
    assert message is not None and message.startswith(f"{file}:1: field 'reference[0].tool_calls[0].function.arg")
    file, message = _load(workdir, json.dumps(RECORD).replace('"A1"}', "9" * 5000 + "}", 1).encode() + b"\n")
    assert message is not None and message.startswith(f"{file}:1: invalid JSON: Exceeds the limit")


def test_bug_unresolvable_ref_crashed_validate_call_after_loading(workdir: Path) -> None:
    for ref in ("#/$defs/missing", "https://example.invalid/schema.json"):
        tool = _set(BALANCE_TOOL, ("function", "parameters", "properties", "account"), {"$ref": ref})
        file, message = _load(workdir, _line({**RECORD, "tools": [tool]}))
        assert message is not None and message.startswith(f"{file}:1: field 'tools[0].function.parameters': "
                                                          "not a valid JSON schema at properties/account/$ref: ")
    tool = _set(BALANCE_TOOL, ("function", "parameters"), {
        "type": "object", "properties": {"account": {"$ref": "#/$defs/id"}}, "$defs": {"id": {"type": "string"}},
        "default": {"$ref": "data, not a reference"}})
    assert _load(workdir, _line({**RECORD, "tools": [tool]}))[1] is None


def test_bug_deep_reference_response_broke_the_alignment_rows(workdir: Path) -> None:
    for content in ("[" * 5000 + "]" * 5000, '"\\udc00"', "[" + "9" * 5000 + "]"):
        file, message = _load(workdir, _line(_set(RECORD, ("reference", 1, "content"), content)))
        assert message is not None and message.startswith(f"{file}:1: field 'reference[1].content': holds JSON")
    assert _load(workdir, _line(_set(RECORD, ("reference", 1, "content"), '{"mean": NaN} plain')))[1] is None
    assert _load(workdir, _line(_set(RECORD, ("reference", 1, "content"), '{"mean": NaN}')))[1] is None


def test_bug_non_ascii_digit_count_raised_value_error() -> None:
    with pytest.raises(TaskFormatError, match="task count must be an integer"):
        load_task_set("builtin:bank:²")


def test_bug_newline_in_a_key_split_the_error_line(workdir: Path) -> None:
    file, message = _load(workdir, _line(_set(RECORD, ("success", "calls", 0, "arguments"), {"a\nb": 1})))
    assert message == f"{file}:1: field 'success.calls[0].arguments.a b': 'get_balance' has no parameter 'a b'"


def test_huge_strings_load(workdir: Path) -> None:
    record = {**RECORD, "id": "x" * 1_000_000, "world_context": "\U0001f600" * 1_000_000}
    path, message = _load(workdir, _line(record))
    assert message is None and load_tasks(path)[0].world_context == "\U0001f600" * 1_000_000
