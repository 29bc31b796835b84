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
a's RL, all seeds>``. A real-model study (``--policy smollm2``) prints ``SUMMARY gain=<a minus d, paired, mean over
seeds and domains> std=<its std> gain_vs_real=<a minus b> real_calls_rl=<...> rehearsal_gain_envace=<best budget
minus budget 0, arm a> rehearsal_gain_base=<the same, arm d>`` over what is recorded: ``nan`` where a figure has
not been measured yet (a std needs two paired gains).

The study's parts are sibling modules of this script: ``study_settings`` (its arms, worlds and ``Settings``),
``study_plan`` (the job list and its resumable run), ``study_jobs`` (what each job trains or tests) and
``study_report`` (the tables and the SUMMARY line).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from study_plan import plan, read_record, run_all, select  # noqa: E402
from study_report import SPLIT_SIZES, _section, report, scoped_report, write_section  # noqa: E402
from study_settings import Settings, parse_levers  # noqa: E402

SECTION = "controlled_study"
"""This benchmark's section of the report file."""


PACING = ("--max-jobs", "--only")
"""Options that choose which jobs run when, never what a job does: the report's command leaves them out."""
RESUMING = ("--accept-rebuilt",)
"""Flags of how one session resumes after a checkpoint was lost, also left out: the report names each arm that
started from a rebuilt checkpoint beside its table."""


