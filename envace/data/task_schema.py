"""The task record's schema vocabulary: its keys, its errors and the checks of one JSON value.

This module owns the allowed keys of each part of a task record (``TOP_KEYS``, ``STANDARD_KEYS``, ...), the error a
bad task file or record raises (``TaskFormatError``, one line naming file, line and field), the internal
``_FieldError`` that the parsers raise and ``parse_task`` prefixes with the location, and the checks of one value
that every part's parser uses (an object with allowed keys, an optional string, a weight, a boolean).
See ``docs/task-format.md``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from envace.errors import UserError
from envace.roles.parsing import json_type_name

TOP_KEYS = (
    "id", "messages", "tools", "success", "reference", "world_context", "environment", "user_turns", "tool_unlocks",
    "user", "checklists", "metadata",
)
STANDARD_KEYS = (
    "question", "focus_on", "pass_condition", "failure_examples", "evidence", "weight", "required_for_next_turn",
)
SUCCESS_KEYS = ("calls", "ordered", "answer", "forbid_extra_calls", "state")
STATE_KEYS = ("tables", "writes", "weight")
CALL_KEYS = ("name", "arguments", "weight")
ANSWER_KEYS = ("equals", "contains", "weight")
ENV_KEYS = ("class_path", "init_args")
ROLES = ("system", "user", "assistant", "tool")


class TaskFormatError(UserError, ValueError):
    """A task file or record is invalid. The message is one line naming file, line and field."""


class _FieldError(Exception):
    """Internal: a problem at ``field``; ``parse_task`` prefixes the location."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _require_object(value: Any, field: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    """``value`` is a JSON object with only ``allowed`` keys and every ``required`` key."""
    if not isinstance(value, dict):
        raise _FieldError(field, f"must be a JSON object, got {json_type_name(value)}")
    prefix = "" if field == "<record>" else field + "."
    for key in value:
        if key not in allowed:
            raise _FieldError(prefix + str(key), f"unknown key (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise _FieldError(prefix + key, "is required")



def _optional_str(value: Any, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _FieldError(field, f"must be a string or null, got {json_type_name(value)}")
    return value


def _parse_weight(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise _FieldError(field, f"must be a finite number >= 0, got {json.dumps(value)}")
    return float(value)


def _parse_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _FieldError(field, f"must be true or false, got {json.dumps(value)}")
    return value
