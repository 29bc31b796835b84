"""EnvACE world rehearsal: the trained policy itself writes each call's tool response.

Each call gets a fresh rehearse-role chat (``envace.roles.rehearse``); the generated ids become a trained
``REHEARSE`` row, and the parsed ``<execution_result>`` JSON becomes the tool message the act role sees.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.engines.base import Engine, Generation, SamplingParams
from envace.engines.stream import TokenStream, prompt_stream
from envace.policy.chat import decode
from envace.roles.parsing import parse_execution_result
from envace.roles.rehearse import build_rehearse_messages, default_system_prompt
from envace.types import Role, Sample, Task
from envace.worlds.base import ToolReply, ToolRequest, World


class RehearseWorld:
    """The policy plays the environment (EnvACE's training world).

    Args:
        system_prompt: rehearse-role system instruction; the packaged one when None.
        show_act_reasoning: show the act role's private ``<think>`` text to the rehearse role (the reference does;
            off by default because it lets the two roles collude).
        max_prompt_tokens: cap on a rehearse prompt; the oldest history messages are dropped to fit.
        all_tools: show every tool's schema in the rehearse prompt, not only the called tool's.
        think: the rehearse role reasons before it answers: its system prompt asks for a short ``<think>`` block
            first, and its alignment and SFT rows train the reference's working (a recorded tool message's
            ``reasoning``; docs/task-format.md) before the result. The reasoning is never shown to the act role.
    """

    trained = True

    @property
    def generates_with_policy(self) -> bool:
        """Each ``respond`` makes one batched generation with the policy's engine (not so for a frozen simulator)."""
        return self.trained

    def __init__(
        self,
        system_prompt: str | None = None,
        show_act_reasoning: bool = False,
        max_prompt_tokens: int = 4096,
        all_tools: bool = False,
        think: bool = False,
    ) -> None:
        self.system_prompt = system_prompt
        self.show_act_reasoning = show_act_reasoning
        self.max_prompt_tokens = max_prompt_tokens
        self.all_tools = all_tools
        self.think = think
        self.tokenizer: PreTrainedTokenizerBase | None = None

    def begin_rollout(self, step: int) -> None:
        """Nothing is scheduled."""

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Keep the tokenizer to render rehearse prompts."""
        self.tokenizer = tokenizer

    def open(self, task: Task) -> Any:
        """No per-episode state: the rehearsed world lives in the conversation."""
        return None

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Render one rehearse prompt per call, generate them in one batch, parse the results."""
        prompts = self.prompts(requests)
        return self.replies(requests, prompts, engine.generate([p.ids for p in prompts], params))

    def prompts(self, requests: list[ToolRequest]) -> list[TokenStream]:
        """The rehearse prompt of each call (``respond``'s first stage; a per-episode runner submits them itself)."""
        return [self.prompt(req) for req in requests]

    def replies(self, requests: list[ToolRequest], prompts: list[TokenStream],
                generations: list[Generation]) -> list[ToolReply]:
        """The replies to ``requests`` from their prompts' generations (``respond``'s second stage)."""
        return [self._reply(req, p, g) for req, p, g in zip(requests, prompts, generations, strict=True)]

    def prompt(self, req: ToolRequest) -> TokenStream:
        """The rehearse prompt stream of one call, dropping the oldest history to fit ``max_prompt_tokens``."""
        assert self.tokenizer is not None, "RehearseWorld.bind was not called"
        system = self.system_prompt or default_system_prompt(self.think)
        history = list(req.history)
        while True:
            messages = build_rehearse_messages(
                req.task,
                req.call,
                history,
                system_prompt=system,
                show_reasoning=self.show_act_reasoning,
                reasoning=req.reasoning,
                all_tools=self.all_tools,
            )
            stream = prompt_stream(self.tokenizer, messages, None)
            if len(stream) <= self.max_prompt_tokens or not history:
                return stream
            history = history[1:]

    def _reply(self, req: ToolRequest, prompt: TokenStream, gen: Generation) -> ToolReply:
        assert self.tokenizer is not None
        body = gen.token_ids[:-1] if gen.finished else gen.token_ids
        result = parse_execution_result(decode(self.tokenizer, body))
        sample = Sample(
            token_ids=prompt.ids + gen.token_ids,
            role_ids=prompt.roles + [int(Role.REHEARSE)] * len(gen.token_ids),
            loss_mask=[0] * len(prompt.ids) + [1] * len(gen.token_ids),
            role=Role.REHEARSE,
            episode_index=req.episode_index,
            group_index=req.group_index,
            engine_logps=[math.nan] * len(prompt.ids) + gen.logprobs if gen.logprobs is not None else None,
        )
        sample = sample if self.trained else None
        return ToolReply(
            content=result.content, ok=result.ok, sample=sample, parse_error=not result.ok, truncated=not gen.finished,
            source="rehearse" if self.trained else "frozen",
        )


def alignment_prompter(world: World) -> RehearseWorld:
    """A rehearse prompter for the policy's alignment rows, with the world's prompt settings.

    Never the world itself: a frozen simulator is bound to its own tokenizer and must stay so. A world that wraps a
    rehearse backend (``HybridWorld``) lends that backend's settings.
    """
    world = getattr(world, "rehearse", world)
    if isinstance(world, RehearseWorld):
        return RehearseWorld(max_prompt_tokens=world.max_prompt_tokens, **rehearse_format(world))
    return RehearseWorld()


FORMAT_FILE = "envace_rehearse.json"
"""Written next to an exported policy: the prompt settings its rehearse role was trained with."""
FORMAT_FIELDS = ("system_prompt", "show_act_reasoning", "all_tools", "think")
"""The ``RehearseWorld`` settings that change what a rehearse role reads or writes (not ``max_prompt_tokens``)."""


def rehearse_format(prompter: RehearseWorld) -> dict[str, Any]:
    """The prompt settings of ``prompter`` that a trained rehearse role depends on."""
    return {name: getattr(prompter, name) for name in FORMAT_FIELDS}


def save_rehearse_format(prompter: RehearseWorld, directory: str | Path) -> Path:
    """Record, next to a policy exported to ``directory``, the rehearse prompt format it was trained with."""
    path = Path(directory, FORMAT_FILE)
    path.write_text(json.dumps(rehearse_format(prompter), indent=1) + "\n", encoding="utf-8")
    return path


def check_rehearse_format(prompter: RehearseWorld, directory: str | Path | None) -> None:
    """Refuse to train or evaluate a policy with rehearse prompts other than those it learned.

    A policy exported by envace records its format (``FORMAT_FILE``); a policy without that file (a pretrained model,
    a hub name) is not checked. Settings the file does not name are not compared.

    Raises:
        ValueError: a setting differs; the message names the file, each setting and both values.
    """
    path = Path(directory, FORMAT_FILE) if directory is not None else None
    if path is None or not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected a JSON object of rehearse prompt settings, got {type(saved).__name__}")
    ours = rehearse_format(prompter)
    differ = [f"{name}: trained {saved[name]!r}, here {ours[name]!r}" for name in FORMAT_FIELDS
              if name in saved and saved[name] != ours[name]]
    if differ:
        raise ValueError(
            f"{path}: this policy's rehearse role was trained with other prompt settings than this run's "
            f"({'; '.join(differ)}). Set them on the training world (real tools: RealWorld(rehearse=RehearseWorld("
            f"...)); SFT: rehearse_world), or delete {path.name} to train a new format on purpose"
        )

