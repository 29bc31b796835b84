"""Ablation: does private rehearsal at test time help, and does it help only a policy trained with world rehearsal?

The paper's claim: at test time the internalised world model lets the agent rehearse privately before it commits an
action, which helps under a moderate budget, while the same procedure does not help a base policy. This script runs
the rehearsal agent (``envace.rollout.rehearsing.RehearsingRunner``, through ``callbacks.rehearsal_budget``) on the
built-in bank domain's test split, in the real environment, for budgets 0 (plain acting), 1, 2, 4 and 8 imagined
attempts before every committed act turn, in parallel and sequential mode, for two policies per seed:

- **envace**: arm (a) of ``benchmarks/controlled_study.py``, trained with world rehearsal from the warm start;
- **base**: that warm start (SFT on demonstrations only).

Both come from the controlled study's output directory (``--out``, default ``runs/study``); a missing one is trained
first, with the study's settings. Every (seed, policy) job saves its result as JSON under ``--out``, so an
interrupted run resumes. It writes its section of ``docs/results.md`` (between its markers) with the exact command,
a plot ``docs/rehearsal_budget.png``, and prints the section; the last line is ``SUMMARY envace_best_gain=<success at
the best budget minus budget 0, means over seeds> base_best_gain=<the same for the warm start>
real_calls_in_rehearsal=<real calls made by all rehearsals: 0>``.

Run from the repository root: ``.venv/bin/python benchmarks/rehearsal_budget.py [--seeds 0 1 2] [--workers 2]``.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from study_jobs import rl_arm, warm_start  # noqa: E402
from study_plan import Job, run_all  # noqa: E402
from study_report import write_section  # noqa: E402
from study_settings import RL_CONFIG, Settings  # noqa: E402

SECTION = "rehearsal_budget"
POLICIES = {"envace": "a", "base": "warm"}
"""Policy name -> the controlled study's job whose exported policy it is."""


def ablate(seed: int, name: str, tasks: str, budgets: list[int], horizon: int, selector: str, out: str,
           policy: str) -> dict[str, Any]:
    """The budget ablation of one checkpoint: ``envace test`` with ``RehearsalBudgetAblation``; its record."""
    from envace.cli.lightning import cli_main

    callback = {"class_path": "callbacks.rehearsal_budget.RehearsalBudgetAblation",
                "init_args": {"tasks": tasks, "limit": None, "budgets": budgets, "horizon": horizon, "seed": seed,
                              "selector": {"class_path": selector},
                              "output_dir": f"{out}/seed{seed}/rehearsal_budget/{name}"}}
    cli = cli_main([
        "test", "--config", RL_CONFIG, "--model.init_args.policy=envace.policy.HFPolicy",
        f"--model.init_args.policy.init_args.name_or_path={policy}",
        "--data.test_tasks=builtin:bank-test:1", "--trainer.limit_test_batches=1", "--trainer.logger=false",
        f"--trainer.default_root_dir={out}/seed{seed}/rehearsal_budget", f"--seed_everything={seed}",
        "--model.init_args.eval_imagined=false", "--model.init_args.eval_fidelity=false",
        f"--trainer.callbacks={json.dumps([callback])}",
    ])
    (ablation,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "RehearsalBudgetAblation"]
    return ablation.history[-1]


def job_key(tag: str, seed: int, name: str) -> str:
    """The saved result of one ablation job; ``tag`` names its settings, so other settings never reuse it."""
    return f"rb-{tag}-s{seed}-{name}"


def plan(settings: Settings, seeds: list[int], tasks: str, budgets: list[int], horizon: int, selector: str,
         tag: str) -> list[Job]:
    """The study's warm starts and arm (a) (reused when saved), then one ablation job per seed and policy."""
    jobs = []
    for s in seeds:
        jobs.append(Job(f"s{s}-warm", warm_start, (settings, s)))
        jobs.append(Job(f"s{s}-a", rl_arm, (settings, s, "a"), (f"s{s}-warm",)))
        for name, source in POLICIES.items():
            key = f"s{s}-{source}"
            jobs.append(Job(job_key(tag, s, name), ablate, (s, name, tasks, budgets, horizon, selector, settings.out),
                            (key,),
                            lambda r, key=key: (r[key]["policy"],)))
    return jobs


# --- report ----------------------------------------------------------------------------------------------------------


def _cell(values: list[float], digits: int = 3) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _values(results: dict[str, dict[str, Any]], seeds: list[int], name: str, mode: str, budget: int,
            key: str) -> list[float]:
    """``key`` of one (policy, mode, budget) cell, per seed (``results`` holds only this run's ablation jobs)."""
    rows = {s: next(v for k, v in results.items() if k.endswith(f"-s{s}-{name}"))["rows"] for s in seeds}
    return [next(r[key] for r in rows[s] if r["mode"] == mode and r["budget"] == budget) for s in seeds]


def best_gain(results: dict[str, dict[str, Any]], seeds: list[int], name: str, budgets: list[int]) -> float:
    """Mean success at the best (mode, budget > 0) minus mean success at budget 0."""
    plain = statistics.fmean(_values(results, seeds, name, "parallel", 0, "success"))
    best = max(statistics.fmean(_values(results, seeds, name, mode, b, "success"))
               for mode in ("parallel", "sequential") for b in budgets if b > 0)
    return best - plain


