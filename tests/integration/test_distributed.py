"""Two processes on CPU (gloo): FSDP2 through Lightning's ModelParallelStrategy shards the policy, every rank
samples its own share of tasks, and the ranks stay in lockstep through rollouts, updates and validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_fsdp2_two_processes_on_cpu(tmp_path: Path) -> None:
    envace = Path(sys.executable).parent / "envace"
    cmd = [
        str(envace), "fit", "--config", str(ROOT / "lit_configs" / "tiny.yaml"),
        "--trainer.devices=2", "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
        "--trainer.strategy.data_parallel_size=2", "--trainer.strategy.tensor_parallel_size=1",
        "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--model.rollout.generate_batch_size=3",  # ranks split generation into different numbers of calls
        "--model.grpo.micro_batch_size=3",  # and their rows into different numbers of micro-batches
        "--model.grpo.mini_batches=2",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1")
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FSDPLlamaForCausalLM" in done.stdout  # the policy really was sharded with fully_shard
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in done.stdout + done.stderr  # 2 rollouts x 2 steps
    (events,) = (tmp_path / "lightning_logs").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert {"val/success_act", "train/loss_align"} <= set(accumulator.Tags()["scalars"])


@pytest.mark.slow
def test_ddp_two_processes_on_cpu(tmp_path: Path) -> None:
    envace = Path(sys.executable).parent / "envace"
    cmd = [
        str(envace), "fit", "--config", str(ROOT / "lit_configs" / "tiny.yaml"),
        "--trainer.devices=2", "--trainer.accelerator=cpu", "--trainer.strategy=ddp",
        "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--model.rollout.generate_batch_size=3", "--model.grpo.micro_batch_size=3",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1")
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in done.stdout + done.stderr
    assert "sync_dist=True" not in done.stderr  # every epoch-level value is reduced across the ranks
    (events,) = (tmp_path / "lightning_logs").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert {"val/success_act", "val/fidelity_exact_match", "train/loss_act"} <= set(accumulator.Tags()["scalars"])


@pytest.mark.slow
def test_fsdp1_unit_generates_outside_and_inside_its_forward_on_cpu() -> None:
    """``strategy: fsdp`` (one FSDP unit, as Lightning wraps the module): sharded over two gloo ranks, rollouts
    generated outside a step (under ``summon_full_params``) and inside the unit's forward equal an unsharded copy's,
    with unequal work per rank; nested units are refused with a message naming the FSDP2 alternative."""
    worker = Path(__file__).with_name("fsdp1_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    ranks = [subprocess.Popen([sys.executable, str(worker), str(rank), "29543"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        outputs = [rank.communicate(timeout=180) for rank in ranks]
    except subprocess.TimeoutExpired:
        pytest.fail("a rank hung")
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (_, err) in zip(ranks, outputs):
        assert rank.returncode == 0, err[-3000:]
    for out, _ in outputs:
        result = json.loads(out.strip().splitlines()[-1])
        assert result["sharded"] and result["outside"] and result["inside"]
        assert "ModelParallelStrategy" in result["refused"] and "auto_wrap_policy" in result["refused"]
