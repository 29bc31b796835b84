"""The task format.

The task format: JSONL task files, their schema, validation and rendering (``tasks``), and the reference
trajectories' format (``reference_format``). It knows no domain and no model.

May import: envace.types, envace.errors, envace.runtime, envace.envs, envace.roles.
"""
