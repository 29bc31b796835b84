"""Peak memory of SmolLM2 training steps: SFT and RL, three task sets, two batch sizes, the token budget on and off.

Each case is a fresh ``envace fit`` process (``--child``), so its peak resident memory (``ru_maxrss``; on CUDA the
peak allocation) is its own. A case runs a few optimiser steps of a config at its defaults, with only the task set,
the batch size and the token budget changed; the step time is the mean of the steps after the first (the two paths
of a comparison run the same seeded batches). The smaller batch at the defaults runs as many more steps as make the
same tasks as the larger batch's steps (the seeded order does not depend on the batch size), so the two peaks are
maxima over the same tasks; its step time is still taken over the first ``--steps``, the batches the path before
runs, and its peak over those steps is reported beside (``peak_ratio_first_steps``).

- ``sft``: ``lit_configs/smollm2_sft.yaml`` from the prepared SmolLM2-135M-Instruct (no validation);
- ``rl``: ``lit_configs/smollm2_rl.yaml`` from the same (untrained) model, acting and rehearsing (no validation,
  no fidelity gate);
- task sets: ``bank`` and ``desk`` (built in) and ``long``: bank tasks whose recorded tool responses carry a long
  statement (about 600 tokens each), the shape of a user's world with verbose tools;
- step time: ``budget=off`` is the path before the token budget (``micro_batch_tokens=0``, no activation
  checkpointing, no freed memory returned to the system), today's step time, measured in the same run as the
  default's, on the same machine. The two paths run ``--repeats`` times each at the smaller batch, interleaved
  (default, off, default, off, ...), so a slow minute of the machine falls on both; the ratio is the mean step time
  of one over the other's. RL's pairs run at learning rate 0: the rollouts of an updated policy depend on its
  weights, which the two paths round differently, so after one update they would sample different episodes (of
  different lengths); with the weights unchanged both sample the same episodes from the same seed and do the same
  work (the benchmark checks the generated tokens per step are equal). ``--trimmed-off`` adds ``off+trim``: the path
  before with freed memory returned as the code now does (``envace.training.memory.FreedMemory``);
- validation: ``envace validate`` of the SFT config at its defaults (``--validate`` domains, ``eval_batch_size``
  tasks of each domain's validation split, acting against the real environment), the prepared model's weights: the
  generation engine's keys and values for ``rollout.generate_batch_size`` prompts at once are what a validation adds
  to a step's floor; the built-in ``library`` domain answers every call with a real ``mcp-server-sqlite`` (from
  ``scripts/setup_mcp_servers.sh``) and has long prompts (its system prompt and five tool schemas);
- growth: one SFT run of ``--growth-steps`` steps (bank, batch 4, a validation every quarter of the run with
  ``export_best`` writing the best weights), its resident memory read after every step. A step's end swings between
  the floor a trim leaves and the ceiling ``FreedMemory`` tolerates above it, so the growth compares windows: the
  quarter after the first validation (which builds what a run holds once) against the last quarter, both their
  highest and their lowest readings; the larger rise, per 100 steps (``growth_per_100``). The run's peak is
  reported beside it (``growth_peak_gb``): a run that validates holds what the peak cases, run without validation,
  never see.

Run on an idle machine, one job at a time (``uptime`` first)::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/memory.py                  # every case, about three hours on 2 cores
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/memory.py --sets bank --stages sft --batches 4 16 --growth-steps 0
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/memory.py --stages --growth-steps 0 --validate library

The last line is ``SUMMARY sft_peak_gb=... rl_peak_gb=... peak_ratio_batch16_over_batch4=...
growth_gb_per_100_steps=... growth_peak_gb=... validation_peak_gb=... step_time_ratio=...
step_time_ratio_over_trimmed_off=...`` (the largest peaks at the defaults over the sets, the largest batch-16 /
batch-4 ratio, the growth scaled to 100 steps and the growth run's peak, the largest validation's peak at the
config's ``generate_batch_size``, and the largest ratio of the default's step time over the ``off`` one and over the
``off+trim`` one, over stages and sets), then ``peak_ratio_first_steps=...``: the ratio with the smaller batch's
peak over its first ``--steps`` only (fewer tasks than the larger batch's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "smollm2-135m-instruct"
CONFIGS = {"sft": "lit_configs/smollm2_sft.yaml", "rl": "lit_configs/smollm2_rl.yaml"}
BUDGET_KEY = {"sft": "--model.init_args.micro_batch_tokens", "rl": "--model.grpo.micro_batch_tokens"}
CHECKPOINT_KEY = {"sft": "--model.init_args.policy.init_args.gradient_checkpointing",
                  "rl": "--model.policy.init_args.gradient_checkpointing"}
LIMIT_KEY = {"sft": "--model.init_args.memory_limit_gb", "rl": "--model.memory_limit_gb"}
STEP_METRICS = ("generated_tokens", "rollout_time_s", "update_time_s")
"""What an RL step logs that the benchmark reads back: the work sampled, and where the step's time went."""
GB = 10**9
"""Every figure is in GB of 10^9 bytes, the unit of the summary's keys (``ru_maxrss`` counts KiB)."""
LABELS = {"default": "default", "0": "off", "0+trim": "off+trim"}
"""The budgets a case runs: the config's, off as before this work, and off with freed memory returned (today's code
with the budget and checkpointing off)."""


