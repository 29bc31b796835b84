"""A bounded pool of running MCP servers of one command, shared by every episode that uses it.

Starting a server costs about a second (a Python process, the SDK's imports, ``initialize``) and a call a few
milliseconds, so episodes never start a server per call: the pool keeps up to ``max_servers`` of them running and
lends one for each call. What an episode sees of the server's state depends on how the server keeps it
(``StateMode``):

- ``"none"``: the server keeps no state an episode could change (a clock, a read-only catalogue). Any server answers.
- ``"file"``: the server reads and writes its state in a file or directory that it reopens per call (the SQLite
  server reopens its database per query; a git server reads its repository). Each server has a live path, named in
  its command by ``{state}``; an episode has a private copy of the task's initial state, copied over the live path
  before each of its calls and back after. So episodes share servers and never see each other's writes.
- ``"restart"``: the server keeps its state in memory. A server serves one episode at a time: it is restarted (its
  live path, if any, seeded afresh) for an episode that it did not serve last, and that episode's earlier calls are
  replayed on it first. So an episode never needs a process of its own for its whole life, at the price of a restart
  and a replay where more episodes call than there are servers.

A server that fails (does not start, exits, hangs past the call timeout, breaks the protocol) is killed and dropped;
the call raises ``MCPServerError`` (its episode fails with the cause) and the next call starts a new server. After
``START_FAILURES`` failed starts in a row the pool stops trying for ``retry_after_s`` and fails calls at once with the
last cause, so a server that cannot start costs a batch seconds, not a start timeout per episode. ``counts`` keeps
the starts, calls and faults (logged as ``train/mcp/*``).

Servers run until ``close`` (at interpreter exit at the latest); each is started through ``envace.envs.mcp_launch``,
so none outlives the trainer, SIGKILL included.
"""

from __future__ import annotations

import atexit
import copy
import itertools
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from envace.envs.mcp_client import MCPClient, MCPServerError, MCPTimeout, ServerCommand

StateMode = Literal["none", "file", "restart"]
STATE_MARK = "{state}"
"""Stands for the server's live state path in its arguments, environment values and working directory."""
START_FAILURES = 3
"""Failed starts in a row after which the pool fails calls at once for ``retry_after_s``."""


class MCPReplayError(MCPServerError):
    """A restarted server answered an episode's earlier call differently: the episode's state cannot be rebuilt."""


Seed = Callable[[Path], None]
"""Makes a fresh initial state at a path (a file, or a directory)."""


@dataclass
class EpisodeState:
    """What the pool keeps of one episode.

    Its initial state's maker, its private copy of the state (``file``) and its calls so far (``restart``).
    """

    seed: Seed | None = None
    token: int = field(default_factory=itertools.count().__next__)
    state: Path | None = None
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)


@dataclass
class _Server:
    live: Path | None
    client: MCPClient | None = None
    holder: int | None = None  # restart mode: the episode whose state the running server holds (None: nobody's)
    clean: bool = True  # restart mode: no call has changed the state it started with
    busy: bool = False
    used: float = 0.0


