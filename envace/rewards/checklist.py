"""The checklist reward: per-turn weighted standards judged by a model, step by step.

A task carries ``checklists`` (read with ``getattr(task, "checklists", ())``): a tuple of checklists, each a tuple
over the conversation's user turns, each a tuple of standards. A standard is a dataclass or a dict with
``question``, ``focus_on``, ``pass_condition``, ``failure_examples`` (list), ``evidence`` (list of
``{"snippet": str}``), ``weight`` (number) and ``required_for_next_turn`` (bool).

For every completed user turn, each assistant step of that turn is judged against each standard of the turn: one
judge request per (step, standard), the verdict a strict JSON object (``envace.rewards.verdicts.parse_verdict``). A
standard is satisfied in a turn if some step satisfies it (see ``ChecklistReward`` for the formula). Judges
(``envace.rewards.judges``):

- ``ScriptedJudge``: answers from a function or a table (tests);
- ``LocalJudge``: a local Hugging Face model through ``envace.engines.chat_model.ChatModel``;
- ``HTTPJudge``: an OpenAI-compatible ``/v1/chat/completions`` server run by the user (standard library only).

The standards and the judge prompt live in ``envace.rewards.checklist_prompt``, the conversation as the judge reads
it (user turns, steps, tool errors) in ``envace.rewards.transcript``. This module keeps the reward, its aggregation
and the masking of groups whose judging failed.

Differences from the reference implementation:

- a judge that cannot give a verdict (unreachable server, HTTP errors, malformed replies after all retries) never
  counts as ``False``: the reward raises ``JudgeUnavailable``, the scorer fails the episode, and
  ``mask_groups_with_failed_judging`` can mask its whole GRPO group;
- an assistant message's reasoning is read from ``message["reasoning"]`` (or a ``<think>`` block); a message without
  either has no thinking, and its whole content is the visible reply;
- verdicts are cached by content (the full prompt and the judge's identity), so an identical (step, standard)
  request is asked once per run;
- tool errors do not end the episode; a tool error after a step makes the standards focused on tool calls or tool
  content fail for that step, without asking the judge (the reference's shortcut).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envace.rewards.checklist_prompt import _Standard, build_prompt, read_checklists
from envace.rewards.judges import JUDGE_UNAVAILABLE, Judge, JudgeRequest, JudgeUnavailable
from envace.rewards.transcript import UserTurn, is_tool_error, split_user_turns
from envace.types import Episode, unreward

TOOL_FOCUS = frozenset({"assistant.tool_calls", "tool.content"})
"""``focus_on`` values that a tool error after the step fails without asking the judge."""


def _tool_error_after(messages: Sequence[Mapping[str, Any]], index: int, end: int) -> bool:
    stop = index + 1
    while stop < end and messages[stop].get("role") == "tool":
        if is_tool_error(messages[stop]):
            return True
        stop += 1
    return False


# ---------------------------------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------------------------------


class ChecklistReward:
    """Reward of an episode from its task's checklists, judged step by step by a model.

    For a completed user turn ``t`` (the assistant replied without tool calls, or the conversation moved on),
    checklist ``j`` and standard ``k`` of that turn, with verdicts ``v(s, k)`` over the turn's assistant steps ``s``::

        sat_jtk = OR_s v(s, k)                       (a standard is met if some step meets it)
        r_t     = sum_j sum_k weight_jtk * sat_jtk
        R       = sum_t r_t                          (turns not reached or not completed contribute 0)
        score   = R / num_checklists / max_num_turns

    where ``max_num_turns`` is the number of user turns of the checklists (the longest one). With weights summing to
    1 per turn, the score lies in [0, 1]. A step followed by a tool error fails the standards focused on
    ``assistant.tool_calls`` or ``tool.content`` without asking the judge.

    ``stop_on_required`` reproduces the reference's termination in scoring only: after a turn where more than half
    of the checklists have a ``required_for_next_turn`` standard unmet, later turns score 0 (and are not judged).
    Ending the rollout itself at that point needs a hook in the runner, which this reward does not provide.

    Judge failures are never scored: if any verdict needed is None, the reward raises ``JudgeUnavailable`` (the scorer
    then fails the episode; ``mask_groups_with_failed_judging`` masks its group). Verdicts are cached by content (the
    full prompt and the judge's identity): an identical request is asked once per run.

    Args:
        judge: the judge (``HTTPJudge``, ``LocalJudge`` or ``ScriptedJudge``).
        stop_on_required: score 0 for turns after an unmet required standard (see above).
        score_incomplete_turns: also score a last turn the assistant did not finish (a budget ended the episode).
        cache_size: verdicts kept (least recently used dropped first).
    """

    def __init__(self, judge: Judge, stop_on_required: bool = True, score_incomplete_turns: bool = False,
                 cache_size: int = 1_000_000) -> None:
        self.judge = judge
        self.stop_on_required = stop_on_required
        self.score_incomplete_turns = score_incomplete_turns
        self.cache_size = cache_size
        self.cache: OrderedDict[str, bool] = OrderedDict()
        self.reset_metrics()

    # metrics ---------------------------------------------------------------------------------------------------------

    def reset_metrics(self) -> None:
        """Zero the counters that ``metrics`` reports."""
        self._passes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._calls = self._hits = self._failures = self._shortcuts = 0

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """Counters since the last reset (zeroed after with ``reset``).

        Per standard, its pass rate over the scored turns (``checklist/pass_rate/<turn>.<k>``, turn and standard from
        1; ``c<j>.<turn>.<k>`` for checklists after the first); ``checklist/judge_calls`` (requests sent to the judge),
        ``checklist/cache_hits``, ``checklist/shortcuts`` (failed by a tool error without a call) and
        ``checklist/judge_failures`` (requests without a verdict).
        """
        out = {f"checklist/pass_rate/{key}": passed / seen for key, (passed, seen) in sorted(self._passes.items())}
        out.update({"checklist/judge_calls": float(self._calls), "checklist/cache_hits": float(self._hits),
                    "checklist/shortcuts": float(self._shortcuts), "checklist/judge_failures": float(self._failures)})
        if reset:
            self.reset_metrics()
        return out

    # scoring ---------------------------------------------------------------------------------------------------------

    def __call__(self, episode: Episode) -> float:
        """The checklist score of ``episode`` (see the class docstring).

        Raises:
            ValueError: the task has no checklists, or a standard is invalid (e.g. a weight that is not a number).
            JudgeUnavailable: the judge gave no verdict for some (step, standard).
        """
        return self.score(episode)[0]

    def score(self, episode: Episode) -> tuple[float, list[float]]:
        """``(score, r_t per checklist turn)`` of ``episode``; raises like ``__call__``."""
        checklists = read_checklists(episode.task)
        max_turns = max(len(c) for c in checklists)
        turn_rewards = [0.0] * max_turns
        if max_turns == 0:
            return 0.0, turn_rewards
        messages = episode.messages
        turns = split_user_turns(messages)
        scored = [t for t in range(min(len(turns), max_turns))
                  if turns[t].completed or (self.score_incomplete_turns and turns[t].steps)]
        if self.stop_on_required:
            for t in scored:
                sat = self._turn(episode, checklists, turns, t)
                turn_rewards[t] = _turn_reward(checklists, t, sat)
                if _unmet(checklists, t, sat) > len(checklists) / 2:
                    break
        else:
            sats = self._turns(episode, checklists, turns, scored)
            for t, sat in zip(scored, sats):
                turn_rewards[t] = _turn_reward(checklists, t, sat)
        return sum(turn_rewards) / len(checklists) / max_turns, turn_rewards

    def continue_after_turn(self, episode: Episode) -> bool:
        """The rollout's turn gate (``EpisodeRunner.run(turn_gate=...)``): does the conversation go on?

        Called when the act role has answered a user turn and another would follow. False when more than half of
        the checklists have a ``required_for_next_turn`` standard of that turn unmet by every step: the reference
        ends the conversation there, and so does the rollout (no compute is spent on turns that would score 0).
        The verdicts land in the cache, so scoring the episode afterwards sends nothing again; pass rates are
        counted once, at scoring. Always True without ``stop_on_required`` or without a required standard.

        Raises:
            JudgeUnavailable: the judge gave no verdict (the runner then fails the episode; its group is masked).
        """
        checklists = read_checklists(episode.task)
        turns = split_user_turns(episode.messages)
        t = len(turns) - 1  # the turn just answered
        if not self.stop_on_required or t < 0 or not any(s.required for c in checklists if t < len(c) for s in c[t]):
            return True
        sat = self._turns(episode, checklists, turns, [t], count=False)[0]
        return _unmet(checklists, t, sat) <= len(checklists) / 2

    def _turn(self, episode: Episode, checklists: list[list[list[_Standard]]], turns: list[UserTurn],
              t: int) -> list[list[bool]]:
        return self._turns(episode, checklists, turns, [t])[0]

    def _turns(self, episode: Episode, checklists: list[list[list[_Standard]]], turns: list[UserTurn],
               scored: Iterable[int], count: bool = True) -> list[list[list[bool]]]:
        """Per scored turn, per checklist, per standard: satisfied by some step (one batched judge call).

        ``count``: add the verdicts to the per-standard pass rates (scoring does; the rollout's gate does not).
        """
        messages, task_id = episode.messages, str(getattr(episode.task, "id", "?"))
        scored = list(scored)
        # sat[n][j][k] for scored turn n; verdicts from the shortcut, the cache or the judge
        sat = [[[False] * (len(c[t]) if t < len(c) else 0) for c in checklists] for t in scored]
        wanted: dict[str, tuple[JudgeRequest, list[tuple[int, int, int]]]] = {}
        for n, t in enumerate(scored):
            turn = turns[t]
            for j, checklist in enumerate(checklists):
                for k, standard in enumerate(checklist[t] if t < len(checklist) else []):
                    for s, index in enumerate(turn.steps):
                        if standard.focus_on in TOOL_FOCUS and _tool_error_after(messages, index, turn.end):
                            self._shortcuts += 1
                            continue
                        prompt = build_prompt(standard, messages, turns, t, s)
                        key = hashlib.sha256(f"{self.judge.identity}\n{prompt}".encode()).hexdigest()
                        if key in self.cache:
                            self._hits += 1
                            self.cache.move_to_end(key)
                            sat[n][j][k] = sat[n][j][k] or self.cache[key]
                        elif key in wanted:
                            self._hits += 1
                            wanted[key][1].append((n, j, k))
                        else:
                            request = JudgeRequest(prompt, task_id, j, t, s, k)
                            wanted[key] = (request, [(n, j, k)])
        if wanted:
            keys = list(wanted)
            answers = self.judge.judge([wanted[key][0] for key in keys])
            self._calls += len(keys)
            failed = [wanted[key][0] for key, answer in zip(keys, answers) if answer is None]
            if failed:
                self._failures += len(failed)
                where = ", ".join(f"turn {r.turn + 1} step {r.step + 1} standard {r.standard + 1}" for r in failed[:3])
                raise JudgeUnavailable(
                    f"task '{task_id}': judge {self.judge.identity} gave no verdict for {len(failed)} of {len(keys)} "
                    f"requests ({where}{', ...' if len(failed) > 3 else ''}): "
                    f"{getattr(self.judge, 'last_error', '') or 'unknown cause'}")
            for key, answer in zip(keys, answers):
                self.cache[key] = bool(answer)
                for n, j, k in wanted[key][1]:
                    sat[n][j][k] = sat[n][j][k] or bool(answer)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        for n, t in enumerate(scored if count else ()):
            for j, row in enumerate(sat[n]):
                for k, ok in enumerate(row):
                    counts = self._passes[f"{t + 1}.{k + 1}" if j == 0 else f"c{j + 1}.{t + 1}.{k + 1}"]
                    counts[0] += int(ok)
                    counts[1] += 1
        return sat


def _unmet(checklists: list[list[list[_Standard]]], t: int, sat: list[list[bool]]) -> int:
    """How many checklists have a ``required_for_next_turn`` standard of turn ``t`` unmet."""
    return sum(any(s.required and not ok for s, ok in zip(c[t], sat[j])) if t < len(c) else False
               for j, c in enumerate(checklists))


def _turn_reward(checklists: list[list[list[_Standard]]], t: int, sat: list[list[bool]]) -> float:
    """``r_t = sum_j sum_k weight_jtk * sat_jtk``."""
    return sum(s.weight for j, c in enumerate(checklists) if t < len(c) for s, ok in zip(c[t], sat[j]) if ok)


# ---------------------------------------------------------------------------------------------------------------------
# Group masking
# ---------------------------------------------------------------------------------------------------------------------


def judging_failed(episode: Episode) -> bool:
    """The episode failed because the checklist judge gave no verdict (its failure cause names ``JudgeUnavailable``)."""
    return episode.stats.failed and JUDGE_UNAVAILABLE in episode.stats.failure


def mask_groups_with_failed_judging(episodes: Sequence[Episode]) -> int:
    """Fail every episode of a GRPO group (``group_index``) in which judging failed for some episode.

    Call after ``envace.rewards.scoring.score_episodes`` and before the advantages: a group whose judge was partly
    unavailable is dropped whole rather than given a baseline from the episodes that happened to be judged. Masked
    episodes are unrewarded as the scorer unrewards failed ones (reward 0, row rewards NaN; ``Episode.samples`` is
    then empty).

    Returns:
        The number of episodes newly failed.
    """
    bad = {e.group_index for e in episodes if judging_failed(e)}
    masked = 0
    for episode in episodes:
        if episode.group_index in bad and not episode.stats.failed:
            episode.stats.fail(f"masked: {JUDGE_UNAVAILABLE} for another episode of group {episode.group_index} "
                               f"(task '{episode.task.id}')")
            unreward(episode)
            masked += 1
    return masked
