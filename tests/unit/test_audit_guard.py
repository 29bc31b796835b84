"""Audits of rehearsed episodes (fidelity horizon, sim-to-real gap) and the collusion guard, on scripted bank runs."""

from __future__ import annotations

import json

import pytest
from helpers import ScriptedEngine
from test_runner import CALL_A1, TASK, call_text, result_text

from envace.rewards import ObservedAnswerSuccess, TaskSuccess
from envace.rewards.scoring import score_episodes
from envace.roles.compare import is_error
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import Episode, ExpectedAnswer, ExpectedCall, SuccessSpec
from envace.world_model.audit import WorldAudit, replay, sim_to_real
from envace.world_model.guard import CollusionGuard
from envace.world_model.quality import WorldQuality
from envace.worlds import HybridWorld, Mix, MixSchedule, RehearseWorld

DEPOSIT = call_text("deposit", {"account": "A1", "amount": 5})
WITHDRAW_B2 = call_text("withdraw", {"account": "B2", "amount": 100})  # B2 holds 50: the real bank refuses
SUCCESS = result_text({"status": "success"})


@pytest.fixture
def tok(tiny_tokenizer):
    return tiny_tokenizer


def rehearsed(tok, act: list[str], rehearse: list[str], tasks=None, world=None) -> list[Episode]:
    tasks = tasks or [TASK]
    world = world or RehearseWorld()
    world.bind(tok, model=None)
    act_engine, rehearse_engine = ScriptedEngine(tok, act), ScriptedEngine(tok, rehearse)
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True))
    episodes = runner.run(tasks, list(range(len(tasks))), act_engine, world, world_engine=rehearse_engine)
    assert act_engine.remaining == 0 and rehearse_engine.remaining == 0
    return episodes


class NoToolErrors:
    """A reward that reads the responses: 1 when no tool response the episode saw reports an error."""

    def __call__(self, episode: Episode) -> float:
        return float(not any(is_error(r.content) for r in episode.rehearsals))


# -- audits ------------------------------------------------------------------------------------------------------------


def test_horizon_is_the_first_departing_call(tok) -> None:
    right_120 = result_text({"account": "A1", "balance": 120})
    wrong_deposit = result_text({"account": "A1", "balance": 130})  # real: 125
    right_125 = result_text({"account": "A1", "balance": 125})
    (ep,) = rehearsed(tok, [CALL_A1, DEPOSIT, CALL_A1, "125"], [right_120, wrong_deposit, right_125])
    audit = replay(ep)
    assert audit.exact == [1.0, 0.0, 1.0] and audit.horizon == 1 and audit.departed
    assert [r.real for r in ep.rehearsals] == ['{"account": "A1", "balance": 120}',
                                              '{"account": "A1", "balance": 125}',
                                              '{"account": "A1", "balance": 125}']
    assert ep.audit is audit


def test_a_faithful_episode_never_departs(tok) -> None:
    (ep,) = rehearsed(tok, [CALL_A1, "120"], [result_text({"balance": 120.0, "account": "A1"})])
    audit = replay(ep)
    assert audit.horizon == 1 and not audit.departed  # censored at the number of calls


def test_sim_to_real_gap_with_a_reward_that_reads_the_responses(tok) -> None:
    # ObservedAnswerSuccess checks the answer against the observed balance: an invented 999 answered as 999 is paid in
    # the rehearsed world, and the same actions on the real responses (balance 120) earn only the call's half
    task = TASK.__class__(**{**TASK.__dict__, "reference": (
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}]},
        {"role": "tool", "name": "get_balance", "content": '{"account": "A1", "balance": 120}'},
        {"role": "assistant", "content": "120"},
    )})
    (ep,) = rehearsed(tok, [CALL_A1, "999"], [result_text({"account": "A1", "balance": 999})], tasks=[task])
    rewards = [ObservedAnswerSuccess()]
    replay(ep)
    score_episodes([ep], rewards)
    assert ep.reward == 1.0
    assert sim_to_real(ep, rewards) == pytest.approx(0.5) and ep.audit.real_reward == pytest.approx(0.5)
    score_episodes([ep], [TaskSuccess()])  # TaskSuccess reads no response: 0.5 in both worlds, gap 0
    assert ep.reward == 0.5 and sim_to_real(ep, [TaskSuccess()]) == pytest.approx(0.0)


def test_audit_selection_is_reproducible_and_needs_a_rehearsed_call(tok) -> None:
    episodes = rehearsed(tok, [CALL_A1] * 8 + ["120"] * 8, [SUCCESS] * 8, tasks=[TASK] * 8)
    audit = WorldAudit(fraction=0.5, seed=1)
    chosen = audit.select(episodes, step=3)
    assert chosen == audit.select(episodes, step=3) and 0 < len(chosen) < 8
    assert WorldAudit(fraction=1.0).select(episodes, 0) == episodes
    for ep in episodes:
        for r in ep.rehearsals:
            r.source = "real"
    assert WorldAudit(fraction=1.0).select(episodes, 0) == []  # nothing rehearsed: nothing to audit
    with pytest.raises(ValueError, match=r"audit.fraction must be in \[0, 1\]"):
        WorldAudit(fraction=1.5)


# -- the collusion guard -----------------------------------------------------------------------------------------------


def withdraw_task():
    spec = SuccessSpec(calls=(ExpectedCall("withdraw", {"account": "B2", "amount": 100}),),
                       answer=ExpectedAnswer(contains=("done",)))
    return TASK.__class__(**{**TASK.__dict__, "success": spec})


