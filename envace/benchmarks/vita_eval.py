"""VitaBench episodes end to end: the policy serves a simulated user on the benchmark's environments, then is judged.

``evaluate_vita`` turns tasks into envace tasks (``vita.to_task``: the agent greets, the simulated user opens), runs
them with ``EpisodeRunner`` on a ``RealWorld`` (each episode its own ``VitaToolbox``, a fresh environment built from
the task's database) against a ``ModelUser`` playing the user with ``vita.USER_GUIDELINES``, and scores them with
``vita_scoring``: the official rubric judge on each trajectory, and the unofficial order proxy on each episode's final
orders.

As in VitaBench (``vita.evaluator.evaluator.evaluate_simulation``), only an episode the user ended is judged. One that
ended prematurely (VitaBench: too many steps or errors, an invalid agent message; here a rollout budget: turns, tool
calls, user turns, context) scores 0 without a judge call. VitaBench's agent never ends the conversation itself. An
episode whose simulated user could not reply is an infrastructure failure: it is reported under ``failed`` and never
scored. Scores depend on the user's and the judge's models (upstream both are API models): name them with every
number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from envace.benchmarks.vita import USER_GUIDELINES, VitaTask, to_task
from envace.benchmarks.vita_scoring import RubricJudge, Verdict, summarise
from envace.engines.base import Engine
from envace.engines.chat_model import ChatModel
from envace.envs.real import RealEnvironment
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import Episode, EpisodeStats, Task
from envace.worlds.real import RealWorld
from envace.worlds.users import ModelUser, UserSimulator

DEFAULT_ROLLOUT = RolloutConfig(act_temperature=0.0, max_turns=60, max_tool_calls=150, max_context_tokens=131072,
                                act_max_new_tokens=2048, max_user_turns=30)
"""Greedy, with caps well inside VitaBench's 300 orchestrator steps (each message, or batch of tool responses, is
one): 60 act turns, 150 tool calls, 30 user turns, a 128k-token context."""

BUDGETS = ("context_limit", "call_limit", "turn_limit", "user_turn_limit", "ended_by_error")
"""The ``EpisodeStats`` flags of the rollout limits that can end an episode before its user does."""

USER_FAILURE = ("the simulated user could not reply (its chat overflowed its model's max_prompt_tokens, or it wrote "
                "no message)")


class VitaWorld(RealWorld):
    """A ``RealWorld`` that keeps each episode's environment, in start order, to read its orders after the episode."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[RealEnvironment] = []

    def open(self, task: Task) -> RealEnvironment:
        """Instantiate the task's environment (a ``VitaToolbox``) and keep it (None if it raised: the episode fails)."""
        try:
            handle = super().open(task)
        except Exception:
            self.opened.append(None)  # keeps ``opened`` aligned with the episodes
            raise
        self.opened.append(handle)
        return handle


def final_orders(handle: RealEnvironment) -> list[dict[str, Any]]:
    """The orders in an episode's environment now: ``VitaToolbox.orders`` of the instance the handle runs calls on."""
    return handle.instance.orders()


def premature_reason(stats: EpisodeStats) -> str:
    """Why an episode ended before its user ended it (the budget's flag), or ``""`` when the user ended it."""
    if stats.user_stop:
        return ""
    return next((flag for flag in BUDGETS if getattr(stats, flag)), "ended without the user stopping")


def trajectory(episode: Episode) -> list[dict[str, Any]]:
    """The episode's conversation as the judge reads it: its OpenAI-format messages after the system message."""
    messages = episode.messages
    start = 1 if messages and messages[0]["role"] == "system" else 0
    return [dict(m) for m in messages[start:]]


@dataclass
class _Run:
    """One episode with what scoring needs: its task, its trial number and its final orders."""

    task: VitaTask
    trial: int
    episode: Episode
    orders: list[dict[str, Any]]


def _simulator(user: ChatModel | UserSimulator) -> UserSimulator:
    """A ``ChatModel`` plays the user with VitaBench's guidelines; a ready simulator is used as it is."""
    return ModelUser(user, guidelines=USER_GUIDELINES) if isinstance(user, ChatModel) else user


