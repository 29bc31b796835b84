"""How a rehearsed tool response compares with the real one: canonical forms, leaf F1, the per-probe scores.

Written once and used by every measure of the rehearse role: the fidelity metrics and probes
(``envace.world_model.fidelity``), the live probes of a hybrid world (``envace.worlds.hybrid``), the audits, and the
rehearse reward's prediction-error shaping (``envace.rewards.shaping``); the task-success checks compare call
arguments with ``canonical_value``.

- ``canonical_value``: canonical JSON of a value, integral floats as ints (argument equality);
- ``json_leaves`` / ``leaf_f1``: a JSON value flattened into ``(path, canonical leaf)`` pairs, and the F1 of two
  such sets (identical values score 1.0);
- ``canonical`` (κ) / ``canonical_text``: a response text's canonical form, floats rounded to ``SIGNIFICANT_DIGITS``;
- ``ProbeScore`` and ``score_response`` / ``score_reply``: exact match, leaf F1, key match, parse rate and error
  agreement of one rehearsal against the real response.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from envace.roles.parsing import json_type_name
from envace.types import canonical_json, is_error_value

SIGNIFICANT_DIGITS = 4
"""Floats are compared rounded to this many significant digits."""

Path = tuple[str | int, ...]


class Reply(Protocol):
    """A rehearse world's reply as ``score_reply`` reads it (``envace.worlds.ToolReply``)."""

    content: str
    parse_error: Any


