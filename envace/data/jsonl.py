"""JSON Lines files read with errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def json_lines(text: str, path: str | Path, error: type[Exception] = ValueError) -> list[tuple[str, Any]]:
    """``(where, decoded value)`` for every non-blank line of a JSON Lines text; ``where`` is ``<path>:<line>``.

    Raises:
        error: a line that is not valid JSON, naming the file and the line.
    """
    out: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: not valid JSON: {exc.msg}") from exc
    return out
