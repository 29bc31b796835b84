"""Logs a few decoded episodes as text every N training steps (TensorBoard's Text tab)."""

from __future__ import annotations

import json
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from envace.types import Episode


def render_episode(episode: Episode) -> str:
    """A readable transcript: the task, each message with its role, the reward and the counters (Markdown)."""
    lines = [f"**task** `{episode.task.id}`  **reward** {episode.reward:.3f}  **success** {episode.success}", ""]
    for m in episode.messages:
        text = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            text += f"\n<tool_call>{json.dumps({'name': fn['name'], 'arguments': fn['arguments']})}</tool_call>"
        role = m["role"] + (f"[{m['name']}]" if m["role"] == "tool" and m.get("name") else "")
        lines.append(f"    {role}: {text.strip()}".replace("\n", "\n    "))
    lines += ["", f"stats: `{episode.stats}`"]
    return "\n".join(lines)


class RolloutSampleLogger(L.Callback):
    """Writes ``num_episodes`` decoded episodes of the latest rollout every ``every_n_steps`` steps.

    Args:
        every_n_steps: logging period in optimiser steps.
        num_episodes: episodes shown each time.
    """

    def __init__(self, every_n_steps: int = 20, num_episodes: int = 2) -> None:
        self.every_n_steps = every_n_steps
        self.num_episodes = num_episodes

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the samples when the step count hits the period."""
        step = trainer.global_step
        if step % self.every_n_steps != 0 or not trainer.is_global_zero:
            return
        episodes: list[Episode] = pl_module.last_episodes[: self.num_episodes]
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for i, episode in enumerate(episodes):
                    logger.experiment.add_text(f"rollouts/episode_{i}", render_episode(episode), step)
