"""The built-in library tasks and their packaged splits (``builtin:library`` and friends), on a real SQLite server.

The library is the third built-in domain and the first whose environment is a real tool server: each task's
environment is ``mcp-server-sqlite`` (``envace.envs.mcp.MCPEnvironment``) on a copy of the task's database, made from
the world's SQL (``seed_sql``). This module owns the generation settings: the server and the tools offered (the
server's own, but ``append_insight``, whose memo outlives an episode), what the act role is told
(``SYSTEM_PROMPT``) and the rehearse role knows (``envace.builtin.library.world_context``), the success check (the
answer and the database's final rows, ``success_of``) and the four splits. ``envace.builtin.generator`` generates the
tasks as it does the bank's and the desk's: every plan runs on the real server, so the references' responses are the
server's, and train, val and test partition the task space while the held-out split uses its own templates.

The server must be installed (``bash scripts/setup_mcp_servers.sh``: ``.venv-mcp/sqlite``) and the task files are
used from the repository root, where their server command's relative path points (as the configs' model paths do).

Usage: ``python -m envace.builtin.library_tasks`` rewrites the four packaged files;
``python -m envace.builtin.library_tasks --n 100 --seed 7 --templates copies,lend --out my_tasks.jsonl`` writes a
custom set.
"""

from __future__ import annotations

import functools
import sqlite3
from typing import Any

from envace.builtin import generator
from envace.builtin.generator import Split, standard_splits
from envace.builtin.library import (
    HELD_OUT_TEMPLATES,
    TEMPLATES,
    TRAIN_TEMPLATES,
    Plan,
    World,
    answer_from_responses,
    draw_world,
    world_context,
)
from envace.envs.mcp import MCPEnvironment
from envace.envs.sqlite_state import final_tables
from envace.types import EnvSpec, ExpectedAnswer, ExpectedState, SuccessSpec, ToolCall

SERVER = ".venv-mcp/sqlite/bin/mcp-server-sqlite"
"""The SQLite MCP server, relative to the repository root (``scripts/setup_mcp_servers.sh`` installs it)."""
TOOLS = ("read_query", "write_query", "list_tables", "describe_table", "create_table")
"""The server's tools a task offers: all but ``append_insight``, whose memo lives in the process across episodes."""
ERROR_PREFIXES = ("Database error:", "Error:")
"""How the server words a failed statement and a refused one (it never flags ``isError``)."""
CLASS_PATH = "envace.envs.mcp.MCPEnvironment"
SYSTEM_PROMPT = (
    "You are a library assistant with a SQLite database: books(id, title, author, copies), where copies are the "
    "copies on the shelf, members(id, name) and loans(book_id, member_id). Use the tools, one call per turn: "
    "read_query runs a SELECT, write_query an INSERT, UPDATE or DELETE. To lend a book, look up the book and the "
    "member, take one copy off the shelf and record the loan; a return deletes the loan and puts the copy back. "
    "Then reply with the answer only: a number; titles in alphabetical order separated by ', ', "
    "or 'none'; 'lent: <copies left> left'; 'returned: <copies> on the shelf'; 'added'; 'passed on'. If a book has "
    "no copy on the shelf, change nothing and reply 'error: no copies of <title> left'."
)
"""The act role's system prompt: the schema, the procedures and the answer formats."""

SPLITS: dict[str, Split] = standard_splits("library", 21, (320, 128, 256, 128), TRAIN_TEMPLATES,
                                           HELD_OUT_TEMPLATES)
"""The packaged splits by name."""


def environment_spec(world: World) -> EnvSpec:
    """A task's environment: the SQLite server on a copy of the world's database."""
    return EnvSpec(CLASS_PATH, {"command": SERVER, "args": ["--db-path", "{state}"], "seed_sql": world.seed_sql(),
                                "error_prefixes": list(ERROR_PREFIXES), "tools": list(TOOLS)})


def world_from_spec(spec: EnvSpec) -> World:
    """A task's world, read back from its database (``seed_sql``)."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(spec.init_args["seed_sql"])
        rows = {name: tuple(tuple(r) for r in db.execute(f"SELECT * FROM {name} ORDER BY rowid"))  # noqa: S608
                for name in ("books", "members", "loans")}
    finally:
        db.close()
    return World(rows["books"], rows["members"], rows["loans"])


@functools.cache
def tool_schemas() -> tuple[dict[str, Any], ...]:
    """The offered tools' schemas, from the server's ``tools/list`` (asked once)."""
    env = MCPEnvironment(SERVER, ["--db-path", "{state}"], seed_sql=World((), (), ()).seed_sql(),
                         error_prefixes=list(ERROR_PREFIXES), tools=list(TOOLS))
    return tuple(env.server_tools())


def success_of(plan: Plan, calls: list[ToolCall], answer: str, world: World) -> SuccessSpec:
    """The exact answer, and every table as the reference's writes leave it (whatever SQL reaches it)."""
    writes = [c.arguments["query"] for c in calls if c.name == "write_query"]
    return SuccessSpec(answer=ExpectedAnswer(equals=answer),
                       state=ExpectedState(tables=final_tables(world.seed_sql(), writes),
                                           writes={"write_query": "query", "create_table": "query"}))


LIBRARY = generator.Domain(
    name="library",
    environment=MCPEnvironment,
    class_path=CLASS_PATH,
    system_prompt=SYSTEM_PROMPT,
    templates=TEMPLATES,
    splits=SPLITS,
    world_type=World,
    draw_world=draw_world,
    world_context=world_context,
    answer=answer_from_responses,
    environment_spec=environment_spec,
    tool_schemas=tool_schemas,
    world_from_spec=world_from_spec,
    success=success_of,
)
"""The library domain, as ``envace.builtin.generator`` generates it."""


def main(argv: list[str] | None = None) -> None:
    """Command line: rewrite the packaged split files, or write a custom task set with ``--out``."""
    generator.main(LIBRARY, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
