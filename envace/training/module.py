"""The EnvACE LightningModule: the policy, its rollout sampler, and the role-wise GRPO update.

The module owns the model, the act/rehearse loss heads, the world-model alignment term and every optimiser step
(manual optimisation). Rollouts are sampled by ``sample_rollouts`` (the narrow interface the DataModule's stream
calls, so the batch a step trains on is always sampled from the current weights); rollout, reward, advantage and
loss code live in their own small modules.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from peft import PeftModel
from torch import Tensor

from envace.evaluation.evaluator import PolicyEvaluator, policy_engine
from envace.evaluation.metrics import failure_causes, rollout_metrics
from envace.losses.aggregation import TokenAggregator, TokenMean, role_weights
from envace.losses.engine_gap import engine_correction
from envace.losses.objective import LossWeights, envace_objective
from envace.losses.policy import ClippedPolicyLoss
from envace.policy.chat import check_chat_template
from envace.policy.hf import Policy, adapter_context
from envace.policy.logprobs import PrefixCarry, token_logps
from envace.rewards.base import Reward
from envace.rewards.checklist import mask_groups_with_failed_judging
from envace.rewards.scoring import score_episodes
from envace.rewards.shaping import PredictionErrorShaping
from envace.rewards.task_success import TaskSuccess
from envace.rollout.collate import RolloutBatch, collate, role_rows
from envace.rollout.private_rehearsal import PrivateRehearsal, Selector
from envace.rollout.runner import EpisodeRunner, RolloutConfig
from envace.runtime.checkpoint import rng_state, set_rng_state
from envace.runtime.distributed import fully_shard_layers, peer_any, peer_max
from envace.training.advantages import group_advantages, role_group_ids
from envace.training.base import PolicyModule
from envace.training.memory import Workload
from envace.training.update import Groups, GRPOConfig, MicroBatch, mean_stats, micro_batches, sum_heads
from envace.types import Episode, Role, Sample, Task
from envace.world_model.alignment import AlignmentRows, DemonstrationRows
from envace.world_model.audit import WorldAudit
from envace.world_model.fidelity import reference_probes, rehearse_probes
from envace.world_model.guard import CollusionGuard
from envace.world_model.quality import WorldQuality
from envace.worlds.base import World
from envace.worlds.rehearse import RehearseWorld, alignment_prompter
from envace.worlds.users import ModelUser

log = logging.getLogger(__name__)

NONFINITE_CHECKS = ("loss_act", "loss_rehearse", "loss_align", "loss_imitate", "kl", "loss")
"""The objective's heads (and total) whose finiteness an optimiser step checks, besides the gradient."""

RATE_STATS = ("clip_frac", "dual_clip_frac", "approx_kl")
"""Per-role token rates of the objective, reduced over micro-batches weighted by their tokens (``sum_heads``)."""


