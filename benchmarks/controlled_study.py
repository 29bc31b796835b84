"""Controlled study: does rehearsal-only RL (EnvACE) improve real success, against the right controls?

For each seed (which varies both the warm start and RL), on the built-in bank domain with the tiny policy:

* **warm start**: ``lit_configs/tiny_sft.yaml`` trained until its real validation success plateaus (Lightning's
  ``EarlyStopping`` on ``val/success_act``, see the config), exporting the weights of its best validation;
* from it, the same number of RL steps (``lit_configs/tiny_rl.yaml``) in three worlds:
  (a) ``RehearseWorld``: EnvACE, the policy rehearses every tool response (no real tool call);
  (b) ``RealWorld``: RL against the real tools;
  (c) ``FrozenWorld``: a frozen copy of the warm start plays the environment (not trained);
* (d) no RL: the warm start itself;
* (e) SFT continued from the warm start on the same demonstrations for the wall-clock time arm (a) took.

Every checkpoint is then tested in the real environment on the test split and on the held-out-template split:
real success, imagined success (the policy rehearsing), rehearsal fidelity. Real tool calls spent during training
are counted by the module. Jobs run in ``--workers`` processes (one torch thread each); each job's result is saved
as JSON under ``--out``, so an interrupted study resumes where it stopped.

Run from the repository root: ``.venv/bin/python benchmarks/controlled_study.py [--seeds 0 1 2] [--workers 2]``.
It writes its section of a Markdown report (default ``docs/results.md``, between its markers; other sections are
kept) and prints it; the last output line is
``SUMMARY gain=<a minus the larger of d and e> std=<largest seed std of a, d, e> real_calls_rl=<real calls during
a's RL, all seeds>``.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import multiprocessing  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SFT_CONFIG = "lit_configs/tiny_sft.yaml"
RL_CONFIG = "lit_configs/tiny_rl.yaml"
SPLITS = {"test": "builtin:bank-test", "heldout": "builtin:bank-heldout"}
ARMS = {
    "a": "EnvACE: RL in the rehearsed world",
    "b": "RL against the real tools",
    "c": "RL against a frozen simulator (the warm start)",
    "d": "no RL (the warm start)",
    "e": "SFT continued, same wall-clock as (a)",
}
WORLDS = {"a": "envace.worlds.RehearseWorld", "b": "envace.worlds.RealWorld", "c": "envace.worlds.FrozenWorld"}
SECTION = "controlled_study"
"""This benchmark's section of the report file."""
LEVER_PREFIX = "L-"
"""Arm key of a lever (``L-<name>``): a variant of arm (a) with extra overrides."""


