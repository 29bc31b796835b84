"""What a real MCP server costs per call and per episode, against the same tools as an in-process Python class.

The same database and the same queries, three ways:

- ``python``: an environment class whose methods run the queries with ``sqlite3`` in the trainer's process (a fresh
  in-memory copy of the database per episode), called through ``envace.envs.real.RealEnvironment`` as envace calls
  any environment class (its worker thread and timeout included);
- ``mcp``: ``mcp-server-sqlite`` (installed by ``scripts/setup_mcp_servers.sh``) through
  ``envace.envs.mcp.MCPEnvironment``: one pooled server, the episode's database file copied in and out around each
  call (``keeps_state: file``);
- ``mcp, restart``: the same server restarted for every episode (``keeps_state: memory``, one server), the price of a
  server that keeps its state in its process.

An episode is a fresh initial state (the task's ``seed_sql``) and ``--calls`` calls: reads and writes alternating.
Each way runs ``--episodes`` episodes after one warm-up episode (the server's start is reported on its own). Run on
an idle machine::

    .venv/bin/python benchmarks/mcp_calls.py [--episodes 50] [--calls 4]

The last line is ``SUMMARY python_call_ms=... mcp_call_ms=... mcp_episode_ms=... mcp_restart_episode_ms=...
server_start_s=...``.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

from envace.envs.mcp import MCPEnvironment
from envace.envs.mcp_pool import close_pools, pool_counts
from envace.envs.real import RealEnvironment
from envace.types import EnvSpec, ToolCall

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / ".venv-mcp" / "sqlite" / "bin" / "mcp-server-sqlite"
SEED = ("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, copies INTEGER);"
        + "".join(f"INSERT INTO books VALUES ({i}, 'Book {i}', {i % 5});" for i in range(200)))


class Books:
    """The same tools in the trainer's process: an in-memory copy of the seeded database per instance."""

    def __init__(self, seed_sql: str) -> None:
        self._db = sqlite3.connect(":memory:")
        self._db.executescript(seed_sql)

    def read_query(self, query: str) -> list[dict[str, Any]]:
        """Run a SELECT query.

        Args:
            query: the SQL query.
        """
        cursor = self._db.execute(query)
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def write_query(self, query: str) -> list[dict[str, Any]]:
        """Run an INSERT, UPDATE or DELETE query.

        Args:
            query: the SQL query.
        """
        cursor = self._db.execute(query)
        self._db.commit()
        return [{"affected_rows": cursor.rowcount}]


def calls(n: int) -> list[ToolCall]:
    out = []
    for i in range(n):
        if i % 2:
            out.append(ToolCall("write_query", {"query": f"UPDATE books SET copies = copies - 1 WHERE id = {i}"}))
        else:
            out.append(ToolCall("read_query", {"query": f"SELECT title, copies FROM books WHERE id < {10 + i}"}))
    return out


def mcp_spec(memory: bool) -> EnvSpec:
    args = {"command": str(SERVER), "args": ["--db-path", "{state}"], "seed_sql": SEED,
            "error_prefixes": ["Database error:", "Error:"]}
    if memory:
        args |= {"keeps_state": "memory", "max_servers": 1}
    return EnvSpec("envace.envs.mcp.MCPEnvironment", args)


def run(spec: EnvSpec, episodes: int, n_calls: int) -> tuple[list[float], list[float]]:
    """Per-call and per-episode seconds over ``episodes`` episodes (after one warm-up episode)."""
    per_call: list[float] = []
    per_episode: list[float] = []
    for episode in range(episodes + 1):
        start = time.perf_counter()
        env = RealEnvironment(spec)
        for call in calls(n_calls):
            t = time.perf_counter()
            _, ok = env.execute(call)
            if not ok:
                raise RuntimeError(f"{call} failed")
            if episode:
                per_call.append(time.perf_counter() - t)
        env.close()
        del env
        if episode:
            per_episode.append(time.perf_counter() - start)
    return per_call, per_episode


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=50, help="timed episodes of each way (restart: a fifth)")
    parser.add_argument("--calls", type=int, default=4, help="calls an episode")
    opts = parser.parse_args(argv)
    if not SERVER.is_file():
        raise SystemExit(f"{SERVER} is not installed: bash scripts/setup_mcp_servers.sh")
    start = time.perf_counter()
    probe = MCPEnvironment(str(SERVER), ["--db-path", "{state}"], seed_sql=SEED)
    probe.tool_names()
    server_start = time.perf_counter() - start
    close_pools()
    ways = {"python": EnvSpec(f"{__name__}.Books", {"seed_sql": SEED}), "mcp": mcp_spec(False),
            "mcp, restart": mcp_spec(True)}
    results = {}
    try:
        for name, spec in ways.items():
            results[name] = run(spec, opts.episodes if name != "mcp, restart" else max(5, opts.episodes // 5),
                                opts.calls)
            results[name] += (dict(pool_counts()),)
            close_pools()
    finally:
        close_pools()
    print(f"server start + initialize: {server_start:.2f} s; {opts.calls} calls an episode")
    print("| environment | call ms (median) | episode ms (median) | server starts |")
    print("|---|---|---|---|")
    med = {}
    for name, (per_call, per_episode, counts) in results.items():
        med[name] = (statistics.median(per_call) * 1e3, statistics.median(per_episode) * 1e3)
        print(f"| {name} | {med[name][0]:.2f} | {med[name][1]:.1f} | {int(counts.get('mcp/starts', 0))} |")
    print(f"SUMMARY python_call_ms={med['python'][0]:.3f} mcp_call_ms={med['mcp'][0]:.3f} "
          f"mcp_episode_ms={med['mcp'][1]:.2f} mcp_restart_episode_ms={med['mcp, restart'][1]:.1f} "
          f"server_start_s={server_start:.2f}")


if __name__ == "__main__":
    main()
