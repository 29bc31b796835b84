"""Fault isolation in training rollouts: a broken tool, a hung tool, a broken environment or world, a broken reward
and garbage model output each touch only their own episode, and the counters say what happened.

The faulty environments below are importable by class path (``test_fault_isolation.FaultyBank``). A hung call waits
on ``RELEASE`` (set after each test), so no worker thread outlives the test session.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

import pytest
import torch
from helpers import RELEASE, ScriptedEngine, call_text, result_text

from envace.builtin.bank import Bank
from envace.engines.base import Generation, SamplingParams
from envace.envs.real import EnvironmentTimeoutError, EnvironmentUnusable, RealEnvironment, tool_schemas_from_class
from envace.evaluation.metrics import failure_causes, rollout_metrics
from envace.policy.chat import encode
from envace.rewards import TaskSuccess
from envace.rewards.scoring import score_episodes
from envace.rollout.collate import collate
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.training.advantages import group_advantages, role_group_ids
from envace.types import EnvSpec, Episode, ExpectedAnswer, ExpectedCall, Role, Sample, SuccessSpec, Task, ToolCall
from envace.world_model.audit import WorldAudit
from envace.world_model.quality import WorldQuality
from envace.worlds import HybridWorld, Mix, MixSchedule, RealWorld, RehearseWorld

BALANCES = {"A1": 120, "B2": 50}
CALL_A1 = call_text("get_balance", {"account": "A1"})


class FaultyBank(Bank):
    """The built-in bank with a fault: ``init`` (the constructor raises), ``tool`` (``get_balance`` raises),
    ``hang`` (``get_balance`` blocks until ``RELEASE``), ``slow_init`` (the constructor blocks) or ``ok``."""

    def __init__(self, balances: dict[str, int], fee: int = 0, mode: str = "ok") -> None:
        if mode == "init":
            raise ConnectionError("database unreachable")
        if mode == "slow_init":
            RELEASE.wait(10)
        super().__init__(balances, fee)
        self.mode = mode

    def get_balance(self, account: str) -> dict:
        """Balance of an account.

        Args:
            account: The account id.
        """
        if self.mode == "tool":
            raise KeyError("ledger offline")
        if self.mode == "hang":
            RELEASE.wait(10)
        return super().get_balance(account)


class FaultyToolbox:
    """A toolbox whose ``call_tool`` raises (``mode="raise"``), hangs (``"hang"``) or answers (``"ok"``)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode

    def tool_names(self) -> list[str]:
        return ["get_balance"]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if self.mode == "raise":
            raise RuntimeError("tool server crashed")
        if self.mode == "hang":
            RELEASE.wait(10)
        return json.dumps({"account": arguments.get("account"), "balance": 120})


@pytest.fixture
def tok(tiny_tokenizer):
    return tiny_tokenizer


def task(mode: str = "ok", task_id: str | None = None, toolbox: bool = False) -> Task:
    """A one-question bank task whose environment has the fault ``mode``."""
    env = (EnvSpec("test_fault_isolation.FaultyToolbox", {"mode": mode}) if toolbox
           else EnvSpec("test_fault_isolation.FaultyBank", {"balances": BALANCES, "mode": mode}))
    return Task(
        id=task_id or f"bank-{mode}",
        messages=({"role": "system", "content": "Reply with the final number only."},
                  {"role": "user", "content": "What is the balance of account A1?"}),
        tools=tuple(tool_schemas_from_class(Bank)),
        success=SuccessSpec(calls=(ExpectedCall("get_balance", {"account": "A1"}),),
                            answer=ExpectedAnswer(equals="120")),
        environment=env,
    )


def run(tok, tasks: list[Task], act_script: list[str], world: Any, rehearse_script: list[str] = (),
        **config: Any) -> list[Episode]:
    world.bind(tok, model=None)
    runner = EpisodeRunner(tok, RolloutConfig(**config))
    act, rehearse = ScriptedEngine(tok, act_script), ScriptedEngine(tok, list(rehearse_script))
    return runner.run(tasks, list(range(len(tasks))), act, world, world_engine=rehearse)


