"""An MCP server as a task's real environment: a toolbox whose tools are the server's.

A task names it like any environment::

    "environment": {"class_path": "envace.envs.mcp.MCPEnvironment",
                    "init_args": {"command": ".venv-mcp/sqlite/bin/mcp-server-sqlite",
                                  "args": ["--db-path", "{state}"], "seed_sql": "CREATE TABLE ...; INSERT ..."}}

Every episode gets the task's initial state (``state`` copied, or ``seed_sql`` run into a new SQLite file), and the
server sees it at the path its command names with ``{state}``; episodes share a bounded pool of running servers
(``envace.envs.mcp_pool``), so a batch pays a server start once, not per episode or call. The tool schemas come from
the server's ``tools/list`` (``openai_tools``; ``envace mcp tools`` writes them for a task file); a call's result
becomes the tool message (``result_text``): its text, or its structured content as JSON, and ``{"error": ...}`` where
the server flags an error (``isError``) or its text starts with one of ``error_prefixes`` (servers that report
errors as plain text, like the SQLite server's ``Database error: ...``).

A server that fails (does not start, crashes, hangs past ``call_timeout_s``, breaks the protocol) fails the call's
episode with the cause; the pool drops it and starts another for the next call, and counts the fault
(``train/mcp/*``).
"""

from __future__ import annotations

import functools
import json
import weakref
from pathlib import Path
from typing import Any, Literal

from envace.envs.mcp_client import ServerCommand
from envace.envs.mcp_pool import STATE_MARK, ServerPool, StateMode, copy_state, shared_pool
from envace.envs.sqlite_state import SeedError, seed_database
from envace.errors import UserError


class MCPConfigError(UserError, ValueError):
    """An MCP environment's settings do not describe a server envace can run."""


class MCPEnvironment:
    """The tools of an MCP server (stdio), with the task's initial state per episode.

    Args:
        command: the server's executable (a path, or a name on ``PATH``).
        args: its arguments; ``{state}`` stands for the live state path (also in ``env`` values and ``cwd``).
        env: variables added to the server's environment.
        cwd: its working directory (None: the trainer's).
        state: the task's initial state, a file or a directory, copied for every episode (a database file, a
            repository); relative paths are taken from the trainer's working directory.
        seed_sql: instead of ``state``, an SQL script run by Python's ``sqlite3`` into a new database file: the
            initial state of a database server, carried in the task itself.
        keeps_state: where the server keeps what a call changes: ``"file"`` (the state path, reopened per call: the
            default with ``state`` or ``seed_sql``), ``"memory"`` (its process: restarted for each episode, with the
            episode's earlier calls replayed where it served another since) or ``"none"`` (no state: the default
            without one).
        error_prefixes: a text result that starts with one of these is a tool error (for servers that do not set
            ``isError``).
        tools: the tool names offered (None: every tool the server lists).
        call_timeout_s: most seconds a call may take; past it the server is killed, and the episode fails. Keep
            ``start_timeout_s + call_timeout_s`` under the world's ``tool_timeout_s``.
        start_timeout_s: most seconds a server may take to start and answer ``initialize``.
        max_servers: most servers of this command running at once (the pool is shared by all episodes and tasks
            with the same command, state mode and limits; each episode brings its own initial state).
        log_dir: keep each server's standard error there (``mcp-<n>.log``, made if missing); None: temporary files,
            removed with the server (a fault's message quotes their last lines either way).

    Raises:
        MCPConfigError: settings that cannot work (a state the command never names, both ``state`` and
            ``seed_sql``, a missing state file, a non-positive limit).
    """

    def __init__(self, command: str, args: list[str] | None = None, env: dict[str, str] | None = None,
                 cwd: str | None = None, state: str | None = None, seed_sql: str | None = None,
                 keeps_state: Literal["file", "memory", "none"] | None = None,
                 error_prefixes: list[str] | None = None, tools: list[str] | None = None,
                 call_timeout_s: float = 15.0, start_timeout_s: float = 10.0, max_servers: int = 4,
                 log_dir: str | None = None) -> None:
        server = ServerCommand(command, tuple(args or ()), tuple(sorted((env or {}).items())), cwd)
        mode = _mode(server, state, seed_sql, keeps_state)
        for name, value in (("call_timeout_s", call_timeout_s), ("start_timeout_s", start_timeout_s),
                            ("max_servers", max_servers)):
            if not value > 0:
                raise MCPConfigError(f"MCP environment: {name} must be > 0, got {value}")
        if seed_sql is not None:
            _database(seed_sql)  # a script that does not run is refused here, not in an episode's first call
        key = (server, mode, start_timeout_s, max_servers, log_dir)
        self._pool = shared_pool(key, lambda: ServerPool(server, mode, max_servers, start_timeout_s, log_dir=log_dir))
        self.error_prefixes = tuple(error_prefixes or ())
        self.call_timeout_s = call_timeout_s
        self._tools = tuple(tools) if tools is not None else None
        self._episode = self._pool.new_episode(_seed(state, seed_sql))
        weakref.finalize(self, self._pool.end_episode, self._episode)

    def tool_names(self) -> list[str]:
        """The tools offered: ``tools``, or every tool the server lists (asked once per pool)."""
        if self._tools is None:
            self._tools = tuple(tool["name"] for tool in self._pool.tools(self._episode))
        return list(self._tools)

    def server_tools(self) -> list[dict[str, Any]]:
        """The server's tools as the OpenAI function schemas a task lists (``envace record`` writes them)."""
        wire = self._pool.tools(self._episode)
        return openai_tools([t for t in wire if self._tools is None or t["name"] in self._tools])

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Call a tool in this episode's state; the tool message's text (``result_text``).

        Raises:
            MCPServerError: the server failed (the episode fails; the next call gets another server).
        """
        return result_text(self._pool.call(self._episode, name, arguments, self.call_timeout_s), self.error_prefixes)


def result_text(result: dict[str, Any], error_prefixes: tuple[str, ...] = ()) -> str:
    """The tool message of an MCP ``tools/call`` result (wire form).

    Text content, joined by newlines; without any, the structured content as JSON; other content (images, audio,
    resources) as a ``[type: ...]`` placeholder. A result flagged ``isError``, or whose text starts with one of
    ``error_prefixes``, is an error object ``{"error": text}`` (``envace.types.is_error_value``).
    """
    parts = [_content_text(item) for item in result.get("content") or []]
    text = "\n".join(p for p in parts if p)
    if not text and result.get("structuredContent") is not None:
        text = json.dumps(result["structuredContent"], ensure_ascii=False)
    if result.get("isError") or any(text.startswith(prefix) for prefix in error_prefixes):
        return json.dumps({"error": text or "the tool reported an error"}, ensure_ascii=False)
    return text


def openai_tools(wire_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP tools (``tools/list``, wire form) as the OpenAI function schemas a task lists."""
    schemas = []
    for tool in wire_tools:
        parameters = dict(tool.get("inputSchema") or {"type": "object", "properties": {}})
        parameters.pop("$schema", None)
        function = {"name": tool["name"], "description": tool.get("description") or tool.get("title") or "",
                    "parameters": parameters}
        schemas.append({"type": "function", "function": function})
    return schemas


