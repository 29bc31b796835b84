"""The embedded demo: SFT warm start, EnvACE rehearsal RL, then real-environment evaluation of both checkpoints.

``python -m envace.cli.demo`` (the README's first command, through ``scripts/train.sh``) runs three stages with the
``envace`` CLI on the built-in bank domain and prints one table:

1. ``lit_configs/tiny_sft.yaml``: supervised warm start of both roles from reference trajectories (real responses
   recorded offline), exported in Hugging Face format;
2. ``lit_configs/tiny_rl.yaml``: EnvACE training from that warm start in ``rehearse`` mode: the policy writes every
   tool response itself, so no real tool is called during RL (counted by the module, not assumed);
3. ``envace test`` of both checkpoints on the test splits, in the real environment (real success) and in the
   policy's own rehearsed world (imagined success), with the rehearsal fidelity of the reference calls.

The stage helpers are also what ``benchmarks/controlled_study.py`` builds its arms from.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from envace.cli.lightning import cli_main
from envace.errors import report_user_errors as guarded
from envace.runtime.progress import ensure_handler, format_duration

logger = logging.getLogger("envace.cli.demo")  # not __name__: it is "__main__" under python -m envace.cli.demo

SPLITS = {"test": "builtin:bank-test", "heldout": "builtin:bank-heldout"}
"""The evaluation splits: in-distribution test tasks, and held-out task templates (of the bank; ``--domain`` swaps)."""
DOMAINS = ("bank", "desk", "library")
"""``--domain``: the built-in domain the demo trains and tests on (the configs name the bank's task sets)."""
_BANK_SET = re.compile(r"builtin:bank(?=$|[-:])")

DEMO_SFT = (
    "--trainer.max_steps=1000",               # the demo's budget; the configs alone train to a plateau
    "--trainer.val_check_interval=250",
    "--data.val_tasks=builtin:bank-val:64",
)
"""The demo's warm-start overrides of ``lit_configs/tiny_sft.yaml`` (``--sft=...`` arguments come after them)."""

DEMO_RL = (
    "--trainer.max_steps=40",
    "--trainer.limit_val_batches=0",          # both checkpoints are tested afterwards
)
"""The demo's RL overrides of ``lit_configs/tiny_rl.yaml`` (``--rl=...`` arguments come after them)."""


@dataclass(frozen=True)
class Preset:
    """What ``--model`` selects: the two stages' configs, the demo's budget, and the model to prepare first.

    Attributes:
        sft_config: the warm start's config.
        rl_config: the RL stage's config (also used for the tests).
        sft_overrides: the demo's budget for the warm start (``--sft=...`` arguments come after them).
        rl_overrides: the demo's budget for RL.
        prepare: a packaged model ``envace prepare-model`` writes to ``models/<name>`` before the first stage.
        seeds_weights: ``--seed`` also seeds the initial weights (a policy built in code; a pretrained one has
            its weights).
        fits_tokenizer: ``--domain`` also fits the policy's tokenizer to that domain (the tiny policy's BPE is
            trained in code on a domain's texts; a pretrained model has its tokenizer).
        per_domain: ``--domain NAME``'s extra ``(SFT, RL)`` overrides, after the budget and before ``--sft``/``--rl``.
    """

    sft_config: str
    rl_config: str
    sft_overrides: tuple[str, ...]
    rl_overrides: tuple[str, ...]
    prepare: str | None = None
    seeds_weights: bool = False
    fits_tokenizer: bool = False
    per_domain: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)


TINY_DESK = (
    ("--trainer.max_steps=3000",),      # 1000 steps reach 0.20 validation success on the desk, 3000 reach 0.39
    ("--model.fidelity_gate=null",),    # its desk rehearsals stay near 0.07 exact match (gate 0.1): RL runs, warned
)
"""The tiny policy's desk budget: more warm-start steps, and RL past the fidelity gate, which the demo announces."""

PRESETS = {
    "tiny": Preset("lit_configs/tiny_sft.yaml", "lit_configs/tiny_rl.yaml", DEMO_SFT, DEMO_RL, seeds_weights=True,
                   fits_tokenizer=True, per_domain={"desk": TINY_DESK}),
    "smollm2": Preset(
        "lit_configs/smollm2_sft.yaml", "lit_configs/smollm2_rl.yaml",
        ("--trainer.max_steps=80", "--trainer.limit_val_batches=0", "--model.init_args.export_best=null",
         "--model.init_args.optimizer.init_args.lr=1.0e-4"),
        ("--trainer.max_steps=10", "--trainer.limit_val_batches=0", "--data.batch_size=4"),
        prepare="smollm2-135m-instruct",
    ),
}
"""``python -m envace.cli.demo --model NAME``: the tiny policy built in code (the default), or SmolLM2-135M-Instruct."""

