"""Fixtures of the end-to-end tests: a scripted act role for runs whose outcome must not depend on a random policy."""

from __future__ import annotations

import pytest

from envace.engines.base import Generation, SamplingParams
from envace.policy.chat import encode
from envace.training.module import EnvACEModule


class ToolThenAnswer:
    """An act engine that calls ``get_balance`` on a first turn and answers after a tool response."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.generated_tokens = 0
        call = '<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>'
        self.call = encode(tokenizer, call)
        self.answer = encode(tokenizer, "120")
        self.response_marker = encode(tokenizer, "<tool_response>")[0]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            ids = (self.answer if self.response_marker in p else self.call) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, True))
        self.generated_tokens += sum(len(g.token_ids) for g in out)
        return out


@pytest.fixture
def scripted_act(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every episode calls get_balance(A1) once, then answers "120" (``ToolThenAnswer``).

    The act rows are identical, so act advantages are all zero.
    """
    bind = EnvACEModule._bind_worlds

    def bind_scripted(self: EnvACEModule) -> None:
        bind(self)
        self.act_engine = ToolThenAnswer(self.tokenizer)

    monkeypatch.setattr(EnvACEModule, "_bind_worlds", bind_scripted)
