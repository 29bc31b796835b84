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
    from envace.benchmarks.tau2_eval import GoldSoloPolicy, evaluate_solo

    for task in load_tasks("telecom", "test")[:3]:
        result = evaluate_solo([task], GoldSoloPolicy(task, tiny_tokenizer), tiny_tokenizer)
        assert result["rewards"] == {task.id: [1.0]} and result["pass_hat"] == {1: 1.0}
        assert result["floor"] == 0.0


def test_a_solo_episode_is_scored_only_if_it_ends_with_taus_stop(tiny_tokenizer) -> None:
    """tau^2 scores a solo conversation only when the agent stops (the ``done`` tool); a plain-text ending is an
    agent error (``###STOP###`` in the text included: ``LLMSoloAgent`` raises on a message without tool calls, and a
    failed run scores 0) and running out of steps is ``max_steps``: all 0. Before, envace scored such episodes as if
    they had ended properly, and its gold policy ended in plain text."""
    from envace.benchmarks.parity import block
    from envace.benchmarks.scripted import ScriptedPolicy
    from envace.benchmarks.tau2_eval import evaluate

    task = load_tasks("telecom", "test")[0]
    calls = [block(a.name, a.arguments) for a in task.evaluation_criteria.actions]

    def run(outputs: list[str], **limits) -> tuple[float, str]:
        result = evaluate([task], ScriptedPolicy(tiny_tokenizer, outputs), tiny_tokenizer, **limits)
        return result["rewards"][task.id][0], result["endings"][task.id][0]

    assert run([*calls, block("done", {})]) == (1.0, "agent_stop")
    assert run([*calls, "Fixed. ###STOP###"]) == (0.0, "agent_error")
    assert run([*calls, "###STOP###"]) == (0.0, "agent_error")
    assert run([*calls, "I fixed it."]) == (0.0, "agent_error")
    assert run([*calls, *calls, block("done", {})], max_steps=2 * len(calls) + 1) == (0.0, "max_steps")
    assert run([*calls, block("done", {})], max_steps=2 * len(calls)) == (0.0, "max_steps")  # the stop is the limit
    assert run([*[block("nope", {})] * 3, *calls, block("done", {})], max_errors=3) == (0.0, "too_many_errors")


def test_solo_tasks_carry_taus_solo_instructions_and_its_done_tool() -> None:
    from envace.benchmarks.tau2_tasks import DONE_TOOL, to_task

    converted = to_task(load_tasks("telecom", "test")[0])
    assert DONE_TOOL in converted.tools
    system = converted.messages[0]["content"]
    assert "send a message containing a single tool call to the `done` tool" in system and "<policy>" in system


def test_solo_conversion_refuses_domains_that_need_a_user() -> None:
    from envace.benchmarks.tau2_tasks import to_task

    task = load_tasks("telecom", "test")[0]
    converted = to_task(task)
    assert converted.messages[1] == {"role": "user", "content": task.ticket}
    assert {"toggle_roaming", "get_customer_by_phone"} <= {t["function"]["name"] for t in converted.tools}
    with pytest.raises(ValueError, match="'retail' needs one"):
        to_task(load_tasks("retail", "test")[0], "retail")


@pytest.mark.slow
def test_a_tiny_random_policy_runs_telecom_solo_deterministically(tiny_tokenizer) -> None:
    import torch

    from envace.benchmarks.tau2_eval import evaluate_solo
    from envace.engines.base import HFEngine
    from envace.policy.tiny import build_model
    from envace.rollout.config import RolloutConfig

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


