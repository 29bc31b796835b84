"""The supervised warm start: trains both roles from references, lowers the loss, exports a loadable policy."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli.lightning import cli_main
from envace.policy import HFPolicy
from envace.training.sft import SFTModule

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
    for builder in (cli.model.alignment, cli.model.demonstrations):  # rows are cut where the rollout ends episodes
        assert builder.cap.max_tokens == cli.model.rollout.max_context_tokens


def test_sft_rows_stop_at_the_rollout_context(tmp_path: Path) -> None:
    args = ["fit", "--config", SFT, "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]", "--data.batch_size=4", "--model.init_args.rollout.max_context_tokens=70"]
    lengths: list[int] = []
    step = SFTModule.training_step

    def recording(self: SFTModule, batch, batch_idx):  # noqa: ANN001, ANN202
        lengths.append(int(batch.attention_mask.sum(-1).max()))
        return step(self, batch, batch_idx)

    with mock.patch.object(sys, "argv", ["envace"]), mock.patch.object(SFTModule, "training_step", recording), \
            pytest.warns(UserWarning, match="longer than rollout.max_context_tokens=70"):
        cli_main(args)
    assert lengths == [70]  # the tiny tokenizer's bank rows are 80-88 tokens: cut


@pytest.mark.slow
def test_sft_validation_runs_the_real_tools_and_exports_the_best_weights(tmp_path: Path) -> None:
    export = tmp_path / "policy"
    args = ["fit", "--config", SFT, "--trainer.max_steps=4", "--trainer.val_check_interval=2",
            "--model.init_args.policy.init_args.hidden=32", "--model.init_args.policy.init_args.layers=1",
            "--model.init_args.rollout.act_max_new_tokens=8", "--model.init_args.rollout.rehearse_max_new_tokens=8",
            "--data.val_tasks=builtin:bank-val:4", "--data.eval_batch_size=4", "--data.batch_size=2",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.callbacks=[]",
            f"--model.export_dir={export}"]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args)
    metrics = cli.trainer.callback_metrics
    for key in ("val/success_act", "val/fidelity_exact_match", "val/real_calls", "val/sft_loss_act"):
        assert key in metrics, key
    # success is 0 at both validations: a tie, so the latest (step 4) is the best, and its weights are exported
    best = cli.model.best
    assert best.score == 0.0 and best.step == 4  # not step 2's weights
    assert best.path is not None and not best.path.exists()  # removed once the export holds the same weights
    exported, _ = HFPolicy(str(export)).build()
    final = cli.model.model.state_dict()
    state = exported.state_dict()
    assert state.keys() == final.keys() and all(torch.equal(state[k], final[k].cpu()) for k in final)


def test_export_best_needs_an_export_dir() -> None:
    from envace.policy import TinyPolicy

    with pytest.raises(ValueError, match="export_best needs export_dir"):
        SFTModule(TinyPolicy(), export_best="val/success_act")