def long_tasks(path: Path, n: int = 600) -> str:
    """Bank tasks whose recorded tool responses carry a statement of 30 transactions; the JSONL file's path."""
    from envace.builtin import domain_of
    from envace.builtin.generator import generate_split, render_tasks

    domain = domain_of("bank")
    tasks = []
    for task in generate_split(domain, "train", n):
        reference = []
        for message in task.reference:
            if message.get("role") == "tool":
                content = json.loads(message["content"])
                content["statement"] = [{"date": f"2026-11-{1 + i % 28:02d}", "description": f"card payment {i}",
                                         "amount": -(i * 7 % 90 + 1)} for i in range(30)]
                message = {**message, "content": json.dumps(content)}
            reference.append(message)
        tasks.append(replace(task, reference=tuple(reference)))
    path.write_text(render_tasks(domain, tasks))
    return str(path)


def task_args(stage: str, name: str, work: Path) -> list[str]:
    if name == "long":
        work.mkdir(parents=True, exist_ok=True)
        spec = long_tasks(work / "long.jsonl")
        return [f"--data.train_tasks={spec}"] + (["--data.demonstrations=600"] if stage == "rl" else [])
    if name == "desk":
        n = "500" if stage == "sft" else "2000"
        return [f"--data.train_tasks=builtin:desk:{n}"]
    return []


def case_args(stage: str, task_set: str, batch: int, budget: str, steps: int, root: Path,
              frozen: bool = False) -> list[str]:
    """The ``envace fit`` arguments of one case; ``frozen``: learning rate 0 (RL's step-time pairs)."""
    args = ["fit", "--config", CONFIGS[stage], f"--trainer.default_root_dir={root}", f"--trainer.max_steps={steps}",
            "--trainer.limit_val_batches=0", "--trainer.logger=false",
            f"--data.batch_size={batch}"]
    if stage == "sft":
        args += [f"--model.init_args.policy.init_args.name_or_path={MODEL}", "--model.init_args.export_dir=null",
                 "--model.init_args.export_best=null"]
    else:
        args += [f"--model.policy.init_args.name_or_path={MODEL}", "--model.export_dir=null",
                 "--model.fidelity_gate=null"]
        if frozen:
            args.append("--model.optimizer.init_args.lr=0")
    if budget != "default":  # the path before the budget: one forward/backward per role, nothing recomputed, no check
        args += [f"{BUDGET_KEY[stage]}=0", f"{CHECKPOINT_KEY[stage]}=false", f"{LIMIT_KEY[stage]}=0"]
    return args + task_args(stage, task_set, root)


SERVER = ROOT / ".venv-mcp" / "sqlite" / "bin" / "mcp-server-sqlite"
"""The real server the built-in library domain's tasks launch (``scripts/setup_mcp_servers.sh`` installs it)."""


def validation_args(domain: str, tasks: int, root: Path, generate_batch: int | None) -> list[str]:
    """The ``envace validate`` arguments of one validation case: the SFT config at its defaults, ``tasks`` tasks of
    ``domain``'s validation split in one batch; ``generate_batch``: ``rollout.generate_batch_size`` instead of the
    config's."""
    args = ["validate", "--config", CONFIGS["sft"], f"--trainer.default_root_dir={root}", "--trainer.logger=false",
            f"--model.init_args.policy.init_args.name_or_path={MODEL}", "--model.init_args.export_dir=null",
            "--model.init_args.export_best=null", f"--data.val_tasks=builtin:{domain}-val:{tasks}",
            f"--data.eval_batch_size={tasks}", "--trainer.limit_val_batches=1"]
    if generate_batch:
        args.append(f"--model.init_args.rollout.generate_batch_size={generate_batch}")
    return args


