"""envace against TRL's ``GRPOTrainer``: wall time of one GRPO optimiser step on the same inputs (CPU).

Protocol (a fair side-by-side: identical inputs, identical work, identical optimisation, separate processes):

- **Identical inputs.** One tiny Qwen2 (hidden 64, 2 layers, seed 0, fp32) and its tokenizer are built in code once
  and saved to a temporary folder; each side loads that folder fresh in its own process. The chat template is TRL's
  bundled ``qwen2_5.jinja``, byte for byte. 64 single-turn arithmetic prompts (no tools) go to envace as a JSONL task
  file and to TRL as a conversational dataset, in the same order (no shuffling). The reward is the same pure-Python
  function on both sides: 1.0 if the completion contains the answer string.
- **Identical work per step.** 8 prompts x G=4 = 32 completions, each exactly 32 new tokens (``min_new_tokens=32``
  on both sides: TRL's ``generation_kwargs``; envace's engine ``generate`` is wrapped here to set
  ``SamplingParams.min_new_tokens``), sampling at temperature 1.0, top_p 1.0, top_k 0. envace uses its own rollout
  engine (``--engine``, default envace's ``model.rollout.engine``: ``cached`` samples the same distribution by
  inverse CDF, ``hf`` calls ``generate``). One forward/backward over all 32 rows in one micro-batch, per-token entropy
  on both sides, no reference model (beta 0), no old-log-prob forward (on-policy), no gradient checkpointing, fp32.
- **Identical optimisation.** Fused AdamW (lr 1e-5, betas 0.9/0.999, eps 1e-8, weight decay 0), gradient-norm
  clip 1.0, linear decay to 0 over the run, clipped ratio loss with epsilon 0.2, token-level mean over the whole
  batch (TRL ``loss_type="dapo"``, envace ``TokenMean``), group-scaled advantages.
- **Known differences that remain.** TRL's group std is the unbiased one plus 1e-4, envace's the population one plus
  1e-6 (the advantages differ by a constant factor, not the work). TRL's reward sees the decoded completion, envace's
  the parsed final answer. TRL also suppresses the pad token until the 32nd token (it is one of its EOS ids); envace
  stops on ``<|im_end|>`` only. envace logs no external logger (``logger: false``) as TRL runs with
  ``report_to="none"``. A completion that contains ``<tool_call>`` or ``</tool_call>`` is a malformed call to envace:
  it appends the error feedback as a tool message before the episode ends (the "rows with feedback" column); the
  update cuts every row after its last trained token, so that tail costs envace the feedback's rendering only.
- **Process layout.** Each side runs in its own subprocess (this script re-invoked with ``--side``), alternating
  envace/TRL for ``--pairs`` pairs and swapping which one goes first in every pair. Each run does ``--warmup``
  steps, then ``--steps`` timed steps. envace runs through its real training path: ``envace.cli.lightning.cli_main``
  builds ``EnvACEModule``, ``RolloutDataModule`` and the Lightning ``Trainer`` from a YAML config, then ``trainer.fit``.
  TRL runs ``GRPOTrainer.train``.
- **What is timed.** Per optimiser step, from the start of step k to its end (rollout, reward, advantages, loss,
  backward, optimiser): a Lightning callback (``on_train_batch_start``/``end``) and a ``TrainerCallback``
  (``on_step_begin``/``end``). "step-to-step" is the start of step k to the start of step k+1 (it adds the
  frameworks' between-step bookkeeping). "gen+score" is envace's logged ``rollout_time_s`` and the wall time of
  TRL's ``_generate_and_score_completions``; "generate" is generation alone (envace's engine ``generate``, TRL's
  ``model.generate``); "update" is step - gen+score (envace's own ``update_time_s``, which stops before its
  logging, is shown too).

Run from the repository root (TRL is an optional dependency: ``.venv/bin/pip install -e '.[vs-trl]'``)::

    .venv/bin/python benchmarks/vs_trl.py [--pairs 3] [--steps 10] [--warmup 2] [--threads 1] [--engine cached|hf]
        [--model models/smollm2-135m-instruct]

``--model DIR`` runs both sides on a real model instead of the tiny Qwen2 (its own tokenizer, TRL's ChatML
``qwen2_5.jinja`` template).

It prints a Markdown table and, last, ``SUMMARY trl_over_envace_step_time=<f> threads=<n>``: the median over pairs
of (TRL median step time / envace median step time); above 1 means envace is faster.

The shared inputs are built by ``benchmarks/vs_trl_inputs.py`` and each side runs in ``benchmarks/vs_trl_runs.py``;
this script parses the options, runs the alternating pairs and prints the tables.
"""

