"""A run killed with SIGKILL resumes from its last checkpoint and continues exactly as if it had never stopped; a
checkpoint damaged mid-write never replaces the previous one, and a damaged file is refused with a clear error."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envace.runtime.checkpoint import AtomicCheckpointIO, CheckpointError

ROOT = Path(__file__).parents[2]
KILLER = '''
import os, signal
from lightning.pytorch import Callback


class KillAt(Callback):
    """SIGKILL this process at the end of optimiser step ``step``: no cleanup, no final checkpoint."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
'''
TIMED = ("time_s", "tokens_per_s")  # wall-clock measurements: the only values allowed to differ


def _config(tmp: Path, name: str, steps: int, kill_at: int | None = None) -> Path:
    config = yaml.safe_load((ROOT / "lit_configs" / "tiny.yaml").read_text())
    trainer = config["trainer"]
    trainer.update(max_steps=steps, limit_val_batches=0, default_root_dir=str(tmp / "runs" / name),
                   enable_progress_bar=False)
    trainer["logger"] = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",  # the resumed run's events
                         "init_args": {"save_dir": str(tmp / "runs" / name), "version": 0}}  # join the first's
    trainer["callbacks"] = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                             "init_args": {"dirpath": str(tmp / "ckpt" / name), "every_n_train_steps": 2,
                                           "save_last": True, "save_top_k": -1}}]
    if kill_at is not None:
        trainer["callbacks"].append({"class_path": "killer.KillAt", "init_args": {"step": kill_at}})
    config["model"]["rollout"].update(act_max_new_tokens=12, rehearse_max_new_tokens=12)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _fit(tmp: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    envace = Path(sys.executable).parent / "envace"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=f"{tmp}{os.pathsep}{ROOT}")
    return subprocess.run([str(envace), "fit", "--config", str(config), *extra], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=600)


def _scalars(run: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for events in sorted(run.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    return out


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path: Path) -> None:
    (tmp_path / "killer.py").write_text(KILLER)
    straight = _fit(tmp_path, _config(tmp_path, "straight", 6))
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _fit(tmp_path, _config(tmp_path, "split", 6, kill_at=5))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = sorted(p.name for p in (tmp_path / "ckpt" / "split").glob("*.ckpt"))
    assert "last.ckpt" in saved and not any("step=6" in name for name in saved)
    assert not list((tmp_path / "ckpt" / "split").glob(".*partial*"))  # no half-written file left behind
    resumed = _fit(tmp_path, _config(tmp_path, "split", 6), "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Restoring states from the checkpoint path" in resumed.stdout + resumed.stderr

    expected, got = _scalars(tmp_path / "runs" / "straight"), _scalars(tmp_path / "runs" / "split")
    last = torch.load(tmp_path / "ckpt" / "split" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 6
    compared = 0
    for tag, values in expected.items():
        if not tag.startswith("train/") or tag.endswith(TIMED):
            continue
        for step, value in values.items():
            assert step in got.get(tag, {}), f"{tag} at step {step} was lost"  # steps 1-4 before, 5-6 after the kill
            if step >= 4:  # optimiser steps 5 and 6 (logged at 0-based steps 4, 5): after the step-4 checkpoint
                assert got[tag][step] == value, (tag, step)  # bit for bit: same weights, optimiser, data, random state
                compared += 1
    assert compared >= 20

    # What a non-atomic writer leaves after a crash: the resume refuses it, naming the earlier checkpoints.
    data = (tmp_path / "ckpt" / "split" / "last.ckpt").read_bytes()
    (tmp_path / "ckpt" / "split" / "last.ckpt").write_bytes(data[: len(data) // 3])
    refused = _fit(tmp_path, _config(tmp_path, "split", 8), "--ckpt_path=last")
    assert refused.returncode != 0
    assert "last.ckpt cannot be read" in refused.stderr and "step=4.ckpt" in refused.stderr, refused.stderr[-3000:]


def test_a_write_killed_midway_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 4, "weights": torch.ones(3)}, path)

    def dies_midway(obj, f, *args, **kwargs):  # the process dies after writing part of the file
        f.write(b"PK\x03\x04 partial bytes")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 6, "weights": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["global_step"] == 4  # the previous checkpoint, intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_truncated_checkpoint_is_refused_naming_the_earlier_ones(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 2}, tmp_path / "step=2.ckpt")
    io.save_checkpoint({"global_step": 4, "weights": torch.ones(1000)}, tmp_path / "step=4.ckpt")
    data = (tmp_path / "step=4.ckpt").read_bytes()
    (tmp_path / "step=4.ckpt").write_bytes(data[: len(data) // 2])  # what a non-atomic writer leaves after a crash
    with pytest.raises(CheckpointError, match=r"step=4\.ckpt cannot be read .* truncated or corrupt.*step=2\.ckpt"):
        io.load_checkpoint(tmp_path / "step=4.ckpt")
    for seed in range(50):  # random bytes: torch's unpicklers fail on them with many exception types
        (tmp_path / "garbage.ckpt").write_bytes(random.Random(seed).randbytes(256))
        with pytest.raises(CheckpointError, match="garbage.ckpt cannot be read"):
            io.load_checkpoint(tmp_path / "garbage.ckpt")
    with pytest.raises(FileNotFoundError, match="missing.ckpt does not exist"):
        io.load_checkpoint(tmp_path / "missing.ckpt")


def test_a_checkpoint_holding_code_is_refused(tmp_path: Path) -> None:
    torch.save({"global_step": 1, "hook": os.system}, tmp_path / "evil.ckpt")  # would call os.system on unpickling
    with pytest.raises(CheckpointError, match="holds objects other than plain data"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "evil.ckpt")


def test_random_states_of_another_rank_count_are_not_applied() -> None:
    """Resuming on a different number of ranks restores everything but the random states, with a warning."""
    from envace.policy import TinyPolicy
    from envace.runtime.checkpoint import rng_state
    from envace.training.module import EnvACEModule

    module = EnvACEModule(policy=TinyPolicy())
    with pytest.warns(UserWarning, match="random states of 2 rank"):
        module.on_load_checkpoint({"envace_rng": [rng_state(), rng_state()]})
    assert module._pending_rng is None
    module.on_load_checkpoint({"envace_rng": [rng_state()]})
    assert module._pending_rng is not None  # applied when the next rollout starts