def colluding_batch(tok, quality: WorldQuality, rehearse: str, n: int = 16) -> list[Episode]:
    """n episodes of 'withdraw 100 from B2' (the real bank refuses: B2 holds 50), rehearsed as ``rehearse``."""
    episodes = rehearsed(tok, [WITHDRAW_B2] * n + ["done"] * n, [rehearse] * n, tasks=[withdraw_task()] * n,
                         world=quality.world)
    rewards = [NoToolErrors()]
    audited = quality.replay(episodes, step=0)
    score_episodes(episodes, rewards)
    quality.metrics = quality.after_scoring(episodes, audited, rewards)
    return episodes


def test_a_rehearser_that_always_reports_success_is_caught(tok) -> None:
    guard = CollusionGuard(margin=0.1, action="penalize", window=16, min_episodes=16, penalty=1.0)
    quality = WorldQuality(RehearseWorld(), WorldAudit(fraction=1.0), guard)
    with pytest.warns(UserWarning, match="collusion guard: rehearsed-world reward exceeds"):
        episodes = colluding_batch(tok, quality, SUCCESS)
    # every episode: paid 1 in the rehearsed world, 0 on the real responses (insufficient funds): gap 1
    assert quality.metrics["sim2real_gap"] == 1.0 and quality.metrics["collusion_alarm"] == 1.0
    assert guard.alarm and guard.alarms == 1 and quality.metrics["collusion_penalized"] == 16.0
    assert all(e.reward == 1.0 and e.rehearsals[0].reward == 0.0 for e in episodes)  # 1 - penalty * gap
    assert all(e.rehearsals[0].sample.reward == 0.0 and e.act.reward == 1.0 for e in episodes)


def test_a_faithful_rehearser_raises_no_alarm(tok) -> None:
    guard = CollusionGuard(margin=0.1, action="penalize", window=16, min_episodes=16)
    quality = WorldQuality(RehearseWorld(), WorldAudit(fraction=1.0), guard)
    refusal = "ValueError: insufficient funds in 'B2': balance 50, requested 101"
    episodes = colluding_batch(tok, quality, result_text({"error": refusal}))
    assert quality.metrics["sim2real_gap"] == 0.0 and not guard.alarm
    assert quality.metrics["fidelity_horizon"] == 1.0 and quality.metrics["departed_rate"] == 0.0
    assert all(e.rehearsals[0].reward == e.reward == 0.0 for e in episodes)


def test_the_ground_response_raises_the_real_share(tok) -> None:
    world = HybridWorld(MixSchedule(Mix(real=0, rehearse=1), Mix(real=0, rehearse=1)), probe=False)
    guard = CollusionGuard(margin=0.1, action="ground", window=16, min_episodes=16, shift=0.25)
    quality = WorldQuality(world, WorldAudit(fraction=1.0), guard)
    with pytest.warns(UserWarning, match="collusion guard"):
        colluding_batch(tok, quality, SUCCESS)
    assert world.mix.probabilities() == pytest.approx({"real": 0.25, "cache": 0.0, "rehearse": 0.75})
    assert not guard.should_ground()  # no fresh evidence since the last response


def test_guard_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="guard needs audited episodes"):
        WorldQuality(RehearseWorld(), None, CollusionGuard())
    with pytest.raises(ValueError, match="raises the real/cache share of a HybridWorld"):
        WorldQuality(RehearseWorld(), WorldAudit(), CollusionGuard(action="ground"))
    with pytest.raises(ValueError, match="guard.action"):
        CollusionGuard(action="shout")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_episodes"):
        CollusionGuard(window=4, min_episodes=8)


def test_guard_window_mean_and_min_episodes() -> None:
    guard = CollusionGuard(margin=0.2, window=4, min_episodes=2)
    assert not guard.observe([1.0])  # too few episodes
    with pytest.warns(UserWarning):
        assert guard.observe([0.0])  # mean 0.5 > 0.2
    assert not guard.observe([0.0, 0.0, 0.0])  # window [0, 0, 0, 0] after sliding: mean 0
    assert guard.gap == 0.0 and guard.alarms == 1
    assert json.dumps(guard.gap) == "0.0"


def test_guard_and_grounding_survive_a_checkpoint() -> None:
    world = HybridWorld(MixSchedule(Mix(), Mix()), probe=False)
    guard = CollusionGuard(margin=0.1, action="ground", window=4, min_episodes=2)
    quality = WorldQuality(world, WorldAudit(), guard)
    with pytest.warns(UserWarning):
        guard.observe([1.0, 1.0])
    world.ground(0.3)
    saved = json.loads(json.dumps(quality.state_dict_extra()))  # checkpoints hold plain data
    fresh_world = HybridWorld(MixSchedule(Mix(), Mix()), probe=False)
    fresh = WorldQuality(fresh_world, WorldAudit(), CollusionGuard(margin=0.1, action="ground", window=4,
                                                                     min_episodes=2))
    fresh.load_state_dict_extra(saved)
    assert list(fresh.guard.gaps) == [1.0, 1.0] and fresh.guard.alarm and fresh.guard.alarms == 1
    assert fresh_world.mix.probabilities()["real"] == pytest.approx(0.3)
    fresh.load_state_dict_extra({})  # a checkpoint from before these existed
    assert fresh_world.boost == 0.0
