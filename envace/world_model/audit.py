"""World audits: replay a rehearsed episode's actions in the real environment and see where the two worlds part.

An audit takes a finished episode whose tool responses were (at least partly) rehearsed, executes its calls in order
on a fresh instance of the task's real environment, and compares each response the act role saw with the real one:

- the **free-running fidelity horizon** is the index of the first call whose response departs from the real one
  (not an exact match under the canonicalisation of ``envace.world_model.fidelity``); an episode that never departs has
  a horizon equal to its number of calls (right-censored; ``departed`` tells which);
- the **sim-to-real gap** of the episode is the reward it earned in the rehearsed world minus the reward the same
  actions (its calls and final answer) earn when the responses are the real ones. A reward that reads only the
  calls and the answer (``TaskSuccess``) cannot be raised by a lenient world model, so its gap is 0 by construction;
  a reward that reads the responses (``ObservedAnswerSuccess``, judges of tool content) can be gamed, and the gap
  measures by how much.

The real responses also become each call's ``Rehearsal.real`` (the target of shaping and grounding).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from envace.envs.real import DEFAULT_TOOL_TIMEOUT_S, EnvironmentUnusable, RealEnvironment
from envace.rewards.base import Reward
from envace.roles.compare import canonical_text, rehearsal_target
from envace.types import Episode


@dataclass
class AuditResult:
    """What one replay found.

    Attributes:
        real: the real response of each call, in order.
        exact: 1.0 where the response the act role saw equals the real one (canonically), per call.
        horizon: index of the first departing call; the number of calls when none departs.
        departed: some call departed.
        real_reward: the episode's reward with the real responses in place of the ones it saw (set by
            ``sim_to_real``).
    """

    real: list[str]
    exact: list[float]
    horizon: int
    departed: bool
    real_reward: float | None = None


@dataclass
class WorldAudit:
    """Which episodes are replayed for real, and how.

    Attributes:
        fraction: share of the episodes with at least one rehearsed response that are replayed (each audit costs
            one real call per call of the episode; they are counted apart from the calls that answer the act
            role).
        seed: seed of the selection.
        tool_timeout_s: most seconds the replay's environment constructor and each call may take (0: no limit); a
            replay that raises or times out fails its episode (``EpisodeStats.failed``), never the step.
    """

    fraction: float = 0.25
    seed: int = 0
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"audit.fraction must be in [0, 1], got {self.fraction}")
        if not self.tool_timeout_s >= 0:
            raise ValueError(f"audit.tool_timeout_s must be >= 0 (0: no limit), got {self.tool_timeout_s}")

    def select(self, episodes: list[Episode], step: int) -> list[Episode]:
        """The episodes to replay at ``step``.

        A reproducible ``fraction`` of those with a rehearsed response and a real environment (failed episodes
        excluded).
        """
        candidates = [e for e in episodes if e.task.environment is not None and rehearsed(e) and not e.stats.failed]
        rng = random.Random(f"{self.seed}:{step}")
        return [e for e in candidates if rng.random() < self.fraction]


def rehearsed(episode: Episode) -> bool:
    """The episode saw at least one response written by a model (the policy or a frozen simulator)."""
    return any(r.source in ("rehearse", "frozen") for r in episode.rehearsals)


def replay(episode: Episode, timeout_s: float = DEFAULT_TOOL_TIMEOUT_S) -> AuditResult:
    """Execute ``episode``'s calls in order on a fresh real environment and compare the responses.

    Sets each ``Rehearsal.real`` and ``episode.audit`` (only once every call was replayed).

    Raises:
        ValueError: the task has no real environment.
        EnvironmentUnusable: a call took longer than ``timeout_s`` (its timeout error is no real response).
        Exception: what the environment's constructor or a toolbox's ``call_tool`` raised.
    """
    if episode.task.environment is None:
        raise ValueError(f"task '{episode.task.id}' has no 'environment'; an audit replays calls on it")
    env = RealEnvironment(episode.task.environment, timeout_s)
    real, exact = [], []
    for rehearsal in episode.rehearsals:
        content, _ = env.execute(rehearsal.call)
        if env.unusable is not None:
            raise EnvironmentUnusable(env.unusable)
        real.append(content)
    for rehearsal, content in zip(episode.rehearsals, real):
        rehearsal.real = content
        exact.append(float(canonical_text(rehearsal.content) == canonical_text(rehearsal_target(content))))
    departures = [i for i, e in enumerate(exact) if e < 1.0]
    result = AuditResult(real, exact, departures[0] if departures else len(exact), bool(departures))
    episode.audit = result
    return result


def sim_to_real(episode: Episode, rewards: list[Reward]) -> float:
    """The episode's reward minus the reward of the same actions on the real responses (needs ``replay`` first).

    Sets ``episode.audit.real_reward``.
    """
    audit: AuditResult | None = episode.audit
    if audit is None:
        raise ValueError("sim_to_real needs a replayed episode (call replay first)")
    swapped = [replace(r, content=content) for r, content in zip(episode.rehearsals, audit.real)]
    on_real = replace(episode, rehearsals=swapped)
    audit.real_reward = float(sum(reward(on_real) for reward in rewards))
    return episode.reward - audit.real_reward
