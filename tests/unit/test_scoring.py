"""score_episodes on hand-built episodes of built-in bank tasks: rewards, success and rehearse shaping."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from envace.builtin.task_sets import resolve_task_path
from envace.data.tasks import load_tasks
from envace.rewards import FormatPenalty, PredictionErrorShaping, TaskSuccess
from envace.rewards.scoring import score_episodes
from envace.types import Episode, EpisodeStats, Rehearsal, Role, Sample, Task, ToolCall
from envace.worlds.cache import ResponseCache


@cache
def bank() -> dict[str, Task]:
    return {t.id: t for t in load_tasks(resolve_task_path("builtin:bank"))}


# bank-0000: get_balance(C9) -> {"account": "C9", "balance": 160}; answer "180"; checklist weights 1 + 1
C9 = ToolCall("get_balance", {"account": "F3"})
C9_REAL = '{"account": "F3", "balance": 180}'


def act_row() -> Sample:
    return Sample([1, 2, 3], [int(Role.SYSTEM), int(Role.ACT), int(Role.ACT)], [0, 1, 1], Role.ACT, 0, 0)


def rehearsal(call: ToolCall, content: str, trained: bool = True) -> Rehearsal:
    sample = Sample([4, 5], [int(Role.SYSTEM), int(Role.REHEARSE)], [0, 1], Role.REHEARSE, 0, 0) if trained else None
    return Rehearsal(call=call, content=content, ok=True, sample=sample)


def episode(
    task_id: str, calls: list[ToolCall], answer: str | None, rehearsals: list[Rehearsal], **stats: int
) -> Episode:
    task = bank()[task_id]
    task = replace(task, success=replace(task.success, forbid_extra_calls=False))  # some episodes repeat calls
    return Episode(
        task=task,
        group_index=0,
        messages=[],
        act=act_row(),
        rehearsals=rehearsals,
        calls=calls,
        final_answer=answer,
        stats=EpisodeStats(**stats),
    )


def test_rewards_are_summed_and_success_set() -> None:
    ep = episode("bank-train-0000-balance", [C9], "180", [rehearsal(C9, C9_REAL)], act_parse_errors=1)
    score_episodes([ep], [TaskSuccess(), FormatPenalty(penalty=0.1)])
    # task success 2/2 = 1.0, format penalty -0.1 * 1 error: 1.0 - 0.1 = 0.9
    assert ep.reward == pytest.approx(0.9)
    assert ep.success  # success follows the checklist, not the summed reward
    assert ep.act.reward == pytest.approx(0.9)
    assert ep.rehearsals[0].reward == pytest.approx(0.9)  # the rehearse row gets the episode reward
    assert ep.rehearsals[0].sample is not None and ep.rehearsals[0].sample.reward == pytest.approx(0.9)


def test_partial_success_is_not_success() -> None:
    wrong = episode("bank-train-0000-balance", [C9], "150", [rehearsal(C9, C9_REAL)])
    none = episode("bank-train-0000-balance", [], None, [])
    score_episodes([wrong, none], [TaskSuccess()])
    assert wrong.reward == pytest.approx(0.5)  # the call (1) without the answer (1): 1 / 2
    assert not wrong.success
    assert none.reward == 0.0 and not none.success and none.act.reward == 0.0


def test_no_rewards_gives_zero_but_success_still_computed() -> None:
    ep = episode("bank-train-0000-balance", [C9], "180", [])
    score_episodes([ep], [])
    assert ep.reward == 0.0 and ep.success


def test_prediction_error_shaping() -> None:
    other = ToolCall("get_balance", {"account": "A3"})  # not in bank-0000's reference
    right = rehearsal(C9, '{"balance": 180.0, "account": "F3"}')  # same leaves, other order and 180.0 == 180
    repeated = rehearsal(C9, '{"account": "F3", "balance": 150}')  # after a call: a state the reference never saw
    unrecorded = rehearsal(other, '{"account": "A3", "balance": 1}')
    ep = episode("bank-train-0000-balance", [C9, C9, other], "180", [right, repeated, unrecorded])
    wrong = rehearsal(C9, '{"account": "F3", "balance": 150}')
    untrained = rehearsal(C9, '{"account": "F3", "balance": 150}', trained=False)
    ep_wrong = episode("bank-train-0000-balance", [C9], "180", [wrong])
    ep_untrained = episode("bank-train-0000-balance", [C9], "180", [untrained])
    score_episodes([ep, ep_wrong, ep_untrained], [TaskSuccess()], PredictionErrorShaping(coef=0.5))
    assert ep.reward == pytest.approx(1.0) and ep.act.reward == pytest.approx(1.0)  # shaping never touches act
    assert right.reward == pytest.approx(1.0)  # leaf F1 = 1: no penalty
    assert repeated.reward == pytest.approx(1.0) and repeated.real is None  # stateful: no recorded response
    assert unrecorded.reward == pytest.approx(1.0)  # no recorded response: no shaping
    # leaves {account: F3, balance: 150} vs {account: F3, balance: 180}: 1 common -> F1 = 2*1/(2+2) = 0.5
    # shaping = -0.5 * (1 - 0.5) = -0.25 -> 1.0 - 0.25 = 0.75
    assert wrong.reward == pytest.approx(0.75)
    assert wrong.sample is not None and wrong.sample.reward == pytest.approx(0.75)
    assert untrained.reward == pytest.approx(0.75) and untrained.sample is None


def test_stateless_cache_shapes_repeated_calls_and_a_known_real_response_wins() -> None:
    first = rehearsal(C9, C9_REAL)
    repeated = rehearsal(C9, '{"account": "F3", "balance": 150}')
    ep = episode("bank-train-0000-balance", [C9, C9], "180", [first, repeated])
    score_episodes([ep], [TaskSuccess()], PredictionErrorShaping(coef=0.5), ResponseCache(stateful=False))
    assert repeated.real == C9_REAL and repeated.reward == pytest.approx(0.75)  # keyed by the call alone
    audited = rehearsal(C9, '{"account": "F3", "balance": 150}')
    audited.real = '{"account": "F3", "balance": 150}'  # e.g. from an audit replay: not overwritten by the reference
    ep = episode("bank-train-0000-balance", [C9], "180", [audited])
    score_episodes([ep], [TaskSuccess()], PredictionErrorShaping(coef=0.5))
    assert audited.reward == pytest.approx(1.0)


def test_shaping_matches_calls_canonically_across_a_multi_call_reference() -> None:
    # bank-0002: transfer(B7 -> F6, 120) -> {"source": "B7", "balance": 45, ...}; get_balance(F6) -> balance 290
    transfer = ToolCall("transfer", {"amount": 120.0, "target": "F6", "source": "B7"})  # 120.0 == 120, any key order
    d9 = ToolCall("get_balance", {"account": "F6"})
    # transfer content missing 2 of 5 leaves: pred 3 leaves, ref 5, common 3 -> F1 = 6/8 = 0.75
    # shaping = -0.5 * 0.25 = -0.125
    partial = rehearsal(transfer, '{"source": "B7", "balance": 45, "target": "F6"}')
    # get_balance with a different shape: pred {balance: 290} vs ref {account: F6, balance: 290}: F1 = 2/3
    # shaping = -0.5 * (1/3) = -1/6
    short = rehearsal(d9, '{"balance": 290}')
    ep = episode("bank-train-0002-transfer_target", [transfer, d9], "0", [partial, short])
    score_episodes([ep], [TaskSuccess()], PredictionErrorShaping(coef=0.5))
    # the two ordered calls match, the answer "0" does not ("290"): 2 / 3
    assert ep.reward == pytest.approx(2 / 3) and not ep.success
    assert partial.reward == pytest.approx(2 / 3 - 0.125)
    assert short.reward == pytest.approx(2 / 3 - 1 / 6)


def test_non_json_rehearsal_content_gets_no_shaping() -> None:
    bad = rehearsal(C9, "not json")
    ep = episode("bank-train-0000-balance", [C9], "180", [bad])
    score_episodes([ep], [TaskSuccess()], PredictionErrorShaping(coef=0.5))
    assert bad.reward == pytest.approx(1.0)
