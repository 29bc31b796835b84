"""FinMCP-Bench teacher-forced policy evaluation, on synthetic records written in FinMCP's real schema."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from envace.benchmarks.finmcp import FinMCPRecord, load_finmcp, parse_record
from envace.benchmarks.finmcp_eval import (
    evaluate_finmcp,
    infer_tool_schemas,
    load_tool_schemas,
    normalised_messages,
    step_prompts,
    teacher_forced_steps,
)
from envace.engines.base import Generation, SamplingParams
from envace.policy.chat import decode, encode

# -- synthetic records (made-up content, FinMCP's field layout) ------------------------------------------------------


def _call(name: str, arguments: Any, call_id: str = "call_x") -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _raw_multi_step() -> dict[str, Any]:
    """Two steps: one call, then two parallel calls, then the final answer."""
    return {
        "id": 7, "scenery": "投资组合分析-基金诊断-持仓分析",
        "diff_level": {"turns": 1, "tool_number": 3, "para_tool_call_number": 1, "level": "medium"},
        "tool_list": [["SearchFund"], ["GetFundNav", "GetFundManager"]],
        "question": "帮我看看示例基金A的净值和经理", "answer": "示例基金A的净值是1.23，经理是张三。",
        "messages": [
            {"role": "user", "content": "帮我看看示例基金A的净值和经理\n当前用户id是r7marker"},
            {"role": "assistant", "content": "", "tool_calls": [_call("SearchFund", {"keyword": "示例基金A"})]},
            {"role": "tool", "content": "{\"success\": true, \"data\": {\"code\": \"000001\"}}"},
            {"role": "assistant", "tool_calls": [_call("GetFundNav", {"code": "000001", "days": 5}, "c1"),
                                                 _call("GetFundManager", {"code": "000001"}, "c2")]},
            {"role": "tool", "content": "{\"nav\": 1.23}"},
            {"role": "tool", "content": "{\"manager\": \"张三\"}"},
            {"role": "assistant", "content": "示例基金A的净值是1.23，经理是张三。"},
        ],
        "annotation": {"最终分数": 1}, "first-class": "投资组合分析", "sub-class": "基金诊断", "task": "multi step",
    }


def _raw_multi_turn() -> dict[str, Any]:
    """Two user turns: a call then an answer, then a second call then an answer."""
    return {
        "id": "mt-1", "scenery": "市场分析与研究-宏观经济-市场环境研判",
        "diff_level": {"turns": 2, "tool_number": 2, "para_tool_call_number": 0, "level": "easy"},
        "tool_list": [["SearchFinancialNews"], ["GetIndexQuote"]],
        "messages": [
            {"role": "system", "content": "You are a finance assistant."},
            {"role": "user", "content": "What is the market mood today? user mtmarker"},
            {"role": "assistant", "tool_calls": [_call("SearchFinancialNews", {"keyword": "market", "limit": 3,
                                                                                "recent": True})]},
            {"role": "tool", "content": "{\"items\": [{\"title\": \"Stocks calm\"}]}"},
            {"role": "assistant", "content": "The market is calm."},
            {"role": "user", "content": "And the main index?"},
            {"role": "assistant", "tool_calls": [_call("GetIndexQuote", {"index": "CSI300", "ratio": 0.5})]},
            {"role": "tool", "content": "{\"last\": 3900.5}"},
            {"role": "assistant", "content": "It is at 3900.5."},
        ],
        "task": "multi turn",
    }


@pytest.fixture
def records() -> list[FinMCPRecord]:
    return [parse_record(_raw_multi_step(), "r[0]"), parse_record(_raw_multi_turn(), "r[1]")]


# -- teacher-forced steps --------------------------------------------------------------------------------------------


def test_teacher_forced_steps_of_a_multi_step_record(records) -> None:
    steps = teacher_forced_steps(records[0])
    assert [gold for _, gold in steps] == [("SearchFund",), ("GetFundNav", "GetFundManager"), ()]
    assert [len(prefix) for prefix, _ in steps] == [1, 3, 6]
    prefix = steps[2][0]
    assert prefix[0] == {"role": "user", "content": "帮我看看示例基金A的净值和经理\n当前用户id是r7marker"}
    # the gold calls of earlier steps, arguments decoded to dicts, call ids dropped, missing content empty
    assert prefix[3] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "GetFundNav", "arguments": {"code": "000001", "days": 5}}},
        {"type": "function", "function": {"name": "GetFundManager", "arguments": {"code": "000001"}}}]}
    # the recorded tool responses, verbatim
    assert [m["content"] for m in prefix if m["role"] == "tool"] == [
        "{\"success\": true, \"data\": {\"code\": \"000001\"}}", "{\"nav\": 1.23}", "{\"manager\": \"张三\"}"]
    assert steps[1][0] == prefix[:3]  # each prefix extends the previous one


def test_teacher_forced_steps_of_a_multi_turn_record(records) -> None:
    steps = teacher_forced_steps(records[1])
    assert [gold for _, gold in steps] == [("SearchFinancialNews",), (), ("GetIndexQuote",), ()]
    assert [len(prefix) for prefix, _ in steps] == [2, 4, 6, 8]
    assert [m["role"] for m in steps[2][0]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert steps[2][0][4] == {"role": "assistant", "content": "The market is calm."}  # the gold answer of turn 1


def test_malformed_gold_arguments_are_kept_raw_and_a_nameless_call_names_the_message() -> None:
    raw = _raw_multi_step()
    raw["messages"][1]["tool_calls"] = [_call("SearchFund", "{keyword: 示例")]
    (_, first), (prefix, _) = teacher_forced_steps(parse_record(raw, "x"))[:2]
    assert first == ("SearchFund",)
    assert prefix[1]["tool_calls"][0]["function"]["arguments"] == {"_raw": "{keyword: 示例"}
    raw["messages"][3]["tool_calls"][1] = {"type": "function", "function": {"arguments": "{}"}}
    with pytest.raises(ValueError, match="record 7, message 3, tool call 1: .*'name'"):
        teacher_forced_steps(parse_record(raw, "x"))


# -- tool schemas ----------------------------------------------------------------------------------------------------


def test_schemas_inferred_from_gold_calls(records) -> None:
    schemas = infer_tool_schemas(records)
    assert list(schemas) == ["SearchFund", "GetFundNav", "GetFundManager", "SearchFinancialNews", "GetIndexQuote"]
    assert schemas["GetFundNav"] == {"type": "function", "function": {"name": "GetFundNav", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}, "days": {"type": "integer"}}}}}
    news = schemas["SearchFinancialNews"]["function"]["parameters"]
    assert news["properties"] == {"keyword": {"type": "string"}, "limit": {"type": "integer"},
                                  "recent": {"type": "boolean"}} and "required" not in news
    assert schemas["GetIndexQuote"]["function"]["parameters"]["properties"]["ratio"] == {"type": "number"}


def test_inferred_types_merge_across_calls() -> None:
    raw = _raw_multi_step()
    raw["messages"][3]["tool_calls"][0] = _call("GetFundNav", {"code": 1, "days": 2.5})  # vs "000001" and 5
    raw["messages"][1]["tool_calls"] = [_call("SearchFund", "not json")]
    schemas = infer_tool_schemas([parse_record(raw, "x"), parse_record(_raw_multi_step() | {"id": 8}, "y")])
    assert schemas["GetFundNav"]["function"]["parameters"]["properties"] == {
        "code": {"type": ["integer", "string"]}, "days": {"type": "number"}}
    # the malformed call adds no property; the well-formed one of the other record does
    assert schemas["SearchFund"]["function"]["parameters"]["properties"] == {"keyword": {"type": "string"}}


def test_tools_file_loader(tmp_path) -> None:
    path = tmp_path / "tools.json"
    keyword = {"type": "object", "properties": {"keyword": {"type": "string"}}, "required": ["keyword"]}
    path.write_text(json.dumps([
        {"type": "function", "function": {"name": "SearchFund", "description": "Find a fund.", "parameters": keyword}},
        {"name": "GetFundNav", "inputSchema": {"type": "object", "properties": {"code": {"type": "string"}}}},
    ]))
    schemas = load_tool_schemas(path)
    assert list(schemas) == ["SearchFund", "GetFundNav"]
    assert schemas["SearchFund"]["function"]["parameters"]["required"] == ["keyword"]
    assert schemas["GetFundNav"] == {"type": "function", "function": {"name": "GetFundNav", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}}}}


@pytest.mark.parametrize(("content", "message"), [
    ([{"name": "A"}, {"description": "no name"}], r"tools\.json\[1\]: a tool schema needs a non-empty string 'name'"),
    ([{"name": "A"}, {"name": "A"}], r"tools\.json\[1\]: duplicate tool 'A' \(first at index 0\)"),
    ([{"name": "A", "parameters": {"type": "array"}}], r"tools\.json\[0\]: tool 'A': 'parameters' must be"),
    ([{"name": "A"}, "SearchFund"], r"tools\.json\[1\]: a tool schema must be a JSON object"),
    ({"name": "A"}, r"tools\.json: expected a JSON list of tool schemas"),
])
def test_tools_file_errors_name_the_file_and_index(tmp_path, content, message) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        load_tool_schemas(path)


def test_per_record_tools_are_kept_and_validated(tmp_path) -> None:
    raw = _raw_multi_step() | {"tools": [{"type": "function", "function": {"name": "SearchFund"}}]}
    path = tmp_path / "records.json"
    path.write_text(json.dumps([raw], ensure_ascii=False))
    (record,) = load_finmcp(path)
    assert record.tools == ({"type": "function", "function": {"name": "SearchFund", "parameters": {
        "type": "object", "properties": {}}}},)
    assert parse_record(_raw_multi_step(), "x").tools == ()
    with pytest.raises(ValueError, match=r"records\.json\[0\]: 'tools'\[0\]: a tool schema needs"):
        path.write_text(json.dumps([raw | {"tools": [{"function": {}}]}]))
        load_finmcp(path)


# -- scripted engines ------------------------------------------------------------------------------------------------

_MARKER = re.compile(r"r7marker|mtmarker")


def _calls_text(*names_and_arguments: tuple[str, dict[str, Any]]) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
                     for n, a in names_and_arguments)


class KeyedEngine:
    """Answers each prompt by (record marker, step index); the step index counts the prompt's assistant headers."""

    def __init__(self, tokenizer: Any, answers: dict[tuple[str, int], str]) -> None:
        self.tokenizer, self.answers = tokenizer, answers
        self.batches: list[int] = []
        self.params: list[SamplingParams] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.batches.append(len(prompts))
        self.params.append(params)
        out = []
        for prompt in prompts:
            text = decode(self.tokenizer, prompt)
            key = (_MARKER.search(text).group(0), text.count("<|im_start|>assistant") - 1)
            out.append(Generation(encode(self.tokenizer, self.answers[key]) + [self.tokenizer.eos_token_id], True))
        return out


