"""Recorded tool responses longer than the rehearse budget: counted, and one warning before training."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from envace.data.task_parsing import parse_task
from envace.policy import TinyPolicy
from envace.rollout.config import RolloutConfig
from envace.training.base import PolicyModule
from envace.training.module import EnvACEModule
from envace.training.sft import SFTModule
from envace.types import Task
from envace.world_model.alignment import long_responses, target_ids, warn_long_responses
from envace.worlds import RealWorld

TOOL = {"type": "function", "function": {
    "name": "get", "description": "Get a value.",
    "parameters": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
}}


class CharTokenizer:
    """One token per character, eos id 0: target lengths can be counted by hand."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def task(task_id: str, responses: list[str]) -> Task:
    reference: list[dict[str, Any]] = []
    for response in responses:
        call = {"type": "function", "function": {"name": "get", "arguments": {"k": "a"}}}
        reference += [{"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "name": "get", "content": response}]
    reference.append({"role": "assistant", "content": "done"})
    return parse_task({"id": task_id, "messages": [{"role": "user", "content": "q"}], "tools": [TOOL],
                       "success": {"answer": {"equals": "done"}}, "reference": reference})


# "<execution_result>" (18) + "\n" + content + "\n" + "</execution_result>" (19) + eos = 40 + len(content)
TASKS = [
    task("t1", ['{"a": 1}', '{"items": "xxxxxxxxxx"}']),  # 8 -> 48; 23 -> 63
    task("t2", ["hello"]),  # free text reads {"result": "hello"} (19) -> 59
    task("t3", []),
]


def test_target_lengths_hand_computed() -> None:
    tokenizer = CharTokenizer()
    assert len(target_ids(tokenizer, '{"a": 1}')) == 48
    assert len(target_ids(tokenizer, "hello")) == 59
    assert target_ids(tokenizer, "{}")[-1] == 0  # ends with eos
    assert long_responses(TASKS, tokenizer, 50) == (2, 3, 63)
    assert long_responses(TASKS, tokenizer, 62) == (1, 3, 63)
    assert long_responses(TASKS, tokenizer, 63) == (0, 3, 63)  # exactly the budget fits
    assert long_responses([TASKS[2]], tokenizer, 1) == (0, 0, 0)


def test_one_warning_with_the_count() -> None:
    with pytest.warns(UserWarning) as record:
        assert warn_long_responses(TASKS, CharTokenizer(), 50) == 2
    (warning,) = record
    assert str(warning.message).startswith(
        "2 of 3 recorded tool responses of the training tasks are longer than rollout.rehearse_max_new_tokens=50 "
        "tokens (longest 63): ")
    assert "raise rollout.rehearse_max_new_tokens to 63 or more" in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_long_responses(TASKS, CharTokenizer(), 63) == 0  # nothing too long: silent


def fit_start(module: PolicyModule, tasks: list[Task], zero: bool = True) -> None:
    module.tokenizer = CharTokenizer()
    module._trainer = SimpleNamespace(is_global_zero=zero,  # type: ignore[assignment]
                                      datamodule=SimpleNamespace(tasks={"train": tasks}))
    PolicyModule.on_fit_start(module)


def test_the_modules_warn_at_fit_start_with_their_budget() -> None:
    with pytest.warns(UserWarning, match=r"^1 of 3 recorded .*rehearse_max_new_tokens=60 tokens \(longest 63\)"):
        fit_start(EnvACEModule(TinyPolicy(), rollout=RolloutConfig(rehearse_max_new_tokens=60)), TASKS)
    with pytest.warns(UserWarning, match=r"^2 of 3 recorded .*rehearse_max_new_tokens=50 tokens"):
        fit_start(SFTModule(TinyPolicy(), eval_world=RealWorld(), rollout=RolloutConfig(rehearse_max_new_tokens=50)),
                  TASKS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_start(SFTModule(TinyPolicy(), rollout=RolloutConfig(rehearse_max_new_tokens=50)), TASKS)  # no eval
        fit_start(EnvACEModule(TinyPolicy(), rollout=RolloutConfig(rehearse_max_new_tokens=50)), TASKS, zero=False)
