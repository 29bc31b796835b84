"""``envace record``: reference trajectories whose tool responses come from the task's real environment.

The SFT warm start and the world-model alignment term learn the rehearse role from recorded tool responses. For a
world served by a real tool server (an MCP server, ``envace.envs.mcp``) or any environment class, write the task file
with the reference's calls only (the assistant messages and their ``tool_calls``); this command runs each task's
calls, in order, on a fresh instance of its environment (its initial state) and writes the file with the server's
responses as the reference's tool messages, replacing any there were. A task without ``tools`` gets its
environment's (an MCP server's ``tools/list``; an environment class's methods). The written tasks are checked like
any task file.

``--check`` runs the calls again and compares every response with the file's, byte for byte: a recording replays
exactly when the environment is deterministic (the same calls on the same initial state answer the same). It names
the first task and call that differs.

Usage::

    envace record --tasks my_tasks.jsonl --out my_tasks.recorded.jsonl
    envace record --tasks my_tasks.recorded.jsonl --check
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from envace.data.task_parsing import parse_task
from envace.data.tasks import decode_json
from envace.envs.real import DEFAULT_TOOL_TIMEOUT_S, RealEnvironment, tool_schemas_from_class
from envace.errors import UserError
from envace.types import EnvSpec, ToolCall

HELP = "Record reference tool responses from each task's real environment (an MCP server or a class)."
"""Also listed by ``envace --help`` (``envace.cli.lightning.RECORD_HELP``)."""



class RecordError(UserError, RuntimeError):
    """A task cannot be recorded (no environment, a call the environment refused) or does not replay."""


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    p = argparse.ArgumentParser(prog="envace record", description=HELP)
    p.add_argument("--tasks", required=True, help="the task file (JSONL): references hold the calls to run")
    p.add_argument("--out", help="the recorded task file to write (not with --check)")
    p.add_argument("--check", action="store_true", help="replay the file's calls and compare the responses")
    p.add_argument("--tool_timeout_s", type=float, default=DEFAULT_TOOL_TIMEOUT_S, help="most seconds a call may take")
    return p


def main(argv: list[str]) -> dict[str, Any]:
    """Run the command; returns its counts (``tasks``, ``calls``, and ``errors``: responses that are tool errors)."""
    opts = parser().parse_args(argv)
    if opts.check == bool(opts.out):
        raise RecordError("envace record: give --out to record, or --check to replay a recorded file (not both)")
    path = Path(opts.tasks)
    if not path.is_file():
        raise RecordError(f"envace record: task file not found: {path}")
    counts = {"tasks": 0, "calls": 0, "errors": 0}
    out: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        record = decode_json(line, where)
        if not isinstance(record, dict):
            raise RecordError(f"{where}: a task must be a JSON object")
        recorded, calls, errors = record_task(record, where, opts.tool_timeout_s)
        if opts.check:
            compare(record, recorded, where)
        else:
            parse_task(recorded, where=where)  # the written file is a valid task file
        out.append(json.dumps(recorded, ensure_ascii=False))
        counts["tasks"], counts["calls"], counts["errors"] = (counts["tasks"] + 1, counts["calls"] + calls,
                                                              counts["errors"] + errors)
    if not opts.check:
        target = Path(opts.out)
        partial = target.with_name(target.name + ".partial")
        partial.write_text("".join(f"{line}\n" for line in out), encoding="utf-8")
        partial.replace(target)  # a failed run leaves any earlier file whole
    verb = "replayed identically" if opts.check else f"recorded to {opts.out}"
    print(f"envace record: {counts['tasks']} tasks, {counts['calls']} calls ({counts['errors']} tool errors) "  # noqa: T201 - the command's own output
          f"{verb}")
    return counts


def record_task(record: dict[str, Any], where: str, timeout_s: float) -> tuple[dict[str, Any], int, int]:
    """``record`` with its reference's tool messages from its environment; the calls made and the errors among them.

    Raises:
        RecordError: the task has no environment, or its environment refused a call (a name it does not have).
    """
    spec = record.get("environment")
    if not isinstance(spec, dict) or not isinstance(spec.get("class_path"), str):
        raise RecordError(f"{where}: field 'environment': a task to record needs its real environment "
                          "({'class_path': ..., 'init_args': {...}})")
    env = RealEnvironment(EnvSpec(spec["class_path"], dict(spec.get("init_args") or {})), timeout_s)
    try:
        reference, calls, errors = _run_reference(env, record.get("reference") or [], where)
        recorded = {**record, "reference": reference}
        if not record.get("tools"):
            recorded["tools"] = _tools(env)
        return {k: recorded[k] for k in _key_order(record, recorded)}, calls, errors
    finally:
        env.close()


def compare(record: dict[str, Any], recorded: dict[str, Any], where: str) -> None:
    """Raise ``RecordError`` naming the first tool response of ``record`` that ``recorded`` answers differently."""
    old = [m for m in record.get("reference") or [] if m.get("role") == "tool"]
    new = [m for m in recorded["reference"] if m.get("role") == "tool"]
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a.get("content") != b.get("content"):
            raise RecordError(f"{where}: tool response {i} ({b.get('name')}) replays differently: recorded "
                              f"{a.get('content')!r}, now {b.get('content')!r}")
    if len(old) != len(new):
        raise RecordError(f"{where}: the file holds {len(old)} tool responses, its calls make {len(new)}")


def _run_reference(env: RealEnvironment, reference: list[Any], where: str
                   ) -> tuple[list[dict[str, Any]], int, int]:
    messages: list[dict[str, Any]] = []
    calls = errors = 0
    for i, message in enumerate(reference):
        if not isinstance(message, dict):
            raise RecordError(f"{where}: field 'reference[{i}]': must be an object")
        if message.get("role") == "tool":
            continue  # replaced by what the environment answers now
        messages.append(message)
        for j, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            arguments = function.get("arguments", {}) if isinstance(function, dict) else None
            if isinstance(arguments, str):  # OpenAI's wire form: the arguments as JSON text
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{where}: field 'reference[{i}].tool_calls[{j}].function.arguments': not "
                                      f"JSON: {exc}") from exc
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise RecordError(f"{where}: field 'reference[{i}].tool_calls[{j}].function': needs a 'name' and "
                                  "an 'arguments' object")
            if name not in env.tool_names and not env.any_name:
                raise RecordError(f"{where}: field 'reference[{i}].tool_calls[{j}].function.name': the environment "
                                  f"has no tool '{name}' (it has: {', '.join(env.tool_names)})")
            content, ok = env.execute(ToolCall(name, arguments))
            calls, errors = calls + 1, errors + (not ok)
            response = {"role": "tool", "name": name, "content": content}
            if isinstance(call.get("id"), str):
                response["tool_call_id"] = call["id"]
            messages.append(response)
    return messages, calls, errors


def _tools(env: RealEnvironment) -> list[dict[str, Any]]:
    """The environment's tool schemas: an MCP server's ``tools/list``, or an environment class's methods."""
    instance = env.instance
    server_tools = getattr(instance, "server_tools", None)
    if callable(server_tools):
        return server_tools()
    if env.toolbox:
        raise RecordError(f"environment '{env.spec.class_path}' lists no tool schemas: write the task's 'tools'")
    return tool_schemas_from_class(type(instance))


def _key_order(record: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """The record's keys in their order, new ones (``tools``) after ``messages``."""
    keys = list(record)
    for key in recorded:
        if key not in keys:
            keys.insert(keys.index("messages") + 1 if "messages" in keys else len(keys), key)
    return keys
