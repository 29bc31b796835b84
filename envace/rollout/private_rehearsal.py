"""Private rehearsal at test time: imagine before committing (the paper's test-time claim).

Before an act turn that will reach the real environment, the policy spends a **rehearsal budget**: ``rehearsals``
imagined continuations from the current real state, played out against its *own* rehearsed tool responses (the
rehearse role; no real call is ever made for them), each for at most ``horizon`` act turns. The attempts are
condensed into a **rehearsal memory**, a short text shown to the act role in the prompt of the one committed turn
(never kept in the conversation), or a ``Selector`` commits one attempt's first turn directly. Then the committed
turn runs for real, and its real responses are what the act role sees next.

- ``parallel``: the attempts are independent (sampled, batched together);
- ``sequential``: attempt *k* sees the memory of attempts 1..k-1, so it can revise them;
- ``granularity``: ``step`` rehearses before every committed act turn, ``task`` only before the first one.

The budget is counted in attempts and in generated tokens (act and rehearse roles), per episode, and real calls are
counted separately: rehearsal never spends them (``EpisodeStats.private_real_calls`` stays 0, and the rollout checks
it). ``EpisodeRunner``'s rehearsing variant is ``envace.rollout.rehearsing.RehearsingRunner``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from envace.roles.compare import is_error
from envace.types import Episode

Mode = Literal["parallel", "sequential"]
Granularity = Literal["step", "task"]

MEMORY_HEADER = (
    "Private rehearsal notes. Before acting, you imagined the attempts below; the tool responses in them were "
    "predicted by you, not observed, and the user has not seen any of it. Use them to choose your next step."
)


@dataclass(frozen=True)
class PrivateRehearsal:
    """How much to rehearse privately before committing act turns to the real environment.

    Attributes:
        rehearsals: imagined attempts per rehearsal (0: plain acting).
        mode: ``parallel`` (independent attempts) or ``sequential`` (each sees the earlier attempts' memory).
        granularity: ``step`` (before every committed act turn) or ``task`` (before the first one only).
        horizon: most act turns of one imagined attempt (0: until it answers, within the rollout's ``max_turns``).
        temperature: sampling temperature of the attempts (their diversity; the committed turn uses the rollout's).
        max_tokens: most generated tokens an episode may spend on rehearsal (act and rehearse roles); a rehearsal
            that would start past it is skipped. None: no cap.
        memory_role: the chat role of the memory message (``system``, or ``user`` for templates that accept a system
            message only first).
        max_response_chars: longest rehearsed response quoted in the memory (longer ones are cut).
        greedy_first: play each rehearsal's first attempt greedily (temperature 0, the turns plain acting would
            write) and the others at ``temperature``, so the candidates always include the greedy action: a selector
            that commits an attempt then replaces it only when the rehearsed outcomes favour another one.
    """

    rehearsals: int = 0
    mode: Mode = "parallel"
    granularity: Granularity = "step"
    horizon: int = 4
    temperature: float = 1.0
    max_tokens: int | None = None
    memory_role: Literal["system", "user"] = "system"
    max_response_chars: int = 300
    greedy_first: bool = False

    def __post_init__(self) -> None:
        if self.rehearsals < 0 or self.horizon < 0:
            raise ValueError(f"PrivateRehearsal: rehearsals and horizon must be >= 0, got {self.rehearsals} and "
                             f"{self.horizon}")
        if self.mode not in ("parallel", "sequential"):
            raise ValueError(f"PrivateRehearsal.mode: '{self.mode}'; valid: parallel, sequential")
        if self.granularity not in ("step", "task"):
            raise ValueError(f"PrivateRehearsal.granularity: '{self.granularity}'; valid: step, task")
        if self.memory_role not in ("system", "user"):
            raise ValueError(f"PrivateRehearsal.memory_role: '{self.memory_role}'; valid: system, user")
        if self.temperature < 0 or (self.max_tokens is not None and self.max_tokens < 0):
            raise ValueError("PrivateRehearsal: temperature and max_tokens must be >= 0")


@dataclass
class Attempt:
    """One imagined continuation.

    Attributes:
        turns: per imagined act turn, the calls with their rehearsed responses (``[(name, arguments, response)]``)
            or, for a plain-text turn, an empty list.
        answer: the plain-text answer it ended with, if any.
        first_turn: the generated ids of its first act turn (a selector may commit them as they are).
        first_finished: that turn ended with a stop token.
        first_key: the identity of its first turn (its calls, canonically, or its answer).
        tokens: tokens it generated (act and rehearse roles).
        verdict: a selector's judgement of its outcome, if one was made.
        greedy: its act turns were generated at temperature 0 (``PrivateRehearsal.greedy_first``): its first turn
            is the one plain acting would commit.
        first_malformed: its first turn was malformed (a broken tool-call block) or held a call the rollout refused
            (an unknown tool, arguments against the schema).
        errors: how many of its rehearsed tool responses report an error (``response_is_error``).
    """

    turns: list[list[tuple[str, dict[str, Any], str]]]
    answer: str | None
    first_turn: list[int]
    first_key: str
    tokens: int = 0
    verdict: bool | None = None
    first_finished: bool = True
    greedy: bool = False
    first_malformed: bool = False
    errors: int = 0

    def record(self) -> dict[str, Any]:
        """A JSON-ready summary (``Episode.private_attempts``): its calls and rehearsed responses, answer and flags."""
        return {"turns": [[[name, arguments, response] for name, arguments, response in turn] for turn in self.turns],
                "answer": self.answer, "first_key": self.first_key, "greedy": self.greedy,
                "first_finished": self.first_finished, "first_malformed": self.first_malformed,
                "errors": self.errors, "tokens": self.tokens, "verdict": self.verdict}

    @property
    def sound(self) -> bool:
        """Its first turn is complete and well-formed, and nothing it imagined reported an error."""
        return self.first_finished and not self.first_malformed and self.errors == 0


def response_is_error(text: str, prefixes: tuple[str, ...] = ()) -> bool:
    """Whether a (rehearsed) tool response reports an error.

    That is ``envace.roles.compare.is_error`` (an error object, or text starting with ``Error``), or text that starts
    with one of ``prefixes`` (the error prefixes a task's environment declares, e.g. ``"Database error:"``).
    """
    return is_error(text) or (isinstance(text, str) and text.lstrip().startswith(prefixes))


def error_prefixes(task: Any) -> tuple[str, ...]:
    """The error prefixes a task's environment declares (``init_args.error_prefixes``, as MCP servers' tasks do)."""
    spec = getattr(task, "environment", None)
    prefixes = (getattr(spec, "init_args", None) or {}).get("error_prefixes") or ()
    return tuple(p for p in prefixes if isinstance(p, str) and p)


def attempt_of(branch: Episode, start_messages: int, first_turn: list[int], tokens: int) -> Attempt:
    """Read an imagined branch: its act turns after ``start_messages`` with their rehearsed responses."""
    turns: list[list[tuple[str, dict[str, Any], str]]] = []
    messages = branch.messages[start_messages:]
    answer = None
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        calls = [c["function"] for c in message.get("tool_calls") or []]
        responses = [m["content"] for m in messages[i + 1 : i + 1 + len(calls)] if m["role"] == "tool"]
        turns.append([(c["name"], c["arguments"], r) for c, r in zip(calls, responses)])
        if not calls:
            answer = message.get("content") or ""
    first = turns[0] if turns else []
    key = json.dumps([[n, a] for n, a, _ in first], sort_keys=True) if first else f"answer:{answer}"
    prefixes = error_prefixes(branch.task)
    errors = sum(response_is_error(r, prefixes) for turn in turns for _, _, r in turn)
    return Attempt(turns, answer, first_turn, key, tokens, errors=errors)


def memory_text(attempts: list[Attempt], max_response_chars: int = 300) -> str:
    """The rehearsal memory: every attempt's calls, predicted responses and answer, in a few lines."""
    lines = [MEMORY_HEADER]
    for number, attempt in enumerate(attempts, 1):
        steps = []
        for turn in attempt.turns:
            for name, arguments, response in turn:
                text = response if len(response) <= max_response_chars else response[:max_response_chars] + "..."
                steps.append(f"{name}({json.dumps(arguments, sort_keys=True)}) -> {text}")
        if attempt.answer is not None:
            steps.append(f"answer: {attempt.answer}")
        verdict = "" if attempt.verdict is None else (" [judged: done]" if attempt.verdict else " [judged: not done]")
        lines.append(f"Attempt {number}{verdict}: " + ("; ".join(steps) or "(no action)"))
    return "\n".join(lines)


def check_selector(selector: Any, rehearsal: PrivateRehearsal) -> None:
    """Refuse, before any episode runs, a selector that needs the greedy turn without ``greedy_first``.

    Raises:
        ValueError: naming the setting to turn on.
    """
    if getattr(selector, "needs_greedy", False) and not rehearsal.greedy_first and rehearsal.rehearsals > 0:
        raise ValueError(f"{type(selector).__name__} commits the greedy turn unless rehearsal gives a reason not to: "
                         "set PrivateRehearsal(greedy_first=True) (e.g. --model.test_rehearsal.greedy_first=true, or "
                         "greedy_first: true in RehearsalBudgetAblation)")


class Selector(Protocol):
    """Chooses what to commit after a rehearsal: one attempt's first turn, or None (generate with the memory)."""

    def select(self, attempts: list[Attempt]) -> Attempt | None:
        """The attempt whose first turn is committed as it is, or None."""
        ...


class MemoryCommit:
    """Commit nothing directly: the act role writes the committed turn with the memory in its prompt."""

    def select(self, attempts: list[Attempt]) -> Attempt | None:
        """Always None."""
        return None


class MajorityCommit:
    """Commit the most frequent first turn among the attempts (ties: the earliest), as it was generated.

    Args:
        min_share: the majority's least share of the attempts; below it, fall back to generating with the memory.
    """

    def __init__(self, min_share: float = 0.5) -> None:
        if not 0.0 <= min_share <= 1.0:
            raise ValueError(f"MajorityCommit.min_share must be in [0, 1], got {min_share}")
        self.min_share = min_share

    def select(self, attempts: list[Attempt]) -> Attempt | None:
        """The first attempt of the most common first turn, if it holds ``min_share`` of the attempts."""
        if not attempts:
            return None
        counts = Counter(a.first_key for a in attempts)
        key, count = max(counts.items(), key=lambda kv: (kv[1], -_first_index(attempts, kv[0])))
        if count / len(attempts) < self.min_share:
            return None
        return next(a for a in attempts if a.first_key == key)


class OutcomeMajorityCommit:
    """Commit the first turn of an attempt that reached the most common rehearsed outcome (its final answer).

    The world model decides: each attempt plays on to an answer against rehearsed responses; the answer most
    attempts reach is the predicted outcome, and the first turn of the earliest attempt that reached it is committed
    as it was generated. Without any answered attempt it falls back to ``MajorityCommit`` over first turns.
    """

    def select(self, attempts: list[Attempt]) -> Attempt | None:
        """The earliest attempt with the majority answer, else the first-turn majority."""
        answered = [a for a in attempts if a.answer is not None and a.answer.strip()]
        if not answered:
            return MajorityCommit(0.0).select(attempts)
        counts = Counter(_normalise(a.answer or "") for a in answered)
        best = max(counts.values())
        return next(a for a in answered if counts[_normalise(a.answer or "")] == best)


def _normalise(answer: str) -> str:
    return " ".join(answer.lower().split())


class JudgedCommit:
    """Commit the first turn of an attempt the policy itself judged successful (the majority among those).

    The judgement (``Attempt.verdict``) is made by the rehearsing runner: the policy reads the attempt and answers
    whether it accomplished the request. Without a successful attempt, it generates with the memory.
    """

    def select(self, attempts: list[Attempt]) -> Attempt | None:
        """The majority first turn among the attempts judged done, or None."""
        return MajorityCommit(0.0).select([a for a in attempts if a.verdict])


class GuardedCommit:
    """Do no harm: commit the turn plain acting would commit unless rehearsal gives a specific reason not to.

    Needs ``PrivateRehearsal(greedy_first=True)``: each rehearsal's first attempt is the greedy turn, the one budget 0
    commits. That turn is committed (as it was generated, so the episode goes on exactly as at budget 0) unless its
    attempt is not ``sound`` (malformed, cut off, or an imagined error) while other attempts are: then the most common
    first turn among the sound ones is committed (the earliest on ties). A malformed or cut-off turn is never taken
    from a sampled attempt, and without a sound alternative the rule abstains and commits the greedy turn. So the
    rule departs from plain acting only where the world model predicts the greedy action fails and another does not.

    Args:
        min_share: the least share of the sound alternatives their most common first turn must hold to replace the
            greedy one (0: any; 1: they must all agree).
    """

    needs_greedy = True
    """It needs the greedy turn among the attempts (``check_selector``)."""

    def __init__(self, min_share: float = 0.0) -> None:
        if not 0.0 <= min_share <= 1.0:
            raise ValueError(f"GuardedCommit.min_share must be in [0, 1], got {min_share}")
        self.min_share = min_share

    def select(self, attempts: list[Attempt]) -> Attempt | None:
        """The greedy attempt, or the majority first turn of the sound alternatives where it is not sound.

        Raises:
            ValueError: the first attempt is not greedy (``greedy_first`` is off): there is no plain turn to keep.
        """
        if not attempts:
            return None
        greedy = attempts[0]
        if not greedy.greedy:
            raise ValueError("GuardedCommit needs the greedy turn among the attempts: set "
                             "PrivateRehearsal(greedy_first=True) (--model.test_rehearsal.greedy_first=true)")
        if greedy.sound:
            return greedy
        alternatives = [a for a in attempts[1:] if a.sound and a.first_key != greedy.first_key]
        choice = MajorityCommit(self.min_share).select(alternatives)
        return choice if choice is not None else greedy


def _first_index(attempts: list[Attempt], key: str) -> int:
    return next(i for i, a in enumerate(attempts) if a.first_key == key)
