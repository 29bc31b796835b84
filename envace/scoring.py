"""Scoring: turn finished episodes into row rewards (task reward for both roles, optional rehearse shaping)."""

from __future__ import annotations

from envace.data.tasks import reference_calls
from envace.rewards.base import Reward
from envace.rewards.shaping import PredictionErrorShaping
from envace.rewards.task_success import task_score
from envace.types import Episode


def score_episodes(
    episodes: list[Episode], rewards: list[Reward], shaping: PredictionErrorShaping | None = None
) -> None:
    """Set ``episode.reward``, ``episode.success`` and the reward of every row, in place.

    The act row gets the summed rewards. Each rehearse row gets the same task reward (EnvACE: both roles optimise
    task success) plus, with ``shaping``, a penalty growing with its response's distance to the recorded real
    response of the same call, where the task's reference trajectory has one.
    """
    for episode in episodes:
        episode.reward = float(sum(reward(episode) for reward in rewards))
        episode.success = task_score(episode.task, episode.calls, episode.final_answer) >= 1.0 - 1e-9
        episode.act.reward = episode.reward
        recorded = _recorded(episode) if shaping is not None else {}
        for rehearsal in episode.rehearsals:
            extra = shaping(rehearsal, recorded) if shaping is not None else None
            rehearsal.reward = episode.reward + (extra or 0.0)
            if rehearsal.sample is not None:
                rehearsal.sample.reward = rehearsal.reward


def _recorded(episode: Episode) -> dict[str, str]:
    return {call.key(): content for call, content in reference_calls(episode.task)}
