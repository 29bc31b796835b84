"""Resuming from a checkpoint continues the rollout stream where it stopped (the DataModule's state_dict)."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli.lightning import cli_main
from envace.training.module import EnvACEModule

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


@pytest.fixture
def batches_seen(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    seen: list[list[str]] = []
    sample = EnvACEModule.sample_rollouts

    def recording(self: EnvACEModule, tasks):  # noqa: ANN001, ANN202
        seen.append([t.id for t in tasks])
        return sample(self, tasks)

    monkeypatch.setattr(EnvACEModule, "sample_rollouts", recording)
    return seen


def _fit(root: Path, steps: int, *extra: str) -> None:
    args = ["fit", "--config", TINY, f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={root}", "--trainer.logger=false",
            "--model.rollout.act_max_new_tokens=8", "--model.rollout.rehearse_max_new_tokens=8", *extra]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli_main(args)


@pytest.mark.slow
def test_resume_continues_the_task_stream(tmp_path: Path, batches_seen: list[list[str]]) -> None:
    _fit(tmp_path / "straight", 4)
    straight = list(batches_seen)
    batches_seen.clear()
    _fit(tmp_path / "split", 2, "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
         "--trainer.callbacks.every_n_train_steps=2", f"--trainer.callbacks.dirpath={tmp_path / 'ckpt'}")
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    _fit(tmp_path / "split", 4, f"--ckpt_path={ckpt}")
    assert len(straight) == 4
    assert batches_seen == straight  # steps 3 and 4 after the resume drew the same task batches as the straight run


@pytest.mark.slow
def test_checkpoint_rebuilds_the_module_from_its_hyperparameters(tmp_path: Path) -> None:
    import torch

    _fit(tmp_path, 2, "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
         "--trainer.callbacks.every_n_train_steps=2", f"--trainer.callbacks.dirpath={tmp_path / 'ckpt'}",
         "--model.grpo.group_size=2")
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    module = EnvACEModule.load_from_checkpoint(ckpt, weights_only=True)  # plain data only: safe to load
    assert module.grpo.group_size == 2 and type(module.policy).__name__ == "TinyPolicy"
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    for name, tensor in module.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    assert any(name.startswith("model.") for name in saved)
