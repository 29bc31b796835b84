"""The ``envace`` command.

The ``envace`` command: its sub-commands (``command``), the LightningCLI that runs fit/validate/test (``lightning``),
``envace export`` (``export``) and the CPU demo (``demo``).

May import: everything in envace.
"""
