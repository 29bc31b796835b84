"""Without vLLM, ``VLLMEngine`` says how to install it (the engine's behaviour is tested in tests/with_vllm)."""

from __future__ import annotations

import importlib.util

import pytest

from envace.engines.base import Generation
from envace.engines.vllm_engine import VLLMEngine


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_both_installs() -> None:
    with pytest.raises(ImportError, match=r"envace\[vllm\].*scripts/setup_vllm_env.sh"):
        VLLMEngine("models/any", stop_ids=[0])


def test_engines_that_report_no_logprobs_leave_them_unset() -> None:
    assert Generation([1, 2], True).logprobs is None


def test_the_efficiency_benchmark_refuses_vllm_without_a_checkpoint(capsys) -> None:
    import importlib.util as util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "rollout_efficiency.py"
    spec = util.spec_from_file_location("rollout_efficiency_cli", path)
    module = util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit):
        module.main(["--engine", "vllm"])
    assert "--engine vllm needs a checkpoint directory" in capsys.readouterr().err