def tool_contents(episode: Episode) -> list[str]:
    return [m["content"] for m in episode.messages if m["role"] == "tool"]


# -- environments ---------------------------------------------------------------------------------------------------


def test_a_tool_that_raises_is_an_error_observation_and_the_episode_goes_on(tok):
    (ep,) = run(tok, [task("tool")], [CALL_A1, "I could not read it."], RealWorld())
    assert tool_contents(ep) == ['{"error": "KeyError: \'ledger offline\'"}']
    assert not ep.stats.failed and ep.final_answer == "I could not read it." and ep.samples()


def test_an_environment_constructor_that_raises_fails_only_its_episode(tok):
    episodes = run(tok, [task("init"), task("ok")], [CALL_A1, "120"], RealWorld())
    broken, fine = episodes
    assert broken.stats.failed and broken.samples() == [] and broken.stats.act_turns == 0
    assert broken.stats.failure == "RealWorld.open: ConnectionError: database unreachable"
    assert not fine.stats.failed and fine.final_answer == "120" and tool_contents(fine) == [
        '{"account": "A1", "balance": 120}']
    assert failure_causes(episodes) == {broken.stats.failure: ["bank-init"]}
    assert rollout_metrics(episodes)["failed_episodes"] == 1.0


def test_a_hung_tool_times_out_and_its_environment_becomes_unusable(tok):
    world = RealWorld(tool_timeout_s=0.2)
    start = time.perf_counter()
    # first turn: the call hangs -> timeout observation; second turn: a call on the unusable instance fails the episode
    (ep,) = run(tok, [task("hang")], [CALL_A1, CALL_A1], world)
    assert time.perf_counter() - start < 3.0
    assert tool_contents(ep) == ['{"error": "TimeoutError: tool \'get_balance\' took longer than 0.2 s"}']
    assert ep.stats.tool_timeouts == 1 and ep.rehearsals[0].real is None  # a timeout is no grounding target
    assert ep.stats.failed and ep.stats.failure.startswith("environment test_fault_isolation.FaultyBank (get_balance)"
                                                           ": EnvironmentUnusable: tool 'get_balance'")
    assert rollout_metrics([ep])["tool_timeouts"] == 1.0


def test_a_hung_tool_answered_before_the_episode_ends_leaves_the_episode_trained(tok):
    (ep,) = run(tok, [task("hang")], [CALL_A1, "unknown"], RealWorld(tool_timeout_s=0.2))
    assert ep.stats.tool_timeouts == 1 and not ep.stats.failed and ep.samples() == [ep.act]


def test_a_hung_or_raising_toolbox_call_tool_fails_only_its_episode(tok):
    tasks = [task("hang", toolbox=True), task("raise", toolbox=True), task("ok", toolbox=True)]
    hung, raised, fine = run(tok, tasks, [CALL_A1] * 3 + ["?", "120"], RealWorld(tool_timeout_s=0.2))
    assert hung.stats.tool_timeouts == 1 and not hung.stats.failed  # the agent saw the timeout and answered
    assert "took longer than 0.2 s" in tool_contents(hung)[0]
    assert raised.stats.failed and raised.stats.failure == (
        "environment test_fault_isolation.FaultyToolbox (get_balance): RuntimeError: tool server crashed")
    assert not fine.stats.failed and fine.final_answer == "120"


def test_a_hung_constructor_times_out():
    start = time.perf_counter()
    with pytest.raises(EnvironmentTimeoutError, match="took longer than 0.2 s to construct"):
        RealEnvironment(EnvSpec("test_fault_isolation.FaultyBank", {"balances": BALANCES, "mode": "slow_init"}), 0.2)
    assert time.perf_counter() - start < 3.0