def _content_text(item: dict[str, Any]) -> str:
    kind = item.get("type")
    if kind == "text":
        return item.get("text", "")
    if kind == "resource":
        resource = item.get("resource") or {}
        return resource.get("text") or f"[resource: {resource.get('uri', '')}]"
    if kind == "resource_link":
        return f"[resource: {item.get('uri', '')}]"
    return f"[{kind}: {item.get('mimeType', '')}]"


def _mode(server: ServerCommand, state: str | None, seed_sql: str | None,
          keeps_state: Literal["file", "memory", "none"] | None) -> StateMode:
    where = f"MCP environment `{server.describe()}`"
    if state is not None and seed_sql is not None:
        raise MCPConfigError(f"{where}: give its initial state as 'state' (a path) or 'seed_sql', not both")
    has_state = state is not None or seed_sql is not None
    named = any(STATE_MARK in text for text in (*server.args, *(v for _, v in server.env), server.cwd or ""))
    if has_state and not named:
        raise MCPConfigError(f"{where}: its initial state is never shown to the server: name the state path with "
                             f"'{STATE_MARK}' in its args, env or cwd")
    if named and not has_state:
        raise MCPConfigError(f"{where}: its command names '{STATE_MARK}' but no initial state is given "
                             "('state' or 'seed_sql')")
    if state is not None and not Path(state).exists():
        raise MCPConfigError(f"{where}: its initial state '{state}' does not exist")
    keeps = keeps_state or ("file" if has_state else "none")
    if keeps == "file" and not has_state:
        raise MCPConfigError(f"{where}: keeps_state 'file' needs the initial state ('state' or 'seed_sql')")
    return {"file": "file", "memory": "restart", "none": "none"}[keeps]  # type: ignore[return-value]


def _database(seed_sql: str) -> bytes:
    try:
        return seed_database(seed_sql)
    except SeedError as exc:
        raise MCPConfigError(f"MCP environment: {exc}") from exc


def _seed(state: str | None, seed_sql: str | None) -> Any:
    """What makes a fresh initial state at a path: a copy of ``state``, or ``seed_sql`` run into a new database."""
    if state is not None:
        return functools.partial(copy_state, Path(state).resolve())
    if seed_sql is not None:
        def build(target: Path) -> None:
            target.write_bytes(_database(seed_sql))

        return build
    return None
