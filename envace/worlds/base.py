"""The world protocol: how tool calls get their responses during a rollout.

The runner batches every pending call of every episode into one ``respond`` call per micro-step, so a world that
generates (rehearsal, frozen simulator) makes one batched ``generate`` call per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.rollout.engine import Engine, SamplingParams
from envace.types import Sample, Task, ToolCall


@dataclass
class ToolRequest:
    """One schema-valid call waiting for its response.

    Attributes:
        task: the episode's task.
        call: the call.
        history: the semantic conversation before the assistant message that made the call.
        handle: the episode's world state, as returned by ``World.open``.
        episode_index: index of the episode in the rollout.
        group_index: GRPO group of the episode.
        reasoning: the act role's private reasoning in the turn that made the call (shown to the rehearse role only
            when it is configured to see reasoning).
    """

    task: Task
    call: ToolCall
    history: list[dict[str, Any]]
    handle: Any
    episode_index: int
    group_index: int
    reasoning: str = ""


@dataclass
class ToolReply:
    """A world's answer to one call.

    Attributes:
        content: the tool message content the act role sees (JSON text).
        ok: a well-formed response (an error the tool itself reports, like an unknown id, is still ok).
        sample: the rehearse role's training row, when the trained policy produced the response.
        real: a real environment executed the call.
        parse_error: the generated response broke the output contract (an error was substituted).
        truncated: the generated response was cut by its token budget.
    """

    content: str
    ok: bool
    sample: Sample | None = None
    real: bool = False
    parse_error: bool = False
    truncated: bool = False


class World(Protocol):
    """Answers tool calls. Implementations: ``RehearseWorld``, ``RealWorld``, ``FrozenWorld``."""

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Called once the policy is built and placed, before the first rollout."""
        ...

    def open(self, task: Task) -> Any:
        """Start an episode of ``task``; returns the per-episode handle passed back in requests."""
        ...

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Answer ``requests`` in order. ``engine`` generates with the trained policy (rehearse role)."""
        ...
