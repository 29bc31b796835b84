"""What private rehearsal changed, task by task: the anatomy of its gains and losses against plain acting.

Two evaluations of one policy on the same tasks, as ``callbacks.episode_writer.episode_record`` writes them (the
rehearsal ablation's ``write_episodes: true`` writes one file per setting): plain acting (budget 0) and a rehearsing
setting. For every task whose success differs (``right_to_wrong``, ``wrong_to_right``) the first committed act turn
that differs from plain acting's is found, and the change is put down to one cause:

- ``malformed_commit``: the committed turn there is malformed or cut off (a sampled attempt's, or one the act role
  wrote with the memory), where plain acting's was not;
- ``wrong_imagined``: a selector committed an attempt whose rehearsed responses to that turn's calls differ from
  what the real environment then answered: the world model misled the choice (or, for a gain, chose well by luck);
- ``right_imagined``: the committed attempt imagined the real responses exactly, and the outcome still changed: the
  rule read a right prediction wrongly (or rightly, for a gain);
- ``memory_rewrite``: no attempt was committed; the act role wrote a different, well-formed turn with the memory in
  its prompt;
- ``same_turns``: every committed turn equals plain acting's, so the change came from elsewhere (a later turn that
  differs only after the same calls, a user simulator, nondeterminism);
- ``no_record``: the rehearsing episode holds no record of its attempts (written before ``private_attempts``).

``anatomy`` returns the counts and one line per changed task; ``markdown`` renders them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.data.jsonl import json_lines
from envace.roles.compare import canonical

CAUSES = ("malformed_commit", "wrong_imagined", "right_imagined", "memory_rewrite", "same_turns", "no_record")
CHANGES = ("right_to_wrong", "wrong_to_right")


@dataclass
class Change:
    """One task whose success differs between plain acting and rehearsal.

    Attributes:
        task: the task's id.
        change: ``right_to_wrong`` or ``wrong_to_right``.
        cause: one of ``CAUSES``.
        turn: the first committed act turn that differs from plain acting's (None: none differs).
        detail: what differed there, in a few words (the two turns' calls, the imagined and the real response).
    """

    task: str
    change: str
    cause: str
    turn: int | None
    detail: str = ""


@dataclass
class Anatomy:
    """The changed tasks of one comparison, and how many tasks it compared."""

    tasks: int
    changes: list[Change] = field(default_factory=list)

    def counts(self) -> dict[str, Counter[str]]:
        """``{change: {cause: tasks}}``."""
        out: dict[str, Counter[str]] = {change: Counter() for change in CHANGES}
        for c in self.changes:
            out[c.change][c.cause] += 1
        return out


def read_episodes(path: str | Path) -> dict[str, dict[str, Any]]:
    """The episode records of a JSON Lines file by task id.

    Raises:
        ValueError: a line that is not a JSON object with a ``task``, or a task twice, naming the file and line.
    """
    records: dict[str, dict[str, Any]] = {}
    for where, record in json_lines(Path(path).read_text(encoding="utf-8"), path):
        if not isinstance(record, dict) or not isinstance(record.get("task"), str):
            raise ValueError(f"{where}: an episode record needs a 'task' id")
        if record["task"] in records:
            raise ValueError(f"{where}: task {record['task']!r} appears twice")
        records[record["task"]] = record
    return records


def anatomy(plain: dict[str, dict[str, Any]], rehearsed: dict[str, dict[str, Any]]) -> Anatomy:
    """Classify every task whose success differs between the two evaluations (``plain``: budget 0).

    Raises:
        ValueError: the two evaluations hold different tasks.
    """
    if set(plain) != set(rehearsed):
        missing = sorted(set(plain) ^ set(rehearsed))[:3]
        raise ValueError(f"the two evaluations hold different tasks (e.g. {missing})")
    result = Anatomy(len(plain))
    for task in sorted(plain):
        before, after = bool(plain[task]["success"]), bool(rehearsed[task]["success"])
        if before != after:
            change = "right_to_wrong" if before else "wrong_to_right"
            result.changes.append(classify(task, change, plain[task], rehearsed[task]))
    return result


def classify(task: str, change: str, plain: dict[str, Any], rehearsed: dict[str, Any]) -> Change:
    """The cause of one changed outcome (the module docstring)."""
    plain_turns, turns = _act_turns(plain), _act_turns(rehearsed)
    turn = next((i for i, (a, b) in enumerate(zip(plain_turns, turns)) if a["key"] != b["key"]), None)
    if turn is None and len(plain_turns) != len(turns):
        turn = min(len(plain_turns), len(turns))
    if turn is None or turn >= len(turns):
        return Change(task, change, "same_turns", None)
    mine = turns[turn]
    theirs = plain_turns[turn]["key"] if turn < len(plain_turns) else "(none)"
    detail = f"plain {theirs} / rehearsed {mine['key']}"
    records = {r["act_turn"]: r for r in rehearsed.get("private_attempts", [])}
    if turn not in records:
        cause = "no_record" if not rehearsed.get("private_attempts") else "same_turns"
        return Change(task, change, cause, turn, detail)
    record = records[turn]
    committed = record.get("committed")
    attempt = record["attempts"][committed] if committed is not None else None
    if mine["malformed"] or (attempt is not None and (attempt["first_malformed"] or not attempt["first_finished"])):
        return Change(task, change, "malformed_commit", turn, detail)
    if attempt is None:
        return Change(task, change, "memory_rewrite", turn, detail)
    imagined = [response for _, _, response in (attempt["turns"][0] if attempt["turns"] else [])]
    same = len(imagined) == len(mine["responses"]) and all(
        _same(a, b) for a, b in zip(imagined, mine["responses"]))
    detail += f"; imagined {imagined} / real {mine['responses']}"
    return Change(task, change, "right_imagined" if same else "wrong_imagined", turn, detail)


def _act_turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each committed act turn of an episode record: its identity, whether it was malformed, its real responses.

    A turn is an assistant message (one per committed act turn); its identity is its calls (canonical JSON) or its
    text; the tool messages after it are its real responses. A turn the rollout refused in part (a malformed
    tool-call block, an unknown tool, arguments against the schema) is followed by the rollout's own error message
    (name ``error``), and counts as malformed.
    """
    messages = record.get("messages", [])
    out = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        calls = [c.get("function", c) for c in message.get("tool_calls") or []]
        content = message.get("content") or ""
        key = (json.dumps([[c.get("name"), c.get("arguments")] for c in calls], sort_keys=True) if calls
               else f"answer:{' '.join(str(content).split())}")
        responses, refused = [], False
        for later in messages[i + 1 :]:
            if later.get("role") != "tool":
                break
            refused = refused or later.get("name") == "error"
            responses.append(later.get("content"))
        out.append({"key": key, "malformed": refused or "<tool_call>" in str(content), "responses": responses})
    return out


def _same(imagined: Any, real: Any) -> bool:
    """Whether an imagined response says what the real one said (canonical forms, as fidelity compares them)."""
    try:
        return canonical(str(imagined)) == canonical(str(real))
    except (TypeError, ValueError):
        return str(imagined).strip() == str(real).strip()


def markdown(rows: Iterable[tuple[str, Anatomy]]) -> str:
    """One table: per labelled comparison, its changed tasks by direction and cause."""
    lines = ["| comparison | tasks | change | " + " | ".join(CAUSES) + " | all |",
             "|---|---|---|" + "---|" * (len(CAUSES) + 1)]
    for label, result in rows:
        for change, counts in result.counts().items():
            cells = " | ".join(str(counts.get(cause, 0)) for cause in CAUSES)
            lines.append(f"| {label} | {result.tasks} | {change} | {cells} | {sum(counts.values())} |")
    return "\n".join(lines)
