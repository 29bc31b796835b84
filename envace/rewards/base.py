"""The reward interface.

Rewards are pluggable: a config names any class by ``class_path`` (with its init arguments), and the scorer calls it
on each finished episode. A reward reads only the episode: its ``calls``, ``final_answer``, ``stats`` and
``task.success``; it never runs an environment and never raises on model output.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from envace.types import Episode


@runtime_checkable
class Reward(Protocol):
    """A scalar reward of one episode (the act role's reward; rewards are summed when several are configured)."""

    def __call__(self, episode: Episode) -> float:
        """Score ``episode``.

        Args:
            episode: a finished episode.

        Returns:
            The reward (finite).
        """
        ...
