"""The rollout engine's per-token log-probs travel with the tokens: stream, row, batch (and are refused misaligned)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ScriptedEngine, call_text

from envace.builtin.bank import Bank
from envace.engines.base import Generation
from envace.engines.stream import TokenStream
from envace.envs.real import tool_schemas_from_class
from envace.rollout.collate import collate
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.training.update import GRPOConfig
from envace.types import EnvSpec, Role, Sample, SuccessSpec, Task
from envace.worlds import RealWorld


class LoggingEngine(ScriptedEngine):
    """The scripted engine, reporting log-prob -0.1 * (position + 1) for each generated token."""

    def generate(self, prompts, params):
        return [Generation(g.token_ids, g.finished, [-0.1 * (i + 1) for i in range(len(g.token_ids))])
                for g in super().generate(prompts, params)]


def bank_task() -> Task:
    return Task(id="bank", messages=({"role": "system", "content": "You are a bank assistant."},
                                     {"role": "user", "content": "What is the balance of A1?"}),
                tools=tuple(tool_schemas_from_class(Bank)), success=SuccessSpec(calls=()),
                environment=EnvSpec("envace.builtin.bank.Bank", {"balances": {"A1": 120}, "fee": 1}))


def test_an_act_rows_engine_logps_sit_on_its_generated_tokens(tiny_tokenizer) -> None:
    engine = LoggingEngine(tiny_tokenizer, [call_text("get_balance", {"account": "A1"}), "It is 120."])
    world = RealWorld()
    world.bind(tiny_tokenizer, model=None)
    (episode,) = EpisodeRunner(tiny_tokenizer, RolloutConfig()).run([bank_task()], [0], engine, world)
    row = episode.act
    assert row.engine_logps is not None and len(row.engine_logps) == len(row.token_ids)
    known = [i for i, x in enumerate(row.engine_logps) if not math.isnan(x)]
    assert known == [i for i, m in enumerate(row.loss_mask) if m]  # exactly the generated (trained) tokens
    first_turn = len(engine.outputs[0][0])
    assert [row.engine_logps[i] for i in known[:first_turn]] == pytest.approx(
        [-0.1 * (i + 1) for i in range(first_turn)])


def test_an_engine_without_logps_leaves_rows_without_them(tiny_tokenizer) -> None:
    engine = ScriptedEngine(tiny_tokenizer, ["It is 120."])
    world = RealWorld()
    world.bind(tiny_tokenizer, model=None)
    (episode,) = EpisodeRunner(tiny_tokenizer, RolloutConfig()).run([bank_task()], [0], engine, world)
    assert episode.act.engine_logps is None


def test_collate_keeps_the_engine_logps_and_nan_elsewhere() -> None:
    rows = [Sample([5, 6, 7], [0, 1, 1], [0, 1, 1], Role.ACT, 0, 0, engine_logps=[math.nan, -0.5, -0.25]),
            Sample([5, 6], [0, 1], [0, 1], Role.ACT, 1, 0)]
    batch = collate(rows, [1.0, 1.0], pad_id=0)
    assert batch.engine_logps is not None
    assert batch.engine_logps[0, 1:].tolist() == [-0.5, -0.25] and torch.isnan(batch.engine_logps[1]).all()
    assert collate(rows[1:], [1.0], pad_id=0).engine_logps is None
    with pytest.raises(ValueError, match="engine_logps has 2 entries for 3 tokens"):
        collate([Sample([5, 6, 7], [0, 1, 1], [0, 1, 1], Role.ACT, 0, 0, engine_logps=[-1.0, -2.0])], [1.0], 0)


def test_misaligned_logps_are_refused() -> None:
    with pytest.raises(ValueError, match="2 log-probs for 3 tokens"):
        TokenStream().extend([1, 2, 3], Role.ACT, "abc", logps=[-1.0, -2.0])
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        TokenStream([1, 2], [0, 0], [0, 0], "", [-1.0])


def test_tis_needs_a_separate_engine() -> None:
    from envace.policy import TinyPolicy
    from envace.training.module import EnvACEModule

    with pytest.raises(ValueError, match="grpo.tis_cap must be > 0"):
        GRPOConfig(tis_cap=0.0)
    with pytest.raises(ValueError, match="needs rollout.engine: vllm, not 'cached'"):
        EnvACEModule(TinyPolicy(), grpo=GRPOConfig(tis_cap=2.0))
