"""A scripted policy: an ``Engine`` that answers one episode's act turns from a list of texts (gold replays)."""

from __future__ import annotations

from typing import Any


class ScriptedPolicy:
    """Answers each act turn with the next text of ``script`` (plus the end-of-turn token), one episode at a time.

    Args:
        tokenizer: the tokenizer that encodes the texts (the policy's, for the rollout's token stream).
        script: the act turns, in order.
    """

    def __init__(self, tokenizer: Any, script: list[str]) -> None:
        self.tokenizer = tokenizer
        self.script = list(script)
        self.generated_tokens = 0

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        """The next scripted act turn.

        Raises:
            ValueError: more than one prompt (one episode at a time), or the script is exhausted.
        """
        from envace.engines.base import Generation
        from envace.policy.chat import encode

        if len(prompts) > 1 or (prompts and not self.script):
            raise ValueError(f"{type(self).__name__} serves one episode at a time, for as many act turns as its "
                             "script holds")
        out = []
        for _ in prompts:
            ids = encode(self.tokenizer, self.script.pop(0)) + [self.tokenizer.eos_token_id]
            self.generated_tokens += len(ids)
            out.append(Generation(ids, True))
        return out