def _gold_answers() -> dict[tuple[str, int], str]:
    return {
        ("r7marker", 0): _calls_text(("SearchFund", {"keyword": "示例基金A"})),
        ("r7marker", 1): _calls_text(("GetFundManager", {"code": "000001"}), ("GetFundNav", {"code": "000001"})),
        ("r7marker", 2): "示例基金A的净值是1.23。",
        ("mtmarker", 0): _calls_text(("SearchFinancialNews", {"keyword": "market"})),
        ("mtmarker", 1): "Calm.",
        ("mtmarker", 2): _calls_text(("GetIndexQuote", {"index": "CSI300"})),
        ("mtmarker", 3): "3900.5.",
    }


def test_a_policy_answering_the_gold_calls_scores_one(records, tiny_tokenizer) -> None:
    engine = KeyedEngine(tiny_tokenizer, _gold_answers())
    result = evaluate_finmcp(records, engine, tiny_tokenizer, batch_size=3, max_new_tokens=64)
    scores = result["scores"]
    assert scores.macro["f1"] == scores.macro["exact_match"] == scores.micro["f1"] == 1.0
    assert result["predictions"] == {"7": [["SearchFund"], ["GetFundManager", "GetFundNav"]],
                                     "mt-1": [["SearchFinancialNews"], ["GetIndexQuote"]]}
    assert (result["steps"], result["generated"], result["overflow"], result["parse_errors"]) == (7, 7, 0, 0)
    assert engine.batches == [3, 3, 1]  # 7 steps in batches of 3
    assert engine.params[0] == SamplingParams(max_new_tokens=64, temperature=0.0, top_p=1.0)
    assert result["schema_source"] == "inferred" and result["schema_sources"] == {"inferred": 2}
    assert result["outputs"]["mt-1"][1] == "Calm."  # decoded without the stop token


