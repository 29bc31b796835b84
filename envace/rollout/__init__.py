"""Rollouts: generation engines, the multi-turn episode runner, and collation into training batches."""
