"""Helpers for running on several processes: FSDP2 sharding of the policy, and agreeing on step counts.

Sharded (FSDP) and replicated (DDP) models need every rank to make the same number of forward, backward and
``generate`` calls; ranks whose rollouts produced fewer rows agree on the largest count and pad with zero-weight
passes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def fully_shard_layers(model: nn.Module, mesh: Any) -> None:
    """FSDP2 (``ModelParallelStrategy``): each decoder layer becomes its own unit, then the root (embeddings, head)."""
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def peer_max(count: int, device: torch.device) -> int:
    """The largest ``count`` over all ranks of the default process group."""
    value = torch.tensor([count], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return int(value.item())
