"""Real environments that answer tool calls.

Real environments that answer tool calls: a Python class named in the task file (``envace.envs.real``), with
argument validation against each tool's JSON schema, timeouts and error capture; and a synchronous client of MCP tool
servers over stdio (``envace.envs.mcp_client``, the ``mcp`` extra), whose servers are started through
``envace.envs.mcp_launch`` so that none outlives the trainer.

May import: envace.types, envace.errors, envace.runtime.
"""