def report(results: dict[str, dict[str, Any]], seeds: list[int], budgets: list[int], command: str,
           horizon: int, selector: str) -> tuple[str, str]:
    """The Markdown section and the SUMMARY line."""
    n_tasks = next(iter(results.values()))["n_tasks"]
    lines = [
        "## Private rehearsal at test time: success against the rehearsal budget", "",
        f"`{command}`", "",
        f"Real-environment success on the built-in test split ({n_tasks} tasks), greedy committed turns, with "
        f"*budget* imagined attempts (sampled at T=1, at most {horizon} act turns each, answered by the policy's own "
        f"rehearse role) before every committed act turn; `{selector.split('.')[-1]}` chooses the committed turn "
        f"from them. Means ± std over seeds {', '.join(map(str, seeds))}. *envace* is the controlled study's arm "
        "(a), *base* its warm start.", "",
        "| policy | mode | " + " | ".join(f"budget {b}" for b in budgets) + " | rehearsal tokens / episode at "
        f"budget {budgets[-1]} |",
        "|---|---|" + "---|" * (len(budgets) + 1),
    ]
    for name in POLICIES:
        for mode in ("parallel", "sequential"):
            cells = [_cell(_values(results, seeds, name, mode, b, "success")) for b in budgets]
            tokens = _cell(_values(results, seeds, name, mode, budgets[-1], "tokens_per_episode"), 0)
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + f" | {tokens} |")
    gains = {name: best_gain(results, seeds, name, budgets) for name in POLICIES}
    calls = sum(r["private_real_calls"] for result in results.values() for r in result["rows"])
    lines += ["", f"Best gain over plain acting (best mode and budget > 0, means over seeds): envace "
                  f"{gains['envace']:+.3f}, base {gains['base']:+.3f}. Real calls made by the rehearsals: "
                  f"{calls:.0f}. Plot: `docs/rehearsal_budget.png`."]
    summary = (f"SUMMARY envace_best_gain={gains['envace']:.3f} base_best_gain={gains['base']:.3f} "
               f"real_calls_in_rehearsal={calls:.0f}")
    return "\n".join(lines), summary


def plot(results: dict[str, dict[str, Any]], seeds: list[int], budgets: list[int], path: str) -> None:
    """Mean success and rehearsal tokens against the budget: one line per policy and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in POLICIES:
        for mode, style in (("parallel", "-"), ("sequential", "--")):
            success = [statistics.fmean(_values(results, seeds, name, mode, b, "success")) for b in budgets]
            tokens = [statistics.fmean(_values(results, seeds, name, mode, b, "tokens_per_episode")) for b in budgets]
            left.plot(budgets, success, style, marker="o", label=f"{name}, {mode}")
            right.plot(budgets, tokens, style, marker="o", label=f"{name}, {mode}")
    left.set(xlabel="attempts per committed turn", ylabel="real success (test split)")
    right.set(xlabel="attempts per committed turn", ylabel="rehearsal tokens per episode")
    left.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="jobs in parallel (one torch thread each)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--horizon", type=int, default=2, help="most act turns of one imagined attempt")
    parser.add_argument("--eval-tasks", type=int, default=None, help="test on the first this-many test tasks")
    parser.add_argument("--selector", default="envace.rollout.private_rehearsal.OutcomeMajorityCommit",
                        help="what a rehearsal commits (a class path of envace.rollout.private_rehearsal's selectors)")
    parser.add_argument("--out", default="runs/study", help="shared with controlled_study.py (its checkpoints)")
    parser.add_argument("--report", default="docs/results.md")
    parser.add_argument("--plot", default="docs/rehearsal_budget.png")
    parser.add_argument("--rl-steps", type=int, default=100, help="arm (a)'s steps, if it must be trained")
    parser.add_argument("--sft-max-steps", type=int, default=3000, help="cap of a warm start not yet trained")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("at least 2 seeds are needed for a standard deviation")
    budgets = sorted(set(args.budgets) | {0})
    tasks = "builtin:bank-test" if args.eval_tasks is None else f"builtin:bank-test:{args.eval_tasks}"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    settings = Settings(args.out, args.rl_steps, args.sft_max_steps)
    tag = f"n{args.eval_tasks or 'all'}-h{args.horizon}-b{'.'.join(map(str, budgets))}-{args.selector.split('.')[-1]}"
    done = run_all(plan(settings, args.seeds, tasks, budgets, args.horizon, args.selector, tag), args.out,
                   args.workers)
    results = {k: v for k, v in done.items() if k.startswith(f"rb-{tag}-")}
    command = " ".join(["python benchmarks/rehearsal_budget.py", *map(shlex.quote, (argv or sys.argv[1:]))])
    text, summary = report(results, args.seeds, budgets, command, args.horizon, args.selector)
    plot(results, args.seeds, budgets, args.plot)
    write_section(args.report, SECTION, text)
    print(text)  # noqa: T201
    print(summary)  # noqa: T201


if __name__ == "__main__":
    main()
