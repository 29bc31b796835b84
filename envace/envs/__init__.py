"""Environments that answer tool calls: real Python environments (``envace.envs.real``)."""
