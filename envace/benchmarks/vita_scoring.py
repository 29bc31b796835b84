"""VitaBench's official score, a sliding-window rubric judge played by a local model, and an unofficial order proxy.

- ``RubricJudge`` and ``score_vita`` are the official score: VitaBench's sliding-window trajectory judge (every rubric
  starts unmet; windows of 10 messages overlapping by 2; reward 1 iff all rubrics are met; ``rubric_score`` the
  fraction met), played by a local ``ChatModel``. A judge that cannot give a verdict fails the episode, which is
  reported apart and never counted as 0. An episode VitaBench would have ended prematurely (a budget, not the user,
  ended it) scores 0 without being judged (``Verdict.premature``), as upstream.
- ``order_match`` is an **unofficial proxy** (``docs/benchmarks.md`` 6(b)): VitaBench's official score is the rubric
  judge, and the required orders are not used by it. Every result holding it says so (``order_match_unofficial``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envace.benchmarks.vita import VitaTask, time_with_weekday

if TYPE_CHECKING:
    from envace.engines.chat_model import ChatModel

# ---------------------------------------------------------------------------------------------------------------------
# The official score: the sliding-window rubric judge
# ---------------------------------------------------------------------------------------------------------------------


JUDGE_SYSTEM = """You grade a conversation between a user and an assistant that can call tools (tool results are \
the lines marked `tool`). The user's goal has been split into numbered rubrics. The conversation is long, so you see \
one window of messages at a time (window {window} of {windows}); rubrics met in earlier windows are not shown again.

# Environment
Current time: {time}

# The user's full instructions (context only)
{instructions}

# How to judge
- A rubric is met only if the assistant's own messages or tool calls in this window achieve it. What the user says \
does not meet a rubric, nor does a tool result the assistant never passes on; the assistant must not invent results.
- A rubric about an order is met only if the order was really placed: a call creating it succeeded.
- Quantities and times must be exactly as the rubric says, even if the user settles for less.
- Addresses and order notes count when they serve the same purpose, even if worded differently.
- If a rubric is not settled in this window, leave it out: a later window may show it.

# Answer
Reply with JSON only: {{"met": [the numbers of the rubrics met in this window]}}, e.g. {{"met": [2, 5]}} or \
{{"met": []}}."""
"""The judge's system message; ``{window}``, ``{windows}``, ``{time}`` and ``{instructions}`` are filled."""


def sliding_windows(count: int, window: int = 10, overlap: int = 2) -> list[tuple[int, int]]:
    """VitaBench's windows over ``count`` messages, as ``(start, end)`` slices.

    Windows start every ``window - overlap`` messages; the last one is the first to reach the end. No messages, no
    windows (VitaBench would still ask about an empty one, where nothing can be met).
    """
    if count <= 0:
        return []
    step, windows, start = window - overlap, [], 0
    while True:
        windows.append((start, min(start + window, count)))
        if start + window >= count:
            return windows
        start += step


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"{function.get('name', '?')}({arguments})"


def render_message(number: int, message: dict[str, Any]) -> str | None:
    """One message as the judge reads it: ``[number] role: text``, tool calls as ``name({json})``; None if empty."""
    text = str(message.get("content") or "").strip()
    calls = " ".join(_call_text(c) for c in message.get("tool_calls") or [])
    body = " ".join(part for part in (text, calls) if part)
    if not body:
        return None
    role = message.get("role", "?")
    label = f"tool ({message['name']})" if role == "tool" and message.get("name") else role
    return f"[{number}] {label}: {body}"


def parse_judge_reply(text: str, offered: Sequence[int]) -> set[int] | None:
    """The rubric numbers a judge reply marks met, or None when it is not exactly ``{"met": [numbers]}``.

    A leading think block (up to ``</think>``) and a ```` ```json ```` fence are tolerated; anything else, another
    key, a non-integer, or a number that was not offered makes the reply invalid.
    """
    body = text.rsplit("</think>", 1)[-1].strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, flags=re.DOTALL)
    body = fenced.group(1) if fenced else body
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, an over-long integer, or nesting too deep to decode
        return None
    if not isinstance(value, dict) or set(value) != {"met"} or not isinstance(value["met"], list):
        return None
    numbers = value["met"]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n in offered for n in numbers):
        return None
    return set(numbers)


