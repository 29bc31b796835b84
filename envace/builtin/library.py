"""The built-in library domain: a lending library's SQLite database, served by the real ``mcp-server-sqlite``.

A hidden world is a small database: ``books(id, title, author, copies)`` (copies on the shelf), ``members(id, name)``
and ``loans(book_id, member_id)``. Its tools are the SQLite MCP server's own (``read_query``, ``write_query``,
``list_tables``, ``describe_table``, ``create_table``, ``append_insight``): the act role writes SQL, and the rehearse
role must predict a query's rows and a write's effect, a world model of a database, which neither the bank nor the
help desk asks for. The server answers a query with the Python repr of its rows (``[{'copies': 2}]``), a write with
``[{'affected_rows': 1}]``, and a bad statement with the text ``Database error: ...`` (a tool error: the task's
``error_prefixes``).

A task succeeds when its final answer is right and the database its writes leave holds exactly the expected rows
(``envace.types.ExpectedState``: any SQL with the right effect passes, and a rehearsed episode is scored without a
server). Every task carries the state check, so a question answered with a stray write fails.

This module owns the world, the wording, the call plans and the answer formats; ``envace.builtin.library_tasks``
generates the splits, running every plan on the real server (``scripts/setup_mcp_servers.sh`` installs it in
``.venv-mcp/sqlite``).

Answer formats (the act role's final message):

* a count: the number (``"2"``); a list of titles: the titles in alphabetical order, separated by ``", "``, or
  ``none``;
* a change: ``lent: <n> left`` (the copies on the shelf after the loan: the lookup's count minus one),
  ``returned: <n> on the shelf`` (plus one), ``added``, ``passed on``;
* an error: ``error: no copies of <title> left``.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from typing import Any

from envace.builtin.generator import OK, Redraw, Template
from envace.types import ToolCall

BOOKS = (
    ("Dune", "Frank Herbert"), ("Emma", "Jane Austen"), ("Persuasion", "Jane Austen"),
    ("Middlemarch", "George Eliot"), ("Silas Marner", "George Eliot"), ("Ulysses", "James Joyce"),
    ("Dubliners", "James Joyce"), ("Beloved", "Toni Morrison"), ("Jazz", "Toni Morrison"),
    ("Solaris", "Stanislaw Lem"), ("Ubik", "Philip K. Dick"), ("Valis", "Philip K. Dick"),
    ("Kindred", "Octavia Butler"), ("Dawn", "Octavia Butler"), ("Rebecca", "Daphne du Maurier"),
    ("Orlando", "Virginia Woolf"), ("The Waves", "Virginia Woolf"), ("Hamlet", "William Shakespeare"),
    ("Macbeth", "William Shakespeare"), ("Walden", "Henry David Thoreau"),
)
"""Titles and authors a world's catalogue is drawn from (titles are unique; several authors have two)."""
MEMBERS = ("Ada", "Ben", "Chloe", "Dev", "Eva", "Finn", "Grace", "Hugo", "Iris", "Jon")
NO_COPIES = "no copies of"
SCHEMA = ("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, author TEXT NOT NULL, "
          "copies INTEGER NOT NULL);\n"
          "CREATE TABLE members (id INTEGER PRIMARY KEY, name TEXT NOT NULL);\n"
          "CREATE TABLE loans (book_id INTEGER NOT NULL, member_id INTEGER NOT NULL);\n")


@dataclass(frozen=True)
class World:
    """The hidden state of one task: the library's rows.

    Attributes:
        books: ``[id, title, author, copies]`` rows.
        members: ``[id, name]`` rows.
        loans: ``[book_id, member_id]`` rows.
    """

    books: tuple[tuple[Any, ...], ...]
    members: tuple[tuple[Any, ...], ...]
    loans: tuple[tuple[int, int], ...]

    def seed_sql(self) -> str:
        """The SQL script that makes this world's database."""
        lines = [SCHEMA]
        lines += [f"INSERT INTO books VALUES ({i}, {_q(t)}, {_q(a)}, {c});" for i, t, a, c in self.books]
        lines += [f"INSERT INTO members VALUES ({i}, {_q(n)});" for i, n in self.members]
        lines += [f"INSERT INTO loans VALUES ({b}, {m});" for b, m in self.loans]
        return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    """What a template asks and the calls that solve it (on the real server, in order).

    Attributes:
        question: the user's request.
        steps: the calls.
        kind: how the answer follows from the responses: ``value`` (the single value of the last query),
            ``titles`` (the titles the last query listed), ``lent``, ``returned``, ``added``, ``passed`` or an error.
        outcome: ``OK``, or the error phrase the parameters were drawn to reach.
        subject: the title an error answer names.
    """

    question: str
    steps: tuple[ToolCall, ...]
    kind: str
    outcome: str = OK
    subject: str = ""

    def calls(self) -> list[ToolCall]:
        """The calls, in order."""
        return list(self.steps)


