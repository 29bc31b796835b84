"""Format penalty: a small negative reward for malformed act-role output.

Counted from ``episode.stats``: turns with a malformed ``<tool_call>`` block, calls to unknown tools and calls whose
arguments violate the tool's schema. Rehearse-role errors are not counted (they belong to the rehearse reward).
"""

from __future__ import annotations

from envace.types import Episode


class FormatPenalty:
    """Reward ``-penalty * min(errors, max_count)``, plus ``-penalty`` for an empty episode.

    ``errors`` is ``act_parse_errors + unknown_tools + invalid_arguments``. An episode is empty when it made no
    valid call and gave no final answer. The result is always in ``[-penalty * (max_count + 1), 0]``.
    """

    def __init__(self, penalty: float = 0.1, max_count: int = 10, empty_penalty: bool = True) -> None:
        """Configure the penalty.

        Args:
            penalty: penalty per error (>= 0).
            max_count: errors beyond this count are not penalised further (>= 0).
            empty_penalty: also subtract ``penalty`` when the episode has no calls and no final answer.
        """
        if penalty < 0 or max_count < 0:
            raise ValueError(f"penalty and max_count must be >= 0, got {penalty} and {max_count}")
        self.penalty = penalty
        self.max_count = max_count
        self.empty_penalty = empty_penalty

    def __call__(self, episode: Episode) -> float:
        """The (non-positive) format reward of ``episode``."""
        stats = episode.stats
        errors = stats.act_parse_errors + stats.unknown_tools + stats.invalid_arguments
        reward = -self.penalty * min(errors, self.max_count)
        if self.empty_penalty and episode.final_answer is None and not episode.calls:
            reward -= self.penalty
        return reward