def _without_pacing(args: list[str]) -> list[str]:
    """The command line as the report prints it, without the ``PACING`` options and the ``RESUMING`` flags."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in PACING:
            skip = True
        elif arg in RESUMING:
            continue
        elif not arg.startswith(tuple(f"{option}=" for option in PACING)):
            out.append(arg)
    return out


PORTABLE_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}
"""CPU arithmetic pinned to AVX2 kernels (torch's own and MKL's, whose conditional numerical reproducibility promises
the same results on every processor with AVX2), whatever the processor offers beyond: a warm start trained again in
a later session, on another x86 CPU, should then get the same weights (same torch, thread count and seed); not yet
seen on two machines, so the fingerprint check still guards it. Measured on an AVX-512 machine: no slower than its
native kernels for SmolLM2-width training steps."""


def portable_numerics(cpuinfo: str = "/proc/cpuinfo") -> None:
    """Pin the jobs' CPU arithmetic (``PORTABLE_NUMERICS``, inherited by the worker processes) on an x86 CPU with
    AVX2, where the user has not set those variables; elsewhere leave it alone."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        flags = Path(cpuinfo).read_text(encoding="utf-8").split()
    except OSError:  # not Linux: no reliable flag list, so no pinning
        return
    if "avx2" in flags:
        for name, value in PORTABLE_NUMERICS.items():
            os.environ.setdefault(name, value)


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="jobs in parallel (one torch thread each)")
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--sft-max-steps", type=int, default=3000)
    parser.add_argument("--out", default="runs/study")
    parser.add_argument("--report", default="docs/results.md")
    parser.add_argument("--section", default=None,
                        help="the report's section a real-model study writes (default: controlled_study_<label>); "
                             "a study of other domains with the same policy names its own, so neither replaces the "
                             "other")
    parser.add_argument("--eval-tasks", type=int, default=None, help="test on this many tasks per split")
    parser.add_argument("--sft", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of the warm start and of arm (e) (repeatable)")
    parser.add_argument("--rl", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of every RL arm (repeatable)")
    parser.add_argument("--warm", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument of the warm start only (repeatable)")
    parser.add_argument("--eval", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace test` argument of every evaluation and test-time rehearsal (repeatable; "
                             "e.g. --eval=--model.rollout.engine=vllm)")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME:OVERRIDE",
                        help="a variant of arm (a) named NAME with an extra `envace fit` argument (repeat a NAME to "
                             "add arguments); trained from the same warm starts and reported in its own table")
    parser.add_argument("--policy", default="tiny", choices=("tiny", "smollm2"),
                        help="the policy (envace.cli.demo's presets: their SFT and RL configs)")
    parser.add_argument("--domains", nargs="+", default=["bank"], choices=("bank", "desk", "library"))
    parser.add_argument("--record", default=None,
                        help="the results file kept in version control (default for a real model: "
                             "docs/study/<label>.json, the label being the policy's or --base-model's name): "
                             "recorded jobs are skipped, each finished job is added")
    parser.add_argument("--rehearsal-budgets", type=int, nargs="+", default=[0, 2, 4],
                        help="test-time private rehearsal budgets of arms (a) and (d) (a real-model study)")
    parser.add_argument("--rehearsal-selector", default="envace.rollout.private_rehearsal.OutcomeMajorityCommit",
                        help="what a test-time rehearsal commits (a class path in envace.rollout.private_rehearsal)")
    parser.add_argument("--demos", type=int, default=None,
                        help="demonstrations of the warm start (and arm (e)): the domain's first N training tasks; the "
                             "RL arms keep those N references (default: each config's own)")
    parser.add_argument("--curve-every", type=int, default=0,
                        help="validate every this many RL steps (rehearsal fidelity, imagined and real success "
                             "curves during RL); 0: no curve")
    parser.add_argument("--curve-tasks", type=int, default=32, help="validation tasks of each curve point")
    parser.add_argument("--world-steps", type=int, default=0,
                        help="a world stage before each warm start: the rehearse role alone trains this many steps on "
                             "the recorded responses of the SFT config's demonstrations, which the RL arms keep as "
                             "references (0: none)")
    parser.add_argument("--base-model", default=None,
                        help="a pretrained model directory the first SFT stage starts from, in place of the preset's "
                             "(e.g. Qwen3-1.7B on a GPU machine)")
    parser.add_argument("--rehearsal-tasks", type=int, default=None,
                        help="test-time private rehearsal on the first this-many test tasks (default: as --eval-tasks)")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERN",
                        help="run only the jobs whose keys match PATTERN (shell-style; repeatable) and the jobs they "
                             "need, e.g. --only 'smollm2-bank-s0-*-a' --only smollm2-bank-s0-a")
    parser.add_argument("--accept-rebuilt", action="store_true",
                        help="train the jobs still to run from a warm start trained again whose weights differ from "
                             "the recorded one's (another CPU), and test that rebuild's (d) again for them to pair "
                             "with; without it such a rebuild stops the study")
    parser.add_argument("--max-jobs", type=int, default=None,
                        help="start at most this many jobs, then rebuild the report from what is recorded (0: only "
                             "rebuild it)")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("at least 2 seeds are needed for a standard deviation")
    if args.max_jobs is not None and args.max_jobs < 0:
        parser.error("--max-jobs must be 0 or more")
    try:
        levers = parse_levers(args.lever)
    except ValueError as err:
        parser.error(str(err))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.demos is not None and args.demos < 1:
        parser.error("--demos must be at least 1")
    if args.world_steps < 0:
        parser.error("--world-steps must be 0 or more")
    if args.rehearsal_tasks is not None and not 1 <= args.rehearsal_tasks <= SPLIT_SIZES["test"]:
        parser.error(f"--rehearsal-tasks must be between 1 and {SPLIT_SIZES['test']} (the test split)")
    if 0 not in args.rehearsal_budgets or any(b < 0 for b in args.rehearsal_budgets):
        parser.error("--rehearsal-budgets must include 0 (plain acting, the baseline) and none below it")
    scopes = [Settings(args.out, args.rl_steps, args.sft_max_steps, tuple(args.sft), tuple(args.rl), args.eval_tasks,
                       tuple(args.warm), levers, args.policy, domain, tuple(sorted(set(args.rehearsal_budgets))),
                       args.rehearsal_selector, args.curve_every, args.curve_tasks, tuple(args.eval), args.demos,
                       args.rehearsal_tasks, args.world_steps, args.base_model)
              for domain in args.domains]
    given = list(argv if argv is not None else sys.argv[1:])
    command = " ".join(["python benchmarks/controlled_study.py", *map(shlex.quote, _without_pacing(given))])
    try:
        label = scopes[0].label
    except ValueError as err:
        parser.error(str(err))
    if label == "tiny" and args.domains == ["bank"] and args.record is None:  # the original study
        results = run_all(plan(scopes[0], args.seeds), args.out, args.workers, max_jobs=args.max_jobs)
        text = report(results, args.seeds, scopes[0], command)
        write_section(args.report, SECTION, text)
        print(text)  # noqa: T201
        return
    record = args.record or f"docs/study/{label}.json"
    jobs = everything = [job for scope in scopes for job in plan(scope, args.seeds)]
    if args.only:
        try:
            jobs = select(jobs, args.only)
        except ValueError as err:
            parser.error(str(err))
    if args.max_jobs != 0:
        portable_numerics()
        run_all(jobs, args.out, args.workers, record=record, max_jobs=args.max_jobs,
                accept_rebuilt=args.accept_rebuilt, retests=everything)
    report_file = Path(args.report)
    tiny = _section(report_file.read_text(encoding="utf-8"), SECTION) if report_file.is_file() else ""
    text = scoped_report(read_record(record), args.seeds, scopes, command, tiny)
    write_section(args.report, args.section or f"{SECTION}_{label}", text)
    print(text)  # noqa: T201


if __name__ == "__main__":
    main()
