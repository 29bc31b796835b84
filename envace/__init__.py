"""envace."""
