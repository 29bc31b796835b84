"""A task's database state as a success item: the episode's writes run on a private copy of its seeded database
(``envace.envs.sqlite_state``), checked against the rows the task expects; the task format reads and writes it."""

from __future__ import annotations

import json

import pytest

from envace.data.task_parsing import parse_task
from envace.data.task_records import task_to_record
from envace.data.task_schema import TaskFormatError
from envace.envs.sqlite_state import SeedError, final_tables, seed_database
from envace.rewards.task_success import state_matches, task_score
from envace.types import ToolCall

SEED = ("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, copies INTEGER);"
        "INSERT INTO books VALUES (1, 'Dune', 2), (2, 'Emma', 0);")
TOOLS = [{"type": "function", "function": {"name": name, "description": "", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    for name in ("read_query", "write_query")]


def record(**success) -> dict:
    return {"id": "lend", "messages": [{"role": "user", "content": "Lend Dune."}], "tools": TOOLS,
            "success": success, "environment": {"class_path": "envace.envs.mcp.MCPEnvironment", "init_args": {
                "command": "mcp-server-sqlite", "args": ["--db-path", "{state}"], "seed_sql": SEED}}}


LENT = {"books": [[1, "Dune", 1], [2, "Emma", 0]]}


def write(query: str) -> ToolCall:
    return ToolCall("write_query", {"query": query})


def test_writes_run_as_the_server_runs_them_on_a_fresh_copy() -> None:
    assert final_tables(SEED, []) == {"books": [[1, "Dune", 2], [2, "Emma", 0]]}
    assert final_tables(SEED, [
        "UPDATE books SET copies = copies - 1 WHERE id = 1",
        "SELECT * FROM books",                                  # a read changes nothing
        "UPDATE nope SET x = 1",                                # a failing statement changes nothing
        "DELETE FROM books WHERE id = 2; DELETE FROM books",    # two statements: refused, as the server does
        "BEGIN",                                                # not committed: rolled back
    ]) == LENT
    assert final_tables(SEED, ["CREATE TABLE loans (book INTEGER)", "INSERT INTO loans VALUES (1)"]) == {
        "books": [[1, "Dune", 2], [2, "Emma", 0]], "loans": [[1]]}
    assert seed_database(SEED).startswith(b"SQLite format 3\x00")
    with pytest.raises(SeedError, match="no such table: t"):
        seed_database("INSERT INTO t VALUES (1)")


def test_any_statement_with_the_right_effect_succeeds_and_others_fail() -> None:
    task = parse_task(record(state={"tables": {"books": [[2, "Emma", 0], [1, "Dune", 1.0]]}}))  # any order; 1.0 == 1
    assert task.success.state is not None and task.success.state.writes == {"write_query": "query",
                                                                            "create_table": "query"}
    assert state_matches(task, [write("UPDATE books SET copies = 1 WHERE title = 'Dune'")])
    assert state_matches(task, [ToolCall("read_query", {"query": "SELECT 1"}),
                                write("UPDATE books SET copies = copies - 1 WHERE id = 1")])
    assert not state_matches(task, [])  # nothing written
    assert not state_matches(task, [write("UPDATE books SET copies = copies - 1")])  # Emma too
    assert not state_matches(task, [write("UPDATE books SET copies = 1 WHERE id = 1"),
                                    write("CREATE TABLE junk (x)")])  # an extra table
    assert task_score(task, [write("UPDATE books SET copies = 1 WHERE id = 1")], None) == 1.0


def test_state_weighs_with_the_answer_and_round_trips() -> None:
    task = parse_task(record(state={"tables": LENT, "weight": 3}, answer={"equals": "1 left"}))
    lend = [write("UPDATE books SET copies = 1 WHERE id = 1")]
    assert task_score(task, lend, "2 left") == pytest.approx(3 / 4)  # state (3) of state + answer (1)
    assert task_score(task, [], "1 left") == pytest.approx(1 / 4)
    again = parse_task(json.loads(json.dumps(task_to_record(task))))
    assert again == task


@pytest.mark.parametrize(("state", "env_args", "message"), [
    ({"tables": LENT}, {"command": "x"}, "success.state': needs the task's initial database"),
    ({"tables": {"books": [1, 2]}}, None, "success.state.tables': must map each table name to a list of rows"),
    ({"tables": LENT, "writes": {"write_query": "sql"}}, None,
     "success.state.writes.write_query': 'write_query' has no parameter \"sql\""),
    ({"tables": LENT, "extra": 1}, None, "success.state"),
    ({"tables": LENT}, {"command": "x", "args": ["{state}"], "seed_sql": "INSERT INTO t VALUES (1)"},
     "environment.init_args.seed_sql': seed_sql does not run: no such table: t"),
])
def test_a_state_that_cannot_be_checked_is_refused_naming_the_field(state, env_args, message) -> None:
    rec = record(state=state)
    if env_args is not None:
        rec["environment"]["init_args"] = env_args
    with pytest.raises(TaskFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_task(rec)
