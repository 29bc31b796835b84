"""Simulated users: the other side of a conversation, when a task's user turns are not scripted.

The rollout asks a ``UserSimulator`` for the next user message whenever the act role has answered a user turn in
plain text and the task's scripted ``user_turns`` are used up (or, when the task's messages end with an assistant
greeting, for the opening message). A task opts in with ``Task.user``: the instructions that tell the simulator who
the user is and what they want (tau^2's user scenario, VitaBench's profile and instructions).

``ModelUser`` is a user played by a local model (``ChatModel``: any Hugging Face checkpoint, never trained). It sees
the conversation from the user's side: its system message is the simulation guidelines plus the task's instructions,
its own earlier messages are the assistant turns, and the agent's plain-text replies are the user turns (the agent's
tool calls and tool responses stay hidden, as with a person on the phone). A user with tools of its own (tau^2
telecom's phone) gets a ``UserTools``: the model's ``<tool_call>`` blocks are executed on the episode's environment
and answered before it writes its message; those exchanges stay in the user's private view.

The simulator ends the conversation by writing one of its ``stop_markers`` (tau^2's ``###STOP###``,
``###TRANSFER###``, ``###OUT-OF-SCOPE###``). A reply that could not be produced (the user's chat overflowed its
model's context) is a ``failed`` reply: the episode ends and the failure is counted, never scored as the agent's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.engines.chat_model import ChatModel
from envace.roles.parsing import parse_act_output
from envace.types import Task, ToolCall

STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
"""tau^2's markers with which the simulated user ends the conversation."""

GUIDELINES = """You are playing the role of a customer contacting a customer service representative (the assistant \
you are talking to). Your goal is to simulate a realistic customer interaction while following the instructions \
below.

Rules:
- Write only the customer's next message, one message at a time, in a natural and concise way.
- Reveal information only as it is needed; do not make up facts that are not in your instructions. If you are asked \
for something you do not know, say so.
- Do not invent a goal that is not in your instructions, and do not repeat these rules.
- When your goal is met, or it cannot be met, end the conversation by writing ###STOP### on its own.
- If you are transferred to another agent, write ###TRANSFER###. If the instructions do not cover the situation, \
write ###OUT-OF-SCOPE###."""
"""Default simulation guidelines (after tau^2's user simulator guidelines, shortened)."""


@dataclass
class UserRequest:
    """One episode waiting for its user's next message.

    Attributes:
        task: the episode's task (``task.user`` holds the simulator's instructions).
        messages: the conversation so far as the agent sees it (OpenAI format).
        state: scratch space the simulator owns for this episode (kept by the rollout across turns).
        handle: the episode's world handle (what a ``UserTools`` acts on).
        episode_index: the episode's index in the rollout batch.
    """

    task: Task
    messages: list[dict[str, Any]]
    state: dict[str, Any]
    handle: Any = None
    episode_index: int = 0


@dataclass(frozen=True)
class UserReply:
    """The user's next message.

    Attributes:
        content: the message text (stop markers removed).
        stop: the user ended the conversation with this message.
        failed: no message could be produced (an infrastructure failure, not the agent's): the episode ends.
        reason: why it failed.
    """

    content: str
    stop: bool = False
    failed: bool = False
    reason: str = ""


class UserSimulator(Protocol):
    """Writes the next user message of waiting episodes, batched."""

    def respond(self, requests: list[UserRequest]) -> list[UserReply]:
        """One reply per request, in order."""
        ...


class UserTools(Protocol):
    """Tools the simulated user operates itself (tau^2 telecom: the phone), on the episode's environment."""

    def schemas(self, request: UserRequest) -> list[dict[str, Any]]:
        """The user's tools as OpenAI function schemas."""
        ...

    def call(self, request: UserRequest, call: ToolCall) -> str:
        """Execute one of the user's calls on the episode's environment; the response text."""
        ...


@dataclass
class ScriptedUser:
    """A user that says the next line of a per-task script (tests, replays); ``None`` ends the conversation.

    Args:
        lines: per task id, the user's messages in order. A task whose lines run out stops. With ``tools``, a line
            holding ``<tool_call>`` blocks is the user operating its tools: the calls run on the episode's
            environment and the next line follows in the same reply (as ``ModelUser`` does).
        tools: the tools the user operates itself (tau^2 telecom: ``Tau2UserTools``), or None.
    """

    lines: dict[str, list[str | None]] = field(default_factory=dict)
    tools: UserTools | None = None

    def respond(self, requests: list[UserRequest]) -> list[UserReply]:
        """The next scripted line of each episode's task, after the user's scripted tool calls."""
        replies = []
        for req in requests:
            line = self._next(req)
            calls = self._calls(line)
            while calls:
                for call in calls:
                    self.tools.call(req, call)  # type: ignore[union-attr]
                req.state["tool_calls"] = req.state.get("tool_calls", 0) + len(calls)
                line = self._next(req)
                calls = self._calls(line)
            replies.append(UserReply("", stop=True) if line is None else _reply(line))
        return replies

    def _next(self, req: UserRequest) -> str | None:
        said = req.state.setdefault("said", 0)
        script = self.lines.get(req.task.id, [])
        req.state["said"] = said + 1
        return script[said] if said < len(script) else None

    def _calls(self, line: str | None) -> list[ToolCall]:
        if line is None or self.tools is None:
            return []
        return [c for c in parse_act_output(line).calls if isinstance(c, ToolCall)]


