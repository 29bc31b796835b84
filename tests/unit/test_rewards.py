"""Rewards: task success (weighted checklist), format penalty and prediction-error shaping, with hand values."""

from __future__ import annotations

import pytest

from envace.rewards import FormatPenalty, PredictionErrorShaping, Reward, TaskSuccess, leaf_f1, task_score
from envace.types import (
    Episode,
    EpisodeStats,
    ExpectedAnswer,
    ExpectedCall,
    Rehearsal,
    Role,
    Sample,
    SuccessSpec,
    Task,
    ToolCall,
)


def make_task(success: SuccessSpec) -> Task:
    return Task(id="t", messages=({"role": "user", "content": "q"},), tools=(), success=success)


def make_episode(task: Task, calls: list[ToolCall], final_answer: str | None, **stats: int) -> Episode:
    act = Sample(token_ids=[1], role_ids=[int(Role.ACT)], loss_mask=[1], role=Role.ACT, episode_index=0, group_index=0)
    return Episode(task=task, group_index=0, messages=[], act=act, calls=calls, final_answer=final_answer,
                   stats=EpisodeStats(**stats))


A1 = ToolCall("get_balance", {"account": "A1"})
B2 = ToolCall("get_balance", {"account": "B2"})
DEPOSIT = ToolCall("deposit", {"account": "A1", "amount": 5})


def test_weighted_partial_credit() -> None:
    spec = SuccessSpec(calls=(ExpectedCall("deposit", {"amount": 5}, weight=2.0), ExpectedCall("get_balance", {}, 1.0)))
    # only the deposit (weight 2) is satisfied: 2 / (2 + 1) = 2/3
    assert task_score(make_task(spec), [DEPOSIT], None) == pytest.approx(2 / 3)
    # only get_balance (weight 1): 1 / 3
    assert task_score(make_task(spec), [B2], None) == pytest.approx(1 / 3)
    assert task_score(make_task(spec), [], None) == 0.0


def test_argument_comparison_is_canonical() -> None:
    spec = SuccessSpec(calls=(ExpectedCall("deposit", {"amount": 5}),))
    task = make_task(spec)
    assert task_score(task, [ToolCall("deposit", {"amount": 5.0, "account": "X"})], None) == 1.0  # 5 == 5.0
    assert task_score(task, [ToolCall("deposit", {"amount": "5"})], None) == 0.0  # "5" != 5
    assert task_score(task, [ToolCall("deposit", {})], None) == 0.0  # key argument missing
    assert task_score(task, [ToolCall("withdraw", {"amount": 5})], None) == 0.0  # wrong name


def test_ordered_vs_unordered() -> None:
    items = (ExpectedCall("deposit", {"amount": 5}), ExpectedCall("get_balance", {"account": "A1"}))
    calls = [A1, DEPOSIT]  # made in the reverse order
    # unordered: both satisfied: 2 / 2
    assert task_score(make_task(SuccessSpec(calls=items)), calls, None) == 1.0
    # ordered: the best subsequence keeps one of the two: 1 / 2
    assert task_score(make_task(SuccessSpec(calls=items, ordered=True)), calls, None) == 0.5
    assert task_score(make_task(SuccessSpec(calls=items, ordered=True)), [DEPOSIT, B2, A1], None) == 1.0


def test_ordered_prefers_heavier_subsequence() -> None:
    items = (ExpectedCall("deposit", {}, 1.0), ExpectedCall("get_balance", {}, 3.0))
    # calls [get_balance, deposit]: either item alone fits; the heavier one wins: 3 / 4
    assert task_score(make_task(SuccessSpec(calls=items, ordered=True)), [A1, DEPOSIT], None) == 0.75


def test_each_call_matches_one_item() -> None:
    items = (ExpectedCall("get_balance", {}), ExpectedCall("get_balance", {"account": "A1"}))
    # one call cannot satisfy two items: 1 / 2
    assert task_score(make_task(SuccessSpec(calls=items)), [A1], None) == 0.5
    # unordered matching is optimal: the generic item must take B2 so that the specific one gets A1: 2 / 2
    assert task_score(make_task(SuccessSpec(calls=items)), [A1, B2], None) == 1.0


def test_forbid_extra_calls() -> None:
    items = (ExpectedCall("get_balance", {"account": "A1"}),)
    strict = make_task(SuccessSpec(calls=items, forbid_extra_calls=True))
    assert task_score(strict, [A1], None) == 1.0
    assert task_score(strict, [A1, B2], None) == 0.0  # B2 is extra
    assert task_score(strict, [A1, A1], None) == 0.0  # a repeated call is extra too
    lenient = make_task(SuccessSpec(calls=items))
    assert task_score(lenient, [A1, B2], None) == 1.0
    ordered_strict = make_task(SuccessSpec(calls=items, ordered=True, forbid_extra_calls=True))
    assert task_score(ordered_strict, [B2, A1], None) == 0.0


