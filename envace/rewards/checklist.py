"""The checklist reward: per-turn weighted standards judged by a model, step by step.

A task carries ``checklists`` (read with ``getattr(task, "checklists", ())``): a tuple of checklists, each a tuple
over the conversation's user turns, each a tuple of standards. A standard is a dataclass or a dict with
``question``, ``focus_on``, ``pass_condition``, ``failure_examples`` (list), ``evidence`` (list of
``{"snippet": str}``), ``weight`` (number) and ``required_for_next_turn`` (bool).

For every completed user turn, each assistant step of that turn is judged against each standard of the turn: one
judge request per (step, standard), the verdict a strict JSON object (``parse_verdict``). A standard is satisfied in a
turn if some step satisfies it (see ``ChecklistReward`` for the formula). Judges:

- ``ScriptedJudge``: answers from a function or a table (tests);
- ``LocalJudge``: a local Hugging Face model through ``envace.engines.chat_model.ChatModel``;
- ``HTTPJudge``: an OpenAI-compatible ``/v1/chat/completions`` server run by the user (standard library only).

Differences from the reference implementation:

- a judge that cannot give a verdict (unreachable server, HTTP errors, malformed replies after all retries) never
  counts as ``False``: the reward raises ``JudgeUnavailable``, the scorer fails the episode, and
  ``mask_groups_with_failed_judging`` can mask its whole GRPO group;
- an assistant message's reasoning is read from ``message["reasoning"]`` (or a ``<think>`` block); a message without
  either has no thinking, and its whole content is the visible reply;
- verdicts are cached by content (the full prompt and the judge's identity), so an identical (step, standard)
  request is asked once per run;
- tool errors do not end the episode; a tool error after a step makes the standards focused on tool calls or tool
  content fail for that step, without asking the judge (the reference's shortcut).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from envace.roles.parsing import loads_json
from envace.types import Episode, error_text, is_error_value, unreward

if TYPE_CHECKING:
    from envace.engines.chat_model import ChatModel

log = logging.getLogger(__name__)

VERDICT_FIELDS = (
    "high_level_understanding_of_the_question",
    "analysis_of_if_focus_on",
    "analysis_of_pass_condition",
    "analysis_of_failure_examples",
)
"""The string fields of a verdict, in the order the judge is asked to fill them; ``answer`` (bool) follows."""

TOOL_FOCUS = frozenset({"assistant.tool_calls", "tool.content"})
"""``focus_on`` values that a tool error after the step fails without asking the judge."""

JUDGE_UNAVAILABLE = "JudgeUnavailable"
"""Marker in an episode's failure cause (``EpisodeStats.failure``) when judging failed (see ``judging_failed``)."""

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "evaluation_verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {**{name: {"type": "string"} for name in VERDICT_FIELDS}, "answer": {"type": "boolean"}},
            "required": [*VERDICT_FIELDS, "answer"],
            "additionalProperties": False,
        },
    },
}
"""The ``response_format`` sent to an OpenAI-compatible server: a strict JSON schema of the verdict."""


class JudgeUnavailable(RuntimeError):
    """The judge gave no verdict for some (step, standard) of an episode: the episode must not be scored."""


# ---------------------------------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A judge's parsed verdict on one (step, standard)."""

    high_level_understanding_of_the_question: str
    analysis_of_if_focus_on: str
    analysis_of_pass_condition: str
    analysis_of_failure_examples: str
    answer: bool


