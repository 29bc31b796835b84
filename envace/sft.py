"""Supervised warm start: teach both roles from tasks' reference trajectories before RL.

Act rows are the chat-template render of each task's messages plus its reference continuation, trained on the
assistant tokens (the template's ``{% generation %}`` mask). Rehearse rows are the alignment rows: the rehearse
prompt of each recorded call followed by its recorded real response. Plain next-token cross-entropy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.alignment import AlignmentRows
from envace.logprobs import token_logps
from envace.rollout.collate import collate
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


@dataclass
class WarmStartReport:
    """What a warm start did: optimiser steps and the mean loss of the first and last 10 steps."""

    steps: int
    first_loss: float
    last_loss: float


def warm_start(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    *,
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> WarmStartReport:
    """Train ``model`` in place on the act and rehearse rows of ``tasks`` (CPU-friendly; tiny models and tests).

    Args:
        model: the causal LM.
        tokenizer: its tokenizer (chat template with generation marks).
        tasks: tasks with reference trajectories.
        steps: optimiser steps.
        lr: AdamW learning rate.
        batch_size: rows per step.
        seed: row sampling seed.
    """
    prompter = RehearseWorld()
    prompter.bind(tokenizer, model)
    rows = act_rows(tasks, tokenizer) + AlignmentRows(tokenizer, prompter, max_per_task=16).rows(tasks)
    if not rows:
        raise ValueError("no task has a reference trajectory to warm-start from")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    device = next(model.parameters()).device
    model.train()
    losses = []
    for _ in range(steps):
        picked = rng.sample(rows, min(batch_size, len(rows)))
        batch = collate(picked, [1.0] * len(picked), tokenizer.pad_token_id).to(device)
        logps, _ = token_logps(model, batch.input_ids, batch.attention_mask)
        loss = -(logps * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return WarmStartReport(steps, sum(losses[:10]) / len(losses[:10]), sum(losses[-10:]) / len(losses[-10:]))
