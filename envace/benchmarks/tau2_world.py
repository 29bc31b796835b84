"""The world of a tau^2 episode: its tau^2 environment executes the calls and records the tau^2 trajectory.

``Tau2World`` answers the agent's calls, ``Tau2UserTools`` the simulated user's own (telecom's phone), both on the
episode's environment; ``episode_trajectory`` is the trajectory tau^2's evaluators score.
"""

from __future__ import annotations

from typing import Any

from envace.benchmarks.tau2 import fresh_environment


class Tau2World:
    """Executes calls on a fresh, initialised tau^2 environment per episode and records the tau^2 trajectory."""

    generates_with_policy = False

    def __init__(self, tasks: list[Any], domain: str = "telecom", solo: bool = True) -> None:
        self.tasks = {str(t.id): t for t in tasks}
        self.domain, self.solo = domain, solo
        self.opened: list[dict[str, Any]] = []  # per episode, in start order: its environment and trajectory

    def begin_rollout(self, step: int) -> None:
        """Nothing is scheduled."""

    def bind(self, tokenizer: Any, model: Any) -> None:
        """Nothing to bind: the environment does not generate."""

    def open(self, task: Any) -> dict[str, Any]:
        """A fresh environment in the task's initial state (a constructor that raises fails the episode)."""
        handle = {"env": None, "trajectory": []}
        self.opened.append(handle)  # first: ``opened`` stays aligned with the episodes
        handle["env"] = fresh_environment(self.tasks[task.id], self.domain, self.solo)
        return handle

    def respond(self, requests: list[Any], engine: Any, params: Any) -> list[Any]:
        """Each call as the agent's tau^2 tool call; the ToolMessage content is the response."""
        from envace.worlds.base import ToolReply, failed_reply

        replies = []
        for req in requests:
            try:
                content = execute_call(req.handle, req.call, "assistant")
            except Exception as exc:  # noqa: BLE001 - fails this episode only (tau^2 reports tool errors itself)
                replies.append(failed_reply(f"tau^2 environment ({req.call.name})", exc, real_calls=1))
                continue
            replies.append(ToolReply(content=content, ok=True, source="real", real_calls=1, real_content=content))
        return replies


def execute_call(handle: dict[str, Any], call: Any, requestor: str) -> str:
    """Run one call on the episode's environment as ``requestor`` and record it in the tau^2 trajectory."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage

    trajectory = handle["trajectory"]
    tau_call = ToolCall(id=f"call_{len(trajectory)}", name=call.name, arguments=dict(call.arguments),
                        requestor=requestor)
    message = handle["env"].get_response(tau_call)
    sender = AssistantMessage if requestor == "assistant" else UserMessage
    trajectory += [sender(role=requestor, tool_calls=[tau_call]), message]
    return message.content or ""


class Tau2UserTools:
    """The simulated user's own tools (telecom's phone), executed on the episode's tau^2 environment."""

    def schemas(self, request: Any) -> list[dict[str, Any]]:
        """The environment's user tools."""
        return [t.openai_schema for t in request.handle["env"].get_user_tools()]

    def call(self, request: Any, call: Any) -> str:
        """Execute the call as the user (recorded in the trajectory the evaluators replay)."""
        return execute_call(request.handle, call, "user")


def episode_trajectory(episode: Any, handle: dict[str, Any]) -> list[Any]:
    """The tau^2 trajectory of an episode: its calls in execution order, then the agent's messages.

    The evaluators replay the calls (agent's and user's, in the order they ran) and search the agent's messages for
    the strings the task requires; the order of messages relative to calls does not enter the reward.
    """
    from tau2.data_model.message import AssistantMessage

    said = [m["content"] for m in episode.messages[len(episode.task.messages):]
            if m["role"] == "assistant" and (m.get("content") or "").strip()]
    return handle["trajectory"] + [AssistantMessage(role="assistant", content=text) for text in said or [""]]
