"""The EnvACE LightningModule: the policy, its rollout sampler, and the role-wise GRPO update.

The module owns the model, the act/rehearse loss heads, the world-model alignment term and every optimiser step
(manual optimisation). Rollouts are sampled by ``sample_rollouts`` (the narrow interface the DataModule's stream
calls, so the batch a step trains on is always sampled from the current weights); rollout, reward, advantage and
loss code live in their own small modules, and so do the optimise loop (``envace.training.optimise.GRPOUpdate``, the
base class), a step's metrics and real-call totals (``step_metrics``), the checks before training (``fit_checks``)
and the rollout engine's weight sync (``engine_sync``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from peft import PeftModel
from torch import Tensor

from envace.evaluation.evaluator import PolicyEvaluator, policy_engine
from envace.evaluation.metrics import failure_causes
from envace.losses.aggregation import TokenAggregator, TokenMean
from envace.losses.policy import ClippedPolicyLoss
from envace.policy.chat import check_chat_template
from envace.policy.hf import Policy
from envace.rewards.base import Reward
from envace.rewards.checklist import mask_groups_with_failed_judging
from envace.rewards.scoring import score_episodes
from envace.rewards.shaping import PredictionErrorShaping
from envace.rewards.task_success import TaskSuccess
from envace.rollout.collate import RolloutBatch, collate
from envace.rollout.config import RolloutConfig
from envace.rollout.private_rehearsal import PrivateRehearsal, Selector
from envace.rollout.runner import EpisodeRunner
from envace.runtime.checkpoint import rng_state, set_rng_state
from envace.runtime.distributed import fully_shard_layers
from envace.training.advantages import group_advantages, role_group_ids
from envace.training.engine_sync import EngineSync
from envace.training.fit_checks import check_fidelity_gate, rl_workload
from envace.training.optimise import GRPOUpdate
from envace.training.step_metrics import (
    LiveFidelityLog,
    RealCallTotals,
    log_reward_metrics,
    log_server_counts,
    step_metrics,
)
from envace.training.update import GRPOConfig
from envace.types import Episode, Role, Sample, Task
from envace.world_model.alignment import AlignmentRows, DemonstrationRows, RowCap
from envace.world_model.audit import WorldAudit
from envace.world_model.guard import CollusionGuard
from envace.world_model.quality import WorldQuality
from envace.worlds.base import World
from envace.worlds.rehearse import RehearseWorld, alignment_prompter
from envace.worlds.users import ModelUser

log = logging.getLogger(__name__)


class EnvACEModule(GRPOUpdate):
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
        export_best: export the weights of the best validation of this logged metric instead of the last ones (written
            to a file in the run's root directory when the best improves: ``envace.training.best``).
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
        self.real_call_totals = RealCallTotals()  # the run's real_calls_total and real_calls_saved_total
        self._live_fidelity = LiveFidelityLog()  # logged every log_every_n_steps training steps
        self._pending_rng: dict[str, Any] | None = None  # random states of a restored checkpoint, for the next rollout
        self._nonfinite_streak = 0  # consecutive optimiser steps skipped for a non-finite loss or gradient
        self._nonfinite_skips = 0  # optimiser steps skipped so far in this training step
        self._failed_streak = 0  # consecutive training steps whose every episode failed
        self._vllm_engine: Any = None  # the rollout engine, with rollout.engine: vllm (started on first use)
        self._engine_sync = EngineSync()  # which weights that engine holds
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
        cap = RowCap(self.rollout.max_context_tokens)  # the context the rollout ends an episode at
        self.alignment = AlignmentRows(self.tokenizer, self.prompter, self.grpo.align_max_per_task, cap)
        self.demonstrations = DemonstrationRows(self.tokenizer, teacher_forced=True, cap=cap)
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
        self.return_freed_memory("rollout")  # the engine's freed keys and values, where the update will not reuse them
        elapsed = time.perf_counter() - start
        generated = self._generated_tokens() - generated_before
        batch.metrics = {"rollout_time_s": elapsed, "generated_tokens": float(generated), **quality,
                         "judge_masked_episodes": float(judge_masked)}
        if synced is not None:
            batch.metrics["engine_sync_s"] = synced
        log_reward_metrics(self, self.rewards)
        log_server_counts(self)
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
        return self._engine_sync.sync(self._vllm_engine, self.model, self.role_adapters, int(self.global_step))

    def _engine_rests(self) -> None:
        """With ``rollout.vllm.sleep``, the vLLM engine gives its GPU memory back until the next rollout."""
        EngineSync.rest(self._vllm_engine, self.rollout.vllm.sleep)

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
        metrics = step_metrics(step_stats, batch, self._nonfinite_skips, start, self.grpo.ppo_epochs)
        metrics.update(self.real_call_totals.count(batch.episodes, metrics, self.trainer, self.device))
        self.last_episodes = batch.episodes
        # Averaged over ranks (counts such as real_calls are per-rank means); every rank logs the same keys.
        self.log_dict({f"train/{k}": float(v) for k, v in metrics.items()}, batch_size=len(batch.episodes),
                      sync_dist=self.trainer.world_size > 1)
        self._live_fidelity.step(self, self.quality)

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

    def rehearse_budget(self) -> int | None:
        """The rehearse role's generation budget (``rollout.rehearse_max_new_tokens``)."""
        return self.rollout.rehearse_max_new_tokens

    def on_fit_start(self) -> None:
        """Declare the live fidelity metric of every training tool, then check the fidelity gate."""
        super().on_fit_start()
        datamodule = self.trainer.datamodule
        train = getattr(datamodule, "tasks", {}).get("train") or []
        self.check_memory(rl_workload(self.grpo, self.rollout, datamodule))
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
        check_fidelity_gate(self.fidelity_gate, tasks, self.prompter, self.rehearse_engine,
                            self.rollout.rehearse_max_new_tokens, self.trainer.strategy, self.device)

    @property
    def real_calls_total(self) -> int:
        """Real tool calls spent by training rollouts (and audits), over the whole run (resumes included)."""
        return self.real_call_totals.total

    @property
    def real_calls_saved_total(self) -> int:
        """Calls answered without a real execution, over the whole run."""
        return self.real_call_totals.saved_total

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the run's real-call counts, the collusion guard's window and the world's grounding across resumes."""
        super().on_save_checkpoint(checkpoint)
        checkpoint.update(self.real_call_totals.state_dict())
        checkpoint["envace_world_quality"] = self.quality.state_dict_extra()
        checkpoint["envace_rng"] = self._rng_states()  # one per rank: each rank samples its own stream

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore what ``on_save_checkpoint`` kept."""
        super().on_load_checkpoint(checkpoint)
        self.real_call_totals.load_state_dict(checkpoint)
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

    def _budget_spent(self) -> bool:
        """``trainer.max_steps`` counts optimiser steps; stop mid-rollout rather than overshoot it."""
        max_steps = self.trainer.max_steps
        return max_steps is not None and 0 <= max_steps <= self.global_step

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
