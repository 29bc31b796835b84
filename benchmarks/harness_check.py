"""Harness validation: the benchmark harnesses score a gold-replay policy 100% and a do-nothing policy at the floor.

- **BFCL-v4 multi-turn** (all four categories, every entry by default): the ground-truth calls, parsed with
  ``envace.benchmarks.bfcl.parse_calls`` and checked by BFCL's own ``multi_turn_checker``, must be valid; the gold
  policy (``GoldPolicy``: the same calls written as ``<tool_call>`` text, through envace's rollout, schema checks and
  environments) must score 100% (not yet for miss_func, whose functions arrive mid-conversation); and the gold
  replays double as fidelity probes: a second fresh environment standing in as the rehearser must reproduce every
  response exactly (exact match under ``envace.fidelity``).
- **tau^2-Bench** (telecom solo, airline and retail; ``base`` split by default): each task's gold actions, replayed
  on a fresh environment, must earn the full reward; the do-nothing policy earns the benchmark's floor (refusal tasks
  pass without any call), which is printed next to it.

Run from the repository root: ``.venv/bin/python benchmarks/harness_check.py [--bfcl-limit N] [--tau2-split base]``.
It prints a table; the last line is ``SUMMARY bfcl_multi_turn_gold=<f> tau2_gold=<f> tau2_null=<f>`` (means over the
BFCL categories and over the tau^2 domains).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envace.benchmarks import bfcl, tau2  # noqa: E402
from envace.fidelity import score_response  # noqa: E402
from envace.policy import TinyPolicy  # noqa: E402  (its tokenizer renders the gold policy's prompts)


def gold_policy_accuracy(entries: list[bfcl.BFCLEntry]) -> float:
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
    for category in bfcl.MULTI_TURN:
        start = time.perf_counter()
        entries = bfcl.load_multi_turn(category, limit=limit)
        valid = [float(bfcl.check_multi_turn(e, bfcl.gold_calls(e))["valid"]) for e in entries]
        policy = gold_policy_accuracy(entries)
        exact = []
        for entry in entries:
            real, rehearser = bfcl.BFCLEnvironment(entry), bfcl.BFCLEnvironment(entry)
            for turn in bfcl.gold_calls(entry):
                for call in (c for step in turn for c in step):
                    exact.append(score_response(rehearser.execute(call), real.execute(call)).exact_match)
        rows.append((category, len(entries), statistics.fmean(valid), policy, statistics.fmean(exact),
                     time.perf_counter() - start))
    return rows


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


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bfcl-limit", type=int, default=None, help="entries per BFCL category (default: all)")
    parser.add_argument("--tau2-split", default="base", choices=tau2.SPLITS)
    args = parser.parse_args(argv)
    lines = ["| BFCL-v4 multi-turn category | entries | gold calls valid (BFCL checker) | gold policy through the "
             "rollout | fidelity EM, real env as rehearser | s |", "|---|---|---|---|---|---|"]
    bfcl_result = bfcl_rows(args.bfcl_limit)
    lines += [f"| {c} | {n} | {v:.3f} | {p:.3f} | {e:.3f} | {s:.1f} |" for c, n, v, p, e, s in bfcl_result]
    lines += ["", f"| tau^2 domain, {args.tau2_split} split | tasks | gold reward | do-nothing reward (floor) | s |",
              "|---|---|---|---|---|"]
    tau2_result = tau2_rows(args.tau2_split)
    lines += [f"| {d} | {n} | {g:.3f} | {z:.3f} | {s:.1f} |" for d, n, g, z, s in tau2_result]
    print("\n".join(lines))  # noqa: T201
    print(  # noqa: T201
        f"SUMMARY bfcl_multi_turn_gold={statistics.fmean(r[2] for r in bfcl_result):.3f} "
        f"tau2_gold={statistics.fmean(r[2] for r in tau2_result):.3f} "
        f"tau2_null={statistics.fmean(r[3] for r in tau2_result):.3f}"
    )


if __name__ == "__main__":
    main()
