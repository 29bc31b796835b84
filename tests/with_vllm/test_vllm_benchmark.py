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
    assert "| envace rollout (vllm) | 4 |" in out and "| raw vLLM generate, same lengths | 4 |" in out
    summary = re.search(r"^SUMMARY vllm_efficiency=(\S+) vllm_efficiency_first_prompt=(\S+)$", out, re.M)
    assert summary is not None and float(summary.group(1)) > 0
