"""Evaluate a policy offline on BFCL-v4 multi-turn and tau^2-Bench telecom (solo), as the benchmarks score them.

The policy is an exported envace checkpoint (any Hugging Face causal LM directory with its tokenizer and chat
template; ``--model tiny`` builds the tiny random model, a smoke test), or ``--model gold``: the gold-replay policy,
which must score 100% (the harness check). BFCL entries are scored by BFCL's own ``multi_turn_checker``; tau^2 tasks
by tau^2's evaluators, with pass^k over ``--trials`` and the do-nothing floor printed next to the score.

Run from the repository root::

    .venv/bin/python benchmarks/evaluate_policy.py --model runs/demo/rl/policy                      # all 200 + 40
    .venv/bin/python benchmarks/evaluate_policy.py --model gold
    .venv/bin/python benchmarks/evaluate_policy.py --model runs/demo/rl/policy --bfcl-limit 20 --tau2-split base

It prints a table and writes the per-entry results as JSON (``--out``). The last line is
``SUMMARY bfcl_multi_turn_base=<f> tau2_telecom_solo=<f> tau2_floor=<f>``. Runs on the GPU when there is one.
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
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envace.benchmarks import bfcl, tau2  # noqa: E402
from envace.benchmarks.passk import pass_hat_k  # noqa: E402


def build_engine(model: str) -> tuple[Any, Any]:
    """``(engine, tokenizer)`` of a checkpoint directory or ``tiny``; ``(None, tokenizer)`` for ``gold``."""
    import torch

    from envace.policy import HFPolicy, TinyPolicy
    from envace.policy.tiny import build_model
    from envace.rollout.engine import HFEngine

    if model in ("gold", "tiny"):
        _, tokenizer = TinyPolicy().build()
        if model == "gold":
            return None, tokenizer
        network = build_model(tokenizer, hidden=32, layers=1, seed=0, max_positions=32768)
    else:
        network, tokenizer = HFPolicy(model).build()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    network = network.to(device).eval()
    return HFEngine(network, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id]), tokenizer


def run_bfcl(engine: Any, tokenizer: Any, limit: int | None) -> dict[str, Any]:
    """BFCL multi_turn_base: accuracy and the verdict per entry."""
    entries = bfcl.load_multi_turn("multi_turn_base", limit=limit)
    if engine is None:  # the gold policy serves one episode at a time
        valid = {e.id: bfcl.evaluate_multi_turn([e], bfcl.GoldPolicy(e, tokenizer), tokenizer)["valid"][e.id]
                 for e in entries}
    else:
        valid = bfcl.evaluate_multi_turn(entries, engine, tokenizer)["valid"]
    return {"accuracy": sum(valid.values()) / len(valid), "valid": valid}


def run_tau2(engine: Any, tokenizer: Any, split: str, trials: int, limit: int | None) -> dict[str, Any]:
    """tau^2 telecom solo: pass^k, the floor and the rewards per task."""
    tasks = tau2.load_tasks("telecom", split)[:limit]
    if engine is None:
        rewards = {}
        for task in tasks:
            result = tau2.evaluate_solo([task], tau2.GoldSoloPolicy(task, tokenizer), tokenizer)
            rewards.update(result["rewards"])
        successes = [[r >= 1.0 for r in rs] for rs in rewards.values()]
        floor = sum(tau2.reward(t, tau2.null_trajectory(), "telecom", solo=True) for t in tasks) / len(tasks)
        return {"pass_hat": {1: pass_hat_k(successes, 1)}, "floor": floor, "rewards": rewards}
    result = tau2.evaluate_solo(tasks, engine, tokenizer, trials=trials)
    return {k: result[k] for k in ("pass_hat", "floor", "rewards")}


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint directory, 'tiny' or 'gold'")
    parser.add_argument("--bfcl-limit", type=int, default=None, help="entries of multi_turn_base (default: all 200)")
    parser.add_argument("--tau2-split", default="test", choices=tau2.SPLITS)
    parser.add_argument("--tau2-limit", type=int, default=None, help="telecom tasks (default: the whole split)")
    parser.add_argument("--trials", type=int, default=1, help="tau^2 trials per task (pass^1..pass^trials)")
    parser.add_argument("--out", default="runs/benchmarks/results.json")
    args = parser.parse_args(argv)
    if args.model not in ("gold", "tiny") and not Path(args.model, "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (an exported checkpoint directory, 'tiny' or 'gold')")
    engine, tokenizer = build_engine(args.model)
    start = time.perf_counter()
    bfcl_result = run_bfcl(engine, tokenizer, args.bfcl_limit)
    bfcl_seconds = time.perf_counter() - start
    tau2_result = run_tau2(engine, tokenizer, args.tau2_split, args.trials, args.tau2_limit)
    tau2_seconds = time.perf_counter() - start - bfcl_seconds
    pass_hat = tau2_result["pass_hat"]
    lines = [
        "| benchmark (offline) | policy | entries | score | floor | s |", "|---|---|---|---|---|---|",
        f"| BFCL-v4 multi_turn_base (BFCL checker) | {args.model} | {len(bfcl_result['valid'])} | "
        f"{bfcl_result['accuracy']:.3f} | – | {bfcl_seconds:.0f} |",
        f"| tau^2 telecom solo, {args.tau2_split} (pass^1" + (f"..pass^{args.trials}" if args.trials > 1 else "")
        + f") | {args.model} | {len(tau2_result['rewards'])} | "
        + " / ".join(f"{v:.3f}" for v in pass_hat.values()) + f" | {tau2_result['floor']:.3f} | {tau2_seconds:.0f} |",
    ]
    print("\n".join(lines))  # noqa: T201
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": args.model, "bfcl_multi_turn_base": bfcl_result,
                                          "tau2_telecom_solo": tau2_result}, indent=1), encoding="utf-8")
    print(f"SUMMARY bfcl_multi_turn_base={bfcl_result['accuracy']:.3f} "  # noqa: T201
          f"tau2_telecom_solo={pass_hat[1]:.3f} tau2_floor={tau2_result['floor']:.3f}")


if __name__ == "__main__":
    main()
