"""Packaged chat templates (jinja), loaded by name with ``envace.policy.templates.load_chat_template``.

May import: nothing (data only).
"""
