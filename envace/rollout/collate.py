"""Collation: training rows (``Sample``) into a right-padded ``RolloutBatch`` of tensors."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from envace.types import Episode, Role, Sample


@dataclass
class RolloutBatch:
    """The training batch of one rollout step. Dims: N rows, T tokens.

    Attributes:
        input_ids: token ids, right-padded.  # [N, T]
        attention_mask: 1 on real tokens.  # [N, T]
        loss_mask: 1 on the tokens each row trains.  # [N, T]
        row_role: the head of each row (``Role.ACT`` or ``Role.REHEARSE``).  # [N]
        is_align: teacher-forced alignment rows.  # [N]
        rewards: row rewards.  # [N]
        advantages: row advantages (0 for alignment rows).  # [N]
        temperatures: the sampling temperature each row was generated with (1 for alignment rows).  # [N]
        group_ids: GRPO group (task index) of each row.  # [N]
        episode_ids: episode index of each row (-1 for alignment rows).  # [N]
        old_logps: behaviour-policy log-probs, when the update needs them.  # [N, T]
        ref_logps: reference-policy log-probs, when a KL term is on.  # [N, T]
        engine_logps: the rollout engine's log-prob of each generated token (NaN elsewhere), when any row's engine
            reported them (vLLM).  # [N, T]
        episodes: the episodes behind the rows (for metrics and sample logs).
        metrics: rollout-side measurements (timings, token counts).
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    row_role: Tensor
    is_align: Tensor
    rewards: Tensor
    advantages: Tensor
    temperatures: Tensor
    group_ids: Tensor
    episode_ids: Tensor
    old_logps: Tensor | None = None
    ref_logps: Tensor | None = None
    engine_logps: Tensor | None = None
    episodes: list[Episode] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: Tensor) -> RolloutBatch:
        """The sub-batch of rows ``index`` (integer indices or a boolean row mask), trimmed to its longest row."""
        lengths = self.attention_mask[index].sum(-1)  # [n]
        width = int(lengths.max().item()) if lengths.numel() else 0
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value[index]
                value = value[:, :width] if value.dim() == 2 else value
            out[f.name] = value
        return replace(self, **out)

    def to(self, device: torch.device) -> RolloutBatch:
        """The batch on ``device``."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device) for k, v in tensors.items() if isinstance(v, Tensor)})


def collate(samples: list[Sample], temperatures: list[float], pad_id: int) -> RolloutBatch:
    """Right-pad ``samples`` into a batch, each row cut after its last trained token. Advantages start at 0.

    Args:
        samples: the rows.
        temperatures: one per row.
        pad_id: padding token id.

    Raises:
        ValueError: no rows, a temperature count that differs from the row count, or a row whose loss mask length
            differs from its token count.
    """
    if not samples or len(temperatures) != len(samples):
        raise ValueError(
            f"collate needs at least one row and one temperature per row, got {len(samples)} rows and "
            f"{len(temperatures)} temperatures"
        )
    for i, s in enumerate(samples):
        if len(s.loss_mask) != len(s):
            raise ValueError(f"row {i}: loss_mask has {len(s.loss_mask)} entries for {len(s)} tokens")
    lengths = [trained_length(s) for s in samples]
    n, width = len(samples), max(lengths)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)  # [N, T]
    attention_mask = torch.zeros((n, width), dtype=torch.long)  # [N, T]
    loss_mask = torch.zeros((n, width), dtype=torch.float32)  # [N, T]
    engine_logps = None
    if any(s.engine_logps is not None for s in samples):
        engine_logps = torch.full((n, width), float("nan"), dtype=torch.float32)  # [N, T]
    for i, (s, length) in enumerate(zip(samples, lengths)):
        input_ids[i, :length] = torch.tensor(s.token_ids[:length], dtype=torch.long)
        attention_mask[i, :length] = 1
        loss_mask[i, :length] = torch.tensor(s.loss_mask[:length], dtype=torch.float32)
        if engine_logps is not None and s.engine_logps is not None:
            if len(s.engine_logps) != len(s):
                raise ValueError(f"row {i}: engine_logps has {len(s.engine_logps)} entries for {len(s)} tokens")
            engine_logps[i, :length] = torch.tensor(s.engine_logps[:length], dtype=torch.float32)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        row_role=torch.tensor([int(s.role) for s in samples], dtype=torch.long),
        is_align=torch.tensor([s.align for s in samples], dtype=torch.bool),
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        advantages=torch.zeros(n, dtype=torch.float32),
        temperatures=torch.tensor(temperatures, dtype=torch.float32),
        group_ids=torch.tensor([s.group_index for s in samples], dtype=torch.long),
        episode_ids=torch.tensor([s.episode_index for s in samples], dtype=torch.long),
        engine_logps=engine_logps,
    )


def trained_length(sample: Sample) -> int:
    """The row's length up to its last trained token: later tokens cannot change a trained token's log-prob.

    An episode that ends on a budget after a tool response (or a turn-limit feedback message) carries that untrained
    tail; the update's forward and backward would otherwise run over it, and pad the whole micro-batch to it. A row
    with no trained token keeps its full length.
    """
    for i in range(len(sample.loss_mask) - 1, -1, -1):
        if sample.loss_mask[i]:
            return i + 1
    return len(sample)


def role_rows(batch: RolloutBatch, role: Role) -> Tensor:
    """Boolean mask (``[N]``) of the policy-gradient rows of ``role``, alignment rows excluded."""
    return (batch.row_role == int(role)) & ~batch.is_align
