"""Parsing of model output and validation of tool calls.

This module owns reading the act role's turns (``<tool_call>{json}</tool_call>`` blocks, optional ``<think>``
reasoning) and the rehearse role's outputs (``<execution_result>{json}</execution_result>``), and checking calls
against a task's tool schemas. Every function here is pure and never raises on model output: problems come back as
``CallError`` values whose JSON form is the tool message the act role sees. Only ``json`` is used to read model text
(``loads_json``: nothing is evaluated), and decoded values that would break a later step are refused as invalid JSON:
nesting deeper than ``MAX_JSON_DEPTH``, lone surrogates (``\\ud800`` escapes, which tokenizers and UTF-8 writers
reject), and numbers outside the finite double range. Duplicate keys in an object: the last one wins, as in ``json``.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from envace.types import Task, ToolCall, canonical_json

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
_RESULT_BLOCK = re.compile(re.escape(RESULT_OPEN) + r"(.*?)" + re.escape(RESULT_CLOSE), re.DOTALL)
_MAX_VALIDATORS = 1024
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_JSON_DEPTH = 100
"""The deepest nesting of arrays and objects ``loads_json`` accepts (recursive helpers downstream stay in bounds)."""


@dataclass(frozen=True)
class CallError:
    """A structured problem with a tool call or a rehearsed response.

    Attributes:
        code: machine-readable code, e.g. ``JSON_DECODE_ERROR`` or ``UNKNOWN_TOOL``.
        message: one human-readable line.
    """

    code: str
    message: str

    def to_content(self) -> str:
        """The tool message content the act role sees: ``{"error": {"code": ..., "message": ...}}``."""
        return json.dumps({"error": {"code": self.code, "message": self.message}}, ensure_ascii=False)


@dataclass
class ParsedTurn:
    """One act-role turn, parsed.

    Attributes:
        content: the text before the first ``<tool_call>``, with the reasoning removed, stripped.
        reasoning: the ``<think>`` text (empty when there is none).
        calls: one entry per tool call block (or per element of a block holding a JSON list), in order.
        malformed: some block could not be read as a tool call.
    """

    content: str
    reasoning: str = ""
    calls: list[ToolCall | CallError] = field(default_factory=list)
    malformed: bool = False


@dataclass(frozen=True)
class ExecutionResult:
    """One rehearse-role output, parsed.

    Attributes:
        ok: a well-formed result was found.
        content: ``json.dumps(value, ensure_ascii=False)`` when ok, else the error's tool-message content.
        error: what went wrong, when not ok.
        value: the decoded JSON value when ok, else None.
    """

    ok: bool
    content: str
    error: CallError | None = None
    value: Any = None


# ---------------------------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


class UnsafeJSONError(ValueError):
    """Decoded JSON that envace refuses to pass on.

    Attributes:
        path: where, as ``key[0].key`` (empty for the whole value).
        problem: what is wrong, one line.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{problem} at {path}" if path else problem)
        self.path = path
        self.problem = problem


