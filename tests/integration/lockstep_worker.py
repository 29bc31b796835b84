"""One rank of the engine lockstep test: ``python lockstep_worker.py RANK PORT [hf|cached]``; prints lengths."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from envace.engines.base import HFEngine, SamplingParams
from envace.engines.kv_engine import CachedEngine
from envace.policy import TinyPolicy


def main(rank: int, port: int, kind: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model, tok = TinyPolicy().build()
    kinds = {"hf": HFEngine, "cached": CachedEngine}
    engine = kinds[kind](model, tok.pad_token_id, [tok.eos_token_id], max_batch_size=3, synced_gpus=True)
    forwards = [0]
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    prompts = [[5, 6, 7]] * (7 if rank == 0 else 1)  # rank 0: 3 generate calls, rank 1: 1 call
    out = engine.generate(prompts, SamplingParams(max_new_tokens=4 + 3 * rank, temperature=1.0))
    dist.barrier()
    sys.stdout.write(json.dumps({"lengths": [len(g.token_ids) for g in out], "forwards": forwards[0]}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "hf")
