"""tau^2's Orchestrator, mirrored: how tau^2 reads an agent message, and where and why a conversation ends.

As in tau^2's ``evaluate_simulation``, only a conversation that ended with the agent's or the user's stop is scored;
every other ending scores 0 (``termination_reason`` mirrors the Orchestrator's: ``agent_error``, ``max_steps``,
``too_many_errors``; ``Tau2Rules`` ends an episode where the Orchestrator would).
"""

from __future__ import annotations

import json
from typing import Any

from envace.benchmarks.tau2_tasks import DONE_TOOL, STOP_TOKEN
from envace.benchmarks.tau2_world import Tau2World
from envace.rollout.rules import LoopRules, awaiting_tools

MAX_STEPS, MAX_ERRORS = 200, 10
"""tau^2's run defaults (``tau2.config.DEFAULT_MAX_STEPS``, ``DEFAULT_MAX_ERRORS``)."""

SCORED_ENDINGS = ("agent_stop", "user_stop")
"""The termination reasons ``evaluate_simulation`` scores; any other ending gets 0."""


def read_agent_message(text: str) -> tuple[str, list[Any] | None]:
    """An act output as tau^2 receives it: ``(content, calls)``; calls None where tau^2 raises on the message.

    A served model's message (``envace.benchmarks.hermes.hermes_message``: vLLM's ``hermes`` parser), then tau^2's
    ``generate``: each call's arguments are ``json.loads``-ed and must be an object (its ``ToolCall`` refuses
    anything else, and the run fails). Content is "" where the parser gave none.
    """
    from envace.benchmarks.hermes import hermes_message
    from envace.types import ToolCall

    content, found = hermes_message(text)
    calls = []
    for name, arguments in found:
        value = json.loads(arguments)
        if not isinstance(value, dict):
            return content or "", None
        calls.append(ToolCall(name, value))
    return content or "", calls


def agent_error(text: str, solo: bool) -> bool:
    """tau^2 fails the run on this agent message (reward 0, ``agent_error``).

    Arguments that are not an object; in solo mode a message without calls (``LLMSoloAgent`` raises; ``###STOP###``
    in text included); in user mode a message with neither calls nor text (``AssistantMessage.validate``: an empty
    or whitespace-only generation, also after ``generate``'s retries, which a greedy model answers the same way).
    """
    content, calls = read_agent_message(text)
    if calls is None:
        return True
    return not calls and (solo or not content.strip())


def calls_done(text: str) -> bool:
    """The act output calls tau^2's ``done`` tool.

    That is the only way a solo agent stops: ``LLMSoloAgent`` raises on a message without tool calls, ``###STOP###``
    in plain text included, and ``run_tasks`` scores that run 0.
    """
    return _has_done(read_agent_message(text)[1] or [])


def _has_done(calls: list[Any]) -> bool:
    from envace.types import ToolCall

    return any(isinstance(c, ToolCall) and c.name == DONE_TOOL["function"]["name"] for c in calls)


