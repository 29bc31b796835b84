"""``python -m envace`` runs the ``envace`` command."""

from envace.command import main

main()
