"""FinMCP-Bench: its record format and its tool-call metrics.

A record (``docs/benchmarks.md``, FinMCP-Bench) holds a gold dialogue (``messages``) and its tool grouping
``tool_list``: a list of steps, each the list of tools called in parallel at that step. A prediction is a grouping of
the same shape. Per record, with P and G the multisets of predicted and gold tool names:

- tool precision ``TP = |P ∩ G| / |P|``, tool recall ``TR = |P ∩ G| / |G|``, ``TF1`` their harmonic mean (an
  undefined ratio is 0, and two empty multisets score 1 on all three);
- ``EMR``: the predicted grouping equals the gold one, step by step, order inside a step ignored (the paper's exact
  match rate);
- ``consist``: the flattened name lists are equal in order (the released ``evaluation.py``'s stricter check).

``score_finmcp`` averages them over records (macro) and also computes micro P/R/F1 from the summed counts, overall
and per task type and difficulty level. The data itself is not shipped by any package (and is licensed
CC-BY-NC-SA-4.0): ``load_finmcp`` reads a copy the user supplies.

Evaluating a policy on the records (the paper's teacher-forced protocol, ``evaluate_finmcp``) lives in
``envace.benchmarks.finmcp_eval``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.data.jsonl import json_lines

Grouping = Sequence[Sequence[str]]
"""Tool names per step; the names of one step were called in parallel."""


@dataclass(frozen=True)
class FinMCPRecord:
    """One FinMCP-Bench sample.

    Attributes:
        id: the record id (as a string).
        tool_list: the gold grouping.
        messages: the gold dialogue (OpenAI format, tool calls included).
        task: ``single step``, ``multi step`` or ``multi turn``.
        level: difficulty (``easy``, ``medium``, ``hard``).
        scenario: the record's ``scenery`` path.
        tools: the record's own tool schemas (OpenAI function format) when it has a ``tools`` field; the released
            files have none.
    """

    id: str
    tool_list: tuple[tuple[str, ...], ...]
    messages: tuple[dict[str, Any], ...] = ()
    task: str = ""
    level: str = ""
    scenario: str = ""
    tools: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ToolScores:
    """The metrics of one record (see the module docstring) and the counts micro averages are built from."""

    precision: float
    recall: float
    f1: float
    exact_match: float
    consist: float
    matched: int
    predicted: int
    gold: int


@dataclass
class FinMCPScores:
    """Averages over records.

    Attributes:
        macro: mean ``precision``, ``recall``, ``f1``, ``exact_match`` (EMR) and ``consist`` over records.
        micro: ``precision``, ``recall`` and ``f1`` from the counts summed over records.
        records: how many records were scored.
        groups: the same ``{"macro": ..., "micro": ..., "records": n}`` per ``task:<type>`` and ``level:<level>``.
    """

    macro: dict[str, float]
    micro: dict[str, float]
    records: int
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def tool_scores(predicted: Grouping, gold: Grouping) -> ToolScores:
    """Score one predicted grouping against the gold one.

    Args:
        predicted: the tools the model called, per step.
        gold: the record's ``tool_list``.
    """
    pred_names = [name for step in predicted for name in step]
    gold_names = [name for step in gold for name in step]
    matched = sum((Counter(pred_names) & Counter(gold_names)).values())
    exact = [sorted(step) for step in predicted] == [sorted(step) for step in gold]
    if not pred_names and not gold_names:
        precision = recall = f1 = 1.0
    else:
        precision, recall = _ratio(matched, len(pred_names)), _ratio(matched, len(gold_names))
        f1 = _f1(precision, recall)
    return ToolScores(precision, recall, f1, float(exact), float(pred_names == gold_names), matched,
                      len(pred_names), len(gold_names))


def _average(scores: list[ToolScores]) -> dict[str, Any]:
    n = len(scores)
    macro = {key: sum(getattr(s, key) for s in scores) / n
             for key in ("precision", "recall", "f1", "exact_match", "consist")}
    matched, predicted, gold = (sum(getattr(s, key) for s in scores) for key in ("matched", "predicted", "gold"))
    precision, recall = _ratio(matched, predicted), _ratio(matched, gold)
    return {"macro": macro, "micro": {"precision": precision, "recall": recall, "f1": _f1(precision, recall)},
            "records": n}


def score_finmcp(records: Sequence[FinMCPRecord], predictions: dict[str, Grouping]) -> FinMCPScores:
    """Score ``predictions`` (record id -> predicted grouping) on ``records``.

    Raises:
        ValueError: no records, or a record without a prediction (an empty grouping is a prediction: say so).
    """
    if not records:
        raise ValueError("score_finmcp: no records")
    missing = [r.id for r in records if r.id not in predictions]
    if missing:
        raise ValueError(f"score_finmcp: no prediction for record(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    scored = [(r, tool_scores(predictions[r.id], r.tool_list)) for r in records]
    overall = _average([s for _, s in scored])
    groups: dict[str, list[ToolScores]] = defaultdict(list)
    for record, score in scored:
        if record.task:
            groups[f"task:{record.task}"].append(score)
        if record.level:
            groups[f"level:{record.level}"].append(score)
    return FinMCPScores(overall["macro"], overall["micro"], overall["records"],
                        {name: _average(group) for name, group in sorted(groups.items())})


# ---------------------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------------------


def _grouping(value: Any, where: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list) or not all(
        isinstance(step, list) and all(isinstance(n, str) for n in step) for step in value
    ):
        raise ValueError(f"{where}: 'tool_list' must be a list of steps, each a list of tool names")
    return tuple(tuple(step) for step in value)


def parse_record(raw: Any, where: str) -> FinMCPRecord:
    """One record from its JSON object.

    Args:
        raw: the decoded JSON object.
        where: where it came from, for errors (``file:line`` or ``file[index]``).

    Raises:
        ValueError: a missing or malformed field, named with ``where``.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a record must be a JSON object")
    for key in ("id", "tool_list"):
        if key not in raw:
            raise ValueError(f"{where}: missing field '{key}'")
    messages = raw.get("messages", [])
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"{where}: 'messages' must be a list of messages with a 'role'")
    level = raw.get("diff_level", {})
    return FinMCPRecord(
        id=str(raw["id"]),
        tool_list=_grouping(raw["tool_list"], where),
        messages=tuple(messages),
        task=str(raw.get("task", "")),
        level=str(level.get("level", "")) if isinstance(level, dict) else "",
        scenario=str(raw.get("scenery", "")),
        tools=_record_tools(raw.get("tools"), where),
    )


