"""envace's BFCL verdicts equal bfcl-eval's own runner, case by case (``envace.benchmarks.parity``).

Every case is a scripted policy on one entry: a gold answer or a perturbation of a kind the official loop treats
specially. envace scores it through its harness (the rollout under BFCL's loop rules, then its scoring); bfcl-eval's
``evaluate_task`` (its QwenFC decoder, its multi-turn and AST checkers) scores envace's episodes written as official
result files. Model SDKs that bfcl-eval imports only for inference are stubbed (``envace.benchmarks.official``); its
runner, decoder and checkers run as shipped. ``test_parity_tau2.py`` does the same for tau^2.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("bfcl_eval")

from envace.benchmarks import bfcl_ast, bfcl_data, parity  # noqa: E402

CASES = parity.multi_turn_cases() + parity.single_turn_cases()


def test_the_cases_cover_every_category_and_kind_of_perturbation() -> None:
    categories = Counter(c.category for c in CASES)
    assert set(bfcl_data.MULTI_TURN) | set(bfcl_ast.SINGLE_TURN) == set(categories)
    multi = {c.kind for c in CASES if c.benchmark == "bfcl_multi_turn"}
    assert {"gold", "wrong_value", "missing_call", "extra_call", "order", "twenty_steps", "over_long_turn",
            "over_long_last_turn", "excluded_function", "held_back_function", "unknown_function",
            "off_format_no_newlines", "off_format_json_list", "off_format_valid_then_malformed",
            "plain_text_ending"} <= multi
    single = {c.kind for c in CASES if c.benchmark == "bfcl_single_turn"}
    assert {"gold", "wrong_value", "missing_call", "extra_call", "off_format_no_newlines", "off_format_json_list",
            "off_format_valid_then_malformed", "plain_text", "a_call"} <= single
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_envaces_verdict_is_the_official_one(case: parity.Case, tiny_tokenizer) -> None:
    verdict = parity.run_case(case, tiny_tokenizer)
    assert verdict.agree, verdict.describe()


def test_the_verdicts_are_not_all_alike(tiny_tokenizer) -> None:
    """Gold passes and perturbations fail on both sides: a sample that cannot tell the harnesses apart proves
    nothing."""
    sample = [c for c in CASES if c.entry_id in ("multi_turn_base_0", "simple_python_0", "irrelevance_0")]
    verdicts = {c.name: parity.run_case(c, tiny_tokenizer) for c in sample}
    for name, verdict in verdicts.items():
        if name.endswith("/gold"):
            assert verdict.official == 1.0 and verdict.envace == 1.0, name
    failures = {v.official_detail for v in verdicts.values() if v.official == 0.0}
    assert {"multi_turn:force_terminated", "multi_turn:instance_state_mismatch", "irrelevance_error:decoder_success",
            "ast_decoder:decoder_failed"} <= failures, failures
