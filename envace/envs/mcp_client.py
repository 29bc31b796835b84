"""A synchronous client of one MCP server over stdio, on the ``mcp`` SDK.

The SDK is asynchronous and its sessions must be entered and left by one task, while envace's rollouts call tools
from plain code. So each ``MCPClient`` runs an event loop on a daemon thread of its own: one owner coroutine starts
the server (through ``envace.envs.mcp_launch``, so the server dies with the trainer, SIGKILL included), initialises
the session and waits until ``close``; requests are coroutines submitted to that loop, each with a timeout.

Every failure of the server itself (it does not start, exits, hangs past the timeout, answers something that is not
MCP) raises ``MCPServerError`` with the cause and the last lines the server wrote to its log; a tool's own error is
a normal result (``isError``). A client whose server failed is dead (``alive`` is False) and is not used again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAUNCHER = Path(__file__).with_name("mcp_launch.py")
"""Run by path (it imports only the standard library), so the server's environment needs no path to envace."""

DEFAULT_START_TIMEOUT_S = 60.0
"""Seconds a server may take to start and answer ``initialize``."""


class MCPServerError(RuntimeError):
    """The server failed: it did not start, exited, or broke the protocol (the message says which, and its log)."""


class MCPTimeout(MCPServerError):
    """The server did not answer within the timeout."""


@dataclass(frozen=True)
class ServerCommand:
    """How to start an MCP server over stdio.

    Attributes:
        command: the executable (a path, or a name found on ``PATH``).
        args: its arguments.
        env: variables added to the server's environment (the SDK passes only a safe few of the trainer's: HOME,
            PATH, USER and the like).
        cwd: its working directory (None: the trainer's).
    """

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=())
    cwd: str | None = None

    def describe(self) -> str:
        """``command arg ...``, for messages."""
        return " ".join([self.command, *self.args])


