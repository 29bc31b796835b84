"""Generated perturbations of the raw text (``envace.benchmarks.parity_families``) score alike on both sides.

The seeded sample ``parity_generated.generated_cases`` is what ``benchmarks/harness_check.py`` counts; the hypothesis
tests draw their own through the same builders (reproducible under the default ``ci`` profile, new ones on every run
with ``HYPOTHESIS_PROFILE=dev``) and shrink a disagreement to its smallest form.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tau2")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from envace.benchmarks import bfcl_data, parity, parity_generated  # noqa: E402
from envace.benchmarks import parity_families as families  # noqa: E402

GENERATED = parity_generated.generated_cases()
EXPLORE = settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def test_at_least_100_generated_cases_per_benchmark_in_every_family() -> None:
    per_benchmark = Counter("bfcl" if c.benchmark.startswith("bfcl") else c.benchmark for c in GENERATED)
    assert per_benchmark["bfcl"] >= 100 and per_benchmark["tau2"] >= 100, per_benchmark
    for benchmark in ("bfcl_multi_turn", "bfcl_single_turn", "tau2"):
        kinds = {c.kind.split("_")[1] for c in GENERATED if c.benchmark == benchmark}
        assert kinds == set(families.FAMILIES), (benchmark, kinds)
    assert len({c.name for c in GENERATED}) == len(GENERATED)


def test_the_sample_is_the_same_on_every_run() -> None:
    assert [c.outputs for c in parity_generated.generated_cases()] == [c.outputs for c in GENERATED]


@pytest.mark.parametrize("case", GENERATED, ids=[c.name for c in GENERATED])
def test_envaces_verdict_is_the_official_one(case: parity.Case, tiny_tokenizer) -> None:
    verdict = parity.run_case(case, tiny_tokenizer)
    assert verdict.agree, verdict.describe()


def _draw(data: st.DataObject) -> families.Draw:
    return lambda options: data.draw(st.sampled_from(list(options)))


@EXPLORE
@given(data=st.data(), family=st.sampled_from(families.FAMILIES),
       entry_id=st.sampled_from(["multi_turn_base_0", "multi_turn_base_1"]))
def test_fresh_multi_turn_perturbations_agree(data: st.DataObject, family: str, entry_id: str,
                                              tiny_tokenizer) -> None:
    (entry,) = bfcl_data.load_multi_turn("multi_turn_base", ids=[entry_id])
    gold = parity._gold_turns(entry)
    turns = [[parity.blocks(turn)] if turn else [] for turn in gold]
    turns[0] = families.perturb(family, gold[0], _draw(data))
    case = parity.Case("bfcl_multi_turn", "multi_turn_base", entry_id, family,
                       parity._close(turns) + ("Done.",) * len(gold))
    verdict = parity.run_case(case, tiny_tokenizer)
    assert verdict.agree, verdict.describe()


@EXPLORE
@given(data=st.data(), family=st.sampled_from(families.FAMILIES), mode=st.sampled_from(["solo", "user"]))
def test_fresh_tau2_perturbations_agree(data: st.DataObject, family: str, mode: str, tiny_tokenizer) -> None:
    if mode == "solo":
        task = parity._solo_tasks()[0]
        (outputs,) = parity_generated.generated_solo_scripts(task, _draw(data), 1, (family,)).values()
        case = parity.Case("tau2", "telecom/solo", str(task.id), family, outputs)
    else:
        task = parity._user_tasks("retail")[0]
        ((outputs, user),) = parity_generated.generated_user_scripts(task, _draw(data), 1, (family,)).values()
        case = parity.Case("tau2", "retail/user", str(task.id), family, outputs, user=user)
    verdict = parity.run_case(case, tiny_tokenizer)
    assert verdict.agree, verdict.describe()
