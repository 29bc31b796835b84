"""The built wheel carries everything a non-editable install needs: callbacks, the built-in tasks, the prompts."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_wheel_ships_callbacks_data_and_prompts(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    subprocess.run([*build, str(ROOT)], check=True, capture_output=True, text=True)
    (wheel,) = tmp_path.glob("envace-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import callbacks.rollout_samples as c, envace, envace.data.tasks as t, envace.roles.rehearse as r;"
        f"assert c.__file__.startswith({str(site)!r}), c.__file__;"
        "assert len(t.load_tasks(t.resolve_task_path('builtin:bank'))) > 0;"
        "assert 'tool environment' in r.default_system_prompt()"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
