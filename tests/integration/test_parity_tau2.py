"""envace's tau^2 rewards and termination reasons equal tau^2's own, case by case (``envace.benchmarks.parity``).

Every case is a scripted policy (and, in user mode, a scripted user) on one task: the gold actions or a perturbation
of a kind tau^2's loop treats specially. envace runs it through its harness (the rollout under tau^2's loop rules,
then tau^2's evaluators); ``tau2.run.run_task`` runs the same scripts as the models of its own agent and user
(``envace.benchmarks.official``: the Orchestrator, ``LLMSoloAgent``/``LLMAgent``, ``DummyUser``/``UserSimulator``
and ``evaluate_simulation`` run as shipped, litellm stubbed).
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("tau2")

from envace.benchmarks import parity, tau2  # noqa: E402

CASES = parity.tau2_cases()


def test_the_cases_cover_every_offline_domain_mode_and_kind_of_ending() -> None:
    categories = Counter(c.category for c in CASES)
    assert set(categories) == {"telecom/solo"} | {f"{d}/user" for d in tau2.DOMAINS}
    assert {"gold", "plain_text_ending", "stop_token_in_text", "missing_action", "done_with_another_call",
            "text_first", "too_many_errors", "step_limit", "stop_on_the_limit_step", "error_limit",
            "agent_writes_stop_token", "user_never_stops", "unknown_tool"} <= {c.kind for c in CASES}
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_envaces_verdict_is_the_official_one(case: parity.Case, tiny_tokenizer) -> None:
    verdict = parity.run_case(case, tiny_tokenizer)
    assert verdict.agree, verdict.describe()


def test_the_verdicts_are_not_all_alike(tiny_tokenizer) -> None:
    """Gold scores 1 and the endings tau^2 scores 0 occur on both sides: a sample that cannot tell the harnesses
    apart proves nothing."""
    solo = next(c.entry_id for c in CASES if c.category == "telecom/solo")
    sample = [c for c in CASES if c.entry_id == solo]
    verdicts = {c.name: parity.run_case(c, tiny_tokenizer) for c in sample}
    assert all(v.official == 1.0 and v.envace == 1.0 for n, v in verdicts.items() if n.endswith("/gold"))
    assert {"agent_stop", "agent_error", "max_steps", "too_many_errors"} <= {v.official_detail
                                                                           for v in verdicts.values()}
    assert any(v.official == 0.0 and v.official_detail == "agent_stop" for v in verdicts.values())
