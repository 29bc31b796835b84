"""A user's mistake ends ``envace`` with one line on stderr naming the file and line or key, exit status 2, and no
traceback; ``ENVACE_DEBUG=1`` shows the traceback. Most cases run the command in-process (``envace.cli.command.main``,
what the console script calls); one runs the real console script in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envace.cli.command import main

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "lit_configs" / "tiny.yaml")


def _fails(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """Run ``envace ARGS``; assert exit status 2 and exactly one error line without a traceback; return that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("envace: error:")]
    assert len(errors) == 1, err
    return errors[0]


def _fit(tmp_path: Path, *extra: str) -> list[str]:
    return ["fit", "--config", TINY, f"--trainer.default_root_dir={tmp_path / 'out'}", "--trainer.max_steps=1",
            "--trainer.limit_val_batches=0", *extra]


def _typo_config(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """tiny.yaml with ``old`` replaced by ``new``; the file and the 1-based line of the change."""
    text = Path(TINY).read_text()
    assert text.count(old) == 1
    line = text[: text.index(old)].count("\n") + 1
    path = tmp_path / "typo.yaml"
    path.write_text(text.replace(old, new))
    return path, line


def test_a_broken_task_line_is_named_by_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = (ROOT / "envace" / "builtin" / "bank_val.jsonl").read_text().splitlines()[:2]
    bad = tmp_path / "bad_tasks.jsonl"
    bad.write_text("\n".join([*good, '{"id": "t3", "messages": [}']) + "\n")
    line = _fails(capsys, _fit(tmp_path, f"--data.train_tasks={bad}"))
    assert "bad_tasks.jsonl:3: invalid JSON" in line


def test_a_missing_task_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(capsys, _fit(tmp_path, f"--data.train_tasks={tmp_path / 'nope.jsonl'}"))
    assert "nope.jsonl" in line


def test_a_config_typo_names_the_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, lineno = _typo_config(tmp_path, "    max_turns: 5 ", "    max_turnz: 5 ")
    line = _fails(capsys, ["fit", "--config", str(config)])
    assert f"typo.yaml:{lineno}: model.rollout.max_turnz: unknown key" in line
    assert "policy" not in line  # not the whole model dict


def test_a_typo_in_a_class_s_arguments_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, lineno = _typo_config(tmp_path, "      lr: 0.001", "      lrr: 0.001")
    line = _fails(capsys, ["fit", "--config", str(config)])
    assert f"typo.yaml:{lineno}: model.optimizer.lrr: unknown key" in line


def test_a_trainer_typo_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, lineno = _typo_config(tmp_path, "  val_check_interval: 10 ", "  val_check_intervall: 10 ")
    line = _fails(capsys, ["fit", "--config", str(config)])
    assert f"typo.yaml:{lineno}: trainer.val_check_intervall: unknown key" in line


def test_command_line_mistakes_name_the_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(capsys, ["fit", "--config", TINY, "--trainer.max_stepz=3"])
    assert "--trainer.max_stepz=3" in line
    line = _fails(capsys, ["fit", "--config", TINY, "--model.rollout.max_turns=abc"])
    assert "command-line argument --model.rollout.max_turns=abc" in line and "int" in line
    line = _fails(capsys, ["fit", "--config", str(tmp_path / "nope.yaml")])
    assert "nope.yaml" in line and "does not exist" in line


def test_a_value_a_constructor_refuses_names_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(capsys, ["fit", "--config", TINY, "--model.export_best=val/success_act"])
    assert "tiny.yaml" in line and "export_best needs export_dir" in line


def test_bad_checkpoints_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.ckpt"
    line = _fails(capsys, _fit(tmp_path, f"--ckpt_path={missing}"))
    assert "missing.ckpt" in line
    corrupt = tmp_path / "corrupt.ckpt"
    torch.save({"state_dict": {}}, corrupt)
    corrupt.write_bytes(corrupt.read_bytes()[:40])  # truncated
    line = _fails(capsys, _fit(tmp_path, f"--ckpt_path={corrupt}"))
    assert "corrupt.ckpt" in line
    line = _fails(capsys, ["export", "--config", TINY, "--ckpt_path", str(missing), "--out", str(tmp_path / "x")])
    assert "missing.ckpt" in line


def test_the_console_script_prints_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad_tasks.jsonl"
    bad.write_text('{"id": "t1", "messages": [}\n')
    args = [sys.executable, "-m", "envace", *_fit(tmp_path, f"--data.train_tasks={bad}")]
    env = {**os.environ, "ENVACE_DEBUG": "0"}
    run = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("envace: error:")] == [
        next(line for line in run.stderr.splitlines() if "bad_tasks.jsonl:1: invalid JSON" in line)]
    debug = subprocess.run(args, capture_output=True, text=True, env={**env, "ENVACE_DEBUG": "1"}, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "TaskFormatError" in debug.stderr
