"""The world protocol: how tool calls get their responses during a rollout.

The runner batches every pending call of every episode into one ``respond`` call per micro-step, so a world that
generates (rehearsal, frozen simulator) makes one batched ``generate`` call per step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.engines.base import Engine, SamplingParams
from envace.types import Sample, Task, ToolCall, error_text


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
        parse_error: the generated response broke the output contract (an error was substituted).
        truncated: the generated response was cut by its token budget.
        source: the backend that answered: ``real``, ``cache``, ``rehearse`` (the trained policy) or ``frozen``.
        real_calls: real executions this answer cost (a hybrid world first replays the calls its real environment
            has not seen, so its state matches the episode's).
        real_content: the real environment's response, when the answer is real or cached (grounding target).
        probe: the live fidelity score of the policy's shadow rehearsal of this call
        (``envace.world_model.fidelity.ProbeScore``). timeouts: real tool calls behind this answer that exceeded the
        tool timeout (its content is then the timeout
            error, and ``real_content`` is None: an error of envace's making is no grounding target).
        failure: the episode cannot go on (its environment could not be built, raised outside a tool, or is unusable
            after a timeout): the cause, and the runner fails the episode (``EpisodeStats.failed``) instead of
            delivering ``content``. None for every normal answer, tool errors included.
    """

    content: str
    ok: bool
    sample: Sample | None = None
    parse_error: bool = False
    truncated: bool = False
    source: str = "rehearse"
    real_calls: int = 0
    real_content: str | None = None
    probe: Any = None
    timeouts: int = 0
    failure: str | None = None


def failed_reply(where: str, exc: BaseException, source: str = "real", real_calls: int = 0) -> ToolReply:
    """The reply to a call whose episode fails: ``where`` names the component, ``exc`` what it raised."""
    cause = f"{where}: {error_text(exc)}"
    return ToolReply(content=json.dumps({"error": cause}, ensure_ascii=False), ok=False, source=source,
                     real_calls=real_calls, failure=cause)


class World(Protocol):
    """Answers tool calls.

    Implementations: ``RehearseWorld``, ``RealWorld``, ``FrozenWorld``, ``HybridWorld`` (which mixes real, cached
    and rehearsed answers per turn) and ``CacheWorld``.

    A world whose ``respond`` generates with the policy's engine sets ``generates_with_policy`` (then it makes
    exactly one ``engine.generate`` call per ``respond``, so that sharded ranks stay in lockstep). A world that never
    answers a call by rehearsal sets ``rehearses = False`` (``RealWorld``; a ``HybridWorld`` by its schedule): the
    module's fidelity gate then does not apply. A world without the attribute is taken to rehearse.
    """

    def begin_rollout(self, step: int) -> None:
        """Called before each training rollout with the optimiser step it is sampled at (schedules key on it)."""
        ...

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Called once the policy is built and placed, before the first rollout."""
        ...

    def open(self, task: Task) -> Any:
        """Start an episode of ``task``; returns the per-episode handle passed back in requests."""
        ...

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Answer ``requests`` in order. ``engine`` generates with the trained policy (rehearse role)."""
        ...