COLUMNS = (
    ("success_act", "real success"),
    ("imagined_success", "imagined success"),
    ("fidelity_exact_match", "fidelity EM"),
    ("fidelity_leaf_f1", "fidelity leaf F1"),
    ("parse_error_rate_act", "act parse errors"),
    ("calls_per_episode", "calls/episode"),
)
"""Test metrics shown in the table (key under ``test/``, header)."""


def on_domain(args: Sequence[str], domain: str) -> list[str]:
    """``args`` with every built-in bank task set (``builtin:bank``, ``builtin:bank-val:64``, ...) of ``domain``."""
    return [_BANK_SET.sub(f"builtin:{domain}", a) for a in args]


def domain_overrides(config: str, domain: str) -> list[str]:
    """The ``--data.*_tasks`` overrides that move a bank config's task sets to ``domain`` (none for the bank)."""
    if domain == "bank":
        return []
    data = (yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}).get("data") or {}
    data = data.get("init_args", data)
    keys = ("train_tasks", "val_tasks", "test_tasks")
    return on_domain([f"--data.{k}={data[k]}" for k in keys if isinstance(data.get(k), str)], domain)


@dataclass
class StageResult:
    """What a ``fit`` stage left behind.

    Attributes:
        export_dir: where the policy was exported (Hugging Face format).
        seconds: wall-clock time of the stage.
        steps: optimiser steps taken.
        metrics: the trainer's final logged metrics (floats).
    """

    export_dir: str
    seconds: float
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def fit(config: str, export_dir: str, root_dir: str, overrides: Sequence[str] = ()) -> StageResult:
    """Run ``envace fit --config config`` with the export and output directories set, plus ``overrides``."""
    args = [
        "fit", "--config", config,
        f"--trainer.default_root_dir={root_dir}",   # logs and checkpoints (last.ckpt, for envace export) go here
        f"--model.init_args.export_dir={export_dir}",
        *overrides,
    ]
    start = time.perf_counter()
    cli = cli_main(args)
    seconds = time.perf_counter() - start
    if not Path(export_dir, "config.json").is_file():
        raise RuntimeError(f"stage {config} finished without exporting a policy to {export_dir}")
    return StageResult(export_dir, seconds, cli.trainer.global_step, _floats(cli.trainer.callback_metrics))


def evaluate(
    config: str, policy_dir: str, tasks: str, root_dir: str, overrides: Sequence[str] = ()
) -> dict[str, float]:
    """``envace test`` of the exported policy ``policy_dir`` on ``tasks`` (real and imagined success, fidelity)."""
    args = [
        "test", "--config", config,
        "--model.init_args.policy=envace.policy.HFPolicy",
        f"--model.init_args.policy.init_args.name_or_path={policy_dir}",
        f"--data.test_tasks={tasks}",
        f"--trainer.default_root_dir={root_dir}",
        "--trainer.logger=false",
        *overrides,
    ]
    cli = cli_main(args)
    return {k.removeprefix("test/"): v for k, v in _floats(cli.trainer.callback_metrics).items()}


