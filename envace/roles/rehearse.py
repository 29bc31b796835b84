"""The rehearse role's prompt: the policy playing the environment for one tool call.

Pure text. The prompt is a fresh two-message chat (system instruction, then a user message made of blocks: the
available tools, the world context, the visible conversation so far, and the call to execute). By default the
rehearse role does not see the act role's private reasoning (``<think>`` blocks are removed from the history), which
closes the reference implementation's collusion channel.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from envace.types import Task, ToolCall

RESULT_OPEN = "<execution_result>"
RESULT_CLOSE = "</execution_result>"


THINK_RULE = ("- Before the result, work it out briefly between <think> and </think>: the state the call reads, the "
              "check it must pass, the arithmetic.")
"""The rule a thinking rehearse role is given (``RehearseWorld(think=True)``), appended to the system prompt."""


def default_system_prompt(think: bool = False) -> str:
    """The packaged rehearse-role system instruction; with ``think``, plus the rule to reason first."""
    text = files("envace.prompts").joinpath("rehearse_system.txt").read_text(encoding="utf-8").strip()
    return f"{text}\n{THINK_RULE}" if think else text


def format_result(content: str, reasoning: str = "") -> str:
    """The output contract: what a correct rehearsal of ``content`` (JSON text) looks like.

    Args:
        content: the response's JSON text.
        reasoning: the environment's working before it (``<think>`` block first; empty: none).
    """
    result = f"{RESULT_OPEN}\n{content}\n{RESULT_CLOSE}"
    return f"<think>\n{reasoning}\n</think>\n{result}" if reasoning else result


def serialize_history(messages: list[dict[str, Any]], *, show_reasoning: bool = False) -> str:
    """One line block per message: ``User: ...``, ``Assistant: ...``, ``Tool[name]: ...``; system messages skipped.

    Args:
        messages: the semantic conversation (assistant messages carry parsed ``tool_calls`` and optional
            ``reasoning``).
        show_reasoning: include the act role's private reasoning.
    """
    lines: list[str] = []
    for m in messages:
        role = m["role"]
        if role == "user":
            lines.append(f"User: {m['content']}")
        elif role == "assistant":
            text = m.get("content") or ""
            if show_reasoning and m.get("reasoning"):
                text = f"<think>{m['reasoning']}</think>{text}"
            for tc in m.get("tool_calls") or []:
                fn = tc["function"]
                call = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
                text += f"\n<tool_call>{call}</tool_call>"
            lines.append(f"Assistant: {text.strip()}")
        elif role == "tool":
            lines.append(f"Tool[{m.get('name', '')}]: {m['content']}")
    return "\n".join(lines)


def build_rehearse_messages(
    task: Task,
    call: ToolCall,
    history: list[dict[str, Any]],
    *,
    system_prompt: str,
    show_reasoning: bool = False,
    reasoning: str = "",
    all_tools: bool = False,
) -> list[dict[str, str]]:
    """The rehearse role's chat for one call.

    Args:
        task: the task (tools and world context).
        call: the schema-valid call to execute.
        history: the semantic conversation before the call (the assistant message that made the call excluded).
        system_prompt: the system instruction.
        show_reasoning: let the rehearse role see the act role's private reasoning.
        reasoning: the act role's private reasoning in the turn that made the call (used with ``show_reasoning``).
        all_tools: list every tool's schema; by default only the called tool's (calls reach the world already
            validated against their schema, and the shorter prompt makes rehearsal cheaper).
    """
    tools = [t for t in task.tools if all_tools or t["function"]["name"] == call.name]
    blocks = ["Tools:\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)]
    if task.world_context:
        blocks.append("World state (hidden from the agent):\n" + task.world_context)
    conversation = serialize_history(history, show_reasoning=show_reasoning)
    blocks.append("Conversation so far:\n" + (conversation or "(none)"))
    if show_reasoning and reasoning:
        blocks.append(f"Agent's reasoning before the call:\n{reasoning}")
    blocks.append(
        "Call to execute:\n" + json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    )
    blocks.append(f"Answer with {RESULT_OPEN} JSON {RESULT_CLOSE}.")
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": "\n\n".join(blocks)}]
