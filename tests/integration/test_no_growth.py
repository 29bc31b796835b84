"""A long run holds no more state at its end than early on: nothing per step accumulates (issue: bounded memory).

Resident memory itself is measured by ``benchmarks/memory.py`` (growth over 100 SmolLM2 steps); here the state a leak
would be made of is counted exactly, after a garbage collection at the end of every training step: the live Python
container objects (a list that keeps every episode, log line or cached prompt grows by hundreds of them a step) and
the bytes of every live tensor (a kept batch, host copies of weights, an unbounded cache of keys and values).
"""

from __future__ import annotations

import gc
from typing import Any

import lightning as L
import pytest
import torch

from envace.cli.lightning import EnvaceCLI, cli_main

STEPS = 12


class StateCounter(L.Callback):
    """After every training step: live container objects and live tensor bytes (each storage once)."""

    def __init__(self) -> None:
        self.objects: list[int] = []
        self.tensor_bytes: list[int] = []

    def on_train_batch_end(self, *_: Any) -> None:
        gc.collect()
        live = gc.get_objects()
        storages = {}
        for obj in live:
            if isinstance(obj, torch.Tensor) and not obj.is_meta:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        self.objects.append(len(live))
        self.tensor_bytes.append(sum(storages.values()))


@pytest.mark.parametrize("stage", ["rl", "sft", "sft-validating"])
def test_state_does_not_grow_over_a_run(tiny_dir, tmp_path, monkeypatch, stage) -> None:
    import envace.world_model.alignment

    # the row caches are bounded (least recently used dropped) at 1024 tasks; bounded at 2 here, they are full after
    # the first step, so any later growth is a leak
    monkeypatch.setattr(envace.world_model.alignment, "ROW_CACHE_TASKS", 2)
    counter = StateCounter()

    class CountingCLI(EnvaceCLI):
        def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[L.Callback]) -> L.Trainer:
            return super()._instantiate_trainer(config, [*callbacks, counter])

    common = [f"--trainer.default_root_dir={tmp_path}", f"--trainer.max_steps={STEPS}", "--trainer.logger=false",
              "--trainer.limit_val_batches=0", "--data.batch_size=2"]
    if stage == "rl":
        args = ["fit", "--config", "lit_configs/tiny_rl.yaml", *common,
                f"--model.policy.init_args.name_or_path={tiny_dir}", "--model.fidelity_gate=null",
                "--model.export_dir=null"]
    elif stage == "sft":
        args = ["fit", "--config", "lit_configs/tiny_sft.yaml", *common, "--model.init_args.export_dir=null",
                "--model.init_args.export_best=null"]
    else:  # validations after steps 4, 8 and 12, and export_best: its best weights go to a file, not to memory
        args = ["fit", "--config", "lit_configs/tiny_sft.yaml", *common, "--trainer.limit_val_batches=1",
                "--trainer.val_check_interval=4", "--data.val_tasks=builtin:bank-val:2", "--data.eval_batch_size=2",
                f"--model.init_args.export_dir={tmp_path}/policy", "--model.init_args.export_best=val/success_act"]
    cli = cli_main(args, cli_class=CountingCLI)
    assert len(counter.objects) == STEPS
    early, late = STEPS // 3, STEPS - 1
    if stage == "sft-validating":  # the first validation builds what a run holds once (the evaluation's objects)
        early = 7  # the same place between validations as the late reading: step 8, after the first one
    # Keeping one small batch a step adds about 20 objects a step, 160 by the end; between the early and the late
    # reading of a run that keeps nothing, the count moved by at most 30 (the objects of the step in flight).
    assert counter.objects[late] - counter.objects[early] <= 60, counter.objects
    # Tensors: the optimiser state exists from the first step; the late reading then differs from the early one by
    # the size of the batch in flight (up to 100 KB on these configs) unless a step's tensors or weights are kept.
    weights = sum(p.numel() * p.element_size() for p in cli.model.model.parameters())
    # a host copy of the weights kept from the first validation on would add their bytes (4.7 MB on tiny_sft): the
    # tensors are compared from step 4, before it
    tensors_from = 3 if stage == "sft-validating" else early
    bound = min(256 * 1024, weights // 2)
    assert counter.tensor_bytes[late] - counter.tensor_bytes[tensors_from] <= bound, (counter.tensor_bytes, weights)
    if stage == "sft-validating":
        assert cli.model.best is not None and cli.model.best.step is not None and (tmp_path / "policy").is_dir()