def _integral_floats_to_int(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_to_int(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_integral_floats_to_int(v) for v in value]
    return value


def canonical_value(value: Any) -> str:
    """Canonical JSON of ``value`` with integral floats written as ints (``1.0`` and ``1`` give ``"1"``)."""
    return canonical_json(_integral_floats_to_int(value))


def json_leaves(value: Any, path: Path = ()) -> set[tuple[Path, str]]:
    """The ``(path, canonical leaf value)`` pairs of a JSON value (empty containers are leaves)."""
    if isinstance(value, dict) and value:
        return {leaf for key, item in value.items() for leaf in json_leaves(item, (*path, key))}
    if isinstance(value, list) and value:
        return {leaf for index, item in enumerate(value) for leaf in json_leaves(item, (*path, index))}
    return {(path, canonical_value(value))}


def leaf_f1(predicted: Any, reference: Any) -> float:
    """F1 between the leaf sets of two JSON values; identical values give 1.0, values sharing no leaf give 0.0.

    Leaf sets are never empty (a scalar or an empty container is one leaf), so the F1 is always defined.

    Args:
        predicted: the rehearsed value.
        reference: the real value.
    """
    pred, ref = json_leaves(predicted), json_leaves(reference)
    common = len(pred & ref)
    return 2 * common / (len(pred) + len(ref))


# ---------------------------------------------------------------------------------------------------------------------
# Canonicalisation
# ---------------------------------------------------------------------------------------------------------------------


def _parse(text: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` is JSON, else ``(False, text.strip())``."""
    try:
        return True, json.loads(text)
    except json.JSONDecodeError:
        return False, text.strip()


def _round_float(value: float) -> float | int:
    """``value`` rounded to ``SIGNIFICANT_DIGITS`` significant digits; a whole result becomes an int."""
    if value.is_integer():
        return int(value)  # exact: never round a whole number (12345.0 stays 12345)
    rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    return int(rounded) if rounded.is_integer() else rounded


def _canonical_value(value: Any) -> Any:
    """κ of a decoded JSON value: keys sorted, floats rounded, whole floats as ints."""
    if isinstance(value, float):
        return _round_float(value)
    if isinstance(value, dict):
        return {key: _canonical_value(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_canonical_value(item) for item in value]
    return value


def canonical(text: str) -> Any:
    """κ: the canonical form of a tool response text.

    The decoded JSON value when ``text`` is JSON (keys sorted, floats rounded to ``SIGNIFICANT_DIGITS`` significant
    digits, whole floats as ints), else the stripped string. Compare canonical forms with ``canonical_text``.

    Args:
        text: a tool response (JSON or free text).
    """
    return _canonical_value(_parse(text)[1])


def canonical_text(text: str) -> str:
    """The canonical JSON text of ``canonical(text)``: two responses are an exact match when these are equal."""
    return canonical_json(canonical(text))


# ---------------------------------------------------------------------------------------------------------------------
# Per-probe scores
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeScore:
    """The fidelity scores of one rehearsed response against the real one (each in [0, 1]).

    Attributes:
        exact_match: 1 when the canonical forms are equal.
        leaf_f1: F1 of the ``(path, value)`` leaf sets of the canonical forms; token F1 over whitespace tokens when
            both are strings (free text).
        key_match: 1 when both are objects with the same top-level keys, or neither is an object and both have the
            same JSON type.
        parse_ok: 1 when the prediction parses as JSON or the real response does not.
        error_agree: 1 when both or neither are errors (``is_error``).
    """

    exact_match: float
    leaf_f1: float
    key_match: float
    parse_ok: float
    error_agree: float


def is_error(text: str) -> bool:
    """Whether a tool response reports an error.

    An error is a JSON object whose ``"error"`` value is truthy (``envace.types.is_error_value``: a tool that raised,
    or one that returned an error object), or a string (free text, a JSON string, or the ``{"result": text}``
    wrapper a rehearsal of free text takes) starting with ``"Error"``.

    Args:
        text: a tool response.
    """
    value = canonical(text)
    if isinstance(value, dict) and list(value) == ["result"]:
        value = value["result"]
    if isinstance(value, dict):
        return is_error_value(value)
    return isinstance(value, str) and value.startswith("Error")


def token_f1(predicted: str, reference: str) -> float:
    """F1 of the multisets of whitespace tokens: ``2 * |common| / (|predicted| + |reference|)``; two blanks give 1.

    Args:
        predicted: the rehearsed text.
        reference: the real text.
    """
    pred, ref = Counter(predicted.split()), Counter(reference.split())
    total = sum(pred.values()) + sum(ref.values())
    if total == 0:
        return 1.0
    return 2 * sum((pred & ref).values()) / total


def _key_match(predicted: Any, real: Any) -> bool:
    if isinstance(predicted, dict) and isinstance(real, dict):
        return set(predicted) == set(real)
    return json_type_name(predicted) == json_type_name(real)


def score_response(predicted: str, real: str) -> ProbeScore:
    """Score one rehearsed response against the real one (see ``ProbeScore``).

    Args:
        predicted: the rehearsed response text.
        real: the real (recorded) response text.
    """
    pred, ref = canonical(predicted), canonical(real)
    f1 = token_f1(pred, ref) if isinstance(pred, str) and isinstance(ref, str) else leaf_f1(pred, ref)
    parse_ok = _parse(predicted)[0] or not _parse(real)[0]
    return ProbeScore(
        exact_match=float(canonical_json(pred) == canonical_json(ref)),
        leaf_f1=f1,
        key_match=float(_key_match(pred, ref)),
        parse_ok=float(parse_ok),
        error_agree=float(is_error(predicted) == is_error(real)),
    )


def broken_contract_score(error_content: str, real: str) -> ProbeScore:
    """The score of a rehearsal that broke the output contract: 0 everywhere but error agreement.

    Args:
        error_content: the error message substituted for the broken rehearsal.
        real: the real response text.
    """
    return ProbeScore(0.0, 0.0, 0.0, 0.0, float(is_error(error_content) == is_error(real)))


def rehearsal_target(real: str) -> str:
    """The form a faithful rehearsal of ``real`` takes: the JSON re-dumped, free text wrapped as ``{"result": ...}``.

    The same target the world-model alignment rows train towards (``envace.world_model.alignment``).

    Args:
        real: the recorded real response text.
    """
    ok, value = _parse(real)
    return json.dumps(value if ok else {"result": real}, ensure_ascii=False)


def score_reply(reply: Reply, real: str) -> ProbeScore:
    """Score a rehearse world's reply against the real response ``real`` (see ``rehearse_probes``).

    Args:
        reply: the rehearsed reply.
        real: the real response text.
    """
    target = rehearsal_target(real)
    if reply.parse_error:
        return broken_contract_score(reply.content, target)
    return score_response(reply.content, target)
