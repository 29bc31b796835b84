"""Real MCP servers as task environments: the SQLite server (``mcp-server-sqlite``, on the 1.x SDK in its own
environment) and the time server (``mcp-server-time``), both installed by scripts/setup_mcp_servers.sh. Episodes run
against them through ``envace.envs.mcp.MCPEnvironment`` with no code written for either; ``envace record`` records
references from them and replays them byte for byte. No server outlives a test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from helpers import ScriptedEngine  # noqa: E402
from mcp_procs import installed_server, new_token, none_left_behind  # noqa: E402

from envace.cli.command import run as envace  # noqa: E402
from envace.cli.record import RecordError  # noqa: E402
from envace.data.tasks import load_tasks  # noqa: E402
from envace.envs.mcp_pool import pool_counts  # noqa: E402
from envace.rollout.config import RolloutConfig  # noqa: E402
from envace.rollout.runner import EpisodeRunner  # noqa: E402
from envace.worlds import RealWorld  # noqa: E402

TOKEN = new_token()
SEED = ("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, copies INTEGER);"
        "INSERT INTO books VALUES (1, 'Dune', 2), (2, 'Emma', 0);")


@pytest.fixture(autouse=True)
def no_server_left():
    with none_left_behind(TOKEN, close_pools=True):
        yield


def sqlite_env() -> dict:
    return {"class_path": "envace.envs.mcp.MCPEnvironment",
            "init_args": {"command": installed_server("sqlite", "mcp-server-sqlite"), "args": ["--db-path", "{state}"],
                          "env": dict([TOKEN]), "seed_sql": SEED, "error_prefixes": ["Database error:", "Error:"]}}


def call(name: str, **arguments: str) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def lend_task(task_id: str, title: str) -> dict:
    return {"id": task_id, "messages": [{"role": "user", "content": f"Lend one copy of {title}."}],
            "success": {"calls": [{"name": "write_query", "arguments": {
                "query": f"UPDATE books SET copies = copies - 1 WHERE title = '{title}'"}}]},
            "environment": sqlite_env(),
            "reference": [call("read_query", query=f"SELECT copies FROM books WHERE title = '{title}'"),
                          call("write_query", query=f"UPDATE books SET copies = copies - 1 WHERE title = '{title}'"),
                          call("read_query", query="SELECT title, copies FROM books ORDER BY id"),
                          call("read_query", query="SELECT nope FROM books"),
                          {"role": "assistant", "content": "Done."}]}


def test_record_references_from_the_sqlite_server_and_replay_them_byte_for_byte(tmp_path: Path) -> None:
    tasks, recorded = tmp_path / "lend.jsonl", tmp_path / "lend.recorded.jsonl"
    tasks.write_text("".join(json.dumps(lend_task(f"lend-{i}", t)) + "\n" for i, t in enumerate(["Dune", "Emma"])))
    counts = envace(["record", "--tasks", str(tasks), "--out", str(recorded)])
    assert counts == {"tasks": 2, "calls": 8, "errors": 2}
    dune, emma = load_tasks(recorded)  # a valid task file, its tools from the server's tools/list
    assert {t["function"]["name"] for t in dune.tools} >= {"read_query", "write_query", "describe_table"}
    responses = [m["content"] for m in dune.reference if m["role"] == "tool"]
    assert responses == ["[{'copies': 2}]", "[{'affected_rows': 1}]",
                         "[{'title': 'Dune', 'copies': 1}, {'title': 'Emma', 'copies': 0}]",
                         '{"error": "Database error: no such column: nope"}']
    assert [m["content"] for m in emma.reference if m["role"] == "tool"][2] == (
        "[{'title': 'Dune', 'copies': 2}, {'title': 'Emma', 'copies': -1}]")  # each task from the initial state
    assert envace(["record", "--tasks", str(recorded), "--check"])["calls"] == 8
    lines = recorded.read_text().splitlines()
    tampered = json.loads(lines[1])
    tampered["reference"][3]["content"] = "[{'affected_rows': 2}]"
    (tmp_path / "tampered.jsonl").write_text(lines[0] + "\n" + json.dumps(tampered) + "\n")
    with pytest.raises(RecordError, match=r"tampered.jsonl:2: tool response 1 \(write_query\) replays differently"):
        envace(["record", "--tasks", str(tmp_path / "tampered.jsonl"), "--check"])


def test_sqlite_episodes_run_from_their_own_initial_state_on_one_server(tmp_path: Path, tiny_tokenizer) -> None:
    tasks, recorded = tmp_path / "lend.jsonl", tmp_path / "lend.recorded.jsonl"
    tasks.write_text(json.dumps(lend_task("lend-0", "Dune")) + "\n")
    envace(["record", "--tasks", str(tasks), "--out", str(recorded)])
    (task,) = load_tasks(recorded)
    def tool_call(name: str, query: str) -> str:
        return f'<tool_call>{json.dumps({"name": name, "arguments": {"query": query}})}</tool_call>'

    lend = tool_call("write_query", "UPDATE books SET copies = copies - 1 WHERE id = 1")
    look = tool_call("read_query", "SELECT copies FROM books WHERE id = 1")
    act = ScriptedEngine(tiny_tokenizer, [lend, lend, look, look, "Done.", "Done."])
    before = pool_counts().get("mcp/starts", 0)
    episodes = EpisodeRunner(tiny_tokenizer, RolloutConfig()).run([task, task], [0, 1], act, RealWorld())
    assert [e.messages[-2]["content"] for e in episodes] == ["[{'copies': 1}]"] * 2
    assert all(e.stats.real_calls == 2 and not e.stats.failed for e in episodes)
    assert pool_counts()["mcp/starts"] - before <= 1  # the recorded task's tools came from the started server


def test_the_time_server_runs_episodes_with_no_code_written_for_it(tmp_path: Path, tiny_tokenizer) -> None:
    environment = {"class_path": "envace.envs.mcp.MCPEnvironment", "init_args": {
        "command": installed_server("time", "mcp-server-time"), "args": ["--local-timezone", "UTC"],
        "env": dict([TOKEN])}}
    convert = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    task = {"id": "tokyo", "messages": [{"role": "user", "content": "What time is it in Tokyo at noon UTC?"}],
            "success": {"calls": [{"name": "convert_time", "arguments": convert}], "answer": {"contains": ["21:00"]}},
            "environment": environment,
            "reference": [call("convert_time", **convert), {"role": "assistant", "content": "21:00"}]}
    tasks, recorded = tmp_path / "time.jsonl", tmp_path / "time.recorded.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    envace(["record", "--tasks", str(tasks), "--out", str(recorded)])
    (loaded,) = load_tasks(recorded)
    assert {t["function"]["name"] for t in loaded.tools} == {"get_current_time", "convert_time"}
    response = json.loads(next(m["content"] for m in loaded.reference if m["role"] == "tool"))
    assert response["target"]["datetime"].endswith("T21:00:00+09:00")
    act = ScriptedEngine(tiny_tokenizer, ['<tool_call>{"name": "convert_time", "arguments": '
                                          + json.dumps(convert) + "}</tool_call>", "21:00"])
    (episode,) = EpisodeRunner(tiny_tokenizer, RolloutConfig()).run([loaded], [0], act, RealWorld())
    assert json.loads(episode.messages[2]["content"])["target"]["datetime"].endswith("T21:00:00+09:00")
    assert episode.final_answer == "21:00" and episode.stats.real_calls == 1


def test_record_names_what_it_cannot_record(tmp_path: Path) -> None:
    cases = [("[]", "a task must be a JSON object"),
             (json.dumps({"id": "x", "messages": []}), "field 'environment': a task to record needs its real"),
             (json.dumps({**lend_task("x", "Dune"), "reference": [call("nope")]}),
              r"field 'reference\[0\].tool_calls\[0\].function.name': the environment has no tool 'nope'"),
             (json.dumps({**lend_task("x", "Dune"), "reference": [{"role": "assistant", "tool_calls": [
                 {"function": {"name": "read_query", "arguments": "{bad"}}]}]}),
              r"field 'reference\[0\].tool_calls\[0\].function.arguments': not JSON")]
    for i, (line, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text("\n" + line + "\n")
        with pytest.raises(RecordError, match=rf"bad{i}.jsonl:2: {message}"):
            envace(["record", "--tasks", str(path), "--out", str(tmp_path / "out.jsonl")])
    assert not (tmp_path / "out.jsonl").exists()  # nothing written by a failed run
    with pytest.raises(RecordError, match="give --out to record, or --check"):
        envace(["record", "--tasks", str(path)])
