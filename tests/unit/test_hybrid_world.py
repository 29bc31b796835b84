"""Hybrid worlds, the response cache and live fidelity probes, driven by scripted generations on the bank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ScriptedEngine
from hypothesis import given
from hypothesis import strategies as st
from test_runner import CALL_A1, TASK, call_text, result_text, tool_messages

from envace.builtin.task_sets import resolve_task_path
from envace.data.tasks import load_tasks
from envace.evaluation.metrics import rollout_metrics
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import Episode, ToolCall
from envace.world_model.fidelity import LiveFidelity
from envace.worlds import CacheWorld, HybridWorld, Mix, MixSchedule, ResponseCache

DEPOSIT = call_text("deposit", {"account": "A1", "amount": 5})
A1 = ToolCall("get_balance", {"account": "A1"})
A1_DEPOSIT = ToolCall("deposit", {"account": "A1", "amount": 5})
REAL_120 = '{"account": "A1", "balance": 120}'
REAL_125 = '{"account": "A1", "balance": 125}'
ONLY_REAL = MixSchedule(Mix(real=1, rehearse=0), Mix(real=1, rehearse=0))
ONLY_REHEARSE = MixSchedule(Mix(), Mix())


@pytest.fixture
def tok(tiny_tokenizer):
    return tiny_tokenizer


def run(tok, world: HybridWorld, act: list[str], rehearse: list[str], tasks=None) -> list[Episode]:
    tasks = tasks or [TASK]
    world.bind(tok, model=None)
    act_engine, rehearse_engine = ScriptedEngine(tok, act), ScriptedEngine(tok, rehearse)
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True))
    episodes = runner.run(tasks, list(range(len(tasks))), act_engine, world, world_engine=rehearse_engine)
    assert act_engine.remaining == 0 and rehearse_engine.remaining == 0, "script not fully consumed"
    return episodes


# -- mixes and schedules -----------------------------------------------------------------------------------------------


def test_mix_probabilities_ramp_and_grounding() -> None:
    assert Mix(real=1, cache=1, rehearse=2).probabilities() == {"real": 0.25, "cache": 0.25, "rehearse": 0.5}
    schedule = MixSchedule(start=Mix(real=1, rehearse=0), end=Mix(), steps=10, warmup=4)
    assert schedule.at(0).probabilities()["real"] == 1.0 and schedule.at(3).probabilities()["real"] == 1.0
    # step 9: 5 of 10 ramp steps done -> halfway between all-real and all-rehearse
    assert schedule.at(9).probabilities() == pytest.approx({"real": 0.5, "cache": 0.0, "rehearse": 0.5})
    assert schedule.at(14).probabilities()["rehearse"] == 1.0 and schedule.at(1000).probabilities()["rehearse"] == 1.0
    # grounding moves rehearse mass into real and cache in their 1:3 ratio: 0.4 -> real +0.1, cache +0.3
    grounded = Mix(real=0.1, cache=0.3, rehearse=0.6).grounded(0.4).probabilities()
    assert grounded == pytest.approx({"real": 0.2, "cache": 0.6, "rehearse": 0.2})
    assert Mix().grounded(0.3).probabilities() == pytest.approx({"real": 0.3, "cache": 0.0, "rehearse": 0.7})
    assert Mix().grounded(5.0).probabilities()["rehearse"] == 0.0  # never below 0


weights = st.floats(min_value=0, max_value=10, allow_nan=False)


@given(weights, weights, weights, weights, weights, weights, st.floats(0, 1), st.floats(0, 2))
def test_mixes_stay_distributions(r1, c1, h1, r2, c2, h2, t, boost) -> None:
    if r1 + c1 + h1 <= 0 or r2 + c2 + h2 <= 0:
        return
    a, b = Mix(r1, c1, h1), Mix(r2, c2, h2)
    for mix in (a.toward(b, t), a.grounded(boost), a.toward(b, t).grounded(boost)):
        p = mix.probabilities()
        assert sum(p.values()) == pytest.approx(1.0) and min(p.values()) >= -1e-12
    # grounding never lowers the real or cache share, and moves at most ``boost``
    g, q = a.grounded(boost).probabilities(), a.probabilities()
    assert g["real"] >= q["real"] - 1e-12 and g["cache"] >= q["cache"] - 1e-12
    assert q["rehearse"] - g["rehearse"] <= boost + 1e-9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"real": -1}, "mix.real must be a finite number >= 0"), ({"rehearse": 0}, "at least one must be positive"),
     ({"cache": float("nan")}, "mix.cache")],
)
def test_bad_mixes_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Mix(**kwargs)


def test_bad_schedule_and_world_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="schedule.steps must be >= 0"):
        MixSchedule(steps=-1)
    with pytest.raises(ValueError, match="granularity"):
        HybridWorld(granularity="call")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_miss"):
        HybridWorld(on_miss="error")  # type: ignore[arg-type]


def test_draws_follow_the_mix_and_are_reproducible() -> None:
    world = HybridWorld(MixSchedule(Mix(real=1, cache=1, rehearse=2), Mix(real=1, cache=1, rehearse=2)), seed=3)
    world.begin_rollout(7)
    draws = [world._draw("turn", i, 0) for i in range(4000)]
    assert draws == [world._draw("turn", i, 0) for i in range(4000)]  # same (seed, step, episode, turn): same draw
    shares = {s: draws.count(s) / len(draws) for s in ("real", "cache", "rehearse")}
    assert shares == pytest.approx({"real": 0.25, "cache": 0.25, "rehearse": 0.5}, abs=0.03)
    world.begin_rollout(8)
    assert [world._draw("turn", i, 0) for i in range(50)] != draws[:50]  # another step, other draws


# -- the response cache ------------------------------------------------------------------------------------------------


def test_cache_is_keyed_by_state_and_seeded_from_references(tmp_path: Path) -> None:
    task = load_tasks(resolve_task_path("builtin:bank"))[0]  # get_balance(F3) -> balance 180
    f3 = ToolCall("get_balance", {"account": "F3"})
    cache = ResponseCache()
    assert cache.get(task, [], f3) == task.reference[1]["content"]
    assert cache.get(task, [f3], f3) is None  # after another call: a state the reference never reached
    assert (cache.hits, cache.misses) == (1, 1)
    assert ResponseCache(stateful=False).get(task, [f3], f3) == task.reference[1]["content"]
    cache.put(task, [f3], f3, '{"x": 1}')
    cache.put(task, [f3], f3, '{"x": 2}')  # the first recorded response is kept
    assert cache.peek(task, [f3], f3) == '{"x": 1}'
    # calls are compared canonically (argument order, 5.0 == 5)
    assert cache.key(TASK, [A1_DEPOSIT], A1) == cache.key(TASK, [ToolCall("deposit", {"amount": 5.0,
                                                                                        "account": "A1"})], A1)


def test_cache_file_survives_a_restart_and_bad_lines_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    cache = ResponseCache(path=str(path), seed_references=False)
    cache.put(TASK, [], A1, REAL_120)
    cache.put(TASK, [A1], A1_DEPOSIT, REAL_125)
    reopened = ResponseCache(path=str(path), seed_references=False)
    assert len(reopened) == 2 and reopened.get(TASK, [A1], A1_DEPOSIT) == REAL_125
    with path.open("a") as f:
        f.write('{"key": "k"}\n')
    with pytest.raises(ValueError, match=r"cache.jsonl:3: not a response-cache record"):
        ResponseCache(path=str(path))


# -- hybrid answers ----------------------------------------------------------------------------------------------------


def test_real_answers_replay_rehearsed_calls_first_and_are_probed(tok) -> None:
    # turn 1 rehearsed (deposit, a state change), turn 2 real (get_balance): the real bank first executes the deposit
    world = HybridWorld(MixSchedule(Mix(), Mix()))
    world._draw = lambda *key: "rehearse" if key[2] == 0 else "real"  # type: ignore[method-assign]
    rehearsed_deposit = result_text({"account": "A1", "balance": 999})
    shadow = result_text({"account": "A1", "balance": 125})  # the probe of the real answer: exact
    (ep,) = run(tok, world, [DEPOSIT, CALL_A1, "125"], [rehearsed_deposit, shadow])
    assert [m["content"] for m in tool_messages(ep)] == ['{"account": "A1", "balance": 999}', REAL_125]
    assert [r.source for r in ep.rehearsals] == ["rehearse", "real"]
    assert ep.stats.real_calls == 2 and ep.stats.real_answers == 1 and ep.stats.rehearse_calls == 1
    assert ep.rehearsals[0].sample is not None and ep.rehearsals[1].sample is None  # the probe is not trained
    assert ep.rehearsals[1].real == REAL_125 and ep.rehearsals[1].probe.exact_match == 1.0
    assert ep.rehearsals[1].request is not None and ep.rehearsals[1].request.call == A1
    # both real executions were recorded with their states
    assert world.cache.peek(TASK, [], A1_DEPOSIT) == REAL_125
    assert world.cache.peek(TASK, [A1_DEPOSIT], A1) == REAL_125
    m = rollout_metrics([ep])
    assert (m["real_calls"], m["real_calls_saved"], m["share_real"], m["share_rehearse"]) == (2.0, 0.0, 0.5, 0.5)


def test_cache_hits_save_real_calls_and_misses_fall_back(tok) -> None:
    world = CacheWorld(on_miss="rehearse")
    world.cache.put(TASK, [], A1, REAL_120)
    shadow = result_text({"account": "A1", "balance": 0})  # probe of the cached answer: right keys, wrong value
    rehearsed = result_text({"account": "A1", "balance": 7})
    (ep,) = run(tok, world, [CALL_A1, CALL_A1, "120"], [shadow, rehearsed])
    assert [r.source for r in ep.rehearsals] == ["cache", "rehearse"]  # the second get_balance: a new state, a miss
    assert [m["content"] for m in tool_messages(ep)] == [REAL_120, '{"account": "A1", "balance": 7}']
    assert ep.stats.real_calls == 0 and ep.stats.cache_calls == 1
    probe = ep.rehearsals[0].probe
    assert (probe.exact_match, probe.key_match, probe.leaf_f1) == (0.0, 1.0, 0.5)
    assert rollout_metrics([ep])["real_calls_saved"] == 2.0
    assert world.metrics()["cache_hit_rate"] == 0.5


def test_a_miss_can_go_to_the_real_environment(tok) -> None:
    world = CacheWorld(on_miss="real", probe=False)
    (ep,) = run(tok, world, [CALL_A1, "120"], [])
    assert ep.rehearsals[0].source == "real" and ep.rehearsals[0].probe is None and ep.stats.real_calls == 1


def test_episode_granularity_draws_once_per_episode(tok) -> None:
    world = HybridWorld(MixSchedule(Mix(real=1, rehearse=1), Mix(real=1, rehearse=1)), granularity="episode",
                        probe=False)
    world.begin_rollout(0)
    handles = [world.open(TASK) for _ in range(64)]
    sources = {h.source for h in handles}
    assert sources == {"real", "rehearse"}  # both drawn across episodes...
    world._draw = lambda *key: pytest.fail("no draw per turn")  # type: ignore[method-assign]
    # ...and an episode keeps its source on every turn
    real_handle = next(h for h in handles if h.source == "real")
    from envace.worlds.base import ToolRequest

    for _ in range(2):
        (reply,) = world.respond([ToolRequest(TASK, A1, [], real_handle, 0, 0)], ScriptedEngine(None, []), None)
        assert reply.source == "real"
        real_handle.calls.append(A1)


# -- live fidelity (the acceptance cases) ----------------------------------------------------------------------


def probed(tok, shadows: list[Any]) -> dict[str, float]:
    """Run TASK with real answers for get_balance, deposit, get_balance; each probe rehearsed as ``shadows``."""
    world = HybridWorld(ONLY_REAL)
    episodes = run(tok, world, [CALL_A1, DEPOSIT, CALL_A1, "125"], [result_text(s) for s in shadows])
    live = LiveFidelity()
    scores = [(r.call.name, r.probe) for e in episodes for r in e.rehearsals]
    live.update([s for _, s in scores], [t for t, _ in scores])
    return live.compute_and_reset()


def test_the_real_environment_standing_in_as_rehearser_is_faithful(tok) -> None:
    out = probed(tok, [json.loads(REAL_120), json.loads(REAL_125), json.loads(REAL_125)])
    assert out["exact_match"] == 1.0 and out["leaf_f1"] == 1.0 and out["probes"] == 3.0
    assert out["get_balance/exact_match"] == 1.0 and out["get_balance/probes"] == 2.0
    assert out["deposit/leaf_f1"] == 1.0 and out["deposit/probes"] == 1.0


def test_a_constant_rehearser_scores_near_zero(tok) -> None:
    out = probed(tok, [{"status": "ok"}] * 3)
    assert out["exact_match"] == 0.0 and out["leaf_f1"] == 0.0 and out["key_match"] == 0.0
    assert out["parse_rate"] == 1.0  # it is JSON, only wrong


def test_right_keys_with_wrong_values(tok) -> None:
    out = probed(tok, [{"account": "Z9", "balance": -1}] * 3)
    assert out["key_match"] == 1.0 and out["exact_match"] == 0.0 and out["leaf_f1"] == 0.0
    assert LiveFidelity().compute_and_reset() == {}  # no probes: nothing to report


def test_the_policys_prompter_keeps_the_hybrid_worlds_rehearse_settings() -> None:
    from envace.worlds import RehearseWorld
    from envace.worlds.rehearse import alignment_prompter

    world = HybridWorld(rehearse=RehearseWorld(max_prompt_tokens=123, all_tools=True))
    prompter = alignment_prompter(world)
    assert (prompter.max_prompt_tokens, prompter.all_tools) == (123, True) and prompter is not world.rehearse
    assert world.prompter.max_prompt_tokens == 123


def test_the_response_cache_travels_in_the_checkpoint() -> None:
    """The recorded real answers, the seeded tasks and the counters survive a ``weights_only`` checkpoint round
    trip, so a resumed run answers from the cache exactly as the interrupted one would have."""
    import io

    import torch

    from envace.world_model.quality import WorldQuality

    call = ToolCall("get_balance", {"account": "A1"})
    world = CacheWorld()
    world.cache.put(TASK, [], call, '{"balance": 7}')
    assert world.cache.get(TASK, [], call) == '{"balance": 7}'
    buffer = io.BytesIO()
    torch.save({"extra": WorldQuality(world, None, None).state_dict_extra()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["extra"]
    resumed = CacheWorld()
    WorldQuality(resumed, None, None).load_state_dict_extra(state)
    assert resumed.cache.peek(TASK, [], call) == '{"balance": 7}'
    assert (resumed.cache.hits, resumed.cache.misses) == (world.cache.hits, world.cache.misses)
    assert resumed.cache.state_dict() == world.cache.state_dict()
