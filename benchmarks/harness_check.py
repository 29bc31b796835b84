"""Harness validation: the benchmark harnesses score a gold-replay policy 100% and a do-nothing policy at the floor.

- **BFCL-v4 multi-turn** (all four categories, every entry by default): the ground-truth calls, parsed with
  ``envace.benchmarks.bfcl_env.parse_calls`` and checked by BFCL's own ``multi_turn_checker``, must be valid; the gold
  policy (``GoldPolicy``: the same calls written as ``<tool_call>`` text, through envace's rollout, schema checks and
  environments) must score 100% (not yet for miss_func, whose functions arrive mid-conversation); and the gold
  replays double as fidelity probes: a second fresh environment standing in as the rehearser must reproduce every
  response exactly (exact match under ``envace.world_model.fidelity``).
- **BFCL-v4 single-turn** (every category of ``envace.benchmarks.bfcl_ast.SINGLE_TURN``, every entry by default):
  each entry's gold output (``gold_output``: the answer's first allowed values as ``<tool_call>`` blocks, plain text
  for irrelevance) is served by ``GoldASTEngine`` and scored by ``evaluate_single_turn`` (BFCL's AST checker and
  relevance rules). Expected 97-100% per category: the 8 misses of the full run are BFCL data problems, not harness
  ones (simple_java 36 and 65: "any"-typed list answers hold numbers that BFCL's converter turns into strings;
  simple_java_64: an answer given as a bare string, not a list of allowed values; live_simple 106-63-0, 112-68-0 and
  live_multiple 507-149-4, 862-181-3, 964-207-0: answers that omit required arguments or name arguments the doc
  lacks); each miss is listed with BFCL's error.
- **tau^2-Bench** (telecom solo, airline and retail; ``base`` split by default): each task's gold actions, replayed
  on a fresh environment, must earn the full reward; the do-nothing policy earns the benchmark's floor (refusal tasks
  pass without any call), which is printed next to it.

- **Parity with the official runners** (``envace.benchmarks.parity``): gold answers and perturbations of every kind
  the official loops treat specially (wrong values, missing, extra and reordered calls, over-long turns, excluded and
  held-back functions, off-format output, plain-text endings, step and error limits), plus generated ones
  (``envace.benchmarks.parity_generated``, ``parity_families``: spaced names and keys, numbers out of range, unusual
  escapes, steps split elsewhere, empty messages), on a sample of entries of every BFCL category envace scores and of
  every tau^2 domain in solo and user mode. Both sides start from the same raw generations: envace's rollout with a
  scripted engine; bfcl-eval's own inference loop (``QwenFCHandler``, only its model query scripted) then its
  ``evaluate_task``, and tau^2's ``run_task`` with only litellm's ``completion`` scripted. Every disagreement is
  listed, and every case in which the official code itself crashes, with the verdict envace reports.

Run from the repository root: ``.venv/bin/python benchmarks/harness_check.py [--bfcl-limit N] [--tau2-split base]
[--no-parity]`` (``--bfcl-limit`` applies to multi-turn and single-turn categories alike). It prints a table per check;
the last line is ``SUMMARY bfcl_multi_turn_gold=<f> tau2_gold=<f> tau2_null=<f> parity=<agreeing>/<cases>`` (means
over the BFCL multi-turn categories and over the tau^2 domains; the single-turn gold pass rates are printed above it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envace.benchmarks import (  # noqa: E402
    bfcl,
    bfcl_ast,
    bfcl_ast_gold,
    bfcl_check,
    bfcl_data,
    bfcl_env,
    parity,
    parity_generated,
    tau2,
)
from envace.policy import TinyPolicy  # noqa: E402  (its tokenizer renders the gold policy's prompts)
from envace.roles.compare import score_response  # noqa: E402


def gold_policy_accuracy(entries: list[bfcl_data.BFCLEntry]) -> float:
    """The gold policy's accuracy through envace's rollout, scored by BFCL.

    Its tool-call text is parsed and executed as a policy's would be, under BFCL's inference protocol.
    """
    _, tokenizer = TinyPolicy().build()
    return statistics.fmean(
        bfcl.evaluate_multi_turn([e], bfcl.GoldPolicy(e, tokenizer), tokenizer)["accuracy"] for e in entries
    )


def bfcl_rows(limit: int | None) -> list[tuple[str, int, float, float, float, float]]:
    """Per category: entries, gold validity, the gold policy's accuracy, fidelity EM of a fresh replay, seconds."""
    rows = []
    for category in bfcl_data.MULTI_TURN:
        start = time.perf_counter()
        entries = bfcl_data.load_multi_turn(category, limit=limit)
        valid = [float(bfcl_check.check_multi_turn(e, bfcl_check.gold_calls(e))["valid"]) for e in entries]
        policy = gold_policy_accuracy(entries)
        exact = []
        for entry in entries:
            real, rehearser = bfcl_env.BFCLEnvironment(entry), bfcl_env.BFCLEnvironment(entry)
            for turn in bfcl_check.gold_calls(entry):
                for call in (c for step in turn for c in step):
                    exact.append(score_response(rehearser.execute(call), real.execute(call)).exact_match)
        rows.append((category, len(entries), statistics.fmean(valid), policy, statistics.fmean(exact),
                     time.perf_counter() - start))
    return rows