def test_a_wrong_tool_and_an_extra_final_call_hand_computed(records, tiny_tokenizer) -> None:
    answers = _gold_answers()
    answers["r7marker", 1] = _calls_text(("GetFundNav", {"code": "000001"}), ("GetFundRating", {"code": "000001"}))
    answers["mtmarker", 3] = "3900.5." + _calls_text(("GetIndexQuote", {"index": "CSI500"}))
    answers["mtmarker", 1] = "<tool_call>\n{broken\n</tool_call>"  # malformed: no tool, counted
    result = evaluate_finmcp(records, KeyedEngine(tiny_tokenizer, answers), tiny_tokenizer)
    assert result["predictions"] == {"7": [["SearchFund"], ["GetFundNav", "GetFundRating"]],
                                     "mt-1": [["SearchFinancialNews"], ["GetIndexQuote"], ["GetIndexQuote"]]}
    assert result["parse_errors"] == 1
    scores = result["scores"]
    # record 7: P = {Search, Nav, Rating}, G = {Search, Nav, Manager}: matched 2, TP = TR = TF1 = 2/3, EMR 0
    # record mt-1: P = {News, Quote, Quote}, G = {News, Quote}: matched 2, TP = 2/3, TR = 1, TF1 = 0.8, EMR 0
    # macro: TP = (2/3 + 2/3) / 2 = 2/3, TR = (2/3 + 1) / 2 = 5/6, TF1 = (2/3 + 0.8) / 2 = 11/15, EMR = 0
    assert scores.macro["precision"] == pytest.approx(2 / 3) and scores.macro["recall"] == pytest.approx(5 / 6)
    assert scores.macro["f1"] == pytest.approx(11 / 15) and scores.macro["exact_match"] == 0.0
    # micro: matched 4, predicted 6, gold 5: P = 2/3, R = 4/5, F1 = 2 * (2/3) * (4/5) / (2/3 + 4/5) = 8/11
    assert scores.micro["precision"] == pytest.approx(2 / 3) and scores.micro["recall"] == pytest.approx(4 / 5)
    assert scores.micro["f1"] == pytest.approx(8 / 11)
    assert scores.groups["task:multi step"]["macro"]["f1"] == pytest.approx(2 / 3)