class ServerPool:
    """Up to ``max_servers`` running servers of one command, lent one call at a time.

    Args:
        server: how to start one; ``{state}`` in its arguments, environment values or working directory stands for
            the server's live state path (a file, or a directory), made at each start by the seed of the episode
            the server starts for (every episode brings its own: ``new_episode``).
        mode: how the server keeps its state (module docstring).
        max_servers: most servers running at once.
        start_timeout_s: most seconds a server may take to start and answer ``initialize``.
        retry_after_s: seconds without a start after ``START_FAILURES`` failed starts in a row.
        log_dir: where the servers' standard error goes (``mcp-<n>.log``; None: temporary files).
    """

    def __init__(self, server: ServerCommand, mode: StateMode = "none", max_servers: int = 4,
                 start_timeout_s: float = 10.0, retry_after_s: float = 30.0, log_dir: str | None = None) -> None:
        if max_servers < 1:
            raise ValueError(f"max_servers must be at least 1, got {max_servers}")
        self.server, self.mode = server, mode
        self.stateful = any(STATE_MARK in text for text in (*server.args, *(v for _, v in server.env),
                                                             server.cwd or ""))
        self.max_servers, self.start_timeout_s, self.retry_after_s = max_servers, start_timeout_s, retry_after_s
        self.log_dir = log_dir
        self.counts: Counter[str] = Counter()
        """``starts``, ``calls``, ``replayed_calls`` and the faults: ``start_failures``, ``timeouts``, ``crashes``."""
        self._servers: list[_Server] = []
        self._cond = threading.Condition()
        self._dir = Path(tempfile.mkdtemp(prefix="envace-mcp-pool-"))
        self._failed_starts, self._cooldown_until, self._last_failure = 0, 0.0, ""
        self._closed = False
        self._tools: list[dict[str, Any]] | None = None

    def new_episode(self, seed: Seed | None = None) -> EpisodeState:
        """An episode whose initial state ``seed`` makes (needed where the command names ``{state}``).

        In ``file`` mode its private copy is made on its first call.

        Raises:
            ValueError: a seed missing where the command names the state, or given where it does not.
        """
        if (seed is not None) != self.stateful or (self.mode == "file" and seed is None):
            raise ValueError(f"MCP server `{self.server.describe()}`: an episode's initial state (seed) is needed "
                             f"exactly where the command names '{STATE_MARK}' and the state is a file")
        return EpisodeState(seed)

    def end_episode(self, episode: EpisodeState) -> None:
        """Forget an episode: remove its state copy; a server that held its state restarts before its next use."""
        if episode.state is not None:
            _remove(episode.state.parent)
            episode.state = None
        with self._cond:
            for slot in self._servers:
                if slot.holder == episode.token:
                    slot.holder = None  # holds a finished episode's state: restarted before anyone else's call
            self._cond.notify_all()

    def tools(self, episode: EpisodeState, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The server's tools in MCP's wire form (``name``, ``description``, ``inputSchema``).

        Asked once per pool, of a running server (started, if none runs, in ``episode``'s initial state).
        """
        if self._tools is None:
            slot = self._lease(episode, listing=True)
            try:
                self._tools = self._guard(slot, lambda client: client.list_tools(timeout_s))
            finally:
                self._give_back(slot)
        return copy.deepcopy(self._tools)

    def call(self, episode: EpisodeState, name: str, arguments: dict[str, Any], timeout_s: float
             ) -> dict[str, Any]:
        """Call ``name`` in ``episode``'s state; the result in MCP's wire form.

        Raises:
            MCPServerError: the server failed (it is dropped; the next call starts another), or could not start.
        """
        if self.mode == "file" and episode.state is None:
            episode.state = self._fresh_state(episode)
        slot = self._lease(episode)
        try:
            if self.mode == "file":
                copy_state(episode.state, slot.live)
            elif self.mode == "restart" and slot.holder != episode.token:
                self._replay(slot, episode, timeout_s)
            result = self._guard(slot, lambda client: client.call_tool(name, arguments, timeout_s))
            self.counts["calls"] += 1
            if self.mode == "file":
                copy_state(slot.live, episode.state)
            elif self.mode == "restart":
                episode.calls.append((name, arguments, result))
                slot.holder, slot.clean = episode.token, False
            return result
        finally:
            self._give_back(slot)

    def close(self) -> None:
        """Stop every server and remove the live and episode states."""
        with self._cond:
            self._closed = True
            servers, self._servers = self._servers, []
        for slot in servers:
            if slot.client is not None:
                slot.client.close()
        _remove(self._dir)

    # -- lending -------------------------------------------------------------------------------------------------

    def _lease(self, episode: EpisodeState, listing: bool = False) -> _Server:
        """A running server, free for one call: preferably the one holding ``episode``'s state; started if needed.

        ``listing``: for ``tools/list``, which changes no state.
        """
        with self._cond:
            while True:
                if self._closed:
                    raise MCPServerError(f"MCP server `{self.server.describe()}`: its pool is closed")
                slot = self._pick(None if listing else episode)
                if slot is not None:
                    slot.busy = True
                    break
                self._cond.wait()
        try:
            if slot.client is None or not slot.client.alive or (
                    self.mode == "restart" and not listing and slot.holder != episode.token and not slot.clean):
                self._start(slot, episode.seed)
        except BaseException:
            self._give_back(slot)
            raise
        return slot

    def _pick(self, episode: EpisodeState | None) -> _Server | None:
        free = [s for s in self._servers if not s.busy]
        if episode is not None and self.mode == "restart":  # its own server; else one in its initial state
            preferred = [s for s in free if s.holder == episode.token] or [s for s in free if s.clean]
            if preferred:
                return preferred[0]
            if len(self._servers) < self.max_servers:
                free = []  # start another before restarting one that holds an episode's state
        if free:
            return min(free, key=lambda s: (s.client is None, s.used))  # a running server first, the least recent
        if len(self._servers) < self.max_servers:
            slot = _Server(live=self._dir / f"live-{len(self._servers)}" / "state" if self.stateful else None)
            self._servers.append(slot)
            return slot
        return None

    def _give_back(self, slot: _Server) -> None:
        with self._cond:
            slot.busy, slot.used = False, time.monotonic()
            self._cond.notify_all()

    def _start(self, slot: _Server, seed: Seed | None) -> None:
        """(Re)start ``slot``'s server: a fresh live state (``restart`` mode), the process, ``initialize``."""
        if slot.client is not None:
            slot.client.close(hard=True)
            slot.client = None
        slot.holder, slot.clean = None, True
        now = time.monotonic()
        if now < self._cooldown_until:
            raise MCPServerError(f"MCP server `{self.server.describe()}`: not restarted for "
                                 f"{self._cooldown_until - now:.0f} s more after {START_FAILURES} failed starts; "
                                 f"the last: {self._last_failure}")
        if slot.live is not None:  # a fresh initial state (a server may need its path to exist to start)
            assert seed is not None
            _remove(slot.live.parent)
            slot.live.parent.mkdir(parents=True)
            seed(slot.live)
        log = None
        if self.log_dir is not None:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            log = Path(self.log_dir, f"mcp-{self.counts['starts']}.log")
        self.counts["starts"] += 1
        try:
            slot.client = MCPClient(_resolve(self.server, slot.live), self.start_timeout_s, log_path=log)
        except MCPServerError as exc:
            self.counts["start_failures"] += 1
            self._failed_starts, self._last_failure = self._failed_starts + 1, str(exc)
            if self._failed_starts >= START_FAILURES:
                self._cooldown_until = time.monotonic() + self.retry_after_s
            raise
        self._failed_starts = 0

    def _guard(self, slot: _Server, request: Callable[[MCPClient], Any]) -> Any:
        """Run ``request`` on ``slot``'s server; a server that fails is counted, killed and dropped."""
        assert slot.client is not None
        try:
            return request(slot.client)
        except MCPServerError as exc:
            self.counts["timeouts" if isinstance(exc, MCPTimeout) else "crashes"] += 1
            slot.client.close(hard=True)
            slot.client, slot.holder = None, None
            raise

    def _replay(self, slot: _Server, episode: EpisodeState, timeout_s: float) -> None:
        """Bring a freshly started server to ``episode``'s state by replaying its calls (``restart`` mode)."""
        if episode.calls:
            slot.clean = False
        for name, arguments, result in episode.calls:
            again = self._guard(slot, lambda client, n=name, a=arguments: client.call_tool(n, a, timeout_s))
            self.counts["replayed_calls"] += 1
            if again != result:
                slot.holder = None
                raise MCPReplayError(f"MCP server `{self.server.describe()}`: replaying call '{name}' on a "
                                     f"restarted server answered {again} where it had answered {result}; "
                                     "the server is not deterministic, so its state cannot be rebuilt: "
                                     "raise max_servers to the episodes that run at once")
        slot.holder = episode.token

    def _fresh_state(self, episode: EpisodeState) -> Path:
        assert episode.seed is not None
        path = Path(tempfile.mkdtemp(prefix="episode-", dir=self._dir)) / "state"
        episode.seed(path)
        return path


_POOLS: dict[tuple[Any, ...], ServerPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(key: tuple[Any, ...], make: Callable[[], ServerPool]) -> ServerPool:
    """The process's pool for ``key`` (made by ``make`` on first use), so every episode of a command shares one."""
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool._closed:
            pool = _POOLS[key] = make()
        return pool


def pool_counts() -> dict[str, float]:
    """The starts, calls and faults of every shared pool, summed (``mcp/<name>``)."""
    total: Counter[str] = Counter()
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            total.update(pool.counts)
    return {f"mcp/{name}": float(value) for name, value in sorted(total.items())}


@atexit.register
def close_pools() -> None:
    """Stop every shared pool's servers (also at interpreter exit)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


def _resolve(server: ServerCommand, live: Path | None) -> ServerCommand:
    """``server`` with ``{state}`` replaced by the live state path."""
    if live is None:
        return server
    sub = str(live)
    return replace(server, args=tuple(a.replace(STATE_MARK, sub) for a in server.args),
                   env=tuple((k, v.replace(STATE_MARK, sub)) for k, v in server.env),
                   cwd=None if server.cwd is None else server.cwd.replace(STATE_MARK, sub))


def copy_state(source: Path | None, target: Path | None) -> None:
    """Make ``target`` a copy of ``source`` (a file or a directory tree), replacing what was there."""
    assert source is not None and target is not None
    if source.is_dir():
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, symlinks=True)
    elif source.exists():
        shutil.copyfile(source, target)
    else:
        target.unlink(missing_ok=True)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
