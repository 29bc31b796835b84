"""A policy's run on tau^2 tasks through envace's rollout, scored as tau^2 scores it, and the gold policies.

``evaluate`` runs telecom solo and every domain with a simulated user (``envace.benchmarks.tau2_tasks``), on the
episode's tau^2 environment (``envace.benchmarks.tau2_world``), ends each episode where tau^2's Orchestrator would
(``envace.benchmarks.tau2_rules``) and scores it with tau^2's reward (``envace.benchmarks.tau2.reward``).
``GoldPolicy`` replays a task's gold actions.
"""

from __future__ import annotations

import json
from typing import Any

from envace.benchmarks.scripted import ScriptedPolicy
from envace.benchmarks.tau2 import SOLO_DOMAINS, null_trajectory, require_tau2, reward
from envace.benchmarks.tau2_rules import MAX_ERRORS, MAX_STEPS, SCORED_ENDINGS, Tau2Rules, termination_reason
from envace.benchmarks.tau2_tasks import DONE_TOOL, to_task, user_guidelines
from envace.benchmarks.tau2_world import Tau2UserTools, Tau2World, episode_trajectory


def evaluate(tasks: list[Any], engine: Any, tokenizer: Any, domain: str = "telecom", mode: str = "solo",
             user: Any = None, rollout: Any | None = None, trials: int = 1, rehearsal: Any = None,
             selector: Any = None, max_steps: int = MAX_STEPS, max_errors: int = MAX_ERRORS) -> dict[str, Any]:
    """Run a policy on tau^2 tasks (``trials`` episodes each) and score them as tau^2 does.

    Args:
        tasks: tau^2 tasks of ``domain`` (``load_tasks``).
        engine: generates the act role (greedy unless ``rollout`` says otherwise).
        tokenizer: the policy's tokenizer.
        domain: the tasks' domain.
        mode: ``solo`` (telecom, no user) or ``user`` (a simulated user writes the user turns).
        user: in ``user`` mode, the simulated user: a model (``envace.engines.chat_model.ChatModel``, a local
        checkpoint;
            tau^2's own guidelines are its instructions, and in telecom it operates the phone), or any
            ``envace.worlds.users.UserSimulator`` (e.g. a scripted one).
        rollout: budgets (default: greedy, 64k context, no turn or call budget below tau^2's own limits).
        trials: episodes per task (pass^k for k up to ``trials``).
        rehearsal: private rehearsal before committed turns (``envace.rollout.private_rehearsal.PrivateRehearsal``);
            rehearsal never reaches the environment.
        selector: what a rehearsal commits (default: the act role writes the turn with the memory).
        max_steps: the Orchestrator's step limit (tau^2's default 200).
        max_errors: the Orchestrator's tool-error limit (tau^2's default 10).

    Returns:
        ``{"rewards": {task id: [reward per trial]}, "pass_hat": {k: pass^k}, "floor": do-nothing reward,
        "endings": {task id: [termination reason per trial]}, "failed": {task id: trials whose simulated user or
        environment failed}, "episodes": [...]}``. As in ``evaluate_simulation``, only an episode that ended with
        the agent's or the user's stop (``SCORED_ENDINGS``) is scored; any other ending scores 0. A trial whose user
        could not reply, or whose environment raised (``EpisodeStats.failed``), is an infrastructure failure: it is
        left out of the rewards and reported under ``failed``.
    """
    from dataclasses import replace

    from envace.benchmarks.passk import pass_hat_k
    from envace.rollout.config import RolloutConfig
    from envace.rollout.rehearsing import make_runner
    from envace.worlds.users import ModelUser

    require_tau2()
    solo = mode == "solo"
    converted = [to_task(t, domain, mode) for t in tasks for _ in range(trials)]
    if not solo and user is None:
        raise ValueError("tau^2 user mode needs a user: a model (envace.engines.chat_model.ChatModel over a local "
                         "checkpoint) or an envace.worlds.users.UserSimulator")
    config = rollout or RolloutConfig(act_temperature=0.0, max_turns=max_steps, max_tool_calls=100_000,
                                      max_context_tokens=65536)
    config = replace(config, validate_calls=False)  # tau^2's tools answer bad arguments and unknown names themselves
    simulator = None if solo else user if hasattr(user, "respond") else ModelUser(
        user, guidelines=user_guidelines(domain in SOLO_DOMAINS), tools=Tau2UserTools() if domain in SOLO_DOMAINS
        else None)
    world = Tau2World(tasks, domain, solo=solo)
    groups = [i // trials for i in range(len(converted))]
    rules = Tau2Rules(world, solo, max_steps, max_errors)
    runner = make_runner(tokenizer, config, rehearsal, selector, rules=rules)
    episodes = runner.run(converted, groups, engine, world, world_engine=engine, user=simulator)
    by_id = {str(t.id): t for t in tasks}
    rewards: dict[str, list[float]] = {str(t.id): [] for t in tasks}
    endings: dict[str, list[str]] = {str(t.id): [] for t in tasks}
    failed: dict[str, int] = {}
    for episode, handle in zip(episodes, world.opened):
        task_id = episode.task.id
        if episode.stats.user_failures or episode.stats.failed:  # never scored against the agent
            failed[task_id] = failed.get(task_id, 0) + 1
            continue
        ending = termination_reason(episode, handle, solo, max_steps, max_errors)
        scored = ending in SCORED_ENDINGS
        value = reward(by_id[task_id], episode_trajectory(episode, handle), domain, solo=solo) if scored else 0.0
        rewards[task_id].append(value)
        endings[task_id].append(ending)
    successes = [[r >= 1.0 for r in per_task] for per_task in rewards.values() if per_task]
    floor = sum(reward(t, null_trajectory(), domain, solo=solo) for t in tasks) / len(tasks)
    most = min((len(s) for s in successes), default=0)  # pass^k over tasks with k scored trials (failures left out)
    return {"rewards": rewards, "pass_hat": {k: pass_hat_k(successes, k) for k in range(1, most + 1)},
            "floor": floor, "endings": endings, "failed": failed, "episodes": episodes}


def evaluate_solo(tasks: list[Any], engine: Any, tokenizer: Any, rollout: Any | None = None, trials: int = 1,
                  domain: str = "telecom") -> dict[str, Any]:
    """``evaluate`` in solo mode (telecom, no user)."""
    return evaluate(tasks, engine, tokenizer, domain, "solo", rollout=rollout, trials=trials)


class GoldPolicy(ScriptedPolicy):
    """A policy that replays one task's gold actions, one call per act turn, then ends as the mode wants.

    Solo: the last turn calls ``done`` (tau^2's stop). User mode: the last turn says what the task needs communicated
    (or "Done."), for the simulated user to end the conversation. It serves one episode at a time.
    """

    def __init__(self, task: Any, tokenizer: Any, solo: bool = True) -> None:
        script = [_call_block(a.name, a.arguments) for a in task.evaluation_criteria.actions or []]
        if solo:
            script.append(_call_block(DONE_TOOL["function"]["name"], {}))
        else:
            script.append(" ".join(task.evaluation_criteria.communicate_info or []) or "Done.")
        super().__init__(tokenizer, script)


class GoldSoloPolicy(GoldPolicy):
    """``GoldPolicy`` in solo mode: the gold actions, then ``done``."""

    def __init__(self, task: Any, tokenizer: Any) -> None:
        super().__init__(task, tokenizer, solo=True)


def _call_block(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
