"""Helper models that answer chats in text: simulated users and judges.

A ``ChatModel`` renders each chat with its own tokenizer's chat template, generates through an ``Engine`` and decodes
the reply. It is never trained, and its text is data to the rollout (a user message, a verdict): the policy's
token-in/token-out rule does not apply to it. It is a local Hugging Face model (any ``Policy``: ``HFPolicy`` for a
checkpoint, ``TinyPolicy`` for tests), built on first use on the device it is bound to, or any engine plus tokenizer
(``from_engine``: scripted engines in tests, a shared policy engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from envace.engines.base import Engine, HFEngine, SamplingParams
from envace.policy.chat import decode, encode, render
from envace.policy.hf import Policy


@dataclass(frozen=True)
class Completion:
    """One reply of a ``ChatModel``.

    Attributes:
        text: the decoded reply (the end-of-turn token removed).
        finished: a stop token ended it (False: ``max_new_tokens`` cut it, or the prompt overflowed).
        overflow: the rendered chat was longer than ``max_prompt_tokens``, so nothing was generated.
    """

    text: str
    finished: bool
    overflow: bool = False


class ChatModel:
    """A local model answering chats in text.

    Args:
        policy: how to build the model (``envace.policy.hf.HFPolicy`` for a local checkpoint, or ``TinyPolicy``).
        max_new_tokens: generation budget of one reply.
        temperature: sampling temperature (0: greedy, the default of simulated users and judges).
        top_p: nucleus mass.
        max_prompt_tokens: longest rendered chat; a longer one is answered with an empty ``overflow`` completion.
        device: where to build the model (default: CUDA when available, else CPU).
    """

    def __init__(
        self,
        policy: Policy | None = None,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_prompt_tokens: int = 16384,
        device: str | None = None,
    ) -> None:
        if max_new_tokens < 1 or max_prompt_tokens < 1:
            raise ValueError("ChatModel: max_new_tokens and max_prompt_tokens must be at least 1")
        if temperature < 0:
            raise ValueError(f"ChatModel: temperature must be >= 0, got {temperature}")
        self.policy = policy
        self.params = SamplingParams(max_new_tokens, temperature, top_p)
        self.max_prompt_tokens = max_prompt_tokens
        self.device = device
        self.engine: Engine | None = None
        self.tokenizer: Any = None

    @classmethod
    def from_engine(cls, engine: Engine, tokenizer: Any, **kwargs: Any) -> ChatModel:
        """A chat model over an existing engine and tokenizer (scripted engines in tests, a shared engine)."""
        model = cls(**kwargs)
        model.engine, model.tokenizer = engine, tokenizer
        return model

    def bind(self) -> None:
        """Build the model once (a no-op when it has an engine)."""
        if self.engine is not None:
            return
        if self.policy is None:
            raise ValueError("ChatModel needs a policy (e.g. envace.policy.hf.HFPolicy with a local checkpoint)")
        model, tokenizer = self.policy.build()
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = model.to(device).eval().requires_grad_(False)
        stop = [tokenizer.eos_token_id] + ([tokenizer.pad_token_id] if tokenizer.pad_token_id is not None else [])
        self.engine = HFEngine(model, pad_id=tokenizer.pad_token_id, stop_ids=stop)
        self.tokenizer = tokenizer

    def complete(self, chats: list[list[dict[str, Any]]],
                 tools: list[list[dict[str, Any]] | None] | None = None) -> list[Completion]:
        """One reply per chat, batched; ``tools`` (per chat) are rendered by the chat template."""
        self.bind()
        assert self.engine is not None
        tools = tools or [None] * len(chats)
        prompts = [encode(self.tokenizer, render(self.tokenizer, chat, spec, add_generation_prompt=True))
                   for chat, spec in zip(chats, tools)]
        fits = [i for i, p in enumerate(prompts) if len(p) <= self.max_prompt_tokens]
        out = [Completion("", False, overflow=True) for _ in prompts]
        if fits:
            generations = self.engine.generate([prompts[i] for i in fits], self.params)
            for i, gen in zip(fits, generations):
                body = gen.token_ids[:-1] if gen.finished else gen.token_ids
                out[i] = Completion(decode(self.tokenizer, body), gen.finished)
        return out
