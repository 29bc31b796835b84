"""One rank of the ``strategy: fsdp`` generation test: ``python fsdp1_worker.py RANK PORT``; prints a JSON line.

The policy is wrapped in one FSDP unit, as Lightning's ``FSDPStrategy`` wraps the LightningModule, and sharded over
two gloo ranks. Greedy rollouts generated through ``full_params_context`` (outside the unit's forward) and inside
the unit's forward must equal an unsharded copy's; nested units must be refused.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from envace.engines.base import SamplingParams
from envace.engines.kv_engine import CachedEngine
from envace.policy import TinyPolicy
from envace.runtime.distributed import full_params_context


class Unit(nn.Module):
    """Stands for the LightningModule: its forward generates, as a validation step does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.engine: CachedEngine | None = None

    def forward(self, prompts: list[list[int]]) -> list[list[int]]:
        assert self.engine is not None
        return [g.token_ids for g in self.engine.generate(prompts, PARAMS)]


PARAMS = SamplingParams(max_new_tokens=6, temperature=0.0)


def main(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model, tok = TinyPolicy().build()
    with torch.no_grad():
        for p in model.parameters():  # varied greedy tokens (the default init repeats one)
            p.mul_(8.0)
    reference = copy.deepcopy(model)
    prompts = [[5 + rank, 6, 7, 8] * 5] * (3 if rank == 0 else 1)  # unequal work: the ranks must stay in lockstep
    expected = [g.token_ids for g in CachedEngine(reference, tok.pad_token_id, [tok.eos_token_id]).generate(
        prompts, PARAMS)]
    unit = Unit(model)
    strategy = FSDPStrategy()
    strategy.model = FSDP(unit, use_orig_params=True, device_id=torch.device("cpu"))
    local = sum(p.numel() for p in model.parameters())
    unit.engine = CachedEngine(model, tok.pad_token_id, [tok.eos_token_id], synced_gpus=True,
                               adapter_context=full_params_context(strategy))
    outside = [g.token_ids for g in unit.engine.generate(prompts, PARAMS)]  # a rollout from the data stream
    inside = strategy.model(prompts)  # generation inside the unit's forward (a validation step)
    nested = copy.deepcopy(reference)
    nested_strategy = FSDPStrategy()
    nested_strategy.model = FSDP(Unit(nested), use_orig_params=True, device_id=torch.device("cpu"),
                                 auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
    try:
        full_params_context(nested_strategy)()  # type: ignore[misc]
        refused = ""
    except ValueError as err:
        refused = str(err)
    dist.barrier()
    total = sum(p.numel() for p in reference.parameters())
    result = {"sharded": local < total, "outside": outside == expected, "inside": inside == expected,
              "refused": refused}
    sys.stdout.write(json.dumps(result) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