def _floats(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def format_table(rows: list[tuple[str, str, dict[str, float], str]]) -> str:
    """A Markdown table: one row per (checkpoint, split), the ``COLUMNS`` metrics and the real calls of its RL."""
    header = ["checkpoint", "split", *(title for _, title in COLUMNS), "real calls during RL"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, split, metrics, calls in rows:
        cells = [f"{metrics[key]:.3f}" if key in metrics else "n/a" for key, _ in COLUMNS]
        lines.append("| " + " | ".join([name, split, *cells, calls]) + " |")
    return "\n".join(lines)


def run_demo(out: str, sft_config: str, rl_config: str, sft_overrides: Sequence[str] = (),
             rl_overrides: Sequence[str] = (), eval_tasks: int | None = None, seed: int | None = None,
             seeds_weights: bool = True, domain: str = "bank", fits_tokenizer: bool = False) -> str:
    """Run the three stages under ``out`` and return the results table.

    Args:
        out: output directory.
        sft_config: the warm start's config.
        rl_config: the RL stage's config (also used for the tests).
        sft_overrides: extra ``envace fit`` arguments of the warm start.
        rl_overrides: extra ``envace fit`` arguments of the RL stage.
        eval_tasks: test on the first this-many tasks of each split (generated); None uses the packaged splits.
        seed: the seed of everything random (``seed_everything``, the tiny policy's initial weights, the task
            order of both stages); None keeps the configs' (0). The warm start is teacher-forced and its validation
            greedy: only the weights and the task order make two seeds' warm starts differ.
        seeds_weights: ``seed`` also sets the policy's ``seed`` (a ``TinyPolicy``'s initial weights).
        domain: the built-in domain (``DOMAINS``): its task sets replace the bank's in the configs and overrides.
        fits_tokenizer: with a domain other than the bank, fit the policy's tokenizer to it (``TinyPolicy``).
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain '{domain}'; valid: {', '.join(DOMAINS)}")
    splits = {k: v if eval_tasks is None else f"{v}:{eval_tasks}" for k, v in SPLITS.items()}
    splits = dict(zip(splits, on_domain(list(splits.values()), domain), strict=True))
    fitted = fits_tokenizer and domain != "bank"
    tokenizer = [f"--model.init_args.policy.init_args.domains=[{domain}]"] if fitted else []
    sft_overrides = [*domain_overrides(sft_config, domain), *tokenizer, *on_domain(sft_overrides, domain)]
    rl_overrides = [*domain_overrides(rl_config, domain), *on_domain(rl_overrides, domain)]
    seeded = [] if seed is None else [f"--seed_everything={seed}", f"--data.seed={seed}"]
    initial = [] if seed is None or not seeds_weights else [f"--model.init_args.policy.init_args.seed={seed}"]
    start = time.perf_counter()
    stages = 2 + 2 * len(splits)
    logger.info("demo: stage 1/%d, SFT warm start (%s) -> %s/sft", stages, sft_config, out)
    warm = fit(sft_config, f"{out}/sft/policy", f"{out}/sft", [*seeded, *initial, *sft_overrides])
    logger.info("demo: stage 2/%d, EnvACE RL (%s) -> %s/rl; SFT took %s", stages, rl_config, out,
                format_duration(warm.seconds))
    rl = fit(rl_config, f"{out}/rl/policy", f"{out}/rl",
             [f"--model.init_args.policy.init_args.name_or_path={warm.export_dir}", *seeded, *rl_overrides])
    real_calls = int(rl.metrics.get("train/real_calls_total", float("nan")))
    rows = []
    for name, stage, calls in (("warm start (SFT)", warm, "n/a"), ("EnvACE (rehearse RL)", rl, str(real_calls))):
        for split, tasks in splits.items():
            logger.info("demo: stage %d/%d, test of the %s on %s (%s elapsed)", len(rows) + 3, stages, name, split,
                        format_duration(time.perf_counter() - start))
            rows.append((name, split, evaluate(rl_config, stage.export_dir, tasks, f"{out}/eval",
                                                  seeded[:1]), calls))
    table = format_table(rows)
    minutes = (time.perf_counter() - start) / 60
    return (f"{table}\n\nSFT {warm.seconds:.0f} s, RL {rl.seconds:.0f} s, total {minutes:.1f} min. "
            f"Real tool calls during RL: {real_calls} (counted by the module).")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m envace.cli.demo [--out DIR] [--sft=OVERRIDE ...] [--rl=OVERRIDE ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/demo", help="output directory (logs, exported policies)")
    parser.add_argument("--model", choices=sorted(PRESETS), default="tiny",
                        help="tiny: the 1.2M-parameter policy built in code (about 7 minutes); smollm2: the real "
                             "pretrained SmolLM2-135M-Instruct, prepared from its wheel on first use (hours on 2 "
                             "CPU cores)")
    parser.add_argument("--sft-config", default=None, help="replace the preset's warm-start config")
    parser.add_argument("--rl-config", default=None, help="replace the preset's RL config")
    parser.add_argument("--sft", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument for the SFT stage, e.g. --sft=--trainer.max_steps=50")
    parser.add_argument("--rl", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace fit` argument for the RL stage (repeatable)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="test on this many tasks per split")
    parser.add_argument("--domain", choices=DOMAINS, default="bank",
                        help="the built-in domain: bank (arithmetic on balances) or desk (help desk tickets: string "
                             "lookups and updates); docs/builtin-domain.md")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the weights, the task order and sampling (default: the configs' 0)")
    args = parser.parse_args(argv)
    ensure_handler()
    preset = PRESETS[args.model]
    sft_config, rl_config = args.sft_config or preset.sft_config, args.rl_config or preset.rl_config

    def stages() -> str:
        if preset.prepare is not None:
            from envace.policy.packaged import DEFAULT_ROOT, packaged_gguf, prepare

            logger.info("demo: preparing %s in %s (once)", preset.prepare, DEFAULT_ROOT / preset.prepare)
            prepare(packaged_gguf(preset.prepare), DEFAULT_ROOT / preset.prepare)
        sft_extra, rl_extra = preset.per_domain.get(args.domain, ((), ()))
        if "--model.fidelity_gate=null" in rl_extra:
            logger.warning("demo: the %s policy's %s rehearsals are below the fidelity gate; its RL stage runs "
                           "without the gate, so read its imagined numbers with that in mind", args.model,
                           args.domain)
        return run_demo(args.out, sft_config, rl_config, [*preset.sft_overrides, *sft_extra, *args.sft],
                        [*preset.rl_overrides, *rl_extra, *args.rl], args.eval_tasks, args.seed,
                        preset.seeds_weights, args.domain, preset.fits_tokenizer)

    report = guarded(stages, ["--config", sft_config, "--config", rl_config, *args.sft, *args.rl])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "results.md").write_text(report + "\n", encoding="utf-8")
    print(report)  # noqa: T201 (the demo's result is its output)


if __name__ == "__main__":
    main()
