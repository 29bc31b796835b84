"""The benchmark command lines on tiny inputs: the gold policies score 100%, the flags parse and are checked, a tiny
random policy runs FinMCP and tau^2 user mode, and the results file and the SUMMARY line are written."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _finmcp_file(folder: Path) -> Path:
    """Two synthetic records in FinMCP-Bench's layout (made-up content)."""
    def call(name: str, arguments: dict) -> dict:
        return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    records = [
        {"id": 1, "task": "single step", "tool_list": [["GetQuote"]], "messages": [
            {"role": "user", "content": "Quote for ACME?"},
            {"role": "assistant", "content": "", "tool_calls": [call("GetQuote", {"symbol": "ACME"})]},
            {"role": "tool", "content": "{\"last\": 12.5}"}, {"role": "assistant", "content": "ACME is at 12.5."}]},
        {"id": 2, "task": "multi step", "tool_list": [["SearchNews"], ["GetIndex"]], "messages": [
            {"role": "user", "content": "Market mood and the index?"},
            {"role": "assistant", "tool_calls": [call("SearchNews", {"keyword": "market"})]},
            {"role": "tool", "content": "{\"items\": []}"},
            {"role": "assistant", "tool_calls": [call("GetIndex", {"index": "CSI300"})]},
            {"role": "tool", "content": "{\"last\": 3900.5}"}, {"role": "assistant", "content": "Calm; 3900.5."}]},
    ]
    path = folder / "finmcp.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def test_evaluate_policy_with_the_gold_policies(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results.json"
    _script("evaluate_policy").main(["--model", "gold", "--bfcl-categories", "multi_turn_base", "simple_python",
                                     "irrelevance", "--bfcl-limit", "2", "--tau2-limit", "1", "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == ("SUMMARY bfcl_multi_turn_base=1.000 bfcl_simple_python=1.000 bfcl_non_live_irrelevance=1.000 "
                         "tau2_telecom_solo=1.000 tau2_telecom_solo_floor=0.000")
    text = "\n".join(lines)
    assert "| multi_turn_base | multi_turn_checker | gold | 2 | 1.000 |" in text
    assert "| simple_python | AST checker | gold | 2 | 1.000 |" in text and "| **bfcl_offline** | – |" in text
    assert "not BFCL-v4 overall" in text and "missing: simple_java" in text
    assert "| tau2_telecom_solo, test | gold | none (solo) | 1 | 1.000 | 0.000 | 0 |" in text
    results = json.loads(out.read_text())
    assert results["bfcl_multi_turn_base"]["valid"] == {"multi_turn_base_0": True, "multi_turn_base_1": True}
    assert results["bfcl_aggregate"]["bfcl_offline"] is None and results["tau2_telecom_solo"]["floor"] == 0.0


def test_evaluate_policy_flags_parse_and_are_checked(tmp_path: Path, capsys) -> None:
    module = _script("evaluate_policy")
    parser = module.build_parser()
    defaults = parser.parse_args(["--model", "gold"])
    assert defaults.bfcl_categories == [*module.bfcl_data.MULTI_TURN, *module.bfcl_ast.SINGLE_TURN]
    assert (defaults.tau2_domains, defaults.tau2_mode, defaults.tau2_split) == (["telecom"], "solo", "test")
    args = parser.parse_args(["--model", "tiny", "--bfcl-categories", "--tau2-domains", "retail", "airline",
                              "--tau2-mode", "user", "--trials", "2", "--user-model", "tiny", "--judge-model", "tiny",
                              "--finmcp", "f.json", "--finmcp-tools", "t.json", "--vita", "v.json",
                              "--vita-trials", "3"])
    assert args.bfcl_categories == [] and args.tau2_domains == ["retail", "airline"] and args.tau2_trials == 2
    assert (args.user_model, args.judge_model, args.finmcp_tools, args.vita_trials) == ("tiny", "tiny", "t.json", 3)
    finmcp = str(_finmcp_file(tmp_path))
    refused = [
        (["--bfcl-categories", "web_search"], "--bfcl-categories: BFCL category 'web_search' is not run"),
        (["--bfcl-categories", "multi_turn_x"], "--bfcl-categories: unknown BFCL category 'multi_turn_x'"),
        (["--tau2-domains", "retail"], "--tau2-domains retail: no solo mode"),
        (["--tau2-domains", "retail", "--tau2-mode", "user"], "--tau2-mode user needs --user-model"),
        (["--vita", finmcp, "--user-model", "tiny"], "--vita needs --judge-model and --user-model"),
        (["--finmcp", str(tmp_path / "none.json")], "--finmcp .*none.json: no such file"),
        (["--finmcp", finmcp], "--model gold replays BFCL and tau.2 solo only; no gold policy for --finmcp"),
        (["--user-model", str(tmp_path)], "--user-model .*: no config.json there"),
        (["--bfcl-limit", "0"], "--bfcl-limit must be at least 1"),
        (["--rehearsals", "2"], "no gold policy for --rehearsals"),
        (["--rehearsals", "-1"], "--rehearsals and --rehearsal-horizon must be >= 0"),
    ]
    for extra, message in refused:
        with pytest.raises(SystemExit):
            module.main(["--model", "gold", *extra])
        assert re.search(message, capsys.readouterr().err), extra


def test_a_tiny_policy_rehearses_privately_on_bfcl_and_tau2(tmp_path: Path, capsys) -> None:
    _script("evaluate_policy").main([
        "--model", "tiny", "--bfcl-categories", "multi_turn_base", "--bfcl-limit", "1", "--tau2-limit", "1",
        "--rehearsals", "2", "--rehearsal-granularity", "task", "--rehearsal-horizon", "1",
        "--rehearsal-selector", "MajorityCommit", "--act-max-new-tokens", "4", "--out", str(tmp_path / "r.json")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("Private rehearsal (BFCL multi-turn and tau^2): 2 parallel attempts of at most 1")
    summary = dict(pair.split("=") for pair in lines[-1].removeprefix("SUMMARY ").split())
    assert set(summary) == {"bfcl_multi_turn_base", "tau2_telecom_solo", "tau2_telecom_solo_floor"}
    assert all(0.0 <= float(v) <= 1.0 for v in summary.values())


def test_a_tiny_policy_runs_finmcp_and_tau2_with_a_tiny_user(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results.json"
    _script("evaluate_policy").main([
        "--model", "tiny", "--bfcl-categories", "--tau2-domains", "retail", "--tau2-mode", "user", "--tau2-limit", "1",
        "--user-model", "tiny", "--max-user-turns", "1", "--helper-max-new-tokens", "4", "--act-max-new-tokens", "4",
        "--finmcp", str(_finmcp_file(tmp_path)), "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    summary = dict(pair.split("=") for pair in lines[-1].removeprefix("SUMMARY ").split())
    assert set(summary) == {"tau2_retail_user", "tau2_retail_user_floor", "finmcp_tp", "finmcp_tr", "finmcp_tf1",
                            "finmcp_emr"}
    assert all(0.0 <= float(v) <= 1.0 for v in summary.values())
    text = "\n".join(lines)
    assert "| tau2_retail_user, test | tiny | TinyPolicy(hidden=64, layers=2, seed=0) | 1 |" in text
    assert "| macro over records | tiny | 2 |" in text and "| inferred |" in text
    results = json.loads(out.read_text())
    assert results["finmcp"]["schema_source"] == "inferred" and set(results["finmcp"]["micro"]) == {
        "precision", "recall", "f1"}


def test_harness_check_on_a_few_entries(capsys) -> None:
    module = _script("harness_check")
    rows = module.bfcl_rows(limit=2)
    assert [r[0] for r in rows] == list(module.bfcl_data.MULTI_TURN)
    assert all(r[2] == 1.0 and r[4] == 1.0 for r in rows)  # gold calls valid, fidelity EM 1
    assert all(r[3] == 1.0 for r in rows)  # the gold policy through the rollout, every category
    single = module.single_turn_rows(limit=2)
    assert [r[0] for r in single] == list(module.bfcl_ast.SINGLE_TURN)
    assert all(n == 2 and rate == 1.0 and misses == [] for _, n, rate, misses, _ in single)
    lines = module.single_turn_lines(limit=1)
    assert lines[2].startswith("| simple_python | 1 | 1.000 | 0 |") and len(lines) == 2 + len(single)


def test_harness_check_lists_a_gold_miss_with_bfcls_error() -> None:
    module = _script("harness_check")
    entry = module.bfcl_ast.load_single_turn("live_simple", ids=["live_simple_106-63-0"])[0]
    error = module._error_type(entry, module.bfcl_ast_gold.gold_output(entry))
    assert error.startswith("simple_function_checker:missing_required: Missing required parameter")


def test_rollout_efficiency_compares_the_rollout_with_plain_generate(capsys) -> None:
    _script("rollout_efficiency").main(["--tasks", "builtin:bank-test:2", "--group-size", "2", "--repeats", "1",
                                        "--act-max-new-tokens", "8", "--rehearse-max-new-tokens", "8"])
    lines = capsys.readouterr().out.strip().splitlines()
    keys = ("run", "sequences", "prompt", "calls", "tokens")
    rollout, matched, first = (dict(zip(keys, row.strip("| ").split(" | ")[:5])) for row in lines[2:5])
    assert rollout["run"] == "envace rollout (cached, lock-step)"
    assert matched["run"] == "plain generate, mean length" and first["run"] == "plain generate, first prompts"
    assert rollout["sequences"] == matched["sequences"] == first["sequences"] == "4"
    assert matched["calls"] == first["calls"] == "1"
    assert int(matched["prompt"]) > int(first["prompt"]) == int(rollout["prompt"])  # + the tool responses
    for plain in (matched, first):
        assert abs(int(rollout["tokens"]) - int(plain["tokens"])) < 4  # the same work, rounded per sequence
    summary = dict(item.split("=") for item in lines[-1].removeprefix("SUMMARY ").split())
    assert set(summary) == {"efficiency", "efficiency_first_prompt"} and all(float(v) > 0 for v in summary.values())


def test_gpu_engines_runs_on_cpu_and_skips_absent_models(tiny_dir: str, tmp_path: Path, capsys) -> None:
    absent = str(tmp_path / "no-such-model")
    _script("gpu_engines").main(["--models", tiny_dir, absent, "--engines", "cached", "hf", "--tasks",
                                 "builtin:bank-test:1", "--group-size", "2", "--act-max-new-tokens", "8",
                                 "--rehearse-max-new-tokens", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert f"absent, skipped: {absent} (no config.json)" in out
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith(f"| {Path(tiny_dir).name} |")]
    assert [r[1] for r in rows] == ["cached", "hf", "cached", "hf"]  # progress rows, then the table
    for row in rows:
        assert int(row[2]) > 0 and float(row[3]) > 0  # new tokens, tokens/s
        assert row[4:] == ["n/a"] * 7  # no vLLM columns for these engines, no memory columns without CUDA
    assert out.strip().splitlines()[-1] == "SUMMARY vllm_speedup=n/a vllm_sync_s=n/a models=1"


def test_gpu_engines_refuses_bad_flags() -> None:
    with pytest.raises(SystemExit):
        _script("gpu_engines").parse_args(["--models", "x", "--repeats", "0"])
    with pytest.raises(SystemExit):
        _script("gpu_engines").parse_args(["--models", "x", "--engines", "sglang"])


def test_vs_trl_without_trl_names_the_install_command(monkeypatch) -> None:
    vs_trl = _script("vs_trl")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(SystemExit, match=r"needs trl( and datasets)?: \.venv/bin/pip install -e '\.\[vs-trl\]'"):
        vs_trl.main(["--pairs", "1"])


def test_vs_trl_ratio_is_the_median_over_pairs_of_trl_over_envace() -> None:
    vs_trl = _script("vs_trl")

    def run(*step_s: float) -> list[dict[str, float]]:
        return [{"step_s": s, "gen_score_s": s / 2, "gen_tokens": 1024.0, "completions": 32.0} for s in step_s]

    results = [("envace", run(9.0, 1.0, 1.2, 1.0)), ("trl", run(9.0, 1.5, 1.5, 1.5)),  # warm-up step 9.0 ignored
               ("trl", run(9.0, 2.0, 2.0, 2.0)), ("envace", run(9.0, 1.0, 1.0, 1.0)),
               ("envace", run(9.0, 2.0, 2.0, 2.0)), ("trl", run(9.0, 1.0, 1.0, 1.0))]
    # per pair, TRL's median step over envace's: 1.5/1.0, 2.0/1.0, 1.0/2.0 -> median 1.5
    assert vs_trl.step_ratio(results, warmup=1) == pytest.approx(1.5)
    summary = vs_trl.summarise(run(9.0, 1.0, 3.0), warmup=1)
    assert summary["step_s"] == 2.0 and summary["update_s"] == 1.0 and summary["completion_len"] == 32.0
    inputs = _script("vs_trl_inputs")
    assert inputs.contains_answer("it is 42.", "42") == 1.0 and inputs.contains_answer("4 2", "42") == 0.0


def test_fidelity_per_tool_prints_a_row_per_tool_and_the_summary(tiny_dir: str, tmp_path: Path, capsys) -> None:
    _script("fidelity_per_tool").main([f"tiny={tiny_dir}", "--tasks", "builtin:bank-test:3", "--dtype", "float32",
                                        "--max-new-tokens", "4", "--misses", str(tmp_path / "misses")])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| tiny |")]
    tools = {line.split("|")[2].strip() for line in rows}
    assert "all" in tools and len(tools) >= 3  # at least one tool, the total and the timing row
    (total,) = [line.split("|") for line in rows if line.split("|")[2].strip() == "all"]
    probes, exact = int(total[3]), float(total[4])
    misses = [json.loads(line) for line in (tmp_path / "misses" / "tiny.jsonl").read_text().splitlines()]
    assert len(misses) == round(probes * (1 - exact)) > 0  # 4 new tokens cannot finish a response
    assert all(m["exact_match"] < 1.0 and m["tool"] in tools and m["target"].startswith("{") for m in misses)
    summary = dict(kv.split("=") for kv in out.strip().splitlines()[-1].removeprefix("SUMMARY ").split())
    assert set(summary) == {"tiny_exact_match", "tiny_leaf_f1"} and 0.0 <= float(summary["tiny_leaf_f1"]) <= 1.0


def test_evaluate_policy_engines_agree_and_a_template_can_be_set(tiny_dir: str, tmp_path: Path, capsys) -> None:
    module = _script("evaluate_policy")
    summaries = []
    for engine in ("cached", "hf"):
        module.main(["--model", "tiny", "--bfcl-categories", "multi_turn_base", "--bfcl-limit", "1", "--tau2-limit",
                     "1", "--act-max-new-tokens", "4", "--engine", engine, "--out", str(tmp_path / f"{engine}.json")])
        captured = capsys.readouterr()
        summaries.append(captured.out.strip().splitlines()[-1])
        progress = [line for line in captured.err.splitlines() if line.startswith("progress: ")]
        assert re.fullmatch(r"progress: bfcl multi_turn_base [01]/1 valid, \d+ s", progress[0]), progress
        assert re.fullmatch(r"progress: tau2 telecom solo pass\^1 [01]\.000 on 1 tasks, floor \d\.\d{3}, \d+ s",
                            progress[-1]), progress
    assert summaries[0] == summaries[1]  # greedy: the same tokens from either engine
    from envace.engines.kv_engine import CachedEngine
    from envace.policy.templates import load_chat_template

    engine, tokenizer = module.build_engine(tiny_dir, chat_template="chatml-tools")
    assert isinstance(engine, CachedEngine) and tokenizer.chat_template == load_chat_template("chatml-tools")


def test_precision_speed_measures_every_precision_on_the_same_inputs(tiny_dir: str, capsys) -> None:
    script = _script("precision_speed")
    script.main(["--model", tiny_dir, "--rows", "2", "--row-tokens", "8", "--prompt-tokens", "4", "--new-tokens", "3",
                 "--repeats", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "precision" not in line]
    assert [r[0].strip() for r in rows] == ["float32", "bf16-mixed", "bf16-true"]
    summary = dict(kv.split("=") for kv in out.strip().splitlines()[-1].removeprefix("SUMMARY ").split())
    for precision in ("float32", "bf16-mixed", "bf16-true"):  # the table's figures, rounded for print
        (row,) = [r for r in rows if r[0].strip() == precision]
        update, generate = float(summary[f"update_tok_s_{precision}"]), float(summary[f"generate_tok_s_{precision}"])
        assert abs(update - float(row[2])) <= 0.55 and abs(generate - float(row[4])) <= 0.055
        seconds = float(row[1])  # 16 row tokens in that many seconds (to the printed 0.01 s)
        assert 16 / (seconds + 0.005) <= update <= 16 / max(seconds - 0.005, 1e-9)
    assert float(summary["bf16_matmul_slowdown"]) > 0


def test_precision_speed_refuses_an_empty_measurement() -> None:
    with pytest.raises(SystemExit):
        _script("precision_speed").parse_args(["--model", "m", "--new-tokens", "0"])
