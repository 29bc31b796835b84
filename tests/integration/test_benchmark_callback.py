"""The benchmark evaluation callback: during a tiny ``fit`` and under ``envace test`` it runs BFCL (multi-turn and
single-turn), tau^2 (solo, and user mode with a tiny simulated user), FinMCP and VitaBench subsets with the policy,
logs the scores to TensorBoard and writes the results files; bad settings are refused at construction, by name."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from envace.cli.lightning import cli_main as main

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "lit_configs" / "tiny.yaml")
sys.path.insert(0, str(Path(__file__).parent))
from test_fit_tiny import _scalars  # noqa: E402

TINY_USER = {"class_path": "envace.engines.chat_model.ChatModel",
             "init_args": {"policy": {"class_path": "envace.policy.TinyPolicy"}, "max_new_tokens": 8}}


def _callback(**init_args: Any) -> str:
    return json.dumps([{"class_path": "callbacks.benchmark_eval.BenchmarkEvaluation",
                        "init_args": {"bfcl_limit": 1, "tau2_limit": 1, "act_max_new_tokens": 8, **init_args}}])


def _run(tmp_path: Path, command: str, callback: str, *extra: str):
    """``envace <command>`` on the tiny config with the callback; returns the CLI and the callback."""
    args = [command, "--config", TINY, f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.callbacks={callback}",
            "--model.rollout.max_turns=2", "--model.rollout.act_max_new_tokens=8", *extra]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(args)
    return cli, next(c for c in cli.trainer.callbacks if type(c).__name__ == "BenchmarkEvaluation")


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _finmcp_file(folder: Path) -> Path:
    """Two synthetic records in FinMCP-Bench's layout (made-up content): one step, then two steps over two turns."""
    records = [
        {"id": 1, "task": "single step", "diff_level": {"level": "easy"}, "tool_list": [["GetQuote"]], "messages": [
            {"role": "user", "content": "Quote for ACME?"},
            {"role": "assistant", "content": "", "tool_calls": [_call("GetQuote", {"symbol": "ACME"})]},
            {"role": "tool", "content": "{\"last\": 12.5}"},
            {"role": "assistant", "content": "ACME is at 12.5."}]},
        {"id": "mt-2", "task": "multi turn", "diff_level": {"level": "medium"},
         "tool_list": [["SearchNews"], ["GetIndex"]], "messages": [
            {"role": "system", "content": "You are a finance assistant."},
            {"role": "user", "content": "Market mood?"},
            {"role": "assistant", "tool_calls": [_call("SearchNews", {"keyword": "market", "limit": 3})]},
            {"role": "tool", "content": "{\"items\": []}"},
            {"role": "assistant", "content": "Calm."},
            {"role": "user", "content": "And the index?"},
            {"role": "assistant", "tool_calls": [_call("GetIndex", {"index": "CSI300"})]},
            {"role": "tool", "content": "{\"last\": 3900.5}"},
            {"role": "assistant", "content": "3900.5."}]},
    ]
    path = folder / "finmcp.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


@pytest.mark.slow
def test_benchmark_scores_are_logged_during_a_tiny_fit(tmp_path: Path) -> None:
    categories = ["multi_turn_base", "simple_python", "irrelevance", "live_simple"]
    callback = _callback(every_n_steps=1, bfcl_categories=categories, finmcp_path=str(_finmcp_file(tmp_path)))
    _, bench = _run(tmp_path, "fit", callback, "--trainer.max_steps=2", "--trainer.limit_val_batches=0")
    assert [r["step"] for r in bench.history] == [1, 2]  # every step; the final one is not repeated at fit end
    scalars = _scalars(tmp_path)
    tags = ["bench/bfcl_multi_turn_base", "bench/bfcl_simple_python", "bench/bfcl_non_live_irrelevance",
            "bench/bfcl_live_simple", "bench/tau2_telecom_solo_pass1", "bench/tau2_telecom_solo_floor",
            "bench/finmcp_tp", "bench/finmcp_tr", "bench/finmcp_tf1", "bench/finmcp_emr"]
    for tag in tags:
        assert tag in scalars and len(scalars[tag]) == 2 and all(0.0 <= v <= 1.0 for v in scalars[tag]), tag
    assert not any(t.startswith("bench/bfcl_offline") for t in scalars)  # a partial aggregate is never logged
    details = bench.history[-1]["details"]
    assert {"simple_java", "multi_turn_miss_func", "live_multiple"} <= set(details["bfcl_aggregate"]["missing"])
    assert "bfcl_limit=1" in details["bfcl_aggregate"]["live_weighting"]
    assert details["finmcp"]["schema_source"] == "inferred" and set(details["finmcp"]["micro"]) == {
        "precision", "recall", "f1"}
    assert details["tau2_telecom_solo"]["user_model"] == "none (solo)"
    written = sorted(p.name for p in tmp_path.rglob("results_step*"))
    assert written == ["results_step1.json", "results_step1.md", "results_step2.json", "results_step2.md"]
    table = next(tmp_path.rglob("results_step2.md")).read_text()
    assert "| score | value | floor | note |" in table and "user: none (solo)" in table
    assert "agentic 40%" in table and "Live is weighted by the entries evaluated here" in table


