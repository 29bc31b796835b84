"""What a training step of ``EnvACEModule`` logs: its metrics, the run's real calls, and what goes to the loggers.

``step_metrics`` gathers one step's logged values (the update's statistics, the rollout's, the sampling metrics the
batch carries, the update's timing and throughput); ``RealCallTotals`` keeps the run's real tool calls, summed over
ranks and kept across resumes. Values whose keys differ between ranks or steps go to the loggers directly
(``log_to_loggers``, at the step Lightning logs the batch's metrics at): the rewards' counters
(``log_reward_metrics``), the MCP servers' counts (``log_server_counts``) and the live fidelity
(``LiveFidelityLog``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
import torch
from torch import Tensor

from envace.evaluation.metrics import rollout_metrics
from envace.rewards.base import Reward
from envace.rollout.collate import RolloutBatch
from envace.training.update import mean_stats
from envace.types import Episode
from envace.world_model.quality import WorldQuality


def step_metrics(step_stats: list[dict[str, Tensor]], batch: RolloutBatch, nonfinite_skips: int, start: float,
                 ppo_epochs: int) -> dict[str, float]:
    """One training step's metrics (keys without the ``train/`` prefix), its update timed from ``start``.

    Args:
        step_stats: each optimiser step's summed statistics (``update.sum_heads``; empty for a skipped step).
        batch: the step's rollout batch, with the sampling metrics it carries (``RolloutBatch.metrics``).
        nonfinite_skips: optimiser steps skipped for a non-finite loss or gradient in this training step.
        start: ``time.perf_counter()`` when the update began.
        ppo_epochs: passes over the batch's rows (``grpo.ppo_epochs``), for the update's token throughput.
    """
    metrics = mean_stats(step_stats)
    metrics.update(rollout_metrics(batch.episodes))
    metrics.update(batch.metrics)
    metrics["nonfinite_skips"] = float(nonfinite_skips)
    metrics["update_time_s"] = time.perf_counter() - start
    metrics["rows"] = float(len(batch))
    metrics["row_tokens"] = float(batch.attention_mask.sum())  # every row's tokens, prompts included
    passes = ppo_epochs * metrics["row_tokens"]
    metrics["update_tokens_per_s"] = passes / metrics["update_time_s"] if metrics["update_time_s"] > 0 else 0.0
    return metrics


class RealCallTotals:
    """The real tool calls of a run's training rollouts, summed over ranks, over the whole run (resumes included)."""

    def __init__(self) -> None:
        self.total = 0  # real tool calls spent by training rollouts, over the whole run (resumes included)
        self.saved_total = 0  # calls answered without a real execution, over the whole run

    def count(self, episodes: list[Episode], metrics: dict[str, float], trainer: Any,
              device: torch.device) -> dict[str, float]:
        """Add a step's real calls (its episodes' and audit's) and saved calls (``metrics``); the run's totals.

        A collective on several ranks: every rank calls it at the same step.
        """
        spent = sum(e.stats.real_calls for e in episodes) + int(metrics.get("real_calls_audit", 0))
        self.total += sum_over_ranks(spent, trainer, device)
        self.saved_total += sum_over_ranks(int(metrics["real_calls_saved"]), trainer, device)
        return {"real_calls_total": float(self.total), "real_calls_saved_total": float(self.saved_total)}

    def state_dict(self) -> dict[str, int]:
        """The totals under their checkpoint keys."""
        return {"envace_real_calls_total": self.total, "envace_real_calls_saved_total": self.saved_total}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Restore the totals from a checkpoint (0 where it has none)."""
        self.total = int(checkpoint.get("envace_real_calls_total", 0))
        self.saved_total = int(checkpoint.get("envace_real_calls_saved_total", 0))


def sum_over_ranks(count: int, trainer: Any, device: torch.device) -> int:
    """``count`` summed over the trainer's ranks (a collective on several ranks)."""
    if trainer.world_size == 1:
        return count
    total = trainer.strategy.reduce(torch.tensor(float(count), device=device), reduce_op="sum")
    return int(total.item())


def log_to_loggers(module: L.LightningModule, values: dict[str, float]) -> None:
    """Write ``values`` to the module's loggers directly, at the step Lightning logs this batch's metrics at.

    For values whose keys differ between ranks or steps, which ``LightningModule.log`` cannot take.
    """
    # the step Lightning logs this batch's metrics at (its count of batches that stepped)
    step = getattr(module.trainer.fit_loop.epoch_loop, "_batches_that_stepped", module.global_step)
    for logger in module.loggers:
        logger.log_metrics(values, step=step)


def log_reward_metrics(module: L.LightningModule, rewards: list[Reward]) -> None:
    """Counters of rewards that keep them (``ChecklistReward``: per-standard pass rates, judge calls/failures).

    Written to the loggers directly: their keys depend on the tasks a rank drew, so ``LightningModule.log`` with
    ``sync_dist`` could make ranks wait on different collectives. Logged from rank 0's rollouts.
    """
    values: dict[str, float] = {}
    for reward in rewards:
        metrics = getattr(reward, "metrics", None)
        if callable(metrics):
            values.update({f"train/{k}": float(v) for k, v in metrics().items()})
    if not values or module._trainer is None:
        return
    log_to_loggers(module, values)


def log_server_counts(module: L.LightningModule) -> None:
    """The MCP servers' starts, calls and faults in this process so far, where a task's environment is one.

    ``mcp/starts``, ``mcp/crashes``, ... (``envace.envs.mcp_pool.pool_counts``): totals, written to the loggers
    directly, on the ranks that ran the servers.
    """
    pools = sys.modules.get("envace.envs.mcp_pool")  # imported only where an environment used a server
    values = pools.pool_counts() if pools is not None else {}
    if values and module._trainer is not None:
        log_to_loggers(module, values)


class LiveFidelityLog:
    """Every ``log_every_n_steps`` training steps, the live fidelity of the probes since the last time.

    Written to the loggers directly, and only for the tools that had probes: ``LightningModule.log`` would repeat a
    tool's last value on the steps without one.
    """

    def __init__(self) -> None:
        self.steps = 0  # training steps since live fidelity was last logged

    def step(self, module: L.LightningModule, quality: WorldQuality) -> None:
        """Count a training step; on every ``log_every_n_steps``-th, log ``quality``'s live fidelity since the last.

        A collective on several ranks: every rank calls it at the same step.
        """
        self.steps += 1
        if self.steps < module.trainer.log_every_n_steps:
            return
        self.steps = 0
        live = quality.fidelity_logs()  # a collective on several ranks: every rank calls it at the same step
        if not live:
            return
        log_to_loggers(module, {f"train/fidelity/{k}": v for k, v in live.items()})