def test_tool_timeout_zero_runs_on_the_callers_thread_and_timeouts_are_not_tool_errors():
    env = RealEnvironment(EnvSpec("test_fault_isolation.FaultyBank", {"balances": BALANCES}), timeout_s=0)
    assert env.execute(ToolCall("get_balance", {"account": "A1"})) == ('{"account": "A1", "balance": 120}', True)
    # a tool that itself raises TimeoutError is a tool error, not a timeout of the call
    raising = RealEnvironment(EnvSpec("test_fault_isolation.FaultyToolbox", {"mode": "ok"}), timeout_s=0.2)
    raising.instance.call_tool = lambda name, arguments: (_ for _ in ()).throw(TimeoutError("upstream"))
    with pytest.raises(TimeoutError, match="upstream"):
        raising.execute(ToolCall("get_balance", {"account": "A1"}))
    assert raising.timeouts == 0 and raising.unusable is None
    with pytest.raises(ValueError, match="tool_timeout_s"):
        RealWorld(tool_timeout_s=-1)


def test_a_world_whose_respond_raises_fails_the_episodes_of_that_batch(tok):
    class BrokenWorld(RealWorld):
        def respond(self, requests, engine, params):
            raise MemoryError("simulator out of memory")

    a, b = run(tok, [task("ok", "t1"), task("ok", "t2")], [CALL_A1, CALL_A1], BrokenWorld())
    assert a.stats.failed and b.stats.failed
    assert a.stats.failure == "BrokenWorld.respond: MemoryError: simulator out of memory"


def test_hybrid_world_fails_a_broken_environment_and_never_caches_a_timeout(tok):
    real = MixSchedule(Mix(real=1.0, cache=0.0, rehearse=0.0), Mix(real=1.0, cache=0.0, rehearse=0.0))
    world = HybridWorld(real, probe=False, tool_timeout_s=0.2)
    tasks = [task("init"), task("hang"), task("ok")]
    broken, hung, fine = run(tok, tasks, [CALL_A1] * 3 + ["?", "120"], world)
    assert broken.stats.failed and "ConnectionError: database unreachable" in broken.stats.failure
    assert hung.stats.tool_timeouts == 1 and not hung.stats.failed and hung.rehearsals[0].real is None
    assert not fine.stats.failed and fine.final_answer == "120"
    call = ToolCall("get_balance", {"account": "A1"})
    assert world.cache.peek(tasks[1], [], call) is None  # the timeout was not recorded as the real answer
    assert world.cache.peek(tasks[2], [], call) == '{"account": "A1", "balance": 120}'


def test_an_audit_replay_that_breaks_fails_its_episode_not_the_step(tok):
    world = RehearseWorld()
    episodes = run(tok, [task("hang"), task("ok")], [CALL_A1, CALL_A1, "120", "120"], world,
                   [result_text({"account": "A1", "balance": 120})] * 2)
    quality = WorldQuality(world, WorldAudit(fraction=1.0, tool_timeout_s=0.2))
    audited = quality.replay(episodes, step=0)
    assert audited == [episodes[1]] and episodes[1].audit is not None
    assert episodes[0].stats.failed and "audit replay" in episodes[0].stats.failure
    assert episodes[0].audit is None
    score_episodes(episodes, [TaskSuccess()])
    metrics = quality.after_scoring(episodes, audited, [TaskSuccess()])
    assert metrics["audit_episodes"] == 1.0


def test_unusable_environment_raises_on_every_later_call():
    env = RealEnvironment(EnvSpec("test_fault_isolation.FaultyBank", {"balances": BALANCES, "mode": "hang"}), 0.1)
    content, ok = env.execute(ToolCall("get_balance", {"account": "A1"}))
    assert not ok and "TimeoutError" in content and env.timeouts == 1
    with pytest.raises(EnvironmentUnusable, match="timed out after 0.1 s"):
        env.execute(ToolCall("get_balance", {"account": "B2"}))


# -- rewards ----------------------------------------------------------------------------------------------------------


