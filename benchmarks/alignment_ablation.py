"""Ablation: does the world-model alignment term (and prediction-error shaping) make the rehearser more faithful, and
the agent more successful in the real environment?

Four variants of RL from the same warm starts (those of ``benchmarks/controlled_study.py``, reused when its output
directory holds them), on the built-in bank domain with the tiny policy, 3 seeds each:

========  ==========================================================  =========================================
variant   alignment term (``grpo.align_weight``; reference rows plus  prediction-error shaping of the rehearse
          live rows: real and cached answers, audited episodes)       reward (``shaping.coef``)
========  ==========================================================  =========================================
A+S+      0.5                                                         0.5
A+S-      0.5                                                         off
A-S+      off                                                         0.5
A-S-      off                                                         off
========  ==========================================================  =========================================

Every variant trains in the same ``HybridWorld`` (``--mix``: by default 20% real answers, 10% cached, 70% rehearsed,
constant), with live fidelity probes on every real or cached answer and a quarter of the rehearsed episodes audited
in the real environment; so each variant's rehearser is measured while it trains (``train/fidelity/*``, one point per
step) and, every ``--val-every`` steps, teacher-forced on the validation tasks' reference calls
(``val/fidelity_exact_match``). The final checkpoints are tested in the real environment on the test split: real
success, and the exact-match fidelity of the rehearsed reference calls.

Run from the repository root: ``.venv/bin/python benchmarks/alignment_ablation.py [--seeds 0 1 2] [--workers 2]``.
It writes its section of ``docs/results.md`` (between its markers, the rest of the file kept) and prints it; the
last output line is ``SUMMARY fidelity_on=<f> fidelity_off=<f> success_on=<f> success_off=<f>``: final exact-match
fidelity and real-env success with the alignment term on and off, means over seeds and over both shaping settings.
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
from study_jobs import warm_start  # noqa: E402
from study_plan import Job, run_all  # noqa: E402
from study_report import write_section  # noqa: E402
from study_settings import RL_CONFIG, Settings  # noqa: E402

VARIANTS = {
    "A+S+": ("--model.init_args.grpo.align_weight=0.5", "--model.init_args.shaping.init_args.coef=0.5"),
    "A+S-": ("--model.init_args.grpo.align_weight=0.5", "--model.init_args.shaping=null"),
    "A-S+": ("--model.init_args.grpo.align_weight=0.0", "--model.init_args.shaping.init_args.coef=0.5"),
    "A-S-": ("--model.init_args.grpo.align_weight=0.0", "--model.init_args.shaping=null"),
}
"""Variant name -> its ``envace fit`` overrides on top of ``lit_configs/tiny_rl.yaml``."""

SECTION = "alignment_ablation"
TEST_SPLIT = "builtin:bank-test"


def hybrid_world(real: float, cache: float, rehearse: float) -> str:
    """The ``--model.init_args.world`` override of a constant-mix ``HybridWorld`` with live probes."""
    mix = {"real": real, "cache": cache, "rehearse": rehearse}
    world = {"class_path": "envace.worlds.HybridWorld",
             "init_args": {"schedule": {"start": mix, "end": mix}, "probe": True}}
    return "--model.init_args.world=" + json.dumps(world)


def variant_key(seed: int, variant: str) -> str:
    """The job key (and result file name) of one training run."""
    return f"abl-s{seed}-{variant.replace('+', 'p').replace('-', 'm')}"


def train(settings: Settings, seed: int, variant: str, world: str, val_every: int, audit: float) -> dict[str, Any]:
    """Train one variant of ``seed`` from its warm start; return its fidelity curves and the exported policy."""
    from envace.cli.demo import fit

    root = f"{settings.out}/seed{seed}/ablation/{variant}"
    stage = fit(RL_CONFIG, f"{root}/policy", root, [
        f"--seed_everything={seed}", f"--model.policy.init_args.name_or_path={settings.out}/seed{seed}/warm/policy",
        f"--trainer.max_steps={settings.rl_steps}", world, f"--model.init_args.audit.fraction={audit}",
        f"--trainer.val_check_interval={val_every}", "--data.val_tasks=builtin:bank-val:64",
        "--trainer.log_every_n_steps=1",  # a point per step for the live fidelity curves
        "--model.init_args.eval_imagined=false", "--model.init_args.fidelity_gate=null",  # as the study's arms
        *settings.extra_rl, *VARIANTS[variant],
    ])
    return {"seconds": stage.seconds, "policy": stage.export_dir, "curves": curves(root),
            "real_calls": stage.metrics.get("train/real_calls_total", float("nan")),
            "real_calls_saved": stage.metrics.get("train/real_calls_saved_total", float("nan"))}


def curves(root: str) -> dict[str, list[tuple[int, float]]]:
    """The fidelity curves a run logged to TensorBoard: ``tag -> [(step, value), ...]``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = ("val/fidelity_exact_match", "val/success_act", "train/fidelity/exact_match", "train/fidelity_horizon",
            "train/sim2real_gap")
    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(root).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in tags:
            if tag in acc.Tags()["scalars"]:
                out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def test(settings: Settings, seed: int, variant: str, policy: str) -> dict[str, Any]:
    """Real-environment test of one final checkpoint on the test split (real success, teacher-forced fidelity)."""
    from envace.cli.demo import evaluate

    tasks = TEST_SPLIT if settings.eval_tasks is None else f"{TEST_SPLIT}:{settings.eval_tasks}"
    return evaluate(RL_CONFIG, policy, tasks, f"{settings.out}/seed{seed}/ablation/eval",
                    ["--model.init_args.eval_imagined=false"])


