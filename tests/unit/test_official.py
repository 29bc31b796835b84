"""The official runners as ``envace.benchmarks.official`` runs them: stubs that do not outlive the import, fresh
checker state per evaluation, and errors for malformed input instead of a verdict."""

from __future__ import annotations

import importlib.util
import sys

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tau2")

from envace.benchmarks import official, official_tau2, parity, tau2  # noqa: E402


def test_sdk_stand_ins_are_gone_after_the_official_code_imports() -> None:
    official.bfcl_runner()
    official.tau2_official()
    for name in ("openai", "anthropic", "litellm"):
        module = sys.modules.get(name)
        assert module is None or not isinstance(module, official._StubModule), name
        if importlib.util.find_spec(name) is None:  # absent here: importing it still fails, as before
            with pytest.raises(ImportError):
                importlib.import_module(name)


def test_only_the_named_sdks_are_stubbed() -> None:
    with official.official_imports(), pytest.raises(ImportError):
        importlib.import_module("envace_no_such_module")


def test_each_evaluation_starts_from_the_entrys_initial_state(tiny_tokenizer) -> None:
    """BFCL's checker caches an entry's API instances per process; a perturbed run of an entry must not leave its
    state behind for the next evaluation of the same entry (a fresh BFCL run evaluates each entry once)."""
    cases = {c.kind: c for c in parity.multi_turn_cases(1) if c.entry_id == "multi_turn_base_0"}
    assert parity.run_case(cases["wrong_value"], tiny_tokenizer).official == 0.0  # it changed the file system
    assert parity.run_case(cases["gold"], tiny_tokenizer).official == 1.0
    assert parity.run_case(cases["gold"], tiny_tokenizer).official == 1.0


def test_duplicate_ids_are_refused() -> None:
    result = {"id": "simple_python_0", "result": "I cannot help."}
    with pytest.raises(ValueError, match="duplicate ids"):
        official.bfcl_official_verdicts("simple_python", [result, result])


def test_a_script_that_runs_out_is_an_error_not_a_verdict() -> None:
    task = tau2.load_tasks("telecom", "base")[0]
    actions = task.evaluation_criteria.actions
    script = [parity.block(actions[0].name, dict(actions[0].arguments))]
    with pytest.raises(official.ScriptExhausted, match="ran out after 1 messages"):
        official_tau2.tau2_official_run(task, "telecom", True, script)


def test_a_solo_text_message_is_a_failed_run() -> None:
    """tau^2's ``LLMSoloAgent`` raises on a message without tool calls; ``run_tasks`` scores the failed run 0 with
    ``agent_error``, ``###STOP###`` in the text or not."""
    task = tau2.load_tasks("telecom", "base")[0]
    assert official_tau2.tau2_official_run(task, "telecom", True, ["###STOP###"]) == (0.0, "agent_error")
    assert official_tau2.tau2_official_run(task, "telecom", True, [parity.block("done", {})]) == (0.0, "agent_stop")


def test_the_bfcl_inference_loop_reads_the_raw_text_itself() -> None:
    """The official side decodes the scripted generations with its own handler: a block without the newlines its
    regex needs is plain text to it (the turn ends), whatever envace's decoder reads."""
    compact = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    result = official.bfcl_official_result("multi_turn_base", "multi_turn_base_0", [compact] + ["Done."] * 8)
    assert result["result"][0] == [compact]  # one step: the generation ended the first turn
    with pytest.raises(official.ScriptExhausted, match="ran out after 1 generations"):
        official.bfcl_official_result("multi_turn_base", "multi_turn_base_0", [compact])
