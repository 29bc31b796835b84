"""Writes every evaluated episode to a JSON Lines file: what the policy did on each task, for reading failures.

``envace test`` logs means; this callback keeps the episodes behind them. One line per episode: the task's id and
metadata, success and reward, the semantic conversation (tool calls parsed, tool responses as the world gave them),
the final answer, the real calls and the episode's counters, and, after private rehearsal, the memory the act role
read before each committed turn (``private_memory``) and every imagined attempt with the one committed
(``private_attempts``). The file is rewritten at the start of each
evaluation, so it always holds the latest one; a multi-GPU run writes one file per rank (``test.rank1.jsonl``).

Config::

    trainer:
      callbacks:
        - class_path: callbacks.episode_writer.EpisodeWriter
          init_args: {splits: [test]}

or ``envace test ... --trainer.callbacks+=callbacks.episode_writer.EpisodeWriter``. Read the failures with, e.g.,
``jq -c 'select(.success | not) | .messages' <log dir>/episodes/test.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import lightning as L

from envace.types import Episode

SPLITS = ("val", "test")


def episode_record(episode: Episode) -> dict[str, Any]:
    """One episode as a JSON-ready dict (messages as the rollout recorded them)."""
    return {
        "task": episode.task.id,
        "metadata": episode.task.metadata,
        "success": bool(episode.success),
        "reward": float(episode.reward),
        "messages": episode.messages,
        "final_answer": episode.final_answer,
        "calls": [{"name": c.name, "arguments": c.arguments} for c in episode.calls],
        "stats": dataclasses.asdict(episode.stats),
        **({"private_memory": [{"act_turn": turn, "memory": text} for turn, text in episode.private_memory]}
           if episode.private_memory else {}),
        **({"private_attempts": [{"act_turn": turn, "attempts": attempts, "committed": committed}
                                 for turn, attempts, committed in episode.private_attempts]}
           if episode.private_attempts else {}),
    }


class EpisodeWriter(L.Callback):
    """Writes each evaluated batch's episodes to ``<output_dir>/<split>.jsonl``.

    Args:
        splits: which evaluations to write: ``test`` (``envace test``) and/or ``val`` (validation during ``fit``;
            the file holds the latest validation).
        output_dir: where the files go (default: ``<log dir>/episodes``).
    """

    def __init__(self, splits: list[str] | None = None, output_dir: str | None = None) -> None:
        self.splits = list(("test",) if splits is None else splits)
        for split in self.splits:
            if split not in SPLITS:
                raise ValueError(f"splits: '{split}'; valid: {', '.join(SPLITS)}")
        self.output_dir = output_dir
        self.paths: dict[str, Path] = {}

    def path(self, trainer: L.Trainer, split: str) -> Path:
        """The file of ``split`` on this rank."""
        root = Path(self.output_dir or Path(trainer.log_dir or trainer.default_root_dir) / "episodes")
        rank = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        return root / f"{split}{rank}.jsonl"

    def _start(self, trainer: L.Trainer, split: str) -> None:
        if split in self.splits and not trainer.sanity_checking:
            path = self.path(trainer, split)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("", encoding="utf-8")
            self.paths[split] = path

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule, split: str) -> None:
        if split not in self.paths or trainer.sanity_checking:
            return
        evaluator = getattr(pl_module, "evaluator", None)
        episodes: list[Episode] = getattr(evaluator, "last_episodes", None) or []
        with self.paths[split].open("a", encoding="utf-8") as fh:
            for episode in episodes:
                fh.write(json.dumps(episode_record(episode), ensure_ascii=False) + "\n")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the test file afresh."""
        self._start(trainer, "test")

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the validation file afresh."""
        self._start(trainer, "val")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        """Append the batch's episodes."""
        self._write(trainer, pl_module, "test")

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """Append the batch's episodes."""
        self._write(trainer, pl_module, "val")
