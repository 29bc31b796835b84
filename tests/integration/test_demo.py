"""The embedded demo end to end on a miniature budget: three CLI stages, two exports, one table, zero real calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli import demo
from envace.worlds.rehearse import FORMAT_FILE

ROOT = Path(__file__).parents[2]
TINY = ["--model.init_args.policy.init_args.hidden=32", "--model.init_args.policy.init_args.layers=1"]
FAST = ["--model.init_args.rollout.act_max_new_tokens=8", "--model.init_args.rollout.rehearse_max_new_tokens=8"]


@pytest.mark.slow
def test_demo_runs_all_stages_and_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sft = [*TINY, *FAST, "--trainer.max_steps=3", "--trainer.min_steps=0", "--trainer.val_check_interval=3",
           "--data.val_tasks=builtin:bank-val:2", "--data.eval_batch_size=2", "--data.batch_size=2"]
    rl = [*FAST, "--trainer.max_steps=2", "--model.fidelity_gate=null", "--data.batch_size=1",
          "--model.grpo.group_size=2"]
    argv = ["--out", str(tmp_path), "--sft-config", str(ROOT / "lit_configs/tiny_sft.yaml"),
            "--rl-config", str(ROOT / "lit_configs/tiny_rl.yaml"), "--eval-tasks", "2",
            *(f"--sft={a}" for a in sft), *(f"--rl={a}" for a in rl)]
    with mock.patch.object(sys, "argv", ["envace-demo"]):
        demo.main(argv)
    out = capsys.readouterr().out
    for row in ("| warm start (SFT) | test |", "| warm start (SFT) | heldout |", "| EnvACE (rehearse RL) | test |"):
        assert row in out
    assert "Real tool calls during RL: 0 (counted by the module)." in out
    assert out.strip().endswith((tmp_path / "results.md").read_text(encoding="utf-8").strip())
    assert (tmp_path / "sft/policy/config.json").is_file() and (tmp_path / "rl/policy/config.json").is_file()
    for stage in ("sft", "rl"):  # each export records the rehearse prompt format the next stage is checked against
        record = json.loads((tmp_path / stage / "policy" / FORMAT_FILE).read_text(encoding="utf-8"))
        assert record == {"system_prompt": None, "show_act_reasoning": False, "all_tools": False, "think": False}
    # Lightning checkpoints of both stages, under each stage's root: envace export works on what the demo trained
    (sft_last,) = (tmp_path / "sft").rglob("last.ckpt")
    (rl_last,) = (tmp_path / "rl").rglob("last.ckpt")
    assert torch.load(sft_last, weights_only=True)["global_step"] == 3
    assert torch.load(rl_last, weights_only=True)["global_step"] == 2
    from envace.cli.command import main as envace

    envace(["export", "--config", str(ROOT / "lit_configs/tiny_rl.yaml"), "--ckpt_path", str(rl_last),
            "--out", str(tmp_path / "export"), f"--model.policy.init_args.name_or_path={tmp_path / 'sft/policy'}"])
    assert (tmp_path / "export/merged/config.json").is_file()


def test_format_table_marks_missing_metrics() -> None:
    table = demo.format_table([("x", "test", {"success_act": 0.5}, "0")])
    assert "| x | test | 0.500 | n/a |" in table


def test_the_seed_reaches_the_weights_the_task_order_and_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    fits: list[tuple[str, list[str]]] = []
    tests: list[list[str]] = []

    def fit(config: str, export_dir: str, root_dir: str, overrides: list[str] = ()) -> demo.StageResult:
        fits.append((config, list(overrides)))
        return demo.StageResult(export_dir, 1.0, 1, {"train/real_calls_total": 0.0})

    def evaluate(config: str, policy: str, tasks: str, root: str, overrides: list[str] = ()) -> dict[str, float]:
        tests.append(list(overrides))
        return {"success_act": 1.0}

    monkeypatch.setattr(demo, "fit", fit)
    monkeypatch.setattr(demo, "evaluate", evaluate)
    demo.run_demo("out", "sft.yaml", "rl.yaml", ["--x=1"], ["--y=2"], seed=7)
    (_, sft), (_, rl) = fits
    assert sft == ["--seed_everything=7", "--data.seed=7", "--model.init_args.policy.init_args.seed=7", "--x=1"]
    assert rl[1:] == ["--seed_everything=7", "--data.seed=7", "--y=2"]  # rl[0]: the warm start's policy
    assert tests == [["--seed_everything=7"]] * 4
    fits.clear()
    demo.run_demo("out", "sft.yaml", "rl.yaml", seed=None)
    assert fits[0][1] == [] and fits[1][1][1:] == []  # the configs' own seeds


def test_python_m_envace_demo_reports_its_stages_and_mistakes_in_one_line(tmp_path: Path) -> None:
    import os
    import subprocess

    run = subprocess.run([sys.executable, "-m", "envace.cli.demo", "--out", str(tmp_path), "--sft-config",
                          str(tmp_path / "missing.yaml")], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    assert run.returncode == 2, run.stderr[-2000:]
    assert "demo: stage 1/6, SFT warm start" in run.stderr  # run as __main__, the demo still logs through envace
    errors = [line for line in run.stderr.splitlines() if line.startswith("envace: error:")]
    assert len(errors) == 1 and "missing.yaml" in errors[0] and "Traceback" not in run.stderr


def test_the_smollm2_preset_prepares_the_model_and_seeds_no_weights(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    import envace.policy.packaged

    fits: list[tuple[str, list[str]]] = []
    prepared: list[tuple[str, str]] = []

    def fit(config: str, export_dir: str, root_dir: str, overrides: list[str] = ()) -> demo.StageResult:
        fits.append((config, list(overrides)))
        return demo.StageResult(export_dir, 1.0, 1, {"train/real_calls_total": 0.0})

    monkeypatch.setattr(demo, "fit", fit)
    monkeypatch.setattr(demo, "evaluate", lambda *a, **k: {"success_act": 0.5})
    monkeypatch.setattr(envace.policy.packaged, "prepare", lambda gguf, out, *a: prepared.append((gguf.name, str(out))))
    demo.main(["--model", "smollm2", "--out", str(tmp_path), "--seed", "3", "--sft=--trainer.max_steps=2"])
    assert prepared == [("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2-135m-instruct")]
    (sft_config, sft), (rl_config, _) = fits
    assert (sft_config, rl_config) == ("lit_configs/smollm2_sft.yaml", "lit_configs/smollm2_rl.yaml")
    assert "--seed_everything=3" in sft and not any("policy.init_args.seed" in a for a in sft)  # pretrained weights
    assert sft[-1] == "--trainer.max_steps=2"  # the user's override after the preset's budget
    assert "| warm start (SFT) | test | 0.500 |" in (tmp_path / "results.md").read_text()


def test_the_tiny_desk_demo_trains_longer_and_runs_rl_past_the_gate_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fits: list[list[str]] = []

    def fit(config: str, export_dir: str, root_dir: str, overrides: list[str] = ()) -> demo.StageResult:
        fits.append(list(overrides))
        return demo.StageResult(export_dir, 1.0, 1, {"train/real_calls_total": 0.0})

    monkeypatch.setattr(demo, "fit", fit)
    monkeypatch.setattr(demo, "evaluate", lambda *a, **k: {"success_act": 0.5})
    with caplog.at_level("WARNING", logger="envace.cli.demo"):
        demo.main(["--domain", "desk", "--out", str(tmp_path), "--sft=--trainer.max_steps=7"])
    sft, rl = fits
    steps = [a for a in sft if a.startswith("--trainer.max_steps=")]
    assert steps == ["--trainer.max_steps=1000", "--trainer.max_steps=3000", "--trainer.max_steps=7"]  # user last
    assert rl[-1] == "--model.fidelity_gate=null" and "below the fidelity gate" in caplog.text
    fits.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="envace.cli.demo"):
        demo.main(["--out", str(tmp_path)])  # the bank keeps the gate and the 1000 steps
    assert "--trainer.max_steps=3000" not in fits[0] and "--model.fidelity_gate=null" not in fits[1]
    assert "fidelity gate" not in caplog.text


def test_the_domain_moves_every_task_set_and_fits_the_tiny_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    fits: list[list[str]] = []
    tested: list[str] = []

    def fit(config: str, export_dir: str, root_dir: str, overrides: list[str] = ()) -> demo.StageResult:
        fits.append(list(overrides))
        return demo.StageResult(export_dir, 1.0, 1, {"train/real_calls_total": 0.0})

    def evaluate(config: str, policy: str, tasks: str, root: str, overrides: list[str] = ()) -> dict[str, float]:
        tested.append(tasks)
        return {"success_act": 1.0}

    monkeypatch.setattr(demo, "fit", fit)
    monkeypatch.setattr(demo, "evaluate", evaluate)
    sft, rl = str(ROOT / "lit_configs/tiny_sft.yaml"), str(ROOT / "lit_configs/tiny_rl.yaml")
    demo.run_demo("out", sft, rl, list(demo.DEMO_SFT), [], eval_tasks=4, domain="desk", fits_tokenizer=True)
    assert fits[0] == ["--data.train_tasks=builtin:desk:500", "--data.val_tasks=builtin:desk-val",
                       "--model.init_args.policy.init_args.domains=[desk]", "--trainer.max_steps=1000",
                       "--trainer.val_check_interval=250", "--data.val_tasks=builtin:desk-val:64"]  # fmt: skip
    assert fits[1][1:] == ["--data.train_tasks=builtin:desk:2000", "--data.val_tasks=builtin:desk-val"]
    assert tested == ["builtin:desk-test:4", "builtin:desk-heldout:4"] * 2
    assert demo.on_domain(["--x=builtin:bankrupt", "builtin:bank"], "desk") == ["--x=builtin:bankrupt", "builtin:desk"]
    with pytest.raises(ValueError, match="unknown domain 'shop'"):
        demo.run_demo("out", sft, rl, domain="shop")