def load_finmcp(path: str | Path) -> list[FinMCPRecord]:
    """Records from a FinMCP-Bench file: a JSON array (the released files) or JSON Lines.

    Raises:
        ValueError: unreadable JSON or a malformed record, with the file and the line or index; duplicate ids.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            raws = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        records = [parse_record(raw, f"{path}[{i}]") for i, raw in enumerate(raws)]
    else:
        records = [parse_record(raw, where) for where, raw in json_lines(text, path)]
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise ValueError(f"{path}: duplicate record id '{record.id}'")
        seen.add(record.id)
    return records


def predicted_grouping(messages: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The grouping of a dialogue's assistant tool calls: one step per assistant message with calls."""
    return [[call["function"]["name"] for call in m["tool_calls"]]
            for m in messages if m.get("role") == "assistant" and m.get("tool_calls")]


# ---------------------------------------------------------------------------------------------------------------------
# Tool schemas (a record's own ``tools`` field; ``finmcp_eval`` also reads files of them)
# ---------------------------------------------------------------------------------------------------------------------


def tool_schema(value: Any, where: str) -> dict[str, Any]:
    """One tool schema in OpenAI function format, read from that format, a bare function or an MCP tool entry.

    Args:
        value: ``{"type": "function", "function": {...}}``, ``{"name", "description", "parameters"}`` or MCP's
            ``{"name", "description", "inputSchema"}``.
        where: where it came from, for errors.

    Raises:
        ValueError: not an object, no name, or parameters that are not an object schema; named with ``where``.
    """
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a tool schema must be a JSON object")
    function = value["function"] if isinstance(value.get("function"), dict) else value
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: a tool schema needs a non-empty string 'name'")
    parameters = function.get("parameters", function.get("inputSchema"))
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValueError(f"{where}: tool '{name}': 'parameters' must be a JSON schema of type 'object'")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{where}: tool '{name}': 'description' must be a string")
    spec: dict[str, Any] = {"name": name}
    if description is not None:
        spec["description"] = description
    spec["parameters"] = parameters
    return {"type": "function", "function": spec}


def schema_list(values: Any, where: str) -> list[dict[str, Any]]:
    """Tool schemas from a JSON list, each error naming ``where[index]``; duplicate names are refused."""
    if not isinstance(values, list):
        raise ValueError(f"{where}: expected a JSON list of tool schemas")
    schemas: list[dict[str, Any]] = []
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        schema = tool_schema(value, f"{where}[{i}]")
        name = schema["function"]["name"]
        if name in first:
            raise ValueError(f"{where}[{i}]: duplicate tool '{name}' (first at index {first[name]})")
        first[name] = i
        schemas.append(schema)
    return schemas


def _record_tools(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    """A record's own ``tools`` field (absent: empty), validated like a tools file."""
    if value is None:
        return ()
    return tuple(schema_list(value, f"{where}: 'tools'"))
