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

Evaluating a policy (``evaluate_finmcp``) follows the paper's teacher-forced protocol. ``teacher_forced_steps`` cuts a
record's gold dialogue at each assistant message; the policy sees the **gold** history before it (system and user
messages, the gold assistant messages with their tool calls, the recorded real tool responses) and generates one
assistant message, token-in/token-out through an envace engine. The tools it calls there are that step's prediction;
the record's predicted grouping is the list of its non-empty predicted steps, so calls made where the gold dialogue
gives its final answer count as extra predictions (they lower precision). ``score_finmcp`` then scores the groupings.

Tool schemas: the records carry none (the real MCP schemas come from the provider). In order of preference the
prompts show the schemas the caller passes (e.g. from ``load_tool_schemas``), the record's own ``tools`` field when
it has one, else schemas inferred from the gold calls of all evaluated records (``infer_tool_schemas``). The inferred
ones are a fallback that gives the model less than the real benchmark does: no descriptions, no required arguments,
no enums, argument types guessed from the recorded values, and only the tools the evaluated records happen to call.
The result names the source used.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON: {exc.msg}") from exc
            records.append(parse_record(raw, f"{path}:{number}"))
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
# Tool schemas
# ---------------------------------------------------------------------------------------------------------------------

RAW_ARGUMENTS = "_raw"
"""The key under which a gold call's malformed argument string is kept verbatim."""
_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", list: "array", dict: "object"}


def _tool_schema(value: Any, where: str) -> dict[str, Any]:
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


def _schema_list(values: Any, where: str) -> list[dict[str, Any]]:
    """Tool schemas from a JSON list, each error naming ``where[index]``; duplicate names are refused."""
    if not isinstance(values, list):
        raise ValueError(f"{where}: expected a JSON list of tool schemas")
    schemas: list[dict[str, Any]] = []
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        schema = _tool_schema(value, f"{where}[{i}]")
        name = schema["function"]["name"]
        if name in first:
            raise ValueError(f"{where}[{i}]: duplicate tool '{name}' (first at index {first[name]})")
        first[name] = i
        schemas.append(schema)
    return schemas


def load_tool_schemas(path: str | Path) -> dict[str, dict[str, Any]]:
    """Tool schemas from a JSON file: a list of tool schemas (or MCP's ``{"tools": [...]}`` listing).

    Each entry is an OpenAI tool schema, a bare function schema or an MCP tool (``inputSchema``); all come back in
    OpenAI function format.

    Returns:
        Tool name -> schema, in file order.

    Raises:
        ValueError: unreadable JSON, or a malformed or duplicate schema, named with the file and its index.
    """
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
    if isinstance(value, dict) and isinstance(value.get("tools"), list):
        value = value["tools"]
    return {s["function"]["name"]: s for s in _schema_list(value, str(path))}


