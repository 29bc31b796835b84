"""Scoring: turn finished episodes into row rewards (task reward for both roles, optional rehearse shaping)."""

from __future__ import annotations

import math
from collections.abc import Callable

from envace.rewards.base import Reward
from envace.rewards.shaping import PredictionErrorShaping
from envace.rewards.task_success import task_score
from envace.types import Episode, error_text, unreward
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

    Fault isolation: a reward (or the shaping) that raises or returns a non-finite value for an episode fails that
    episode (``EpisodeStats.fail``, the cause naming the reward class and the error), never the step. A failed
    episode (here or earlier in the rollout) is not rewarded: ``reward`` 0, ``success`` False, and its rows' rewards
    NaN, the advantage estimator's "not applicable" (``Episode.samples`` already gives it no training rows).
    """
    if shaping is not None:
        attach_recorded(episodes, recorded if recorded is not None else ResponseCache())
    for episode in episodes:
        if not episode.stats.failed:
            _score(episode, rewards, shaping)
        if episode.stats.failed:
            unreward(episode)


def _score(episode: Episode, rewards: list[Reward], shaping: PredictionErrorShaping | None) -> None:
    """Reward one episode and its rows; on a reward that raises or is not finite, fail the episode instead."""
    total = 0.0
    for reward in rewards:
        value = guarded(episode, f"reward {type(reward).__name__}", lambda reward=reward: reward(episode))
        if value is None:
            return
        total += value
    extras = []
    for rehearsal in episode.rehearsals:
        where = f"shaping {type(shaping).__name__}"
        extra = guarded(episode, where, lambda r=rehearsal: shaping(r)) if shaping else 0.0
        if extra is None:
            return
        extras.append(extra)
    episode.reward = total
    spec = episode.task.success
    if spec.calls or spec.answer is not None or spec.state is not None:
        episode.success = task_score(episode.task, episode.calls, episode.final_answer) >= 1.0 - 1e-9
    # else: a checklist task without a success spec (its reward is the checklist judge's): success stays False
    for row in episode.act_rows():
        row.reward = episode.reward
    for rehearsal, extra in zip(episode.rehearsals, extras):
        rehearsal.reward = episode.reward + extra
        if rehearsal.sample is not None:
            rehearsal.sample.reward = rehearsal.reward


def guarded(episode: Episode, where: str, fn: Callable[[], float | None]) -> float | None:
    """``fn()`` as a finite float (a None shaping is 0), or None after failing ``episode`` with the cause."""
    try:
        value = fn()
        value = 0.0 if value is None else float(value)
    except Exception as exc:  # noqa: BLE001 - a broken reward fails this episode only
        episode.stats.fail(f"{where}: {error_text(exc)}")
        return None
    if not math.isfinite(value):
        episode.stats.fail(f"{where}: returned {value}")
        return None
    return value


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