class ModelUser:
    """A simulated user played by a local model.

    Args:
        model: the user's model (a ``ChatModel``; greedy by default, like tau^2's user).
        guidelines: the simulation guidelines opening the user's system message (default ``GUIDELINES``).
        tools: tools the user operates itself, or None.
        max_tool_steps: most rounds of the user's own tool calls before it must write a message.
        stop_markers: texts that end the conversation.
    """

    def __init__(
        self,
        model: ChatModel,
        guidelines: str | None = None,
        tools: UserTools | None = None,
        max_tool_steps: int = 10,
        stop_markers: tuple[str, ...] = STOP_MARKERS,
    ) -> None:
        if max_tool_steps < 0:
            raise ValueError(f"ModelUser.max_tool_steps must be >= 0, got {max_tool_steps}")
        self.model = model
        self.guidelines = GUIDELINES if guidelines is None else guidelines
        self.tools = tools
        self.max_tool_steps = max_tool_steps
        self.stop_markers = tuple(stop_markers)

    def respond(self, requests: list[UserRequest]) -> list[UserReply]:
        """Each episode's next user message; the user's own tool calls are executed first."""
        replies: list[UserReply | None] = [None] * len(requests)
        waiting = list(range(len(requests)))
        for round_ in range(self.max_tool_steps + 1):
            if not waiting:
                break
            views = [self.view(requests[i]) for i in waiting]
            schemas = [self.tools.schemas(requests[i]) if self.tools else None for i in waiting]
            completions = self.model.complete(views, schemas)
            still = []
            for i, completion in zip(waiting, completions):
                if completion.overflow:
                    replies[i] = UserReply("", failed=True, reason="the user's chat is longer than its model's "
                                           "max_prompt_tokens")
                    continue
                turn = parse_act_output(completion.text)
                calls = [c for c in turn.calls if isinstance(c, ToolCall)]
                if calls and self.tools is not None and round_ < self.max_tool_steps:
                    self._use_tools(requests[i], turn.content, calls)
                    still.append(i)
                else:
                    replies[i] = self._message(turn.content)
            waiting = still
        return [r if r is not None else UserReply("", failed=True, reason="no message") for r in replies]

    def view(self, request: UserRequest) -> list[dict[str, Any]]:
        """The conversation from the user's side (roles swapped; the agent's tool traffic hidden)."""
        instructions = request.task.user or ""
        chat: list[dict[str, Any]] = [{"role": "system", "content": f"{self.guidelines}\n\n# Your instructions\n"
                                                                    f"{instructions}".strip()}]
        private = request.state.get("private", {})
        for position, message in enumerate(request.messages):
            chat.extend(private.get(position, []))
            if message["role"] == "user":
                chat.append({"role": "assistant", "content": message.get("content") or ""})
            elif message["role"] == "assistant" and (message.get("content") or "").strip():
                chat.append({"role": "user", "content": message["content"]})
        chat.extend(private.get(len(request.messages), []))
        return chat

    def _use_tools(self, request: UserRequest, content: str, calls: list[ToolCall]) -> None:
        """Execute the user's calls and keep the exchange in its private view, at the conversation's end."""
        assert self.tools is not None
        exchange: list[dict[str, Any]] = [{"role": "assistant", "content": content, "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}]
        for call in calls:
            exchange.append({"role": "tool", "name": call.name, "content": self.tools.call(request, call)})
        private = request.state.setdefault("private", {})
        private.setdefault(len(request.messages), []).extend(exchange)
        request.state["tool_calls"] = request.state.get("tool_calls", 0) + len(calls)

    def _message(self, text: str) -> UserReply:
        return _reply(text, self.stop_markers)


def _reply(text: str, markers: tuple[str, ...] = STOP_MARKERS) -> UserReply:
    """A reply from the user's text: a stop marker anywhere ends the conversation (and is removed)."""
    stop = any(marker in text for marker in markers)
    for marker in markers:
        text = text.replace(marker, "")
    return UserReply(text.strip(), stop=stop)

