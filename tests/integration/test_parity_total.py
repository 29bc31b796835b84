"""The parity sample is large enough to mean something: at least 200 cases across BFCL and tau^2."""

from __future__ import annotations

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tau2")

from envace.benchmarks import parity  # noqa: E402


def test_at_least_200_cases_across_both_benchmarks_and_every_mode() -> None:
    cases = parity.cases()
    assert len(cases) >= 200
    assert {c.benchmark for c in cases} == {"bfcl_multi_turn", "bfcl_single_turn", "tau2"}
    assert {c.category.split("/")[1] for c in cases if c.benchmark == "tau2"} == {"solo", "user"}
