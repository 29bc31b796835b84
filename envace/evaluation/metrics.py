"""Rollout metrics: per-role rewards, success, token counts, parse-error, truncation and tool-error rates.

Pure functions of episodes; the LightningModule logs what they return. Rates are per opportunity (per act turn,
per rehearsed call), so they stay comparable as episodes get longer.
"""

from __future__ import annotations

from envace.types import Episode, Rehearsal, Role, is_error_text


def reports_error(rehearsal: Rehearsal) -> bool:
    """A call a world answered well-formed whose response is a tool error (``envace.types.is_error_value``).

    A real tool that raised or returned an error object, a cached such response, or a rehearsed one; not an error the
    world substituted for a malformed rehearsal (``ok`` False, counted in ``parse_error_rate_rehearse``).
    """
    return rehearsal.ok and is_error_text(rehearsal.content)


def _rate(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


COUNT_METRICS = frozenset({"tokens_act", "tokens_rehearse", "real_calls", "real_calls_saved", "user_failures",
                           "private_real_calls", "failed_episodes", "tool_timeouts"})
"""Keys of ``rollout_metrics`` that count things in a batch: an evaluation sums them over its batches and ranks (a
256-task test that made 456 real calls logs 456), where the other keys are means weighted by the episodes."""


def rollout_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Aggregate counters of one batch of episodes, keyed by metric name (role suffix ``_act`` / ``_rehearse``).

    Rewards and success are means over the episodes that did not fail (a failed episode has no reward);
    ``failed_episodes`` counts the others.
    """
    stats = [e.stats for e in episodes]
    scored = [e for e in episodes if not e.stats.failed]
    rehearsals = [r for e in scored for r in e.rehearsals if r.sample is not None]
    reh_success = [float(e.success) for e in scored for r in e.rehearsals if r.sample is not None]
    act_turns = sum(s.act_turns for s in stats)
    world_calls = sum(len(e.rehearsals) for e in episodes)  # every call a world answered, real ones included
    rehearsed = sum(s.rehearse_calls for s in stats)  # the calls a model wrote the response of
    answered = [r for e in scored for r in e.rehearsals if r.ok]  # well-formed answers of the scored episodes
    attempted = sum(len(e.calls) + s.unknown_tools + s.invalid_arguments for e, s in zip(episodes, stats))
    n = len(episodes)
    return {
        "reward_act": _mean([e.reward for e in scored]),
        "reward_rehearse": _mean([r.reward for r in rehearsals]),
        "success_act": _mean([float(e.success) for e in scored]),
        "success_rehearse": _mean(reh_success),
        "tokens_act": float(sum(row.role_ids.count(int(Role.ACT)) for e in episodes for row in e.act_rows())),
        "tokens_rehearse": float(sum(r.sample.loss_mask.count(1) for r in rehearsals if r.sample is not None)),
        "parse_error_rate_act": _rate(sum(s.act_parse_errors for s in stats), act_turns),
        "parse_error_rate_rehearse": _rate(sum(s.rehearse_parse_errors for s in stats), rehearsed),
        "truncation_rate_act": _rate(sum(s.act_truncated for s in stats), act_turns),
        "truncation_rate_rehearse": _rate(sum(s.rehearse_truncated for s in stats), rehearsed),
        "invalid_call_rate": _rate(sum(s.unknown_tools + s.invalid_arguments for s in stats), attempted),
        "tool_error_rate": _rate(sum(reports_error(r) for r in answered), len(answered)),  # raised or returned
        "turns_per_episode": _rate(act_turns, n),
        "calls_per_episode": _rate(world_calls, n),
        "real_calls": float(sum(s.real_calls for s in stats)),  # spent answering calls in this batch
        "real_calls_saved": float(world_calls - sum(s.real_calls for s in stats)),  # vs. one real call per call
        "share_real": _rate(sum(s.real_answers for s in stats), world_calls),
        "share_cache": _rate(sum(s.cache_calls for s in stats), world_calls),
        "share_rehearse": _rate(rehearsed, world_calls),
        "real_calls_per_episode": _rate(sum(s.real_calls for s in stats), n),
        "turn_limit_rate": _rate(sum(s.turn_limit for s in stats), n),
        "call_limit_rate": _rate(sum(s.call_limit for s in stats), n),
        "context_limit_rate": _rate(sum(s.context_limit for s in stats), n),
        "error_end_rate": _rate(sum(s.ended_by_error for s in stats), n),
        "user_turns_per_episode": _rate(sum(s.user_turns for s in stats), n),
        "user_stop_rate": _rate(sum(s.user_stop for s in stats), n),  # conversations the simulated user ended
        "gate_stop_rate": _rate(sum(s.gate_stop for s in stats), n),  # ended by the turn gate (checklist)
        "rerenders_per_episode": _rate(sum(s.rerenders for s in stats), n),  # new act rows: the template rewrote
        "user_failures": float(sum(s.user_failures for s in stats)),  # simulated-user replies that failed
        "private_rehearsals_per_episode": _rate(sum(s.private_rehearsals for s in stats), n),  # test-time attempts
        "private_tokens_per_episode": _rate(sum(s.private_tokens for s in stats), n),
        "private_real_calls": float(sum(s.private_real_calls for s in stats)),  # always 0: rehearsal is private
        "failed_episodes": float(sum(s.failed for s in stats)),  # environment, world or reward raised: not trained
        "tool_timeouts": float(sum(s.tool_timeouts for s in stats)),  # real calls past the world's tool timeout
    }


def failure_causes(episodes: list[Episode]) -> dict[str, list[str]]:
    """The failed episodes' task ids by failure cause (in first-seen order), for one warning per cause."""
    causes: dict[str, list[str]] = {}
    for episode in episodes:
        if episode.stats.failed:
            causes.setdefault(episode.stats.failure, []).append(episode.task.id)
    return causes


ROLLOUT_METRICS: tuple[str, ...] = tuple(rollout_metrics([]))
"""The names ``rollout_metrics`` returns."""
