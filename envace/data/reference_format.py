"""Training rows of the EnvACE authors' checklist task ("reference format") as envace tasks.

A row (one Parquet row, one element of a ``.json`` list, or one line of a ``.jsonl`` file) holds:

- ``messages``: the initial chat (system prompt and first user message);
- ``data_source``: a label (kept as ``Task.metadata["data_source"]``, so ``envace test`` can report success per
  source with ``test_group_by: data_source``);
- ``extra_info.original_index`` (else ``extra_info.index``): the task id;
- ``extra_info.tools``: OpenAI function schemas, a list or a JSON string of one;
- ``extra_info.messages``: the full reference conversation (users, assistants with ``tool_calls`` whose
  ``function.arguments`` is a JSON object string, and the tool messages answering them);
- ``extra_info.interaction_kwargs.checklist_list``: checklists, each a list over the user turns of the reference
  conversation, each turn a list of standards (``envace.types.Standard``).

Conversion (``row_to_task``): ``messages`` stays the initial chat; the reference conversation after its first user
message becomes ``Task.reference`` (envace's reference may hold later user messages: the continuation of the whole
conversation, as BFCL's exported tasks do), and each later user message becomes one entry of ``Task.user_turns``
(the scripted next user message, as EnvACE copies the (turn+1)-th user message). The checklists go to
``Task.checklists``; ``Task.success`` is empty (``SuccessSpec()``): the checklist reward scores these tasks.

Every problem names the file, the row and the row's field, e.g.
``train.parquet: row 3 (id '17'): field 'extra_info.messages[4].tool_calls': ...``. Fields checked by envace's own
task validation (tool schemas, calls against their schemas) are mapped back to the row's fields. ``load_reference_rows``
raises on the first bad row by default; ``skip_invalid=True`` skips bad rows, counts them and logs a warning.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.data.task_checklists import parse_checklists
from envace.data.task_parsing import _parse_task
from envace.data.task_schema import ROLES, STANDARD_KEYS, TaskFormatError, _FieldError, _one_line
from envace.data.tasks import decode_json
from envace.roles.parsing import json_type_name, loads_json
from envace.types import Task

log = logging.getLogger(__name__)

SUFFIXES = (".parquet", ".json", ".jsonl")
CHECKLISTS_FIELD = "extra_info.interaction_kwargs.checklist_list"
_OBSERVATION_ROLES = ("tool", "observation")  # the authors' tool cache accepts either for a tool response


@dataclass
class ReferenceRows:
    """The result of ``load_reference_rows``.

    Attributes:
        tasks: the converted tasks, in row order.
        skipped: one error line per skipped row (only with ``skip_invalid=True``).
    """

    tasks: list[Task]
    skipped: list[str] = field(default_factory=list)


def load_reference_rows(path: str | Path, *, skip_invalid: bool = False) -> ReferenceRows:
    """Load rows in the EnvACE authors' format and convert them into envace tasks.

    Args:
        path: a ``.parquet`` file (needs pyarrow), a ``.json`` file (a list of rows) or a ``.jsonl`` file (one row
            per line; blank lines skipped).
        skip_invalid: skip an invalid row (counted in ``skipped`` and logged) instead of raising.

    Raises:
        TaskFormatError: the file is missing, unreadable, has an unknown suffix, holds no valid row, or (without
            ``skip_invalid``) a row is invalid; one line naming the file, the row and the field.
        ImportError: a Parquet file and pyarrow is not installed.
    """
    path = Path(path)
    rows = read_rows(path)
    tasks: list[Task] = []
    skipped: list[str] = []
    first_row: dict[str, int] = {}
    for index, row in enumerate(rows):
        try:
            task = row_to_task(row, where=f"{path}: row {index}")
            if task.id in first_row:
                raise TaskFormatError(f"{path}: row {index}: field 'extra_info.original_index': duplicate task id "
                                      f"'{task.id}' (first in row {first_row[task.id]})")
        except TaskFormatError as exc:
            if not skip_invalid:
                raise
            skipped.append(str(exc))
            continue
        first_row[task.id] = index
        tasks.append(task)
    if skipped:
        log.warning("%s: skipped %d invalid row(s) of %d; first: %s", path, len(skipped), len(rows), skipped[0])
    if not tasks:
        raise TaskFormatError(f"{path}: no valid rows ({len(rows)} rows, {len(skipped)} skipped)")
    return ReferenceRows(tasks, skipped)


def read_rows(path: Path) -> list[Any]:
    """The raw rows of a ``.parquet``, ``.json`` or ``.jsonl`` file."""
    if path.suffix not in SUFFIXES:
        raise TaskFormatError(f"{path}: unknown suffix '{path.suffix}' for reference rows (use {', '.join(SUFFIXES)})")
    if not path.is_file():
        raise TaskFormatError(f"reference row file not found: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {path} needs pyarrow: pip install -e '.[parquet]' (or pip install pyarrow)"
                              ) from exc
        try:
            return [_drop_nulls(row) for row in pq.read_table(path).to_pylist()]
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types on a damaged file
            raise TaskFormatError(f"{path}: cannot read Parquet: {_one_line(str(exc))}") from exc
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(f"{path}: not UTF-8 text: {exc.reason} (byte {exc.start})") from exc
    if path.suffix == ".json":
        rows = decode_json(text, str(path), "<row>")
        if not isinstance(rows, list):
            raise TaskFormatError(f"{path}: a .json file of rows must hold a JSON list, got {json_type_name(rows)}")
        return rows
    lines = enumerate(text.split("\n"), start=1)
    return [decode_json(line, f"{path}:{n}", "<row>") for n, line in lines if line.strip()]


def _drop_nulls(value: Any) -> Any:
    """Parquet structs hold every key of every row; a key a row did not have reads as None: drop such keys.

    Tool schemas are left alone (``"default": null`` is meaningful there); give ``extra_info.tools`` as a JSON string,
    as the authors' files do.
    """
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    if isinstance(value, dict):
        return {k: (v if k == "tools" else _drop_nulls(v)) for k, v in value.items() if v is not None}
    return value


# ---------------------------------------------------------------------------------------------------------------------
# One row
# ---------------------------------------------------------------------------------------------------------------------


def row_to_task(row: Any, *, where: str = "<row>") -> Task:
    """Validate one row and convert it into a ``Task`` (see the module docstring).

    Raises:
        TaskFormatError: one line ``{where} (id 'ID'): field '{row field}': {problem}``.
    """
    task_id: str | None = None
    start = 0
    try:
        task_id = _row_id(row)
        record, start = _row_record(row, task_id)
        return _parse_task(record)
    except _FieldError as exc:
        name = f" (id '{task_id}')" if task_id is not None else ""
        field_name = _row_field(exc.field, start)
        raise TaskFormatError(f"{where}{name}: field '{_one_line(field_name)}': {_one_line(exc.message)}") from exc


def _row_id(row: Any) -> str:
    if not isinstance(row, dict):
        raise _FieldError("<row>", f"must be a JSON object, got {json_type_name(row)}")
    extra = _get(row, "extra_info", dict)
    for key in ("original_index", "index"):
        value = extra.get(key)
        if isinstance(value, bool) or (value is not None and not isinstance(value, int | str)):
            raise _FieldError(f"extra_info.{key}", f"must be an integer or a string, got {json_type_name(value)}")
        if value is not None and str(value).strip():
            return str(value)
    raise _FieldError("extra_info.original_index", "is required (or extra_info.index)")


def _get(value: dict[str, Any], key: str, kind: type, prefix: str = "") -> Any:
    if key not in value:
        raise _FieldError(prefix + key, "is required")
    if not isinstance(value[key], kind):
        expected = {dict: "a JSON object", list: "a list"}[kind]
        raise _FieldError(prefix + key, f"must be {expected}, got {json_type_name(value[key])}")
    return value[key]


def _row_record(row: dict[str, Any], task_id: str) -> tuple[dict[str, Any], int]:
    """The envace task record of a row, and the index in ``extra_info.messages`` where the reference starts."""
    extra = row["extra_info"]
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(_get(row, "messages", list))]
    if not messages:
        raise _FieldError("messages", "must be a non-empty list of messages")
    tools = _tools(extra.get("tools"))
    conversation = [_message(m, f"extra_info.messages[{i}]") for i, m in enumerate(_get(extra, "messages", list,
                                                                                         "extra_info."))]
    _check_tool_responses(conversation)
    users = [i for i, m in enumerate(conversation) if m["role"] == "user"]
    if not users:
        raise _FieldError("extra_info.messages", "has no user message")
    start = users[0] + 1
    kwargs = _get(extra, "interaction_kwargs", dict, "extra_info.")
    checklists = _get(kwargs, "checklist_list", list, "extra_info.interaction_kwargs.")
    if not checklists:
        raise _FieldError(CHECKLISTS_FIELD, "must hold at least one checklist (the reward of these tasks)")
    parse_checklists(checklists, CHECKLISTS_FIELD, len(users), strict_keys=False)  # row fields named in errors
    record = {
        "id": task_id,
        "messages": messages,
        "tools": tools,
        "success": {},
        "reference": conversation[start:],
        "user_turns": [[conversation[i]] for i in users[1:]],
        "checklists": _known_keys(checklists),
    }
    if row.get("data_source") is not None:
        record["metadata"] = {"data_source": row["data_source"]}
    return record, start


def _known_keys(checklists: list[Any]) -> list[Any]:
    """The checklists with unknown keys of standards dropped (envace keeps the seven fields of ``Standard``)."""
    return [[[{k: v for k, v in s.items() if k in STANDARD_KEYS} for s in turn] for turn in checklist]
            for checklist in checklists]


def _message(value: Any, field_name: str) -> dict[str, Any]:
    """A chat message with null keys dropped, null content read as ``""`` and an ``observation`` role as ``tool``."""
    if not isinstance(value, dict):
        raise _FieldError(field_name, f"a message must be a JSON object, got {json_type_name(value)}")
    message = {k: v for k, v in value.items() if v is not None}
    message.setdefault("content", "")
    if message.get("role") == "observation":
        message["role"] = "tool"
    if message.get("role") not in ROLES:
        raise _FieldError(f"{field_name}.role", f"must be one of {', '.join(ROLES)} (or observation), got "
                                                f"{json.dumps(message.get('role'))}")
    if "tool_calls" in message:
        calls = message["tool_calls"]
        if message["role"] != "assistant" or not isinstance(calls, list):
            raise _FieldError(f"{field_name}.tool_calls", "must be a list, on an assistant message")
        if not calls:
            del message["tool_calls"]
        for j, call in enumerate(calls):
            _check_arguments(call, f"{field_name}.tool_calls[{j}]")
    return message


def _check_arguments(call: Any, field_name: str) -> None:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise _FieldError(field_name, 'must be {"type": "function", "function": {"name": ..., "arguments": ...}}')
    arguments = call["function"].get("arguments")
    where = f"{field_name}.function.arguments"
    if isinstance(arguments, dict):
        return
    if not isinstance(arguments, str):
        raise _FieldError(where, f"must be a JSON object string, got {json_type_name(arguments)}")
    decoded = _field_json(arguments, where, "must be a JSON object string")
    if not isinstance(decoded, dict):
        raise _FieldError(where, f"must be a JSON object string, got a JSON {json_type_name(decoded)}")


def _field_json(text: str, where: str, problem: str) -> Any:
    """A row field holding JSON text, decoded; ``_FieldError(where, "<problem>: <why>")`` if it is not JSON."""
    try:
        return loads_json(text)
    except ValueError as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise _FieldError(where, f"{problem}: {message}") from exc


def _tools(value: Any) -> list[Any]:
    where = "extra_info.tools"
    if value is None:
        raise _FieldError(where, "is required")
    if isinstance(value, str):
        value = _field_json(value, where, "not a JSON list of function schemas")
    if not isinstance(value, list):
        raise _FieldError(where, f"must be a list (or a JSON string of a list) of function schemas, got "
                                 f"{json_type_name(value)}")
    for i, spec in enumerate(value):
        if not isinstance(spec, dict) or spec.get("type") != "function" or not isinstance(spec.get("function"), dict):
            raise _FieldError(f"{where}[{i}]", 'must be a function schema {"type": "function", "function": {...}}')
    return value


def _check_tool_responses(conversation: list[dict[str, Any]]) -> None:
    """Each assistant message with k tool calls is followed by exactly k tool messages (and no tool message else)."""
    i = 0
    while i < len(conversation):
        message = conversation[i]
        calls = message.get("tool_calls", [])
        if message["role"] == "tool":
            raise _FieldError(f"extra_info.messages[{i}]", "tool message without a preceding assistant tool call")
        i += 1
        if not calls:
            continue
        answered = 0
        while i < len(conversation) and conversation[i]["role"] == "tool":
            answered, i = answered + 1, i + 1
        if answered != len(calls):
            raise _FieldError(f"extra_info.messages[{i - answered - 1}].tool_calls",
                              f"{len(calls)} tool call(s) followed by {answered} tool message(s); expected exactly "
                              f"{len(calls)}")


_RECORD_FIELDS = (
    (re.compile(r"^tools(?=\[|$)"), "extra_info.tools"),
    (re.compile(r"^checklists(?=\[|$)"), CHECKLISTS_FIELD),
)


def _row_field(record_field: str, start: int) -> str:
    """The row field of a field of the envace record built from it."""
    match = re.match(r"^reference\[(\d+)\]", record_field)
    if match:
        return f"extra_info.messages[{int(match.group(1)) + start}]" + record_field[match.end() :]
    if record_field.startswith("user_turns"):
        return "extra_info.messages"
    for pattern, replacement in _RECORD_FIELDS:
        if pattern.match(record_field):
            return pattern.sub(replacement, record_field, count=1)
    return record_field
