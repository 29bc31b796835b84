"""FinMCP-Bench policy evaluation: the paper's teacher-forced protocol, through an envace engine.

``teacher_forced_steps`` cuts a record's gold dialogue at each assistant message; at each, ``evaluate_finmcp`` shows
the policy the **gold** history before it (system and user messages, the gold assistant messages with their tool
calls, the recorded real tool responses) and it generates one assistant message, token-in/token-out through an envace
engine. The tools it calls there are that step's prediction; the record's predicted grouping is the list of its
non-empty predicted steps, so calls made where the gold dialogue gives its final answer count as extra predictions
(they lower precision). ``envace.benchmarks.finmcp.score_finmcp`` then scores the groupings.

Tool schemas: the records carry none (the real MCP schemas come from the provider). In order of preference the
prompts show the schemas the caller passes (e.g. from ``load_tool_schemas``), the record's own ``tools`` field when
it has one, else schemas inferred from the gold calls of all evaluated records (``infer_tool_schemas``). The inferred
ones are a fallback that gives the model less than the real benchmark does: no descriptions, no required arguments,
no enums, argument types guessed from the recorded values, and only the tools the evaluated records happen to call.
The result names the source used.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.benchmarks.finmcp import FinMCPRecord, schema_list, score_finmcp, tool_schema

# ---------------------------------------------------------------------------------------------------------------------
# Tool schemas
# ---------------------------------------------------------------------------------------------------------------------

RAW_ARGUMENTS = "_raw"
"""The key under which a gold call's malformed argument string is kept verbatim."""
_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", list: "array", dict: "object"}


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
    return {s["function"]["name"]: s for s in schema_list(value, str(path))}


def _caller_tools(tools: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The caller's name -> schema mapping as a validated schema list.

    Raises:
        ValueError: a malformed schema, or one filed under another tool's name.
    """
    schemas = []
    for name, value in tools.items():
        schema = tool_schema(value, f"tools[{name!r}]")
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

    The ids are ``envace.engines.stream.prompt_stream(tokenizer, messages[:end], tools).ids`` for each ``end`` (each
    message's template delta encoded on its own, consecutive tool messages as one segment, then the generation
    prompt's delta), but the dialogue is rendered and encoded once for all its steps rather than once per step, which
    grows with the square of the dialogue's length (about 5x slower on a 12-step dialogue).

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
    from envace.engines.base import SamplingParams

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
