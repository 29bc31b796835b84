"""Task success: the weighted checklist of a task's ``SuccessSpec``, scored from the calls made and the answer.

This module owns the matching rules: a required call is satisfied by a made call with the same name whose arguments
include every key argument with an equal value (compared as canonical JSON with integral floats made ints, so ``1``
equals ``1.0`` but ``"1"`` does not); answers are compared after normalisation (strip, lower-case, collapse
whitespace); a database state (``ExpectedState``) by running the episode's writes on a private copy of the task's
initial database (``state_matches``).
"""

from __future__ import annotations

from envace.envs.sqlite_state import final_tables
from envace.roles.compare import canonical_value
from envace.types import Episode, ExpectedAnswer, ExpectedCall, SuccessSpec, Task, ToolCall


def call_matches(expected: ExpectedCall, call: ToolCall) -> bool:
    """``call`` has the expected name and every key argument of ``expected`` with an equal value."""
    if call.name != expected.name:
        return False
    return all(
        key in call.arguments and canonical_value(call.arguments[key]) == canonical_value(value)
        for key, value in expected.arguments.items()
    )


def normalize_answer(text: str) -> str:
    """Strip, lower-case and collapse whitespace."""
    return " ".join(text.split()).lower()


def answer_matches(expected: ExpectedAnswer, answer: str | None, *, normalize: bool = True) -> bool:
    """The final answer satisfies ``expected`` (``equals`` if set, and every ``contains`` string); None fails."""
    if answer is None:
        return False
    norm = normalize_answer if normalize else (lambda text: text)
    if expected.equals is not None and norm(answer) != norm(expected.equals):
        return False
    return all(norm(part) in norm(answer) for part in expected.contains)


def _match_ordered(spec: SuccessSpec, calls: list[ToolCall]) -> tuple[float, set[int]]:
    """Best (weight, count) of required calls matched as a subsequence of ``calls``; returns weight and used calls.

    Dynamic programming over (items, calls), like a weighted longest common subsequence: ``best[i][j]`` is the best
    result using the first ``i`` items and the first ``j`` calls. Each call matches at most one item.
    """
    items = spec.calls
    best = [[(0.0, 0)] * (len(calls) + 1) for _ in range(len(items) + 1)]  # [I+1][C+1] of (weight, count)
    for i, item in enumerate(items, start=1):
        for j, call in enumerate(calls, start=1):
            best[i][j] = max(best[i - 1][j], best[i][j - 1])
            if call_matches(item, call):
                weight, count = best[i - 1][j - 1]
                best[i][j] = max(best[i][j], (weight + item.weight, count + 1))
    used: set[int] = set()
    i, j = len(items), len(calls)
    while i > 0 and j > 0:  # backtrack to the calls that were used
        if best[i][j] == best[i - 1][j]:
            i -= 1
        elif best[i][j] == best[i][j - 1]:
            j -= 1
        else:
            used.add(j - 1)
            i, j = i - 1, j - 1
    return best[-1][-1][0], used


def _match_unordered(spec: SuccessSpec, calls: list[ToolCall]) -> tuple[float, set[int]]:
    """Maximum-weight assignment of required calls to distinct made calls; returns weight and used calls.

    Items are taken by decreasing weight and placed with augmenting paths (Kuhn's algorithm). The matchable item
    sets form a transversal matroid, so this greedy order is optimal.
    """
    owner: dict[int, int] = {}  # call index -> item index
    order = sorted(range(len(spec.calls)), key=lambda k: -spec.calls[k].weight)
    for item in order:
        _augment(item, spec.calls, calls, owner, set())
    weight = sum(spec.calls[item].weight for item in owner.values())
    return weight, set(owner)


def _augment(
    item: int, items: tuple[ExpectedCall, ...], calls: list[ToolCall], owner: dict[int, int], seen: set[int]
) -> bool:
    """Try to give ``item`` a call, re-seating the owners of already taken calls along an augmenting path."""
    for j, call in enumerate(calls):
        if j in seen or not call_matches(items[item], call):
            continue
        seen.add(j)
        if j not in owner or _augment(owner[j], items, calls, owner, seen):
            owner[j] = item
            return True
    return False


def task_score(task: Task, calls: list[ToolCall], final_answer: str | None, *, answer_normalize: bool = True) -> float:
    """Weighted fraction of the task's success checklist satisfied, in [0, 1].

    Args:
        task: the task (its ``success`` spec).
        calls: the schema-valid calls made, in order.
        final_answer: the final plain-text answer, or None.
        answer_normalize: normalise answers before comparing.

    Raises:
        ValueError: the success spec's weights sum to 0 (the loader rejects such tasks).
    """
    spec = task.success
    total = sum(item.weight for item in spec.calls) + (spec.answer.weight if spec.answer else 0.0)
    total += spec.state.weight if spec.state else 0.0
    if total <= 0:
        raise ValueError(f"task '{task.id}': success weights sum to {total}")
    matcher = _match_ordered if spec.ordered else _match_unordered
    satisfied, used = matcher(spec, calls)
    if spec.forbid_extra_calls and len(used) < len(calls):
        return 0.0
    if spec.answer is not None and answer_matches(spec.answer, final_answer, normalize=answer_normalize):
        satisfied += spec.answer.weight
    if spec.state is not None and state_matches(task, calls):
        satisfied += spec.state.weight
    return satisfied / total


def state_matches(task: Task, calls: list[ToolCall]) -> bool:
    """The database ``calls`` leave equals the task's expected one (``ExpectedState``; the loader checks the seed).

    The write calls' statements run in order on a fresh copy of the task's initial database
    (``envace.envs.sqlite_state.final_tables``); rows are compared as canonical JSON, in any order.
    """
    state = task.success.state
    assert state is not None and task.environment is not None
    statements = [call.arguments.get(state.writes[call.name]) for call in calls if call.name in state.writes]
    final = final_tables(task.environment.init_args["seed_sql"], [s for s in statements if isinstance(s, str)])
    expected = {name: sorted(canonical_value(row) for row in rows) for name, rows in state.tables.items()}
    return {name: sorted(canonical_value(row) for row in rows) for name, rows in final.items()} == expected


class TaskSuccess:
    """Reward = weighted fraction of the task's success checklist satisfied by the episode, in [0, 1]."""

    def __init__(self, answer_normalize: bool = True) -> None:
        """Configure the reward.

        Args:
            answer_normalize: compare answers after stripping, lower-casing and collapsing whitespace.
        """
        self.answer_normalize = answer_normalize

    def __call__(self, episode: Episode) -> float:
        """The task score of ``episode`` (see ``task_score``)."""
        return task_score(episode.task, episode.calls, episode.final_answer, answer_normalize=self.answer_normalize)
