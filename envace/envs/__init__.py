"""Real environments that answer tool calls.

Real environments that answer tool calls: a Python class named in the task file (``envace.envs.real``), with
argument validation against each tool's JSON schema, timeouts and error capture.

May import: envace.types, envace.errors, envace.runtime.
"""
