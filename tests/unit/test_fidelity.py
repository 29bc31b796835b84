"""Rehearsal fidelity: κ, per-probe scores, the summed metric, per-tool breakdown and teacher-forced bank probes."""

from __future__ import annotations

import json
import math
from collections import Counter
from functools import cache

import pytest
import torch
from helpers import ScriptedEngine
from torch import nn

from envace.builtin.task_sets import resolve_task_path
from envace.data.tasks import load_tasks
from envace.roles.compare import (
    ProbeScore,
    canonical,
    canonical_text,
    is_error,
    rehearsal_target,
    score_response,
    token_f1,
)
from envace.types import Task
from envace.world_model.alignment import _normalise, reference_steps
from envace.world_model.fidelity import Probe, RehearsalFidelity, per_tool, reference_probes, rehearse_probes, summarize
from envace.worlds.rehearse import RehearseWorld

ONES = ProbeScore(1.0, 1.0, 1.0, 1.0, 1.0)
BALANCE = '{"account": "C9", "balance": 160}'
TRANSFER = '{"source": "E8", "balance": 86, "target": "D9", "amount": 29, "fee": 0}'
WITHDRAW_ERROR = '{"error": "ValueError: insufficient funds in \'A4\': balance 130, requested 178"}'


@cache
def bank_tasks() -> list[Task]:
    return load_tasks(resolve_task_path("builtin:bank"))


@cache
def bank_probes() -> list[Probe]:
    return reference_probes(bank_tasks())


def real_is_error(probe: Probe) -> bool:
    """Independent oracle: the recorded real response is a bank error object."""
    return "error" in json.loads(probe.real)


def counts() -> tuple[int, int]:
    """(reference tool responses, error responses) of the bank split, counted from the raw task records."""
    reals = [m["content"] for t in bank_tasks() for m in t.reference if m["role"] == "tool"]
    return len(reals), sum("error" in json.loads(real) for real in reals)


@pytest.fixture
def world(tiny_tokenizer) -> RehearseWorld:
    world = RehearseWorld()
    world.bind(tiny_tokenizer, nn.Identity())
    return world


def echo(content: str) -> str:
    return f"<execution_result>\n{content}\n</execution_result>"


# ---------------------------------------------------------------------------------------------------------------------
# κ and per-probe scores
# ---------------------------------------------------------------------------------------------------------------------


def test_canonical_sorts_keys_rounds_floats_and_strips_text() -> None:
    value = canonical('{"b": 1.00001, "a": [2.0, 3.14159, 12345.6, 12345.0, 0.000123456, true, null]}')
    assert value == {"a": [2, 3.142, 12350, 12345, 0.0001235, True, None], "b": 1}
    assert list(value) == ["a", "b"]  # keys sorted
    assert type(value["b"]) is int and type(value["a"][0]) is int  # whole floats (after rounding) are ints
    assert canonical("  not json \n") == "not json"
    assert canonical_text('{"b": 2, "a": 1}') == canonical_text('{"a":1.0,"b":2}') == '{"a":1,"b":2}'


def test_real_response_against_itself_scores_one_everywhere() -> None:
    for real in [BALANCE, TRANSFER, WITHDRAW_ERROR, "Error during execution: boom", "plain text", "[]", '{"x": {}}']:
        assert score_response(real, real) == ONES, real


def test_float_rounding_and_key_order_are_exact_matches() -> None:
    assert score_response('{"x": 1.00001}', '{"x": 1.0}').exact_match == 1.0  # 1.00001 -> 1.000 -> 1
    assert score_response('{"x": 3.14159}', '{"x": 3.1416}').exact_match == 1.0  # both -> 3.142
    assert score_response('{"x": 3.14}', '{"x": 3.142}').exact_match == 0.0
    assert score_response('{"x": 2}', '{"x": 2.0}') == ONES
    assert score_response('{"b": 2, "a": 1}', '{"a": 1, "b": 2}') == ONES
    assert score_response('{"x": "1"}', '{"x": 1}').exact_match == 0.0  # a string is not a number


def test_right_keys_wrong_values() -> None:
    score = score_response('{"account": "C9", "balance": 100}', BALANCE)
    # leaves: {account=C9, balance=100} vs {account=C9, balance=160}: 1 common -> 2*1 / (2+2) = 0.5
    assert score == ProbeScore(exact_match=0.0, leaf_f1=0.5, key_match=1.0, parse_ok=1.0, error_agree=1.0)
    predicted = '{"source": "E8", "balance": 85, "target": "D9", "amount": 29, "fee": 1}'
    # common leaves: source, target, amount = 3 of 5 each -> 2*3 / (5+5) = 0.6
    assert score_response(predicted, TRANSFER).leaf_f1 == pytest.approx(0.6)
    assert score_response('{"account": "C9"}', BALANCE).key_match == 0.0  # a key missing
    assert score_response("[1]", "[2, 3]").key_match == 1.0  # non-objects: same JSON type (array)
    assert score_response('"x"', "[2]").key_match == 0.0