def draw_world(rng: random.Random) -> World:
    """4 to 7 books with 0 to 3 copies on the shelf, 3 to 5 members, 0 to 3 loans."""
    catalogue = rng.sample(BOOKS, rng.randint(4, 7))
    books = tuple((i + 1, title, author, rng.randint(0, 3)) for i, (title, author) in enumerate(catalogue))
    members = tuple((i + 1, name) for i, name in enumerate(rng.sample(MEMBERS, rng.randint(3, 5))))
    pairs = [(b[0], m[0]) for b in books for m in members]
    loans = tuple(sorted(rng.sample(pairs, rng.randint(0, 3))))
    return World(books, members, loans)


def world_context(world: World) -> str:
    """The facts the rehearse role needs to play the database (never shown to the act role)."""
    books = "; ".join(f"({i}, {t!r}, {a!r}, {c})" for i, t, a, c in world.books)
    members = "; ".join(f"({i}, {n!r})" for i, n in world.members)
    loans = "; ".join(f"({b}, {m})" for b, m in world.loans) or "none"
    return (
        "SQLite database. books(id, title, author, copies): " + books + ". members(id, name): " + members
        + ". loans(book_id, member_id): " + loans + ". A query returns its rows as a Python list of dicts, e.g. "
        "[{'copies': 2}]; a write returns [{'affected_rows': <n>}]; a bad statement returns "
        "'Database error: <sqlite message>'."
    )


# --- the templates ---------------------------------------------------------------------------------------------------