class NanOnSecond:
    """Returns NaN for the episode of index 1, 0 otherwise."""

    def __call__(self, episode: Episode) -> float:
        return float("nan") if episode.act.episode_index == 1 else 0.0


class RaisesOnThird:
    """Raises for the episode of index 2, 0 otherwise."""

    def __call__(self, episode: Episode) -> float:
        if episode.act.episode_index == 2:
            raise ZeroDivisionError("no calls to average")
        return 0.0


def test_a_reward_that_returns_nan_or_raises_fails_that_episode_and_leaves_the_baseline_alone(tok):
    # one group of four episodes; the second's reward is NaN and the third's raises: the baseline is the first and
    # the fourth's mean, as if the group had two episodes
    group = [task("ok", "same")] * 4
    answers = ["120", "7", "120", "7"]
    episodes = run(tok, group, [CALL_A1] * 4 + answers, RealWorld())
    for ep in episodes:
        ep.group_index = 0
        ep.act.group_index = 0
    score_episodes(episodes, [TaskSuccess(), NanOnSecond(), RaisesOnThird()])
    ok0, nan1, raised2, ok3 = episodes
    assert nan1.stats.failed and nan1.stats.failure == "reward NanOnSecond: returned nan"
    assert raised2.stats.failed
    assert raised2.stats.failure == "reward RaisesOnThird: ZeroDivisionError: no calls to average"
    assert (nan1.reward, raised2.reward, nan1.success, raised2.success) == (0.0, 0.0, False, False)
    assert ok0.reward == 1.0 and ok0.success and 0.0 <= ok3.reward < 1.0 and not ok3.success
    samples = [s for e in episodes for s in e.samples()]
    assert samples == [ok0.act, ok3.act]  # failed episodes give no rows
    batch = collate(samples, [1.0] * len(samples), tok.pad_token_id)
    adv = group_advantages(batch.rewards, role_group_ids(batch.group_ids, batch.row_role), batch.episode_ids)
    half = (ok0.reward - ok3.reward) / 2
    assert adv.tolist() == pytest.approx([half, -half])  # the baseline is the mean of the two scored episodes only
    metrics = rollout_metrics(episodes)
    assert metrics["failed_episodes"] == 2.0 and metrics["success_act"] == 0.5
    assert metrics["reward_act"] == pytest.approx((ok0.reward + ok3.reward) / 2)


def test_failed_episode_rows_would_be_left_out_of_the_baseline_even_if_collated(tok):
    # a failed episode's row rewards are NaN: the advantage estimator's "not applicable"
    episodes = run(tok, [task("ok", "g")] * 3, [CALL_A1] * 3 + ["120", "7", "120"], RealWorld())
    for ep in episodes:
        ep.group_index = ep.act.group_index = 0
    score_episodes(episodes, [TaskSuccess(), RaisesOnThird()])
    rows = [e.act for e in episodes]
    assert torch.isnan(torch.tensor(rows[2].reward))
    batch = collate(rows, [1.0] * 3, tok.pad_token_id)
    adv = group_advantages(batch.rewards, role_group_ids(batch.group_ids, batch.row_role), batch.episode_ids)
    half = (episodes[0].reward - episodes[1].reward) / 2
    assert adv.tolist() == pytest.approx([half, -half, 0.0])


def test_failure_causes_are_grouped_once_per_cause():
    spec = SuccessSpec()
    eps = []
    for i, cause in enumerate(["a", "b", "a"]):
        t = Task(f"t{i}", ({"role": "user", "content": "x"},), (), spec)
        ep = Episode(t, 0, [], Sample([], [], [], Role.ACT, i, 0))
        ep.stats.fail(cause)
        ep.stats.fail("later causes are ignored")
        eps.append(ep)
    assert failure_causes(eps) == {"a": ["t0", "t2"], "b": ["t1"]}


# -- garbage generation -----------------------------------------------------------------------------------------------