def evaluate_vita(
    tasks: Sequence[VitaTask],
    engine: Engine,
    tokenizer: Any,
    user: ChatModel | UserSimulator,
    judge: RubricJudge,
    trials: int = 1,
    rollout: RolloutConfig | None = None,
    language: str = "english",
) -> dict[str, Any]:
    """Run a policy on VitaBench tasks (``trials`` episodes each) against a simulated user and score the episodes.

    Args:
        tasks: loaded tasks (``vita.load_vita``); VitaBench's code must be installed (``vita.require_vita``).
        engine: generates the act role.
        tokenizer: the policy's tokenizer.
        user: the simulated user's model (``ChatModel`` over a local checkpoint), played as a ``ModelUser`` with
            ``vita.USER_GUIDELINES``; or a ready ``UserSimulator`` (``ScriptedUser`` for replays and tests).
        judge: the rubric judge (its own local model).
        trials: episodes per task (pass^k and pass@k for k up to the fewest scored trials of a task).
        rollout: budgets and sampling (default ``DEFAULT_ROLLOUT``); calls are never validated against the schemas,
            as VitaBench's tools answer bad arguments themselves.
        language: ``english`` or ``chinese`` (tool descriptions, policy and greeting).

    Returns:
        ``vita_scoring.score_vita``'s result over the scored episodes (``episodes`` rows, each also with
        ``trajectory``, ``final_orders`` and, when a budget ended it, ``premature``; ``judge_failures``, ``scored``,
        ``avg_reward``, ``avg_rubric_score``, ``pass_hat``, ``pass_at``, ``order_match_unofficial``), plus
        ``rewards`` (task id -> reward per scored trial), ``failed`` (task id -> trials whose simulated user or
        environment failed) and ``user_failures`` (their rows, with the reason), ``premature`` (episodes a budget
        ended, scored 0 without a judge call, and their reasons), ``judged`` and ``judge_calls``, and ``rollouts``
        (every ``Episode``, in run order).

    Raises:
        ValueError: ``trials`` below 1.
        ImportError: VitaBench's code is not installed.
    """
    if trials < 1:
        raise ValueError(f"evaluate_vita: trials must be at least 1, got {trials}")
    converted = [to_task(t, language=language) for t in tasks]
    runs = [(task, trial, envace_task) for task, envace_task in zip(tasks, converted) for trial in range(trials)]
    config = replace(rollout or DEFAULT_ROLLOUT, validate_calls=False)
    world = VitaWorld()
    groups = [i // trials for i in range(len(runs))]
    episodes = EpisodeRunner(tokenizer, config).run([t for _, _, t in runs], groups, engine, world,
                                                    user=_simulator(user))
    done = [_Run(task, trial, episode, final_orders(handle) if handle is not None else [])
            for (task, trial, _), episode, handle in zip(runs, episodes, world.opened)]
    return _score(done, judge)


def _verdicts(runs: list[_Run], judge: RubricJudge) -> list[Verdict]:
    """One verdict per run: the judge's for runs the user ended (batched), a premature 0 for the others."""
    reasons = [premature_reason(r.episode.stats) for r in runs]
    ended = [r for r, why in zip(runs, reasons) if not why]
    judged = iter(judge.judge([r.task for r in ended], [trajectory(r.episode) for r in ended]))
    return [Verdict(r.task.id, [False] * len(r.task.rubrics), premature=why) if why else next(judged)
            for r, why in zip(runs, reasons)]


def _score(runs: list[_Run], judge: RubricJudge) -> dict[str, Any]:
    """``evaluate_vita``'s result from its finished runs."""
    lost = [r for r in runs if r.episode.stats.user_failures or r.episode.stats.failed]  # never scored as the agent's
    kept = [r for r in runs if not (r.episode.stats.user_failures or r.episode.stats.failed)]
    verdicts = _verdicts(kept, judge)
    result = summarise([r.task for r in kept], verdicts, [r.orders for r in kept], [r.trial for r in kept])
    for row, run in zip(result["episodes"], kept):
        row["trajectory"], row["final_orders"] = trajectory(run.episode), run.orders
    rewards: dict[str, list[float]] = {r.task.id: [] for r in runs}
    for row in result["episodes"]:
        if not row["failed"]:
            rewards[row["task_id"]].append(row["reward"])
    premature = [v.premature for v in verdicts if v.premature]
    result.update(
        rewards=rewards,
        failed=dict(Counter(r.task.id for r in lost)),
        user_failures=[{"task_id": r.task.id, "trial": r.trial, "reason": r.episode.stats.failure or USER_FAILURE}
                       for r in lost],
        premature={"episodes": len(premature), "reasons": dict(Counter(premature)),
                   "note": "ended by a budget, not by the user: scored 0 without a judge call, as in VitaBench"},
        judged=len(verdicts) - len(premature),
        judge_calls=sum(v.calls for v in verdicts),
        rollouts=[r.episode for r in runs],
    )
    return result
