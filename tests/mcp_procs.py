"""Finding the MCP server processes a test module started: every server it starts carries a token of its own in its
environment, so a test can tell them from any other process's (other test workers' servers included)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

FAULTY_SERVER = Path(__file__).parent / "fixtures" / "mcp_faulty_server.py"
"""A deliberately faulty MCP server (tests/fixtures/mcp_faulty_server.py)."""


def new_token() -> tuple[str, str]:
    """An environment variable (name, value) to mark one module's servers with."""
    return "ENVACE_TEST_MCP", uuid.uuid4().hex


def servers(token: tuple[str, str]) -> list[int]:
    """Process ids of the running (not zombie) processes whose environment holds ``token``."""
    marker = "=".join(token).encode()
    return _processes(lambda entry: marker in (entry / "environ").read_bytes().split(b"\0"))


def gone(token: tuple[str, str], pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` is no longer among ``servers(token)`` within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if pid not in servers(token):
            return True
        time.sleep(0.05)
    return False


@contextmanager
def none_left_behind(token: tuple[str, str], close_pools: bool = False) -> Iterator[None]:
    """Fail if a server marked with ``token`` that was not running before is still running after (and kill it).

    ``close_pools``: first stop every pool of servers the block left (``envace.envs.mcp_pool.close_pools``).
    """
    before = set(servers(token))
    try:
        yield
    finally:
        if close_pools:
            from envace.envs.mcp_pool import close_pools as close

            close()
    left = [pid for pid in set(servers(token)) - before if not gone(token, pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"server processes left behind: {left}"


def installed_server(name: str, executable: str) -> str:
    """The executable of a real MCP server that scripts/setup_mcp_servers.sh installs in ``.venv-mcp/NAME``.

    Missing, the calling test is skipped, unless ``ENVACE_TEST_MCP_SERVERS=required`` (scripts/test.sh, so CI), where
    it fails: CI must run the real servers.
    """
    import pytest

    path = Path(__file__).parents[1] / ".venv-mcp" / name / "bin" / executable
    if not path.is_file():
        message = f"{path} is not installed (bash scripts/setup_mcp_servers.sh)"
        if os.environ.get("ENVACE_TEST_MCP_SERVERS") == "required":
            pytest.fail(message)
        pytest.skip(message)
    return str(path)


def processes_with(text: str) -> list[int]:
    """Process ids of the running processes whose command line holds ``text`` (e.g. a server pool's directory)."""
    return _processes(lambda entry: text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
        errors="replace"))


def _processes(match: Callable[[Path], bool]) -> list[int]:
    """Process ids of the running (not zombie) processes other than this one whose ``/proc`` entry ``match``es."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(") ", 1)[1][:1]
            if state not in ("Z", "X") and match(entry):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found
