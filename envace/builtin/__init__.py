"""Built-in tool domains and their packaged task files.

Three domains ship, each with four splits (``docs/builtin-domain.md``):

- the bank (``envace.builtin.bank``, tasks from ``envace.builtin.make_tasks``): balances, deposits, withdrawals and
  transfers; responses are arithmetic on hidden balances. ``builtin:bank`` (the training split; ``builtin:bank-train``
  is the same file), ``builtin:bank-val``, ``builtin:bank-test`` and ``builtin:bank-heldout`` (held-out templates);
- the help desk (``envace.builtin.desk``, tasks from ``envace.builtin.desk_tasks``): tickets with a title, a status
  and an assignee; responses are records looked up and updated, with string values. ``builtin:desk`` (also
  ``builtin:desk-train``), ``builtin:desk-val``, ``builtin:desk-test`` and ``builtin:desk-heldout``;
- the library (``envace.builtin.library``, tasks from ``envace.builtin.library_tasks``): a lending library's SQLite
  database served by the real ``mcp-server-sqlite``; the act role writes SQL, responses are query rows and write
  counts, and success checks the answer and the database's final rows. ``builtin:library`` (also
  ``builtin:library-train``), ``builtin:library-val``, ``builtin:library-test`` and ``builtin:library-heldout``; its
  server is installed by ``scripts/setup_mcp_servers.sh``.

``TASK_SETS`` maps each ``builtin:NAME`` to its file in this package; ``python -m envace.builtin.make_tasks``,
``python -m envace.builtin.desk_tasks`` and ``python -m envace.builtin.library_tasks`` regenerate them.
``builtin:NAME:N`` generates the first ``N`` tasks of a split instead (deterministic; the packaged file holds the
first ones), e.g. ``builtin:bank:2000`` for more demonstrations.

May import: envace.data and the packages below it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envace.builtin.generator import Domain

TASK_SETS: dict[str, str] = {
    "bank": "bank_tasks.jsonl",
    "bank-train": "bank_tasks.jsonl",
    "bank-val": "bank_val.jsonl",
    "bank-test": "bank_test.jsonl",
    "bank-heldout": "bank_heldout.jsonl",
    "desk": "desk_tasks.jsonl",
    "desk-train": "desk_tasks.jsonl",
    "desk-val": "desk_val.jsonl",
    "desk-test": "desk_test.jsonl",
    "desk-heldout": "desk_heldout.jsonl",
    "library": "library_tasks.jsonl",
    "library-train": "library_tasks.jsonl",
    "library-val": "library_val.jsonl",
    "library-test": "library_test.jsonl",
    "library-heldout": "library_heldout.jsonl",
}
"""Packaged task file of each built-in task set name (``builtin:NAME``)."""

SPLIT_OF: dict[str, str] = {
    f"{domain}{suffix}": split
    for domain in ("bank", "desk", "library")
    for suffix, split in (("", "train"), ("-train", "train"), ("-val", "val"), ("-test", "test"),
                          ("-heldout", "heldout"))
}
"""The generator split behind each built-in task set name."""

DOMAINS: dict[str, str] = {"bank": "envace.builtin.make_tasks:BANK", "desk": "envace.builtin.desk_tasks:DESK",
                           "library": "envace.builtin.library_tasks:LIBRARY"}
"""Where each built-in domain's ``generator.Domain`` lives (imported on first use)."""


def domain_of(name: str) -> Domain:
    """The domain of a built-in task set name (``bank-test`` -> the bank), imported on first use.

    Raises:
        KeyError: no built-in domain has that name.
    """
    module, _, attribute = DOMAINS[name.split("-", 1)[0]].partition(":")
    return getattr(import_module(module), attribute)
