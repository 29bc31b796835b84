"""Recorded real tool responses, keyed by the canonical call and the state it was made in.

A real environment's answer depends on its state, and its state on the calls made before. So a cached response is
keyed by the environment (its class and constructor arguments, or the task id when a task has no environment), the
canonical calls made earlier in the episode, and the canonical call: a hit is then exactly what the real environment
would answer, for any deterministic environment. ``stateful=False`` drops the earlier calls from the key (more hits;
exact only for tools that never change state).

The cache is seeded from each task's reference trajectory (its recorded real responses) and grows with every real
answer a ``HybridWorld`` gets. With ``path`` it is also an append-only JSON Lines file: loaded at start, every new
entry appended and flushed at once, so a crash loses nothing already recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envace.data.task_reference import reference_calls
from envace.types import Task, ToolCall, canonical_json


def environment_key(task: Task) -> str:
    """What a task's real state starts from: its environment spec, or its id when it has none."""
    if task.environment is None:
        return f"task:{task.id}"
    return "env:" + canonical_json({"class_path": task.environment.class_path, "init_args": task.environment.init_args})


class ResponseCache:
    """Real responses by ``(environment, earlier calls, call)``.

    Args:
        stateful: key on the calls made earlier in the episode too (exact for any deterministic environment).
        path: an append-only JSON Lines file backing the cache (created if missing); None keeps it in memory.
        seed_references: add each task's recorded reference responses the first time the task is seen.

    Attributes:
        hits: lookups answered.
        misses: lookups not answered.
    """

    def __init__(self, stateful: bool = True, path: str | None = None, seed_references: bool = True) -> None:
        self.stateful = stateful
        self.path = Path(path) if path is not None else None
        self.seed_references = seed_references
        self._entries: dict[str, str] = {}
        self._seeded: set[str] = set()
        self.hits = 0
        self.misses = 0
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, task: Task, earlier: Sequence[ToolCall], call: ToolCall) -> str:
        """The cache key of ``call`` made after ``earlier`` in an episode of ``task``."""
        prefix = [c.key() for c in earlier] if self.stateful else []
        return canonical_json([environment_key(task), prefix, call.key()])

    def get(self, task: Task, earlier: Sequence[ToolCall], call: ToolCall) -> str | None:
        """The recorded response of ``call`` after ``earlier``, or None (counted as a hit or a miss)."""
        self.seed(task)
        content = self._entries.get(self.key(task, earlier, call))
        self.hits += int(content is not None)
        self.misses += int(content is None)
        return content

    def peek(self, task: Task, earlier: Sequence[ToolCall], call: ToolCall) -> str | None:
        """Like ``get`` but not counted (for lookups that answer no call, such as shaping targets)."""
        self.seed(task)
        return self._entries.get(self.key(task, earlier, call))

    def put(self, task: Task, earlier: Sequence[ToolCall], call: ToolCall, content: str) -> None:
        """Record a real response (the first one recorded for a key is kept)."""
        key = self.key(task, earlier, call)
        if key in self._entries:
            return
        self._entries[key] = content
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "content": content}, ensure_ascii=False) + "\n")
                f.flush()

    def seed(self, task: Task) -> None:
        """Add the recorded responses of ``task``'s reference trajectory (once per task id)."""
        if not self.seed_references or task.id in self._seeded:
            return
        self._seeded.add(task.id)
        earlier: list[ToolCall] = []
        for call, content in reference_calls(task):
            self._entries.setdefault(self.key(task, earlier, call), content)
            earlier.append(call)

    def state_dict(self) -> dict[str, Any]:
        """The recorded responses, the seeded task ids and the counters, as plain data (for checkpoints)."""
        return {"entries": dict(self._entries), "seeded": sorted(self._seeded), "hits": self.hits,
                "misses": self.misses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output (merged with what a backing file already loaded; the first record wins)."""
        for key, content in state.get("entries", {}).items():
            self._entries.setdefault(key, content)
        self._seeded.update(state.get("seeded", ()))
        self.hits, self.misses = int(state.get("hits", 0)), int(state.get("misses", 0))

    def _load(self, path: Path) -> None:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    key, content = record["key"], record["content"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{number}: not a response-cache record "
                                     f'({{"key": ..., "content": ...}}): {exc}') from exc
                if not isinstance(key, str) or not isinstance(content, str):
                    raise ValueError(f"{path}:{number}: 'key' and 'content' must be strings")
                self._entries.setdefault(key, content)
