"""Style is enforced, not suggested: ruff (pyproject's rules) must pass on the library, callbacks and tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_ruff_is_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        found = shutil.which("ruff")
        if found is None:
            pytest.fail("ruff is not installed (it is in the dev extra: scripts/setup_env.sh installs it)")
        ruff = Path(found)
    done = subprocess.run([str(ruff), "check", "envace", "callbacks", "tests", "benchmarks"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:]
