"""Supervised warm start: teach both roles from tasks' reference trajectories before RL.

Act rows are the chat-template render of each task's messages plus its reference continuation, trained on the
assistant tokens (the template's ``{% generation %}`` mask). Rehearse rows are the alignment rows: the rehearse
prompt of each recorded call followed by its recorded real response. Plain next-token cross-entropy.

A row longer than ``rollout.max_context_tokens``, where the rollout ends an episode, is cut there
(``envace.world_model.alignment.RowCap``; a warning names the key), so one row is never more than the context the
policy acts in. Rows are packed into micro-batches under a budget of computed tokens (``micro_batch_tokens``,
``envace.training.update``); each micro-batch's forward and backward run in turn, gradients accumulate, and the
optimiser steps once per training step. Each head's token mean is normalised by the whole step's token count, so the
loss and gradients do not depend on the budget (beyond float rounding), while peak memory does not grow with the batch
size or the rows per task.

Validation always reports the teacher-forced cross-entropy; with an ``eval_world`` it also runs the policy greedily
on the validation tasks (real success, rehearsal fidelity), so that Lightning's ``EarlyStopping`` can stop the warm
start when its real success plateaus, and ``export_best`` exports the best weights rather than the last.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from envace.evaluation.evaluator import PolicyEvaluator, policy_engine
from envace.policy.chat import check_chat_template
from envace.policy.hf import Policy
from envace.policy.logprobs import PrefixCarry, token_logps
from envace.rewards.base import Reward
from envace.rewards.task_success import TaskSuccess
from envace.rollout.collate import RolloutBatch, collate
from envace.rollout.config import RolloutConfig
from envace.training.base import PolicyModule
from envace.training.memory import Workload
from envace.training.update import DEFAULT_MICRO_BATCH_TOKENS, Groups, MicroBatch, computed_tokens, micro_batches
from envace.types import Role, Task
from envace.world_model.alignment import AlignmentRows, DemonstrationRows, RowCap
from envace.worlds.base import World
from envace.worlds.rehearse import RehearseWorld


class SFTModule(PolicyModule):
    """Supervised warm start of both roles from the tasks' reference trajectories (teacher forcing).

    Act rows are the reference dialogues trained on the assistant tokens; rehearse rows are the rehearse-role prompt
    of each recorded call followed by its recorded real response (the alignment rows). The loss is
    ``act_weight * NLL_act + rehearse_weight * NLL_rehearse``, each a token mean. The rows come through
    ``RolloutDataModule`` like rollouts do (this module is its sampler), so the same data config serves both stages.

    Args:
        policy: builds the model and tokenizer.
        act_weight: weight of the act-role cross-entropy.
        rehearse_weight: weight of the rehearse-role cross-entropy.
        rehearse_max_per_task: most rehearse rows per task (the first recorded calls).
        optimizer: optimiser over the trainable parameters.
        lr_scheduler: learning-rate schedule, stepped after every optimiser step (e.g. a linear warm-up); None keeps
            the rate constant.
        export_dir: at the end of ``fit``, save the model and tokenizer here in Hugging Face format, ready for
            ``HFPolicy(name_or_path=export_dir)`` in the RL stage; None saves nothing. ``{root}`` stands for
            ``trainer.default_root_dir``.
        rehearse_world: the rehearse prompt format of the rehearse rows (system prompt, tools shown); use the RL
            stage's world settings. Default: ``RehearseWorld()``.
        eval_world: in ``validate``/``test`` and during ``fit``'s validation, also run the policy greedily in this
            world (``RealWorld`` for real success) and log the rollout metrics and the rehearsal fidelity next to the
            teacher-forced loss; None logs the loss only.
        rollout: budgets of those evaluation episodes (sampling is greedy).
        rewards: scores them. Default: ``[TaskSuccess()]``.
        eval_imagined: also log ``imagined_success`` (the policy rehearsing the tool responses).
        export_best: a logged metric to maximise (e.g. ``"val/success_act"``): write the weights of its best
            validation to a file in the run's root directory (``envace.training.best``; kept across resumes, not in
            memory) and export those instead of the last ones; needs ``export_dir``.
        test_group_by: under ``envace test``, also log success per value of this key of the tasks' ``metadata``
            (``test/success_act/KEY=VALUE``, ``test/tasks/KEY=VALUE``; docs/task-format.md); needs ``eval_world``.
        share_prefix: compute a prefix that rows of one role share (the system prompt and tool schemas, most of a
            short row) once per step, when it is at least this many tokens (``envace.training.update.micro_batches``,
            ``envace.policy.logprobs.token_logps``); 0 (the default) runs every row in full.
        micro_batch_tokens: most computed tokens (rows x the longest row; with ``share_prefix`` their shared prefix
            once) per forward/backward; a step's rows are packed into micro-batches under it and their gradients
            accumulated, so peak activation memory is set by this key, not by ``data.batch_size`` or the rows per
            task. 0: one micro-batch per step (every row at once, as large as the batch makes it).
        micro_batch_size: most rows per micro-batch.
        memory_limit_gb: before the first step, the run's estimated peak memory (``envace.training.memory``) must fit in
            this many GiB, or it stops with one line naming the key to lower; None: the memory this machine (or GPU)
            has; 0: no check.
        grad_clip: clip the gradient norm of each optimiser step to this (0: no clipping; ``trainer.gradient_clip_val``
            does not apply, the module steps its optimiser itself).
    """

    def __init__(
        self,
        policy: Policy,
        act_weight: float = 1.0,
        rehearse_weight: float = 1.0,
        rehearse_max_per_task: int = 16,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        export_dir: str | None = None,
        rehearse_world: RehearseWorld | None = None,
        eval_world: World | None = None,
        rollout: RolloutConfig = RolloutConfig(),  # noqa: B008 (frozen use: never mutated)
        rewards: list[Reward] | None = None,
        eval_imagined: bool = False,
        export_best: str | None = None,
        test_group_by: str | None = None,
        share_prefix: int = 0,
        micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS,
        micro_batch_size: int = 64,
        grad_clip: float = 0.0,
        memory_limit_gb: float | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("share_prefix", share_prefix), ("micro_batch_tokens", micro_batch_tokens),
                            ("grad_clip", grad_clip), ("memory_limit_gb", memory_limit_gb or 0)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
        self.share_prefix = share_prefix
        self.micro_batch_tokens, self.micro_batch_size, self.grad_clip = micro_batch_tokens, micro_batch_size, grad_clip
        self.memory_limit_gb = memory_limit_gb
        self.automatic_optimization = False  # one optimiser step per training step, over several micro-batches
        if test_group_by is not None and eval_world is None:
            raise ValueError("test_group_by needs eval_world (success is measured by running the policy in it)")
        self.save_hyperparameters()
        self.configure_export(export_dir, export_best)
        self.policy = policy
        self.act_weight, self.rehearse_weight = act_weight, rehearse_weight
        self.rehearse_max_per_task = rehearse_max_per_task
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.prompter = rehearse_world if rehearse_world is not None else RehearseWorld()
        self.eval_world = eval_world
        self.rollout = rollout
        self.evaluator = (
            PolicyEvaluator(eval_world, self.prompter, rewards or [TaskSuccess()], rollout, imagined=eval_imagined,
                            group_by=test_group_by)
            if eval_world is not None
            else None
        )
        self.model: nn.Module | None = None
        self.tokenizer: Any = None
        self.alignment: AlignmentRows | None = None
        self.demonstrations: DemonstrationRows | None = None
        self._engine: Any = None

    def configure_model(self) -> None:
        """Build the policy (idempotent)."""
        if self.model is not None:
            return
        self.check_policy_format()
        self.model, self.tokenizer = self.policy.build()
        check_chat_template(self.tokenizer)
        self.model.train()
        self.prompter.bind(self.tokenizer, self.model)
        cap = RowCap(self.rollout.max_context_tokens)  # the context the rollout ends an episode at
        self.alignment = AlignmentRows(self.tokenizer, self.prompter, self.rehearse_max_per_task, cap)
        self.demonstrations = DemonstrationRows(self.tokenizer, cap=cap)

    def on_fit_start(self) -> None:
        """The base checks, then the memory check on the first step's rows (``memory_limit_gb``)."""
        super().on_fit_start()
        self.check_memory(self._workload())

    def _workload(self) -> Workload:
        """The token sizes of this run's peak, from the rows of the first training batch's tasks.

        A micro-batch's tokens are those it computes (``envace.training.update.computed_tokens``: a shared prefix once,
        the suffixes padded), taken as the whole budget where it fills less (a later step's may fill it); a row longer
        than the budget gets a micro-batch of its own. Without a budget, a step is one micro-batch of every row.
        Validation generates ``data.eval_batch_size`` rows at once.
        """
        datamodule = self.trainer.datamodule
        tasks = [t for t in (getattr(datamodule, "tasks", {}).get("train") or []) if t.reference]
        batch = self.sample_rollouts(tasks[: max(1, getattr(datamodule, "batch_size", 1))]) if tasks else None
        tokens = scored = 0
        if batch is not None:
            lengths = batch.attention_mask.sum(-1).tolist()
            for micro in self._micro_batches(batch):
                computed = computed_tokens(micro, lengths)
                fraction = float(batch.loss_mask[micro.rows].sum()) / max(computed, 1)
                size = max(computed, self.micro_batch_tokens) if self.micro_batch_tokens else computed
                tokens, scored = max(tokens, size), max(scored, int(size * fraction))
        rows = min(getattr(datamodule, "eval_batch_size", 0), self.rollout.generate_batch_size)
        return Workload(tokens, scored, rows if self.evaluator is not None else 0, self.rollout.max_context_tokens,
                        self.rollout.cache_tokens if self.rollout.engine == "cached" else 0,
                        budget_key="model.init_args.micro_batch_tokens", generation_key="data.eval_batch_size")

    def rehearse_budget(self) -> int | None:
        """The evaluation episodes' rehearse budget (``rollout.rehearse_max_new_tokens``); None without eval_world."""
        return self.rollout.rehearse_max_new_tokens if self.evaluator is not None else None

    def sample_rollouts(self, tasks: list[Task]) -> RolloutBatch:
        """The supervised rows of ``tasks`` (they do not depend on the weights)."""
        assert self.alignment is not None and self.demonstrations is not None
        rows = self.demonstrations.rows(tasks) + self.alignment.rows(tasks)
        if not rows:
            raise ValueError("no task in this batch has a reference trajectory to learn from")
        return collate(rows, [1.0] * len(rows), self.tokenizer.pad_token_id)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move rollout batches; evaluation task lists stay on the host."""
        return batch.to(device) if isinstance(batch, RolloutBatch) else batch

    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        """Token-mean cross-entropy of each role's target tokens, weighted and summed; one optimiser step.

        The rows run in micro-batches (``micro_batch_tokens``), each backward adding its share of the step's loss.
        """
        _, stats = self._loss(batch, backward=True)
        self.step_optimizer(self.optimizers(), self.grad_clip)
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=len(batch), prog_bar=True)

    def _evaluate(self, tasks: list[Task], prefix: str) -> None:
        if any(t.reference for t in tasks):
            batch = self.sample_rollouts(tasks).to(self.device)
            with torch.no_grad():
                _, stats = self._loss(batch)  # in micro-batches: memory as in training, without the gradients
            self.log_dict({f"{prefix}/{k}": v for k, v in stats.items()}, batch_size=len(batch), sync_dist=True)
        if self.evaluator is not None:
            assert self.eval_world is not None
            if self._engine is None:
                self.eval_world.bind(self.tokenizer, self.model)
                self._engine = policy_engine(self, self.model, self.tokenizer, self.rollout)
            was_training = self.model.training
            self.model.eval()
            self.evaluator.evaluate(self, tasks, prefix, self._engine, self._engine, self.tokenizer)
            self.model.train(was_training)

    def _micro_batches(self, batch: RolloutBatch) -> list[MicroBatch]:
        """The step's rows in micro-batches under ``micro_batch_tokens`` (one role each with ``share_prefix``)."""
        rows = torch.arange(len(batch), device=batch.input_ids.device)
        return list(micro_batches(batch, rows, self.micro_batch_size, self.micro_batch_tokens,
                                  share_prefix=self.share_prefix))

    def _loss(self, batch: RolloutBatch, backward: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """The step's loss ``act_weight * NLL_act + rehearse_weight * NLL_rehearse`` and its heads, in micro-batches.

        Each head is a token mean over the whole batch: a micro-batch adds its rows' NLL sum divided by the batch's
        token count of that head, so the sum over micro-batches is the single-batch value (bit for bit with one
        micro-batch) and so are the accumulated gradients, up to float rounding. With ``backward`` each micro-batch's
        share is back-propagated at once (its activations are freed before the next one runs); the returned loss is
        then detached.
        """
        assert self.model is not None
        act_rows = batch.row_role == int(Role.ACT)  # [N]
        counts = {"act": (batch.loss_mask * act_rows[:, None]).sum().clamp(min=1.0),
                  "rehearse": (batch.loss_mask * ~act_rows[:, None]).sum().clamp(min=1.0)}
        heads: dict[str, Tensor] = {}
        plan = self._micro_batches(batch)
        carry = self.prefix_carry(batch, plan)
        lengths = batch.attention_mask.sum(-1).tolist()
        for planned in plan:
            idx, groups = planned
            micro = batch.rows(idx)
            if backward:
                self.before_micro_batch(micro.input_ids.shape[1])
            with self.over_budget(planned, lengths, self.micro_batch_tokens if backward else 0):
                nll = -self._logps(micro, groups, carry) * micro.loss_mask  # [n, t]
            act = (micro.row_role == int(Role.ACT)).float()[:, None]  # [n, 1]
            part = {"act": (nll * act).sum() / counts["act"], "rehearse": (nll * (1 - act)).sum() / counts["rehearse"]}
            if backward:
                self.manual_backward(self.with_carry(
                    self.act_weight * part["act"] + self.rehearse_weight * part["rehearse"], carry))
                part = {k: v.detach() for k, v in part.items()}
                self.return_freed_memory("micro_batch")
            heads = {k: heads[k] + v if k in heads else v for k, v in part.items()}
        if carry is not None:
            carry.check_done()
        loss = self.act_weight * heads["act"] + self.rehearse_weight * heads["rehearse"]
        return loss, {"sft_loss": loss.detach(), **{f"sft_loss_{k}": v.detach() for k, v in heads.items()}}

    def _logps(self, micro: RolloutBatch, groups: Groups | None = None, carry: PrefixCarry | None = None) -> Tensor:
        """Log-probs of a micro-batch's target tokens, on its planned prefix groups (``micro_batches``)."""
        assert self.model is not None
        return token_logps(self.model, micro.input_ids, micro.attention_mask, positions=micro.loss_mask,
                           share_prefix=self.share_prefix, groups=groups, carry=carry)[0].float()
