"""tau^2's own runner on raw model text: ``run_task`` with only the model request scripted.

``tau2_official_run`` runs ``tau2.run.run_task`` (its ``LLMSoloAgent`` or ``LLMAgent``, its ``DummyUser`` or
``UserSimulator``, its Orchestrator and ``evaluate_simulation``). The one thing replaced is litellm's ``completion``
inside ``tau2.utils.llm_utils``: it answers each request with the script's raw generation, read into an OpenAI chat
message the way a served model's is (``hermes_message``, vLLM's ``hermes`` tool parser, the parser for the
``<tool_call>`` format of envace's templates). tau^2's own ``generate`` then does the rest as shipped: its retries of
an empty answer, ``json.loads`` of each call's arguments, the message types and their validation.

Each requester's generations are served in order; a retried request (``generate`` retries an empty answer, with the
same messages) gets the same text again, as a greedy model would write it.
"""

from __future__ import annotations

import contextlib
import json
import types
from collections.abc import Iterator
from typing import Any

from envace.benchmarks import tau2_rules
from envace.benchmarks.hermes import hermes_message
from envace.benchmarks.official import ScriptExhausted, tau2_official

AGENT_MODEL = "envace-script/agent"
USER_MODEL = "envace-script/user"
"""The model names ``run_task`` is given; ``_ScriptedCompletion`` answers each from its script."""


class _Response(types.SimpleNamespace):
    """The parts of litellm's ``ModelResponse`` tau^2's ``generate`` reads."""

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class _Choice(types.SimpleNamespace):
    """One choice of the response; ``generate`` keeps its ``to_dict()`` as the message's raw data."""

    def to_dict(self) -> dict[str, Any]:
        calls = [{"id": c.id, "type": c.type, "function": vars(c.function)} for c in self.message.tool_calls or []]
        return {"finish_reason": self.finish_reason,
                "message": {"role": "assistant", "content": self.message.content, "tool_calls": calls or None}}


def _response(model: str, text: str, tag: str) -> _Response:
    """The chat response a served model gives for ``text`` (``hermes_message``), with zero usage."""
    content, calls = hermes_message(text)
    tool_calls = [types.SimpleNamespace(id=f"{tag}-{i}", type="function",
                                        function=types.SimpleNamespace(name=name, arguments=arguments))
                  for i, (name, arguments) in enumerate(calls)] or None
    message = types.SimpleNamespace(role="assistant", content=content, tool_calls=tool_calls)
    choice = _Choice(message=message, finish_reason="tool_calls" if calls else "stop")
    usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
    return _Response(model=model, choices=[choice], usage=usage)


class _ScriptedCompletion:
    """Stands in for litellm's ``completion`` in ``tau2.utils.llm_utils``: the agent's and the user's model.

    Each requester (``AGENT_MODEL`` or ``USER_MODEL``) is answered with its script's raw generations in order; a
    request with the same messages as the requester's previous one (``generate`` retrying an empty answer) gets the
    same generation again, as a greedy model would write it.
    """

    def __init__(self, agent: list[str], user: list[str]) -> None:
        self.scripts = {AGENT_MODEL: list(agent), USER_MODEL: list(user)}
        self.answered: dict[str, tuple[str, int]] = {}  # requester -> (its last request, the index answered)
        self.exhausted = ""

    def __call__(self, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> _Response:
        script = self.scripts[model]
        request = json.dumps(messages, sort_keys=True, default=str)
        last, index = self.answered.get(model, ("", -1))
        if request != last:
            index += 1
        if index >= len(script):
            self.exhausted = f"the {model} script ran out after {len(script)} messages"
            raise ScriptExhausted(self.exhausted)
        self.answered[model] = (request, index)
        return _response(model, script[index], f"{model}-{index}")


@contextlib.contextmanager
def _scripted(completion: _ScriptedCompletion) -> Iterator[None]:
    """Litellm's ``completion`` (and ``completion_cost``: 0) in tau^2's ``llm_utils`` answer from the scripts."""
    from tau2.utils import llm_utils

    saved = {name: getattr(llm_utils, name) for name in ("completion", "completion_cost")}
    llm_utils.completion, llm_utils.completion_cost = completion, lambda **kwargs: 0.0
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(llm_utils, name, value)


def tau2_official_run(task: Any, domain: str, solo: bool, agent_script: list[str],
                      user_script: list[str] | None = None, max_steps: int = tau2_rules.MAX_STEPS,
                      max_errors: int = tau2_rules.MAX_ERRORS) -> tuple[float, str]:
    """One scripted episode through ``tau2.run.run_task``: the Orchestrator, then ``evaluate_simulation``.

    ``llm_agent_solo`` with ``dummy_user`` in solo mode, ``llm_agent`` with ``user_simulator`` in user mode, each
    model answering from its script of raw generations; ``EvaluationType.ALL``, as ``run_task`` defaults.

    A run that raises is scored as ``run_tasks`` scores a failed sample (``skip_failed_samples``): reward 0,
    ``agent_error``. tau^2 raises on an agent message with neither text nor calls (``AssistantMessage.validate``:
    an empty or whitespace-only generation, after ``generate``'s retries), on call arguments that are not an object,
    and in solo mode on a message without calls.

    Args:
        task: a tau^2 ``Task``.
        domain: its domain.
        solo: solo mode or user mode.
        agent_script: the agent's raw generations, in order.
        user_script: user mode: the simulated user's raw generations.
        max_steps: the Orchestrator's ``max_steps``.
        max_errors: the Orchestrator's ``max_errors``.

    Returns:
        ``(reward, termination reason)`` as tau^2 records them.

    Raises:
        ScriptExhausted: a script ran out before the run ended.
    """
    official = tau2_official()
    completion = _ScriptedCompletion(agent_script, user_script or [])
    try:
        with _scripted(completion):
            simulation = official.run.run_task(
                domain=domain, task=task, agent="llm_agent_solo" if solo else "llm_agent",
                user="dummy_user" if solo else "user_simulator", llm_agent=AGENT_MODEL,
                llm_user=None if solo else USER_MODEL, max_steps=max_steps, max_errors=max_errors,
                evaluation_type=official.evaluator.EvaluationType.ALL)
    except Exception as exc:  # noqa: BLE001 - run_tasks(skip_failed_samples=True) scores any failed run this way
        if completion.exhausted:
            raise ScriptExhausted(f"tau2_official_run: {completion.exhausted}") from exc
        return 0.0, official.simulation.TerminationReason.AGENT_ERROR.value
    reason = simulation.termination_reason
    return float(simulation.reward_info.reward), str(getattr(reason, "value", reason))
