"""The supervised warm start: trains both roles from references, lowers the loss, exports a loadable policy."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli import cli_main
from envace.policy import HFPolicy
from envace.sft import SFTModule

SFT = str(Path(__file__).parents[2] / "lit_configs" / "tiny_sft.yaml")


@pytest.mark.slow
def test_sft_lowers_both_losses_and_exports_a_policy(tmp_path: Path) -> None:
    export = tmp_path / "policy"
    args = ["fit", "--config", SFT, "--trainer.max_steps=12", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.log_every_n_steps=1",
            f"--model.export_dir={export}", "--data.batch_size=4"]
    losses: list[dict[str, float]] = []
    step = SFTModule.training_step

    def recording(self: SFTModule, batch, batch_idx):  # noqa: ANN001, ANN202
        _, stats = self._loss(batch)
        losses.append({k: float(v) for k, v in stats.items()})
        return step(self, batch, batch_idx)

    with mock.patch.object(sys, "argv", ["envace"]), mock.patch.object(SFTModule, "training_step", recording):
        cli = cli_main(args)
    assert isinstance(cli.model, SFTModule)
    first, last = losses[0], losses[-1]
    assert last["sft_loss_act"] < first["sft_loss_act"] and last["sft_loss_rehearse"] < first["sft_loss_rehearse"]
    model, tokenizer = HFPolicy(str(export)).build()
    trained = dict(cli.model.model.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param, trained[name].detach()), name
    assert tokenizer.chat_template
