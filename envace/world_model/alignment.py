"""World-model alignment rows: recorded real tool responses, teacher-forced under the rehearse prompt.

For every tool call in a task's reference trajectory, the row is the rehearse role's prompt for that call (built
exactly as during rollouts, with the reference conversation as history) followed by the recorded real response in
the rehearse output format. Its loss is the cross-entropy of the response tokens (``Sample.align``).

A target is never cut, but the rehearse role generates at most ``rollout.rehearse_max_new_tokens`` tokens: a recorded
response longer than that cannot be rehearsed whole. ``warn_long_responses`` says so once, before training.
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from transformers import PreTrainedTokenizerBase

from envace.data.task_reference import reference_calls, reference_reasoning, reference_steps
from envace.policy.chat import encode
from envace.roles.rehearse import format_result
from envace.types import Episode, Role, Sample, Task, ToolCall
from envace.worlds.base import ToolRequest
from envace.worlds.rehearse import RehearseWorld

T = TypeVar("T")


def _normalise(content: str) -> str:
    """Recorded content in the form a parsed rehearsal takes (``json.dumps(..., ensure_ascii=False)``)."""
    try:
        return json.dumps(json.loads(content), ensure_ascii=False)
    except json.JSONDecodeError:
        return json.dumps({"result": content}, ensure_ascii=False)


def target_ids(tokenizer: PreTrainedTokenizerBase, content: str, reasoning: str = "") -> list[int]:
    """What the rehearse role must generate for ``content``: its working (if any), the result, the eos token."""
    return encode(tokenizer, format_result(_normalise(content), reasoning)) + [tokenizer.eos_token_id]


def long_responses(tasks: list[Task], tokenizer: PreTrainedTokenizerBase, max_new_tokens: int,
                   think: bool = False) -> tuple[int, int, int]:
    """``(long, total, longest)`` of the recorded tool responses of ``tasks`` and their rehearse targets.

    ``long`` of the ``total`` responses have a target (``target_ids``, with the recorded working when ``think``)
    longer than ``max_new_tokens`` tokens; ``longest`` is the longest target's length (0 without any response).
    """
    lengths = [len(target_ids(tokenizer, content, reasoning if think else "")) for task in tasks
               for (_, content), reasoning in zip(reference_calls(task), reference_reasoning(task))]
    return sum(n > max_new_tokens for n in lengths), len(lengths), max(lengths, default=0)


def warn_long_responses(tasks: list[Task], tokenizer: PreTrainedTokenizerBase, max_new_tokens: int,
                        think: bool = False) -> int:
    """Warn (once per call) when recorded tool responses of ``tasks`` are longer than the rehearse budget.

    Their alignment targets are whole, but the rehearse role can generate only the first ``max_new_tokens`` tokens
    of them: its rehearsals of such calls are cut (a parse error) and their fidelity probes score 0.

    Returns:
        How many responses are too long.
    """
    long, total, longest = long_responses(tasks, tokenizer, max_new_tokens, think)
    if long:
        warnings.warn(
            f"{long} of {total} recorded tool responses of the training tasks are longer than "
            f"rollout.rehearse_max_new_tokens={max_new_tokens} tokens (longest {longest}): the rehearse role can "
            f"generate only their first {max_new_tokens} tokens, so its rehearsals of such calls are truncated (a "
            "parse error) although their alignment targets are whole; raise rollout.rehearse_max_new_tokens to "
            f"{longest} or more",
            UserWarning,
            stacklevel=2,
        )
    return long


ROW_CACHE_TASKS = 1024
"""Tasks whose rows ``AlignmentRows`` and ``DemonstrationRows`` keep rendered (least recently used dropped first): a
pass over a large task file then re-renders a task instead of keeping every row of every task for the whole run."""


class RowCap:
    """Cuts teacher-forced rows at a token cap: the context the rollout ends an episode at.

    A reference dialogue (or a recorded call's rehearse prompt and response) longer than the rollout's
    ``max_context_tokens`` holds states the policy never reaches: the rollout ends an episode there. Training on the
    rest would cost memory that grows with the task's length (one row is one micro-batch at least) and teach nothing
    the rollout uses, so the rows are cut at the cap, as TRL's ``max_length`` and verl's length limits cut theirs; a row
    with no trained token left is dropped. The first cut warns once, naming the key that raises the cap.

    Args:
        max_tokens: most tokens of a row (0: no cap).
        key: the config key that sets it, for the warning.
    """

    def __init__(self, max_tokens: int = 0, key: str = "rollout.max_context_tokens") -> None:
        self.max_tokens, self.key = max_tokens, key
        self.cut = self.dropped = 0
        self._warned = False

    def __call__(self, row: Sample, what: str) -> Sample | None:
        """``row`` cut to the cap; None if no trained token is left."""
        if not self.max_tokens or len(row.token_ids) <= self.max_tokens:
            return row
        n = self.max_tokens
        cut = replace(row, token_ids=row.token_ids[:n], role_ids=row.role_ids[:n], loss_mask=row.loss_mask[:n])
        kept = any(cut.loss_mask)
        self.cut, self.dropped = self.cut + kept, self.dropped + (not kept)
        if not self._warned:
            self._warned = True
            warnings.warn(f"{what} of {len(row.token_ids)} tokens is longer than {self.key}={n}, where the rollout "
                          f"ends an episode: such rows are cut to {n} tokens (dropped where no trained token is "
                          f"left); raise {self.key} to train on them whole", stacklevel=3)
        return cut if kept else None


def _cached(cache: OrderedDict[str, T], key: str, make: Callable[[], T]) -> T:
    """``cache[key]``, made on a miss; the cache keeps its ``ROW_CACHE_TASKS`` most recently used entries."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    while len(cache) > ROW_CACHE_TASKS:
        cache.popitem(last=False)
    return value


class AlignmentRows:
    """Builds (and caches) the alignment rows of tasks.

    With a thinking prompter (``RehearseWorld(think=True)``), a recorded call's target starts with its working (the
    tool message's ``reasoning``). Live pairs have none, so a thinking prompter gives them no row: the result alone
    after a prompt that asks for the working first would teach the rehearse role to stop working (measured: on a
    real-tool RL run from a thinking warm start, those rows' loss started at 0.66 against 0.01 for the recorded
    ones, and fell as the role unlearned its working).

    Args:
        tokenizer: the policy's tokenizer.
        prompter: the rehearse world whose prompt format the rows use.
        max_per_task: most rows per task per step (the first calls of the reference).
        cap: cuts rows longer than the rollout's context (``RowCap``; default: none).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompter: RehearseWorld, max_per_task: int,
                 cap: RowCap | None = None) -> None:
        self.tokenizer = tokenizer
        self.prompter = prompter
        self.max_per_task = max_per_task
        self.cap = cap or RowCap()
        self._cache: OrderedDict[str, list[Sample]] = OrderedDict()

    def rows(self, tasks: list[Task]) -> list[Sample]:
        """Alignment rows of ``tasks``; ``group_index`` is the task's position in ``tasks``."""
        out = []
        for group, task in enumerate(tasks):
            for row in self._task_rows(task):
                out.append(Sample(row.token_ids, row.role_ids, row.loss_mask, Role.REHEARSE, -1, group, align=True))
        return out

    def live_rows(self, episodes: list[Episode], max_rows: int) -> list[Sample]:
        """Alignment rows of the live pairs of ``episodes`` (at most ``max_rows``, in episode order).

        A live pair is a call answered by a real environment or the cache, or any call of an audited episode: the
        rehearse prompt with the episode's own history, and the real response as the target. Failed episodes
        give none (their environment may have been left in an unknown state), and a thinking prompter none at all.
        """
        out: list[Sample] = []
        if self.prompter.think:
            return out
        for episode in episodes:
            if episode.stats.failed:
                continue
            for rehearsal in episode.rehearsals:
                if len(out) >= max_rows:
                    return out
                live = rehearsal.source in ("real", "cache") or episode.audit is not None
                if not live or rehearsal.real is None or rehearsal.request is None:
                    continue
                req = rehearsal.request
                row = self.cap(self._row(episode.task, rehearsal.call, rehearsal.real, req.history), "a rehearse row")
                if row is not None:
                    out.append(replace(row, group_index=episode.group_index))
        return out

    def _task_rows(self, task: Task) -> list[Sample]:
        def make() -> list[Sample]:
            steps = reference_steps(task)[: self.max_per_task]
            reasoning = reference_reasoning(task) if self.prompter.think else [""] * len(steps)
            rows = [self.cap(self._row(task, call, content, history, why), "a rehearse row")
                    for (call, content, history), why in zip(steps, reasoning)]
            return [row for row in rows if row is not None]

        return _cached(self._cache, task.id, make)

    def _row(self, task: Task, call: ToolCall, content: str, history: list[dict[str, Any]],
             reasoning: str = "") -> Sample:
        prompt = self.prompter.prompt(ToolRequest(task, call, history, None, -1, -1))
        target = target_ids(self.tokenizer, content, reasoning)
        return Sample(
            token_ids=prompt.ids + target,
            role_ids=prompt.roles + [int(Role.TOOL)] * len(target),
            loss_mask=[0] * len(prompt.ids) + [1] * len(target),
            role=Role.REHEARSE,
            episode_index=-1,
            group_index=-1,
            align=True,
        )


class DemonstrationRows:
    """The act rows of tasks' reference dialogues, each rendered once per task id.

    An act row is the chat-template render of the task's messages plus its whole reference continuation, trained on
    the assistant tokens (the template's ``{% generation %}`` mask). The SFT warm start trains on them, and RL's
    imitation term (``teacher_forced=True``: rows marked ``align``) does.

    Args:
        tokenizer: the policy's tokenizer (its chat template renders the rows).
        teacher_forced: mark the rows ``align`` (teacher-forced cross-entropy rows inside an RL batch).
        cap: cuts rows longer than the rollout's context (``RowCap``; default: none).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, teacher_forced: bool = False,
                 cap: RowCap | None = None) -> None:
        self.tokenizer = tokenizer
        self.teacher_forced = teacher_forced
        self.cap = cap or RowCap()
        self._cache: OrderedDict[str, Sample | None] = OrderedDict()

    def rows(self, tasks: list[Task]) -> list[Sample]:
        """One row per task with a reference; ``group_index`` is the task's position in ``tasks``.

        Raises:
            ValueError: the chat template marks no assistant tokens (it lacks ``{% generation %}``).
        """
        out = []
        for group, task in enumerate(tasks):
            if not task.reference:
                continue
            row = _cached(self._cache, task.id, lambda task=task: self.cap(self._row(task), "an act row"))  # type: ignore[misc]
            if row is not None:
                out.append(replace(row, group_index=group))
        return out

    def _row(self, task: Task) -> Sample:
        enc = self.tokenizer.apply_chat_template(
            list(task.messages) + list(task.reference),
            tools=list(task.tools),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        mask = list(enc["assistant_masks"])
        if not any(mask):
            raise ValueError("the chat template marks no assistant tokens ({% generation %}); cannot build act rows")
        roles = [int(Role.ACT) if m else int(Role.SYSTEM) for m in mask]
        return Sample(list(enc["input_ids"]), roles, mask, Role.ACT, -1, -1, align=self.teacher_forced)