def child(args: list[str], rss_every_step: bool, before: bool = False) -> None:
    """Run ``envace`` in this process; print the step times, the RSS per step and the peak as one JSON line.

    ``before``: the path before the token budget also returned no freed memory to the system between micro-batches
    and steps (``envace.training.memory.return_freed_memory``, which costs the page faults of refilling it), so its step
    time is measured without it.
    """
    import lightning as L

    import envace.training.memory
    from envace.cli.lightning import EnvaceCLI, cli_main

    if before:  # every trim the training modules ask for (FreedMemory) goes through this function
        envace.training.memory.return_freed_memory = lambda: False

    times: list[float] = []
    rss: list[float] = []
    hwm: list[float] = []  # the peak so far, after every step
    logged: dict[str, list[float]] = {key: [] for key in STEP_METRICS}

    class Clock(L.Callback):
        def on_train_batch_start(self, *_: Any) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
            times.append(time.perf_counter() - self.start)
            hwm.append(peak_gb())
            for key, values in logged.items():
                value = trainer.callback_metrics.get(f"train/{key}")
                if value is not None:
                    values.append(float(value))
            if rss_every_step:
                pages = int(Path("/proc/self/statm").read_text().split()[1])
                rss.append(pages * os.sysconf("SC_PAGE_SIZE") / GB)

    class ClockCLI(EnvaceCLI):
        def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[L.Callback]) -> L.Trainer:
            return super()._instantiate_trainer(config, [*callbacks, Clock()])

    sys.argv = ["envace"]
    start = time.perf_counter()
    cli_main(args, cli_class=ClockCLI)
    result = {"wall_s": time.perf_counter() - start, "times": times, "rss": rss, "peak_gb": peak_gb(), "hwm": hwm}
    print("RESULT " + json.dumps({**result, **logged}), flush=True)


def peak_gb() -> float:
    """This process's peak so far: resident memory on CPU, allocated memory on CUDA."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / GB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def run_case(args: list[str], rss_every_step: bool = False, before: bool = False) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--child", json.dumps(args)] + (["--rss"] if rss_every_step else []) + (
        ["--before"] if before else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"case failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def run_in(tmp: str, build: Any, stage: str, task_set: str, batch: int, budget: str, steps: int,
           frozen: bool = False) -> dict[str, Any]:
    """One case in its own directory under ``tmp``, removed after (its last.ckpt: 1.4 GB a case)."""
    root = Path(tmp, f"{stage}-{task_set}-{batch}-{budget}{'-frozen' if frozen else ''}")
    try:
        return run_case(build(stage, task_set, batch, budget, steps, root, frozen), before=budget == "0")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def time_pairs(tmp: str, stage: str, task_set: str, batch: int, opts: argparse.Namespace,
               rows: list[tuple[str, str, int, str, float, float]]) -> dict[str, float]:
    """The default's mean step time over each path before's, their runs interleaved ``opts.repeats`` times.

    RL runs frozen (learning rate 0), so every run samples the same episodes; a run whose generated tokens per step
    differ from the first run's stops the benchmark (the two would not have done the same work).
    """
    budgets = ["default", "0"] + (["0+trim"] if opts.trimmed_off else [])
    frozen = stage == "rl"
    steps: dict[str, list[float]] = {b: [] for b in budgets}
    work: list[float] | None = None
    for repeat in range(opts.repeats):
        for budget in budgets:
            result = run_in(tmp, case_args, stage, task_set, batch, budget, opts.steps, frozen)
            generated = result["generated_tokens"][: opts.steps]
            if frozen and work is not None and generated != work:
                raise RuntimeError(f"{stage} {task_set} budget {budget}: generated tokens per step {generated}, "
                                   f"the first run's {work}: the runs did not sample the same episodes")
            work = work if work is not None else generated
            steps[budget].append(mean_step(result["times"][: opts.steps]))
            rows.append((stage, task_set, batch, LABELS[budget] + (" (lr 0)" if frozen else ""), result["peak_gb"],
                         steps[budget][-1]))
            print(f"{stage} {task_set} batch {batch} budget {budget}{' lr 0' if frozen else ''} run {repeat + 1}: "
                  f"peak {result['peak_gb']:.2f} GB, step {steps[budget][-1]:.1f} s"
                  f"{breakdown(result, opts.steps)}", flush=True)
    means = {b: statistics.fmean(v) for b, v in steps.items()}
    for budget in budgets[1:]:
        print(f"{stage} {task_set}: default {means['default']:.1f} s over {LABELS[budget]} {means[budget]:.1f} s = "
              f"{means['default'] / means[budget]:.3f} (runs: {' '.join(f'{x:.1f}' for x in steps['default'])} over "
              f"{' '.join(f'{x:.1f}' for x in steps[budget])})", flush=True)
    return {b: means["default"] / means[b] for b in budgets[1:]}


def breakdown(result: dict[str, Any], steps: int) -> str:
    """Where an RL step's time went (rollout and update, after the first step) and its generated tokens."""
    rollout, update = result.get("rollout_time_s", [])[1:steps], result.get("update_time_s", [])[1:steps]
    if not rollout or not update:
        return ""
    tokens = " ".join(str(int(x)) for x in result["generated_tokens"][:steps])
    return f" (rollout {statistics.fmean(rollout):.1f} s, update {statistics.fmean(update):.1f} s; generated {tokens})"


