"""SQLite databases as a task's state: made from a seed script, and the state an episode's writes leave.

A database task carries its initial state as an SQL script (``seed_sql``). ``seed_database`` builds it once per
script; ``final_tables`` runs the write statements an episode made on a private in-memory copy, as the SQLite MCP
server runs them (one statement per call; INSERT, UPDATE, DELETE, CREATE, DROP and ALTER committed, anything else
rolled back; a statement that fails changes nothing), and reads every table back, its rows sorted. The task's success
check (``envace.types.ExpectedState``) compares that with the rows it expects. Python's ``sqlite3`` runs them, the
engine the server itself uses; the server is never called, so a rehearsed episode is scored without one.
"""

from __future__ import annotations

import functools
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from envace.types import canonical_json

COMMITTED = ("INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER")
"""Statements the SQLite server commits (its ``_execute_query``); it rolls back any other."""


class SeedError(ValueError):
    """A seed script that does not run."""


@functools.lru_cache(maxsize=64)
def seed_database(seed_sql: str) -> bytes:
    """The SQLite database file that ``seed_sql`` makes.

    Built in memory and copied out: run on a file, every statement would commit and wait for the disk.

    Raises:
        SeedError: the script does not run (the message says why).
    """
    memory = sqlite3.connect(":memory:")
    try:
        memory.executescript(seed_sql)
        with tempfile.TemporaryDirectory(prefix="envace-seed-") as tmp:
            path = Path(tmp) / "seed.db"
            disk = sqlite3.connect(path)
            memory.backup(disk)
            disk.close()
            return path.read_bytes()
    except sqlite3.Error as exc:
        raise SeedError(f"seed_sql does not run: {exc}") from exc
    finally:
        memory.close()


def final_tables(seed_sql: str, statements: Iterable[str]) -> dict[str, list[list[Any]]]:
    """Every table's rows, sorted, after ``statements`` run in order on a fresh copy of the seeded database."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(seed_sql)
        for statement in statements:
            _run(db, statement)
        return tables(db)
    finally:
        db.close()


def tables(db: sqlite3.Connection) -> dict[str, list[list[Any]]]:
    """Every user table of ``db`` and its rows as JSON values (blobs as hex), sorted."""
    names = [row[0] for row in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    out = {}
    for name in names:
        rows = [[value.hex() if isinstance(value, bytes) else value for value in row]
                for row in db.execute(f'SELECT * FROM "{name}"')]  # noqa: S608 - a name read from the database
        out[name] = sorted(rows, key=canonical_json)
    return out


def _run(db: sqlite3.Connection, statement: str) -> None:
    text = statement.strip()
    if not text or text.upper().startswith("SELECT"):
        return
    try:
        db.execute(text)
    except (sqlite3.Error, sqlite3.Warning, ValueError):  # a statement that fails (or is several) changes nothing
        db.rollback()
        return
    if text.upper().startswith(COMMITTED):
        db.commit()
    else:
        db.rollback()
