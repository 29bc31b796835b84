"""Observed-answer task success: the answer is checked against the values the episode's own responses reported."""

from __future__ import annotations

import json

import pytest

from envace.data.task_reference import reference_steps
from envace.rewards import ObservedAnswerSuccess, TaskSuccess
from envace.rewards.observed import answer_provenance, observed_answer
from envace.types import (
    Episode,
    ExpectedAnswer,
    ExpectedCall,
    Rehearsal,
    Role,
    Sample,
    SuccessSpec,
    Task,
    ToolCall,
)

TRANSFER = ToolCall("transfer", {"source": "C1", "target": "D5", "amount": 60})
BALANCE = ToolCall("get_balance", {"account": "D5"})


def _tool_message(call: ToolCall, content: dict) -> list[dict]:
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}]}
    return [assistant, {"role": "tool", "content": json.dumps(content)}]


def make_task(equals: str, reference: bool = True) -> Task:
    spec = SuccessSpec(calls=(ExpectedCall("transfer", {"source": "C1"}), ExpectedCall("get_balance", {})),
                       answer=ExpectedAnswer(equals=equals))
    steps = [*_tool_message(TRANSFER, {"source": "C1", "balance": 90, "target": "D5", "amount": 60, "fee": 0}),
             *_tool_message(BALANCE, {"account": "D5", "balance": 230}),
             {"role": "assistant", "content": equals}]
    return Task(id=f"t-{equals}-{reference}", messages=({"role": "user", "content": "q"},), tools=(), success=spec,
                reference=tuple(steps) if reference else ())


def make_episode(task: Task, responses: list[dict | str], answer: str) -> Episode:
    act = Sample([1], [int(Role.ACT)], [1], Role.ACT, 0, 0)
    rehearsals = [Rehearsal(call, r if isinstance(r, str) else json.dumps(r), True)
                  for call, r in zip([TRANSFER, BALANCE], responses)]
    return Episode(task, 0, [], act, rehearsals, [TRANSFER, BALANCE][: len(responses)], answer)


def test_provenance_is_the_last_response_value_that_reads_like_each_word() -> None:
    # "90" is the transfer's balance; "230" the balance lookup's
    assert answer_provenance(make_task("90 230")) == [
        (TRANSFER.key(), ("balance",)), (BALANCE.key(), ("balance",))]
    assert answer_provenance(make_task("error: unknown account")) is None  # words that are no response value
    assert answer_provenance(make_task("230", reference=False)) is None  # nothing recorded to trace


def test_the_answer_the_rehearsed_world_implies_earns_the_reward() -> None:
    task = make_task("90 230")
    rehearsed = [{"source": "C1", "balance": 80, "target": "D5", "amount": 60, "fee": 0},
                 {"account": "D5", "balance": 150}]
    faithful = make_episode(task, rehearsed, "80 150")  # reports what it was told
    real_answer = make_episode(task, rehearsed, "90 230")  # the real values, which it was not told
    # checklist: 2 calls + answer, weight 1 each; TaskSuccess gives 2/3 to the faithful report, 1 to the other
    assert TaskSuccess()(faithful) == pytest.approx(2 / 3) and TaskSuccess()(real_answer) == 1.0
    assert ObservedAnswerSuccess()(faithful) == 1.0
    assert ObservedAnswerSuccess()(real_answer) == pytest.approx(2 / 3)
    assert observed_answer(answer_provenance(task), faithful.rehearsals) == "80 150"


def test_real_responses_give_the_tasks_own_answer() -> None:
    task = make_task("90 230")
    real = [{"source": "C1", "balance": 90, "target": "D5", "amount": 60, "fee": 0}, {"account": "D5", "balance": 230}]
    for answer in ("90 230", "90 231"):
        episode = make_episode(task, real, answer)
        assert ObservedAnswerSuccess()(episode) == TaskSuccess()(episode)


@pytest.mark.parametrize("responses", [
    [{"error": "ValueError: unknown account 'C1'"}, {"account": "D5", "balance": 150}],  # the value is missing
    [{"source": "C1", "balance": 80}],  # the second source call was never made
    ["not json", {"account": "D5", "balance": 150}],
    [{"source": "C1", "balance": {"nested": 1}}, {"account": "D5", "balance": 150}],  # not a scalar there
])
def test_untraceable_observations_fall_back_to_the_tasks_answer(responses: list) -> None:
    task = make_task("90 230")
    episode = make_episode(task, responses, "90 230")
    assert observed_answer(answer_provenance(task), episode.rehearsals) is None
    assert ObservedAnswerSuccess()(episode) == TaskSuccess()(episode)


def test_builtin_bank_answers_are_mostly_traceable() -> None:
    from envace.builtin.task_sets import load_task_set

    tasks = load_task_set("builtin:bank:200")
    traced = [t for t in tasks if answer_provenance(t) is not None]
    assert len(traced) > len(tasks) // 2
    for task in traced:  # replaying the recorded responses reproduces every traced task's answer exactly
        rehearsals = [Rehearsal(call, content, True) for call, content, _ in reference_steps(task)]
        assert observed_answer(answer_provenance(task), rehearsals) == " ".join(task.success.answer.equals.split())


def test_two_tasks_sharing_an_id_do_not_share_a_provenance() -> None:
    reward = ObservedAnswerSuccess()
    first, second = make_task("90 230"), make_task("230")
    second = Task(first.id, second.messages, second.tools, second.success, second.reference)  # same id, other answer
    real = [{"source": "C1", "balance": 90, "target": "D5", "amount": 60, "fee": 0}, {"account": "D5", "balance": 230}]
    assert reward(make_episode(first, real, "90 230")) == 1.0
    assert reward(make_episode(second, real, "230")) == 1.0  # traced on its own: "230", not "90 230"
