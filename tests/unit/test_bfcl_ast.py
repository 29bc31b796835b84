"""BFCL-v4 single-turn categories: the checker shim, gold outputs through BFCL's checker, the aggregate, the harness."""

from __future__ import annotations

import json
import sys
from types import ModuleType

import pytest

pytest.importorskip("bfcl_eval")

from envace.benchmarks import bfcl_ast_checker  # noqa: E402
from envace.benchmarks.bfcl_ast import (  # noqa: E402
    AST_CATEGORIES,
    SINGLE_TURN,
    check_entry,
    decode_calls,
    evaluate_single_turn,
    load_single_turn,
    offline_aggregate,
)
from envace.benchmarks.bfcl_ast_checker import CHECKER_MODEL_NAME, load_checker  # noqa: E402
from envace.benchmarks.bfcl_ast_gold import GoldASTEngine, gold_calls, gold_output  # noqa: E402


def _one(category: str, entry_id: str):
    (entry,) = load_single_turn(category, ids=[entry_id])
    return entry


def _block(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# -- the checker -------------------------------------------------------------------------------------------------------


def test_the_checker_loads_without_model_sdks_and_leaves_sys_modules_as_it_was() -> None:
    load_checker()  # the checker's genuine dependencies are imported once, on first use
    load_checker.cache_clear()
    before = set(sys.modules)
    checker = load_checker()
    assert set(sys.modules) == before  # no stand-in, no private module, nothing a failed real import left behind
    assert callable(checker.ast_checker)
    assert not checker.MODEL_CONFIG_MAPPING[CHECKER_MODEL_NAME.replace("_", "/")].underscore_to_dot


def test_the_stand_in_is_present_only_while_the_checker_source_runs(monkeypatch) -> None:
    previous = ModuleType("bfcl_eval.constants.model_config")  # whatever was there must come back
    monkeypatch.setitem(sys.modules, "bfcl_eval.constants.model_config", previous)
    checker = bfcl_ast_checker._checker_from_source()
    assert sys.modules["bfcl_eval.constants.model_config"] is previous
    assert checker.__name__ not in sys.modules
    assert list(checker.MODEL_CONFIG_MAPPING) == ["Qwen/Qwen3-8B-FC"]  # the stand-in's one key
    monkeypatch.delitem(sys.modules, "bfcl_eval.constants.model_config")
    bfcl_ast_checker._checker_from_source()
    assert "bfcl_eval.constants.model_config" not in sys.modules


# -- entries -----------------------------------------------------------------------------------------------------------


def test_entries_carry_bfcls_chat_hinted_tools_and_the_checkers_docs() -> None:
    entry = _one("simple_python", "simple_python_0")
    assert entry.messages == ({"role": "user", "content": "Find the area of a triangle with a base of 10 units and "
                                                           "height of 5 units."},)  # FC mode: no system prompt
    (tool,) = entry.tools
    assert tool["type"] == "function" and tool["function"]["name"] == "calculate_triangle_area"
    assert tool["function"]["description"].endswith("Note that the provided function is in Python 3 syntax.")
    assert tool["function"]["parameters"]["type"] == "object"  # BFCL's "dict" as JSON Schema
    assert entry.answer == [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
    java = _one("simple_java", "simple_java_1")
    assert java.language == "java" and java.functions[0]["name"] == "SQLCompletionAnalyzer.makeProposalsFromObject"
    shown = java.tools[0]["function"]
    assert shown["name"] == java.functions[0]["name"]  # dotted names kept
    assert {p["type"] for p in shown["parameters"]["properties"].values()} == {"string"}  # the Java hint
    assert java.functions[0]["parameters"]["properties"]["params"]["type"] == "HashMap"  # the checker's doc
    assert _one("simple_javascript", "simple_javascript_0").language == "javascript"
    assert _one("irrelevance", "irrelevance_0").answer is None


def test_unknown_network_and_multi_turn_categories_are_refused_with_directions() -> None:
    with pytest.raises(ValueError, match="valid: simple_python, simple_java, simple_javascript, multiple"):
        load_single_turn("simple")
    with pytest.raises(ValueError, match="'web_search_base' is not run: it queries a live search API"):
        load_single_turn("web_search_base")
    with pytest.raises(ValueError, match="use envace.benchmarks.bfcl_data.load_multi_turn"):
        load_single_turn("multi_turn_base")
    with pytest.raises(ValueError, match=r"unknown live_simple id\(s\) \['live_simple_x'\]; live_simple has 258 ids, "
                                         r"e.g. live_simple_0-0-0"):
        load_single_turn("live_simple", ids=["live_simple_x"])
    assert [e.id for e in load_single_turn("parallel", limit=2)] == ["parallel_0", "parallel_1"]


# -- scoring -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("category", SINGLE_TURN)
def test_gold_outputs_pass_bfcls_checker(category: str) -> None:
    for entry in load_single_turn(category, limit=5):
        verdict = check_entry(entry, decode_calls(gold_output(entry)))
        assert verdict["valid"], (entry.id, verdict)


def test_gold_takes_the_first_allowed_values_and_writes_java_and_javascript_source() -> None:
    assert gold_calls(_one("simple_python", "simple_python_0")) == [
        {"calculate_triangle_area": {"base": 10, "height": 5, "unit": "units"}}]
    assert gold_calls(_one("simple_java", "simple_java_1")) == [{"SQLCompletionAnalyzer.makeProposalsFromObject": {
        "object": "Customers", "useShortName": "true",
        "params": 'new HashMap<String, Object>() {{ put("limit", 50); put("schemaFilter", "public"); }}'}}]
    assert gold_calls(_one("simple_javascript", "simple_javascript_1")) == [{"getActiveDataEntries": {
        "listElement": "listElement", "attribute": "data-active", "value": "true"}}]


def test_wrong_outputs_fail_bfcls_checker() -> None:
    entry = _one("simple_python", "simple_python_0")
    assert check_entry(entry, [{"calculate_triangle_area": {"base": 10, "height": 5}}])["valid"]  # unit may go
    missing = check_entry(entry, [{"calculate_triangle_area": {"base": 10}}])
    assert not missing["valid"] and missing["error_type"] == "simple_function_checker:missing_required"
    renamed = check_entry(entry, [{"triangle_area": {"base": 10, "height": 5}}])
    assert renamed["error_type"] == "simple_function_checker:wrong_func_name"
    assert check_entry(entry, [{"calculate_triangle_area": {"base": 11, "height": 5}}])["error_type"] == \
        "value_error:others"
    assert check_entry(entry, [])["error_type"] == "simple_function_checker:wrong_count"
    assert check_entry(entry, None)["error_type"] == "ast_decoder:decoder_failed"
    parallel = _one("parallel", "parallel_0")
    assert not check_entry(parallel, gold_calls(parallel)[1:])["valid"]
    assert check_entry(parallel, gold_calls(parallel)[::-1])["valid"]  # parallel calls match in any order
    java = _one("simple_java", "simple_java_1")
    calls = gold_calls(java)
    calls[0]["SQLCompletionAnalyzer.makeProposalsFromObject"]["useShortName"] = True  # not a Java source string
    assert check_entry(java, calls)["error_type"] == "type_error:java"


def test_irrelevance_wants_no_call_and_relevance_wants_one() -> None:
    irrelevant, relevant = _one("irrelevance", "irrelevance_0"), _one("live_relevance", "live_relevance_0-0-0")
    text, call = "I cannot do that with these tools.", _block(relevant.functions[0]["name"], {"prompt": "x"})
    listed = "<tool_call>\n" + json.dumps([{"name": "search_engine.query", "arguments": {"prompt": "x"}}]) + \
        "\n</tool_call>"
    assert decode_calls(text) == [] and decode_calls(call) == [{"search_engine.query": {"prompt": "x"}}]
    assert decode_calls(listed) is None  # a JSON list in one block: BFCL's decoder fails the output
    for output, expected in ((text, True), (call, False), (listed, True)):
        assert check_entry(irrelevant, decode_calls(output))["valid"] is expected, output
        assert check_entry(relevant, decode_calls(output))["valid"] is not expected, output
    assert check_entry(irrelevant, decode_calls(call))["error_type"] == "irrelevance_error:decoder_success"


def test_outputs_are_decoded_as_bfcls_own_decoder_for_the_format_decodes_them() -> None:
    """bfcl-eval's QwenFCHandler: blocks need newlines inside the tags, undecodable JSON bodies are skipped, a
    non-object in a block or arguments that are not an object fail the whole output (envace's tolerant parser read
    all of these differently)."""
    call = _block("f", {"x": 1})
    assert decode_calls(call + "\n<tool_call>\n{not json\n</tool_call>") == [{"f": {"x": 1}}]  # valid one kept
    assert decode_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>') == []  # no newlines
    assert decode_calls('<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>') is None  # AST wants an object
    assert decode_calls('<tool_call>\n{"name": "f"}\n</tool_call>') is None
    assert decode_calls("<think>" + call + "</think>\nNo call.") == []  # the reasoning is not the response


# -- the aggregate -----------------------------------------------------------------------------------------------------


def _accuracies() -> dict[str, float]:
    return {"simple_python": 0.9, "simple_java": 0.6, "simple_javascript": 0.3,  # simple = 0.6
            "multiple": 0.8, "parallel": 0.7, "parallel_multiple": 0.5,  # NonLive = (0.6+0.8+0.7+0.5)/4 = 0.65
            "live_simple": 0.5, "live_multiple": 1.0, "live_parallel": 0.0, "live_parallel_multiple": 0.25,
            "irrelevance": 0.8, "live_irrelevance": 0.6,  # Irrelevance = 0.7
            "multi_turn_base": 0.4, "multi_turn_miss_func": 0.2, "multi_turn_miss_param": 0.3,
            "multi_turn_long_context": 0.1,  # MultiTurn = 0.25
            "live_relevance": 0.75}


def test_offline_aggregate_on_hand_computed_numbers() -> None:
    counts = {"live_simple": 2, "live_multiple": 1, "live_parallel": 1, "live_parallel_multiple": 4}
    result = offline_aggregate(_accuracies(), counts)  # Live = (0.5*2 + 1.0 + 0 + 0.25*4) / 8 = 0.375
    assert result["simple"] == pytest.approx(0.6) and result["non_live"] == pytest.approx(0.65)
    assert result["live"] == pytest.approx(0.375) and result["irrelevance"] == pytest.approx(0.7)
    assert result["multi_turn"] == pytest.approx(0.25) and result["missing"] == []
    assert result["bfcl_offline"] == pytest.approx((6.5 + 3.75 + 7.0 + 7.5) / 60)
    assert result["live_relevance"] == 0.75 and "not BFCL-v4 overall" in result["note"]


def test_offline_aggregate_with_missing_parts_names_them_and_gives_no_total() -> None:
    accuracy = {k: v for k, v in _accuracies().items() if not k.startswith("multi_turn") and k != "simple_java"}
    counts = {"live_simple": 2, "live_multiple": 1, "live_parallel": 1, "live_parallel_multiple": 4}
    result = offline_aggregate(accuracy, counts)
    assert result["bfcl_offline"] is None and result["non_live"] is None and result["multi_turn"] is None
    assert result["missing"] == ["simple_java", "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                 "multi_turn_long_context"]
    assert result["live"] == pytest.approx(0.375) and result["irrelevance"] == pytest.approx(0.7)
    with pytest.raises(ValueError, match="give counts .* for live_parallel"):
        offline_aggregate(_accuracies(), {**counts, "live_parallel": 0})


# -- the harness -------------------------------------------------------------------------------------------------------


def _two_per_category() -> list:
    return [e for category in SINGLE_TURN for e in load_single_turn(category, limit=2)]


class _Recording:
    """Counts the prompts of each ``generate`` call of the engine it wraps."""

    def __init__(self, engine) -> None:
        self.engine, self.batches = engine, []

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return self.engine.generate(prompts, params)


def test_gold_outputs_score_one_through_generation_and_parsing(tiny_tokenizer) -> None:
    entries = _two_per_category()
    engine = _Recording(GoldASTEngine(entries, tiny_tokenizer))
    result = evaluate_single_turn(entries, engine, tiny_tokenizer, max_new_tokens=8, batch_size=10)
    assert result["accuracy"] == 1.0 and all(result["valid"].values())
    assert engine.batches == [10, 10, 6]
    assert result["counts"] == {c: 2 for c in SINGLE_TURN} and set(result["categories"].values()) == {1.0}
    assert result["outputs"]["simple_python_0"] == gold_output(entries[0])  # the stop token is not in the text
    assert set(AST_CATEGORIES) < set(result["categories"])


def test_entries_sharing_a_prompt_each_get_their_own_gold_answer(tiny_tokenizer) -> None:
    call, no_call = _one("live_simple", "live_simple_29-7-2"), _one("live_irrelevance", "live_irrelevance_118-7-8")
    assert (call.messages, call.tools) == (no_call.messages, no_call.tools)  # BFCL ships this prompt twice
    result = evaluate_single_turn([call, no_call], GoldASTEngine([call, no_call], tiny_tokenizer), tiny_tokenizer)
    assert result["valid"] == {call.id: True, no_call.id: True}


def test_a_tiny_random_policy_runs_every_category_deterministically(tiny_tokenizer) -> None:
    import torch

    from envace.engines.base import HFEngine
    from envace.policy.tiny import build_model

    model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=0, max_positions=4096)
    engine = HFEngine(model, pad_id=tiny_tokenizer.pad_token_id, stop_ids=[tiny_tokenizer.eos_token_id])
    entries = _two_per_category()
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        result = evaluate_single_turn(entries, engine, tiny_tokenizer, max_new_tokens=24, temperature=1.0,
                                      batch_size=len(entries))
        assert 0.0 <= result["accuracy"] <= 1.0
        assert all(0.0 <= a <= 1.0 for a in result["categories"].values())
        runs.append((result["valid"], result["outputs"]))
    assert runs[0] == runs[1]  # the same seed: the same outputs and the same verdicts
