"""The collusion guard: an alarm when the rehearsed world pays more than the real one, and what to do about it.

The rehearse role is paid with the act role's task reward, so nothing but grounding stops it from making tasks easy
(lenient or invented results) instead of being right. The guard watches the sim-to-real gap of audited episodes
(``envace.world_model.audit``: reward in the rehearsed world minus the reward of the same actions on real responses)
over a
sliding window, and raises the alarm when its mean exceeds ``margin``. Its response is configurable:

- ``warn``: a warning (once per alarm) and the ``collusion_alarm`` metric;
- ``ground``: also move ``shift`` of the hybrid world's rehearse probability to real and cache answers (at most once
  per window of fresh evidence);
- ``penalize``: also, while the alarm is on, lower each audited episode's rehearse rows' reward by ``penalty`` times
  that episode's positive gap.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_warn

from envace.types import Episode

Action = Literal["warn", "ground", "penalize"]


class CollusionGuard:
    """Sliding-window alarm on the sim-to-real gap, with a configurable response.

    Args:
        margin: the alarm goes on when the window's mean gap exceeds this.
        action: ``warn``, ``ground`` (needs a world with a real or cache share to raise: ``HybridWorld``) or
            ``penalize``.
        window: audited episodes in the sliding window.
        min_episodes: no alarm before the window holds this many.
        shift: rehearse probability moved to real and cache per ``ground`` response.
        penalty: per unit of gap, the reward taken from an audited episode's rehearse rows under ``penalize``.
    """

    def __init__(
        self,
        margin: float = 0.1,
        action: Action = "warn",
        window: int = 64,
        min_episodes: int = 16,
        shift: float = 0.1,
        penalty: float = 1.0,
    ) -> None:
        if action not in ("warn", "ground", "penalize"):
            raise ValueError(f"guard.action must be 'warn', 'ground' or 'penalize', got {action!r}")
        if window < 1 or not 1 <= min_episodes <= window:
            raise ValueError(f"guard: need window >= 1 and 1 <= min_episodes <= window, got {window}, {min_episodes}")
        if margin < 0 or shift < 0 or penalty < 0:
            raise ValueError("guard: margin, shift and penalty must be >= 0")
        self.margin, self.action, self.min_episodes = margin, action, min_episodes
        self.shift, self.penalty = shift, penalty
        self.gaps: deque[float] = deque(maxlen=window)
        self.alarm = False
        self.alarms = 0  # times the alarm went on
        self._fresh = 0  # gaps observed since the last ``ground`` response

    def state_dict(self) -> dict[str, Any]:
        """The window and the alarm, for checkpoints."""
        return {"gaps": list(self.gaps), "alarm": self.alarm, "alarms": self.alarms, "fresh": self._fresh}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output (the window keeps its configured size)."""
        self.gaps.clear()
        self.gaps.extend(float(g) for g in state.get("gaps", []))
        self.alarm = bool(state.get("alarm", False))
        self.alarms = int(state.get("alarms", 0))
        self._fresh = int(state.get("fresh", 0))

    @property
    def gap(self) -> float:
        """The window's mean gap (0 when empty)."""
        return sum(self.gaps) / len(self.gaps) if self.gaps else 0.0

    def observe(self, gaps: list[float]) -> bool:
        """Add audited episodes' gaps and update the alarm; returns it."""
        self.gaps.extend(gaps)
        self._fresh += len(gaps)
        was_on = self.alarm
        self.alarm = len(self.gaps) >= self.min_episodes and self.gap > self.margin
        if self.alarm and not was_on:
            self.alarms += 1
            rank_zero_warn(
                f"collusion guard: rehearsed-world reward exceeds the real reward of the same actions by "
                f"{self.gap:.3f} over the last {len(self.gaps)} audited episodes (margin {self.margin}); "
                f"response: {self.action}"
            )
        return self.alarm

    def should_ground(self) -> bool:
        """The ``ground`` response is due: the alarm is on and a window's worth of evidence came since the last."""
        if self.action != "ground" or not self.alarm or self._fresh < self.min_episodes:
            return False
        self._fresh = 0
        return True

    def penalize(self, episodes: list[Episode]) -> int:
        """Apply the ``penalize`` response; returns how many episodes were penalised.

        With the alarm on, lowers the rehearse rows' reward of audited episodes with a positive gap. Call after
        scoring, before advantages.
        """
        if self.action != "penalize" or not self.alarm:
            return 0
        count = 0
        for episode in episodes:
            audit = episode.audit
            if audit is None or audit.real_reward is None or episode.reward <= audit.real_reward:
                continue
            cut = self.penalty * (episode.reward - audit.real_reward)
            for rehearsal in episode.rehearsals:
                if rehearsal.sample is not None:
                    rehearsal.reward -= cut
                    rehearsal.sample.reward = rehearsal.reward
            count += 1
        return count