@pytest.mark.slow
def test_a_tiny_random_policy_and_user_run_retail_deterministically(tiny_tokenizer) -> None:
    import torch

    from envace.benchmarks.tau2_eval import evaluate
    from envace.engines.base import HFEngine
    from envace.engines.chat_model import ChatModel
    from envace.policy.tiny import build_model
    from envace.rollout.config import RolloutConfig

    def engine(seed: int) -> HFEngine:
        model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=seed, max_positions=16384)
        return HFEngine(model, pad_id=tiny_tokenizer.pad_token_id, stop_ids=[tiny_tokenizer.eos_token_id])

    agent = engine(0)
    user = ChatModel.from_engine(engine(1), tiny_tokenizer, max_new_tokens=8, temperature=1.0)
    config = RolloutConfig(act_max_new_tokens=8, act_temperature=1.0, max_turns=3, max_tool_calls=4,
                           max_context_tokens=16384, max_user_turns=2)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        result = evaluate(load_tasks("retail", "test")[:1], agent, tiny_tokenizer, "retail", "user", user=user,
                          rollout=config, trials=2)
        assert all(r in (0.0, 1.0) for rs in result["rewards"].values() for r in rs)
        episodes = result["episodes"]
        assert all(e.stats.user_turns >= 1 for e in episodes)  # the simulated user opened every conversation
        runs.append((result["rewards"], [e.messages for e in episodes]))
    assert runs[0] == runs[1]


# -- user mode: a simulated user writes the user turns ---------------------------------------------------------------

TELECOM_USER_TASK = "[mobile_data_issue]data_saver_mode_on|user_abroad_roaming_enabled_off[PERSONA:Easy]"


def scripted_user(tokenizer, lines: list[str]):
    """A simulated user's model that says ``lines`` in order (the user's own tool calls included)."""
    from helpers import ScriptedEngine

    from envace.engines.chat_model import ChatModel

    return ChatModel.from_engine(ScriptedEngine(tokenizer, lines), tokenizer)


def test_user_mode_conversion_opens_with_the_greeting_and_the_users_scenario() -> None:
    from envace.benchmarks.tau2_tasks import GREETING, to_task

    task = load_tasks("telecom", "test", ids=[TELECOM_USER_TASK])[0]
    converted = to_task(task, "telecom", mode="user")
    assert converted.messages[1] == {"role": "assistant", "content": GREETING}
    assert converted.user == f"<scenario>\n{task.user_scenario}\n</scenario>"
    names = {t["function"]["name"] for t in converted.tools}
    assert "get_customer_by_phone" in names and "toggle_roaming" not in names  # the phone is the user's
    with pytest.raises(ValueError, match="unknown tau\\^2 mode 'duet'; valid: solo, user"):
        to_task(task, "telecom", mode="duet")


def test_retail_gold_actions_with_a_simulated_user_earn_the_full_reward(tiny_tokenizer) -> None:
    from envace.benchmarks.tau2_eval import GoldPolicy, evaluate

    task = load_tasks("retail", "test")[0]
    user = scripted_user(tiny_tokenizer, ["I want to return some items.", "Thanks! ###STOP###"])
    gold = GoldPolicy(task, tiny_tokenizer, solo=False)
    result = evaluate([task], gold, tiny_tokenizer, "retail", "user", user=user)
    (episode,) = result["episodes"]
    assert result["rewards"] == {task.id: [1.0]} and episode.stats.user_stop and episode.stats.user_turns == 1
    assert result["failed"] == {} and result["floor"] == 0.0  # retail test task 0 cannot be passed by refusing


def test_an_episode_its_user_did_not_end_scores_zero_and_a_failed_user_is_not_scored(tiny_tokenizer) -> None:
    from envace.benchmarks.tau2_eval import GoldPolicy, evaluate
    from envace.engines.chat_model import ChatModel
    from envace.rollout.config import RolloutConfig

    task = load_tasks("retail", "test")[0]
    user = scripted_user(tiny_tokenizer, ["I want to return some items."])
    config = RolloutConfig(act_temperature=0.0, max_turns=30, max_context_tokens=65536, max_user_turns=1)
    result = evaluate([task], GoldPolicy(task, tiny_tokenizer, solo=False), tiny_tokenizer, "retail", "user",
                      user=user, rollout=config)
    assert result["rewards"] == {task.id: [0.0]}  # the right actions, but the conversation was cut, as upstream
    silent = ChatModel.from_engine(scripted_user(tiny_tokenizer, []).engine, tiny_tokenizer, max_prompt_tokens=4)
    result = evaluate([task], GoldPolicy(task, tiny_tokenizer, solo=False), tiny_tokenizer, "retail", "user",
                      user=silent)
    assert result["rewards"] == {task.id: []} and result["failed"] == {task.id: 1} and result["pass_hat"] == {}