def test_long_prompts_are_skipped_and_predict_nothing(records, tiny_tokenizer) -> None:
    lengths: list[int] = []

    class Measuring(KeyedEngine):
        def generate(self, prompts, params):
            lengths.extend(len(p) for p in prompts)
            return super().generate(prompts, params)

    full = evaluate_finmcp(records, Measuring(tiny_tokenizer, _gold_answers()), tiny_tokenizer)
    positions = [(r.id, k, gold) for r in records for k, (_, gold) in enumerate(teacher_forced_steps(r))]
    record, k, gold = positions[lengths.index(max(lengths))]
    assert gold == () and len(set(lengths)) == 7  # the longest prompt is a final-answer step's
    result = evaluate_finmcp(records, KeyedEngine(tiny_tokenizer, _gold_answers()), tiny_tokenizer,
                             max_prompt_tokens=max(lengths) - 1)
    assert (result["overflow"], result["generated"], result["steps"]) == (1, 6, 7)
    assert result["outputs"][record][k] is None and full["outputs"][record][k] is not None
    assert result["scores"].macro["f1"] == 1.0  # the skipped step was a final answer: nothing predicted, nothing lost
    calls_only = evaluate_finmcp(records, KeyedEngine(tiny_tokenizer, _gold_answers()), tiny_tokenizer,
                                 max_prompt_tokens=min(lengths) - 1)
    assert calls_only["overflow"] == 7 and calls_only["scores"].macro["recall"] == 0.0  # nothing predicted