def parse_verdict(text: str) -> Verdict | None:
    """The verdict in a judge reply, or None when it is malformed.

    The reply must be one JSON object with exactly the four string fields of ``VERDICT_FIELDS`` and the boolean
    ``answer``. A leading think block (up to ``</think>``) and a ```` ```json ```` fence around the object are
    tolerated; anything else (other keys, a missing key, a string ``"true"``, trailing text) is malformed.
    """
    if not isinstance(text, str):
        return None
    body = text.rsplit("</think>", 1)[-1].strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, flags=re.DOTALL)
    body = fenced.group(1) if fenced else body
    try:
        value = loads_json(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or set(value) != {*VERDICT_FIELDS, "answer"}:
        return None
    if not isinstance(value["answer"], bool) or not all(isinstance(value[name], str) for name in VERDICT_FIELDS):
        return None
    return Verdict(**value)


# ---------------------------------------------------------------------------------------------------------------------
# Standards (plain data: a dataclass or a dict)
# ---------------------------------------------------------------------------------------------------------------------


def field_of(item: Any, name: str, default: Any = None) -> Any:
    """``item[name]`` for a mapping, else ``getattr(item, name)``; ``default`` when absent."""
    if isinstance(item, Mapping):
        return item.get(name, default)
    return getattr(item, name, default)


@dataclass(frozen=True)
class _Standard:
    """A validated standard (the fields the reward and the prompt use)."""

    question: str
    focus_on: str
    pass_condition: str
    failure_examples: list[Any]
    snippets: list[Any]
    weight: float
    required: bool


def _standard(raw: Any, where: str) -> _Standard:
    weight = field_of(raw, "weight", None)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise ValueError(f"checklist {where}: weight must be a finite number, got {weight!r}")
    required = field_of(raw, "required_for_next_turn", False)
    if not isinstance(required, bool):
        raise ValueError(f"checklist {where}: required_for_next_turn must be a bool, got {required!r}")
    examples = field_of(raw, "failure_examples", None) or []
    evidence = field_of(raw, "evidence", None) or []
    if not isinstance(examples, list | tuple) or not isinstance(evidence, list | tuple):
        raise ValueError(f"checklist {where}: failure_examples and evidence must be lists")
    return _Standard(
        question=str(field_of(raw, "question", "") or ""),
        focus_on=str(field_of(raw, "focus_on", "") or ""),
        pass_condition=str(field_of(raw, "pass_condition", "") or ""),
        failure_examples=list(examples),
        snippets=[field_of(e, "snippet", e) for e in evidence],
        weight=float(weight),
        required=required,
    )


def read_checklists(task: Any) -> list[list[list[_Standard]]]:
    """The task's checklists (``getattr(task, "checklists", ())``), validated: ``[checklist][turn][standard]``.

    Raises:
        ValueError: no checklists, or a standard with a weight that is not a finite number (naming the task, the
            checklist, the turn and the standard, all from 1).
    """
    task_id = getattr(task, "id", "?")
    raw = getattr(task, "checklists", ()) or ()
    if not raw:
        raise ValueError(f"task '{task_id}' has no checklists (ChecklistReward needs Task.checklists)")
    return [
        [[_standard(s, f"of task '{task_id}', checklist {j + 1}, turn {t + 1}, standard {k + 1}")
          for k, s in enumerate(turn)] for t, turn in enumerate(checklist)]
        for j, checklist in enumerate(raw)
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Conversation: user turns, steps, serialisation
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class UserTurn:
    """One user turn of an episode's messages.

    Attributes:
        start: index of its first user message in ``episode.messages``.
        end: index one past its last message.
        steps: indices of its assistant messages (the steps), in order.
        completed: the assistant finished the turn (a reply without tool calls), or the conversation moved on.
    """

    start: int
    end: int
    steps: list[int]
    completed: bool


def split_user_turns(messages: Sequence[Mapping[str, Any]]) -> list[UserTurn]:
    """The user turns of ``messages``: a run of user messages and the assistant and tool messages that follow it."""
    starts = [i for i, m in enumerate(messages)
              if m.get("role") == "user" and (i == 0 or messages[i - 1].get("role") != "user")]
    turns = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(messages)
        steps = [i for i in range(start, end) if messages[i].get("role") == "assistant"]
        last = messages[steps[-1]] if steps else None
        completed = n + 1 < len(starts) or (last is not None and not last.get("tool_calls"))
        turns.append(UserTurn(start, end, steps, completed))
    return turns


def split_reasoning(message: Mapping[str, Any]) -> tuple[str | None, str]:
    """``(thinking, visible reply)`` of an assistant message.

    The thinking is ``message["reasoning"]`` when present, else a ``<think>...</think>`` block at the start of the
    content; a message without either has no thinking and its whole content is the reply.
    """
    content = str(message.get("content") or "")
    reasoning = message.get("reasoning")
    if reasoning:
        return str(reasoning), content.strip()
    match = re.match(r"\s*<think>(.*?)</think>(.*)", content, flags=re.DOTALL)
    if match:
        return match.group(1).strip(), match.group(2).strip()
    return None, content.strip()


def serialise_message(message: Mapping[str, Any], turn: int | None = None, step: int | None = None) -> str:
    """One message as the judge reads it (``turn`` heads a user message, ``step`` an assistant one)."""
    role = message.get("role", "?")
    if role == "assistant":
        thinking, reply = split_reasoning(message)
        calls = json.dumps(message.get("tool_calls") or [], ensure_ascii=False)
        head = f"## Step: {step}\n" if step is not None else ""
        return (f"{head}Role: assistant\ncontent.thinking: {thinking if thinking is not None else '(none)'}\n"
                f"content.user_visible_reply: {reply or '(none)'}\ntool_call: {calls}")
    content = message.get("content")
    content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if role == "user":
        head = f"# Turn: {turn}\n" if turn is not None else ""
        return f"{head}Role: user\ncontent: {content}"
    if role == "tool" and message.get("name"):
        return f"Role: tool\nname: {message['name']}\ncontent: {content}"
    return f"Role: {role}\ncontent: {content}"


def serialise_messages(messages: Sequence[Mapping[str, Any]], first: int, last: int,
                       turns: Sequence[UserTurn]) -> str:
    """Messages ``first`` to ``last`` (exclusive) joined by blank lines, numbered by turn (from 1) and step."""
    turn_of = {t.start: n + 1 for n, t in enumerate(turns)}
    step_of = {i: s + 1 for t in turns for s, i in enumerate(t.steps)}
    parts = []
    for i in range(first, last):
        message = messages[i]
        parts.append(serialise_message(message, turn=turn_of.get(i), step=step_of.get(i)))
    return "\n\n".join(parts)


def is_tool_error(message: Mapping[str, Any]) -> bool:
    """A tool message reporting an error.

    That is ``{"error": ...}`` content with a truthy value (envace's tool and call errors, and an environment that
    returns an error object instead of raising: ``envace.types.is_error_value``), a message answering a call that
    could not be made (name ``error``), or the reference's ``error_tool_call`` marker.
    """
    if message.get("role") != "tool":
        return False
    if message.get("name") == "error":
        return True
    content = message.get("content")
    if not isinstance(content, str):
        return False
    if "error_tool_call" in content:
        return True
    try:
        value = loads_json(content)
    except ValueError:
        return False
    return is_error_value(value)


# ---------------------------------------------------------------------------------------------------------------------
# The prompt
# ---------------------------------------------------------------------------------------------------------------------


PROMPT_TEMPLATE = """# Role
You are a precise checklist evaluator. You check one step of a conversation between a user and an AI assistant \
that can call tools against one criterion of a checklist, strictly and without guessing.

# Objective
Decide whether the step under evaluation satisfies the criterion. The step is the last assistant message under \
"Current Messages to Evaluate", together with the tool responses that follow it. Earlier messages are context only: \
judge what this step does, in the light of what came before.

# Criteria
**Question:** <<question>>
**Focus on:** <<focus_on>>
**Pass condition:** <<pass_condition>>
**Failure examples:** <<failure_examples>>
**Reference snippet:** <<snippets>>

# Previous Messages
<<previous>>

# Current Messages to Evaluate
<<current>>

# Special rule of tool call
- A tool call counts only if it is in the `tool_call` field of an assistant message. A call that appears only in \
`content.thinking` or in the visible reply was never made and is invalid.
- A tool call whose tool response is an error is invalid: it does not count toward the criterion.

# Evaluation Process
1. high_level_understanding_of_the_question: say in your own words what the question checks.
2. analysis_of_if_focus_on: find the part named in "Focus on" (for example the assistant's tool calls, the tool \
responses or the assistant's visible reply) in the current messages; if it is missing, the answer is false.
3. analysis_of_pass_condition: check every requirement of the pass condition against that part, using the reference \
snippet as a guide to what a passing step looks like.
4. analysis_of_failure_examples: check whether the step matches any of the failure examples or makes the same kind \
of mistake.
5. answer: true only if the focus part is present, the pass condition is fully met and no failure example is \
triggered; otherwise false.

# Output Format
Reply with one JSON object and nothing else:
{"high_level_understanding_of_the_question": "<text>", "analysis_of_if_focus_on": "<text>", \
"analysis_of_pass_condition": "<text>", "analysis_of_failure_examples": "<text>", "answer": <true or false>}"""
"""The judge's prompt (one user message); ``<<name>>`` slots are filled by ``build_prompt``."""


def build_prompt(standard: _Standard, messages: Sequence[Mapping[str, Any]], turns: Sequence[UserTurn], turn: int,
                 step: int) -> str:
    """The judge prompt for step ``step`` (index into the turn's steps) of user turn ``turn`` (index)."""
    current = turns[turn]
    index = current.steps[step]
    stop = index + 1
    while stop < current.end and messages[stop].get("role") == "tool":
        stop += 1
    slots = {
        "question": standard.question,
        "focus_on": standard.focus_on,
        "pass_condition": standard.pass_condition,
        "failure_examples": json.dumps(standard.failure_examples, ensure_ascii=False),
        "snippets": json.dumps(standard.snippets, ensure_ascii=False),
        "previous": serialise_messages(messages, 0, current.start, turns) or "(none)",
        "current": serialise_messages(messages, current.start, stop, turns),
    }
    return re.sub(r"<<(\w+)>>", lambda m: slots[m.group(1)], PROMPT_TEMPLATE)


def _tool_error_after(messages: Sequence[Mapping[str, Any]], index: int, end: int) -> bool:
    stop = index + 1
    while stop < end and messages[stop].get("role") == "tool":
        if is_tool_error(messages[stop]):
            return True
        stop += 1
    return False


# ---------------------------------------------------------------------------------------------------------------------
# Judges
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeRequest:
    """One (step, standard) to judge.

    Attributes:
        prompt: the full judge prompt (one user message).
        task_id: the episode's task.
        checklist: checklist index (from 0).
        turn: user turn index (from 0).
        step: step index within the turn (from 0).
        standard: standard index within the turn (from 0).
    """

    prompt: str
    task_id: str = ""
    checklist: int = 0
    turn: int = 0
    step: int = 0
    standard: int = 0


@runtime_checkable
class Judge(Protocol):
    """Gives verdicts: ``True``/``False``, or None when no valid verdict could be had after the judge's retries.

    ``identity`` names the judge and its settings (part of the verdict cache key); ``last_error`` says why the last
    None was given.
    """

    identity: str
    last_error: str

    def judge(self, requests: list[JudgeRequest]) -> list[bool | None]:
        """One answer per request, in order."""
        ...


class ScriptedJudge:
    """A judge for tests: answers from ``answer(request)`` (or a table keyed by ``(turn, step, standard)``).

    An answer may be a bool, None (a failed verdict), or a reply text, parsed with ``parse_verdict`` and asked again
    up to ``retries`` times while malformed (``answer`` is then called once per attempt). ``calls`` counts the
    requests received, ``attempts`` the answers produced.
    """

    def __init__(self, answer: Callable[[JudgeRequest], bool | str | None] | Mapping[tuple[int, int, int], Any],
                 retries: int = 2, default: bool | None = False, identity: str = "scripted") -> None:
        if isinstance(answer, Mapping):
            table = dict(answer)
            self.answer: Callable[[JudgeRequest], Any] = (
                lambda r: table.get((r.turn, r.step, r.standard), default))
        else:
            self.answer = answer
        self.retries, self.identity, self.last_error = retries, identity, ""
        self.calls = self.attempts = 0
        self.requests: list[JudgeRequest] = []

    def judge(self, requests: list[JudgeRequest]) -> list[bool | None]:
        """One scripted answer per request."""
        out: list[bool | None] = []
        for request in requests:
            self.calls += 1
            self.requests.append(request)
            out.append(self._one(request))
        return out

    def _one(self, request: JudgeRequest) -> bool | None:
        for _ in range(self.retries + 1):
            self.attempts += 1
            reply = self.answer(request)
            if reply is None or isinstance(reply, bool):
                if reply is None:
                    self.last_error = "scripted failure"
                return reply
            verdict = parse_verdict(reply)
            if verdict is not None:
                return verdict.answer
        self.last_error = f"malformed verdict after {self.retries + 1} attempts"
        return None


class LocalJudge:
    """A judge played by a local Hugging Face model (``ChatModel``, greedy by default), one batched call per attempt.

    Malformed replies are asked again, up to ``retries`` more times; a prompt longer than the model's
    ``max_prompt_tokens`` fails at once.

    Args:
        model: the judge's model.
        retries: further attempts after a malformed reply.
        name: the judge's name in its identity (default: the model's path).
    """

    def __init__(self, model: ChatModel, retries: int = 2, name: str | None = None) -> None:
        if retries < 0:
            raise ValueError(f"LocalJudge.retries must be >= 0, got {retries}")
        self.model, self.retries, self.last_error = model, retries, ""
        path = name or getattr(getattr(model, "policy", None), "name_or_path", None) or type(model).__name__
        params = getattr(model, "params", None)
        self.identity = f"local:{path}:{params!r}"

    def judge(self, requests: list[JudgeRequest]) -> list[bool | None]:
        """One answer per request: one batched generation per attempt."""
        out: list[bool | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        for _ in range(self.retries + 1):
            if not pending:
                break
            replies = self.model.complete([[{"role": "user", "content": requests[i].prompt}] for i in pending])
            again = []
            for i, reply in zip(pending, replies):
                if getattr(reply, "overflow", False):
                    self.last_error = "the judge prompt is longer than the model's max_prompt_tokens"
                    continue
                verdict = parse_verdict(reply.text)
                if verdict is None:
                    again.append(i)
                else:
                    out[i] = verdict.answer
            pending = again
        if pending:
            self.last_error = f"malformed verdict after {self.retries + 1} attempts ({len(pending)} requests)"
        return out


class HTTPJudge:
    """A judge served by an OpenAI-compatible ``/v1/chat/completions`` endpoint that the user runs.

    Each request is one chat completion with the prompt as the user message, ``response_format`` the verdict's JSON
    schema (``VERDICT_SCHEMA``). An attempt fails on a connection error, a timeout, an HTTP error status, or a reply
    that is not a valid verdict; it is tried again after ``min(2 ** attempt, backoff_cap)`` seconds (attempt from 0),
    up to ``attempts`` attempts. After the last one the answer is None (never False), and the error, naming the URL,
    is logged and kept in ``errors`` (and ``last_error``).

    Args:
        base_url: the server's API root, e.g. ``http://127.0.0.1:10001/v1`` (``/chat/completions`` is appended).
        model: the served model's name.
        api_key_env: name of the environment variable holding the API key (sent as a bearer token); None for a
            server without authentication. The key itself never appears in a config.
        temperature: sampling temperature (reference: 0.6).
        top_p: nucleus mass (reference: 0.8).
        max_tokens: reply budget (reference: 6000).
        timeout: seconds per HTTP request (reference: 120).
        attempts: attempts per request (reference: 5).
        backoff_cap: longest wait between attempts, in seconds (reference: 30).
        concurrency: requests in flight at once.
        response_format: send the JSON schema (disable for servers that do not support it).
        sleep: the wait function (tests inject a no-op).

    Raises:
        ValueError: bad settings, or ``api_key_env`` names a variable that is not set.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, temperature: float = 0.6,
                 top_p: float = 0.8, max_tokens: int = 6000, timeout: float = 120.0, attempts: int = 5,
                 backoff_cap: float = 30.0, concurrency: int = 32, response_format: bool = True,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if attempts < 1 or concurrency < 1 or timeout <= 0 or max_tokens < 1:
            raise ValueError("HTTPJudge: attempts, concurrency and max_tokens must be >= 1 and timeout > 0")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"HTTPJudge.base_url must be an http(s) URL, got {base_url!r}")
        self.api_key = None
        if api_key_env is not None:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ValueError(f"HTTPJudge: environment variable {api_key_env!r} (api_key_env) is not set")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.temperature, self.top_p, self.max_tokens = model, temperature, top_p, max_tokens
        self.timeout, self.attempts, self.backoff_cap, self.concurrency = timeout, attempts, backoff_cap, concurrency
        self.response_format, self.sleep = response_format, sleep
        self.identity = f"http:{self.url}:{model}:t={temperature}:p={top_p}:max={max_tokens}"
        self.last_error = ""
        self.errors: list[str] = []

    def judge(self, requests: list[JudgeRequest]) -> list[bool | None]:
        """One answer per request; up to ``concurrency`` requests in flight."""
        if not requests:
            return []
        if len(requests) == 1 or self.concurrency == 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def _body(self, request: JudgeRequest) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": request.prompt}],
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if self.response_format:
            body["response_format"] = VERDICT_SCHEMA
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    def _post(self, data: bytes) -> str:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as response:  # noqa: S310 - the user's judge server
            return response.read().decode("utf-8", "replace")

    def _one(self, request: JudgeRequest) -> bool | None:
        data = self._body(request)
        error = ""
        for attempt in range(self.attempts):
            if attempt:
                self.sleep(min(2 ** (attempt - 1), self.backoff_cap))
            try:
                verdict = _reply_verdict(self._post(data))
                if verdict is not None:
                    return verdict.answer
                error = "malformed verdict (not the evaluation_verdict JSON object)"
            except urllib.error.HTTPError as exc:
                try:
                    detail = " ".join(exc.read().decode("utf-8", "replace").split())[:200] if exc.fp else ""
                except OSError:
                    detail = ""
                error = f"HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")
            except urllib.error.URLError as exc:
                error = f"cannot reach the server: {exc.reason}"
            except (OSError, ValueError) as exc:  # timeouts, resets, undecodable bodies
                error = error_text(exc)
        message = f"judge {self.url} (model {self.model}) gave no verdict after {self.attempts} attempts: {error}"
        log.warning(message)
        self.last_error = message
        self.errors = [*self.errors[-99:], message]
        return None


def _reply_verdict(body: str) -> Verdict | None:
    """The verdict in a chat completion response body, or None when the body or the verdict is malformed."""
    try:
        value = loads_json(body)
        content = value["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return parse_verdict(content) if isinstance(content, str) else None


# ---------------------------------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------------------------------


class ChecklistReward:
    """Reward of an episode from its task's checklists, judged step by step by a model.

    For a completed user turn ``t`` (the assistant replied without tool calls, or the conversation moved on),
    checklist ``j`` and standard ``k`` of that turn, with verdicts ``v(s, k)`` over the turn's assistant steps ``s``::

        sat_jtk = OR_s v(s, k)                       (a standard is met if some step meets it)
        r_t     = sum_j sum_k weight_jtk * sat_jtk
        R       = sum_t r_t                          (turns not reached or not completed contribute 0)
        score   = R / num_checklists / max_num_turns

    where ``max_num_turns`` is the number of user turns of the checklists (the longest one). With weights summing to
    1 per turn, the score lies in [0, 1]. A step followed by a tool error fails the standards focused on
    ``assistant.tool_calls`` or ``tool.content`` without asking the judge.

    ``stop_on_required`` reproduces the reference's termination in scoring only: after a turn where more than half
    of the checklists have a ``required_for_next_turn`` standard unmet, later turns score 0 (and are not judged).
    Ending the rollout itself at that point needs a hook in the runner, which this reward does not provide.

    Judge failures are never scored: if any verdict needed is None, the reward raises ``JudgeUnavailable`` (the scorer
    then fails the episode; ``mask_groups_with_failed_judging`` masks its group). Verdicts are cached by content (the
    full prompt and the judge's identity): an identical request is asked once per run.

    Args:
        judge: the judge (``HTTPJudge``, ``LocalJudge`` or ``ScriptedJudge``).
        stop_on_required: score 0 for turns after an unmet required standard (see above).
        score_incomplete_turns: also score a last turn the assistant did not finish (a budget ended the episode).
        cache_size: verdicts kept (least recently used dropped first).
    """

    def __init__(self, judge: Judge, stop_on_required: bool = True, score_incomplete_turns: bool = False,
                 cache_size: int = 1_000_000) -> None:
        self.judge = judge
        self.stop_on_required = stop_on_required
        self.score_incomplete_turns = score_incomplete_turns
        self.cache_size = cache_size
        self.cache: OrderedDict[str, bool] = OrderedDict()
        self.reset_metrics()

    # metrics ---------------------------------------------------------------------------------------------------------

    def reset_metrics(self) -> None:
        """Zero the counters that ``metrics`` reports."""
        self._passes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._calls = self._hits = self._failures = self._shortcuts = 0

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """Counters since the last reset (zeroed after with ``reset``).

        Per standard, its pass rate over the scored turns (``checklist/pass_rate/<turn>.<k>``, turn and standard from
        1; ``c<j>.<turn>.<k>`` for checklists after the first); ``checklist/judge_calls`` (requests sent to the judge),
        ``checklist/cache_hits``, ``checklist/shortcuts`` (failed by a tool error without a call) and
        ``checklist/judge_failures`` (requests without a verdict).
        """
        out = {f"checklist/pass_rate/{key}": passed / seen for key, (passed, seen) in sorted(self._passes.items())}
        out.update({"checklist/judge_calls": float(self._calls), "checklist/cache_hits": float(self._hits),
                    "checklist/shortcuts": float(self._shortcuts), "checklist/judge_failures": float(self._failures)})
        if reset:
            self.reset_metrics()
        return out

    # scoring ---------------------------------------------------------------------------------------------------------

    def __call__(self, episode: Episode) -> float:
        """The checklist score of ``episode`` (see the class docstring).

        Raises:
            ValueError: the task has no checklists, or a standard is invalid (e.g. a weight that is not a number).
            JudgeUnavailable: the judge gave no verdict for some (step, standard).
        """
        return self.score(episode)[0]

    def score(self, episode: Episode) -> tuple[float, list[float]]:
        """``(score, r_t per checklist turn)`` of ``episode``; raises like ``__call__``."""
        checklists = read_checklists(episode.task)
        max_turns = max(len(c) for c in checklists)
        turn_rewards = [0.0] * max_turns
        if max_turns == 0:
            return 0.0, turn_rewards
        messages = episode.messages
        turns = split_user_turns(messages)
        scored = [t for t in range(min(len(turns), max_turns))
                  if turns[t].completed or (self.score_incomplete_turns and turns[t].steps)]
        if self.stop_on_required:
            for t in scored:
                sat = self._turn(episode, checklists, turns, t)
                turn_rewards[t] = _turn_reward(checklists, t, sat)
                if _unmet(checklists, t, sat) > len(checklists) / 2:
                    break
        else:
            sats = self._turns(episode, checklists, turns, scored)
            for t, sat in zip(scored, sats):
                turn_rewards[t] = _turn_reward(checklists, t, sat)
        return sum(turn_rewards) / len(checklists) / max_turns, turn_rewards

    def continue_after_turn(self, episode: Episode) -> bool:
        """The rollout's turn gate (``EpisodeRunner.run(turn_gate=...)``): does the conversation go on?

        Called when the act role has answered a user turn and another would follow. False when more than half of
        the checklists have a ``required_for_next_turn`` standard of that turn unmet by every step: the reference
        ends the conversation there, and so does the rollout (no compute is spent on turns that would score 0).
        The verdicts land in the cache, so scoring the episode afterwards sends nothing again; pass rates are
        counted once, at scoring. Always True without ``stop_on_required`` or without a required standard.

        Raises:
            JudgeUnavailable: the judge gave no verdict (the runner then fails the episode; its group is masked).
        """
        checklists = read_checklists(episode.task)
        turns = split_user_turns(episode.messages)
        t = len(turns) - 1  # the turn just answered
        if not self.stop_on_required or t < 0 or not any(s.required for c in checklists if t < len(c) for s in c[t]):
            return True
        sat = self._turns(episode, checklists, turns, [t], count=False)[0]
        return _unmet(checklists, t, sat) <= len(checklists) / 2

    def _turn(self, episode: Episode, checklists: list[list[list[_Standard]]], turns: list[UserTurn],
              t: int) -> list[list[bool]]:
        return self._turns(episode, checklists, turns, [t])[0]

    def _turns(self, episode: Episode, checklists: list[list[list[_Standard]]], turns: list[UserTurn],
               scored: Iterable[int], count: bool = True) -> list[list[list[bool]]]:
        """Per scored turn, per checklist, per standard: satisfied by some step (one batched judge call).

        ``count``: add the verdicts to the per-standard pass rates (scoring does; the rollout's gate does not).
        """
        messages, task_id = episode.messages, str(getattr(episode.task, "id", "?"))
        scored = list(scored)
        # sat[n][j][k] for scored turn n; verdicts from the shortcut, the cache or the judge
        sat = [[[False] * (len(c[t]) if t < len(c) else 0) for c in checklists] for t in scored]
        wanted: dict[str, tuple[JudgeRequest, list[tuple[int, int, int]]]] = {}
        for n, t in enumerate(scored):
            turn = turns[t]
            for j, checklist in enumerate(checklists):
                for k, standard in enumerate(checklist[t] if t < len(checklist) else []):
                    for s, index in enumerate(turn.steps):
                        if standard.focus_on in TOOL_FOCUS and _tool_error_after(messages, index, turn.end):
                            self._shortcuts += 1
                            continue
                        prompt = build_prompt(standard, messages, turns, t, s)
                        key = hashlib.sha256(f"{self.judge.identity}\n{prompt}".encode()).hexdigest()
                        if key in self.cache:
                            self._hits += 1
                            self.cache.move_to_end(key)
                            sat[n][j][k] = sat[n][j][k] or self.cache[key]
                        elif key in wanted:
                            self._hits += 1
                            wanted[key][1].append((n, j, k))
                        else:
                            request = JudgeRequest(prompt, task_id, j, t, s, k)
                            wanted[key] = (request, [(n, j, k)])
        if wanted:
            keys = list(wanted)
            answers = self.judge.judge([wanted[key][0] for key in keys])
            self._calls += len(keys)
            failed = [wanted[key][0] for key, answer in zip(keys, answers) if answer is None]
            if failed:
                self._failures += len(failed)
                where = ", ".join(f"turn {r.turn + 1} step {r.step + 1} standard {r.standard + 1}" for r in failed[:3])
                raise JudgeUnavailable(
                    f"task '{task_id}': judge {self.judge.identity} gave no verdict for {len(failed)} of {len(keys)} "
                    f"requests ({where}{', ...' if len(failed) > 3 else ''}): "
                    f"{getattr(self.judge, 'last_error', '') or 'unknown cause'}")
            for key, answer in zip(keys, answers):
                self.cache[key] = bool(answer)
                for n, j, k in wanted[key][1]:
                    sat[n][j][k] = sat[n][j][k] or bool(answer)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        for n, t in enumerate(scored if count else ()):
            for j, row in enumerate(sat[n]):
                for k, ok in enumerate(row):
                    counts = self._passes[f"{t + 1}.{k + 1}" if j == 0 else f"c{j + 1}.{t + 1}.{k + 1}"]
                    counts[0] += int(ok)
                    counts[1] += 1
        return sat


def _unmet(checklists: list[list[list[_Standard]]], t: int, sat: list[list[bool]]) -> int:
    """How many checklists have a ``required_for_next_turn`` standard of turn ``t`` unmet."""
    return sum(any(s.required and not ok for s, ok in zip(c[t], sat[j])) if t < len(c) else False
               for j, c in enumerate(checklists))


def _turn_reward(checklists: list[list[list[_Standard]]], t: int, sat: list[list[bool]]) -> float:
    """``r_t = sum_j sum_k weight_jtk * sat_jtk``."""
    return sum(s.weight for j, c in enumerate(checklists) if t < len(c) for s, ok in zip(c[t], sat[j]) if ok)


# ---------------------------------------------------------------------------------------------------------------------
# Group masking
# ---------------------------------------------------------------------------------------------------------------------


def judging_failed(episode: Episode) -> bool:
    """The episode failed because the checklist judge gave no verdict (its failure cause names ``JudgeUnavailable``)."""
    return episode.stats.failed and JUDGE_UNAVAILABLE in episode.stats.failure


def mask_groups_with_failed_judging(episodes: Sequence[Episode]) -> int:
    """Fail every episode of a GRPO group (``group_index``) in which judging failed for some episode.

    Call after ``envace.rewards.scoring.score_episodes`` and before the advantages: a group whose judge was partly
    unavailable is dropped whole rather than given a baseline from the episodes that happened to be judged. Masked
    episodes are unrewarded as the scorer unrewards failed ones (reward 0, row rewards NaN; ``Episode.samples`` is
    then empty).

    Returns:
        The number of episodes newly failed.
    """
    bad = {e.group_index for e in episodes if judging_failed(e)}
    masked = 0
    for episode in episodes:
        if episode.group_index in bad and not episode.stats.failed:
            episode.stats.fail(f"masked: {JUDGE_UNAVAILABLE} for another episode of group {episode.group_index} "
                               f"(task '{episode.task.id}')")
            unreward(episode)
            masked += 1
    return masked