@pytest.mark.slow
def test_the_callback_scores_a_checkpoint_under_envace_test(tmp_path: Path) -> None:
    from envace.benchmarks import bfcl_ast, bfcl_data

    callback = _callback(bfcl_categories=[*bfcl_data.MULTI_TURN, *bfcl_ast.SINGLE_TURN], tau2_domains=["retail"],
                         tau2_mode="user", user=TINY_USER, max_user_turns=1)
    _, bench = _run(tmp_path, "test", callback, "--trainer.limit_test_batches=1",
                    "--data.test_tasks=builtin:bank-test:2")
    (record,) = bench.history
    scores = record["scores"]
    for key in ("bfcl_offline", "bfcl_non_live", "bfcl_live", "bfcl_irrelevance", "bfcl_multi_turn",
                "bfcl_live_relevance", "tau2_retail_user_pass1", "tau2_retail_user_floor"):
        assert 0.0 <= scores[key] <= 1.0, key
    assert record["details"]["bfcl_aggregate"]["missing"] == []
    assert record["floors"]["tau2_retail_user_pass1"] == scores["tau2_retail_user_floor"]
    assert record["details"]["tau2_retail_user"]["user_model"].startswith("TinyPolicy(hidden=64")
    table = next(tmp_path.rglob("results_step*.md")).read_text()
    assert "user: TinyPolicy(hidden=64" in table and "not BFCL-v4 overall" in table


def test_bad_settings_are_refused_by_name(tmp_path: Path) -> None:
    from callbacks.benchmark_eval import BenchmarkEvaluation
    from envace.engines.chat_model import ChatModel
    from envace.policy import TinyPolicy

    user = ChatModel(TinyPolicy(), max_new_tokens=8)
    refused = [
        ({"bfcl_categories": ["multi_turn_composite"]}, r"bfcl_categories: unknown BFCL category "
                                                        r"'multi_turn_composite'; valid: multi_turn_base, .*simple"),
        ({"bfcl_categories": ["web_search"]}, "bfcl_categories: BFCL category 'web_search' is not run: .*offline"),
        ({"bfcl_categories": ["simple_python", "simple_python"]}, "'simple_python' is listed twice"),
        ({"bfcl_limit": 0}, "bfcl_limit must be at least 1"),
        ({"bfcl_split": "test"}, "bfcl_split: 'test'; valid: all, train, eval"),
        ({"tau2_split": "dev"}, "tau2_split: 'dev'"),
        ({"tau2_mode": "duo"}, "tau2_mode: 'duo'"),
        ({"tau2_domains": ["bank"]}, "tau2_domains: unknown domain 'bank'"),
        ({"tau2_domains": ["retail"]}, "tau2_domains: 'retail' has no solo mode"),
        ({"tau2_domains": ["retail"], "tau2_mode": "user"}, "user: tau2_mode 'user' needs"),
        ({"tau2_trials": 0}, "tau2_trials must be at least 1"),
        ({"finmcp_path": str(tmp_path / "none.json")}, "finmcp_path: no file at"),
        ({"finmcp_tools": "tools.json"}, "finmcp_tools: given without finmcp_path"),
        ({"vita_path": str(tmp_path / "tasks.json"), "user": user}, "judge: vita_path needs a judge model"),
        ({"vita_path": str(tmp_path / "tasks.json"), "judge": user}, "user: vita_path needs"),
        ({"vita_language": "klingon"}, "vita_language: 'klingon'"),
    ]
    for settings, message in refused:
        with pytest.raises(ValueError, match=message):
            BenchmarkEvaluation(**settings)
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"id\": 1}]")
    with pytest.raises(ValueError, match="finmcp_path: .*missing field 'tool_list'"):
        BenchmarkEvaluation(finmcp_path=str(bad))
    # tau^2 off: user mode needs no user
    assert BenchmarkEvaluation(tau2_domains=["retail"], tau2_mode="user", tau2_split=None).tau2_domains == []


def _test_vita_module():
    """tests/unit/test_vita.py, for its synthetic task and its stand-in ``vita`` package."""
    spec = importlib.util.spec_from_file_location("_vita_tests", ROOT / "tests" / "unit" / "test_vita.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vitabench_runs_in_the_callback_with_a_stand_in_checkout(tmp_path: Path, monkeypatch, tiny_tokenizer) -> None:
    from callbacks.benchmark_eval import BenchmarkEvaluation
    from envace.benchmarks.scripted import ScriptedPolicy
    from envace.engines.chat_model import ChatModel

    tests = _test_vita_module()
    for name, text in tests.STAND_IN.items():
        (tmp_path / "checkout" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "checkout" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "checkout"))
    path = tests.write_tasks(tmp_path, [tests.vita_task("T1", required=(tests.BOWLS,))])
    order = tests.call_text("create_order", tests.ORDER)
    user = ChatModel.from_engine(ScriptedPolicy(tiny_tokenizer, ["Two bowls to Ward 3.", "Thanks ###STOP###"]),
                                 tiny_tokenizer)
    judge = ChatModel.from_engine(ScriptedPolicy(tiny_tokenizer, ['{"met": [1, 2]}']), tiny_tokenizer)
    bench = BenchmarkEvaluation(bfcl_categories=[], tau2_split=None, vita_path=str(path), user=user, judge=judge,
                                output_dir=str(tmp_path / "out"))
    module = SimpleNamespace(_bind_worlds=lambda: None, tokenizer=tiny_tokenizer,
                             act_engine=ScriptedPolicy(tiny_tokenizer, [order, "Order OT0 is placed."]))
    trainer = SimpleNamespace(global_step=3, loggers=[], log_dir=None, default_root_dir=str(tmp_path))
    try:
        record = bench.evaluate(trainer, module)
    finally:
        for name in [n for n in sys.modules if n == "vita" or n.startswith("vita.")]:
            del sys.modules[name]
    assert record["scores"] == {"vita_reward": 0.0, "vita_rubric_score": pytest.approx(2 / 3),
                                "vita_order_match_unofficial": 1.0}
    assert record["details"]["vita"]["judge_model"] == "ChatModel over ScriptedPolicy"
    table = (tmp_path / "out" / "results_step3.md").read_text()
    assert "| vita_order_match_unofficial | 1.000 | – | UNOFFICIAL proxy" in table
