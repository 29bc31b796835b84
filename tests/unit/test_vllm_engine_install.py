"""Without vLLM, ``VLLMEngine`` says how to install it (the engine's behaviour is tested in tests/with_vllm)."""

from __future__ import annotations

import importlib.util

import pytest

from envace.rollout.engine import Generation
from envace.rollout.vllm_engine import VLLMEngine


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_both_installs() -> None:
    with pytest.raises(ImportError, match=r"envace\[vllm\].*scripts/setup_vllm_env.sh"):
        VLLMEngine("models/any", stop_ids=[0])


def test_engines_that_report_no_logprobs_leave_them_unset() -> None:
    assert Generation([1, 2], True).logprobs is None
