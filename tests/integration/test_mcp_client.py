"""``envace.envs.mcp_client`` against a real MCP server process written to fail on demand (tests/fixtures).

Every test checks that no server process is left behind, including after the trainer process is SIGKILLed while the
server is blocked in a tool call (it would not notice its closed input).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_procs import FAULTY_SERVER as SERVER  # noqa: E402
from mcp_procs import gone as gone_with  # noqa: E402
from mcp_procs import new_token, none_left_behind  # noqa: E402
from mcp_procs import servers as servers_with  # noqa: E402

from envace.envs.mcp_client import MCPClient, MCPServerError, MCPTimeout, ServerCommand  # noqa: E402

TOKEN = new_token()
"""In the environment of every server these tests start: how ``servers`` tells them from any other process's."""


def faulty(*flags: str) -> ServerCommand:
    return ServerCommand(sys.executable, (str(SERVER), *flags), env=(TOKEN,))


FAULTY = faulty()


def servers() -> list[int]:
    return servers_with(TOKEN)


def gone(pid: int) -> bool:
    return gone_with(TOKEN, pid)


@pytest.fixture(autouse=True)
def no_server_left():
    with none_left_behind(TOKEN):
        yield


def test_tools_results_and_tool_errors() -> None:
    with MCPClient(FAULTY) as client:
        assert client.alive and client.pid in servers()
        tools = {tool["name"]: tool for tool in client.list_tools()}
        assert {"echo", "add", "fail", "sleep", "crash", "counter", "pid"} <= set(tools)
        assert tools["add"]["inputSchema"]["required"] == ["a", "b"]
        echo = client.call_tool("echo", {"text": "hi"})
        assert echo["content"] == [{"type": "text", "text": "hi"}] and echo["isError"] is False
        assert '"sum": 3' in client.call_tool("add", {"a": 1, "b": 2})["content"][0]["text"]
        assert client.call_tool("fail", {"reason": "nope"})["isError"] is True  # a tool error is a result
        assert client.call_tool("echo", {})["isError"] is True  # so are arguments the server rejects
        assert client.call_tool("pid", {})["content"][0]["text"] == str(client.pid)  # the launcher became the server
        assert client.alive
    assert not client.alive


def test_a_hung_call_times_out_and_the_server_is_stopped() -> None:
    client = MCPClient(FAULTY)
    pid = client.pid
    start = time.monotonic()
    with pytest.raises(MCPTimeout, match="tools/call sleep: no answer within 1 s"):
        client.call_tool("sleep", {"seconds": 60}, timeout_s=1)
    assert time.monotonic() - start < 5  # the SDK's timeout, not the backstop
    assert not client.alive  # its state is unknown: not used again
    with pytest.raises(MCPServerError, match="not running"):
        client.call_tool("echo", {"text": "x"})
    client.close()
    assert pid is not None and gone(pid)


def test_a_server_that_exits_mid_call_is_an_error_naming_the_call() -> None:
    client = MCPClient(FAULTY)
    with pytest.raises(MCPServerError, match="tools/call crash: .*Connection closed"):
        client.call_tool("crash", {})
    assert not client.alive
    client.close()


def test_a_server_that_does_not_start_is_an_error_with_its_log() -> None:
    with pytest.raises(MCPServerError, match="did not start(.|\n)*refusing to start"):
        MCPClient(faulty("--fail-start"), start_timeout_s=20)
    with pytest.raises(MCPServerError, match="cannot run '/no/such/server': No such file or directory"):
        MCPClient(ServerCommand("/no/such/server"), start_timeout_s=20)


def test_a_server_that_never_answers_initialize_times_out() -> None:
    silent = ServerCommand(sys.executable, ("-c", "import time; time.sleep(60)"), env=(TOKEN,))
    start = time.monotonic()
    with pytest.raises(MCPServerError, match="did not start"):
        MCPClient(silent, start_timeout_s=1)
    assert time.monotonic() - start < 15


def test_a_line_that_is_not_json_rpc_is_skipped_and_the_session_goes_on() -> None:
    with MCPClient(faulty("--garbage")) as client:
        assert client.call_tool("echo", {"text": "x"})["content"][0]["text"] == "x"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's")
def test_a_server_blocked_in_a_call_dies_with_a_sigkilled_trainer(tmp_path: Path) -> None:
    trainer = textwrap.dedent(f"""
        import sys, threading, time
        from envace.envs.mcp_client import MCPClient, ServerCommand
        client = MCPClient(ServerCommand({sys.executable!r}, ({str(SERVER)!r},), env=({TOKEN!r},)))
        threading.Thread(target=client.call_tool, args=("sleep", {{"seconds": 120}}, 300), daemon=True).start()
        time.sleep(1.0)
        print(client.pid, flush=True)
        time.sleep(300)
    """)
    # a SIGKILLed trainer cannot remove its server's process-id and log files: they go to this test's directory
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2], env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        pid = int(proc.stdout.readline())
        assert pid in servers()
        assert sorted(p.suffix for p in tmp_path.glob("envace-mcp-*")) == [".log", ".pid"]
        proc.kill()  # SIGKILL: no cleanup runs in the trainer
        proc.wait(timeout=30)
        assert gone(pid), "the server outlived its SIGKILLed trainer"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
