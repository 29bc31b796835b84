"""Every shipped config parses and instantiates (model, data, strategy, callbacks) without loading any weights."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli.lightning import ConfigCheckCLI
from envace.cli.lightning import cli_main as main
from envace.training.module import EnvACEModule

CONFIGS = sorted((Path(__file__).parents[2] / "lit_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_parses_and_instantiates(path: Path) -> None:
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(path)], run=False, cli_class=ConfigCheckCLI)
    assert cli.model.model is None  # constructors are cheap: nothing was built or loaded
    assert cli.datamodule.batch_size >= 1
    if isinstance(cli.model, EnvACEModule):
        assert cli.model.rollout.max_turns >= 1


def test_qwen7b_is_fsdp_with_lora_on_a_real_model_name() -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(CONFIGS[0].parent / "qwen7b.yaml")], run=False, cli_class=ConfigCheckCLI)
    strategy = cli.config_init["trainer"]["strategy"]
    assert isinstance(strategy, ModelParallelStrategy)  # FSDP2; the module fully_shards the decoder layers
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (8, 1)
    policy = cli.model.policy
    assert policy.name_or_path.startswith("Qwen/") and policy.lora is not None and policy.dtype == "bfloat16"


def test_cli_override_on_the_command_line() -> None:
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(
            ["--config", str(CONFIGS[0].parent / "tiny.yaml"), "--model.grpo.group_size=8", "--data.batch_size=3"],
            run=False,
            cli_class=ConfigCheckCLI,
        )
    assert cli.model.grpo.group_size == 8
    assert cli.datamodule.batch_size == 3


def test_unknown_class_path_is_a_one_line_parse_error(capsys: pytest.CaptureFixture[str]) -> None:
    from envace.cli.command import main as envace

    with pytest.raises(SystemExit) as done:
        envace(["fit", "--config", str(CONFIGS[0].parent / "tiny.yaml"), "--model.world=envace.worlds.NoSuchWorld"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("envace: error:")]
    assert "--model.world=envace.worlds.NoSuchWorld" in line and "Traceback" not in err


@pytest.mark.parametrize(
    "choice",
    ["envace.losses.TokenMean", "envace.losses.SeqMeanTokenMean", '{"class_path": "envace.losses.ConstantNorm", '
     '"init_args": {"constant": 512}}'],
)
def test_loss_aggregation_is_chosen_by_class_path(choice: str) -> None:
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(CONFIGS[0].parent / "tiny.yaml"), f"--model.aggregation={choice}"],
                   run=False, cli_class=ConfigCheckCLI)
    assert type(cli.model.aggregation).__name__ in choice


def test_the_single_gpu_config_is_qlora_on_one_device() -> None:
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(CONFIGS[0].parent / "qwen7b_qlora.yaml")], run=False, cli_class=ConfigCheckCLI)
    trainer = cli.config_init["trainer"]
    assert trainer["devices"] == 1 and trainer["precision"] == "bf16-mixed"
    policy = cli.model.policy
    assert policy.load_in_4bit and policy.lora is not None and policy.name_or_path.startswith("Qwen/")


def test_the_checklist_config_is_qwen7b_with_a_judged_checklist_reward() -> None:
    """Same structure as qwen7b.yaml (keys and strategy); the reward is the checklist judged over HTTP, the data
    is the authors' row format."""
    import yaml

    from envace.rewards import ChecklistReward, HTTPJudge

    def keys(node: object, prefix: str = "") -> set[str]:
        if not isinstance(node, dict):
            return set()
        return {f"{prefix}{k}" for k in node} | {x for k, v in node.items() for x in keys(v, f"{prefix}{k}.")
                                                 if k in ("trainer", "model", "data")}

    base, checklist = (yaml.safe_load((CONFIGS[0].parent / name).read_text())
                       for name in ("qwen7b.yaml", "qwen7b_checklist.yaml"))
    assert keys(base) == keys(checklist)
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(CONFIGS[0].parent / "qwen7b_checklist.yaml")], run=False,
                   cli_class=ConfigCheckCLI)
    reward = cli.model.rewards[0]
    assert isinstance(reward, ChecklistReward) and isinstance(reward.judge, HTTPJudge)
    assert cli.datamodule.paths["train"].startswith("reference:")


def test_qwen3_8b_is_the_papers_model_full_fine_tuned_with_fsdp_and_new_rows_on_rewrites() -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(CONFIGS[0].parent / "qwen3_8b.yaml")], run=False, cli_class=ConfigCheckCLI)
    assert isinstance(cli.config_init["trainer"]["strategy"], ModelParallelStrategy)
    policy = cli.model.policy
    assert policy.name_or_path == "Qwen/Qwen3-8B" and policy.lora is None and policy.dtype == "bfloat16"
    assert cli.model.rollout.on_rerender == "new_row"


@pytest.mark.parametrize("name", ["smollm2_sft.yaml", "smollm2_rl.yaml", "smollm2_rl_lora.yaml"])
def test_smollm2_configs_use_the_prepared_directory_and_the_packaged_tool_template(name: str) -> None:
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(["--config", str(CONFIGS[0].parent / name)], run=False, cli_class=ConfigCheckCLI)
    policy = cli.model.policy
    assert policy.chat_template == "chatml-tools" and policy.dtype == "float32"
    assert cli.config_init["trainer"]["precision"] == "bf16-mixed"
    assert policy.name_or_path in ("models/smollm2-135m-instruct", "runs/smollm2_sft/policy")
    assert (policy.lora is not None) == name.endswith("_lora.yaml")