def test_answer_normalisation() -> None:
    task = make_task(SuccessSpec(answer=ExpectedAnswer(equals="Balance  is 120")))
    assert task_score(task, [], "  balance is\n120 ") == 1.0
    assert task_score(task, [], "balance is 121") == 0.0
    assert task_score(task, [], None) == 0.0  # no final answer fails the item
    raw = TaskSuccess(answer_normalize=False)
    assert raw(make_episode(task, [], "balance is 120")) == 0.0
    assert raw(make_episode(task, [], "Balance  is 120")) == 1.0


def test_answer_contains_and_mixed_weights() -> None:
    answer = ExpectedAnswer(contains=("insufficient", "A1"), weight=1.0)
    task = make_task(SuccessSpec(calls=(ExpectedCall("withdraw", {}, weight=3.0),), answer=answer))
    withdraw = ToolCall("withdraw", {"account": "A1", "amount": 9})
    # call (3) + answer (1) over 4
    assert task_score(task, [withdraw], "Error: INSUFFICIENT funds in a1") == 1.0
    # call only: 3 / 4
    assert task_score(task, [withdraw], "insufficient funds") == 0.75
    # answer only: 1 / 4
    assert task_score(task, [], "insufficient in A1") == 0.25


def test_task_success_reward_protocol() -> None:
    task = make_task(SuccessSpec(calls=(ExpectedCall("get_balance", {"account": "A1"}),), answer=ExpectedAnswer("7")))
    reward = TaskSuccess()
    assert isinstance(reward, Reward)
    assert reward(make_episode(task, [A1], "7")) == 1.0
    assert reward(make_episode(task, [A1], None)) == 0.5


def test_zero_weights_rejected() -> None:
    task = make_task(SuccessSpec(calls=(ExpectedCall("a", {}, weight=0.0),)))
    with pytest.raises(ValueError, match="weights sum to 0"):
        task_score(task, [], None)


def test_format_penalty() -> None:
    task = make_task(SuccessSpec(answer=ExpectedAnswer("1")))
    penalty = FormatPenalty(penalty=0.1, max_count=10)
    assert penalty(make_episode(task, [A1], "1")) == 0.0
    # 2 parse errors + 1 unknown tool + 1 invalid arguments = 4 -> -0.1 * 4
    assert penalty(make_episode(task, [A1], "1", act_parse_errors=2, unknown_tools=1, invalid_arguments=1)) == (
        pytest.approx(-0.4)
    )
    # capped: min(15, 10) = 10 -> -1.0; plus empty episode -0.1 -> -1.1
    assert penalty(make_episode(task, [], None, act_parse_errors=15)) == pytest.approx(-1.1)
    assert FormatPenalty(0.1, empty_penalty=False)(make_episode(task, [], None)) == 0.0
    assert penalty(make_episode(task, [], None, rehearse_parse_errors=5)) == pytest.approx(-0.1)  # only empty


def test_leaf_f1_hand_values() -> None:
    assert leaf_f1({"a": 1, "b": 2}, {"a": 1, "b": 2}) == 1.0
    assert leaf_f1({}, {}) == 1.0 and leaf_f1([], []) == 1.0
    # leaves {a:1, b:3} vs {a:1, b:2}: 1 common; F1 = 2*1 / (2 + 2) = 0.5
    assert leaf_f1({"a": 1, "b": 3}, {"a": 1, "b": 2}) == 0.5
    # pred {a:1} vs ref {a:1, b:2, c:3}: 1 common; F1 = 2*1 / (1 + 3) = 0.5
    assert leaf_f1({"a": 1}, {"a": 1, "b": 2, "c": 3}) == 0.5
    # nested: pred {x.y:1, x.z[0]:"p"} vs ref {x.y:1.0, x.z[0]:"q", w:null}: 1 common (1 == 1.0); 2/(2+3) = 0.4
    assert leaf_f1({"x": {"y": 1, "z": ["p"]}}, {"x": {"y": 1.0, "z": ["q"]}, "w": None}) == pytest.approx(0.4)
    assert leaf_f1({"a": 1}, {"b": 1}) == 0.0  # same value, different path
    assert leaf_f1({"a": []}, {"a": [1]}) == 0.0  # an empty array is a leaf of its own
    assert leaf_f1({"a.b": 1}, {"a": {"b": 1}}) == 0.0  # paths are key tuples, not dotted strings


def test_prediction_error_shaping() -> None:
    real = '{"account": "A1", "balance": 120}'
    shaping = PredictionErrorShaping(coef=0.5)
    exact = Rehearsal(call=A1, content='{"balance": 120, "account": "A1"}', ok=True, real=real)
    assert shaping(exact) == 0.0
    # one of two leaves right: F1 = 2*1/(2+2) = 0.5 -> -0.5 * (1 - 0.5) = -0.25
    half = Rehearsal(call=A1, content='{"account": "A1", "balance": 99}', ok=True, real=real)
    assert shaping(half) == pytest.approx(-0.25)
    assert shaping(Rehearsal(call=B2, content="{}", ok=True)) is None  # the real response is unknown
    assert shaping(Rehearsal(call=A1, content="not json", ok=False, real=real)) is None
