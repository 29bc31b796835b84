"""``envace.envs.mcp``: an MCP server as a task's environment, on a real server process written to fail on demand
(tests/fixtures/mcp_faulty_server.py). Episodes get the task's initial state each, share a bounded pool of servers,
and a server that fails fails its call's episode, is replaced, and is counted. No server outlives a test."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_procs import FAULTY_SERVER, new_token, none_left_behind, servers  # noqa: E402

from envace.envs.mcp import MCPConfigError, MCPEnvironment, openai_tools, result_text  # noqa: E402
from envace.envs.mcp_client import MCPServerError, MCPTimeout  # noqa: E402
from envace.envs.mcp_pool import MCPReplayError, pool_counts  # noqa: E402
from envace.envs.real import RealEnvironment  # noqa: E402
from envace.types import EnvSpec, ToolCall  # noqa: E402
from envace.worlds.base import ToolRequest  # noqa: E402
from envace.worlds.real import RealWorld  # noqa: E402

TOKEN = new_token()


def env(*flags: str, **kwargs) -> MCPEnvironment:
    return MCPEnvironment(sys.executable, [str(FAULTY_SERVER), *flags], env=dict([TOKEN]), **kwargs)


@pytest.fixture(autouse=True)
def no_server_left():
    with none_left_behind(TOKEN, close_pools=True):
        yield


def test_episodes_see_their_own_copy_of_the_initial_state_through_one_server(tmp_path: Path) -> None:
    seed = tmp_path / "seed.txt"
    seed.write_text("seed\n")
    a, b = (env("--state", "{state}", state=str(seed), max_servers=1) for _ in range(2))
    assert a.call_tool("note", {"text": "a"}) == "noted"
    assert b.call_tool("note", {"text": "b"}) == "noted"
    assert a.call_tool("notes", {}) == "seed\na\n"
    assert b.call_tool("notes", {}) == "seed\nb\n"
    assert seed.read_text() == "seed\n"  # the task's state is never written
    counts = pool_counts()
    assert counts["mcp/starts"] == 1 and counts["mcp/calls"] == 4  # one server served both episodes
    assert len(servers(TOKEN)) == 1


def test_a_server_that_keeps_state_in_memory_is_restarted_per_episode_and_replayed() -> None:
    a, b = env(keeps_state="memory", max_servers=1), env(keeps_state="memory", max_servers=1)
    assert a.call_tool("counter", {}) == "1"
    assert b.call_tool("counter", {}) == "1"  # a fresh server for b (one server at most)
    assert a.call_tool("counter", {}) == "2"  # a's earlier call replayed on a restarted server first
    counts = pool_counts()
    assert counts["mcp/starts"] == 3 and counts["mcp/replayed_calls"] == 1 and counts["mcp/calls"] == 3
    c = env(keeps_state="memory", max_servers=2)  # another pool: two servers, no restart needed
    d = env(keeps_state="memory", max_servers=2)
    assert [c.call_tool("counter", {}), d.call_tool("counter", {}), c.call_tool("counter", {})] == ["1", "1", "2"]
    assert pool_counts()["mcp/starts"] == 5


def test_a_server_whose_replay_differs_fails_the_episode() -> None:
    a, b = env(keeps_state="memory", max_servers=1), env(keeps_state="memory", max_servers=1)
    a.call_tool("pid", {})
    b.call_tool("pid", {})
    with pytest.raises(MCPReplayError, match="not deterministic"):
        a.call_tool("echo", {"text": "x"})  # replaying a's pid call on a new server answers another pid
    assert env(keeps_state="memory", max_servers=1).call_tool("echo", {"text": "y"}) == "y"  # the pool goes on


def test_tools_results_and_errors_become_tool_messages() -> None:
    e = env(error_prefixes=["Database error:"])
    assert {"echo", "add", "fail", "sleep", "crash", "counter", "pid"} <= set(e.tool_names())
    assert e.call_tool("echo", {"text": "hi"}) == "hi"
    assert json.loads(e.call_tool("add", {"a": 1, "b": 2})) == {"sum": 3}
    assert json.loads(e.call_tool("fail", {"reason": "nope"})) == {"error": "Error executing tool fail"}  # isError
    assert json.loads(e.call_tool("echo", {"text": "Database error: no such table"})) == {
        "error": "Database error: no such table"}  # a prefix the server does not flag
    schemas = {s["function"]["name"]: s for s in openai_tools([{"name": "add", "inputSchema": {
        "$schema": "x", "type": "object", "properties": {"a": {"type": "integer"}}}}])}
    assert schemas["add"] == {"type": "function", "function": {
        "name": "add", "description": "", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
    assert result_text({"content": [], "structuredContent": {"x": 1}}) == '{"x": 1}'
    assert result_text({"content": [{"type": "image", "mimeType": "image/png", "data": ""}]}) == "[image: image/png]"
    assert json.loads(result_text({"content": [], "isError": True})) == {"error": "the tool reported an error"}


def test_a_crash_and_a_hang_fail_the_call_and_the_next_call_gets_a_new_server() -> None:
    e = env(call_timeout_s=1)
    first = e.call_tool("pid", {})
    with pytest.raises(MCPServerError, match="tools/call crash"):
        e.call_tool("crash", {})
    second = e.call_tool("pid", {})
    assert second != first
    start = time.monotonic()
    with pytest.raises(MCPTimeout, match="no answer within 1 s"):
        e.call_tool("sleep", {"seconds": 60})
    assert time.monotonic() - start < 10
    assert e.call_tool("pid", {}) not in (first, second)
    counts = pool_counts()
    assert (counts["mcp/crashes"], counts["mcp/timeouts"], counts["mcp/starts"]) == (1, 1, 3)


def test_a_server_that_cannot_start_fails_fast_after_three_tries(tmp_path: Path) -> None:
    e = env("--fail-start", log_dir=str(tmp_path / "logs"))
    for _ in range(3):
        with pytest.raises(MCPServerError, match="refusing to start"):
            e.call_tool("echo", {"text": "x"})
    start = time.monotonic()
    with pytest.raises(MCPServerError, match="not restarted for .* after 3 failed starts"):
        e.call_tool("echo", {"text": "x"})
    assert time.monotonic() - start < 0.5
    assert pool_counts()["mcp/start_failures"] == 3
    assert [p.read_text().strip() for p in sorted((tmp_path / "logs").iterdir())] == ["faulty: refusing to start"] * 3


def test_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MCPConfigError, match="never shown to the server"):
        env(seed_sql="CREATE TABLE t (x)")
    with pytest.raises(MCPConfigError, match="no initial state is given"):
        env("--state", "{state}")
    with pytest.raises(MCPConfigError, match="not both"):
        env("--state", "{state}", state=str(tmp_path), seed_sql="")
    with pytest.raises(MCPConfigError, match="does not exist"):
        env("--state", "{state}", state=str(tmp_path / "missing.db"))
    with pytest.raises(MCPConfigError, match="call_timeout_s must be > 0"):
        env(call_timeout_s=0)


def test_a_task_environment_runs_in_the_real_world_and_a_crash_fails_only_its_episode() -> None:
    spec = EnvSpec("envace.envs.mcp.MCPEnvironment",
                   {"command": sys.executable, "args": [str(FAULTY_SERVER)], "env": dict([TOKEN])})
    world = RealWorld(tool_timeout_s=30)
    good, bad = RealEnvironment(spec), RealEnvironment(spec)  # what RealWorld.open builds for a task

    def request(handle: RealEnvironment, name: str, arguments: dict) -> ToolRequest:
        return ToolRequest(None, ToolCall(name, arguments), [], handle, 0, 0)  # type: ignore[arg-type]

    replies = world.respond([request(good, "echo", {"text": "ok"}), request(bad, "crash", {})], None, None)
    assert replies[0].content == "ok" and replies[0].ok and replies[0].real_calls == 1
    assert replies[1].failure is not None and "tools/call crash" in replies[1].failure
    assert world.respond([request(good, "echo", {"text": "again"})], None, None)[0].content == "again"
    assert good.tool_names == bad.tool_names and "echo" in good.tool_names


def test_a_seed_script_that_does_not_run_is_refused_at_once() -> None:
    with pytest.raises(MCPConfigError, match="seed_sql does not run: .*no such table: missing"):
        env("--state", "{state}", seed_sql="INSERT INTO missing VALUES (1)")


def test_a_real_world_runs_episodes_calls_at_once_and_each_episodes_in_order() -> None:
    spec = EnvSpec("envace.envs.mcp.MCPEnvironment", {"command": sys.executable, "args": [str(FAULTY_SERVER)],
                                                      "env": dict([TOKEN]), "keeps_state": "memory",
                                                      "max_servers": 3})
    envs = [RealEnvironment(spec) for _ in range(3)]

    def request(handle: RealEnvironment, name: str, arguments: dict) -> ToolRequest:
        return ToolRequest(None, ToolCall(name, arguments), [], handle, 0, 0)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        RealWorld(concurrency=0)
    world = RealWorld(concurrency=3)
    requests = [request(env, "sleep", {"seconds": 2}) for env in envs]
    requests += [request(envs[0], "counter", {}), request(envs[0], "counter", {})]  # one episode's two calls
    replies = world.respond(requests, None, None)  # type: ignore[arg-type]
    assert [r.content for r in replies] == ["slept 2.0"] * 3 + ["1", "2"]  # in order, per episode too
    assert pool_counts()["mcp/starts"] == 3  # three calls held three servers at once