def parse_levers(specs: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``NAME:OVERRIDE`` specs -> ``((name, overrides), ...)`` in first-seen order; a repeated name adds overrides.

    Raises:
        ValueError: a spec without ``NAME:``, or a name that is not a plain identifier (it names a directory).
    """
    levers: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, override = spec.partition(":")
        if not sep or not override.startswith("--"):
            raise ValueError(f"--lever {spec!r}: expected NAME:--override=value")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"--lever {spec!r}: the name {name!r} must be letters, digits, '-' or '_'")
        levers.setdefault(name, []).append(override)
    return tuple((name, tuple(overrides)) for name, overrides in levers.items())


@dataclass(frozen=True)
class Settings:
    """What every job of one study shares.

    Attributes:
        out: output directory.
        rl_steps: optimiser steps of each RL arm.
        sft_max_steps: cap of the warm start (it normally stops at its plateau first).
        extra_sft: extra ``envace fit`` arguments of the warm start and of arm (e).
        extra_warm: extra ``envace fit`` arguments of the warm start only (e.g. the policy's size).
        extra_rl: extra ``envace fit`` arguments of every RL arm.
        eval_tasks: test on the first this-many tasks of each split; None: the packaged splits.
        levers: variants of arm (a), name -> their extra ``envace fit`` arguments (on top of ``extra_rl``); each is
            trained from the same warm starts and reported in a table of its own.
    """

    out: str
    rl_steps: int
    sft_max_steps: int
    extra_sft: tuple[str, ...] = ()
    extra_rl: tuple[str, ...] = ()
    eval_tasks: int | None = None
    extra_warm: tuple[str, ...] = ()
    levers: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass
class Job:
    """One unit of work: a stage of one seed, run after the jobs it depends on."""

    key: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...]
    needs: tuple[str, ...] = ()
    extra: Callable[[dict[str, dict[str, Any]]], tuple[Any, ...]] = field(default=lambda results: ())


# --- jobs (each runs in a worker process) ----------------------------------------------------------------------------


def _seed_args(seed: int) -> list[str]:
    return [f"--seed_everything={seed}"]


def warm_start(settings: Settings, seed: int) -> dict[str, Any]:
    """Train the warm start of ``seed`` to its validation plateau; export its best weights."""
    from envace.demo import fit

    root = f"{settings.out}/seed{seed}/warm"
    stage = fit(SFT_CONFIG, f"{root}/policy", root, [
        *_seed_args(seed), f"--model.init_args.policy.init_args.seed={seed}",
        f"--trainer.max_steps={settings.sft_max_steps}", *settings.extra_sft, *settings.extra_warm,
    ])
    return {"seconds": stage.seconds, "steps": stage.steps, "policy": stage.export_dir,
            "val_success_best": _best_val(root), **_prefixed(stage.metrics, "val/")}


def rl_arm(settings: Settings, seed: int, arm: str) -> dict[str, Any]:
    """Train arm ``arm`` of ``seed`` from its warm start: a, b or c, or a lever (a variant of a) by its arm key."""
    from envace.demo import fit

    lever = dict(settings.levers).get(arm.removeprefix(LEVER_PREFIX)) if arm.startswith(LEVER_PREFIX) else None
    world = WORLDS["a"] if lever is not None else WORLDS[arm]
    root = f"{settings.out}/seed{seed}/{arm}"
    stage = fit(RL_CONFIG, f"{root}/policy", root, [
        *_seed_args(seed), f"--model.policy.init_args.name_or_path={settings.out}/seed{seed}/warm/policy",
        f"--model.world={world}", f"--trainer.max_steps={settings.rl_steps}",
        "--trainer.limit_val_batches=0", *settings.extra_rl, *(lever or ()),  # timed: training only (tested after)
    ])
    return {"seconds": stage.seconds, "policy": stage.export_dir,
            "real_calls": stage.metrics.get("train/real_calls_total", float("nan"))}


def sft_continued(settings: Settings, seed: int, seconds: float) -> dict[str, Any]:
    """Arm (e): SFT from the warm start on the same demonstrations for ``seconds`` of wall-clock time."""
    from envace.demo import fit

    root = f"{settings.out}/seed{seed}/e"
    hours, rest = divmod(int(round(seconds)), 3600)
    stage = fit(SFT_CONFIG, f"{root}/policy", root, [
        *_seed_args(seed), "--model.init_args.policy=envace.policy.HFPolicy",
        f"--model.init_args.policy.init_args.name_or_path={settings.out}/seed{seed}/warm/policy",
        "--trainer.callbacks=[]", "--model.init_args.export_best=null", "--trainer.max_steps=-1",
        "--trainer.limit_val_batches=0",
        f"--trainer.max_time=00:{hours:02d}:{rest // 60:02d}:{rest % 60:02d}", *settings.extra_sft,
    ])
    return {"seconds": stage.seconds, "policy": stage.export_dir, "real_calls": 0.0}


def evaluate(settings: Settings, seed: int, arm: str, policy: str) -> dict[str, Any]:
    """Real-environment test of one checkpoint on every split."""
    from envace.demo import evaluate as test

    splits = {k: v if settings.eval_tasks is None else f"{v}:{settings.eval_tasks}" for k, v in SPLITS.items()}
    return {split: test(RL_CONFIG, policy, tasks, f"{settings.out}/seed{seed}/eval") for split, tasks in splits.items()}


def _prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith(prefix)}


def _best_val(root: str) -> float:
    """Best ``val/success_act`` logged by the warm start (TensorBoard)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    best = float("nan")
    for events in Path(root).rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if "val/success_act" in acc.Tags()["scalars"]:
            values = [e.value for e in acc.Scalars("val/success_act")]
            best = max(values) if values else best
    return best


def _run(job_key: str, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...], path: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.basicConfig(level=logging.WARNING)
    result = fn(*args)
    Path(path).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


# --- scheduling ------------------------------------------------------------------------------------------------------


def plan(settings: Settings, seeds: list[int]) -> list[Job]:
    """Every job of the study, with its dependencies; warm starts first (the longest jobs, and every arm needs one)."""
    jobs = [Job(f"s{s}-warm", warm_start, (settings, s)) for s in seeds]
    for s in seeds:
        jobs.append(Job(f"s{s}-eval-d", evaluate, (settings, s, "d"), (f"s{s}-warm",),
                        lambda r, s=s: (r[f"s{s}-warm"]["policy"],)))
        for arm in ("a", "b", "c"):
            jobs.append(Job(f"s{s}-{arm}", rl_arm, (settings, s, arm), (f"s{s}-warm",)))
            jobs.append(Job(f"s{s}-eval-{arm}", evaluate, (settings, s, arm), (f"s{s}-{arm}",),
                            lambda r, s=s, arm=arm: (r[f"s{s}-{arm}"]["policy"],)))
        jobs.append(Job(f"s{s}-e", sft_continued, (settings, s), (f"s{s}-a",),
                        lambda r, s=s: (r[f"s{s}-a"]["seconds"],)))
        jobs.append(Job(f"s{s}-eval-e", evaluate, (settings, s, "e"), (f"s{s}-e",),
                        lambda r, s=s: (r[f"s{s}-e"]["policy"],)))
    for name, _ in settings.levers:  # after the main arms: the study's table comes first
        arm = LEVER_PREFIX + name
        for s in seeds:
            jobs.append(Job(f"s{s}-{arm}", rl_arm, (settings, s, arm), (f"s{s}-warm",)))
            jobs.append(Job(f"s{s}-eval-{arm}", evaluate, (settings, s, arm), (f"s{s}-{arm}",),
                            lambda r, s=s, arm=arm: (r[f"s{s}-{arm}"]["policy"],)))
    return jobs


def run_all(jobs: list[Job], out: str, workers: int) -> dict[str, dict[str, Any]]:
    """Run ``jobs`` respecting their dependencies, ``workers`` at a time; reuse results saved by an earlier run."""
    results: dict[str, dict[str, Any]] = {}
    for job in jobs:
        saved = Path(out, f"{job.key}.json")
        if saved.is_file():
            results[job.key] = json.loads(saved.read_text(encoding="utf-8"))
    pending = [j for j in jobs if j.key not in results]
    running: dict[Future, Job] = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        while pending or running:
            for job in [j for j in pending if all(n in results for n in j.needs)][: workers - len(running)]:
                pending.remove(job)
                args = job.args + job.extra(results)
                running[pool.submit(_run, job.key, job.fn, args, str(Path(out, f"{job.key}.json")))] = job
                print(f"started {job.key}", flush=True)  # noqa: T201
            if not running:
                raise RuntimeError(f"jobs whose dependencies failed: {[j.key for j in pending]}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                results[job.key] = future.result()  # a failed job stops the study with its error
                print(f"finished {job.key}", flush=True)  # noqa: T201
    return results


# --- report ----------------------------------------------------------------------------------------------------------


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def report(results: dict[str, dict[str, Any]], seeds: list[int], settings: Settings, command: str) -> str:
    """The Markdown report and the SUMMARY line."""
    def metric(arm: str, seed: int, split: str, key: str) -> float:
        return float(results[f"s{seed}-eval-{arm}"][split].get(key, float("nan")))

    def cell(arm: str, split: str, key: str) -> str:
        values = [metric(arm, s, split, key) for s in seeds]
        mean, std = _stats(values)
        return f"{mean:.3f} ± {std:.3f} ({' / '.join(f'{v:.3f}' for v in values)})"

    def spent(arm: str) -> str:
        if arm == "d":
            return "–"
        return str(int(sum(results[f"s{s}-{arm}"]["real_calls"] for s in seeds)))

    def seconds(arm: str) -> str:
        key = {"d": "warm"}.get(arm, arm)
        return f"{statistics.fmean(results[f's{s}-{key}']['seconds'] for s in seeds):.0f}"

    lines = [
        "| arm | real success, test (mean ± std; per seed) | real success, held-out templates | imagined success, "
        "test | fidelity EM, test | fidelity leaf F1, test | real tool calls in training (all seeds) | wall s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, title in ARMS.items():
        lines.append(
            f"| ({arm}) {title} | {cell(arm, 'test', 'success_act')} | {cell(arm, 'heldout', 'success_act')} | "
            f"{cell(arm, 'test', 'imagined_success')} | {cell(arm, 'test', 'fidelity_exact_match')} | "
            f"{cell(arm, 'test', 'fidelity_leaf_f1')} | {spent(arm)} | {seconds(arm)} |"
        )
    warm = [results[f"s{s}-warm"] for s in seeds]
    lines += [
        "",
        "Warm starts (best validation success, 128 validation tasks, at the step it was reached / steps run): "
        + ", ".join(f"seed {s}: {w['val_success_best']:.3f} / {w['steps']:.0f} steps, {w['seconds']:.0f} s"
                    for s, w in zip(seeds, warm)) + ".",
    ]
    test = {arm: [metric(arm, s, "test", "success_act") for s in seeds] for arm in ARMS}
    mean = {arm: statistics.fmean(v) for arm, v in test.items()}
    std = {arm: _stats(v)[1] for arm, v in test.items()}
    gain = mean["a"] - max(mean["d"], mean["e"])
    real_calls = int(sum(results[f"s{s}-a"]["real_calls"] for s in seeds))
    tasks = "all (256 and 128)" if settings.eval_tasks is None else f"the first {settings.eval_tasks}"
    header = [
        "# Controlled study: rehearsal-only RL on the built-in bank domain",
        "",
        f"Produced by `{command}` ({len(seeds)} seeds: {', '.join(map(str, seeds))}; {settings.rl_steps} RL steps "
        f"per arm). Real success is measured in the real environment, greedy, on {tasks} tasks of the test split "
        "and of the held-out-template split; fidelity is the teacher-forced rehearsal of the test tasks' reference "
        "calls. See docs/study.md for the protocol and the analysis.",
        "",
    ]
    summary = f"SUMMARY gain={gain:.3f} std={max(std['a'], std['d'], std['e']):.3f} real_calls_rl={real_calls}"
    return "\n".join([*header, *lines, *lever_table(settings, seeds, cell, metric, spent, seconds), "", summary])


def lever_table(settings: Settings, seeds: list[int], cell: Callable[[str, str, str], str],
                metric: Callable[[str, int, str, str], float], spent: Callable[[str], str],
                seconds: Callable[[str], str]) -> list[str]:
    """The levers' rows (variants of arm (a)), with each one's per-seed gain over (d) and over (a)."""
    if not settings.levers:
        return []

    def paired(arm: str, base: str) -> str:
        gains = [metric(arm, s, "test", "success_act") - metric(base, s, "test", "success_act") for s in seeds]
        mean, std = _stats(gains)
        return f"{mean:+.3f} ± {std:.3f}"

    lines = [
        "",
        "## Levers: variants of arm (a), from the same warm starts",
        "",
        "| lever (overrides on top of arm (a)) | real success, test | gain over (d), paired per seed | gain over (a), "
        "paired | imagined success, test | fidelity EM, test | real tool calls | wall s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, overrides in settings.levers:
        arm = LEVER_PREFIX + name
        lines.append(
            f"| {name}: `{' '.join(overrides)}` | {cell(arm, 'test', 'success_act')} | {paired(arm, 'd')} | "
            f"{paired(arm, 'a')} | {cell(arm, 'test', 'imagined_success')} | "
            f"{cell(arm, 'test', 'fidelity_exact_match')} | {spent(arm)} | {seconds(arm)} |"
        )
    return lines


def write_section(path: str, name: str, text: str) -> None:
    """Replace the ``name`` section of the Markdown file ``path`` (between its markers, the rest kept), or append it.

    Each benchmark writes its own section of the shared report (``docs/results.md``).
    """
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{text}\n{end}"
    file = Path(path)
    old = file.read_text(encoding="utf-8") if file.is_file() else ""
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = (old.rstrip("\n") + "\n\n" if old else "") + block + "\n"
    file.write_text(new, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="jobs in parallel (one torch thread each)")
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--sft-max-steps", type=int, default=3000)
    parser.add_argument("--out", default="runs/study")
    parser.add_argument("--report", default="docs/results.md")
    parser.add_argument("--eval-tasks", type=int, default=None, help="test on this many tasks per split")
    parser.add_argument("--sft", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of the warm start and of arm (e) (repeatable)")
    parser.add_argument("--rl", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of every RL arm (repeatable)")
    parser.add_argument("--warm", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of the warm start only (repeatable)")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME:OVERRIDE",
                        help="a variant of arm (a) named NAME with an extra `envace fit` argument (repeat a NAME to "
                             "add arguments); trained from the same warm starts and reported in its own table")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("at least 2 seeds are needed for a standard deviation")
    try:
        levers = parse_levers(args.lever)
    except ValueError as err:
        parser.error(str(err))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    settings = Settings(args.out, args.rl_steps, args.sft_max_steps, tuple(args.sft), tuple(args.rl), args.eval_tasks,
                        tuple(args.warm), levers)
    results = run_all(plan(settings, args.seeds), args.out, args.workers)
    command = " ".join(["python benchmarks/controlled_study.py", *map(shlex.quote, (argv or sys.argv[1:]))])
    text = report(results, args.seeds, settings, command)
    write_section(args.report, SECTION, text)
    print(text)  # noqa: T201


if __name__ == "__main__":
    main()