def loads_json(text: str, *, strict_numbers: bool = True) -> Any:
    """``json.loads`` for untrusted text: a ``ValueError`` for anything unusable, never another exception.

    Args:
        text: the JSON text.
        strict_numbers: also refuse ``NaN``, ``Infinity`` and numbers outside the finite double range (not
            interoperable JSON; they break canonical comparisons and schema checks).

    Raises:
        json.JSONDecodeError: not JSON.
        UnsafeJSONError: nested deeper than ``MAX_JSON_DEPTH``, a lone surrogate, or (strict) an out-of-range number.
        ValueError: (strict) a ``NaN``/``Infinity`` literal, or an integer of more digits than Python converts.
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant if strict_numbers else None)
    except RecursionError as exc:
        raise UnsafeJSONError("", f"nested deeper than {MAX_JSON_DEPTH} levels") from exc
    check_json_value(value, strict_numbers=strict_numbers)
    return value


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_json_value(value: Any, *, strict_numbers: bool = True) -> None:
    """Raise ``UnsafeJSONError`` naming the first place where decoded JSON ``value`` is unsafe (see ``loads_json``)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]  # iterative: the check itself must not recurse
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise UnsafeJSONError(path, "a string holds a lone surrogate (\\ud800-\\udfff)")
        elif isinstance(item, float | int) and not isinstance(item, bool):
            if strict_numbers and not abs(item) <= sys.float_info.max:  # also NaN and inf; exact for ints
                raise UnsafeJSONError(path, "a number is outside the finite double range")
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise UnsafeJSONError(path, f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                children = []
                for key, child in item.items():
                    key_path = f"{path}.{_printable(key)}" if path else _printable(key)
                    if _SURROGATE.search(key):
                        raise UnsafeJSONError(key_path, "a key holds a lone surrogate (\\ud800-\\udfff)")
                    children.append((child, key_path, depth + 1))
            else:
                children = [(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item)]
            stack.extend(reversed(children))


def _decode_error(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    return f"invalid JSON: {exc}"


def split_reasoning(text: str) -> tuple[str, str]:
    """Split model text into ``(reasoning, rest)``.

    Everything before the last ``</think>`` is reasoning (so nested or repeated think blocks, and a missing opening
    tag added by the chat template, are handled); an unclosed ``<think>`` turns the rest of the text into reasoning.
    """
    end = text.rfind(THINK_CLOSE)
    if end >= 0:
        reasoning = text[:end].replace(THINK_OPEN, "").replace(THINK_CLOSE, "")
        return reasoning.strip(), text[end + len(THINK_CLOSE) :]
    start = text.find(THINK_OPEN)
    if start >= 0:
        return text[start + len(THINK_OPEN) :].strip(), text[:start]
    return "", text


# ---------------------------------------------------------------------------------------------------------------------
# Act role
# ---------------------------------------------------------------------------------------------------------------------


def parse_act_output(text: str) -> ParsedTurn:
    """Parse one act-role turn.

    Blocks are found tolerantly (any whitespace inside the tags). Text with no tool call block is a plain answer.

    Args:
        text: the decoded generation.

    Returns:
        The parsed turn; malformed blocks are ``CallError`` entries of ``calls``.
    """
    reasoning, rest = split_reasoning(text)
    first = rest.find(CALL_OPEN)
    if first < 0:
        calls: list[ToolCall | CallError] = []
        if CALL_CLOSE in rest:
            calls.append(CallError("MALFORMED_TOOL_CALL", f"found {CALL_CLOSE} without a matching {CALL_OPEN}"))
        return ParsedTurn(content=rest.strip(), reasoning=reasoning, calls=calls, malformed=bool(calls))
    calls = _parse_blocks(rest[first:])
    malformed = any(isinstance(c, CallError) for c in calls)
    return ParsedTurn(content=rest[:first].strip(), reasoning=reasoning, calls=calls, malformed=malformed)


def _parse_blocks(text: str) -> list[ToolCall | CallError]:
    """Parse the tool call blocks of ``text`` (which starts at the first opening tag), stopping at an unclosed one."""
    calls: list[ToolCall | CallError] = []
    position = 0
    while (start := text.find(CALL_OPEN, position)) >= 0:
        match = _CALL_BLOCK.match(text, start)
        if match is None:
            calls.append(CallError("MALFORMED_TOOL_CALL", f"{CALL_OPEN} is never closed with {CALL_CLOSE}"))
            break
        calls.extend(_parse_block(match.group(1)))
        position = match.end()
    return calls


def _parse_block(body: str) -> list[ToolCall | CallError]:
    try:
        value = loads_json(body.strip())
    except ValueError as exc:
        return [CallError("JSON_DECODE_ERROR", f"tool call is {_decode_error(exc)}")]
    if isinstance(value, list):
        if not value:
            return [CallError("MALFORMED_TOOL_CALL", "tool call block holds an empty list")]
        return [_parse_call(item) for item in value]
    return [_parse_call(value)]


def _parse_call(value: Any) -> ToolCall | CallError:
    """One decoded call object: ``{"name": ..., "arguments": ...}`` (or ``parameters``, or OpenAI-style nesting)."""
    if not isinstance(value, dict):
        return CallError("MALFORMED_TOOL_CALL", f"a tool call must be a JSON object, got {json_type_name(value)}")
    if "name" not in value and isinstance(value.get("function"), dict):
        value = value["function"]  # {"type": "function", "function": {"name": ..., "arguments": ...}}
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return CallError("INVALID_TOOL_NAME", f"'name' must be a non-empty string, got {json.dumps(name)}")
    arguments = value.get("arguments", value.get("parameters"))
    if arguments is None:
        arguments = {}  # lenient: a call without arguments
    elif isinstance(arguments, str):
        arguments = _decode_argument_string(arguments)
    if not isinstance(arguments, dict):
        got = json_type_name(arguments)
        return CallError("INVALID_ARGUMENTS_TYPE", f"'arguments' must be a JSON object, got {got}")
    return ToolCall(name=name.strip(), arguments=arguments)


def _decode_argument_string(text: str) -> Any:
    """Arguments given as a JSON string: the decoded value (``{}`` for a blank string), or the text if undecodable."""
    if not text.strip():
        return {}
    try:
        return loads_json(text)
    except ValueError:
        return text


def json_type_name(value: Any) -> str:
    """The JSON type name of a decoded value: object, array, string, number, boolean or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Call validation
# ---------------------------------------------------------------------------------------------------------------------

_validators: dict[str, Draft202012Validator] = {}


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A cached validator for ``schema`` (keyed by its canonical JSON)."""
    key = canonical_json(schema)
    validator = _validators.get(key)
    if validator is None:
        if len(_validators) >= _MAX_VALIDATORS:
            _validators.clear()
        validator = _validators[key] = Draft202012Validator(schema)
    return validator


def validate_call(call: ToolCall, task: Task, check_arguments: bool = True) -> CallError | None:
    """Check a parsed call against the task's tools.

    Args:
        call: the call.
        task: the task whose tools are available.
        check_arguments: also validate the arguments against the tool's JSON schema.

    Returns:
        ``CallError("UNKNOWN_TOOL", ...)``, ``CallError("INVALID_ARGUMENTS", ...)`` or None when the call is valid.
    """
    tool = task.tool(call.name)
    if tool is None:
        available = ", ".join(spec["function"]["name"] for spec in task.tools) or "(none)"
        return CallError("UNKNOWN_TOOL", f"tool '{call.name}' is not available; available: {available}")
    if not check_arguments:
        return None
    error = best_match(_validator(tool["parameters"]).iter_errors(call.arguments))
    if error is None:
        return None
    message = " ".join(error.message.split())
    return CallError("INVALID_ARGUMENTS", f"arguments of '{call.name}' invalid at {error.json_path}: {message}")


# ---------------------------------------------------------------------------------------------------------------------
# Rehearse role
# ---------------------------------------------------------------------------------------------------------------------


def parse_execution_result(text: str) -> ExecutionResult:
    """Parse one rehearse-role output.

    The first ``<execution_result>`` block (after any reasoning) must hold a non-empty JSON object or a JSON array.

    Args:
        text: the decoded generation.

    Returns:
        The parsed result; ``ok=False`` with an error whose content replaces the response.
    """
    _, rest = split_reasoning(text)
    if not rest.strip():
        return _result_error("EMPTY_OUTPUT", "the output is empty")
    start = rest.find(RESULT_OPEN)
    if start < 0:
        return _result_error("NO_EXECUTION_RESULT", f"no {RESULT_OPEN} block found")
    match = _RESULT_BLOCK.match(rest, start)
    if match is None:
        return _result_error("MALFORMED_EXECUTION_RESULT", f"{RESULT_OPEN} is never closed with {RESULT_CLOSE}")
    try:
        value = loads_json(match.group(1).strip())
    except ValueError as exc:
        return _result_error("RESULT_JSON_DECODE_ERROR", f"execution result is {_decode_error(exc)}")
    if not (isinstance(value, list) or (isinstance(value, dict) and value)):
        kind = "an empty object" if value == {} else json_type_name(value)
        return _result_error("INVALID_RESULT_TYPE", f"execution result must be a non-empty object or array, got {kind}")
    return ExecutionResult(ok=True, content=json.dumps(value, ensure_ascii=False), value=value)


def _result_error(code: str, message: str) -> ExecutionResult:
    error = CallError(code, message)
    return ExecutionResult(ok=False, content=error.to_content(), error=error)
