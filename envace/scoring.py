"""Scoring: turn finished episodes into row rewards (task reward for both roles, optional rehearse shaping)."""

from __future__ import annotations

from envace.rewards.base import Reward
from envace.rewards.shaping import PredictionErrorShaping
from envace.rewards.task_success import task_score
from envace.types import Episode
from envace.worlds.cache import ResponseCache


def score_episodes(
    episodes: list[Episode],
    rewards: list[Reward],
    shaping: PredictionErrorShaping | None = None,
    recorded: ResponseCache | None = None,
) -> None:
    """Set ``episode.reward``, ``episode.success`` and the reward of every row, in place.

    The act row gets the summed rewards. Each rehearse row gets the same task reward (EnvACE: both roles optimise
    task success) plus, with ``shaping``, a penalty growing with its response's distance to the real response of the
    same call in the same state, where that is known: from an audit replay or a real answer (``Rehearsal.real``),
    else from ``recorded`` (default: the tasks' reference trajectories), see ``attach_recorded``.
    """
    if shaping is not None:
        attach_recorded(episodes, recorded if recorded is not None else ResponseCache())
    for episode in episodes:
        episode.reward = float(sum(reward(episode) for reward in rewards))
        episode.success = task_score(episode.task, episode.calls, episode.final_answer) >= 1.0 - 1e-9
        episode.act.reward = episode.reward
        for rehearsal in episode.rehearsals:
            extra = shaping(rehearsal) if shaping is not None else None
            rehearsal.reward = episode.reward + (extra or 0.0)
            if rehearsal.sample is not None:
                rehearsal.sample.reward = rehearsal.reward


def attach_recorded(episodes: list[Episode], recorded: ResponseCache) -> None:
    """Set ``Rehearsal.real`` from ``recorded`` where it is unknown.

    The recorded response is the one of the same call after the same earlier calls (``ResponseCache`` keys: a
    stateful cache never pairs a call with a response of another state).
    """
    for episode in episodes:
        earlier = []
        for rehearsal in episode.rehearsals:
            if rehearsal.real is None:
                rehearsal.real = recorded.peek(episode.task, earlier, rehearsal.call)
            earlier.append(rehearsal.call)