def growth_per_100(rss: list[float], interval: int) -> tuple[float, tuple[tuple[float, float], ...]]:
    """The growth of resident memory per 100 steps, and the (lowest, highest) step end of the two windows compared.

    Resident memory at a step's end swings between the floor a trim leaves and the ceiling ``FreedMemory`` tolerates
    above it, so one reading minus another reads the swing. The growth compares windows of ``interval`` steps
    instead: the first after the first validation (which builds what a run holds once) and the last. Both their
    highest readings (the ceiling) and their lowest (the floor) are compared; the larger rise, per 100 steps, is the
    growth.
    """
    first, last = rss[interval:2 * interval], rss[-interval:]
    if len(rss) < 3 * interval or not first:
        raise ValueError(f"the growth run needs at least {3 * interval} steps, got {len(rss)}")
    distance = len(rss) - 2 * interval  # steps between the windows' starts
    rise = max(max(last) - max(first), min(last) - min(first))
    return rise * 100 / distance, ((min(first), max(first)), (min(last), max(last)))


def mean_step(times: list[float]) -> float:
    """The mean step time after the first step (which builds the optimiser state); both paths of a comparison run
    the same seeded batches, so their means cover the same rows."""
    return statistics.fmean(times[1:] if len(times) > 1 else times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", nargs="*", default=["sft", "rl"], choices=["sft", "rl"],
                        help="the stages of the peak cases (none: the growth run only)")
    parser.add_argument("--sets", nargs="+", default=["bank", "desk", "long"], choices=["bank", "desk", "long"])
    parser.add_argument("--batches", nargs=2, type=int, default=[4, 16], help="the two batch sizes compared")
    parser.add_argument("--steps", type=int, default=4, help="optimiser steps per case")
    parser.add_argument("--growth-steps", type=int, default=100, help="steps of the growth run (0: none)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each path of the step-time comparison, interleaved (0: no comparison)")
    parser.add_argument("--trimmed-off", action="store_true",
                        help="also time the path before with freed memory returned (off+trim)")
    parser.add_argument("--validate", nargs="*", default=["bank", "library"], choices=["bank", "desk", "library"],
                        help="domains of the validation cases (none: no validation case)")
    parser.add_argument("--val-tasks", type=int, default=64, help="tasks a validation case validates, in one batch")
    parser.add_argument("--val-generate-batch", type=int, nargs="+", default=[0],
                        help="rollout.generate_batch_size of the validation cases (0: the config's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rss", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        child(json.loads(opts.child), opts.rss, opts.before)
        return
    if not MODEL.is_dir():
        raise SystemExit(f"{MODEL}: run `envace prepare-model smollm2-135m-instruct` first")
    if "library" in opts.validate and not SERVER.exists():
        raise SystemExit(f"{SERVER}: the library validation case needs the real server: run "
                         "`bash scripts/setup_mcp_servers.sh` first, or leave library out of --validate")
    small, large = opts.batches
    rows: list[tuple[str, str, int, str, float, float]] = []
    peaks: dict[tuple[str, str, int, str], float] = {}
    first_peaks: dict[tuple[str, str, int, str], float] = {}  # the smaller batch's peak over its first --steps
    step_ratio: list[float] = []
    trimmed_ratio: list[float] = []
    validation_peaks: list[float] = []
    with tempfile.TemporaryDirectory(prefix="envace-memory-") as tmp:
        for domain in opts.validate:
            for generate_batch in opts.val_generate_batch:
                root = Path(tmp, f"validate-{domain}-{generate_batch}")
                try:
                    result = run_case(validation_args(domain, opts.val_tasks, root, generate_batch))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                label = f"generate_batch_size {generate_batch or 'of the config'}"
                if not generate_batch:
                    validation_peaks.append(result["peak_gb"])
                rows.append(("validate", domain, opts.val_tasks, label, result["peak_gb"], result["wall_s"]))
                print(f"validate {domain}, {opts.val_tasks} tasks, {label}: peak {result['peak_gb']:.2f} GB, "
                      f"{result['wall_s']:.0f} s", flush=True)
        for stage in opts.stages:
            for task_set in opts.sets:
                for batch in (small, large):  # the peaks at the defaults, over the same tasks
                    steps = opts.steps * large // small if batch == small else opts.steps
                    result = run_in(tmp, case_args, stage, task_set, batch, "default", steps)
                    peaks[(stage, task_set, batch, "default")] = result["peak_gb"]
                    step = mean_step(result["times"][: opts.steps])
                    if steps > opts.steps:
                        first_peaks[(stage, task_set, batch, "default")] = result["hwm"][opts.steps - 1]
                        print(f"{stage} {task_set} batch {batch}: peak {result['hwm'][opts.steps - 1]:.2f} GB over "
                              f"its first {opts.steps} steps, {result['peak_gb']:.2f} GB over {steps}", flush=True)
                    rows.append((stage, task_set, batch, "default", result["peak_gb"], step))
                    print(f"{stage} {task_set} batch {batch} budget default: peak {result['peak_gb']:.2f} GB, "
                          f"step {step:.1f} s{breakdown(result, opts.steps)}", flush=True)
                if opts.repeats:
                    ratios = time_pairs(tmp, stage, task_set, small, opts, rows)
                    step_ratio.append(ratios["0"])
                    if "0+trim" in ratios:
                        trimmed_ratio.append(ratios["0+trim"])
        growth = growth_peak = float("nan")
        if opts.growth_steps:
            root = Path(tmp, "growth")
            args = case_args("sft", "bank", small, "default", opts.growth_steps, root)
            interval = max(1, opts.growth_steps // 4)
            args += ["--trainer.limit_val_batches=1", f"--trainer.val_check_interval={interval}",
                     "--data.eval_batch_size=8", "--model.init_args.export_best=val/success_act",
                     f"--model.init_args.export_dir={root}/policy"]
            result = run_case(args, rss_every_step=True)
            rss, growth_peak = result["rss"], result["peak_gb"]
            growth, envelope = growth_per_100(rss, interval)
            print(f"growth: {rss[0]:.2f} GB after step 1; after the first validation, step ends between "
                  f"{envelope[0][0]:.2f} and {envelope[0][1]:.2f} GB (steps {interval + 1}-{2 * interval}), in the "
                  f"last {interval} steps between {envelope[1][0]:.2f} and {envelope[1][1]:.2f} GB; peak "
                  f"{growth_peak:.2f} GB; every step: {' '.join(f'{x:.2f}' for x in rss)}", flush=True)
    print("\n| stage | tasks | batch | budget | peak GB | step s (validate: the run) |\n|---|---|---|---|---|---|")
    for stage, task_set, batch, budget, peak, step in rows:
        print(f"| {stage} | {task_set} | {batch} | {budget} | {peak:.2f} | {step:.1f} |")
    default = {k: v for k, v in peaks.items() if k[3] == "default"}
    sft = max((v for k, v in default.items() if k[0] == "sft"), default=float("nan"))
    rl = max((v for k, v in default.items() if k[0] == "rl"), default=float("nan"))
    ratios = [default[(s, t, large, "default")] / default[(s, t, small, "default")]
              for (s, t, b, _) in default if b == small and (s, t, large, "default") in default]
    ratio = max(ratios, default=float("nan"))
    first = max((default[(s, t, large, "default")] / v for (s, t, _, _), v in first_peaks.items()
                 if (s, t, large, "default") in default), default=float("nan"))
    steps = max(step_ratio, default=float("nan"))
    trimmed = max(trimmed_ratio, default=float("nan"))
    validation = max(validation_peaks, default=float("nan"))
    print(f"SUMMARY sft_peak_gb={sft:.2f} rl_peak_gb={rl:.2f} peak_ratio_batch16_over_batch4={ratio:.3f} "
          f"growth_gb_per_100_steps={growth:.3f} growth_peak_gb={growth_peak:.2f} "
          f"validation_peak_gb={validation:.2f} step_time_ratio={steps:.3f} "
          f"step_time_ratio_over_trimmed_off={trimmed:.3f} peak_ratio_first_steps={first:.3f}")


if __name__ == "__main__":
    main()