class GarbageEngine:
    """Random token ids (special tokens and lone bytes of broken UTF-8 included), some far past the token budget
    (up to 1000 tokens), some never finished, some opening a tool call and never closing it; a quarter of the act
    turns are a valid call, so the rehearse role gets garbage to answer too."""

    def __init__(self, tokenizer, seed: int) -> None:
        self.rng = random.Random(seed)
        self.vocab = len(tokenizer)
        self.eos = tokenizer.eos_token_id
        self.opening = encode(tokenizer, '<tool_call>\n{"name": "get_balance", "arguments": {"acc')
        self.valid = encode(tokenizer, CALL_A1)
        self.generated_tokens = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for _ in prompts:
            length = self.rng.choice([1, 5, params.max_new_tokens, 4 * params.max_new_tokens, 1000])
            ids = [self.rng.randrange(self.vocab) for _ in range(length)]
            draw = self.rng.random()
            if draw < 0.25:
                out.append(Generation(self.valid + [self.eos], True))
                continue
            if draw < 0.6:
                ids = self.opening + ids
            finished = self.rng.random() < 0.5
            out.append(Generation(ids + [self.eos] if finished else ids, finished))
        self.generated_tokens += sum(len(g.token_ids) for g in out)
        return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_garbage_generation_is_counted_never_raised(tok, seed):
    tasks = [task("ok", f"g{i}") for i in range(6)]
    world = RehearseWorld()
    world.bind(tok, model=None)
    runner = EpisodeRunner(tok, RolloutConfig(max_turns=4, act_max_new_tokens=24, rehearse_max_new_tokens=16,
                                              max_context_tokens=900))
    episodes = runner.run(tasks, list(range(6)), GarbageEngine(tok, seed), world, GarbageEngine(tok, seed + 100))
    score_episodes(episodes, [TaskSuccess()])
    metrics = rollout_metrics(episodes)
    assert not any(e.stats.failed for e in episodes)  # garbage is the model's fault: counted, trained on
    assert metrics["parse_error_rate_act"] > 0 and metrics["truncation_rate_act"] > 0
    assert metrics["parse_error_rate_rehearse"] > 0 and metrics["calls_per_episode"] > 0
    assert metrics["context_limit_rate"] > 0  # a 1000-token turn filled the context: the episode ended, counted
    assert sum(e.stats.act_turns for e in episodes) >= len(episodes)
    samples = [s for e in episodes for s in e.samples()]
    batch = collate(samples, [1.0] * len(samples), tok.pad_token_id)
    assert batch.loss_mask.sum() > 0 and all(s.role in (Role.ACT, Role.REHEARSE) for s in samples)


def test_failures_are_logged_once_per_cause_by_the_module(caplog):
    from types import SimpleNamespace

    from envace.policy import TinyPolicy
    from envace.training.module import EnvACEModule

    module = EnvACEModule(policy=TinyPolicy())
    trainer = SimpleNamespace(world_size=1, global_step=0)
    eps = []
    for i, cause in enumerate(["reward X: returned nan"] * 3):
        t = Task(f"task-{i % 2}", ({"role": "user", "content": "x"},), (), SuccessSpec())
        ep = Episode(t, 0, [], Sample([], [], [], Role.ACT, i, 0))
        ep.stats.fail(cause)
        eps.append(ep)
    with caplog.at_level(logging.WARNING, logger="envace.training.module"), mock_trainer(module, trainer), \
            pytest.warns(UserWarning, match="every episode of the rollout failed; the update is skipped"):
        assert module._all_failed(eps)
    records = [r.getMessage() for r in caplog.records if r.name == "envace.training.module"]
    assert records == ["step 0: 3 episode(s) failed and are left out of the update: reward X: returned nan "
                       "(tasks: task-0, task-1)"]


def mock_trainer(module, trainer):
    from unittest import mock

    return mock.patch.object(type(module), "trainer", new=property(lambda self: trainer))
