"""Evaluate a policy offline on BFCL-v4, tau^2-Bench, FinMCP-Bench and VitaBench, as the benchmarks score them.

The policy is an exported envace checkpoint (any Hugging Face causal LM directory with its tokenizer and chat
template; ``--model tiny`` builds the tiny random model, a smoke test), or ``--model gold``: the gold-replay policies
(``bfcl.GoldPolicy`` for multi-turn, ``bfcl_ast_gold.GoldASTEngine`` for single-turn, ``tau2_eval.GoldSoloPolicy`` for
tau^2 solo), the harness check. Each benchmark is scored by its own rules:

- **BFCL-v4** (``--bfcl-categories``, default: the four multi-turn categories and every single-turn category that
  runs offline, i.e. the full offline BFCL; ``--bfcl-limit`` entries each): multi-turn by BFCL's
  ``multi_turn_checker``, single-turn by BFCL's AST checker and relevance rules; then the offline aggregate and its
  components. The aggregate is not BFCL-v4 overall: its agentic 40% needs the network and is left out.
- **tau^2-Bench** (``--tau2-domains``, ``--tau2-mode solo|user``, ``--tau2-split``, ``--tau2-trials``): tau^2's
  evaluators, pass^k with the do-nothing floor next to it. User mode needs ``--user-model``: a local checkpoint
  played by ``ChatModel(HFPolicy(DIR))`` (``tiny``: a random tiny user, for smoke runs); the scores depend on it, so
  it is printed with them.
- **FinMCP-Bench** (``--finmcp FILE [--finmcp-tools FILE]``): the paper's teacher-forced protocol, macro TP/TR/TF1/EMR
  and micro P/R/F1, with the tool-schema source.
- **VitaBench** (``--vita FILE --judge-model DIR``, with ``--user-model``): episodes against the simulated user,
  scored by the rubric judge (the official score) and the order-match proxy (unofficial, labelled so).

Run from the repository root::

    .venv/bin/python benchmarks/evaluate_policy.py --model runs/demo/rl/policy      # full offline BFCL + telecom solo
    .venv/bin/python benchmarks/evaluate_policy.py --model gold
    .venv/bin/python benchmarks/evaluate_policy.py --model runs/demo/rl/policy --bfcl-categories multi_turn_base \\
        --bfcl-limit 20 --tau2-domains retail airline --tau2-mode user --user-model /models/user-8b
    .venv/bin/python benchmarks/evaluate_policy.py --model runs/demo/rl/policy --bfcl-categories --tau2-domains \\
        --finmcp finmcp.json --vita tasks_en.json --user-model /models/user --judge-model /models/judge

It prints tables and writes the per-entry results as JSON (``--out``). The last line is ``SUMMARY`` with key=value
pairs for what ran: ``bfcl_<category>`` (``irrelevance`` as ``bfcl_non_live_irrelevance``), the aggregate's
components and ``bfcl_offline`` (when every component ran), ``tau2_<domain>_<mode>=<pass^1>`` and
``tau2_<domain>_<mode>_floor``, ``finmcp_tp/tr/tf1/emr``, ``vita_reward``, ``vita_rubric_score`` and
``vita_order_match_unofficial``. Runs on the GPU when there is one. A progress line goes to stderr as each BFCL
category and tau^2 domain finishes (``progress: bfcl simple_python 3/5 valid, 16 s``), so a long run that is stopped
still tells what it measured.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envace.benchmarks import bfcl, bfcl_ast, bfcl_ast_gold, bfcl_data, tau2, tau2_eval, tau2_rules, tau2_tasks  # noqa: E402
from envace.benchmarks.suite import BFCL_COMPONENTS, ORDER_MATCH_NOTE, bfcl_key, describe_model  # noqa: E402
from envace.rollout.config import RolloutConfig  # noqa: E402

OFFLINE_BFCL = [*bfcl_data.MULTI_TURN, *bfcl_ast.SINGLE_TURN]
"""The default categories: every BFCL-v4 category that runs offline."""

BFCL_ROLLOUT = RolloutConfig(act_temperature=0.0, max_turns=100_000, max_tool_calls=100_000,
                             max_context_tokens=32768)
"""``bfcl.evaluate_multi_turn``'s default budgets: none below BFCL's own loop (21 steps per turn), a 32k context."""

TAU2_ROLLOUT = RolloutConfig(act_temperature=0.0, max_turns=tau2_rules.MAX_STEPS, max_tool_calls=100_000,
                             max_context_tokens=65536)
"""``tau2_eval.evaluate``'s default budgets: none below the Orchestrator's own limits (200 steps, 10 errors)."""


def progress(line: str) -> None:
    """One progress line on stderr, flushed at once (stdout keeps the report and its ``SUMMARY`` last line)."""
    print(f"progress: {line}", file=sys.stderr, flush=True)  # noqa: T201


def check_category(category: str) -> None:
    """Refuse a category no harness runs: with its reason (``bfcl_data.NOT_RUN``), else the valid list."""
    if category in bfcl_data.MULTI_TURN or category in bfcl_ast.SINGLE_TURN:
        return
    bfcl_data.refuse_not_run(category)
    raise ValueError(f"unknown BFCL category '{category}'; valid: {', '.join(OFFLINE_BFCL)}")


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------


def build_engine(model: str, chat_template: str | None = None, engine: str = "cached") -> tuple[Any, Any]:
    """``(engine, tokenizer)`` of a checkpoint directory or ``tiny``; ``(None, tokenizer)`` for ``gold``.

    Args:
        model: a checkpoint directory, ``tiny`` or ``gold``.
        chat_template: replaces the checkpoint's template (``chatml-tools`` or a jinja file; e.g. for an untrained
            SmolLM2, whose own template ignores tools).
        engine: ``cached`` (``CachedEngine``, envace's rollout engine) or ``hf`` (one ``generate`` per call); greedy
            outputs are the same tokens.
    """
    import torch

    from envace.engines.base import HFEngine
    from envace.engines.kv_engine import CachedEngine
    from envace.policy import HFPolicy, TinyPolicy
    from envace.policy.tiny import build_model

    if model in ("gold", "tiny"):
        _, tokenizer = TinyPolicy().build()
        if model == "gold":
            return None, tokenizer
        network = build_model(tokenizer, hidden=32, layers=1, seed=0, max_positions=32768)
    else:
        network, tokenizer = HFPolicy(model, chat_template=chat_template).build()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    network = network.to(device).eval()
    kind = CachedEngine if engine == "cached" else HFEngine
    return kind(network, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id]), tokenizer


def chat_model(model: str | None, max_new_tokens: int) -> Any:
    """A helper model (simulated user, judge): ``ChatModel(HFPolicy(DIR))``, ``tiny`` (random) or None."""
    from envace.engines.chat_model import ChatModel
    from envace.policy import HFPolicy, TinyPolicy

    if model is None:
        return None
    return ChatModel(TinyPolicy() if model == "tiny" else HFPolicy(model), max_new_tokens=max_new_tokens)


# ---------------------------------------------------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------------------------------------------------


def rehearsal_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(PrivateRehearsal, selector)`` from ``--rehearsals`` and friends; ``(None, None)`` without a budget."""
    from envace.rollout import private_rehearsal

    if not args.rehearsals:
        return None, None
    budget = private_rehearsal.PrivateRehearsal(args.rehearsals, args.rehearsal_mode, args.rehearsal_granularity,
                                                args.rehearsal_horizon)
    return budget, getattr(private_rehearsal, args.rehearsal_selector)()


def run_multi_turn(category: str, engine: Any, tokenizer: Any, limit: int | None, rollout: RolloutConfig,
                   split: str = "all", rehearsal: tuple[Any, Any] = (None, None)) -> dict[str, Any]:
    """One BFCL multi-turn category: accuracy and the verdict per entry (the gold policy: one entry at a time)."""
    entries = bfcl_data.load_split(category, split, limit=limit)
    if engine is None:
        valid = {e.id: bfcl.evaluate_multi_turn([e], bfcl.GoldPolicy(e, tokenizer), tokenizer, rollout)["valid"][e.id]
                 for e in entries}
    else:
        valid = bfcl.evaluate_multi_turn(entries, engine, tokenizer, rollout, *rehearsal)["valid"]
    return {"accuracy": sum(valid.values()) / len(valid), "valid": valid, "entries": len(valid)}


def run_single_turn(category: str, engine: Any, tokenizer: Any, limit: int | None, max_new_tokens: int
                    ) -> dict[str, Any]:
    """One BFCL single-turn category (gold: ``GoldASTEngine``): accuracy and the verdict per entry."""
    entries = bfcl_ast.load_single_turn(category, limit=limit)
    engine = engine or bfcl_ast_gold.GoldASTEngine(entries, tokenizer)
    valid = bfcl_ast.evaluate_single_turn(entries, engine, tokenizer, max_new_tokens=max_new_tokens)["valid"]
    return {"accuracy": sum(valid.values()) / len(valid), "valid": valid, "entries": len(valid)}


def run_bfcl(categories: list[str], engine: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every category (timed), then the offline aggregate over them: ``{category: result, "aggregate": ...}``."""
    rollout = replace(BFCL_ROLLOUT, act_max_new_tokens=args.act_max_new_tokens or BFCL_ROLLOUT.act_max_new_tokens)
    results: dict[str, Any] = {}
    for category in categories:
        start = time.perf_counter()
        if category in bfcl_data.MULTI_TURN:
            results[category] = run_multi_turn(category, engine, tokenizer, args.bfcl_limit, rollout, args.bfcl_split,
                                               rehearsal_of(args))
        else:
            results[category] = run_single_turn(category, engine, tokenizer, args.bfcl_limit,
                                                args.act_max_new_tokens or 1024)
        results[category]["seconds"] = time.perf_counter() - start
        r = results[category]
        progress(f"bfcl {category} {sum(r['valid'].values())}/{r['entries']} valid, {r['seconds']:.0f} s")
    aggregate = bfcl_ast.offline_aggregate({c: r["accuracy"] for c, r in results.items()},
                                           {c: r["entries"] for c, r in results.items()})
    return {"categories": results, "aggregate": aggregate}


def run_tau2(domain: str, engine: Any, tokenizer: Any, user: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One tau^2 domain: pass^k, the floor, the rewards and failed users per task (gold: one task at a time)."""
    from envace.benchmarks.passk import pass_hat_k

    tasks = tau2.load_tasks(domain, args.tau2_split)[: args.tau2_limit]
    start = time.perf_counter()
    if engine is None:  # gold, solo only (checked in main)
        result = {"rewards": {}, "failed": {}}
        for task in tasks:
            result["rewards"].update(tau2_eval.evaluate_solo([task], tau2_eval.GoldSoloPolicy(task, tokenizer),
                                                             tokenizer, domain=domain)["rewards"])
        result["pass_hat"] = {1: pass_hat_k([[r >= 1.0 for r in rs] for rs in result["rewards"].values()], 1)}
        result["floor"] = sum(tau2.reward(t, tau2.null_trajectory(), domain, solo=True) for t in tasks) / len(tasks)
    else:
        rollout = replace(TAU2_ROLLOUT, act_max_new_tokens=args.act_max_new_tokens or TAU2_ROLLOUT.act_max_new_tokens,
                          max_user_turns=args.max_user_turns)
        budget, selector = rehearsal_of(args)
        result = tau2_eval.evaluate(tasks, engine, tokenizer, domain, args.tau2_mode, user=user, rollout=rollout,
                                    trials=args.tau2_trials, rehearsal=budget, selector=selector)
    out = {k: result[k] for k in ("pass_hat", "floor", "rewards", "failed")}
    out["user_model"] = "none (solo)" if args.tau2_mode == "solo" else describe_model(user)
    seconds = time.perf_counter() - start
    progress(f"tau2 {domain} {args.tau2_mode} pass^1 {_f(out['pass_hat'].get(1))} on {len(tasks)} tasks, "
             f"floor {_f(out['floor'])}, {seconds:.0f} s")
    return {**out, "tasks": len(tasks), "seconds": seconds}


def run_finmcp(engine: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """FinMCP-Bench's teacher-forced protocol on ``--finmcp``: the scores and their schema source."""
    from envace.benchmarks.finmcp import load_finmcp
    from envace.benchmarks.finmcp_eval import evaluate_finmcp, load_tool_schemas

    start = time.perf_counter()
    records = load_finmcp(args.finmcp)[: args.finmcp_limit]
    tools = load_tool_schemas(args.finmcp_tools) if args.finmcp_tools else None
    result = evaluate_finmcp(records, engine, tokenizer, tools=tools, max_new_tokens=args.act_max_new_tokens or 256)
    scores = result["scores"]
    keep = ("schema_source", "schema_sources", "steps", "overflow", "parse_errors", "truncated", "predictions")
    return {"macro": scores.macro, "micro": scores.micro, "records": scores.records, "groups": scores.groups,
            **{k: result[k] for k in keep}, "seconds": time.perf_counter() - start}


def run_vita(engine: Any, tokenizer: Any, user: Any, judge: Any, args: argparse.Namespace) -> dict[str, Any]:
    """VitaBench on ``--vita`` with the simulated user and the rubric judge."""
    from envace.benchmarks.vita import load_vita
    from envace.benchmarks.vita_eval import DEFAULT_ROLLOUT, evaluate_vita
    from envace.benchmarks.vita_scoring import RubricJudge

    start = time.perf_counter()
    tasks = load_vita(args.vita)[: args.vita_limit]
    rollout = replace(DEFAULT_ROLLOUT, act_max_new_tokens=args.act_max_new_tokens or DEFAULT_ROLLOUT.act_max_new_tokens,
                      max_user_turns=args.max_user_turns)
    result = evaluate_vita(tasks, engine, tokenizer, user, RubricJudge(judge), trials=args.vita_trials,
                           rollout=rollout, language=args.vita_language)
    keep = ("official", "scored", "avg_reward", "avg_rubric_score", "order_match_unofficial", "pass_hat", "pass_at",
            "rewards", "failed", "premature", "judge_failures", "judged", "judge_calls", "episodes")
    return {**{k: result[k] for k in keep}, "user_model": describe_model(user), "judge_model": describe_model(judge),
            "tasks": len(tasks), "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def bfcl_lines(result: dict[str, Any], model: str, limit: int | None) -> list[str]:
    """Per-category accuracy, then the aggregate with its components and its note."""
    lines = ["| BFCL-v4 category (offline) | checker | policy | entries | accuracy | s |", "|---|---|---|---|---|---|"]
    for category, r in result["categories"].items():
        checker = "multi_turn_checker" if category in bfcl_data.MULTI_TURN else (
            "relevance rule" if category in bfcl_ast.IRRELEVANCE + bfcl_ast.RELEVANCE else "AST checker")
        lines.append(f"| {category} | {checker} | {model} | {r['entries']} | {r['accuracy']:.3f} | "
                     f"{r['seconds']:.0f} |")
    agg = result["aggregate"]
    live = "count-weighted by the entries evaluated" if limit is not None else "count-weighted, BFCL's full sizes"
    lines += ["", "| BFCL offline aggregate | value |", "|---|---|", f"| NonLive | {_f(agg['non_live'])} |",
              f"| Live ({live}) | {_f(agg['live'])} |", f"| Irrelevance | {_f(agg['irrelevance'])} |",
              f"| MultiTurn | {_f(agg['multi_turn'])} |", f"| **bfcl_offline** | {_f(agg['bfcl_offline'])} |", "",
              f"Note: {agg['note']}."]
    if agg["missing"]:
        lines.append(f"bfcl_offline needs every offline category; missing: {', '.join(agg['missing'])}.")
    return lines


def tau2_lines(results: dict[str, Any], model: str, args: argparse.Namespace) -> list[str]:
    """pass^k with the floor next to it, and the user model, per domain."""
    k = f"pass^1..pass^{args.tau2_trials}" if args.tau2_trials > 1 else "pass^1"
    lines = [f"| tau^2 domain, mode, split | policy | user model | tasks | {k} | floor | failed user trials | s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        passes = " / ".join(f"{v:.3f}" for v in r["pass_hat"].values()) or "–"
        lines.append(f"| {name}, {args.tau2_split} | {model} | {r['user_model']} | {r['tasks']} | {passes} | "
                     f"{r['floor']:.3f} | {sum(r['failed'].values())} | {r['seconds']:.0f} |")
    return lines


def finmcp_lines(r: dict[str, Any], model: str) -> list[str]:
    """Macro TP/TR/TF1/EMR, micro P/R/F1 and the tool-schema source."""
    macro, micro = r["macro"], r["micro"]
    return ["| FinMCP-Bench (teacher-forced) | policy | records | TP | TR | TF1 | EMR | micro P / R / F1 | "
            "tool schemas | s |", "|---|---|---|---|---|---|---|---|---|---|",
            f"| macro over records | {model} | {r['records']} | {macro['precision']:.3f} | {macro['recall']:.3f} | "
            f"{macro['f1']:.3f} | {macro['exact_match']:.3f} | {micro['precision']:.3f} / {micro['recall']:.3f} / "
            f"{micro['f1']:.3f} | {r['schema_source']} | {r['seconds']:.0f} |"]


def vita_lines(r: dict[str, Any], model: str) -> list[str]:
    """The rubric judge's scores, the unofficial order proxy, and both helper models."""
    order = r["order_match_unofficial"]["mean"]
    return ["| VitaBench | policy | user model | judge model | scored | reward | rubric score | order match "
            "(UNOFFICIAL) | s |", "|---|---|---|---|---|---|---|---|---|",
            f"| rubric judge | {model} | {r['user_model']} | {r['judge_model']} | {r['scored']} | "
            f"{_f(r['avg_reward'])} | {_f(r['avg_rubric_score'])} | {_f(order)} | {r['seconds']:.0f} |",
            "", f"Order match: {ORDER_MATCH_NOTE}."]


def summary(results: dict[str, Any]) -> str:
    """The ``SUMMARY`` line: key=value pairs for what ran (``nan`` where nothing could be scored)."""
    pairs: dict[str, float | None] = {}
    if "bfcl" in results:
        pairs.update({bfcl_key(c): r["accuracy"] for c, r in results["bfcl"]["categories"].items()})
        aggregate = results["bfcl"]["aggregate"]
        pairs.update({f"bfcl_{p}": aggregate[p] for p in BFCL_COMPONENTS if aggregate[p] is not None})
        if aggregate["bfcl_offline"] is not None:
            pairs["bfcl_offline"] = aggregate["bfcl_offline"]
    for name, r in results.get("tau2", {}).items():
        pairs[name], pairs[f"{name}_floor"] = r["pass_hat"].get(1), r["floor"]
    if "finmcp" in results:
        macro = results["finmcp"]["macro"]
        pairs.update({"finmcp_tp": macro["precision"], "finmcp_tr": macro["recall"], "finmcp_tf1": macro["f1"],
                      "finmcp_emr": macro["exact_match"]})
    if "vita" in results:
        vita = results["vita"]
        pairs.update({"vita_reward": vita["avg_reward"], "vita_rubric_score": vita["avg_rubric_score"],
                      "vita_order_match_unofficial": vita["order_match_unofficial"]["mean"]})
    return "SUMMARY " + " ".join(f"{k}={'nan' if v is None else f'{v:.3f}'}" for k, v in pairs.items())


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint directory, 'tiny' or 'gold'")
    parser.add_argument("--chat-template", default=None,
                        help="replace the checkpoint's chat template: chatml-tools or a jinja file (e.g. for an "
                             "untrained SmolLM2, whose own template ignores tools)")
    parser.add_argument("--engine", default="cached", choices=("cached", "hf"),
                        help="cached: envace's CachedEngine (default); hf: one transformers generate per call")
    parser.add_argument("--bfcl-categories", nargs="*", default=OFFLINE_BFCL, metavar="CATEGORY",
                        help="BFCL categories, multi-turn and single-turn (default: every offline one; none: no BFCL)")
    parser.add_argument("--bfcl-limit", type=int, default=None, help="first entries of each category (default: all)")
    parser.add_argument("--bfcl-split", default="all", choices=bfcl_data.SPLITS,
                        help="multi-turn entries: all 200, or the eval ids held out of training exports (or train)")
    parser.add_argument("--rehearsals", type=int, default=0,
                        help="private rehearsal: imagined attempts before each committed turn (BFCL multi-turn, tau^2)")
    parser.add_argument("--rehearsal-mode", default="parallel", choices=("parallel", "sequential"))
    parser.add_argument("--rehearsal-granularity", default="step", choices=("step", "task"))
    parser.add_argument("--rehearsal-horizon", type=int, default=2, help="most act turns of one imagined attempt")
    parser.add_argument("--rehearsal-selector", default="MemoryCommit",
                        choices=("MemoryCommit", "MajorityCommit", "OutcomeMajorityCommit", "JudgedCommit"),
                        help="what a rehearsal commits (envace.rollout.private_rehearsal)")
    parser.add_argument("--tau2-domains", nargs="*", default=["telecom"], choices=tau2.DOMAINS, metavar="DOMAIN",
                        help=f"tau^2 domains, of {', '.join(tau2.DOMAINS)} (default: telecom; none: no tau^2)")
    parser.add_argument("--tau2-mode", default="solo", choices=tau2_tasks.MODES, help="solo (telecom only) or user")
    parser.add_argument("--tau2-split", default="test", choices=tau2.SPLITS)
    parser.add_argument("--tau2-limit", type=int, default=None, help="first tasks per domain (default: the split)")
    parser.add_argument("--tau2-trials", "--trials", type=int, default=1, help="trials per task (pass^1..pass^k)")
    parser.add_argument("--user-model", default=None, help="the simulated user: a checkpoint directory, or 'tiny'")
    parser.add_argument("--judge-model", default=None, help="VitaBench's judge: a checkpoint directory or 'tiny'")
    parser.add_argument("--helper-max-new-tokens", type=int, default=512, help="reply budget of the user and judge")
    parser.add_argument("--max-user-turns", type=int, default=30, help="user turns per conversation with a user")
    parser.add_argument("--act-max-new-tokens", type=int, default=None,
                        help="the policy's budget per turn (default: each harness's own)")
    parser.add_argument("--finmcp", default=None, metavar="FILE", help="a FinMCP-Bench file (JSON array or lines)")
    parser.add_argument("--finmcp-tools", default=None, metavar="FILE", help="FinMCP tool schemas (JSON)")
    parser.add_argument("--finmcp-limit", type=int, default=None, help="first FinMCP records (default: all)")
    parser.add_argument("--vita", default=None, metavar="FILE", help="a VitaBench task file")
    parser.add_argument("--vita-limit", type=int, default=None, help="first VitaBench tasks (default: all)")
    parser.add_argument("--vita-trials", type=int, default=1, help="VitaBench episodes per task")
    parser.add_argument("--vita-language", default="english", choices=("english", "chinese"))
    parser.add_argument("--out", default="runs/benchmarks/results.json")
    return parser


def _check_model(parser: argparse.ArgumentParser, flag: str, value: str | None, allowed: tuple[str, ...]) -> None:
    """A model flag names a checkpoint directory (with config.json) or one of ``allowed``."""
    if value is not None and value not in allowed and not Path(value, "config.json").is_file():
        parser.error(f"{flag} {value}: no config.json there (an exported checkpoint directory or "
                     f"{' or '.join(repr(a) for a in allowed)})")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse inconsistent options, naming the flag."""
    _check_model(parser, "--model", args.model, ("gold", "tiny"))
    _check_model(parser, "--user-model", args.user_model, ("tiny",))
    _check_model(parser, "--judge-model", args.judge_model, ("tiny",))
    for category in args.bfcl_categories:
        try:
            check_category(category)
        except ValueError as exc:
            parser.error(f"--bfcl-categories: {exc}")
    if len(set(args.bfcl_categories)) < len(args.bfcl_categories):
        parser.error("--bfcl-categories: a category is listed twice")
    for flag in ("bfcl_limit", "tau2_limit", "finmcp_limit", "vita_limit", "tau2_trials", "vita_trials"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    solo_only = [d for d in args.tau2_domains if d not in tau2.SOLO_DOMAINS]
    if args.tau2_mode == "solo" and solo_only:
        parser.error(f"--tau2-domains {' '.join(solo_only)}: no solo mode; use --tau2-mode user with --user-model")
    if args.tau2_domains and args.tau2_mode == "user" and args.user_model is None:
        parser.error("--tau2-mode user needs --user-model (the simulated user's checkpoint)")
    if args.vita and (args.judge_model is None or args.user_model is None):
        parser.error("--vita needs --judge-model and --user-model")
    for flag, path in (("--finmcp", args.finmcp), ("--finmcp-tools", args.finmcp_tools), ("--vita", args.vita)):
        if path is not None and not Path(path).is_file():
            parser.error(f"{flag} {path}: no such file")
    if args.finmcp_tools and not args.finmcp:
        parser.error("--finmcp-tools needs --finmcp")
    gold_missing = [f for f, on in (("--tau2-mode user", args.tau2_domains and args.tau2_mode == "user"),
                                    ("--finmcp", args.finmcp), ("--vita", args.vita)) if on]
    if args.rehearsals < 0 or args.rehearsal_horizon < 0:
        parser.error("--rehearsals and --rehearsal-horizon must be >= 0")
    if args.rehearsals and args.model == "gold":
        gold_missing.append("--rehearsals")
    if args.model == "gold" and gold_missing:
        parser.error(f"--model gold replays BFCL and tau^2 solo only; no gold policy for {', '.join(gold_missing)}")


def run_all(args: argparse.Namespace, engine: Any, tokenizer: Any) -> tuple[dict[str, Any], list[str]]:
    """Every benchmark asked for: the results (by benchmark) and the report's lines."""
    results: dict[str, Any] = {}
    lines: list[str] = []
    if args.rehearsals:
        lines += [f"Private rehearsal (BFCL multi-turn and tau^2): {args.rehearsals} {args.rehearsal_mode} attempts "
                  f"of at most {args.rehearsal_horizon} act turns before each committed "
                  f"{'turn' if args.rehearsal_granularity == 'step' else 'episode'}; {args.rehearsal_selector} "
                  "commits; attempts never reach the environment.", ""]
    if args.bfcl_categories:
        results["bfcl"] = run_bfcl(args.bfcl_categories, engine, tokenizer, args)
        lines += bfcl_lines(results["bfcl"], args.model, args.bfcl_limit) + [""]
    user = chat_model(args.user_model, args.helper_max_new_tokens)
    if args.tau2_domains:
        results["tau2"] = {f"tau2_{d}_{args.tau2_mode}": run_tau2(d, engine, tokenizer, user, args)
                           for d in args.tau2_domains}
        lines += tau2_lines(results["tau2"], args.model, args) + [""]
    if args.finmcp:
        results["finmcp"] = run_finmcp(engine, tokenizer, args)
        lines += finmcp_lines(results["finmcp"], args.model) + [""]
    if args.vita:
        judge = chat_model(args.judge_model, args.helper_max_new_tokens)
        results["vita"] = run_vita(engine, tokenizer, user, judge, args)
        lines += vita_lines(results["vita"], args.model) + [""]
    return results, lines


def results_json(model: str, results: dict[str, Any]) -> dict[str, Any]:
    """The results file: ``bfcl_<category>`` and ``bfcl_aggregate``, ``tau2_<domain>_<mode>``, ``finmcp``, ``vita``."""
    out: dict[str, Any] = {"model": model}
    if "bfcl" in results:
        out.update({bfcl_key(c): r for c, r in results["bfcl"]["categories"].items()})
        out["bfcl_aggregate"] = results["bfcl"]["aggregate"]
    out.update(results.get("tau2", {}))
    out.update({k: results[k] for k in ("finmcp", "vita") if k in results})
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    engine, tokenizer = build_engine(args.model, args.chat_template, args.engine)
    results, lines = run_all(args, engine, tokenizer)
    print("\n".join(lines).rstrip())  # noqa: T201
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results_json(args.model, results), indent=1, default=str), encoding="utf-8")
    print(summary(results))  # noqa: T201


if __name__ == "__main__":
    main()
