"""The ``envace`` command and its subcommands.

``fit``, ``validate``, ``test`` (``envace.cli.lightning``), ``export``, ``prepare-model`` and ``record``
(``envace.cli.record``).

A mistake in what the user gave (a task file, a config, a checkpoint, a command-line argument) ends the command
with one line on stderr that names the file, line and key, and exit status 2; ``ENVACE_DEBUG=1`` shows the full
traceback instead (``envace.errors``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from envace.errors import report_user_errors


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``envace`` console script (and ``python -m envace``)."""
    argv = list(sys.argv[1:] if args is None else args)
    report_user_errors(lambda: run(argv), argv)


def run(argv: list[str]) -> Any:
    """Run one ``envace`` command line (errors propagate); returns what the subcommand returns."""
    if argv and argv[0] == "export":
        from envace.cli.export import main as export

        return export([str(a) for a in argv[1:]])
    if argv and argv[0] == "prepare-model":
        from envace.policy.packaged import main as prepare_model

        return prepare_model([str(a) for a in argv[1:]])
    if argv and argv[0] == "record":
        from envace.cli.record import main as record

        return record([str(a) for a in argv[1:]])
    from envace.cli.lightning import cli_main

    return cli_main(argv)


if __name__ == "__main__":
    main()
