"""Task success with the final answer checked against what the episode's own tool responses reported.

In a rehearsed world the act role answers from rehearsed responses. When the rehearse role gets a number wrong, the
task's expected answer (the real value) marks a faithful report of that number as a failure, and the act role's
answer reward becomes noise from the world model's mistakes. ``ObservedAnswerSuccess`` removes that noise: it locates
each part of the expected answer in the task's recorded reference responses (which call, which JSON path), reads
the same place in the responses the episode observed, and checks the answer against those values. With real
responses this is the task's own answer; everything else (the checklist of calls and arguments) is ``TaskSuccess``.

It is a training reward: reported success (``Episode.success``) always uses the task's own expected answer.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from envace.data.task_reference import reference_steps
from envace.rewards.task_success import normalize_answer, task_score
from envace.types import Episode, Rehearsal, Task

Path = tuple[str | int, ...]


def _leaves(value: Any, path: Path = ()) -> list[tuple[Path, Any]]:
    """Every scalar leaf of a JSON value with its path, in document order."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))]
    if isinstance(value, list):
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, (*path, index))]
    return [(path, value)]


def _text(value: Any) -> str:
    """How a scalar leaf reads in an answer: strings as they are, integral floats as ints, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def _json(content: str) -> Any:
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return None


def answer_provenance(task: Task) -> list[tuple[str, Path]] | None:
    """Where each word of the task's expected answer comes from: ``(reference call key, JSON path)`` per word.

    A word's source is the last scalar leaf of the recorded reference responses that reads the same (normalised):
    answers report the latest state. None when the task has no ``equals`` answer or no reference, or when a word is
    not a response value (then the task's own answer is the only one to check against).
    """
    answer = task.success.answer
    if answer is None or answer.equals is None or not task.reference:
        return None
    sources: list[tuple[str, Path, str]] = []
    for call, content, _ in reference_steps(task):
        value = _json(content)
        sources += [(call.key(), path, normalize_answer(_text(leaf))) for path, leaf in _leaves(value)]
    provenance = []
    for word in normalize_answer(answer.equals).split():
        found = [(key, path) for key, path, text in sources if text == word]
        if not found:
            return None
        provenance.append(found[-1])
    return provenance


def _has(value: Any, step: str | int) -> bool:
    if isinstance(value, dict):
        return isinstance(step, str) and step in value
    return isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value)


def _read(value: Any, path: Path) -> Any:
    """The scalar at ``path`` in ``value``, or None (no such path, or not a scalar there)."""
    for step in path:
        if not _has(value, step):
            return None
        value = value[step]
    return None if isinstance(value, dict | list) else value


def observed_answer(provenance: list[tuple[str, Path]], rehearsals: list[Rehearsal]) -> str | None:
    """The expected answer re-read from the responses an episode observed (the last response of each call).

    None when a source call was not made or its response lacks the value (e.g. it was an error).
    """
    seen = {r.call.key(): _json(r.content) for r in rehearsals}
    words = []
    for key, path in provenance:
        value = _read(seen.get(key), path)
        if value is None:
            return None
        words.append(_text(value))
    return " ".join(words)


class ObservedAnswerSuccess:
    """Reward = ``TaskSuccess``'s weighted checklist, with the answer expected to report the observed responses.

    Where the expected answer cannot be traced to the reference responses, or the episode did not observe them, the
    task's own expected answer is used.

    Args:
        answer_normalize: compare answers after stripping, lower-casing and collapsing whitespace.
    """

    def __init__(self, answer_normalize: bool = True) -> None:
        self.answer_normalize = answer_normalize

    def __call__(self, episode: Episode) -> float:
        """The task score of ``episode`` against the answer its own observations imply."""
        task = episode.task
        provenance = answer_provenance(task)  # a few small JSON parses: cheaper than any cache key over the task
        expected = observed_answer(provenance, episode.rehearsals) if provenance is not None else None
        if expected is not None:
            answer = replace(task.success.answer, equals=expected)
            task = replace(task, success=replace(task.success, answer=answer))
        return task_score(task, episode.calls, episode.final_answer, answer_normalize=self.answer_normalize)