@dataclass
class Verdict:
    """The judge's verdict on one episode.

    Attributes:
        task_id: the task.
        met: per rubric (``VitaTask.rubrics`` order), whether a window met it.
        failed: the judge gave no valid verdict for some window: the episode is not scored.
        reason: why it failed.
        calls: judge replies requested for this episode (retries included).
        premature: why the episode ended before the user ended it (a budget), or empty. VitaBench scores such an
            episode 0 without judging it; so does this verdict (reward and rubric score 0, nothing met).
    """

    task_id: str
    met: list[bool]
    failed: bool = False
    reason: str = ""
    calls: int = 0
    premature: str = ""

    @property
    def reward(self) -> float | None:
        """1 iff every rubric is met (1 without rubrics, as in VitaBench); 0 if premature; None when failed."""
        if self.failed:
            return None
        return 0.0 if self.premature else float(all(self.met))

    @property
    def rubric_score(self) -> float | None:
        """The fraction of rubrics met (1 without rubrics); 0 if premature; None when failed."""
        if self.failed:
            return None
        if self.premature:
            return 0.0
        return sum(self.met) / len(self.met) if self.met else 1.0


@dataclass
class _Episode:
    """One episode's judging state."""

    task: VitaTask
    messages: list[dict[str, Any]]
    windows: list[tuple[int, int]]
    verdict: Verdict


class RubricJudge:
    """VitaBench's sliding-window trajectory judge, played by a local model.

    Every rubric starts unmet. The trajectory (system messages dropped) is cut into windows of ``window`` messages
    overlapping by ``overlap``. For each window the model sees the rubrics still unmet, numbered as in
    ``VitaTask.rubrics`` (from 1), and the window's messages, and replies ``{"met": [numbers]}``. Met rubrics stay
    met, and an episode whose rubrics are all met is not asked again. Unlike VitaBench's judge, it is not shown met
    rubrics and so cannot un-meet them. An invalid reply is asked again up to ``retries`` times; then (or when the
    prompt overflows the model) the episode is ``failed``. Judge calls are batched across episodes: one
    ``ChatModel.complete`` per window index and attempt.

    Args:
        model: the judge's model (greedy by default).
        window: messages per window (VitaBench: 10).
        overlap: messages shared by consecutive windows (VitaBench: 2).
        retries: further attempts after an invalid reply.
    """

    def __init__(self, model: ChatModel, window: int = 10, overlap: int = 2, retries: int = 2) -> None:
        if window < 1 or not 0 <= overlap < window:
            raise ValueError(f"RubricJudge needs window >= 1 and 0 <= overlap < window, got {window}, {overlap}")
        if retries < 0:
            raise ValueError(f"RubricJudge.retries must be >= 0, got {retries}")
        self.model, self.window, self.overlap, self.retries = model, window, overlap, retries

    def judge(self, tasks: Sequence[VitaTask], trajectories: Sequence[Sequence[dict[str, Any]]]) -> list[Verdict]:
        """One verdict per (task, trajectory) pair; trajectories are OpenAI-format messages.

        Raises:
            ValueError: the two lists differ in length.
        """
        if len(tasks) != len(trajectories):
            raise ValueError(f"RubricJudge: {len(tasks)} tasks but {len(trajectories)} trajectories")
        episodes = [self._episode(t, m) for t, m in zip(tasks, trajectories)]
        rounds = max((len(e.windows) for e in episodes), default=0)
        for index in range(rounds):
            self._round(index, [e for e in episodes if index < len(e.windows) and self._open(e)])
        return [e.verdict for e in episodes]

    def _episode(self, task: VitaTask, trajectory: Sequence[dict[str, Any]]) -> _Episode:
        messages = [dict(m) for m in trajectory if m.get("role") != "system"]
        windows = sliding_windows(len(messages), self.window, self.overlap)
        return _Episode(task, messages, windows, Verdict(task.id, [False] * len(task.rubrics)))

    @staticmethod
    def _open(episode: _Episode) -> bool:
        return not episode.verdict.failed and not all(episode.verdict.met)

    def _round(self, index: int, episodes: list[_Episode]) -> None:
        """Judge window ``index`` of ``episodes``: one batched call per attempt, invalid replies asked again."""
        chats = {id(e): self.prompt(e, index) for e in episodes}
        pending = episodes
        for _ in range(self.retries + 1):
            if not pending:
                return
            replies = self.model.complete([chats[id(e)] for e in pending])
            pending = [e for e, reply in zip(pending, replies) if not self._take(e, reply)]
        for episode in pending:
            episode.verdict.failed = True
            episode.verdict.reason = (f"window {index + 1}: no valid verdict after {self.retries + 1} attempts "
                                      '(expected {"met": [rubric numbers]})')

    def _take(self, episode: _Episode, reply: Any) -> bool:
        """Apply one reply; False when it must be asked again (an overflow fails the episode at once)."""
        verdict = episode.verdict
        verdict.calls += 1
        if reply.overflow:
            verdict.failed, verdict.reason = True, "the judge prompt is longer than the model's max_prompt_tokens"
            return True
        met = parse_judge_reply(reply.text, self.unmet(episode))
        if met is None:
            return False
        for number in met:
            verdict.met[number - 1] = True
        return True

    @staticmethod
    def unmet(episode: _Episode) -> list[int]:
        """The numbers (from 1) of the episode's rubrics not met yet."""
        return [i + 1 for i, met in enumerate(episode.verdict.met) if not met]

    def prompt(self, episode: _Episode, index: int) -> list[dict[str, Any]]:
        """The judge's chat for window ``index`` of an episode."""
        start, end = episode.windows[index]
        task = episode.task
        system = JUDGE_SYSTEM.format(window=index + 1, windows=len(episode.windows), time=time_with_weekday(task.time),
                                     instructions=task.instructions)
        rubrics = [f"{n}. {episode.task.rubrics[n - 1]}" for n in self.unmet(episode)]
        lines = [render_message(start + i + 1, m) for i, m in enumerate(episode.messages[start:end])]
        user = "\n".join(["# Rubrics not met yet", *rubrics, "",
                          f"# Conversation window (messages {start + 1} to {end} of {len(episode.messages)})",
                          *[line for line in lines if line is not None]])
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------------------------------


