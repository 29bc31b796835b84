"""Packaged prompt texts."""
