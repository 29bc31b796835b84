"""``python -m envace`` runs the ``envace`` command."""

from envace.cli import main

main()
