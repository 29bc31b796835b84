"""GPU smoke test: the tiny config trains on one CUDA device in bf16. Skipped without CUDA (run with -m gpu)."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli import cli_main as main

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


def test_tiny_fit_on_one_gpu(tmp_path: Path) -> None:
    args = ["fit", "--config", TINY, "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed",
            "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(args)
    assert next(cli.model.model.parameters()).is_cuda
    assert cli.trainer.global_step == 2
