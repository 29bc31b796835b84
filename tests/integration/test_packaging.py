"""Packaging: the built wheel carries everything a non-editable install needs (callbacks, the built-in tasks, the
prompts), and the environment is the one requirements.lock pins."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_wheel_ships_callbacks_data_and_prompts(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    subprocess.run([*build, str(ROOT)], check=True, capture_output=True, text=True)
    (wheel,) = tmp_path.glob("envace-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import callbacks.rollout_samples as c, envace, envace.builtin.task_sets as t, envace.roles.rehearse as r;"
        f"assert c.__file__.startswith({str(site)!r}), c.__file__;"
        "assert len(t.load_task_set('builtin:bank')) > 0;"
        "assert 'tool environment' in r.default_system_prompt()"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def _check_lock():
    """scripts/check_lock.py, the check scripts/setup_env.sh runs after installing, as a module."""
    spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lock_script_value(name: str) -> str:
    """A variable's value in scripts/lock.sh, e.g. ``TORCH`` or ``BENCH_PACKAGES`` (an array: its words)."""
    match = re.search(rf"^{name}=(\(([^)]*)\)|\S+)", (ROOT / "scripts" / "lock.sh").read_text(), re.M)
    assert match, f"scripts/lock.sh sets no {name}"
    return match.group(2) if match.group(2) is not None else match.group(1)


@pytest.mark.parametrize("name", ["torch", "transformers", "lightning", "peft", "bitsandbytes"])
def test_key_package_is_installed_at_its_locked_version(name: str) -> None:
    pins, _ = _check_lock().read_lock()
    installed = metadata.version(name)
    assert pins[name].specifier.contains(installed), f"{name} {installed} is installed, {pins[name]} is locked"


def test_environment_matches_the_lock() -> None:
    assert _check_lock().problems() == []


def test_lock_covers_pyproject_and_the_no_deps_packages() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins, no_deps = _check_lock().read_lock()
    extras = project["optional-dependencies"]
    for line in [*project["dependencies"], *extras["dev"], *extras["bench"]]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins, f"pyproject.toml needs {req}, requirements.lock lacks it: run scripts/lock.sh"
        (pin,) = pins[name].specifier
        assert req.specifier.contains(pin.version, prereleases=True), f"{req} but {pins[name]} locked"
    bench = [Requirement(word) for word in _lock_script_value("BENCH_PACKAGES").split()]
    assert bench, "scripts/lock.sh: BENCH_PACKAGES is empty"
    assert {canonicalize_name(req.name) for req in bench} == no_deps
    for req in [*bench, Requirement(_lock_script_value("TORCH")), Requirement(_lock_script_value("UV"))]:
        assert str(pins[canonicalize_name(req.name)]) == str(req), f"scripts/lock.sh pins {req}: run it"
