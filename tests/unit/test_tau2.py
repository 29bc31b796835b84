"""tau^2-Bench offline: gold trajectories earn the full reward, the do-nothing policy earns the floor."""

from __future__ import annotations

import pytest

from envace.benchmarks.tau2 import environment_constructor, gold_trajectory, load_tasks, null_trajectory, reward


def test_telecom_solo_gold_replays_score_one_and_doing_nothing_scores_zero() -> None:
    tasks = load_tasks("telecom", "test")[:4]
    assert len(tasks) == 4
    for task in tasks:
        assert reward(task, gold_trajectory(task, "telecom", solo=True), "telecom", solo=True) == 1.0, task.id
        assert reward(task, null_trajectory(), "telecom", solo=True) == 0.0, task.id


def test_airline_gold_replay_and_a_refusal_task_passing_with_no_call() -> None:
    tasks = load_tasks("airline", "test")
    gold = tasks[0]
    assert reward(gold, gold_trajectory(gold, "airline"), "airline") == 1.0
    # the floor: some airline tasks are passed by refusing (6 of the 20 test tasks, measured)
    floor = [t.id for t in tasks[:8] if reward(t, null_trajectory(), "airline") == 1.0]
    assert floor == ["6", "13"]  # measured; tasks whose right answer is to refuse


def test_bad_domains_splits_ids_and_modes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="valid: airline, retail, telecom"):
        load_tasks("banking")
    with pytest.raises(ValueError, match="valid: base, train, test"):
        load_tasks("telecom", "full_set")
    with pytest.raises(ValueError, match=r"unknown retail/base task id\(s\) \['nope'\]"):
        load_tasks("retail", ids=["nope"])
    with pytest.raises(ValueError, match="solo mode exists for telecom only"):
        environment_constructor("retail", solo=True)