def test_the_telecom_user_operates_the_phone_and_the_evaluators_see_it(tiny_tokenizer) -> None:
    from helpers import ScriptedEngine

    from envace.benchmarks.tau2_eval import evaluate

    task = load_tasks("telecom", "test", ids=[TELECOM_USER_TASK])[0]
    call = '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call>'
    user = scripted_user(tiny_tokenizer, [
        "My mobile data does not work abroad.",
        call.format("toggle_data_saver_mode"), call.format("toggle_roaming"), "Done, both toggled.",
        "It works now. ###STOP###",
    ])
    agent = ScriptedEngine(tiny_tokenizer, ["Please turn off data saver mode and turn on roaming.", "Great."])
    result = evaluate([task], agent, tiny_tokenizer, "telecom", "user", user=user)
    (episode,) = result["episodes"]
    assert result["rewards"] == {task.id: [1.0]}
    assert [m["content"] for m in episode.messages if m["role"] == "user"] == [
        "My mobile data does not work abroad.", "Done, both toggled.", "It works now."]
    assert not episode.calls  # the agent made no call: the phone's calls were the user's
    # without the user's calls the assertions fail
    user = scripted_user(tiny_tokenizer, ["My mobile data does not work abroad.", "I won't. ###STOP###"])
    agent = ScriptedEngine(tiny_tokenizer, ["Please turn off data saver mode and turn on roaming."])
    assert evaluate([task], agent, tiny_tokenizer, "telecom", "user", user=user)["rewards"] == {task.id: [0.0]}


# -- training tasks ----------------------------------------------------------------------------------------------------


def test_training_tasks_hold_out_the_test_split_and_carry_gold_references() -> None:
    import json

    from envace.benchmarks.tau2_train import Tau2Toolbox, training_task
    from envace.data.task_parsing import parse_task
    from envace.data.task_records import task_to_record

    with pytest.raises(ValueError, match="in the test split, held out"):
        training_task(load_tasks("retail", "test")[0], "retail", "user")
    task = load_tasks("retail", "train")[0]
    converted = training_task(task, "retail", "user")
    assert parse_task(json.loads(json.dumps(task_to_record(converted)))) == converted  # the loader takes it
    gold = [a.name for a in task.evaluation_criteria.actions]
    assert [c.name for c in converted.success.calls] == gold and not converted.success.ordered
    calls = [m["tool_calls"][0]["function"]["name"] for m in converted.reference if m.get("tool_calls")]
    assert calls == gold and converted.reference[-1]["role"] == "assistant"
    toolbox = Tau2Toolbox("retail", task.id)
    assert "get_order_details" in toolbox.tool_names()
    assert toolbox.call_tool("get_order_details", {"order_id": "#nope"}) == "Error: Order not found"


def test_tau2_reward_replays_the_episodes_calls_whatever_answered_them(tiny_tokenizer) -> None:
    from dataclasses import replace

    from envace.benchmarks.tau2_eval import GoldSoloPolicy, evaluate
    from envace.benchmarks.tau2_train import Tau2Reward

    task = load_tasks("telecom", "test")[0]
    (episode,) = evaluate([task], GoldSoloPolicy(task, tiny_tokenizer), tiny_tokenizer)["episodes"]
    assert Tau2Reward()(episode) == 1.0
    episode.calls.clear()  # as if the rehearsed world had answered nothing real: the replay decides
    assert Tau2Reward()(episode) == 0.0
    episode.task = replace(episode.task, environment=None)  # not a converted task
    with pytest.raises(ValueError, match="Tau2Reward scores tau\\^2 tasks"):
        Tau2Reward()(episode)
