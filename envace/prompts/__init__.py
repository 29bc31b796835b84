"""Packaged prompt texts: the rehearse role's system prompt, read as a file.

May import: nothing (data only).
"""
