"""Real environments that answer tool calls.

Real environments that answer tool calls: a Python class named in the task file (``envace.envs.real``), with
argument validation against each tool's JSON schema, timeouts and error capture; and MCP tool servers
(``envace.envs.mcp``: a task environment on any stdio server; ``envace.envs.mcp_pool``: the bounded pool of running
servers and each episode's state; ``envace.envs.mcp_client``: the synchronous client, the ``mcp`` extra), whose
servers are started through ``envace.envs.mcp_launch`` so that none outlives the trainer. ``envace.envs.sqlite_state``
makes a database from a task's seed script and the state an episode's writes leave (the success check of database
tasks).

May import: envace.types, envace.errors, envace.runtime.
"""