def test_constant_rehearser_against_bank_responses() -> None:
    reals = [probe.real for probe in bank_probes()]
    summary = summarize([score_response('{"ok": true}', real) for real in reals])
    n, errors = counts()
    assert n > errors > 0  # the split has both kinds
    # {"ok": true} shares no leaf and no key with any bank response; it agrees (no error) on the n - errors others
    assert summary == {
        "exact_match": 0.0,
        "leaf_f1": 0.0,
        "key_match": 0.0,
        "parse_rate": 1.0,
        "error_agreement": pytest.approx((n - errors) / n),
        "probes": float(n),
    }


def test_free_text_token_f1() -> None:
    score = score_response("the file was not found", "Error: file not found")
    # tokens 5 and 4, common {file, not, found} = 3 -> 2*3 / (5+4) = 6/9
    assert score.leaf_f1 == pytest.approx(6 / 9)
    assert (score.exact_match, score.key_match, score.parse_ok) == (0.0, 1.0, 1.0)  # real is not JSON: parse ok
    assert score.error_agree == 0.0  # only the real one starts with "Error"
    assert token_f1("a a b", "a b b") == pytest.approx(4 / 6)  # multisets: min(2,1) + min(1,2) = 2 common
    assert token_f1("", "  ") == 1.0 and token_f1("", "a") == 0.0
    broken = score_response("not json at all", BALANCE)  # real parses, prediction does not
    assert broken == ProbeScore(exact_match=0.0, leaf_f1=0.0, key_match=0.0, parse_ok=0.0, error_agree=1.0)


def test_error_agreement() -> None:
    assert is_error(WITHDRAW_ERROR) and is_error('{"error": {"code": "X", "message": "m"}}')
    assert is_error("Error during execution: boom") and is_error('"Error: x"')
    assert is_error('{"result": "Error during execution: boom"}')  # a rehearsal of free-text error output
    assert not is_error(BALANCE) and not is_error("error in lower case") and not is_error("[]")
    assert not is_error('{"result": "ok"}') and not is_error('{"result": "Error", "x": 1}')
    assert score_response('{"error": "boom"}', "Error during execution: boom").error_agree == 1.0
    assert score_response('{"error": "boom"}', BALANCE).error_agree == 0.0
    assert score_response(BALANCE, WITHDRAW_ERROR).error_agree == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------------


def test_metric_accumulates_over_updates() -> None:
    metric = RehearsalFidelity()
    metric.update([ONES, ProbeScore(0.0, 0.5, 1.0, 0.0, 1.0)])
    metric.update([ProbeScore(0.0, 0.25, 0.0, 1.0, 0.0)])
    out = metric.compute()
    # sums over 3 probes: EM 1, F1 1 + 0.5 + 0.25 = 1.75, keys 2, parse 2, errors 2
    expected = {
        "exact_match": 1 / 3,
        "leaf_f1": 1.75 / 3,
        "key_match": 2 / 3,
        "parse_rate": 2 / 3,
        "error_agreement": 2 / 3,
        "probes": 3.0,
    }
    assert {k: v.item() for k, v in out.items()} == pytest.approx(expected)
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update`` method"):
        empty = metric.compute()
    assert empty["probes"].item() == 0.0 and math.isnan(empty["exact_match"].item())


def test_metric_states_sum_across_ranks() -> None:
    rank0, rank1 = RehearsalFidelity(), RehearsalFidelity()
    rank0.update([ONES])
    rank1.update([ProbeScore(0.0, 0.5, 1.0, 1.0, 0.0)])
    rank0.merge_state(rank1)  # what dist_reduce_fx="sum" does on sync
    out = rank0.compute()
    assert out["probes"] == torch.tensor(2.0, dtype=torch.float64)
    assert out["leaf_f1"].item() == pytest.approx(0.75)  # (1 + 0.5) / 2
    assert out["error_agreement"].item() == pytest.approx(0.5)  # (1 + 0) / 2


def test_per_tool_breakdown() -> None:
    scores = [ONES, ProbeScore(0.0, 0.5, 1.0, 1.0, 1.0), ProbeScore(0.0, 0.0, 0.0, 0.0, 0.0)]
    out = per_tool(scores, ["get_balance", "get_balance", "withdraw"])
    assert list(out) == ["get_balance", "withdraw"]
    # get_balance: EM (1 + 0) / 2, F1 (1 + 0.5) / 2
    assert out["get_balance"] == {
        "exact_match": 0.5,
        "leaf_f1": 0.75,
        "key_match": 1.0,
        "parse_rate": 1.0,
        "error_agreement": 1.0,
        "probes": 2.0,
    }
    assert out["withdraw"]["probes"] == 1.0 and out["withdraw"]["parse_rate"] == 0.0
    with pytest.raises(ValueError, match="2 scores but 1 tool names"):
        per_tool(scores[:2], ["get_balance"])


# ---------------------------------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------------------------------