class MCPClient:
    """One running MCP server and its initialised session.

    Args:
        server: how to start it.
        start_timeout_s: most seconds to start and initialise.
        log_path: file for the server's standard error (None: a temporary file, removed at ``close``).

    Raises:
        MCPServerError: the server did not start or did not initialise (with its log's last lines).
    """

    def __init__(self, server: ServerCommand, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 log_path: str | os.PathLike[str] | None = None) -> None:
        self.server = server
        self._own_log = log_path is None
        fd, pid_file = tempfile.mkstemp(prefix="envace-mcp-", suffix=".pid")
        os.close(fd)
        self._pid_file = Path(pid_file)
        self.log_path = Path(log_path) if log_path is not None else self._pid_file.with_suffix(".log")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the server writes to it until close
        self.pid: int | None = None
        self.failed: str | None = None
        self._session: Any = None
        self._closed = False
        self._stop: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"envace-mcp-{server.command}",
                                        daemon=True)
        self._thread.start()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._owner = asyncio.run_coroutine_threadsafe(self._own(ready, start_timeout_s), self._loop)
        try:
            ready.result(timeout=start_timeout_s + 5)
        except BaseException as exc:  # noqa: BLE001 - every start failure is reported the same way, with its cause
            timed_out = isinstance(exc, concurrent.futures.TimeoutError | TimeoutError)
            cause = f"no answer within {start_timeout_s:g} s" if timed_out else _cause(exc)
            message = self._message(f"did not start ({cause})")  # before close removes the log
            self.pid = self.pid or _read_pid(self._pid_file)  # a server that started but never answered: killed
            self.close(hard=True)
            raise MCPServerError(message) from None

    async def _own(self, ready: concurrent.futures.Future[None], start_timeout_s: float) -> None:
        import anyio
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self._stop = asyncio.Event()
        params = StdioServerParameters(
            command=sys.executable,
            args=[str(LAUNCHER), str(os.getpid()), str(self._pid_file), self.server.command, *self.server.args],
            env=dict(self.server.env), cwd=self.server.cwd)
        try:
            async with stdio_client(params, errlog=self._log) as (read, write), ClientSession(read, write) as session:
                with anyio.fail_after(start_timeout_s):
                    await session.initialize()
                self.pid = _read_pid(self._pid_file)
                self._session = session
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif not self._closed:
                self.failed = self.failed or _cause(exc)
            raise
        finally:
            self._session = None

    @property
    def alive(self) -> bool:
        """Whether the session is up and the server process runs."""
        return (not self._closed and self.failed is None and self._session is not None
                and not self._owner.done() and _running(self.pid))

    def list_tools(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every tool the server offers, in MCP's wire form (``name``, ``description``, ``inputSchema``...).

        Raises:
            MCPServerError: the server failed (``MCPTimeout``: no answer within ``timeout_s``).
        """
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self._request(self._list_page(cursor), timeout_s, "tools/list")
            tools += [_wire(tool) for tool in page.tools]
            cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
            if not cursor:
                return tools

    async def _list_page(self, cursor: str | None) -> Any:
        if cursor is None:
            return await self._session.list_tools()
        from mcp.types import PaginatedRequestParams

        return await self._session.list_tools(params=PaginatedRequestParams(cursor=cursor))

    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Call one tool; its result in MCP's wire form (``content``, ``structuredContent``, ``isError``).

        A tool's own failure is a result with ``isError`` true, not an exception.

        Raises:
            MCPServerError: the server failed (``MCPTimeout``: no answer within ``timeout_s``; the SDK then cancels
                the request on the server).
        """
        # the SDK's own timeout answers first (and cancels the request on the server); 5 s more are a backstop
        result = self._request(self._session_call(name, arguments, timeout_s), timeout_s, f"tools/call {name}", 5.0)
        wire = _wire(result)
        wire.pop("resultType", None)  # a client-side default of the 2.x SDK, not part of the server's answer
        return wire

    async def _session_call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        return await self._session.call_tool(name, arguments, read_timeout_seconds=timeout_s)

    def _request(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float, what: str, grace_s: float = 0.0
                 ) -> Any:
        if not self.alive:
            coroutine.close()
            raise MCPServerError(self._message(f"{what}: the server is not running ({self.failed or 'closed'})"))
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=timeout_s + grace_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            cause = "timed out"
        except Exception as exc:  # noqa: BLE001 - the SDK's errors (closed connection, protocol) all mean "failed"
            cause = _cause(exc)
        if "timed out" in cause.lower():  # the backstop's, or the SDK's own (its wording differs between versions)
            self.failed = f"{what}: no answer within {timeout_s:g} s"
            raise MCPTimeout(self._message(self.failed))
        if not _running(self.pid) or "closed" in cause.lower():
            self.failed = f"{what}: {cause}"
        raise MCPServerError(self._message(f"{what}: {cause}"))

    def kill(self) -> None:
        """SIGKILL the server process now."""
        if self.pid is not None and _running(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self, hard: bool = False, timeout_s: float = 10.0) -> None:
        """Stop the session and the server (``hard``: SIGKILL first, instead of closing its input and waiting)."""
        if self._closed:
            return
        self._closed = True
        if hard or self.failed is not None:
            self.kill()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._owner.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self.kill()
        except BaseException:  # noqa: BLE001, S110 - a failed server's error was reported when it happened
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self.kill()  # the server is gone by now; this makes sure
        self._log.close()
        self._pid_file.unlink(missing_ok=True)
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 5) -> str:
        """The last ``lines`` lines of the server's standard error."""
        try:
            self._log.flush()
            text = self.log_path.read_text(errors="replace")
        except (OSError, ValueError):
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _message(self, what: str) -> str:
        tail = self.log_tail()
        return f"MCP server `{self.server.describe()}`: {what}" + (f"; its log ends:\n{tail}" if tail else "")

    def __enter__(self) -> MCPClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _wire(model: Any) -> dict[str, Any]:
    """An SDK result as MCP's wire form (camelCase names under both SDK majors)."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def _cause(exc: BaseException) -> str:
    """One line for an exception, anyio's exception groups flattened."""
    inner = getattr(exc, "exceptions", None)  # an exception group (anyio's task groups raise them)
    if isinstance(inner, tuple) and inner:
        return "; ".join(_cause(e) for e in inner)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _running(pid: int | None) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    if pid is None:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # no /proc: ask the kernel
        except OSError:
            return False
        return True
    return state not in ("Z", "X")
