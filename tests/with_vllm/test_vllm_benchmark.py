"""``benchmarks/rollout_efficiency.py --engine vllm`` on SmolLM2, with a tiny budget: it runs and reports its ratio
(the measured numbers are in docs/performance.md; speed is never asserted in tests)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

BENCH = Path(__file__).parents[2] / "benchmarks" / "rollout_efficiency.py"


def test_the_vllm_efficiency_benchmark_runs_and_prints_its_summary(smollm2_dir, capsys) -> None:
    spec = importlib.util.spec_from_file_location("rollout_efficiency", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rollout_efficiency"] = module
    spec.loader.exec_module(module)
    module.main(["--engine", "vllm", "--model", smollm2_dir, "--chat-template", "chatml-tools",
                 "--tasks", "builtin:bank-test:2", "--group-size", "2", "--repeats", "1",
                 "--act-max-new-tokens", "8", "--rehearse-max-new-tokens", "8", "--threads", "2"])
    out = capsys.readouterr().out
    assert "| envace rollout (vllm, continuous) | 4 |" in out
    exact = re.search(r"^\| raw vLLM generate, each episode's lengths \| 4 \| \d+ \| 1 \| (\d+) \|", out, re.M)
    rollout = re.search(r"^\| envace rollout \(vllm, continuous\) \| 4 \| \d+ \| \d+ \| (\d+) \|", out, re.M)
    assert exact is not None and rollout is not None
    assert exact.group(1) == rollout.group(1)  # the baseline generated exactly the rollout's tokens
    summary = re.search(r"^SUMMARY vllm_efficiency=(\S+) vllm_efficiency_mean_length=(\S+) "
                        r"vllm_efficiency_first_prompt=(\S+)$", out, re.M)
    assert summary is not None and float(summary.group(1)) > 0


def test_the_gpu_script_measures_the_vllm_engine_and_restarts_it_per_model(smollm2_dir, capsys) -> None:
    """The GPU script's path on CPU: sync, sleep/wake (a no-op without CUDA), close, and a second engine started in the
    same process for the next model (here the same directory twice)."""
    spec = importlib.util.spec_from_file_location("gpu_engines", BENCH.parent / "gpu_engines.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_engines"] = module
    spec.loader.exec_module(module)
    module.main(["--models", smollm2_dir, smollm2_dir, "--engines", "cached", "vllm", "--chat-template",
                 "chatml-tools", "--tasks", "builtin:bank-test:1", "--group-size", "2", "--act-max-new-tokens", "8",
                 "--rehearse-max-new-tokens", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    name = Path(smollm2_dir).name
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith(f"| {name} | vllm |")]
    assert len(rows) == 4  # two models, each a progress row and a table row
    for row in rows:
        tokens, rate, startup, sync = int(row[2]), float(row[3]), float(row[4]), float(row[5])
        assert tokens > 0 and rate > 0 and startup > 0 and sync > 0
    summary = re.search(r"^SUMMARY vllm_speedup=(\S+) vllm_sync_s=(\S+) models=2$", out, re.M)
    assert summary is not None and float(summary.group(1)) > 0 and float(summary.group(2)) > 0
