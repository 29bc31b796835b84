"""``PATH:N`` task specs: the first N tasks of a file (and of reference rows), and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_row

from envace.builtin.task_sets import load_task_set
from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks


def record(task_id: str) -> dict:
    return {
        "id": task_id,
        "messages": [{"role": "user", "content": "Balance of A1?"}],
        "success": {"answer": {"equals": "120"}},
        "environment": {"class_path": "envace.builtin.bank.Bank", "init_args": {"balances": {"A1": 120}}},
    }


def write(path: Path, ids: list[str], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(record(i)) + "\n" for i in ids) + tail, encoding="utf-8")
    return path


def test_path_count_takes_the_first_n_tasks(tmp_path: Path) -> None:
    path = write(tmp_path / "tasks.jsonl", ["a", "b", "c", "d"])
    assert [t.id for t in load_task_set(f"{path}:2")] == ["a", "b"]
    assert [t.id for t in load_task_set(f"{path}:4")] == ["a", "b", "c", "d"]
    assert [t.id for t in load_task_set(str(path))] == ["a", "b", "c", "d"]


def test_lines_after_the_first_n_are_not_read(tmp_path: Path) -> None:
    path = write(tmp_path / "tasks.jsonl", ["a", "b"], tail="{not json\n")
    assert [t.id for t in load_task_set(f"{path}:2")] == ["a", "b"]
    assert [t.id for t in load_tasks(path, limit=1)] == ["a"]
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:3: invalid JSON"):
        load_task_set(str(path))


def test_a_path_may_hold_colons(tmp_path: Path) -> None:
    folder = tmp_path / "run:7" / "v:2"
    folder.mkdir(parents=True)
    path = write(folder / "tasks.jsonl", ["a", "b", "c"])
    assert [t.id for t in load_task_set(str(path))] == ["a", "b", "c"]
    assert [t.id for t in load_task_set(f"{path}:1")] == ["a"]


def test_an_existing_file_of_the_full_name_wins_over_a_count(tmp_path: Path) -> None:
    write(tmp_path / "tasks.jsonl", ["short-a", "short-b", "short-c"])
    literal = write(tmp_path / "tasks.jsonl:2", ["full-a", "full-b", "full-c"])
    assert [t.id for t in load_task_set(str(literal))] == ["full-a", "full-b", "full-c"]
    assert [t.id for t in load_task_set(f"{literal}:1")] == ["full-a"]  # a count of the file named 'tasks.jsonl:2'


@pytest.mark.parametrize("count", ["0", "-3"])
def test_a_count_below_one_is_an_error(tmp_path: Path, count: str) -> None:
    path = write(tmp_path / "tasks.jsonl", ["a"])
    with pytest.raises(TaskFormatError) as info:
        load_task_set(f"{path}:{count}")
    assert str(info.value) == f"'{path}:{count}': the task count after ':' must be an integer >= 1, got {int(count)}"


def test_fewer_tasks_than_asked_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "tasks.jsonl", ["a", "b", "c"])
    with pytest.raises(TaskFormatError) as info:
        load_task_set(f"{path}:5")
    assert str(info.value) == (f"'{path}:5': asks for the first 5 tasks, but {path} holds only 3; ask for at most 3, "
                               "or drop ':5' to load them all")


def test_a_missing_file_names_both_readings(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TaskFormatError) as info:
        load_task_set(f"{missing}:3")
    assert str(info.value) == (f"task file not found: neither {missing}:3 nor {missing} (read as its first 3 tasks) "
                               "exists")
    with pytest.raises(TaskFormatError, match="task file not found"):
        load_task_set(str(missing))


def test_reference_rows_take_a_count_too(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [make_row(1), make_row(2), {"not": "a row"}, make_row(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert [t.id for t in load_task_set(f"reference-lenient:{path}:2")] == ["orig-1", "orig-2"]
    assert [t.id for t in load_task_set(f"reference-lenient:{path}:3")] == ["orig-1", "orig-2", "orig-3"]
    with pytest.raises(TaskFormatError, match=r"asks for the first 4 tasks, but .*rows\.jsonl holds only 3"):
        load_task_set(f"reference-lenient:{path}:4")
    with pytest.raises(TaskFormatError, match=r"must be an integer >= 1, got 0"):
        load_task_set(f"reference:{path}:0")


def test_builtin_counts_are_unchanged() -> None:
    assert len(load_task_set("builtin:bank:3")) == 3
    with pytest.raises(TaskFormatError, match="must be an integer in 1"):
        load_task_set("builtin:bank:0")