def test_reference_probes_on_bank() -> None:
    tasks, probes = bank_tasks(), bank_probes()
    steps = [(index, step) for index, task in enumerate(tasks) for step in reference_steps(task)]
    assert len(probes) == len(steps) == counts()[0]  # one probe per recorded tool response
    for probe, (index, (call, real, history)) in zip(probes, steps):
        assert (probe.request.call, probe.real, probe.request.history) == (call, real, history)
        assert probe.request.task is tasks[index] and probe.request.handle is None
        assert probe.request.episode_index == probe.request.group_index == index
    # a second call is teacher-forced on the REAL first call and its recorded response
    index, task = next((i, t) for i, t in enumerate(tasks) if len(t.reference) >= 4)
    second = [p for p in probes if p.request.task is task][1]
    assert task.reference[1]["role"] == "tool" and task.reference[3]["role"] == "tool"
    assert second.real == task.reference[3]["content"]
    assert second.request.history == list(task.messages) + list(task.reference[:2])
    assert second.request.group_index == index
    assert len(reference_probes(tasks, max_per_task=1)) == len(tasks)  # every bank task has a reference call
    assert reference_probes(tasks, max_per_task=0) == []
    with pytest.raises(ValueError, match="max_per_task"):
        reference_probes(tasks, max_per_task=-1)


def test_rehearsal_target_matches_the_alignment_target() -> None:
    for real in [BALANCE, '{"a":1,  "b":[2]}', "plain text", "Error during execution: boom", "[1, 2]"]:
        assert rehearsal_target(real) == _normalise(real)


def test_echoing_the_real_response_is_an_exact_match(world: RehearseWorld, tiny_tokenizer) -> None:
    probes = bank_probes()
    engine = ScriptedEngine(tiny_tokenizer, [echo(p.real) for p in probes])
    scores = rehearse_probes(probes, world, engine, max_new_tokens=64)
    assert engine.call_count == 1 and len(engine.calls[0]) == len(probes)  # one batched generation
    assert engine.params[0].temperature == 0.0 and engine.params[0].max_new_tokens == 64
    assert engine.calls[0][3] == world.prompt(probes[3].request).ids  # the teacher-forced rehearse prompt
    assert scores == [ONES] * len(probes)


def test_garbage_breaks_the_contract(world: RehearseWorld, tiny_tokenizer) -> None:
    probes = bank_probes()
    engine = ScriptedEngine(tiny_tokenizer, ["garbage"] * len(probes))
    summary = summarize(rehearse_probes(probes, world, engine, max_new_tokens=64))
    n, errors = counts()
    # every reply is a contract error {"error": {...}}: it agrees with the real error responses only
    assert summary["exact_match"] == 0.0 and summary["parse_rate"] == 0.0
    assert summary["leaf_f1"] == 0.0 and summary["key_match"] == 0.0
    assert summary["error_agreement"] == pytest.approx(errors / n)


def test_per_tool_on_rehearsed_bank(world: RehearseWorld, tiny_tokenizer) -> None:
    probes = bank_probes()
    script = ["garbage" if p.tool == "withdraw" else echo(p.real) for p in probes]
    scores = rehearse_probes(probes, world, ScriptedEngine(tiny_tokenizer, script), max_new_tokens=64)
    out = per_tool(scores, [p.tool for p in probes])
    calls = Counter(c["function"]["name"] for t in bank_tasks() for m in t.reference for c in m.get("tool_calls", []))
    assert {tool: row["probes"] for tool, row in out.items()} == {tool: float(n) for tool, n in calls.items()}
    assert set(out) == {"get_balance", "deposit", "transfer", "withdraw"}
    assert all(out[tool]["exact_match"] == 1.0 for tool in ("get_balance", "deposit", "transfer"))
    withdraw_errors = sum(real_is_error(p) for p in probes if p.tool == "withdraw")
    # a contract error agrees only with the real withdraw errors; everything else is 0
    assert out["withdraw"] == {
        "exact_match": 0.0,
        "leaf_f1": 0.0,
        "key_match": 0.0,
        "parse_rate": 0.0,
        "error_agreement": pytest.approx(withdraw_errors / calls["withdraw"]),
        "probes": float(calls["withdraw"]),
    }


def test_free_text_real_response_is_rehearsed_wrapped(world: RehearseWorld, tiny_tokenizer) -> None:
    base = bank_tasks()[0]
    call = {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "C9"}}}
    reference = (
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "name": "get_balance", "content": "Error during execution: boom"},
        {"role": "tool", "name": "get_balance", "content": "Error during execution: boom"},
    )
    task = Task(id="text", messages=base.messages, tools=base.tools, success=base.success, reference=reference)
    script = [echo('{"result": "Error during execution: boom"}'), echo('{"error": "boom"}')]
    scores = rehearse_probes(reference_probes([task]), world, ScriptedEngine(tiny_tokenizer, script), 64)
    assert scores[0] == ONES  # the alignment target form of free text
    # {"error": "boom"} vs {"result": "Error during execution: boom"}: different keys and leaves, both errors
    assert scores[1] == ProbeScore(exact_match=0.0, leaf_f1=0.0, key_match=0.0, parse_ok=1.0, error_agree=1.0)
    assert rehearse_probes([], world, ScriptedEngine(tiny_tokenizer, []), 64) == []
