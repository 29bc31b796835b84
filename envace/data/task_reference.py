"""Queries over a task's reference trajectory (its ``reference`` field): the calls, their responses and history.

This module owns reading a loaded task's reference: each call with its recorded response (``reference_calls``), with
the history before it too (``reference_steps``), and the recorded working of each response
(``reference_reasoning``). The loader (``envace.data.task_parsing``) has checked that the tool messages following an
assistant message answer its calls in order. Not to be confused with ``envace.data.reference_format``, the authors'
reference rows read as tasks.
"""

from __future__ import annotations

import json
from typing import Any

from envace.types import Task, ToolCall


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