def _q(text: str) -> str:
    """An SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def read(sql: str) -> ToolCall:
    """A ``read_query`` call."""
    return ToolCall("read_query", {"query": sql})


def write(sql: str) -> ToolCall:
    """A ``write_query`` call."""
    return ToolCall("write_query", {"query": sql})


def _find_book(title: str) -> ToolCall:
    return read(f"SELECT id, copies FROM books WHERE title = {_q(title)}")


def _find_member(name: str) -> ToolCall:
    return read(f"SELECT id FROM members WHERE name = {_q(name)}")


def _copies(rng: random.Random, world: World) -> Plan:
    _, title, _, _ = rng.choice(world.books)
    return Plan(f"How many copies of {title} are on the shelf?",
                (read(f"SELECT copies FROM books WHERE title = {_q(title)}"),), "value")


def _by_author(rng: random.Random, world: World) -> Plan:
    author = rng.choice(world.books)[2]
    return Plan(f"Which books by {author} does the library have?",
                (read(f"SELECT title FROM books WHERE author = {_q(author)} ORDER BY title"),), "titles")


def _on_loan(rng: random.Random, world: World) -> Plan:
    _, name = rng.choice(world.members)
    sql = ("SELECT b.title FROM loans l JOIN books b ON b.id = l.book_id JOIN members m ON m.id = l.member_id "
           f"WHERE m.name = {_q(name)} ORDER BY b.title")
    return Plan(f"Which books does {name} have on loan?", (read(sql),), "titles")


def _lend(rng: random.Random, world: World) -> Plan:
    shelf = [b for b in world.books if b[3] > 0]
    if not shelf:
        raise Redraw
    book_id, title, _, _ = rng.choice(shelf)
    member_id, name = rng.choice(world.members)
    return Plan(f"Lend {title} to {name}.", (
        _find_book(title), _find_member(name),
        write(f"UPDATE books SET copies = copies - 1 WHERE id = {book_id}"),
        write(f"INSERT INTO loans (book_id, member_id) VALUES ({book_id}, {member_id})"),
    ), "lent")


def _lend_unavailable(rng: random.Random, world: World) -> Plan:
    gone = [b for b in world.books if b[3] == 0]
    if not gone:
        raise Redraw
    _, title, _, _ = rng.choice(gone)
    _, name = rng.choice(world.members)
    return Plan(f"Lend {title} to {name}.", (_find_book(title),), "error", NO_COPIES, title)


def _a_loan(rng: random.Random, world: World) -> tuple[int, int, str, str]:
    """A loan of the world: its book's id and title, its member's id and name."""
    if not world.loans:
        raise Redraw
    book_id, member_id = rng.choice(world.loans)
    title = next(b[1] for b in world.books if b[0] == book_id)
    name = next(m[1] for m in world.members if m[0] == member_id)
    return book_id, member_id, title, name


def _return(rng: random.Random, world: World) -> Plan:
    book_id, member_id, title, name = _a_loan(rng, world)
    return Plan(f"{name} returns {title}.", (
        _find_book(title), _find_member(name),
        write(f"DELETE FROM loans WHERE book_id = {book_id} AND member_id = {member_id}"),
        write(f"UPDATE books SET copies = copies + 1 WHERE id = {book_id}"),
    ), "returned")


def _add(rng: random.Random, world: World) -> Plan:
    have = {b[1] for b in world.books}
    title, author = rng.choice([b for b in BOOKS if b[0] not in have])
    copies = rng.randint(1, 3)
    return Plan(f"Add {copies} copies of {title} by {author} to the catalogue.", (
        write(f"INSERT INTO books (title, author, copies) VALUES ({_q(title)}, {_q(author)}, {copies})"),), "added")


def _author_copies(rng: random.Random, world: World) -> Plan:
    author = rng.choice(world.books)[2]
    return Plan(f"How many copies of books by {author} are on the shelf in all?",
                (read(f"SELECT SUM(copies) FROM books WHERE author = {_q(author)}"),), "value")


def _pass_on(rng: random.Random, world: World) -> Plan:
    book_id, member_id, title, name = _a_loan(rng, world)
    to_id, to_name = rng.choice([m for m in world.members if m[0] != member_id])
    return Plan(f"{name} passes {title} on to {to_name}.", (
        _find_book(title), _find_member(name), _find_member(to_name),
        write(f"UPDATE loans SET member_id = {to_id} WHERE book_id = {book_id} AND member_id = {member_id}"),
    ), "passed")


TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("copies", False, 1, "copies of a title on the shelf", _copies),
    Template("by_author", False, 1, "the titles by an author", _by_author),
    Template("on_loan", False, 1, "the titles a member has on loan (a join)", _on_loan),
    Template("lend", False, 4, "lend a title: look up the book and the member, decrement, record the loan", _lend),
    Template("lend_unavailable", False, 1, "lend a title with no copy left: the error", _lend_unavailable),
    Template("return", False, 4, "a member returns a title: look up, delete the loan, increment", _return),
    Template("add", False, 1, "add a new title with its copies", _add),
    Template("author_copies", True, 1, "held out: the copies of an author's titles in all (an aggregate)",
             _author_copies),
    Template("pass_on", True, 4, "held out: a loan passed from one member to another (an update of a loan)",
             _pass_on),
)}
TRAIN_TEMPLATES = tuple(name for name, t in TEMPLATES.items() if not t.held_out)
HELD_OUT_TEMPLATES = tuple(name for name, t in TEMPLATES.items() if t.held_out)


def answer_from_responses(plan: Plan, contents: list[str]) -> str:
    """The final answer of ``plan`` from the server's responses (the Python repr of the rows, read with ``ast``)."""
    if plan.outcome != OK:
        return f"error: {plan.outcome} {plan.subject} left"
    if plan.kind == "added":
        return "added"
    if plan.kind == "passed":
        return "passed on"
    if plan.kind == "lent":  # the copies the first lookup found, one taken off the shelf
        return f"lent: {_rows(contents[0])[0]['copies'] - 1} left"
    if plan.kind == "returned":
        return f"returned: {_rows(contents[0])[0]['copies'] + 1} on the shelf"
    rows = _rows(contents[-1])
    if plan.kind == "titles":
        return ", ".join(row["title"] for row in rows) or "none"
    value = next(iter(rows[0].values())) if rows else None
    return str(value if value is not None else 0)


def _rows(content: str) -> list[dict[str, Any]]:
    """The rows of a query's response (the Python repr the server writes, read as a literal, never run)."""
    return ast.literal_eval(content)
