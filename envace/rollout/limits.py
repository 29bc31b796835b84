"""Limits and accounting of a running episode: the rollout's budgets, call validation, and the stats of replies.

``EpisodeLimits`` is a mixin of ``EpisodeRunner`` (``envace.rollout.runner``). It applies the benchmark's loop rules
(``envace.rollout.rules``) after every phase, ends an episode whose context has no room for a full act turn, checks
each call before it reaches the world (``validate_calls``), counts the world's replies in ``EpisodeStats``, and after
the tool responses are delivered applies ``on_world_error``, ``max_turns`` and ``max_steps_per_user_turn``.
"""

from __future__ import annotations

from envace.roles.parsing import CallError, validate_call
from envace.rollout.config import RolloutConfig
from envace.rollout.rules import LoopRules
from envace.rollout.state import _Live
from envace.types import Rehearsal, ToolCall, error_text
from envace.worlds.base import ToolReply, ToolRequest


class EpisodeLimits:
    """The runner's limit and accounting steps (mixed into ``EpisodeRunner``; ``UserTurns`` has ``_next_user_turn``)."""

    config: RolloutConfig
    rules: LoopRules

    def _apply_rules(self, live: list[_Live]) -> None:
        """End the running episodes the loop rules end (a rule that raises fails that episode only)."""
        for s in live:
            if s.done:
                continue
            try:
                reason = self.rules.stop_reason(s.episode)
            except Exception as exc:  # noqa: BLE001 - a broken rule fails this episode, never the rollout
                s.episode.stats.fail(f"{type(self.rules).__name__}.stop_reason: {error_text(exc)}")
                s.done = True
                continue
            if reason:
                s.episode.stats.stop_reason = reason
                s.pending = []
                s.done = True

    def _ready_to_act(self, states: list[_Live]) -> list[_Live]:
        """The episodes whose act turn is due; one whose context has no room for a full turn ends here."""
        budget = self.config.act_max_new_tokens
        for s in states:
            if s.stream is not None and len(s.stream) + budget > self.config.max_context_tokens:
                s.episode.stats.context_limit = True
                s.done = True
        return [s for s in states if not s.done and not s.awaiting_user]

    def _check(self, call: ToolCall | CallError, s: _Live) -> ToolCall | CallError:
        if isinstance(call, CallError):
            return call
        task = s.episode.task
        if not self.config.validate_calls:  # the environment answers every call, as the benchmark's own loop does
            return call
        hidden = task.tool(call.name) is not None and call.name in task.hidden_tools() - s.unlocked
        if task.tool(call.name) is None or hidden:
            s.episode.stats.unknown_tools += 1  # the error never names a hidden tool
            available = [spec["function"]["name"] for spec in task.visible_tools()] + sorted(s.unlocked)
            listed = ", ".join(available) or "(none)"
            return CallError("UNKNOWN_TOOL", f"tool '{call.name}' is not available; available: {listed}")
        error = validate_call(call, task, self.config.validate_calls)
        if error is not None:
            stats = s.episode.stats
            stats.unknown_tools += int(error.code == "UNKNOWN_TOOL")
            stats.invalid_arguments += int(error.code == "INVALID_ARGUMENTS")
            return error
        return call

    def _record(self, s: _Live, pairs: list[tuple[ToolRequest | CallError, ToolReply | CallError]]) -> None:
        stats = s.episode.stats
        for req, reply in pairs:
            if isinstance(req, ToolRequest) and isinstance(reply, ToolReply):
                stats.real_calls += reply.real_calls
                stats.real_answers += int(reply.source == "real")
                stats.cache_calls += int(reply.source == "cache")
                stats.rehearse_calls += int(reply.source in ("rehearse", "frozen"))
                stats.rehearse_parse_errors += int(reply.parse_error)
                stats.rehearse_truncated += int(reply.truncated)
                stats.tool_timeouts += reply.timeouts
                s.episode.rehearsals.append(
                    Rehearsal(req.call, reply.content, reply.ok, reply.sample, source=reply.source,
                              real=reply.real_content, probe=reply.probe, request=req)
                )

    def _after_tools(self, s: _Live, pairs: list[tuple[ToolRequest | CallError, ToolReply | CallError]]) -> None:
        stats = s.episode.stats
        world_failed = any(isinstance(r, ToolReply) and not r.ok for _, r in pairs)
        if world_failed and self.config.on_world_error == "end":
            stats.ended_by_error = True
            s.done = True
        elif stats.act_turns >= self.config.max_turns:
            stats.turn_limit = True
            s.done = True
        elif 0 < self.config.max_steps_per_user_turn <= s.turn_steps:
            stats.step_limits += 1
            self._next_user_turn(s, cut=True)
