"""The external-simulator baseline: a separate, frozen model plays the environment (never trained)."""

from __future__ import annotations

import copy

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.engines.base import Engine, HFEngine, SamplingParams
from envace.policy.hf import Policy
from envace.worlds.base import ToolReply, ToolRequest
from envace.worlds.rehearse import RehearseWorld


class FrozenWorld(RehearseWorld):
    """Rehearsal prompts answered by a frozen model; its rows are not trained.

    Args:
        policy: the simulator model; None freezes a copy of the initial policy (the warm start) at bind time.
        system_prompt: rehearse-role system instruction; the packaged one when None.
        show_act_reasoning: show the act role's private reasoning to the simulator.
        max_prompt_tokens: cap on a simulator prompt.
        all_tools: show every tool's schema, not only the called tool's.
        think: the simulator works each response out in ``<think>`` first, as a warm start trained with a thinking
            rehearse role does (``RehearseWorld.think``); a frozen copy of such a policy answers plain prompts badly.
    """

    trained = False

    def __init__(
        self,
        policy: Policy | None = None,
        system_prompt: str | None = None,
        show_act_reasoning: bool = False,
        max_prompt_tokens: int = 4096,
        all_tools: bool = False,
        think: bool = False,
    ) -> None:
        super().__init__(system_prompt, show_act_reasoning, max_prompt_tokens, all_tools, think)
        self.policy = policy
        self.engine: HFEngine | None = None

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Build (or copy) the frozen simulator next to the policy, on the policy's device."""
        device = next(model.parameters()).device
        if self.policy is None:
            frozen, frozen_tok = copy.deepcopy(model), tokenizer
        else:
            frozen, frozen_tok = self.policy.build()
        frozen = frozen.to(device).eval().requires_grad_(False)
        super().bind(frozen_tok, frozen)
        stop = [frozen_tok.eos_token_id] + ([frozen_tok.pad_token_id] if frozen_tok.pad_token_id is not None else [])
        self.engine = HFEngine(frozen, pad_id=frozen_tok.pad_token_id, stop_ids=stop)

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Answer with the frozen model's engine, ignoring the policy's."""
        assert self.engine is not None, "FrozenWorld.bind was not called"
        return super().respond(requests, self.engine, params)