from __future__ import annotations

import os

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, also when loaded by path
from vs_trl_inputs import (  # noqa: E402
    GROUP_SIZE,
    MODEL_DIR,
    NEW_TOKENS,
    PROMPTS_PER_STEP,
    TASKS_FILE,
    build_model_dir,
    use_model_dir,
    write_tasks,
)
from vs_trl_runs import run_envace, run_trl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = ".venv/bin/pip install -e '.[vs-trl]'"
SIDES = ("envace", "trl")
LOAD_WARNING = 0.7


# -- orchestration -----------------------------------------------------------------------------------------------------


def worker(side: str, workdir: Path, out: Path, max_steps: int, threads: int, engine: str | None) -> None:
    """Run one side in this process and write its per-step records to ``out`` (JSON)."""
    import torch

    torch.set_num_threads(threads)
    run: Callable[[Path, int, int, str | None], list[dict[str, float]]] = run_envace if side == "envace" else run_trl
    records = run(workdir, max_steps, threads, engine)
    out.write_text(json.dumps({"side": side, "steps": records}), encoding="utf-8")


def run_side(side: str, workdir: Path, index: int, args: argparse.Namespace) -> list[dict[str, float]]:
    """Run ``side`` in a fresh subprocess; its per-step records.

    Raises:
        RuntimeError: the worker failed (its output's tail is in the message).
    """
    out = workdir / f"{side}-{index}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--workdir", str(workdir),
           "--out", str(out), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--threads", str(args.threads)] + (["--engine", args.engine] if args.engine else [])
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (workdir / f"{side}-{index}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{side} worker failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    steps = json.loads(out.read_text(encoding="utf-8"))["steps"]
    if len(steps) != args.warmup + args.steps:
        raise RuntimeError(f"{side} worker recorded {len(steps)} steps, expected {args.warmup + args.steps}")
    return steps


def summarise(steps: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Medians of one run over its timed steps (``update_s`` = step - gen+score)."""
    timed = steps[warmup:]
    out = {key: statistics.median(s[key] for s in timed) for key in timed[0] if key != "cycle_s"}
    cycles = [s["cycle_s"] for s in timed if "cycle_s" in s]
    out["cycle_s"] = statistics.median(cycles) if cycles else float("nan")
    out["update_s"] = statistics.median(s["step_s"] - s["gen_score_s"] for s in timed)
    out["completion_len"] = out["gen_tokens"] / out["completions"]
    return out


def median_of(runs: list[dict[str, float]], key: str) -> float:
    """Median over runs of one per-run median."""
    return statistics.median(r[key] for r in runs)


def report(results: list[tuple[str, list[dict[str, float]]]], pairs: list[tuple[int, str]], warmup: int) -> str:
    """The Markdown tables: per side, per pair, and every timed step."""
    runs = {side: [summarise(steps, warmup) for s, steps in results if s == side] for side in SIDES}
    lines = [
        "| side | median s/step | step-to-step s | gen+score s | of which generate s | update s | envace logged "
        "update s | gen tokens/step | mean completion len | prompt tokens | update seq len | rows with feedback |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        r = runs[side]
        logged = f"{median_of(r, 'update_logged_s'):.3f}" if side == "envace" else "-"
        lines.append(
            f"| {side} | {median_of(r, 'step_s'):.3f} | {median_of(r, 'cycle_s'):.3f} | "
            f"{median_of(r, 'gen_score_s'):.3f} | {median_of(r, 'generate_s'):.3f} | {median_of(r, 'update_s'):.3f} | "
            f"{logged} | {median_of(r, 'gen_tokens'):.0f} | {median_of(r, 'completion_len'):.2f} | "
            f"{median_of(r, 'prompt_tokens'):.1f} | {median_of(r, 'update_width'):.0f} | "
            f"{median_of(r, 'feedback_rows'):.1f} |"
        )
    lines += ["", "| pair | first | envace s/step | TRL s/step | TRL / envace |", "|---|---|---|---|---|"]
    for i, (pair, first) in enumerate(pairs):
        e, t = runs["envace"][i]["step_s"], runs["trl"][i]["step_s"]
        lines.append(f"| {pair} | {first} | {e:.3f} | {t:.3f} | {t / e:.3f} |")
    lines += ["", "Timed step times (s), per run in execution order:"]
    for side, steps in results:
        lines.append(f"- {side}: " + " ".join(f"{s['step_s']:.3f}" for s in steps[warmup:]))
    return "\n".join(lines)


def step_ratio(results: list[tuple[str, list[dict[str, float]]]], warmup: int) -> float:
    """Median over pairs of TRL's median step time over envace's."""
    per_side = {side: [summarise(steps, warmup)["step_s"] for s, steps in results if s == side] for side in SIDES}
    return statistics.median(t / e for e, t in zip(per_side["envace"], per_side["trl"], strict=True))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the benchmark's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3, help="envace/TRL run pairs (the first side alternates)")
    p.add_argument("--steps", type=int, default=10, help="timed optimiser steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads and OMP/MKL_NUM_THREADS")
    p.add_argument("--engine", choices=("cached", "hf"), help="envace's model.rollout.engine (default: envace's)")
    p.add_argument("--model", type=Path, help="a local Hugging Face model directory to compare on (e.g. "
                   "models/smollm2-135m-instruct, from envace prepare-model) instead of the tiny Qwen2 built in code")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # worker mode
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pairs < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--pairs, --steps and --threads must be at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> None:
    """Build the shared inputs, run the alternating pairs, print the tables and the SUMMARY line."""
    args = parse_args(argv)
    if args.side is not None:
        worker(args.side, args.workdir, args.out, args.warmup + args.steps, args.threads, args.engine)
        return
    missing = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(f"benchmarks/vs_trl.py needs {' and '.join(missing)}: {INSTALL_HINT}")
    load = os.getloadavg()[0]
    if load > LOAD_WARNING:
        print(f"WARNING: load average {load:.2f} > {LOAD_WARNING}: other processes compete, timings will be noisy",  # noqa: T201
              flush=True)
    with tempfile.TemporaryDirectory(prefix="envace-vs-trl-") as tmp:
        workdir = Path(tmp)
        if args.model is None:
            build_model_dir(workdir / MODEL_DIR)
        else:
            use_model_dir(args.model, workdir / MODEL_DIR)
        write_tasks(workdir / TASKS_FILE)
        results: list[tuple[str, list[dict[str, float]]]] = []
        pairs: list[tuple[int, str]] = []
        for pair in range(args.pairs):
            order = SIDES if pair % 2 == 0 else SIDES[::-1]
            pairs.append((pair + 1, order[0]))
            for side in order:
                print(f"pair {pair + 1}/{args.pairs}: {side} ...", flush=True)  # noqa: T201
                results.append((side, run_side(side, workdir, pair, args)))
    threads = {int(s["threads"]) for _, steps in results for s in steps}
    from envace.rollout.config import RolloutConfig

    engine = args.engine or RolloutConfig().engine
    model = args.model or "the tiny Qwen2 built in code"
    print(f"\n{model}: {args.pairs} pairs x ({args.warmup} warm-up + {args.steps} timed steps); "  # noqa: T201
          f"{PROMPTS_PER_STEP} prompts x G={GROUP_SIZE} x {NEW_TOKENS} new tokens per step; envace engine {engine}; "
          "torch threads "
          f"{sorted(threads)}; load average "
          f"before {load:.2f}, after {os.getloadavg()[0]:.2f}\n")
    print(report(results, pairs, args.warmup))  # noqa: T201
    print(f"SUMMARY trl_over_envace_step_time={step_ratio(results, args.warmup):.3f} "  # noqa: T201
          f"threads={max(threads)}")


if __name__ == "__main__":
    main()
