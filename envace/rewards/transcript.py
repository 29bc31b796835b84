"""An episode's conversation as a judge reads it: user turns and their steps, reasoning, tool errors, serialisation.

A user turn is a run of user messages and the assistant and tool messages that follow it; its steps are its
assistant messages (``split_user_turns``). ``serialise_messages`` writes messages as the judge prompt shows them
(``envace.rewards.checklist_prompt``), numbered by turn and step; ``is_tool_error`` tells a tool message that
reports an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.roles.parsing import loads_json
from envace.types import is_error_value


@dataclass
class UserTurn:
    """One user turn of an episode's messages.

    Attributes:
        start: index of its first user message in ``episode.messages``.
        end: index one past its last message.
        steps: indices of its assistant messages (the steps), in order.
        completed: the assistant finished the turn (a reply without tool calls), or the conversation moved on.
    """

    start: int
    end: int
    steps: list[int]
    completed: bool


def split_user_turns(messages: Sequence[Mapping[str, Any]]) -> list[UserTurn]:
    """The user turns of ``messages``: a run of user messages and the assistant and tool messages that follow it."""
    starts = [i for i, m in enumerate(messages)
              if m.get("role") == "user" and (i == 0 or messages[i - 1].get("role") != "user")]
    turns = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(messages)
        steps = [i for i in range(start, end) if messages[i].get("role") == "assistant"]
        last = messages[steps[-1]] if steps else None
        completed = n + 1 < len(starts) or (last is not None and not last.get("tool_calls"))
        turns.append(UserTurn(start, end, steps, completed))
    return turns


def split_reasoning(message: Mapping[str, Any]) -> tuple[str | None, str]:
    """``(thinking, visible reply)`` of an assistant message.

    The thinking is ``message["reasoning"]`` when present, else a ``<think>...</think>`` block at the start of the
    content; a message without either has no thinking and its whole content is the reply.
    """
    content = str(message.get("content") or "")
    reasoning = message.get("reasoning")
    if reasoning:
        return str(reasoning), content.strip()
    match = re.match(r"\s*<think>(.*?)</think>(.*)", content, flags=re.DOTALL)
    if match:
        return match.group(1).strip(), match.group(2).strip()
    return None, content.strip()


def serialise_message(message: Mapping[str, Any], turn: int | None = None, step: int | None = None) -> str:
    """One message as the judge reads it (``turn`` heads a user message, ``step`` an assistant one)."""
    role = message.get("role", "?")
    if role == "assistant":
        thinking, reply = split_reasoning(message)
        calls = json.dumps(message.get("tool_calls") or [], ensure_ascii=False)
        head = f"## Step: {step}\n" if step is not None else ""
        return (f"{head}Role: assistant\ncontent.thinking: {thinking if thinking is not None else '(none)'}\n"
                f"content.user_visible_reply: {reply or '(none)'}\ntool_call: {calls}")
    content = message.get("content")
    content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if role == "user":
        head = f"# Turn: {turn}\n" if turn is not None else ""
        return f"{head}Role: user\ncontent: {content}"
    if role == "tool" and message.get("name"):
        return f"Role: tool\nname: {message['name']}\ncontent: {content}"
    return f"Role: {role}\ncontent: {content}"


def serialise_messages(messages: Sequence[Mapping[str, Any]], first: int, last: int,
                       turns: Sequence[UserTurn]) -> str:
    """Messages ``first`` to ``last`` (exclusive) joined by blank lines, numbered by turn (from 1) and step."""
    turn_of = {t.start: n + 1 for n, t in enumerate(turns)}
    step_of = {i: s + 1 for t in turns for s, i in enumerate(t.steps)}
    parts = []
    for i in range(first, last):
        message = messages[i]
        parts.append(serialise_message(message, turn=turn_of.get(i), step=step_of.get(i)))
    return "\n\n".join(parts)


def is_tool_error(message: Mapping[str, Any]) -> bool:
    """A tool message reporting an error.

    That is ``{"error": ...}`` content with a truthy value (envace's tool and call errors, and an environment that
    returns an error object instead of raising: ``envace.types.is_error_value``), a message answering a call that
    could not be made (name ``error``), or the reference's ``error_tool_call`` marker.
    """
    if message.get("role") != "tool":
        return False
    if message.get("name") == "error":
        return True
    content = message.get("content")
    if not isinstance(content, str):
        return False
    if "error_tool_call" in content:
        return True
    try:
        value = loads_json(content)
    except ValueError:
        return False
    return is_error_value(value)
