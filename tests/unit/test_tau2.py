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


def test_the_gold_policy_earns_the_full_reward_through_the_rollout(tiny_tokenizer) -> None:
    from envace.benchmarks.tau2 import GoldSoloPolicy, evaluate_solo

    for task in load_tasks("telecom", "test")[:3]:
        result = evaluate_solo([task], GoldSoloPolicy(task, tiny_tokenizer), tiny_tokenizer)
        assert result["rewards"] == {task.id: [1.0]} and result["pass_hat"] == {1: 1.0}
        assert result["floor"] == 0.0


def test_solo_conversion_refuses_domains_that_need_a_user() -> None:
    from envace.benchmarks.tau2 import to_task

    task = load_tasks("telecom", "test")[0]
    converted = to_task(task)
    assert converted.messages[1] == {"role": "user", "content": task.ticket}
    assert {"toggle_roaming", "get_customer_by_phone"} <= {t["function"]["name"] for t in converted.tools}
    with pytest.raises(ValueError, match="'retail' needs one"):
        to_task(load_tasks("retail", "test")[0], "retail")


@pytest.mark.slow
def test_a_tiny_random_policy_runs_telecom_solo_deterministically(tiny_tokenizer) -> None:
    import torch

    from envace.benchmarks.tau2 import evaluate_solo
    from envace.policy.tiny import build_model
    from envace.rollout.engine import HFEngine
    from envace.rollout.runner import RolloutConfig

    model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=0, max_positions=32768)
    engine = HFEngine(model, pad_id=tiny_tokenizer.pad_token_id, stop_ids=[tiny_tokenizer.eos_token_id])
    config = RolloutConfig(act_max_new_tokens=8, act_temperature=1.0, max_turns=2, max_tool_calls=4,
                           max_context_tokens=32768)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        result = evaluate_solo(load_tasks("telecom", "test")[:1], engine, tiny_tokenizer, config, trials=2)
        assert all(0.0 <= r <= 1.0 for rs in result["rewards"].values() for r in rs)
        assert set(result["pass_hat"]) == {1, 2}
        runs.append((result["rewards"], [e.act.token_ids for e in result["episodes"]]))
    assert runs[0] == runs[1]