def test_step_prompts_match_prompt_stream_and_render_parallel_responses(records, tiny_tokenizer) -> None:
    from envace.engines.stream import prompt_stream
    from envace.policy.chat import render

    tools = list(infer_tool_schemas(records).values())
    messages = normalised_messages(records[1])  # no parallel calls: the same ids as envace's prompt streams
    ends = [2, 4, 6, 8]
    assert step_prompts(tiny_tokenizer, messages, tools, ends) == [
        prompt_stream(tiny_tokenizer, messages[:end], tools).ids for end in ends]
    messages = normalised_messages(records[0])  # two consecutive tool messages, one template block
    (last,) = step_prompts(tiny_tokenizer, messages, tools, [6])
    assert decode(tiny_tokenizer, last) == render(tiny_tokenizer, messages[:6], tools, add_generation_prompt=True)
    assert decode(tiny_tokenizer, last).count("<tool_response>") == 3


def test_caller_and_record_schemas_are_shown_and_reported(records, tiny_tokenizer) -> None:
    seen: list[str] = []

    class Recorder(KeyedEngine):
        def generate(self, prompts, params):
            seen.extend(decode(self.tokenizer, p) for p in prompts)
            return super().generate(prompts, params)

    tools = {"SearchFund": {"type": "function", "function": {"name": "SearchFund", "description": "查找基金 desc",
                                                             "parameters": {"type": "object", "properties": {}}}}}
    result = evaluate_finmcp(records, Recorder(tiny_tokenizer, _gold_answers()), tiny_tokenizer, tools=tools)
    assert result["schema_source"] == "caller" and all("查找基金 desc" in text for text in seen)
    assert all("GetIndexQuote\", \"parameters" not in text for text in seen)  # only the caller's tools are listed
    seen.clear()
    own = parse_record(_raw_multi_step() | {"tools": [{"name": "OwnTool", "description": "own desc"}]}, "x")
    result = evaluate_finmcp([own, records[1]], Recorder(tiny_tokenizer, _gold_answers()), tiny_tokenizer)
    assert result["schema_source"] == "mixed" and result["schema_sources"] == {"record": 1, "inferred": 1}
    assert sum("own desc" in text for text in seen) == 3 and sum("\"name\": \"GetIndexQuote\"" in t for t in seen) >= 4
    with pytest.raises(ValueError, match=r"tools\['X'\]: the schema is named 'SearchFund'"):
        evaluate_finmcp(records, Recorder(tiny_tokenizer, {}), tiny_tokenizer, tools={"X": tools["SearchFund"]})


def test_records_that_cannot_be_teacher_forced_are_refused(records, tiny_tokenizer) -> None:
    engine = KeyedEngine(tiny_tokenizer, {})
    with pytest.raises(ValueError, match=r"record\(s\) \['9'\] have no gold assistant message"):
        evaluate_finmcp([FinMCPRecord("9", (("A",),))], engine, tiny_tokenizer)
    with pytest.raises(ValueError, match="duplicate record id"):
        evaluate_finmcp([records[0], records[0]], engine, tiny_tokenizer)
    headless = FinMCPRecord("h", (), ({"role": "assistant", "content": "hi"},))
    with pytest.raises(ValueError, match=r"record\(s\) \['h'\] open with an assistant message"):
        evaluate_finmcp([headless], engine, tiny_tokenizer)
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_finmcp(records, engine, tiny_tokenizer, batch_size=0)


# -- the tiny random policy end to end -------------------------------------------------------------------------------


def test_a_tiny_random_policy_runs_end_to_end_deterministically(records, tiny_tokenizer) -> None:
    import torch

    from envace.engines.base import HFEngine
    from envace.policy.tiny import build_model

    model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=0, max_positions=4096)
    engine = HFEngine(model, pad_id=tiny_tokenizer.pad_token_id, stop_ids=[tiny_tokenizer.eos_token_id])
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        result = evaluate_finmcp(records, engine, tiny_tokenizer, max_new_tokens=8, temperature=1.0, batch_size=4)
        scores = result["scores"]
        assert all(0.0 <= v <= 1.0 for v in [*scores.macro.values(), *scores.micro.values()])
        assert result["generated"] == result["steps"] == 7 and result["truncated"] <= 7
        runs.append((result["outputs"], result["predictions"], scores.macro))
    assert runs[0] == runs[1]  # the same seed: the same generations and the same scores
