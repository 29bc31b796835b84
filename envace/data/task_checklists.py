"""The checklists of a task record: per user turn, the standards a judge checks the conversation against.

This module owns the ``checklists`` field (``parse_checklists``, also used for the authors' reference rows by
``envace.data.reference_format``): its shape (one list of standards per user turn) and each standard's keys, texts,
evidence snippets, weight and ``required_for_next_turn``. Problems are raised as ``_FieldError`` naming the field
(``envace.data.task_schema``). The inverse, ``standard_to_record``, is in ``envace.data.task_records``.
"""

from __future__ import annotations

from typing import Any

from envace.data.task_schema import STANDARD_KEYS, _FieldError, _parse_bool, _parse_weight, _require_object
from envace.roles.parsing import json_type_name
from envace.types import Checklist, Standard


def parse_checklists(value: Any, field: str, turns: int, *, strict_keys: bool = True) -> tuple[Checklist, ...]:
    """Checklists: a list of checklists, each a list of exactly ``turns`` user turns, each a list of standards.

    Args:
        value: the decoded JSON value.
        field: its field name (for errors).
        turns: the number of user turns of the conversation (the first one included).
        strict_keys: refuse unknown keys in a standard (False: ignore them).

    Raises:
        _FieldError: a problem, naming the field (``checklists[0][1][2].weight``).
    """
    if not isinstance(value, list):
        raise _FieldError(field, f"must be a list of checklists, got {json_type_name(value)}")
    checklists = []
    for i, checklist in enumerate(value):
        if not isinstance(checklist, list):
            raise _FieldError(f"{field}[{i}]", f"must be a list of turns (lists of standards), got "
                                               f"{json_type_name(checklist)}")
        if len(checklist) != turns:
            raise _FieldError(f"{field}[{i}]", f"has {len(checklist)} turns, but the conversation has {turns} user "
                                               "turns (one list of standards per user turn)")
        parsed = []
        for t, standards in enumerate(checklist):
            if not isinstance(standards, list):
                raise _FieldError(f"{field}[{i}][{t}]", f"must be a list of standards, got {json_type_name(standards)}")
            parsed.append(tuple(
                _parse_standard(s, f"{field}[{i}][{t}][{k}]", strict_keys) for k, s in enumerate(standards)
            ))
        checklists.append(tuple(parsed))
    return tuple(checklists)


def _parse_standard(value: Any, field: str, strict_keys: bool) -> Standard:
    required = ("question", "focus_on", "pass_condition")
    if strict_keys:
        _require_object(value, field, STANDARD_KEYS, required=required)
    else:
        _require_object(value, field, tuple(value) if isinstance(value, dict) else STANDARD_KEYS, required=required)
    texts = {}
    for key in required:
        if not isinstance(value[key], str):
            raise _FieldError(f"{field}.{key}", f"must be a string, got {json_type_name(value[key])}")
        texts[key] = value[key]
    examples = value.get("failure_examples", [])
    if not isinstance(examples, list):
        raise _FieldError(f"{field}.failure_examples", f"must be a list, got {json_type_name(examples)}")
    evidence = value.get("evidence", [])
    if not isinstance(evidence, list):
        raise _FieldError(f"{field}.evidence", f"must be a list of {{\"snippet\": ...}} objects, got "
                                               f"{json_type_name(evidence)}")
    snippets = []
    for j, item in enumerate(evidence):
        if not isinstance(item, dict) or not isinstance(item.get("snippet"), str):
            raise _FieldError(f"{field}.evidence[{j}]", 'must be an object {"snippet": "<text>"}')
        snippets.append(item["snippet"])
    return Standard(
        **texts,
        failure_examples=tuple(examples),
        evidence=tuple(snippets),
        weight=_parse_weight(value.get("weight", 1.0), f"{field}.weight"),
        required_for_next_turn=_parse_bool(value.get("required_for_next_turn", False),
                                           f"{field}.required_for_next_turn"),
    )