def _products(order: dict[str, Any]) -> Counter[tuple[str, Any]]:
    """The multiset of ``(product_id, quantity)`` (quantities compared as numbers: 2 and 2.0 are equal)."""
    pairs = []
    for product in order.get("products") or []:
        product = product if isinstance(product, dict) else {}
        quantity = product.get("quantity")
        if isinstance(quantity, float) and quantity.is_integer():
            quantity = int(quantity)
        pairs.append((str(product.get("product_id")), quantity))
    return Counter(pairs)


def _address(order: dict[str, Any]) -> Any:
    location = order.get("location")
    return location.get("address") if isinstance(location, dict) else None


def _matches(required: dict[str, Any], final: dict[str, Any]) -> bool:
    same = (final.get("order_type") == required.get("order_type") and final.get("store_id") == required.get("store_id")
            and _products(final) == _products(required))
    if required.get("order_type") == "delivery":
        same = same and _address(final) == _address(required)
    return same


def order_match(task: VitaTask, final_orders: Sequence[dict[str, Any]]) -> float:
    """Unofficial proxy: VitaBench's official score is the rubric judge. The fraction of required orders placed.

    ``docs/benchmarks.md`` 6(b): R is the union of ``required_orders`` over the expected states; a required order
    counts if some final order has the same ``order_type`` and ``store_id``, the same multiset of
    ``(product_id, quantity)`` and, for a delivery order, the same ``location.address``. Order ids, times, prices and
    statuses are ignored. A task with no required orders scores 1 (vacuously).

    Args:
        task: the task.
        final_orders: the environment's orders after the episode, as plain dicts (``VitaToolbox.orders``).
    """
    required = task.required_orders
    if not required:
        return 1.0
    return sum(any(_matches(r, o) for o in final_orders) for r in required) / len(required)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _pass_metrics(episodes: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """pass^k and pass@k over each task's scored trials, for k up to the fewest scored trials of a task."""
    from envace.benchmarks.passk import pass_at_k, pass_hat_k

    trials: dict[str, list[bool]] = {}
    for e in episodes:
        if not e["failed"]:
            trials.setdefault(e["task_id"], []).append(e["reward"] >= 1.0)
    if not trials:
        return {"pass_hat": {}, "pass_at": {}}
    ks = range(1, min(len(t) for t in trials.values()) + 1)
    rows = list(trials.values())
    return {"pass_hat": {k: pass_hat_k(rows, k) for k in ks}, "pass_at": {k: pass_at_k(rows, k) for k in ks}}


def _trial_numbers(tasks: Sequence[VitaTask]) -> list[int]:
    """Each episode's trial number: how many earlier episodes had the same task."""
    seen: Counter[str] = Counter()
    numbers = []
    for task in tasks:
        numbers.append(seen[task.id])
        seen[task.id] += 1
    return numbers


def _episode_rows(tasks: Sequence[VitaTask], verdicts: Sequence[Verdict], trials: Sequence[int]
                  ) -> list[dict[str, Any]]:
    rows = []
    for task, verdict, trial in zip(tasks, verdicts, trials):
        row = {"task_id": task.id, "trial": trial, "reward": verdict.reward, "rubric_score": verdict.rubric_score,
               "met": list(verdict.met), "failed": verdict.failed, "reason": verdict.reason}
        if verdict.premature:
            row["premature"] = verdict.premature
        rows.append(row)
    return rows


def _order_block(tasks: Sequence[VitaTask], final_orders: Sequence[Sequence[dict[str, Any]]],
                 rows: list[dict[str, Any]]) -> dict[str, Any]:
    scores = [order_match(t, o) for t, o in zip(tasks, final_orders)]
    for row, score in zip(rows, scores):
        row["order_match_unofficial"] = score
    return {"note": "unofficial proxy: VitaBench's official score is the rubric judge", "mean": _mean(scores),
            "episodes": len(scores), "without_required_orders": sum(not t.required_orders for t in tasks)}


def score_vita(tasks: Sequence[VitaTask], trajectories: Sequence[Sequence[dict[str, Any]]], judge: RubricJudge,
               final_orders: Sequence[Sequence[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """VitaBench's official score of episodes: one (task, trajectory) pair each; repeat a task for several trials.

    Returns ``episodes`` (per episode: ``reward``, ``rubric_score``, ``met``, ``failed``), ``judge_failures`` (the
    episodes the judge could not score: excluded from every average, never counted as 0), ``scored``,
    ``avg_reward`` and ``avg_rubric_score`` over scored episodes (None if none), ``pass_hat`` / ``pass_at`` per k
    over each task's scored trials. With ``final_orders`` (per episode, ``VitaToolbox.orders()`` after it), each
    episode also gets ``order_match_unofficial`` and the result an ``order_match_unofficial`` summary.

    Raises:
        ValueError: the lists differ in length.
    """
    if final_orders is not None and len(final_orders) != len(tasks):
        raise ValueError(f"score_vita: {len(tasks)} tasks but {len(final_orders)} final order lists")
    return summarise(tasks, judge.judge(tasks, trajectories), final_orders)


def summarise(tasks: Sequence[VitaTask], verdicts: Sequence[Verdict],
              final_orders: Sequence[Sequence[dict[str, Any]]] | None = None,
              trials: Sequence[int] | None = None) -> dict[str, Any]:
    """``score_vita``'s result from verdicts already given, one per task (premature ones included).

    Args:
        tasks: one per episode.
        verdicts: one per episode.
        final_orders: per episode, the environment's orders after it (adds the unofficial order proxy).
        trials: per episode, its trial number (default: its rank among the episodes of its task).

    Raises:
        ValueError: the lists differ in length.
    """
    for name, values in (("verdicts", verdicts), ("final order lists", final_orders), ("trial numbers", trials)):
        if values is not None and len(values) != len(tasks):
            raise ValueError(f"score_vita: {len(tasks)} tasks but {len(values)} {name}")
    rows = _episode_rows(tasks, verdicts, trials if trials is not None else _trial_numbers(tasks))
    scored = [r for r in rows if not r["failed"]]
    result: dict[str, Any] = {
        "official": "VitaBench sliding-window rubric judge (reward 1 iff every rubric is met)",
        "episodes": rows,
        "judge_failures": [{k: r[k] for k in ("task_id", "trial", "reason")} for r in rows if r["failed"]],
        "scored": len(scored),
        "avg_reward": _mean([r["reward"] for r in scored]),
        "avg_rubric_score": _mean([r["rubric_score"] for r in scored]),
        **_pass_metrics(rows),
    }
    if final_orders is not None:
        result["order_match_unofficial"] = _order_block(tasks, final_orders, rows)
    return result