class EnvACEModule(PolicyModule):
    """A policy trained with world rehearsal: it acts, rehearses its own tool responses, and learns from both.

    Args:
        policy: builds the model and tokenizer (``envace.policy.HFPolicy`` or ``envace.policy.TinyPolicy``).
        world: answers tool calls during training: ``RehearseWorld`` (EnvACE), ``RealWorld`` (the classic
            baseline) or ``FrozenWorld`` (an external, frozen simulator). Default: ``RehearseWorld()``.
        eval_world: answers tool calls in ``validate``/``test``; default: the training world. Use ``RealWorld`` to
            measure real success rather than success inside the policy's own rehearsed world.
        rewards: summed into each episode's reward. Default: ``[TaskSuccess()]``.
        shaping: optional prediction-error shaping of the rehearse rows' reward.
        rollout: episode budgets and sampling.
        grpo: advantage and update settings.
        policy_loss: the clipped policy-gradient loss of both heads.
        aggregation: how token losses are averaged within a head (``TokenMean``, ``SeqMeanTokenMean``,
            ``ConstantNorm``). Default: ``TokenMean()``.
        optimizer: optimiser over the trainable parameters.
        lr_scheduler: learning-rate schedule, stepped after every optimiser step (e.g. a linear warm-up); None keeps
            the rate constant.
        role_adapters: names of the act and rehearse LoRA adapters for the "noshare" variant (the policy must be
            built with ``adapters`` holding both); None shares all weights between the roles (EnvACE's setting).
        log_entropy: log per-role token entropy (one extra softmax over the vocabulary per micro-batch).
        eval_fidelity: in ``validate``/``test``, also rehearse every reference call of the evaluation tasks
            (teacher-forced: the real history before it) and log how faithful the responses are to the recorded
            real ones (exact match, leaf F1, key match, parse rate, error agreement).
        eval_imagined: in ``validate``/``test``, also run every task with the policy rehearsing the tool responses
            and log ``imagined_success`` next to the ``eval_world`` success.
        export_dir: at the end of ``fit``, save the policy here in Hugging Face format (single device or DDP);
            ``{root}`` stands for ``trainer.default_root_dir``.
        export_best: export the weights of the best validation of this logged metric instead of the last ones.
        audit: replay a share of the rehearsed training episodes in the real environment (their tasks need one):
            the free-running fidelity horizon, the sim-to-real gap, and real targets for shaping and grounding.
            Audit calls are real calls, counted in ``real_calls_audit`` and ``real_calls_total``.
        guard: the collusion guard on the audited sim-to-real gap (needs ``audit``).
        fidelity_gate: refuse to start training when the policy's rehearsal fidelity (exact match of the rehearsed
            responses to the recorded real ones, teacher-forced on the validation tasks' reference calls, or the
            training tasks' without validation tasks) is below this: a world model that inaccurate is easier to game
            than to learn from. None skips the check, and so does a training world that never rehearses
            (``RealWorld``, a ``HybridWorld`` without rehearsal).
        user: a simulated user (a local model that is never trained) writing the user turns of tasks with
            ``Task.user`` after their scripted ones, in training and evaluation (tau^2's user-mode tasks).
        test_rehearsal: under ``envace test``, rehearse privately before committed act turns (the paper's test-time
            claim; ``envace.rollout.private_rehearsal``), e.g. ``--model.test_rehearsal.rehearsals=4``. None acts
            plainly.
        rehearsal_selector: what a rehearsal commits: ``envace.rollout.private_rehearsal.MemoryCommit`` (default: the
        act
            role writes the turn with the rehearsal memory), ``MajorityCommit`` or ``JudgedCommit``.
        test_group_by: under ``envace test``, also log success per value of this key of the tasks' ``metadata``:
            ``test/success_act/KEY=VALUE`` and ``test/tasks/KEY=VALUE`` (tasks without the key: ``KEY=none``;
            docs/task-format.md). None logs the overall success only.
        memory_limit_gb: before the first step, the run's estimated peak memory (``envace.training.memory``) must fit in
            this many GiB, or it stops with one line naming the key to lower; None: the memory this machine (or GPU)
            has; 0: no check.
    """

    def __init__(
        self,
        policy: Policy,
        world: World | None = None,
        eval_world: World | None = None,
        rewards: list[Reward] | None = None,
        shaping: PredictionErrorShaping | None = None,
        rollout: RolloutConfig = RolloutConfig(),  # noqa: B008 (frozen use: never mutated)
        grpo: GRPOConfig = GRPOConfig(),  # noqa: B008
        policy_loss: ClippedPolicyLoss | None = None,
        aggregation: TokenAggregator | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        role_adapters: tuple[str, str] | None = None,
        log_entropy: bool = True,
        eval_fidelity: bool = True,
        eval_imagined: bool = True,
        export_dir: str | None = None,
        export_best: str | None = None,
        fidelity_gate: float | None = None,
        audit: WorldAudit | None = None,
        guard: CollusionGuard | None = None,
        user: ModelUser | None = None,
        test_rehearsal: PrivateRehearsal | None = None,
        rehearsal_selector: Selector | None = None,
        test_group_by: str | None = None,
        memory_limit_gb: float | None = None,
    ) -> None:
        super().__init__()
        if memory_limit_gb is not None and memory_limit_gb < 0:
            raise ValueError(f"memory_limit_gb must be >= 0 or null, got {memory_limit_gb}")
        self.memory_limit_gb = memory_limit_gb
        if grpo.tis_cap is not None and rollout.engine != "vllm":
            raise ValueError("grpo.tis_cap corrects for a separate rollout engine's log-probs: it needs "
                             f"rollout.engine: vllm, not {rollout.engine!r}")
        if fidelity_gate is not None and not 0.0 <= fidelity_gate <= 1.0:
            raise ValueError(f"fidelity_gate must be in [0, 1] or None, got {fidelity_gate}")
        self.fidelity_gate = fidelity_gate
        self.save_hyperparameters()
        self.configure_export(export_dir, export_best)
        self.real_calls_total = 0  # real tool calls spent by training rollouts, over the whole run (resumes included)
        self.real_calls_saved_total = 0  # calls answered without a real execution, over the whole run
        self._live_steps = 0  # training steps since live fidelity was last logged
        self._pending_rng: dict[str, Any] | None = None  # random states of a restored checkpoint, for the next rollout
        self._nonfinite_streak = 0  # consecutive optimiser steps skipped for a non-finite loss or gradient
        self._nonfinite_skips = 0  # optimiser steps skipped so far in this training step
        self._failed_streak = 0  # consecutive training steps whose every episode failed
        self._vllm_engine: Any = None  # the rollout engine, with rollout.engine: vllm (started on first use)
        self._adapter_dir: tempfile.TemporaryDirectory[str] | None = None  # role adapters as the vLLM engine reads them
        self._engine_step: int | None = None  # the global step whose weights that engine holds
        self.automatic_optimization = False
        self.policy = policy
        self.world = world if world is not None else RehearseWorld()
        self.eval_world = eval_world if eval_world is not None else self.world
        self.rewards = rewards if rewards is not None else [TaskSuccess()]
        self.shaping = shaping
        self.rollout = rollout
        self.grpo = grpo
        self.policy_loss = policy_loss or ClippedPolicyLoss()
        self.aggregation = aggregation or TokenMean()
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.role_adapters = role_adapters
        self.log_entropy = log_entropy
        self.eval_fidelity = eval_fidelity
        self.model: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.last_episodes: list[Episode] = []
        self._bound = False
        self.prompter = alignment_prompter(self.world)  # the policy's own rehearse prompts (alignment, evaluation)
        self.quality = WorldQuality(self.world, audit, guard)
        self.user = user
        self.evaluator = PolicyEvaluator(self.eval_world, self.prompter, self.rewards, rollout, eval_fidelity,
                                         eval_imagined, user, test_rehearsal, rehearsal_selector, test_group_by)

    # -- setup ------------------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        """Build the policy (idempotent: Lightning may call this more than once)."""
        if self.model is not None:
            return
        self.check_policy_format()
        model, tokenizer = self.policy.build()
        check_chat_template(tokenizer)
        model.train()
        if self.grpo.kl_weight > 0 and not isinstance(model, PeftModel):
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if self._device_mesh is not None:
            for module in (model, self.reference):
                if module is not None:
                    fully_shard_layers(module, self.device_mesh["data_parallel"])
        self.model, self.tokenizer = model, tokenizer

    def _bind_worlds(self) -> None:
        if self._bound:
            return
        for world in {id(self.world): self.world, id(self.eval_world): self.eval_world}.values():
            world.bind(self.tokenizer, self.model)
        self.runner = EpisodeRunner(self.tokenizer, self.rollout)
        self.prompter.bind(self.tokenizer, self.model)
        self.alignment = AlignmentRows(self.tokenizer, self.prompter, self.grpo.align_max_per_task)
        self.demonstrations = DemonstrationRows(self.tokenizer, teacher_forced=True)
        act, rehearse = self.role_adapters or (None, None)
        self.act_engine = policy_engine(self, self.model, self.tokenizer, self.rollout, act)
        self.rehearse_engine = policy_engine(self, self.model, self.tokenizer, self.rollout, rehearse)
        self._bound = True

    # -- rollouts ---------------------------------------------------------------------------------------------------

    def sample_rollouts(self, tasks: list[Task]) -> RolloutBatch:
        """Sample G episodes per task with the current weights, score them, and collate the training rows.

        This is the sampling interface the DataModule's stream calls; it runs under ``torch.no_grad``.
        """
        self._bind_worlds()
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        start = time.perf_counter()
        synced = self.sync_engine()
        generated_before = self._generated_tokens()
        group = self.grpo.group_size
        self.world.begin_rollout(int(self.global_step))
        with torch.no_grad():
            episodes = self.runner.run(
                [t for t in tasks for _ in range(group)],
                [i for i in range(len(tasks)) for _ in range(group)],
                self.act_engine,
                self.world,
                self.rehearse_engine,
                any_active=self._any_active if self.trainer.world_size > 1 else None,
                user=self.user,
                turn_gate=self._turn_gate(),
            )
        self._engine_rests()
        audited = self.quality.replay(episodes, int(self.global_step))
        score_episodes(episodes, self.rewards, self.shaping, self.quality.recorded)
        judge_masked = mask_groups_with_failed_judging(episodes)  # a judge failure drops its whole group
        quality = self.quality.after_scoring(episodes, audited, self.rewards)
        batch = self._collate(episodes, tasks)
        self.return_freed_memory()  # the engine's keys and values of the finished episodes
        elapsed = time.perf_counter() - start
        generated = self._generated_tokens() - generated_before
        batch.metrics = {"rollout_time_s": elapsed, "generated_tokens": float(generated), **quality,
                         "judge_masked_episodes": float(judge_masked)}
        if synced is not None:
            batch.metrics["engine_sync_s"] = synced
        self._log_reward_metrics()
        batch.metrics.update({f"world_{k}": v for k, v in getattr(self.world, "metrics", dict)().items()})
        batch.metrics["rollout_tokens_per_s"] = generated / elapsed if elapsed > 0 else 0.0
        return batch

    def _generated_tokens(self) -> int:
        # one engine may serve both roles (or two views of one vLLM engine, which share its queue and its count)
        engines = {id(getattr(e, "queue", e)): e for e in (self.act_engine, self.rehearse_engine)}.values()
        return sum(e.generated_tokens for e in engines)

    def sync_engine(self) -> float | None:
        """Give a separate rollout engine (vLLM) the policy's weights if an optimiser step changed them since.

        A sleeping engine (``rollout.vllm.sleep``) is woken first. Returns the seconds the sync took, or None when
        nothing was synced (the engine is current, or the policy generates with the trained model itself).
        """
        engine = self._vllm_engine
        if engine is None:
            return None
        engine.wake_up()
        if self._engine_step == int(self.global_step):
            return None
        from envace.engines.weights import policy_weights, write_adapter

        if self.role_adapters:  # the base is frozen: each role's adapter goes through vLLM's LoRA support
            if self._adapter_dir is None:
                self._adapter_dir = tempfile.TemporaryDirectory(prefix="envace-adapters-")
            start = time.perf_counter()
            for name in self.role_adapters:
                engine.load_adapter(name, write_adapter(self.model, name, Path(self._adapter_dir.name, name)))
            seconds = time.perf_counter() - start
        else:
            seconds = engine.load_weights(policy_weights(self.model))
        self._engine_step = int(self.global_step)
        return seconds

    def _engine_rests(self) -> None:
        """With ``rollout.vllm.sleep``, the vLLM engine gives its GPU memory back until the next rollout."""
        if self._vllm_engine is not None and self.rollout.vllm.sleep:
            self._vllm_engine.sleep()

    def _collate(self, episodes: list[Episode], tasks: list[Task]) -> RolloutBatch:
        samples = [s for e in episodes for s in e.samples()]
        if self.grpo.align_weight > 0:
            samples += self.alignment.rows(tasks)
            if self.grpo.align_live:
                samples += self.alignment.live_rows(episodes, self.grpo.align_live_max)
        if self.grpo.imitate_weight > 0:
            samples += self.demonstrations.rows(tasks)
        if not samples:  # every episode failed: one zero-weight row, so this rank can still join its peers' passes
            pad = self.tokenizer.pad_token_id
            samples = [Sample([pad], [int(Role.SYSTEM)], [0], Role.ACT, -1, -1, reward=float("nan"))]
        temps = {Role.ACT: self.rollout.act_temperature, Role.REHEARSE: self.rollout.rehearse_temperature}
        temperatures = [1.0 if s.align else temps[s.role] for s in samples]
        batch = collate(samples, temperatures, self.tokenizer.pad_token_id)
        rewards = torch.where(batch.is_align, torch.full_like(batch.rewards, float("nan")), batch.rewards)
        batch.advantages = group_advantages(
            rewards,
            role_group_ids(batch.group_ids, batch.row_role),
            batch.episode_ids,
            baseline=self.grpo.baseline,
            scale_by_std=self.grpo.scale_by_std,
        )
        batch.episodes = episodes
        return batch

    def _any_active(self, active: bool) -> bool:
        return bool(self.trainer.strategy.reduce_boolean_decision(active, all=False))

    # -- update -----------------------------------------------------------------------------------------------------

    def training_step(self, dataloader_iter: Iterator[tuple[RolloutBatch, int, int]]) -> None:
        """One rollout batch (sampled fresh by the DataModule stream), then ``ppo_epochs`` passes of updates.

        Taking the iterator (rather than a batch) stops Lightning from prefetching the next batch, which would
        sample it from the weights before this update: every update here trains on rollouts of its own weights.
        """
        batch, _, _ = next(dataloader_iter)
        batch = batch.to(self.device)
        start = time.perf_counter()
        self._nonfinite_skips = 0
        step_stats: list[dict[str, Tensor]] = []
        if not self._all_failed(batch.episodes):  # failed episodes have no rows; all failed: nothing to learn from
            self._behaviour_logps(batch)
            for _ in range(self.grpo.ppo_epochs):
                for rows in self._mini_batches(len(batch)):
                    if self._budget_spent():
                        break
                    step_stats.append(self._optimise(batch.rows(rows)))
        metrics = mean_stats(step_stats)
        metrics.update(rollout_metrics(batch.episodes))
        metrics.update(batch.metrics)
        metrics["nonfinite_skips"] = float(self._nonfinite_skips)
        metrics["update_time_s"] = time.perf_counter() - start
        metrics["rows"] = float(len(batch))
        metrics["row_tokens"] = float(batch.attention_mask.sum())  # every row's tokens, prompts included
        passes = self.grpo.ppo_epochs * metrics["row_tokens"]
        metrics["update_tokens_per_s"] = passes / metrics["update_time_s"] if metrics["update_time_s"] > 0 else 0.0
        spent = sum(e.stats.real_calls for e in batch.episodes) + int(metrics.get("real_calls_audit", 0))
        self.real_calls_total += self._sum_over_ranks(spent)
        self.real_calls_saved_total += self._sum_over_ranks(int(metrics["real_calls_saved"]))
        metrics["real_calls_total"] = float(self.real_calls_total)
        metrics["real_calls_saved_total"] = float(self.real_calls_saved_total)
        self.last_episodes = batch.episodes
        # Averaged over ranks (counts such as real_calls are per-rank means); every rank logs the same keys.
        self.log_dict({f"train/{k}": float(v) for k, v in metrics.items()}, batch_size=len(batch.episodes),
                      sync_dist=self.trainer.world_size > 1)
        self._log_live_fidelity()

    def _all_failed(self, episodes: list[Episode]) -> bool:
        """Warn once per failure cause; True when every episode of every rank failed (the update is then skipped).

        Reduced over ranks, so every rank makes the same collective calls: all skip, or none does (a rank whose
        episodes all failed joins its peers' passes with a zero-weight row).
        """
        step = int(self.global_step)
        where = f"rank {self.global_rank}, " if self.trainer.world_size > 1 else ""
        for cause, ids in failure_causes(episodes).items():
            tasks = list(dict.fromkeys(ids))
            shown = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
            log.warning("%sstep %d: %d episode(s) failed and are left out of the update: %s (tasks: %s)",
                        where, step, len(ids), cause, shown)
        failed = bool(episodes) and all(e.stats.failed for e in episodes)
        if self.trainer.world_size > 1:
            failed = bool(self.trainer.strategy.reduce_boolean_decision(failed, all=True))
        self._failed_streak = self._failed_streak + 1 if failed else 0
        limit = self.grpo.max_failed_steps
        if failed and 0 < limit <= self._failed_streak:
            causes = "; ".join(failure_causes(episodes)) or "see the warnings above"
            raise RuntimeError(f"{self._failed_streak} training steps in a row had every episode fail (the last at "
                               f"step {step}: {causes}); training stops (grpo.max_failed_steps={limit})")
        if failed:
            rank_zero_warn(f"step {step}: every episode of the rollout failed; the update is skipped "
                           "(train/failed_episodes, and the warnings above name the causes)")
        return failed

    def _turn_gate(self) -> Any:
        """The first reward's turn gate (``ChecklistReward.continue_after_turn``), or None."""
        return next((r.continue_after_turn for r in self.rewards if hasattr(r, "continue_after_turn")), None)

    def _log_reward_metrics(self) -> None:
        """Counters of rewards that keep them (``ChecklistReward``: per-standard pass rates, judge calls/failures).

        Written to the loggers directly: their keys depend on the tasks a rank drew, so ``self.log`` with
        ``sync_dist`` could make ranks wait on different collectives. Logged from rank 0's rollouts.
        """
        values: dict[str, float] = {}
        for reward in self.rewards:
            metrics = getattr(reward, "metrics", None)
            if callable(metrics):
                values.update({f"train/{k}": float(v) for k, v in metrics().items()})
        if not values or self._trainer is None:
            return
        step = getattr(self.trainer.fit_loop.epoch_loop, "_batches_that_stepped", self.global_step)
        for logger in self.loggers:
            logger.log_metrics(values, step=step)

    def _log_live_fidelity(self) -> None:
        """Every ``log_every_n_steps`` training steps, the live fidelity of the probes since the last time.

        Written to the loggers directly, and only for the tools that had probes: ``self.log`` would repeat a tool's
        last value on the steps without one.
        """
        self._live_steps += 1
        if self._live_steps < self.trainer.log_every_n_steps:
            return
        self._live_steps = 0
        live = self.quality.fidelity_logs()  # a collective on several ranks: every rank calls it at the same step
        if not live:
            return
        # the step Lightning logs this batch's metrics at (its count of batches that stepped)
        step = getattr(self.trainer.fit_loop.epoch_loop, "_batches_that_stepped", self.global_step)
        for logger in self.loggers:
            logger.log_metrics({f"train/fidelity/{k}": v for k, v in live.items()}, step=step)

    def rehearse_budget(self) -> int | None:
        """The rehearse role's generation budget (``rollout.rehearse_max_new_tokens``)."""
        return self.rollout.rehearse_max_new_tokens

    def _sum_over_ranks(self, count: int) -> int:
        if self.trainer.world_size == 1:
            return count
        total = self.trainer.strategy.reduce(torch.tensor(float(count), device=self.device), reduce_op="sum")
        return int(total.item())

    def on_fit_start(self) -> None:
        """Declare the live fidelity metric of every training tool, then check the fidelity gate."""
        super().on_fit_start()
        datamodule = self.trainer.datamodule
        train = getattr(datamodule, "tasks", {}).get("train") or []
        self.check_memory(self._workload())
        # every rank declares the same tools, in the same order: each metric's compute is a collective
        self.quality.live.declare(sorted({spec["function"]["name"] for task in train for spec in task.tools}))
        if self.fidelity_gate is None:
            return
        if not getattr(self.world, "rehearses", True):
            rank_zero_info(f"fidelity gate: not checked, the training world ({type(self.world).__name__}) answers no "
                           "call by rehearsal")
            return
        tasks = getattr(datamodule, "tasks", {}).get("val") or getattr(datamodule, "tasks", {}).get("train") or []
        self._bind_worlds()
        probes = reference_probes(tasks)
        if not probes:
            raise ValueError("fidelity_gate is set but no validation or training task has a reference call to probe")
        with torch.no_grad():
            scores = rehearse_probes(probes, self.prompter, self.rehearse_engine, self.rollout.rehearse_max_new_tokens)
        exact = sum(score.exact_match for score in scores) / len(scores)
        exact = float(self.trainer.strategy.reduce(torch.tensor(exact, device=self.device), reduce_op="mean"))
        rank_zero_info(f"fidelity gate: rehearsal exact match {exact:.3f} on {len(scores)} reference calls "
                       f"(gate {self.fidelity_gate})")
        if exact < self.fidelity_gate:
            raise ValueError(
                f"fidelity gate: the policy rehearses {exact:.3f} of the reference calls exactly, below "
                f"fidelity_gate={self.fidelity_gate}; train the warm start longer (or on more world-model data) "
                "before rehearsal RL, or lower the gate"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the run's real-call counts, the collusion guard's window and the world's grounding across resumes."""
        checkpoint["envace_real_calls_total"] = self.real_calls_total
        checkpoint["envace_real_calls_saved_total"] = self.real_calls_saved_total
        checkpoint["envace_world_quality"] = self.quality.state_dict_extra()
        checkpoint["envace_rng"] = self._rng_states()  # one per rank: each rank samples its own stream

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore what ``on_save_checkpoint`` kept."""
        self.real_calls_total = int(checkpoint.get("envace_real_calls_total", 0))
        self.real_calls_saved_total = int(checkpoint.get("envace_real_calls_saved_total", 0))
        self.quality.load_state_dict_extra(checkpoint.get("envace_world_quality", {}))
        states = checkpoint.get("envace_rng")
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer else (0, 1)
        if isinstance(states, list) and len(states) == world:
            # Applied when the next rollout starts, not now: between here and there Lightning creates the training
            # DataLoader's iterator, which draws from the global generator; the interrupted run made that draw
            # before its first step. Sampling then continues exactly where the interrupted run was.
            self._pending_rng = states[rank]
        elif states is not None:
            rank_zero_warn(f"the checkpoint holds the random states of {len(states)} rank(s), this run has {world}: "
                           "sampling restarts from the seed")

    def _rng_states(self) -> list[dict[str, Any]]:
        """Every rank's random states (a collective: Lightning calls ``on_save_checkpoint`` on every rank)."""
        mine = rng_state()
        if self.trainer.world_size == 1:
            return [mine]
        states: list[Any] = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(states, mine)
        return states

    def _workload(self) -> Workload:
        """The token sizes of this run's peak, bounded from the config (the rows depend on what is sampled).

        A micro-batch holds up to ``grpo.micro_batch_tokens`` padded tokens, or one row of up to
        ``rollout.max_context_tokens``; without a budget, ``grpo.micro_batch_size`` such rows. Half its positions are
        taken as scored (generated). The engine generates a step's episodes (or an evaluation batch) at once.
        """
        g, r = self.grpo, self.rollout
        tokens = max(g.micro_batch_tokens, r.max_context_tokens) if g.micro_batch_tokens else (
            g.micro_batch_size * r.max_context_tokens)
        datamodule = self.trainer.datamodule
        episodes = getattr(datamodule, "batch_size", 1) * g.group_size
        rows = min(max(episodes, getattr(datamodule, "eval_batch_size", 0)), r.generate_batch_size)
        return Workload(tokens, tokens // 2, rows if r.engine != "vllm" else 0, r.max_context_tokens,
                        r.cache_tokens if r.engine == "cached" else 0, budget_key="model.grpo.micro_batch_tokens",
                        generation_key="data.batch_size (or rollout.generate_batch_size)")

    def _budget_spent(self) -> bool:
        """``trainer.max_steps`` counts optimiser steps; stop mid-rollout rather than overshoot it."""
        max_steps = self.trainer.max_steps
        return max_steps is not None and 0 <= max_steps <= self.global_step

    def _behaviour_logps(self, batch: RolloutBatch) -> None:
        """Old log-probs when the update takes several steps per rollout; reference log-probs for the KL term."""
        several = self.grpo.ppo_epochs > 1 or self.grpo.mini_batches > 1
        with torch.no_grad():
            if several:
                batch.old_logps = self._logps_in_chunks(batch, self.model, nullcontext)
            if self.grpo.kl_weight > 0:
                reference = self.reference or self.model
                context = nullcontext if self.reference is not None else self.model.disable_adapter
                batch.ref_logps = self._logps_in_chunks(batch, reference, context)

    def _logps_in_chunks(
        self, batch: RolloutBatch, model: torch.nn.Module, context: Any
    ) -> Tensor:
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)  # [N, T]
        micro_batches = list(self._micro_batches(batch, torch.arange(len(batch), device=batch.input_ids.device)))
        passes = self._peer_max(len(micro_batches))  # before any pass: no other collective may interleave with it
        carry = self.prefix_carry(batch, micro_batches)
        for idx, groups in micro_batches:
            micro = batch.rows(idx)
            with context(), self._role_adapter(micro):
                logps, _ = token_logps(model, micro.input_ids, micro.attention_mask, micro.temperatures,
                                        positions=micro.loss_mask, share_prefix=self.grpo.share_prefix,
                                        groups=groups, carry=carry)
            out[idx, : logps.shape[1]] = logps
        if carry is not None:
            carry.check_done()
        for _ in range(passes - len(micro_batches)):
            with context():
                self._join_peers(model, backward=False)
        return out

    def _mini_batches(self, n: int) -> list[Tensor]:
        """``grpo.mini_batches`` shuffled parts of the rows: the same count on every rank (a part may be empty)."""
        order = torch.randperm(n, generator=torch.Generator().manual_seed(int(self.global_step)))
        return [part.to(self.device) for part in torch.tensor_split(order, self.grpo.mini_batches)]

    def _peer_max(self, count: int) -> int:
        """The largest ``count`` over all ranks: every rank must make the same number of model passes."""
        return peer_max(count, self.device) if self.trainer.world_size > 1 else count

    def _join_peers(self, model: torch.nn.Module, backward: bool) -> None:
        """A zero-weight one-token pass, so that a rank with fewer micro-batches joins its peers' collectives."""
        ids = torch.full((1, 1), self.tokenizer.pad_token_id, dtype=torch.long, device=self.device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        if backward:
            self.manual_backward(logits.sum() * 0.0)

    def _micro_batches(self, batch: RolloutBatch, rows: Tensor) -> Iterator[MicroBatch]:
        """``update.micro_batches`` under ``grpo``'s caps; one role per micro-batch with role adapters."""
        g = self.grpo
        return micro_batches(batch, rows, g.micro_batch_size, g.micro_batch_tokens, by_role=bool(self.role_adapters),
                             share_prefix=g.share_prefix)

    def _optimise(self, mb: RolloutBatch) -> dict[str, Tensor]:
        """One optimiser step on a mini-batch, accumulating gradients over its micro-batches."""
        optimizer = self.optimizers()
        stats = self._accumulate(mb)
        nonfinite = self._nonfinite(stats, optimizer)
        if nonfinite:  # skipped on every rank (the flags are reduced): no rank steps while another skips
            optimizer.zero_grad(set_to_none=True)
            self._skip_nonfinite(nonfinite)
            return {}
        self._nonfinite_streak = 0
        self.step_optimizer(optimizer, self.grpo.grad_clip)
        return sum_heads(stats)

    def _accumulate(self, mb: RolloutBatch) -> list[dict[str, Tensor]]:
        """Forward and backward every micro-batch of a mini-batch; the gradients add up to the mini-batch's.

        Each head's aggregation weights are computed once on the whole mini-batch and sliced per micro-batch, so the
        accumulated loss and gradients equal the single-batch ones (up to float rounding) whatever the token budget.
        Returns each micro-batch's statistics.
        """
        weights = {
            "act": role_weights(self.aggregation, mb.loss_mask, role_rows(mb, Role.ACT)),
            "rehearse": role_weights(self.aggregation, mb.loss_mask, role_rows(mb, Role.REHEARSE)),
            "align": role_weights(TokenMean(), mb.loss_mask, mb.is_align & (mb.row_role == int(Role.REHEARSE))),
            "imitate": role_weights(TokenMean(), mb.loss_mask, mb.is_align & (mb.row_role == int(Role.ACT))),
        }
        micro_batches = list(self._micro_batches(mb, torch.arange(len(mb), device=mb.input_ids.device)))
        passes = self._peer_max(len(micro_batches))  # before any pass: no other collective may interleave with it
        stats: list[dict[str, Tensor]] = []
        carry = self.prefix_carry(mb, micro_batches)
        for idx, groups in micro_batches:
            micro = mb.rows(idx)
            w = {k: v[idx][:, : micro.input_ids.shape[1]] for k, v in weights.items()}
            with self._role_adapter(micro):
                loss, micro_stats = self._micro_loss(micro, w, groups, carry)
                self.manual_backward(self.with_carry(loss, carry))
            self.return_freed_memory("micro_batch")
            stats.append(micro_stats)
        if carry is not None:
            carry.check_done()
        for _ in range(passes - len(micro_batches)):
            self._join_peers(self.model, backward=True)
        return stats

    def _nonfinite(self, stats: list[dict[str, Tensor]], optimizer: Any) -> list[str]:
        """The loss heads (``NONFINITE_CHECKS``) and ``grad_norm`` that are not finite on some rank; [] if none.

        One collective on several ranks, so every rank gets the same answer. The gradient is checked on the
        optimiser's own parameters (this rank's shard under FSDP), except under a float16 ``GradScaler``, whose own
        step skips overflowing gradients and lowers its scale (skipping before it would keep the scale too high).
        """
        flags = torch.zeros(len(NONFINITE_CHECKS) + 1, device=self.device)  # [H + 1]
        if stats:
            heads = torch.stack([torch.stack([s[h].float() for h in NONFINITE_CHECKS]) for s in stats])  # [M, H]
            flags[:-1] = (~torch.isfinite(heads)).any(0).float()
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        grads = [] if scaled else [p.grad for group in optimizer.param_groups for p in group["params"]
                                   if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # FSDP2: this rank's shard
        if grads:
            flags[-1] = (~torch.stack([torch.isfinite(g).all() for g in grads]).all()).float()
        if self.trainer.world_size > 1:
            peer_any(flags)
        return [name for name, flag in zip((*NONFINITE_CHECKS, "grad_norm"), flags.tolist()) if flag]

    def _skip_nonfinite(self, nonfinite: list[str]) -> None:
        """Count a skipped optimiser step; stop training after ``grpo.max_nonfinite_steps`` in a row."""
        self._nonfinite_skips += 1
        self._nonfinite_streak += 1
        step, names = int(self.global_step), ", ".join(nonfinite)
        limit = self.grpo.max_nonfinite_steps
        if 0 < limit <= self._nonfinite_streak:
            raise RuntimeError(
                f"{self._nonfinite_streak} consecutive optimiser steps had a non-finite loss or gradient (the last at "
                f"optimiser step {step}: non-finite {names}); training stops (grpo.max_nonfinite_steps={limit}). "
                "Check the rewards and advantages, lower the learning rate, or train in float32")
        rank_zero_warn(f"optimiser step {step}: non-finite {names}; the step is skipped (gradients zeroed), "
                       f"{self._nonfinite_streak} in a row")

    def _micro_loss(self, micro: RolloutBatch, w: dict[str, Tensor], groups: Groups | None = None,
                    carry: PrefixCarry | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        logps, entropy = token_logps(
            self.model, micro.input_ids, micro.attention_mask, micro.temperatures, with_entropy=self.log_entropy,
            positions=micro.loss_mask, share_prefix=self.grpo.share_prefix, groups=groups, carry=carry,
        )
        old = micro.old_logps if micro.old_logps is not None else logps.detach()
        g = self.grpo
        gap: dict[str, Tensor] = {}
        if self.rollout.engine == "vllm":  # every rank logs the same keys, with or without engine log-probs here
            engine = micro.engine_logps if micro.engine_logps is not None else torch.full_like(old, float("nan"))
            trained = micro.loss_mask * (~micro.is_align).float()[:, None]
            tis, gap = engine_correction(old, engine, trained, g.tis_cap)
            w = {**w, "act": w["act"] * tis, "rehearse": w["rehearse"] * tis}
        loss, stats = envace_objective(
            logps, old, micro.ref_logps, micro.advantages, micro.loss_mask, micro.row_role, micro.is_align,
            w["act"], w["rehearse"], w["align"], self.policy_loss,
            LossWeights(g.act_weight, g.rehearse_weight, g.align_weight, g.kl_weight, g.imitate_weight),
            weights_imitate=w["imitate"],
        )
        stats.update(gap)
        for name, role in (("act", Role.ACT), ("rehearse", Role.REHEARSE)):  # rates as [sum, count]: token-weighted
            count = (micro.loss_mask * role_rows(micro, role).float()[:, None]).sum()
            for key in RATE_STATS:
                stats[f"{key}_{name}"] = torch.stack([stats[f"{key}_{name}"] * count, count])
        if entropy is not None:
            for name, role in (("act", Role.ACT), ("rehearse", Role.REHEARSE)):
                mask = micro.loss_mask * role_rows(micro, role).float()[:, None]
                stats[f"entropy_{name}"] = torch.stack([(entropy * mask).sum(), mask.sum()])
        return loss, stats

    def _role_adapter(self, micro: RolloutBatch) -> AbstractContextManager[None]:
        if not self.role_adapters:
            return nullcontext()
        name = self.role_adapters[0] if int(micro.row_role[0]) == int(Role.ACT) else self.role_adapters[1]
        return adapter_context(self.model, name)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Task batches stay on the host (rollouts are generated on the model's device)."""
        return batch

    # -- evaluation -------------------------------------------------------------------------------------------------

    def _evaluate(self, tasks: list[Task], prefix: str) -> None:
        self._bind_worlds()
        self.sync_engine()
        self.evaluator.evaluate(self, tasks, prefix, self.act_engine, self.rehearse_engine, self.tokenizer)
        self._engine_rests()
        self.last_episodes = self.evaluator.last_episodes