def single_turn_rows(limit: int | None) -> list[tuple[str, int, float, list[tuple[str, str]], float]]:
    """Per single-turn category: entries, the gold outputs' pass rate, the misses (id, BFCL's error type), seconds."""
    _, tokenizer = TinyPolicy().build()
    rows = []
    for category in bfcl_ast.SINGLE_TURN:
        start = time.perf_counter()
        entries = bfcl_ast.load_single_turn(category, limit=limit)
        result = bfcl_ast.evaluate_single_turn(entries, bfcl_ast_gold.GoldASTEngine(entries, tokenizer), tokenizer)
        misses = [(e.id, _error_type(e, result["outputs"][e.id])) for e in entries if not result["valid"][e.id]]
        rows.append((category, len(entries), result["accuracy"], misses, time.perf_counter() - start))
    return rows


def single_turn_lines(limit: int | None) -> list[str]:
    """The single-turn gold check as a table, then each miss with BFCL's error (BFCL data problems)."""
    rows = single_turn_rows(limit)
    lines = ["| BFCL-v4 single-turn category | entries | gold outputs pass (BFCL AST checker / relevance rule) "
             "| misses | s |", "|---|---|---|---|---|"]
    lines += [f"| {c} | {n} | {p:.3f} | {len(m)} | {s:.1f} |" for c, n, p, m, s in rows]
    misses = [f"- {entry} ({category}): {error}" for category, _, _, found, _ in rows for entry, error in found]
    return lines + (["", "Gold misses (BFCL data problems, see the module docstring):", *misses] if misses else [])


def _error_type(entry: bfcl_ast.ASTEntry, output: str) -> str:
    """BFCL's error type (and first error) of an output that failed."""
    verdict = bfcl_ast.check_entry(entry, bfcl_ast.decode_calls(output))
    errors = verdict.get("error") or [""]
    return f"{verdict.get('error_type', '?')}: {str(errors[0])[:100]}"


def tau2_rows(split: str) -> list[tuple[str, int, float, float, float]]:
    """Per domain: tasks, mean gold reward, mean do-nothing reward, seconds."""
    rows = []
    for domain in tau2.DOMAINS:
        start = time.perf_counter()
        solo = domain in tau2.SOLO_DOMAINS
        tasks = tau2.load_tasks(domain, split)
        gold = [tau2.reward(t, tau2.gold_trajectory(t, domain, solo), domain, solo) for t in tasks]
        null = [tau2.reward(t, tau2.null_trajectory(), domain, solo) for t in tasks]
        name = f"{domain} ({'solo' if solo else 'gold actions, no user'})"
        rows.append((name, len(tasks), statistics.fmean(gold), statistics.fmean(null), time.perf_counter() - start))
    return rows


def parity_lines() -> tuple[list[str], int, int]:
    """The parity check as a table per benchmark and category, then every disagreement; ``(lines, agree, cases)``."""
    _, tokenizer = TinyPolicy().build()
    groups: dict[tuple[str, str], list[parity.Verdict]] = {}
    seconds: dict[tuple[str, str], float] = {}
    for case in parity_generated.all_cases():
        start = time.perf_counter()
        key = (case.benchmark, case.category)
        groups.setdefault(key, []).append(parity.run_case(case, tokenizer))
        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
    lines = ["| parity: benchmark | category | cases | kinds | envace = official | envace passes | s |",
             "|---|---|---|---|---|---|---|"]
    for key, verdicts in groups.items():
        kinds = len({v.case.kind for v in verdicts})
        agree = sum(v.agree for v in verdicts)
        passes = sum(v.envace > 0 for v in verdicts)
        lines.append(f"| {key[0]} | {key[1]} | {len(verdicts)} | {kinds} | {agree} | {passes} | {seconds[key]:.1f} |")
    every = [v for vs in groups.values() for v in vs]
    misses = [f"- {v.describe()}" for v in every if not v.agree]
    if misses:
        lines += ["", "Disagreements:", *misses]
    crashes = [f"- {v.describe()}" for v in every if v.official_crash]
    if crashes:
        lines += ["", "The official code crashes (envace's verdict is its checkers' verdict):", *crashes]
    return lines, sum(v.agree for v in every), len(every)


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bfcl-limit", type=int, default=None, help="entries per BFCL category (default: all)")
    parser.add_argument("--tau2-split", default="base", choices=tau2.SPLITS)
    parser.add_argument("--no-parity", action="store_true", help="skip the check against the official runners")
    args = parser.parse_args(argv)
    lines = ["| BFCL-v4 multi-turn category | entries | gold calls valid (BFCL checker) | gold policy through the "
             "rollout | fidelity EM, real env as rehearser | s |", "|---|---|---|---|---|---|"]
    bfcl_result = bfcl_rows(args.bfcl_limit)
    lines += [f"| {c} | {n} | {v:.3f} | {p:.3f} | {e:.3f} | {s:.1f} |" for c, n, v, p, e, s in bfcl_result]
    lines += ["", *single_turn_lines(args.bfcl_limit)]
    lines += ["", f"| tau^2 domain, {args.tau2_split} split | tasks | gold reward | do-nothing reward (floor) | s |",
              "|---|---|---|---|---|"]
    tau2_result = tau2_rows(args.tau2_split)
    lines += [f"| {d} | {n} | {g:.3f} | {z:.3f} | {s:.1f} |" for d, n, g, z, s in tau2_result]
    agree_text = ""
    if not args.no_parity:
        parity_table, agree, total = parity_lines()
        lines += ["", *parity_table]
        agree_text = f" parity={agree}/{total}"
    print("\n".join(lines))  # noqa: T201
    print(  # noqa: T201
        f"SUMMARY bfcl_multi_turn_gold={statistics.fmean(r[2] for r in bfcl_result):.3f} "
        f"tau2_gold={statistics.fmean(r[2] for r in tau2_result):.3f} "
        f"tau2_null={statistics.fmean(r[3] for r in tau2_result):.3f}{agree_text}"
    )


if __name__ == "__main__":
    main()
