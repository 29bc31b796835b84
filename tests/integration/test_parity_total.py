"""The parity sample is large enough to mean something: at least 600 cases across BFCL and tau^2, at least 100 of
them generated per benchmark."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tau2")

from envace.benchmarks import parity_generated  # noqa: E402


def test_at_least_600_cases_across_both_benchmarks_and_every_mode() -> None:
    cases = parity_generated.all_cases()
    assert len(cases) >= 600
    assert {c.benchmark for c in cases} == {"bfcl_multi_turn", "bfcl_single_turn", "tau2"}
    assert {c.category.split("/")[1] for c in cases if c.benchmark == "tau2"} == {"solo", "user"}
    generated = Counter(c.benchmark.split("_")[0] for c in cases if c.kind.startswith("gen_"))
    assert generated["bfcl"] >= 100 and generated["tau2"] >= 100, generated
    assert len({c.name for c in cases}) == len(cases)