def _record_tools(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    """A record's own ``tools`` field (absent: empty), validated like a tools file."""
    if value is None:
        return ()
    return tuple(_schema_list(value, f"{where}: 'tools'"))


def _caller_tools(tools: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The caller's name -> schema mapping as a validated schema list.

    Raises:
        ValueError: a malformed schema, or one filed under another tool's name.
    """
    schemas = []
    for name, value in tools.items():
        schema = _tool_schema(value, f"tools[{name!r}]")
        if schema["function"]["name"] != name:
            raise ValueError(f"tools[{name!r}]: the schema is named '{schema['function']['name']}'")
        schemas.append(schema)
    return schemas


def _json_type(value: Any) -> str:
    """The JSON schema type of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return _JSON_TYPES.get(type(value), "string")


def _property_schema(types: set[str]) -> dict[str, Any]:
    """``{"type": ...}`` for the types one argument took (integers merge into numbers)."""
    if "number" in types:
        types = types - {"integer"}
    ordered = sorted(types)
    return {"type": ordered[0] if len(ordered) == 1 else ordered}


def infer_tool_schemas(records: Sequence[FinMCPRecord]) -> dict[str, dict[str, Any]]:
    """Tool schemas inferred from the records' gold calls: the fallback when no real schema is available.

    Each tool gets an object schema whose properties are the argument keys seen in its gold calls, typed from the
    recorded JSON values, with no ``required`` list and no descriptions. Malformed argument strings (kept as
    ``{"_raw": text}``) add no property. This gives the model less than the real benchmark does; see the module
    docstring.

    Returns:
        Tool name -> schema (OpenAI function format), in order of first use.
    """
    seen: dict[str, dict[str, set[str]]] = {}
    for record in records:
        for message in normalised_messages(record):
            for call in message.get("tool_calls", ()):
                function = call["function"]
                properties = seen.setdefault(function["name"], {})
                if set(function["arguments"]) == {RAW_ARGUMENTS}:
                    continue  # a malformed argument string, kept verbatim
                for key, value in function["arguments"].items():
                    properties.setdefault(key, set()).add(_json_type(value))
    return {name: {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {key: _property_schema(types) for key, types in properties.items()}}}}
        for name, properties in seen.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Teacher-forced steps
# ---------------------------------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """Message content as text: None is empty, non-string content is its JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _arguments(value: Any) -> dict[str, Any]:
    """Gold call arguments as a dict.

    FinMCP stores arguments as a JSON string. A blank or missing one is ``{}``; one that is not a JSON object is
    kept verbatim as ``{"_raw": text}`` rather than failing the record: the gold history still shows the model what
    was recorded, and the step's gold tool name (all the metrics use) is unaffected.
    """
    if isinstance(value, dict):
        return value
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError:
        decoded = None
    return decoded if isinstance(decoded, dict) else {RAW_ARGUMENTS: text}


def _gold_call(call: Any, where: str) -> dict[str, Any]:
    """One gold tool call in envace's form: ``{"type": "function", "function": {"name", "arguments": dict}}``.

    Raises:
        ValueError: the call has no function name; named with ``where``.
    """
    function = call.get("function", call) if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: a tool call needs a function with a non-empty string 'name'")
    return {"type": "function", "function": {"name": name, "arguments": _arguments(function.get("arguments"))}}


def _normalised_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """One gold message as envace renders it: role and text content, plus parsed tool calls for the assistant."""
    out: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"))}
    if message["role"] != "assistant":
        return out
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError(f"{where}: 'tool_calls' must be a list")
    if calls:
        out["tool_calls"] = [_gold_call(call, f"{where}, tool call {j}") for j, call in enumerate(calls)]
    return out


def normalised_messages(record: FinMCPRecord) -> list[dict[str, Any]]:
    """The record's gold dialogue in the form envace's chat rendering expects.

    Assistant tool calls get dict arguments (FinMCP stores JSON strings; see ``_arguments`` for malformed ones),
    every content becomes text (None is empty), and fields the templates do not use (call ids, annotations) go.

    Raises:
        ValueError: a malformed tool call, named with the record id and the message index.
    """
    return [_normalised_message(m, f"record {record.id}, message {i}") for i, m in enumerate(record.messages)]


def teacher_forced_steps(record: FinMCPRecord) -> list[tuple[list[dict[str, Any]], tuple[str, ...]]]:
    """The record's teacher-forced steps: one per gold assistant message.

    Returns:
        ``(prefix, gold_tools)`` per assistant message, in order: ``prefix`` is the normalised gold dialogue before
        it (so it holds the gold tool calls and the recorded tool responses of earlier steps), ``gold_tools`` the
        names it calls (empty for a final answer).
    """
    messages = normalised_messages(record)
    return [(messages[:i], tuple(c["function"]["name"] for c in m.get("tool_calls", ())))
            for i, m in enumerate(messages) if m["role"] == "assistant"]


# ---------------------------------------------------------------------------------------------------------------------
# Policy evaluation
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class _Step:
    """One teacher-forced generation: its record, its prompt ids (None when too long) and what came of it."""

    record: str
    prompt: list[int] | None
    tools: list[str] = field(default_factory=list)
    text: str | None = None
    parse_errors: int = 0
    truncated: bool = False


def _tool_lists(records: Sequence[FinMCPRecord], tools: Mapping[str, dict[str, Any]] | None
                ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """The schemas each record's prompts show, and their source (``caller``, ``record`` or ``inferred``)."""
    if tools is not None:
        shared = _caller_tools(tools)
        return {r.id: shared for r in records}, {r.id: "caller" for r in records}
    lists: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, str] = {}
    inferred: list[dict[str, Any]] | None = None
    for record in records:
        if record.tools:
            lists[record.id], sources[record.id] = list(record.tools), "record"
            continue
        if inferred is None:
            inferred = list(infer_tool_schemas(records).values())
        lists[record.id], sources[record.id] = inferred, "inferred"
    return lists, sources


def _delta_ids(tokenizer: Any, text: str, full: str) -> list[int]:
    """The ids of what ``full`` adds to ``text``.

    Raises:
        TemplateError: ``full`` does not extend ``text`` (the chat template is not prefix-preserving).
    """
    from envace.policy.chat import TemplateError, encode

    if not full.startswith(text):
        raise TemplateError("the chat template is not prefix-preserving on this gold dialogue; teacher-forced "
                            "prompts are rendered incrementally, as envace's token streams are")
    return encode(tokenizer, full[len(text) :])


def step_prompts(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 ends: Sequence[int]) -> list[list[int]]:
    """Prompt ids of each prefix ``messages[:end]`` plus the generation prompt, rendered once, incrementally.

    The ids are those of ``envace.rollout.stream.prompt_stream`` (each message's template delta encoded on its own,
    then the generation prompt's), except that consecutive tool messages (the responses of parallel calls) form one
    segment: Qwen-style templates close their shared block only after the last one, so ``prompt_stream``, which
    renders message by message, refuses them.

    Args:
        tokenizer: the tokenizer holding the chat template.
        messages: the normalised gold dialogue.
        tools: the tool schemas shown.
        ends: the prefix lengths, increasing, each at least 1 and never between two tool messages.

    Raises:
        TemplateError: the template is not prefix-preserving on this dialogue.
    """
    from envace.policy.chat import render

    prompts: list[list[int]] = []
    ids: list[int] = []
    text = ""
    wanted = set(ends)
    for i in range(1, max(ends, default=0) + 1):
        if i < len(messages) and messages[i - 1]["role"] == messages[i]["role"] == "tool" and i not in wanted:
            continue
        full = render(tokenizer, messages[:i], tools, add_generation_prompt=False)
        ids.extend(_delta_ids(tokenizer, text, full))
        text = full
        if i in wanted:
            opened = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
            prompts.append(ids + _delta_ids(tokenizer, text, opened))
    return prompts


def _build_steps(records: Sequence[FinMCPRecord], lists: dict[str, list[dict[str, Any]]], tokenizer: Any,
                 max_prompt_tokens: int) -> list[_Step]:
    """Every (record, step) prompt in record then step order; a prompt over ``max_prompt_tokens`` is None."""
    steps = []
    for record in records:
        messages = normalised_messages(record)
        ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for ids in step_prompts(tokenizer, messages, lists[record.id], ends):
            steps.append(_Step(record.id, ids if len(ids) <= max_prompt_tokens else None))
    return steps


def _generate(engine: Any, prompts: list[list[int]], params: Any, batch_size: int) -> list[Any]:
    """``engine.generate`` over ``prompts`` in batches of ``batch_size``, in order."""
    out: list[Any] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        generations = engine.generate(batch, params)
        if len(generations) != len(batch):
            raise ValueError(f"the engine returned {len(generations)} generations for {len(batch)} prompts")
        out.extend(generations)
    return out


def _read_generation(step: _Step, generation: Any, tokenizer: Any) -> None:
    """Decode and parse one generation into ``step``: its tool names, malformed blocks and truncation."""
    from envace.policy.chat import decode
    from envace.roles.parsing import CallError, parse_act_output

    ids = generation.token_ids[:-1] if generation.finished else generation.token_ids
    step.text = decode(tokenizer, list(ids))
    step.truncated = not generation.finished
    turn = parse_act_output(step.text)
    step.tools = [c.name for c in turn.calls if not isinstance(c, CallError)]
    step.parse_errors = sum(isinstance(c, CallError) for c in turn.calls)


def _check_records(records: Sequence[FinMCPRecord]) -> None:
    """Refuse what cannot be teacher-forced: no records, duplicate ids, no gold assistant message or no context."""
    if not records:
        raise ValueError("evaluate_finmcp: no records")
    ids = Counter(r.id for r in records)
    duplicates = sorted(i for i, n in ids.items() if n > 1)
    if duplicates:
        raise ValueError(f"evaluate_finmcp: duplicate record id(s) {duplicates[:5]}")
    silent = [r.id for r in records if not any(m.get("role") == "assistant" for m in r.messages)]
    if silent:
        raise ValueError(f"evaluate_finmcp: record(s) {silent[:5]} have no gold assistant message to teacher-force")
    headless = [r.id for r in records if r.messages[0].get("role") == "assistant"]
    if headless:
        raise ValueError(f"evaluate_finmcp: record(s) {headless[:5]} open with an assistant message (no context)")


def _source_summary(sources: dict[str, str]) -> str:
    """The one schema source of all records, or ``mixed``."""
    kinds = set(sources.values())
    return kinds.pop() if len(kinds) == 1 else "mixed"


def evaluate_finmcp(
    records: Sequence[FinMCPRecord],
    engine: Any,
    tokenizer: Any,
    tools: Mapping[str, dict[str, Any]] | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    batch_size: int = 16,
    max_prompt_tokens: int = 32768,
) -> dict[str, Any]:
    """Evaluate a policy on ``records`` with the paper's teacher-forced protocol (see the module docstring).

    Every gold assistant message is one step: its gold prefix is rendered with the chat template
    (``step_prompts``), all steps of all records are generated in order, ``batch_size`` prompts per
    ``engine.generate`` call, and each generation is decoded (without its stop token) and parsed for
    ``<tool_call>`` blocks. A malformed block calls no tool and is counted. A prompt longer than
    ``max_prompt_tokens`` is not generated: it is counted as an overflow and predicts no tool.

    Args:
        records: the records to evaluate.
        engine: an envace ``Engine`` (``generate(prompts, SamplingParams) -> list[Generation]``).
        tokenizer: the policy's tokenizer (its chat template renders tools and assistant tool calls).
        tools: tool name -> schema shown in every prompt; None uses each record's ``tools``, else inferred schemas.
        max_new_tokens: generation budget per step.
        temperature: sampling temperature (0 is greedy).
        top_p: nucleus sampling mass.
        batch_size: prompts per ``engine.generate`` call.
        max_prompt_tokens: longest prompt generated.

    Returns:
        ``scores`` (``FinMCPScores``), ``predictions`` (id -> predicted grouping), ``schema_source`` (``caller``,
        ``record``, ``inferred`` or ``mixed``), ``schema_sources`` (records per source), the counts ``steps``,
        ``generated``, ``overflow``, ``parse_errors`` (malformed blocks) and ``truncated`` (generations cut by
        ``max_new_tokens``), and ``outputs`` (id -> decoded text per step, None where not generated).

    Raises:
        ValueError: no records, duplicate ids, a record without a gold assistant message, a malformed schema or gold
            call, a non-positive ``batch_size`` or ``max_prompt_tokens``.
    """
    from envace.rollout.engine import SamplingParams

    if batch_size < 1 or max_prompt_tokens < 1:
        raise ValueError(f"evaluate_finmcp: batch_size ({batch_size}) and max_prompt_tokens ({max_prompt_tokens}) "
                         "must be positive")
    _check_records(records)
    lists, sources = _tool_lists(records, tools)
    steps = _build_steps(records, lists, tokenizer, max_prompt_tokens)
    live = [s for s in steps if s.prompt is not None]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    for step, generation in zip(live, _generate(engine, [s.prompt for s in live], params, batch_size)):
        _read_generation(step, generation, tokenizer)
    return _result(records, steps, sources, len(live))


def _result(records: Sequence[FinMCPRecord], steps: list[_Step], sources: dict[str, str], generated: int
            ) -> dict[str, Any]:
    """The evaluation result of ``evaluate_finmcp`` from its steps."""
    predictions: dict[str, list[list[str]]] = {r.id: [] for r in records}
    outputs: dict[str, list[str | None]] = {r.id: [] for r in records}
    for step in steps:
        outputs[step.record].append(step.text)
        if step.tools:
            predictions[step.record].append(step.tools)
    return {
        "scores": score_finmcp(records, predictions),
        "predictions": predictions,
        "schema_source": _source_summary(sources),
        "schema_sources": dict(Counter(sources.values())),
        "steps": len(steps),
        "generated": generated,
        "overflow": len(steps) - generated,
        "parse_errors": sum(s.parse_errors for s in steps),
        "truncated": sum(s.truncated for s in steps),
        "outputs": outputs,
    }
