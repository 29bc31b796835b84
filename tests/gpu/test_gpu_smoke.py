"""GPU smoke test: the tiny config trains on one CUDA device in bf16. Skipped without CUDA (run with -m gpu)."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from lightning.pytorch import Callback

from envace.cli.lightning import cli_main as main
from envace.training.module import EnvACEModule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


class _TrainingDevice(Callback):
    """Records where the policy's weights are while it trains (Lightning moves the module back to the CPU after
    ``fit``)."""

    def __init__(self) -> None:
        self.devices: list[torch.device] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: D102
        self.devices.append(next(pl_module.model.parameters()).device)


def test_tiny_fit_on_one_gpu(tmp_path: Path) -> None:
    # the tiny config's HybridWorld (real, cached and rehearsed answers, live probes, audits) on one GPU in bf16
    args = ["fit", "--config", TINY, "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed",
            "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}"]
    device = _TrainingDevice()
    with mock.patch.object(sys, "argv", ["envace"]), mock.patch.object(
        EnvACEModule, "configure_callbacks", lambda self: [device], create=True
    ):
        cli = main(args)
    assert device.devices and all(d.type == "cuda" for d in device.devices)
    assert cli.trainer.global_step == 2
