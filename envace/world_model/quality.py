"""World-model quality during training: live fidelity, audits of rehearsed episodes, and the collusion guard.

``WorldQuality`` is the LightningModule's one place for these. After each rollout it replays a share of the rehearsed
episodes in the real environment (``envace.world_model.audit``), then, once the episodes are scored, measures their
sim-to-real gap, feeds the collusion guard and applies its response, and collects the live fidelity probes of the calls
a real environment or the cache answered. Its metrics are keyed the same on every step (window means over the last
audited episodes), so that ranks can reduce them together.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torch import nn

from envace.rewards.base import Reward
from envace.rewards.scoring import guarded
from envace.types import Episode, error_text
from envace.world_model.audit import WorldAudit, replay, sim_to_real
from envace.world_model.fidelity import LiveFidelity
from envace.world_model.guard import CollusionGuard
from envace.worlds.base import World
from envace.worlds.cache import ResponseCache

WINDOW = 64
"""Audited episodes in the sliding windows of the audit metrics."""


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _gap(episode: Episode, rewards: list[Reward]) -> float | None:
    """The audited episode's sim-to-real gap, or None after failing the episode (a reward raised or was not finite)."""
    return guarded(episode, "reward on the audited real responses", lambda: sim_to_real(episode, rewards))


class WorldQuality(nn.Module):
    """Live fidelity, audits and the collusion guard of one training run.

    Args:
        world: the training world (its cache, when it has one, also supplies shaping targets; a ``ground``
            response needs its ``ground`` method).
        audit: which rehearsed episodes to replay in the real environment; None replays none.
        guard: the collusion guard; needs ``audit``.

    Raises:
        ValueError: a guard without audits, or a ``ground`` guard with a world that cannot raise its real share.
    """

    def __init__(self, world: World, audit: WorldAudit | None = None, guard: CollusionGuard | None = None) -> None:
        super().__init__()
        if guard is not None and (audit is None or audit.fraction == 0):
            raise ValueError("guard needs audited episodes: set audit (with fraction > 0) to measure the sim-to-real "
                             "gap it watches")
        if guard is not None and guard.action == "ground" and not hasattr(world, "ground"):
            raise ValueError(f"guard.action 'ground' raises the real/cache share of a HybridWorld; the training world "
                             f"is a {type(world).__name__}")
        self.world, self.audit, self.guard = world, audit, guard
        cache = getattr(world, "cache", None)
        self.recorded: ResponseCache = cache if isinstance(cache, ResponseCache) else ResponseCache()
        self.live = LiveFidelity()
        self._horizons: deque[float] = deque(maxlen=WINDOW)
        self._departed: deque[float] = deque(maxlen=WINDOW)
        self._free_exact: deque[float] = deque(maxlen=WINDOW)
        self._gaps: deque[float] = deque(maxlen=WINDOW)
        self.audited_total = 0

    def replay(self, episodes: list[Episode], step: int) -> list[Episode]:
        """Replay the selected rehearsed episodes in the real environment; returns them.

        Call before scoring: shaping reads the real responses. A replay that raises or times out fails its episode
        (``EpisodeStats.failed``), which is then not audited.
        """
        if self.audit is None:
            return []
        audited = []
        for episode in self.audit.select(episodes, step):
            try:
                replay(episode, self.audit.tool_timeout_s)
            except Exception as exc:  # noqa: BLE001 - fails this episode only
                episode.stats.fail(f"audit replay in {episode.task.environment.class_path}: {error_text(exc)}")
                continue
            audited.append(episode)
        return audited

    def after_scoring(self, episodes: list[Episode], audited: list[Episode], rewards: list[Reward]) -> dict[str, float]:
        """Gaps, guard, probes: everything that needs scored episodes; returns this step's metrics.

        Episodes that failed (in scoring, or here: a reward that raises on the real responses) are left out.
        """
        measured, gaps = [], []
        for episode in audited:
            gap = None if episode.stats.failed else _gap(episode, rewards)
            if gap is not None:
                measured.append(episode)
                gaps.append(gap)
        for episode, gap in zip(measured, gaps):
            audit = episode.audit
            self._horizons.append(float(audit.horizon))
            self._departed.append(float(audit.departed))
            self._free_exact.append(_mean(audit.exact))
            self._gaps.append(gap)
        self.audited_total += len(audited)
        metrics: dict[str, float] = {}
        if self.audit is not None:
            metrics.update({
                "audit_episodes": float(len(audited)),
                "real_calls_audit": float(sum(len(e.audit.real) for e in audited)),
                "fidelity_horizon": _mean(self._horizons),
                "departed_rate": _mean(self._departed),
                "free_exact_match": _mean(self._free_exact),
                "sim2real_gap": _mean(self._gaps),
            })
        if self.guard is not None:
            metrics.update(self._guard(episodes, gaps))
        probes = [(r.call.name, r.probe) for e in episodes for r in e.rehearsals if r.probe is not None]
        self.live.update([p for _, p in probes], [t for t, _ in probes])
        return metrics

    def _guard(self, episodes: list[Episode], gaps: list[float]) -> dict[str, float]:
        assert self.guard is not None
        self.guard.observe(gaps)
        if self.guard.should_ground():
            self.world.ground(self.guard.shift)  # type: ignore[attr-defined]  (checked in __init__)
        penalized = self.guard.penalize(episodes)
        return {"collusion_gap": self.guard.gap, "collusion_alarm": float(self.guard.alarm),
                "collusion_penalized": float(penalized)}

    def state_dict_extra(self) -> dict[str, Any]:
        """What a resumed run needs: the guard's window and alarm, the hybrid world's grounding boost and its cache."""
        cache = _response_cache(self.world)
        return {"guard": self.guard.state_dict() if self.guard is not None else None,
                "world_boost": float(getattr(self.world, "boost", 0.0)), "audited_total": self.audited_total,
                "world_cache": cache.state_dict() if cache is not None else None}

    def load_state_dict_extra(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict_extra``'s output."""
        if self.guard is not None and state.get("guard") is not None:
            self.guard.load_state_dict(state["guard"])
        if hasattr(self.world, "boost"):
            self.world.boost = float(state.get("world_boost", 0.0))  # type: ignore[attr-defined]
        self.audited_total = int(state.get("audited_total", 0))
        cache = _response_cache(self.world)
        if cache is not None and state.get("world_cache") is not None:
            cache.load_state_dict(state["world_cache"])

    def fidelity_logs(self) -> dict[str, float]:
        """The live fidelity since the last call (synced over ranks), keyed ``<metric>`` and ``<tool>/<metric>``."""
        return self.live.compute_and_reset()


def _response_cache(world: Any) -> ResponseCache | None:
    """The world's response cache of recorded real answers (hybrid and cache worlds), if it has one."""
    cache = getattr(world, "cache", None)
    return cache if isinstance(cache, ResponseCache) else None
