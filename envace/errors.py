"""User mistakes, reported as one line that names the file, line and key, instead of a traceback.

A ``UserError`` is an error in something the user gave: a task file, a config, a checkpoint, a command-line
argument. Its message already names where (``tasks.jsonl:3: invalid JSON: ...``). ``report_user_errors`` runs a
command and turns such an error (also when it was raised deep inside a Lightning run and chained), a missing file,
or a config/argument error of the parser (jsonargparse's ``ArgumentError``) into ``envace: error: <message>`` on
stderr and exit status 2. Anything else is a bug and keeps its traceback. ``ENVACE_DEBUG=1`` keeps the traceback of
user errors too.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

DEBUG_VARIABLE = "ENVACE_DEBUG"
"""Set this environment variable to 1 to see the traceback of a user error."""


class UserError(Exception):
    """Base of errors in what the user gave (files, configs, arguments); the message names the file, line or key."""


class ConfigError(UserError, ValueError):
    """A config value that parsed but that a constructor refused (the message names the config and the reason)."""


def report_user_errors(fn: Callable[[], T], argv: Sequence[str] = ()) -> T:
    """``fn()``; a user error ends the process with one line on stderr and exit status 2 (``ENVACE_DEBUG=1``: raise).

    Args:
        fn: the command.
        argv: its command line: a config key is looked up there (``--key=value``) and in its ``--config`` files.
    """
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 (re-raised unless it is a user error)
        message = user_error_message(exc, argv)
        if message is None or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            raise
        sys.stderr.write(f"envace: error: {message}\n(set {DEBUG_VARIABLE}=1 to see the traceback)\n")
        raise SystemExit(2) from None


def user_error_message(exc: BaseException, argv: Sequence[str] = ()) -> str | None:
    """The one-line message of the user error in ``exc``'s chain (``exc`` first), or None when there is none."""
    for error in _chain(exc):
        if isinstance(error, argparse.ArgumentError):
            return argument_error_message(str(error), argv)
        if isinstance(error, UserError):
            return _one_line(str(error))
        if isinstance(error, FileNotFoundError):
            return _one_line(str(error) if error.filename is None else f"{error.filename}: no such file")
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes and contexts, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        error = todo.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        todo += [e for e in (error.__cause__, error.__context__) if e is not None]


_NOISE = (
    "Does not validate against any of the Union subtypes", "Subtypes:", "Errors:", "Given value type:",
    "Given value:", "Expected a <class 'NoneType'>", "Problem with given class_path",
)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_GROUP_OPTION = re.compile(r"Group '([^']+)' does not accept option '([^']+)'")
_OPTION = re.compile(r"Subcommand '[^']+' does not accept option '([^']+)'|Option '([^']+)' is not accepted")
_KEY = re.compile(r"""Key ["']([^"']+)["']""")
_UNRECOGNISED = re.compile(r"unrecognized arguments: (.+)")


def argument_error_message(text: str, argv: Sequence[str] = ()) -> str:
    """One line for a jsonargparse error: ``file:line: key: reason``, ``--key=value: reason``, or ``key: reason``.

    Args:
        text: the parser's message.
        argv: the command line: the argument that set the key, or the line of the ``--config`` file that did.
    """
    key, reason = _key_and_reason(text)
    if key is None:
        return _one_line(reason)
    flag = _flag_for(key, argv)
    if flag is not None:
        return f"command-line argument {flag}: {reason}"
    where = locate_key(key, config_files(argv))
    return f"{where}: {key}: {reason}" if where else f"{key}: {reason}"


def _key_and_reason(text: str) -> tuple[str | None, str]:
    """The dotted config key an error is about (None if it names none) and the reason, from jsonargparse's text."""
    prefix: list[str] = []
    for raw in text.splitlines():
        line = raw.strip().removeprefix("- ")
        match = _PARSER_KEY.match(line)
        if match:
            prefix.append(match.group(1))
            line = match.group(2).strip()
            if not line:
                continue
        if not line or line.startswith(_NOISE):
            continue
        if m := _GROUP_OPTION.search(line):
            return ".".join([*prefix, m.group(1), m.group(2)]), "unknown key"
        if m := _OPTION.search(line):
            return ".".join([*prefix, m.group(1) or m.group(2)]), "unknown key"
        if m := _UNRECOGNISED.search(line):
            return None, f"unrecognised command-line argument(s): {m.group(1)}"
        if prefix == ["config"] or "File does not exist" in line:
            return None, f"--config: {line}"
        if not prefix and (m := _KEY.search(line)):
            return m.group(1), line
        return (".".join(prefix) or None), _short(line)
    return (".".join(prefix) or None), _short(text)


def parser_reason(text: str) -> str:
    """The reason in a jsonargparse report, without its union and value noise (e.g. a constructor's own message)."""
    return _key_and_reason(text)[1]


def _short(reason: str) -> str:
    """``reason`` without a long ``Got value: ...`` dump."""
    head, _, value = reason.partition(" Got value: ")
    return head if not value else f"{head} Got {value if len(value) <= 60 else value[:57] + '...'}"


def _flag_for(key: str, argv: Sequence[str]) -> str | None:
    """The command-line argument that set ``key`` (``--key=value`` or ``--key value``), if one did."""
    for i, arg in enumerate(argv):
        name, eq, _ = str(arg).partition("=")
        if name == f"--{key}":
            return arg if eq else f"{arg} {argv[i + 1]}" if i + 1 < len(argv) else arg
    return None


def config_files(argv: Sequence[str]) -> list[str]:
    """The ``--config`` files of a command line, in order."""
    files = []
    for i, arg in enumerate(map(str, argv)):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(str(argv[i + 1]))
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def locate_key(key: str, config_files: Sequence[str]) -> str | None:
    """``file:line`` of the last config file that sets ``key`` (``init_args`` levels may sit between its parts)."""
    import yaml

    for name in reversed(list(config_files)):
        try:
            node = yaml.compose(Path(name).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        except (OSError, yaml.YAMLError):
            continue
        line = _find(node, key.split("."))
        if line is not None:
            return f"{name}:{line}"
    return None


def _find(node: Any, parts: list[str]) -> int | None:
    """1-based line of the key ``parts`` under the YAML ``node`` (skipping ``init_args``), or None."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return next((line for item in node.value if (line := _find(item, parts)) is not None), None)
    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value in node.value:
        if key_node.value == parts[0]:
            if len(parts) == 1:
                return key_node.start_mark.line + 1
            if (line := _find(value, parts[1:])) is not None:
                return line
        elif key_node.value == "init_args" and (line := _find(value, parts)) is not None:
            return line
    return None


def _one_line(message: str) -> str:
    """``message`` on one line (later lines joined with '; ')."""
    return "; ".join(part.strip() for part in message.strip().splitlines() if part.strip())
