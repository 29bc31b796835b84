"""``python -m envace`` runs the ``envace`` command."""

from envace.cli.command import main

main()
