"""Task sets by name: a JSONL file, ``PATH:N``, ``builtin:NAME[:N]``, or the authors' rows (``reference:PATH``).

What a config's ``data.*_tasks`` says is resolved here.

The data layer (``envace.data.tasks``, ``envace.data.reference_format``) knows file formats only; this module knows
the names, including the built-in domain's (``envace.builtin``), so the format code never imports a domain.
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks
from envace.types import Task

BUILTIN_PREFIX = "builtin:"
REFERENCE_PREFIX = "reference:"  # rows in the EnvACE authors' format (envace.data.reference_format)
REFERENCE_LENIENT_PREFIX = "reference-lenient:"  # the same, invalid rows skipped and counted
_COUNT = re.compile(r"(.+):(-?[0-9]+)")  # PATH:N, the first N tasks of a file (only a trailing count)


def load_task_set(spec: str) -> list[Task]:
    """The tasks named by ``spec``: a JSONL path, a packaged built-in set ``builtin:NAME``, or ``builtin:NAME:N``.

    ``builtin:NAME:N`` generates the first ``N`` tasks of that built-in split in memory (deterministic; a packaged
    file holds the first tasks of its split), e.g. ``builtin:bank:2000``. ``reference:PATH`` loads rows in the EnvACE
    authors' format (``.parquet``, ``.json`` or ``.jsonl``; ``envace.data.reference_format``); an invalid row raises.
    ``reference-lenient:PATH`` skips invalid rows instead (counted and logged).

    ``PATH:N`` (also ``reference:PATH:N`` and ``reference-lenient:PATH:N``) takes the first ``N`` tasks of the file
    (of its valid rows, when lenient); the lines after them are not read. Only a trailing ``:<digits>`` is a count,
    and a file whose full name ends so is loaded whole (it is preferred to the count). ``N`` must be >= 1 and the file
    must hold at least ``N`` tasks: anything else is an error, never silently fewer tasks.

    Raises:
        TaskFormatError: an unknown built-in name, a bad ``N``, a file with fewer than ``N`` tasks, or any error of
            ``load_tasks`` or of the reference row loader.
    """
    for prefix in (REFERENCE_PREFIX, REFERENCE_LENIENT_PREFIX):
        if spec.startswith(prefix):
            from envace.data.reference_format import load_reference_rows

            path, count = _split_count(spec, spec[len(prefix) :])
            tasks = load_reference_rows(path, skip_invalid=prefix == REFERENCE_LENIENT_PREFIX).tasks
            return tasks if count is None else _first(tasks, count, spec, path)
    if spec.startswith(BUILTIN_PREFIX) and spec.count(":") == 2:
        from envace.builtin import SPLIT_OF, domain_of
        from envace.builtin.generator import MAX_TASKS, generate_split

        name, _, count = spec[len(BUILTIN_PREFIX) :].partition(":")
        if name not in SPLIT_OF:
            raise TaskFormatError(f"unknown built-in task set '{spec}'; generated sets: {', '.join(sorted(SPLIT_OF))}")
        if not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= MAX_TASKS:  # int('²') raises
            raise TaskFormatError(f"'{spec}': the task count must be an integer in 1..{MAX_TASKS}, got '{count}'")
        return generate_split(domain_of(name), SPLIT_OF[name], int(count))
    if spec.startswith(BUILTIN_PREFIX):
        return load_tasks(resolve_task_path(spec))
    path, count = _split_count(spec, spec)
    if count is None:
        return load_tasks(Path(path))
    return _first(load_tasks(Path(path), limit=count), count, spec, path)


def _split_count(spec: str, path: str) -> tuple[str, int | None]:
    """``(file, N)`` of a ``file:N`` path (``N`` None: no count). A file of the full name wins over a count.

    Raises:
        TaskFormatError: ``N`` < 1, or neither the full name nor the name before ``:N`` is a file.
    """
    match = _COUNT.fullmatch(path)
    if match is None or Path(path).is_file():
        return path, None
    head, count = match.group(1), int(match.group(2))
    if count < 1:
        raise TaskFormatError(f"'{spec}': the task count after ':' must be an integer >= 1, got {count}")
    if not Path(head).is_file():
        raise TaskFormatError(f"task file not found: neither {path} nor {head} (read as its first {count} tasks) "
                              "exists")
    return head, count


def _first(tasks: list[Task], count: int, spec: str, path: str) -> list[Task]:
    """The first ``count`` tasks, or an error naming the file when it holds fewer."""
    if len(tasks) < count:
        raise TaskFormatError(f"'{spec}': asks for the first {count} tasks, but {path} holds only {len(tasks)}; "
                              f"ask for at most {len(tasks)}, or drop ':{count}' to load them all")
    return tasks[:count]


def resolve_task_path(path: str) -> Path:
    """Map ``builtin:NAME`` to its packaged file in ``envace/builtin/``; any other string is a path.

    The names are those of ``envace.builtin.TASK_SETS``: for each built-in domain (``bank``, ``desk``),
    ``builtin:<domain>`` (its training split, e.g. ``bank_tasks.jsonl``; also ``builtin:<domain>-train``),
    ``builtin:<domain>-val``, ``builtin:<domain>-test`` and ``builtin:<domain>-heldout`` (held-out task templates).

    Args:
        path: a file path or ``builtin:NAME`` (e.g. ``builtin:bank``).

    Raises:
        TaskFormatError: no built-in task set has that name, or its packaged file is missing.
    """
    from envace.builtin import TASK_SETS  # the built-in names live with the files they name

    if not path.startswith(BUILTIN_PREFIX):
        return Path(path)
    name = path[len(BUILTIN_PREFIX) :]
    if name not in TASK_SETS:
        raise TaskFormatError(f"unknown built-in task set '{path}'; available: {', '.join(sorted(TASK_SETS))}")
    resource = files("envace.builtin").joinpath(TASK_SETS[name])
    if not resource.is_file():
        raise TaskFormatError(f"built-in task set '{path}': packaged file {TASK_SETS[name]} is missing")
    return Path(str(resource))
