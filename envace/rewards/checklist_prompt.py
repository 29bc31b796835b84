"""The checklist's standards as a task carries them, and the judge prompt for one (step, standard).

A standard is a dataclass or a dict with ``question``, ``focus_on``, ``pass_condition``, ``failure_examples``
(list), ``evidence`` (list of ``{"snippet": str}``), ``weight`` (number) and ``required_for_next_turn`` (bool);
``read_checklists`` validates a task's checklists. ``build_prompt`` fills ``PROMPT_TEMPLATE`` with a standard and
the conversation up to the step under evaluation (serialised by ``envace.rewards.transcript``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.rewards.transcript import UserTurn, serialise_messages

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