class Tau2Rules(LoopRules):
    """tau^2's Orchestrator, mirrored: the solo stop, and the step and error limits.

    Solo: a turn with a ``done`` call is the stop message (``STOP_TOKEN``, its other calls dropped), as
    ``LLMSoloAgent._check_if_stop_toolcall`` makes it. In every mode the episode ends once ``max_errors`` tool
    errors or ``max_steps`` steps are reached at a point where the Orchestrator checks (never while a tool call
    waits for its response); ``steps`` counts as the Orchestrator does.

    Args:
        world: the rollout's ``Tau2World`` (its per-episode trajectory holds the tool errors and the user's calls).
        solo: solo mode.
        max_steps: the Orchestrator's ``max_steps``.
        max_errors: the Orchestrator's ``max_errors``.
    """

    name = "tau2"

    def __init__(self, world: Tau2World, solo: bool, max_steps: int = MAX_STEPS, max_errors: int = MAX_ERRORS) -> None:
        self.world, self.solo = world, solo
        self.max_steps, self.max_errors = max_steps, max_errors

    def parse(self, text: str) -> Any:
        """The message tau^2 receives (``read_agent_message``); in solo mode a turn calling ``done`` is the stop.

        Arguments tau^2 refuses leave the turn without calls (``malformed``); ``stop_reason`` then ends the episode.
        """
        from envace.roles.parsing import ParsedTurn

        content, calls = read_agent_message(text)
        if calls is None:
            return ParsedTurn(content=text.strip(), calls=[], malformed=True)
        if self.solo and _has_done(calls):
            return ParsedTurn(content=STOP_TOKEN)
        return ParsedTurn(content=content.strip(), calls=list(calls))

    def stop_reason(self, episode: Any) -> str:
        """Where the Orchestrator would end the conversation here, or "".

        ``agent_error`` right after an agent message tau^2 fails the run on (``agent_error``; before any limit,
        since the run raises inside its step), else ``too_many_errors`` or ``max_steps``.
        """
        if awaiting_tools(episode):
            return ""
        last = episode.messages[-1] if episode.messages else {}
        if last.get("role") == "assistant" and episode.act_outputs and agent_error(episode.act_outputs[-1][1],
                                                                                    self.solo):
            return "agent_error"
        return limit_reason(episode, self.world.opened[episode.act.episode_index], self.solo, self.max_steps,
                            self.max_errors)


def steps(episode: Any, handle: dict[str, Any], solo: bool) -> int:
    """The Orchestrator's ``step_count``: one per agent and user message and per tool-response batch.

    The opening (the greeting, or in solo mode the agent's first message) is not a step. The user's own tool calls
    (telecom's phone) count two each: the call and its response.
    """
    from tau2.data_model.message import UserMessage

    count = 0
    for message in episode.messages[len(episode.task.messages):]:
        if message["role"] == "assistant":
            count += 2 if message.get("tool_calls") else 1
        elif message["role"] == "user":
            count += 1
    if episode.stats.user_stop and (not episode.messages or episode.messages[-1]["role"] != "user"):
        count += 1  # the stop message itself, when it said nothing else
    if awaiting_tools(episode):
        count -= 1  # its responses have not come yet
    count += 2 * sum(1 for m in handle["trajectory"] if isinstance(m, UserMessage) and m.tool_calls)
    return count - 1 if solo and count > 0 else count


def errors(handle: dict[str, Any]) -> int:
    """Tool responses that were errors (the Orchestrator's ``num_errors``), the user's included."""
    from tau2.data_model.message import ToolMessage

    return sum(1 for m in handle["trajectory"] if isinstance(m, ToolMessage) and m.error)


def limit_reason(episode: Any, handle: dict[str, Any], solo: bool, max_steps: int = MAX_STEPS,
                 max_errors: int = MAX_ERRORS) -> str:
    """``too_many_errors`` or ``max_steps`` if a limit is reached (errors win, as in ``Orchestrator.run``), else ""."""
    if errors(handle) >= max_errors:
        return "too_many_errors"
    return "max_steps" if steps(episode, handle, solo) >= max_steps else ""


def termination_reason(episode: Any, handle: dict[str, Any], solo: bool, max_steps: int = MAX_STEPS,
                       max_errors: int = MAX_ERRORS) -> str:
    """Why the conversation ended, in the Orchestrator's words (``TerminationReason`` values).

    ``agent_stop`` (solo: a ``done`` call), ``user_stop``, ``agent_error`` (solo: a message without tool calls,
    ``###STOP###`` in plain text included), ``max_steps``, ``too_many_errors``; an episode ended by one of envace's
    own budgets (turns, calls, context) is ``envace_budget``. As in ``Orchestrator.run``, the limits are checked
    after the last message too, so a stop on the step that reaches a limit is that limit.
    """
    if episode.stats.stop_reason:
        return episode.stats.stop_reason
    answer = episode.final_answer
    if solo and answer is not None:
        natural = "agent_stop" if episode.act_outputs and calls_done(episode.act_outputs[-1][1]) else "agent_error"
    elif not solo and episode.stats.user_stop:
        natural = "user_stop"
    else:
        natural = "envace_budget"
    return limit_reason(episode, handle, solo, max_steps, max_errors) or natural
