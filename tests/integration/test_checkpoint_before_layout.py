"""Checkpoints written before envace's layout moved (issue 44) still resume, load and export.

The two files in ``tests/data/`` were written by the code before the move (commit 69b6200), one optimiser step each of
the tiny configs, with a policy of width 8 and one layer and plain SGD (no optimiser state) to keep them small:

    envace fit --config lit_configs/tiny.yaml --trainer.max_steps=1 --trainer.limit_val_batches=0 \
        --model.rollout.act_max_new_tokens=8 --model.rollout.rehearse_max_new_tokens=8 --trainer.logger=false \
        --model.policy.init_args.hidden=8 --model.policy.init_args.layers=1 --model.optimizer=torch.optim.SGD \
        --model.optimizer.init_args.lr=0.001                                    # -> before_layout_rl.ckpt
    envace fit --config lit_configs/tiny_sft.yaml --trainer.max_steps=1 --trainer.limit_val_batches=0 \
        --model.init_args.policy.init_args.hidden=8 --model.init_args.policy.init_args.layers=1 \
        --model.init_args.optimizer=torch.optim.SGD --model.init_args.optimizer.init_args.lr=0.001 \
        --trainer.logger=false                                                  # -> before_layout_sft.ckpt

(the ``last.ckpt`` of each). Their hyperparameters name the classes by their old modules
(``envace.module.EnvACEModule``, ``envace.sft.SFTModule``), which no longer exist.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli.command import main
from envace.cli.lightning import cli_main
from envace.runtime.checkpoint import upgrade_class_paths
from envace.training.module import EnvACEModule
from envace.training.sft import SFTModule

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
RL, SFT = DATA / "before_layout_rl.ckpt", DATA / "before_layout_sft.ckpt"
TINY, TINY_SFT = str(ROOT / "lit_configs" / "tiny.yaml"), str(ROOT / "lit_configs" / "tiny_sft.yaml")
SMALL_RL = ["--model.rollout.act_max_new_tokens=8", "--model.rollout.rehearse_max_new_tokens=8",
            "--model.policy.init_args.hidden=8", "--model.policy.init_args.layers=1",
            "--model.optimizer=torch.optim.SGD", "--model.optimizer.init_args.lr=0.001"]
SMALL_SFT = ["--model.init_args.policy.init_args.hidden=8", "--model.init_args.policy.init_args.layers=1",
             "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.001"]


def _stored(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["hyper_parameters"]


def test_the_files_name_the_old_modules() -> None:
    assert _stored(RL)["_class_path"] == "envace.module.EnvACEModule"
    assert _stored(SFT)["_class_path"] == "envace.sft.SFTModule"


def test_moved_class_paths_are_renamed_and_nothing_else() -> None:
    stored = {"_class_path": "envace.module.EnvACEModule",
              "selector": {"class_path": "envace.private_rehearsal.MajorityCommit", "init_args": {"k": 2}},
              "user": [{"class_path": "envace.users.ModelUser"}, "envace.policy.HFPolicy", "envace.memory"],
              "judge": {"class_path": "envace.rewards.checklist.HTTPJudge"},
              "note": "envace.module.EnvACEModule trained this", "count": 3}
    assert upgrade_class_paths(stored) == {
        "_class_path": "envace.training.module.EnvACEModule",
        "selector": {"class_path": "envace.rollout.private_rehearsal.MajorityCommit", "init_args": {"k": 2}},
        "user": [{"class_path": "envace.worlds.users.ModelUser"}, "envace.policy.HFPolicy", "envace.memory"],
        "judge": {"class_path": "envace.rewards.judges.HTTPJudge"},
        "note": "envace.module.EnvACEModule trained this", "count": 3}


def test_a_module_loads_from_a_checkpoint_before_the_move() -> None:
    rl = EnvACEModule.load_from_checkpoint(RL)
    assert type(rl.policy).__name__ == "TinyPolicy" and rl.grpo.group_size == 4
    sft = SFTModule.load_from_checkpoint(SFT)
    assert type(sft).__name__ == "SFTModule"


@pytest.mark.slow
def test_a_run_resumes_from_a_checkpoint_before_the_move(tmp_path: Path) -> None:
    for config, path, extra in ((TINY, RL, SMALL_RL), (TINY_SFT, SFT, SMALL_SFT)):
        root = tmp_path / path.stem
        args = ["fit", "--config", config, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                "--trainer.logger=false", f"--trainer.default_root_dir={root}", f"--ckpt_path={path}", *extra]
        with mock.patch.object(sys, "argv", ["envace"]):
            cli = cli_main(args)
        assert cli.trainer.global_step == 2  # the checkpoint's step 1, then one more


@pytest.mark.slow
def test_a_policy_exports_from_a_checkpoint_before_the_move(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from envace.cli.export import load_policy

    out = tmp_path / "export"
    with mock.patch.object(sys, "argv", ["envace"]):
        main(["export", "--config", TINY, "--ckpt_path", str(RL), "--out", str(out), *SMALL_RL])
    trained, _ = load_policy(TINY, str(RL), SMALL_RL)
    ids = torch.arange(5, 45).unsqueeze(0)
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        exported = AutoModelForCausalLM.from_pretrained(out / "merged").eval()(input_ids=ids).logits
    assert torch.allclose(exported, expected)  # the same weights through the same layers
