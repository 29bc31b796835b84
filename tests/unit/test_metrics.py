"""rollout_metrics on hand-built episodes with known counters: exact rates, and 0 (never NaN) when empty."""

from __future__ import annotations

import math

import pytest

from envace.evaluation.metrics import rollout_metrics
from envace.types import Episode, EpisodeStats, ExpectedAnswer, Rehearsal, Role, Sample, SuccessSpec, Task, ToolCall

SYS, ACT, REH, TOOL = int(Role.SYSTEM), int(Role.ACT), int(Role.REHEARSE), int(Role.TOOL)
SPEC = SuccessSpec(answer=ExpectedAnswer(equals="x"))
TASK = Task(id="t", messages=({"role": "user", "content": "q"},), tools=(), success=SPEC)
CALL = ToolCall("get_balance", {"account": "A1"})


def act_row(role_ids: list[int]) -> Sample:
    return Sample(list(range(len(role_ids))), role_ids, [int(r == ACT) for r in role_ids], Role.ACT, 0, 0)


def rehearse_row(loss_mask: list[int]) -> Sample:
    return Sample(list(range(len(loss_mask))), [REH] * len(loss_mask), loss_mask, Role.REHEARSE, 0, 0)


def episode_a() -> Episode:
    """4 act turns, 2 calls rehearsed by the policy, successful."""
    stats = EpisodeStats(
        act_turns=4,
        act_parse_errors=1,
        act_truncated=2,
        unknown_tools=1,
        rehearse_calls=2,
        rehearse_parse_errors=1,
        rehearse_truncated=1,
        turn_limit=True,
        user_turns=3,
        user_stop=True,
        rerenders=1,
    )
    rehearsals = [
        Rehearsal(CALL, "{}", True, rehearse_row([0, 1, 1, 1]), reward=0.5),  # 3 trained tokens
        Rehearsal(CALL, "{}", False, rehearse_row([0, 0, 1, 1]), reward=0.25),  # 2 trained tokens
    ]
    act = act_row([SYS, ACT, ACT, TOOL, ACT])  # 3 act tokens
    earlier = [act_row([SYS, ACT, ACT])]  # a row closed when the template rewrote an earlier turn: 2 act tokens
    return Episode(TASK, 0, [], act, rehearsals, [CALL, CALL], "x", stats, reward=1.0, success=True,
                   earlier_act=earlier)


def episode_b() -> Episode:
    """2 act turns, 1 call executed by a real environment (no rehearse row), failed, ended by an error."""
    stats = EpisodeStats(act_turns=2, invalid_arguments=1, real_calls=1, real_answers=1, call_limit=True,
                         ended_by_error=True, user_failures=1)
    rehearsals = [Rehearsal(CALL, "{}", True, None, reward=0.0, source="real")]
    return Episode(TASK, 1, [], act_row([SYS, ACT]), rehearsals, [CALL], None, stats, reward=0.0, success=False)


def test_exact_rates() -> None:
    m = rollout_metrics([episode_a(), episode_b()])
    expected = {
        "reward_act": 0.5,  # (1.0 + 0.0) / 2 episodes
        "reward_rehearse": 0.375,  # (0.5 + 0.25) / 2 trained rehearse rows
        "success_act": 0.5,  # 1 of 2 episodes
        "success_rehearse": 1.0,  # both trained rehearse rows belong to the successful episode
        "tokens_act": 6.0,  # 2 + 3 act tokens (episode a, two rows) + 1 (episode b)
        "tokens_rehearse": 5.0,  # 3 + 2 trained rehearse tokens
        "parse_error_rate_act": 1 / 6,  # 1 malformed turn / (4 + 2) act turns
        "parse_error_rate_rehearse": 0.5,  # 1 malformed / 2 rehearsed calls (the real call is no opportunity)
        "truncation_rate_act": 2 / 6,  # 2 cut turns / 6 act turns
        "truncation_rate_rehearse": 0.5,  # 1 cut / 2 rehearsed calls
        "invalid_call_rate": 0.4,  # (1 unknown + 1 invalid) / (3 valid calls + 2 invalid attempts)
        "tool_error_rate": 0.0,  # no "{}" answer reports an error
        "turns_per_episode": 3.0,  # 6 turns / 2 episodes
        "calls_per_episode": 1.5,  # 3 world-answered calls / 2 episodes
        "real_calls": 1.0,
        "real_calls_saved": 2.0,  # 3 answered calls - 1 real execution
        "share_real": 1 / 3,  # 1 real answer / 3 answered calls
        "share_cache": 0.0,
        "share_rehearse": 2 / 3,  # 2 rehearsed / 3
        "real_calls_per_episode": 0.5,  # 1 real call / 2 episodes
        "turn_limit_rate": 0.5,
        "call_limit_rate": 0.5,
        "context_limit_rate": 0.0,
        "error_end_rate": 0.5,
        "user_turns_per_episode": 2.0,  # (3 + 1) user turns / 2 episodes
        "user_stop_rate": 0.5,  # episode a's simulated user ended it
        "gate_stop_rate": 0.0,
        "rerenders_per_episode": 0.5,  # 1 new act row / 2 episodes
        "user_failures": 1.0,  # episode b's user failed to reply
        "private_rehearsals_per_episode": 0.0,
        "private_tokens_per_episode": 0.0,
        "private_real_calls": 0.0,
        "failed_episodes": 0.0,
        "tool_timeouts": 0.0,
    }
    assert m.keys() == expected.keys()
    for key, value in expected.items():
        assert m[key] == pytest.approx(value), key


def test_no_rehearsals_gives_zero_not_nan() -> None:
    stats = EpisodeStats(act_turns=1)
    ep = Episode(TASK, 0, [], act_row([SYS, ACT]), [], [], "x", stats, reward=1.0, success=True)
    m = rollout_metrics([ep])
    assert all(math.isfinite(v) for v in m.values())
    rehearse_keys = ("reward_rehearse", "success_rehearse", "tokens_rehearse", "parse_error_rate_rehearse")
    for key in (*rehearse_keys, "truncation_rate_rehearse", "invalid_call_rate", "calls_per_episode"):
        assert m[key] == 0.0, key
    assert m["reward_act"] == 1.0 and m["success_act"] == 1.0 and m["turns_per_episode"] == 1.0


def test_real_world_only_has_zero_rehearse_rates() -> None:
    m = rollout_metrics([episode_b()])
    assert m["parse_error_rate_rehearse"] == 0.0 and m["truncation_rate_rehearse"] == 0.0
    assert m["reward_rehearse"] == 0.0 and m["calls_per_episode"] == 1.0
    assert m["invalid_call_rate"] == pytest.approx(0.5)  # 1 invalid / (1 valid + 1 invalid)


def test_no_episodes() -> None:
    m = rollout_metrics([])
    assert m and all(v == 0.0 for v in m.values())
