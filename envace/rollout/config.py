"""The rollout's typed configuration: ``RolloutConfig`` (budgets, sampling, engine choice) and its validation.

``EpisodeRunner`` (``envace.rollout.runner``) reads it for every episode; trainers, evaluators and benchmarks build
it from the ``rollout`` section of a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from envace.engines.base import SamplingParams
from envace.engines.vllm_engine import VLLMOptions

ErrorPolicy = Literal["feedback", "end"]
RerenderPolicy = Literal["new_row", "error"]


@dataclass
class RolloutConfig:
    """Budgets and sampling of one episode.

    Attributes:
        max_turns: most act-role turns per episode.
        max_tool_calls: most tool calls per episode; a turn that would exceed it ends the episode.
        max_context_tokens: cap on the act role's context (prompt plus a full turn); reaching it ends the episode.
        act_max_new_tokens: generation budget of one act turn.
        rehearse_max_new_tokens: generation budget of one rehearsed tool response.
        act_temperature: act-role sampling temperature (0 = greedy).
        rehearse_temperature: rehearse-role sampling temperature (0 = greedy).
        top_p: nucleus mass for both roles.
        on_call_error: what a malformed call, an unknown tool or schema-violating arguments do: ``feedback`` answers
            with a structured error tool message so the agent can recover; ``end`` ends the episode (the reference).
        on_world_error: the same choice for a rehearsed response that breaks the output contract.
        check_render: debug check: after every step, assert the act token stream decodes to the chat-template render
            of the transcript.
        generate_batch_size: most prompts per ``generate`` call (bounds generation memory); longer batches are
            split.
        max_steps_per_user_turn: in a multi-turn conversation (``Task.user_turns``), most act turns per user turn;
            reaching it moves on to the next user turn (BFCL's rule: 20). 0: no limit.
        max_user_turns: most user turns in an episode, the first included, whether scripted (``Task.user_turns``)
            or written by a simulated user; the episode ends when the act role answers the last one. 0: no limit.
        validate_calls: check calls before they reach the environment: their arguments against the tool's JSON
            schema (``INVALID_ARGUMENTS``), the tool's name (a tool the task does not have is ``UNKNOWN_TOOL``), and
            tools a later user turn brings (``Task.tool_unlocks``), refused as unknown until then. Off, every call
            reaches the environment, which answers as it does (an unknown name included): the protocol of
            benchmarks whose executors check nothing before running a call (BFCL, tau^2, VitaBench).
        engine: the policy's generation engine: ``cached`` (``CachedEngine``: each turn reuses the keys/values of
            the turns before it, finished rows leave the batch) or ``hf`` (``HFEngine``: one ``transformers``
            ``generate`` per call, every prompt read from scratch); both sample the same distribution. ``vllm``
            (``VLLMEngine``): a vLLM engine colocated with the trainer, one per rank, given the policy's weights
            before each rollout that follows an optimiser step (docs/performance.md).
        cache_entries: with the cached engine, most sequences a rollout keeps for reuse (least recently used
            evicted); each costs its keys and values (``2 x layers x kv_heads x head_dim`` values per token).
        cache_tokens: with the cached engine, most tokens those sequences hold together (least recently used
            evicted first): the bound on the store's memory whatever the batch or the sequences' length
            (``envace.training.memory`` counts it in the peak estimate). 0: no token bound (``cache_entries`` alone).
        on_rerender: what happens when the chat template rewrites text already in the act row as a message is
            added (Qwen3 drops the reasoning of turns before the last user message): ``new_row`` (the EnvACE
            authors' behaviour) closes the row and starts the next generation in a new row from the re-rendered
            context, so a trained token is always a generated one; ``error`` refuses such a template.
        vllm: the vLLM engine's settings (with ``engine: vllm``).
        continuous: with an engine that takes requests one at a time (``VLLMEngine``), schedule per episode: each
            episode's next generation (act turn or rehearsed responses) joins the engine's running batch as soon as
            its previous one ends, instead of waiting for every episode's turn to end (lock-step micro-steps, what
            the other engines and sharded ranks do). Episodes never see each other, so each one runs the same state
            machine either way; only the order in which generations finish changes.
    """

    max_turns: int = 8
    max_tool_calls: int = 16
    max_context_tokens: int = 4096
    act_max_new_tokens: int = 256
    rehearse_max_new_tokens: int = 256
    act_temperature: float = 1.0
    rehearse_temperature: float = 1.0
    top_p: float = 1.0
    on_call_error: ErrorPolicy = "feedback"
    on_world_error: ErrorPolicy = "feedback"
    check_render: bool = False
    generate_batch_size: int = 64
    max_steps_per_user_turn: int = 0
    max_user_turns: int = 0
    validate_calls: bool = True
    engine: Literal["cached", "hf", "vllm"] = "cached"
    cache_entries: int = 256
    cache_tokens: int = 65536
    on_rerender: RerenderPolicy = "new_row"
    vllm: VLLMOptions = field(default_factory=VLLMOptions)
    continuous: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ("cached", "hf", "vllm"):
            raise ValueError(f"rollout.engine must be 'cached', 'hf' or 'vllm', got {self.engine!r}")
        if self.cache_entries < 1:
            raise ValueError(f"rollout.cache_entries must be at least 1, got {self.cache_entries}")
        if self.cache_tokens < 0:
            raise ValueError(f"rollout.cache_tokens must be >= 0, got {self.cache_tokens}")
        if self.on_rerender not in ("new_row", "error"):
            raise ValueError(f"rollout.on_rerender must be 'new_row' or 'error', got {self.on_rerender!r}")

    def act_params(self) -> SamplingParams:
        """Sampling of the act role."""
        return SamplingParams(self.act_max_new_tokens, self.act_temperature, self.top_p)

    def rehearse_params(self) -> SamplingParams:
        """Sampling of the rehearse role."""
        return SamplingParams(self.rehearse_max_new_tokens, self.rehearse_temperature, self.top_p)
