"""The task file format (JSONL, one task per line): its loader and writer.

This module owns reading and writing task files; each record is converted into the frozen ``envace.types.Task``
dataclass by ``envace.data.task_parsing.parse_task`` (and back by ``envace.data.task_records.task_to_record``). Every
problem is reported as one ``TaskFormatError`` line naming the file, the line and the field, e.g.
``tasks.jsonl:3: field 'tools[0].function.parameters': not a valid JSON schema: ...``. See ``docs/task-format.md``.

Lines are split on ``\\n`` only (a JSON string may hold U+2028 or U+0085 raw). Lines are read with
``envace.roles.parsing.loads_json``: nesting deeper than ``MAX_JSON_DEPTH``, lone surrogates, ``NaN``/``Infinity`` and
out-of-range numbers are refused with the field named. Duplicate keys in an object: the last one wins, as in ``json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from envace.data.task_parsing import parse_task
from envace.data.task_records import task_to_record
from envace.data.task_schema import TaskFormatError, _one_line
from envace.roles.parsing import UnsafeJSONError, loads_json
from envace.types import Task


def load_tasks(path: str | Path, *, limit: int | None = None) -> list[Task]:
    """Load and validate a JSONL task file (blank lines skipped).

    Args:
        path: the file (``envace.builtin.task_sets.load_task_set`` also reads ``builtin:NAME``, ``reference:PATH`` and
            ``PATH:N``).
        limit: stop after this many tasks (the lines after them are neither read nor checked); None reads all.

    Raises:
        TaskFormatError: the file is missing, empty, or a line is invalid (one line naming file, line and field).
    """
    path = Path(path)
    if not path.is_file():
        named = str(path).startswith(("builtin:", "reference:", "reference-lenient:"))
        raise TaskFormatError(f"task file not found: {path}" + (
            " (a task set name: envace.builtin.task_sets.load_task_set reads it)" if named else ""))
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").split("\n")  # not splitlines(): JSON strings may hold U+2028, U+0085 raw
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise TaskFormatError(f"{path}:{lineno}: not UTF-8 text: {exc.reason} (byte {exc.start})") from exc
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        task = parse_task(decode_json(line, f"{path}:{lineno}"), where=f"{path}:{lineno}")
        if task.id in first_line:
            raise TaskFormatError(
                f"{path}:{lineno}: field 'id': duplicate task id '{task.id}' (first on line {first_line[task.id]})"
            )
        first_line[task.id] = lineno
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise TaskFormatError(f"{path}: no tasks (the file is empty)")
    return tasks


def decode_json(text: str, where: str, whole: str = "<record>") -> Any:
    """``loads_json`` of a task-file text, every problem a ``TaskFormatError`` that starts with ``where``.

    ``whole`` names the top-level value in an error about it; a multi-line text's errors name the line too.
    """
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if "\n" in text else f"column {exc.colno}"
        raise TaskFormatError(f"{where}: invalid JSON: {exc.msg} ({at})") from exc
    except UnsafeJSONError as exc:
        raise TaskFormatError(f"{where}: field '{_one_line(exc.path) or whole}': {exc.problem}") from exc
    except ValueError as exc:  # NaN/Infinity, an integer too long to convert
        raise TaskFormatError(f"{where}: invalid JSON: {_one_line(str(exc))}") from exc


def write_tasks(tasks: Iterable[Task], path: str | Path) -> dict[str, int]:
    """Write ``tasks`` as a task file (JSON Lines), each checked exactly as the loader will read it back.

    A task the loader would refuse (a benchmark's gold call that breaks its own tool schema, say) is left out and
    counted. Returns ``{"written": n, "skipped_schema": n}``.
    """
    counts = {"written": 0, "skipped_schema": 0}
    lines = []
    for task in tasks:
        record = task_to_record(task)
        try:
            parse_task(json.loads(json.dumps(record)))
        except TaskFormatError:
            counts["skipped_schema"] += 1
            continue
        lines.append(json.dumps(record, ensure_ascii=False))
        counts["written"] += 1
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return counts
