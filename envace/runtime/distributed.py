"""Helpers for running on several processes: sharding the policy (FSDP2, FSDP), and agreeing on step counts.

Sharded (FSDP) and replicated (DDP) models need every rank to make the same number of forward, backward and
``generate`` calls; ranks whose rollouts produced fewer rows agree on the largest count and pad with zero-weight
passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
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


def peer_any(flags: torch.Tensor) -> torch.Tensor:
    """``flags`` (0/1 floats) set wherever any rank of the default process group set them (in place, one collective)."""
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return flags


def full_params_context(strategy: Any) -> Callable[[], AbstractContextManager[object]] | None:
    """For Lightning's ``FSDPStrategy`` (``strategy: fsdp``): a context that gathers the full weights to generate.

    Lightning wraps the LightningModule in one FSDP unit. Inside a training or validation step the unit's forward
    has gathered its weights, so generation there needs nothing; rollouts are sampled by the data stream, outside
    any step, so they run under ``summon_full_params`` (no write-back: generation never changes a weight). Nested
    FSDP units (an ``auto_wrap_policy``) would re-shard each layer after its own forward, under the summoned weights;
    they are refused with a clear error. ``None`` for any other strategy (FSDP2 shards per layer and gathers in each
    forward, so its generation needs no context).
    """
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(strategy, FSDPStrategy):
        return None

    def gathered() -> AbstractContextManager[object]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp._common_utils import TrainingState

        root = strategy.model
        if not isinstance(root, FSDP) or root.training_state != TrainingState.IDLE:
            return nullcontext()  # not wrapped yet, or inside the unit's forward: the weights are gathered
        nested = [name for name, m in root.named_modules() if isinstance(m, FSDP) and m is not root]
        if nested:
            raise ValueError(
                f"strategy: fsdp with nested FSDP units ({nested[0]}, ... {len(nested)} in all; an auto_wrap_policy) "
                "cannot generate rollouts outside a training step; drop the auto_wrap_policy, or shard per layer "
                "with FSDP2: strategy: lightning.pytorch.strategies.ModelParallelStrategy (lit_configs/qwen7b.yaml)")
        return FSDP.summon_full_params(root, writeback=False, recurse=True)

    return gathered


def chain_contexts(*factories: Callable[[], AbstractContextManager[object]] | None
                   ) -> Callable[[], AbstractContextManager[object]] | None:
    """One context-manager factory entering each given factory's context in order (``None`` when none is given)."""
    given = [f for f in factories if f is not None]
    if not given:
        return None

    @contextmanager
    def chained() -> Iterator[None]:
        with ExitStack() as stack:
            for factory in given:
                stack.enter_context(factory())
            yield

    return chained
