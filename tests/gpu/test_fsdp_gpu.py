"""``strategy: fsdp`` (Lightning's FSDPStrategy) trains the tiny config on every visible GPU (up to 2). Skipped
without CUDA (run with ``-m gpu``); the CPU tests cover FSDP2 and the FSDP unit's generation on gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ROOT = Path(__file__).parents[2]


def test_tiny_fit_with_strategy_fsdp(tmp_path: Path) -> None:
    devices = min(2, torch.cuda.device_count())
    envace = Path(sys.executable).parent / "envace"
    cmd = [
        str(envace), "fit", "--config", str(ROOT / "lit_configs" / "tiny.yaml"),
        "--trainer.accelerator=gpu", f"--trainer.devices={devices}", "--trainer.strategy=fsdp",
        "--trainer.precision=bf16-mixed", "--trainer.max_steps=4", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1", "--model.rollout.generate_batch_size=3", "--model.grpo.micro_batch_size=3",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in done.stdout + done.stderr
    (events,) = (tmp_path / "lightning_logs").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert {"val/success_act", "train/loss_act", "train/rollout_time_s"} <= set(accumulator.Tags()["scalars"])
