"""Judges: give a verdict (``True``/``False``, or None when none could be had) per (step, standard) request.

Any judge-scored reward can use them (``envace.rewards.checklist.ChecklistReward`` does):

- ``ScriptedJudge``: answers from a function or a table (tests);
- ``LocalJudge``: a local Hugging Face model through ``envace.engines.chat_model.ChatModel``;
- ``HTTPJudge``: an OpenAI-compatible ``/v1/chat/completions`` server run by the user (standard library only).

A judge that cannot give a verdict (unreachable server, HTTP errors, malformed replies after all retries) answers
None, never ``False``; a reward that needs the verdict then raises ``JudgeUnavailable``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from envace.rewards.verdicts import VERDICT_SCHEMA, Verdict, parse_verdict
from envace.roles.parsing import loads_json
from envace.types import error_text

if TYPE_CHECKING:
    from envace.engines.chat_model import ChatModel

log = logging.getLogger(__name__)

JUDGE_UNAVAILABLE = "JudgeUnavailable"
"""Marker in an episode's failure cause (``EpisodeStats.failure``) when judging failed (see
``envace.rewards.checklist.judging_failed``)."""


class JudgeUnavailable(RuntimeError):
    """The judge gave no verdict for some (step, standard) of an episode: the episode must not be scored."""


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
