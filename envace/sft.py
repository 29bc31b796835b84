"""Supervised warm start: teach both roles from tasks' reference trajectories before RL.

Act rows are the chat-template render of each task's messages plus its reference continuation, trained on the
assistant tokens (the template's ``{% generation %}`` mask). Rehearse rows are the alignment rows: the rehearse
prompt of each recorded call followed by its recorded real response. Plain next-token cross-entropy.

Validation always reports the teacher-forced cross-entropy; with an ``eval_world`` it also runs the policy greedily
on the validation tasks (real success, rehearsal fidelity), so that Lightning's ``EarlyStopping`` can stop the warm
start when its real success plateaus, and ``export_best`` exports the best weights rather than the last.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from envace.alignment import AlignmentRows, DemonstrationRows
from envace.base_module import PolicyModule
from envace.evaluation import PolicyEvaluator, policy_engine
from envace.logprobs import token_logps
from envace.policy.chat import check_chat_template
from envace.policy.hf import Policy
from envace.rewards.base import Reward
from envace.rewards.task_success import TaskSuccess
from envace.rollout.collate import RolloutBatch, collate
from envace.rollout.runner import RolloutConfig
from envace.types import Role, Task
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
        export_best: a logged metric to maximise (e.g. ``"val/success_act"``): keep a host copy of the weights at
            its best validation and export those instead of the last ones. Meant for small models (one extra copy in
            host memory); needs ``export_dir``.
        test_group_by: under ``envace test``, also log success per value of this key of the tasks' ``metadata``
            (``test/success_act/KEY=VALUE``, ``test/tasks/KEY=VALUE``; docs/task-format.md); needs ``eval_world``.
        share_prefix: run each role's rows as one forward whose shared prefix (the system prompt and tool schemas,
            most of a short row) is computed once, when it is at least this many tokens
            (``envace.logprobs.token_logps``); 0 (the default) runs every row in full. Not with gradient
            checkpointing.
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
    ) -> None:
        super().__init__()
        if share_prefix < 0:
            raise ValueError(f"share_prefix must be >= 0, got {share_prefix}")
        self.share_prefix = share_prefix
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
        self.alignment = AlignmentRows(self.tokenizer, self.prompter, self.rehearse_max_per_task)
        self.demonstrations = DemonstrationRows(self.tokenizer)

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

    def training_step(self, batch: RolloutBatch, batch_idx: int) -> Tensor:
        """Token-mean cross-entropy of each role's target tokens, weighted and summed."""
        loss, stats = self._loss(batch)
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=len(batch), prog_bar=True)
        return loss

    def _evaluate(self, tasks: list[Task], prefix: str) -> None:
        if any(t.reference for t in tasks):
            batch = self.sample_rollouts(tasks).to(self.device)
            with torch.no_grad():
                _, stats = self._loss(batch)
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

    def _logps(self, batch: RolloutBatch) -> Tensor:
        """Log-probs of the rows' target tokens: in one forward, or one per role with a shared prefix."""
        assert self.model is not None
        if not self.share_prefix:
            return token_logps(self.model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask)[0]
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)  # [N, T]
        for role in (Role.ACT, Role.REHEARSE):
            rows = torch.nonzero(batch.row_role == int(role), as_tuple=True)[0]
            if rows.numel():
                part = batch.rows(rows)
                logps, _ = token_logps(self.model, part.input_ids, part.attention_mask, positions=part.loss_mask,
                                       share_prefix=self.share_prefix)
                out[rows, : logps.shape[1]] = logps.float()
        return out

    def _loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        assert self.model is not None
        nll = -self._logps(batch) * batch.loss_mask  # [N, T]
        act = (batch.row_role == int(Role.ACT)).float()[:, None]  # [N, 1]
        heads = {"act": (nll * act).sum() / (batch.loss_mask * act).sum().clamp(min=1.0)}
        heads["rehearse"] = (nll * (1 - act)).sum() / (batch.loss_mask * (1 - act)).sum().clamp(min=1.0)
        loss = self.act_weight * heads["act"] + self.rehearse_weight * heads["rehearse"]
        return loss, {"sft_loss": loss.detach(), **{f"sft_loss_{k}": v.detach() for k, v in heads.items()}}
