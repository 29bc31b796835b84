"""The judge's verdict on one (step, standard): its fields, its JSON schema, and parsing a reply into it.

A verdict is a strict JSON object: the four string fields of ``VERDICT_FIELDS`` and the boolean ``answer``
(``parse_verdict``). ``VERDICT_SCHEMA`` is the same object as the ``response_format`` of an OpenAI-compatible server.
Used by the judges (``envace.rewards.judges``) and the checklist reward (``envace.rewards.checklist``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from envace.roles.parsing import loads_json

VERDICT_FIELDS = (
    "high_level_understanding_of_the_question",
    "analysis_of_if_focus_on",
    "analysis_of_pass_condition",
    "analysis_of_failure_examples",
)
"""The string fields of a verdict, in the order the judge is asked to fill them; ``answer`` (bool) follows."""

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
