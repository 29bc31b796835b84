"""pass^k, pass@k and the FinMCP-Bench metrics, on hand-computed values and synthetic records in FinMCP's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.benchmarks import load_finmcp, pass_at_k, pass_hat_k, score_finmcp, tool_scores
from envace.benchmarks.finmcp import FinMCPRecord, predicted_grouping

# -- pass^k ------------------------------------------------------------------------------------------------------------


def test_pass_hat_k_hand_values() -> None:
    # n = 4, c = 2, k = 2: C(2,2) / C(4,2) = 1/6 (the example of docs/benchmarks.md)
    assert pass_hat_k([[True, True, False, False]], 2) == pytest.approx(1 / 6)
    # two tasks, n = 4: c = 3 -> C(3,2)/C(4,2) = 3/6; c = 4 -> 1; mean 0.75
    tasks = [[True, True, True, False], [True] * 4]
    assert pass_hat_k(tasks, 2) == pytest.approx(0.75)
    # k = 1 is the mean success rate: (3/4 + 4/4) / 2
    assert pass_hat_k(tasks, 1) == pytest.approx(0.875) == pass_at_k(tasks, 1)
    # k = n: every trial must succeed
    assert pass_hat_k(tasks, 4) == pytest.approx(0.5)


def test_pass_at_k_hand_values() -> None:
    # n = 4, c = 1, k = 2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; c = 0: 0
    assert pass_at_k([[True, False, False, False], [False] * 4], 2) == pytest.approx(0.25)


@pytest.mark.parametrize(("trials", "k", "message"), [
    ([[True]], 0, "k must be >= 1"), ([], 1, "no tasks"), ([[True, False], [True]], 2, "task 1 has 1 trials"),
])
def test_pass_k_refuses_bad_input(trials, k, message) -> None:
    with pytest.raises(ValueError, match=message):
        pass_hat_k(trials, k)


# -- FinMCP tool metrics -----------------------------------------------------------------------------------------------


def test_tool_scores_hand_values() -> None:
    gold = [["SearchFinancialNews"], ["GetFundInfo", "GetFundNav"]]
    # predicted multiset {Search, GetFundInfo, GetFundInfo}: matched 2 (GetFundInfo counts once); P = 2/3, R = 2/3
    s = tool_scores([["SearchFinancialNews", "GetFundInfo"], ["GetFundInfo"]], gold)
    assert (s.matched, s.predicted, s.gold) == (2, 3, 3)
    assert s.precision == pytest.approx(2 / 3) and s.recall == pytest.approx(2 / 3) and s.f1 == pytest.approx(2 / 3)
    assert s.exact_match == 0.0 and s.consist == 0.0
    # the right groups with the parallel pair swapped: EMR 1 (order inside a step ignored), consist 0 (ordered)
    swapped = tool_scores([["SearchFinancialNews"], ["GetFundNav", "GetFundInfo"]], gold)
    assert (swapped.exact_match, swapped.consist, swapped.f1) == (1.0, 0.0, 1.0)
    # the same names regrouped into one step: F1 1, EMR 0, consist 1 (the flattened order is the gold one)
    flat = tool_scores([["SearchFinancialNews", "GetFundInfo", "GetFundNav"]], gold)
    assert (flat.f1, flat.exact_match, flat.consist) == (1.0, 0.0, 1.0)


def test_tool_scores_empty_cases() -> None:
    assert tool_scores([], []).f1 == 1.0 and tool_scores([], []).exact_match == 1.0  # nothing to call, nothing called
    none = tool_scores([], [["A"]])
    assert (none.precision, none.recall, none.f1, none.exact_match) == (0.0, 0.0, 0.0, 0.0)
    extra = tool_scores([["A"]], [])
    assert (extra.precision, extra.recall, extra.f1) == (0.0, 0.0, 0.0)


def record(rid: str, tool_list: list[list[str]], task: str, level: str) -> FinMCPRecord:
    return FinMCPRecord(rid, tuple(tuple(s) for s in tool_list), (), task, level, "")


def test_macro_micro_and_groups() -> None:
    records = [record("1", [["A"]], "single step", "easy"), record("2", [["A"], ["B", "C"]], "multi step", "easy"),
               record("3", [["D"]], "single step", "hard")]
    predictions = {"1": [["A"]], "2": [["A"], ["B"]], "3": [["E"], ["F"]]}
    scores = score_finmcp(records, predictions)
    # per record (P, R): 1: (1, 1); 2: (2/2, 2/3), F1 0.8; 3: (0/2, 0/1), F1 0
    assert scores.macro["precision"] == pytest.approx((1 + 1 + 0) / 3)
    assert scores.macro["recall"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert scores.macro["f1"] == pytest.approx((1 + 0.8 + 0) / 3)
    assert scores.macro["exact_match"] == pytest.approx(1 / 3) and scores.records == 3
    # micro: matched 1 + 2 + 0 = 3, predicted 1 + 2 + 2 = 5, gold 1 + 3 + 1 = 5 -> P = R = F1 = 0.6
    assert scores.micro == pytest.approx({"precision": 0.6, "recall": 0.6, "f1": 0.6})
    assert scores.groups["task:single step"]["records"] == 2
    assert scores.groups["level:easy"]["macro"]["f1"] == pytest.approx(0.9)
    with pytest.raises(ValueError, match=r"no prediction for record\(s\) \['3'\]"):
        score_finmcp(records, {"1": [], "2": []})


# -- FinMCP records ----------------------------------------------------------------------------------------------------

SYNTHETIC = {  # a record in FinMCP-Bench's schema, with invented content
    "id": 7, "scenery": "synthetic-a-b", "diff_level": {"turns": 1, "tool_number": 2, "level": "medium"},
    "tool_list": [["LookupFund"], ["GetNav", "GetRisk"]], "question": "q", "answer": "a", "task": "multi step",
    "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                               "function": {"name": "LookupFund", "arguments": "{}"}}]},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "GetNav", "arguments": "{}"}},
            {"id": "c3", "type": "function", "function": {"name": "GetRisk", "arguments": "{}"}}]},
        {"role": "tool", "content": "{}"}, {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "a"},
    ],
}


def test_load_a_json_array_and_replay_its_gold_dialogue(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps([SYNTHETIC, {**SYNTHETIC, "id": 8, "task": "single step"}]), encoding="utf-8")
    records = load_finmcp(path)
    assert [r.id for r in records] == ["7", "8"] and records[0].level == "medium"
    assert records[0].tool_list == (("LookupFund",), ("GetNav", "GetRisk"))
    # the gold dialogue's own calls reproduce the gold grouping: every metric is 1
    gold = {r.id: predicted_grouping(r.messages) for r in records}
    scores = score_finmcp(records, gold)
    assert scores.macro == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "exact_match": 1.0, "consist": 1.0}


def test_bad_files_name_the_place(tmp_path: Path) -> None:
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps(SYNTHETIC) + "\n" + json.dumps({**SYNTHETIC, "id": 9, "tool_list": ["A"]}) + "\n")
    with pytest.raises(ValueError, match=r"bench.jsonl:2: 'tool_list' must be a list of steps"):
        load_finmcp(path)
    path.write_text(json.dumps(SYNTHETIC) + "\n{broken\n")
    with pytest.raises(ValueError, match=r"bench.jsonl:2: not valid JSON"):
        load_finmcp(path)
    path.write_text(json.dumps(SYNTHETIC) + "\n" + json.dumps(SYNTHETIC) + "\n")
    with pytest.raises(ValueError, match="duplicate record id '7'"):
        load_finmcp(path)
    array = tmp_path / "bench.json"
    array.write_text(json.dumps([SYNTHETIC, {"tool_list": []}]))
    with pytest.raises(ValueError, match=r"bench.json\[1\]: missing field 'id'"):
        load_finmcp(array)
