"""The ``envace`` command as a user meets it: ``--trainer.default_root_dir`` moves every output, progress lines
appear when output is redirected, dependencies' noise is gone, and ``--help`` lists every subcommand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envace.cli.command import main
from envace.runtime.noise import LOG_NOISE, WARNING_NOISE

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_default_root_dir_moves_every_output_and_the_run_reports_progress(tmp_path: Path) -> None:
    (tmp_path / "lit_configs").symlink_to(ROOT / "lit_configs")
    out = tmp_path / "D"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [sys.executable, "-m", "envace", "fit", "--config", "lit_configs/tiny.yaml", "--trainer.max_steps=2",
         f"--trainer.default_root_dir={out}", "--model.rollout.act_max_new_tokens=8",
         "--model.rollout.rehearse_max_new_tokens=8"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # stdout and stderr are pipes
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (tmp_path / "runs").exists()
    assert list(out.rglob("events.out.tfevents.*")) and list(out.rglob("last.ckpt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D", "lit_configs"]
    assert "fit: started, 2 steps" in run.stderr and "fit: finished, step 2/2 (100%)" in run.stderr
    for pattern in WARNING_NOISE:
        assert not re.search(pattern, run.stderr), pattern
    for prefixes in LOG_NOISE.values():
        assert not any(p in run.stderr for p in prefixes)
    assert "Traceback" not in run.stderr


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    for command in ("fit", "validate", "test", "export"):
        assert re.search(rf"^\s+{command}\s+\S", listed, re.M), listed
    with pytest.raises(SystemExit) as done:
        main(["export", "--help"])
    assert done.value.code == 0 and "--ckpt_path" in capsys.readouterr().out
