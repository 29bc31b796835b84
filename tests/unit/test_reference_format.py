"""Rows in the EnvACE authors' format ("reference format") loaded as envace tasks, and checklists in task files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from helpers import make_row

from envace.builtin.task_sets import load_task_set
from envace.data.reference_format import load_reference_rows, row_to_task
from envace.data.task_reference import reference_calls
from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks, write_tasks
from envace.rewards.scoring import _score
from envace.types import Episode, Sample, Standard, SuccessSpec, ToolCall


def write_json(rows: list[Any], path: Path) -> Path:
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_row_becomes_task(tmp_path: Path) -> None:
    loaded = load_reference_rows(write_json([make_row(1), make_row(2, tools_as_string=False)], tmp_path / "r.json"))
    assert loaded.skipped == []
    task, second = loaded.tasks
    assert (task.id, second.id) == ("orig-1", "orig-2")
    assert [m["role"] for m in task.messages] == ["system", "user"]
    assert [t["function"]["name"] for t in task.tools] == ["get_weather", "get_time"]
    assert second.tools == task.tools
    assert task.user_turns == (({"role": "user", "content": "And in Oslo?"},),)
    assert [m["role"] for m in task.reference] == ["assistant", "tool", "tool", "assistant", "user", "assistant",
                                                   "tool", "assistant"]
    assert reference_calls(task) == [
        (ToolCall("get_weather", {"city": "Paris"}), '{"sky": "rain"}'),
        (ToolCall("get_time", {"city": "Paris"}), '{"time": "10:00"}'),
        (ToolCall("get_weather", {"city": "Oslo"}), '{"sky": "snow"}'),
    ]
    assert task.success == SuccessSpec()
    (checklist,) = task.checklists
    assert [[s.weight for s in turn] for turn in checklist] == [[0.7, 0.3], [1.0]]
    first = checklist[0][0]
    assert first == Standard(
        question="Weather of Paris asked?", focus_on="assistant.tool_calls",
        pass_condition="The call names the right city.", failure_examples=("calls get_time instead",),
        evidence=("get_weather(city='Paris')",), weight=0.7, required_for_next_turn=True,
    )


def test_jsonl_and_task_set_spec(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(make_row(1)) + "\n\n" + json.dumps(make_row(2)) + "\n", encoding="utf-8")
    assert [t.id for t in load_task_set(f"reference:{path}")] == ["orig-1", "orig-2"]
    row = make_row(3)
    row["extra_info"]["original_index"] = None  # falls back to index
    assert row_to_task(row).id == "3"


def test_parquet(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([make_row(1), make_row(2)]), path)  # user messages get tool_calls: null
    tasks = load_task_set(f"reference:{path}")
    assert [t.id for t in tasks] == ["orig-1", "orig-2"]
    assert tasks[0] == load_reference_rows(write_json([make_row(1)], tmp_path / "r.json")).tasks[0]


def test_checklist_task_round_trips_through_jsonl(tmp_path: Path) -> None:
    task = row_to_task(make_row(1))
    assert write_tasks([task], tmp_path / "t.jsonl") == {"written": 1, "skipped_schema": 0}
    (back,) = load_tasks(tmp_path / "t.jsonl")
    assert back == task
    record = json.loads((tmp_path / "t.jsonl").read_text())
    record["checklists"][0][1][0]["weight"] = "heavy"
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskFormatError, match=r"bad.jsonl:1: field 'checklists\[0\]\[1\]\[0\].weight'"):
        load_tasks(tmp_path / "bad.jsonl")
    record["checklists"][0][1][0]["weight"] = 1
    record["checklists"][0][1][0]["colour"] = "red"
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskFormatError, match=r"field 'checklists\[0\]\[1\]\[0\].colour': unknown key"):
        load_tasks(tmp_path / "bad.jsonl")
    del record["checklists"]
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskFormatError, match=r"field 'success': needs at least one"):
        load_tasks(tmp_path / "bad.jsonl")


def _set(row: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node = row
    keys = path.split("/")
    for key in keys[:-1]:
        node = node[int(key) if key.isdigit() else key]
    last: Any = int(keys[-1]) if keys[-1].isdigit() else keys[-1]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return row


_DELETE = object()
CHECK = "extra_info/interaction_kwargs/checklist_list/0"
CK = r"extra_info.interaction_kwargs.checklist_list"


@pytest.mark.parametrize(("path", "value", "field", "problem"), [
    ("extra_info/tools", '{"name": "x"}', "extra_info.tools", "must be a list"),
    ("extra_info/tools", "[not json", "extra_info.tools", "not a JSON list"),
    ("extra_info/tools", [{"name": "get_weather"}], r"extra_info.tools\[0\]", "function schema"),
    ("extra_info/tools", json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]),
     r"extra_info.tools\[0\].function.parameters", "not a valid JSON schema"),
    ("extra_info/messages/4", _DELETE, r"extra_info.messages\[2\].tool_calls", "2 tool call\\(s\\) followed by 1"),
    ("extra_info/messages/2/tool_calls/0/function/arguments", "[1]",
     r"extra_info.messages\[2\].tool_calls\[0\].function.arguments", "JSON object string"),
    ("extra_info/messages/2/tool_calls/0/function/arguments", "{oops",
     r"extra_info.messages\[2\].tool_calls\[0\].function.arguments", "JSON object string"),
    ("extra_info/messages/7/tool_calls/0/function/arguments", '{"city": 5}',
     r"extra_info.messages\[7\].tool_calls\[0\].function", "city"),
    (CHECK + "/1", _DELETE, r"extra_info.interaction_kwargs.checklist_list\[0\]", "has 1 turns.*2 user turns"),
    (CHECK + "/0/1/weight", "0.3", CK + r"\[0\]\[0\]\[1\].weight", "finite number"),
    (CHECK + "/0/1/weight", math.inf, CK + r"\[0\]\[0\]\[1\].weight", "finite number"),
    (CHECK + "/1/0/required_for_next_turn", "yes", CK + r"\[0\]\[1\]\[0\].required_for_next_turn",
     "true or false"),
    (CHECK + "/0/0/question", _DELETE, CK + r"\[0\]\[0\]\[0\].question", "is required"),
    ("extra_info/interaction_kwargs", _DELETE, "extra_info.interaction_kwargs", "is required"),
    ("extra_info/messages", _DELETE, "extra_info.messages", "is required"),
    ("extra_info/original_index", _DELETE, "extra_info.original_index", "is required"),
    ("messages", _DELETE, "messages", "is required"),
])
def test_bad_row_names_row_and_field(tmp_path: Path, path: str, value: Any, field: str, problem: str) -> None:
    bad = make_row(2)
    if path == "extra_info/original_index":
        del bad["extra_info"]["index"]
    _set(bad, path, value)
    rows = [make_row(1), bad, make_row(3)]
    file = tmp_path / "rows.jsonl"
    file.write_text("\n".join(json.dumps(r, allow_nan=True) for r in rows) + "\n", encoding="utf-8")
    if value is math.inf:  # the JSON loaders refuse Infinity: check the converter directly
        with pytest.raises(TaskFormatError, match=rf"^row \(id 'orig-2'\): field '{field}': .*{problem}"):
            row_to_task(bad, where="row")
        return
    with pytest.raises(TaskFormatError, match=rf"rows.jsonl: row 1\b.*field '{field}': .*{problem}"):
        load_reference_rows(file)
    loaded = load_reference_rows(file, skip_invalid=True)
    assert [t.id for t in loaded.tasks] == ["orig-1", "orig-3"]
    assert len(loaded.skipped) == 1 and "row 1" in loaded.skipped[0]
    assert [t.id for t in load_task_set(f"reference-lenient:{file}")] == ["orig-1", "orig-3"]


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="not found"):
        load_reference_rows(tmp_path / "missing.json")
    with pytest.raises(TaskFormatError, match="unknown suffix"):
        load_reference_rows(tmp_path / "rows.csv")
    with pytest.raises(TaskFormatError, match="must hold a JSON list"):
        load_reference_rows(write_json({"rows": []}, tmp_path / "obj.json"))  # type: ignore[arg-type]
    with pytest.raises(TaskFormatError, match=r"row 1\b.*duplicate task id 'orig-1' \(first in row 0\)"):
        load_reference_rows(write_json([make_row(1), make_row(1)], tmp_path / "dup.json"))
    with pytest.raises(TaskFormatError, match="no valid rows"):
        load_reference_rows(write_json([{"messages": []}], tmp_path / "bad.json"), skip_invalid=True)


def test_scoring_a_checklist_task_does_not_need_a_success_spec() -> None:
    task = row_to_task(make_row(1))
    episode = Episode(task=task, group_index=0, messages=[], act=Sample([1], [2], [1], 2, 0, 0))  # type: ignore[arg-type]
    _score(episode, [lambda e: 0.25], None)  # type: ignore[list-item]
    assert (episode.reward, episode.success, episode.stats.failed) == (0.25, False, False)


def test_parquet_without_pyarrow_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow then raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"rows\.parquet needs pyarrow: pip install -e '\.\[parquet\]'"):
        load_reference_rows(tmp_path / "rows.parquet")