def plan(settings: Settings, seeds: list[int], world: str, val_every: int, audit: float) -> list[Job]:
    """The warm starts (reused when saved) and, per seed and variant, a training and a test job."""
    jobs = [Job(f"s{s}-warm", warm_start, (settings, s)) for s in seeds]
    for variant in VARIANTS:
        for s in seeds:
            key = variant_key(s, variant)
            jobs.append(Job(key, train, (settings, s, variant, world, val_every, audit), (f"s{s}-warm",)))
            jobs.append(Job(f"{key}-test", test, (settings, s, variant), (key,),
                            lambda r, key=key: (r[key]["policy"],)))
    return jobs


# --- report ----------------------------------------------------------------------------------------------------------


def _mean_std(values: list[float]) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {std:.3f} ({' / '.join(f'{v:.3f}' for v in values)})"


def _at(curve: list[tuple[int, float]], step: int) -> float:
    """The value logged at ``step`` (the last one logged at or before it), NaN if none."""
    values = [v for s, v in curve if s <= step]
    return values[-1] if values else float("nan")


def _window_mean(curve: list[tuple[int, float]], lo: int, hi: int) -> float:
    values = [v for s, v in curve if lo <= s < hi]
    return statistics.fmean(values) if values else float("nan")


def report(results: dict[str, dict[str, Any]], seeds: list[int], settings: Settings, command: str,
           val_every: int) -> tuple[str, str]:
    """The Markdown section and the SUMMARY line."""
    def final(variant: str, key: str) -> list[float]:
        return [float(results[f"{variant_key(s, variant)}-test"].get(key, float("nan"))) for s in seeds]

    def curve_mean(variant: str, tag: str, value: Any) -> str:
        points = [value(results[variant_key(s, variant)]["curves"].get(tag, [])) for s in seeds]
        return f"{statistics.fmean(points):.3f}"

    steps = list(range(val_every, settings.rl_steps + 1, val_every))
    bounds = sorted({round(i * settings.rl_steps / 4) for i in range(5)})
    live_windows = list(zip(bounds[:-1], bounds[1:]))  # the run's quarters
    lines = [
        "| variant | alignment | shaping | real success, test | fidelity EM, test (final) | fidelity leaf F1, test "
        "| real calls in training (answers + audits, all seeds) | real calls saved | wall s / run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        runs = [results[variant_key(s, variant)] for s in seeds]
        lines.append(
            f"| {variant} | {'on' if variant[1] == '+' else 'off'} | {'on' if variant[3] == '+' else 'off'} | "
            f"{_mean_std(final(variant, 'success_act'))} | {_mean_std(final(variant, 'fidelity_exact_match'))} | "
            f"{_mean_std(final(variant, 'fidelity_leaf_f1'))} | {int(sum(r['real_calls'] for r in runs))} | "
            f"{int(sum(r['real_calls_saved'] for r in runs))} | {statistics.fmean(r['seconds'] for r in runs):.0f} |"
        )
    lines += [
        "",
        "Fidelity over training steps (means over seeds). Teacher-forced exact match on 64 validation tasks' "
        "reference calls, at each validation:",
        "",
        "| variant | " + " | ".join(f"step {s}" for s in steps) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for variant in VARIANTS:
        cells = [curve_mean(variant, "val/fidelity_exact_match", lambda c, s=s: _at(c, s)) for s in steps]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Live fidelity while training (exact match of the policy's shadow rehearsal of every real or cached answer, "
        "at the training temperature; mean of the per-step values over each quarter of the run) and the audits' "
        "free-running fidelity horizon (calls before a rehearsed episode departs from its real replay; sliding mean "
        "over the last 64 audited episodes, at the end):",
        "",
        "| variant | " + " | ".join(f"live EM, steps {lo}-{hi - 1}" for lo, hi in live_windows)
        + " | horizon (end) | sim-to-real gap (end) |",
        "|---|" + "---|" * (len(live_windows) + 2),
    ]
    for variant in VARIANTS:
        cells = [curve_mean(variant, "train/fidelity/exact_match", lambda c, w=w: _window_mean(c, *w))
                 for w in live_windows]
        cells.append(curve_mean(variant, "train/fidelity_horizon", lambda c: c[-1][1] if c else float("nan")))
        cells.append(curve_mean(variant, "train/sim2real_gap", lambda c: c[-1][1] if c else float("nan")))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    on = [v for v in VARIANTS if v.startswith("A+")]
    off = [v for v in VARIANTS if v.startswith("A-")]
    lines += [
        "",
        "The alignment term's effect, paired: each (seed, shaping setting) with the term on minus the same seed and "
        "shaping setting with it off:",
        "",
        "| metric (test) | paired gain, mean ± std | positive pairs |",
        "|---|---|---|",
    ]
    for key, title in (("success_act", "real success"), ("fidelity_exact_match", "fidelity EM"),
                       ("fidelity_leaf_f1", "fidelity leaf F1")):
        gains = [a - b for v_on, v_off in zip(on, off) for a, b in zip(final(v_on, key), final(v_off, key))]
        std = statistics.stdev(gains) if len(gains) > 1 else 0.0
        lines.append(f"| {title} | {statistics.fmean(gains):+.3f} ± {std:.3f} | "
                     f"{sum(g > 0 for g in gains)} of {len(gains)} |")

    def pooled(variants: list[str], key: str) -> float:
        return statistics.fmean(x for v in variants for x in final(v, key))

    summary = (f"SUMMARY fidelity_on={pooled(on, 'fidelity_exact_match'):.3f} "
               f"fidelity_off={pooled(off, 'fidelity_exact_match'):.3f} "
               f"success_on={pooled(on, 'success_act'):.3f} success_off={pooled(off, 'success_act'):.3f}")
    tasks = "all 256" if settings.eval_tasks is None else f"the first {settings.eval_tasks}"
    header = [
        "## Ablation: the world-model alignment term and prediction-error shaping",
        "",
        f"Produced by `{command}` ({len(seeds)} seeds: {', '.join(map(str, seeds))}; {settings.rl_steps} RL steps "
        f"per run, from the controlled study's warm starts). Final real success and fidelity on {tasks} test tasks, "
        "in the real environment, greedy. `SUMMARY` pools both shaping settings. See docs/study.md for the analysis.",
        "",
    ]
    return "\n".join([*header, *lines]), summary


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="jobs in parallel (one torch thread each)")
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--val-every", type=int, default=25, help="steps between validations (fidelity curve)")
    parser.add_argument("--mix", type=float, nargs=3, default=[0.2, 0.1, 0.7], metavar=("REAL", "CACHE", "REHEARSE"),
                        help="the HybridWorld's constant mix")
    parser.add_argument("--audit", type=float, default=0.25, help="share of rehearsed episodes replayed for real")
    parser.add_argument("--out", default="runs/study", help="shared with controlled_study.py (its warm starts)")
    parser.add_argument("--report", default="docs/results.md")
    parser.add_argument("--eval-tasks", type=int, default=None, help="test on this many tasks")
    parser.add_argument("--sft-max-steps", type=int, default=3000, help="cap of a warm start not yet trained")
    parser.add_argument("--rl", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of every run (repeatable)")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("at least 2 seeds are needed for a standard deviation")
    if args.val_every < 1 or args.val_every > args.rl_steps:
        parser.error("--val-every must be between 1 and --rl-steps")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    settings = Settings(args.out, args.rl_steps, args.sft_max_steps, extra_rl=tuple(args.rl),
                        eval_tasks=args.eval_tasks)
    world = hybrid_world(*args.mix)
    results = run_all(plan(settings, args.seeds, world, args.val_every, args.audit), args.out, args.workers)
    command = " ".join(["python benchmarks/alignment_ablation.py", *map(shlex.quote, (argv or sys.argv[1:]))])
    text, summary = report(results, args.seeds, settings, command, args.val_every)
    write_section(args.report, SECTION, text)
    print(text)  # noqa: T201
    print(summary)  # noqa: T201


if __name__ == "__main__":
    main()
