"""Supervised warm start: teach both roles from tasks' reference trajectories before RL.

Act rows are the chat-template render of each task's messages plus its reference continuation, trained on the
assistant tokens (the template's ``{% generation %}`` mask). Rehearse rows are the alignment rows: the rehearse
prompt of each recorded call followed by its recorded real response. Plain next-token cross-entropy.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from lightning.pytorch.cli import OptimizerCallable
from peft import PeftModel
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from envace.alignment import AlignmentRows
from envace.base_module import PolicyModule
from envace.logprobs import token_logps
from envace.policy.hf import Policy
from envace.rollout.collate import RolloutBatch, collate
from envace.types import Role, Sample, Task
from envace.worlds.rehearse import RehearseWorld


def act_rows(tasks: list[Task], tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
    """One act row per task with a reference: the whole reference dialogue, trained on the assistant tokens."""
    rows = []
    for group, task in enumerate(tasks):
        if not task.reference:
            continue
        enc = tokenizer.apply_chat_template(
            list(task.messages) + list(task.reference),
            tools=list(task.tools),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        mask = list(enc["assistant_masks"])
        if not any(mask):
            raise ValueError("the chat template marks no assistant tokens ({% generation %}); cannot build SFT rows")
        roles = [int(Role.ACT) if m else int(Role.SYSTEM) for m in mask]
        rows.append(Sample(list(enc["input_ids"]), roles, mask, Role.ACT, -1, group))
    return rows


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
        export_dir: at the end of ``fit``, save the model and tokenizer here in Hugging Face format, ready for
            ``HFPolicy(name_or_path=export_dir)`` in the RL stage; None saves nothing.
    """

    def __init__(
        self,
        policy: Policy,
        act_weight: float = 1.0,
        rehearse_weight: float = 1.0,
        rehearse_max_per_task: int = 16,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.policy = policy
        self.act_weight, self.rehearse_weight = act_weight, rehearse_weight
        self.rehearse_max_per_task = rehearse_max_per_task
        self.optimizer_factory = optimizer
        self.export_dir = export_dir
        self.model: nn.Module | None = None
        self.tokenizer: Any = None
        self.alignment: AlignmentRows | None = None

    def configure_model(self) -> None:
        """Build the policy (idempotent)."""
        if self.model is not None:
            return
        self.model, self.tokenizer = self.policy.build()
        self.model.train()
        prompter = RehearseWorld()
        prompter.bind(self.tokenizer, self.model)
        self.alignment = AlignmentRows(self.tokenizer, prompter, self.rehearse_max_per_task)

    def sample_rollouts(self, tasks: list[Task]) -> RolloutBatch:
        """The supervised rows of ``tasks`` (they do not depend on the weights)."""
        assert self.alignment is not None
        rows = act_rows(tasks, self.tokenizer) + self.alignment.rows(tasks)
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

    def validation_step(self, tasks: list[Task], batch_idx: int) -> None:
        """Teacher-forced cross-entropy on the validation tasks' references."""
        if not any(t.reference for t in tasks):
            return
        batch = self.sample_rollouts(tasks).to(self.device)
        _, stats = self._loss(batch)
        self.log_dict({f"val/{k}": v for k, v in stats.items()}, batch_size=len(batch), sync_dist=True)

    def _loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        assert self.model is not None
        logps, _ = token_logps(self.model, batch.input_ids, batch.attention_mask)  # [N, T]
        nll = -logps * batch.loss_mask  # [N, T]
        act = (batch.row_role == int(Role.ACT)).float()[:, None]  # [N, 1]
        heads = {"act": (nll * act).sum() / (batch.loss_mask * act).sum().clamp(min=1.0)}
        heads["rehearse"] = (nll * (1 - act)).sum() / (batch.loss_mask * (1 - act)).sum().clamp(min=1.0)
        loss = self.act_weight * heads["act"] + self.rehearse_weight * heads["rehearse"]
        return loss, {"sft_loss": loss.detach(), **{f"sft_loss_{k}": v.detach() for k, v in heads.items()}}

    def on_train_end(self) -> None:
        """Export the warm start in Hugging Face format (global rank 0 only)."""
        if self.export_dir is None or not self.trainer.is_global_zero:
            return
        assert self.model is not None
        # LoRA: export a merged copy, leaving the trained module as it is.
        model = copy.deepcopy(self.model).merge_and_unload() if isinstance(self.model, PeftModel) else self.model
        model.save_pretrained(self.export_dir)
        self.tokenizer.save_pretrained(self.export_dir)
