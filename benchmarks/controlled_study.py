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
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import fnmatch  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
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
        rehearsal_tasks: test-time private rehearsal on the first this-many test tasks; None: ``eval_tasks``.
        world_steps: before the warm start, train the rehearse role alone (``act_weight=0``) this many steps on the
            recorded tool responses of the SFT config's demonstrations (the world data), and keep those references in
            the RL arms; 0: no world stage.
        base_model: the pretrained model the first SFT stage starts from (a directory); None: the SFT config's.
    """

    out: str
    rl_steps: int
    sft_max_steps: int
    extra_sft: tuple[str, ...] = ()
    extra_rl: tuple[str, ...] = ()
    eval_tasks: int | None = None
    extra_warm: tuple[str, ...] = ()
    levers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    policy: str = "tiny"
    domain: str = "bank"
    rehearsal_budgets: tuple[int, ...] = (0, 2, 4)
    rehearsal_selector: str = "envace.rollout.private_rehearsal.OutcomeMajorityCommit"
    curve_every: int = 0
    curve_tasks: int = 32
    extra_eval: tuple[str, ...] = ()
    demos: int | None = None
    rehearsal_tasks: int | None = None
    world_steps: int = 0
    base_model: str | None = None

    def demo_args(self, stage: str) -> list[str]:
        """``--demos N``: the warm start (and arm (e)) trains on the domain's first N tasks' demonstrations, and RL
        keeps the recorded references of those N only (the alignment term and shaping read no others)."""
        if self.demos is None:
            return []
        if stage == "sft":
            return [f"--data.train_tasks=builtin:{self.domain}:{self.demos}"]
        return [] if self.world_steps else [f"--data.demonstrations={self.demos}"]

    def base(self) -> list[str]:
        """The override that starts the first SFT stage from ``base_model`` (none: the config's model)."""
        return [] if self.base_model is None else [f"--model.init_args.policy.init_args.name_or_path={self.base_model}"]

    @property
    def tag(self) -> str:
        """The prefix of this scope's job keys and directories (none for the tiny policy on the bank, the original)."""
        return "" if (self.label, self.domain) == ("tiny", "bank") else f"{self.label}-{self.domain}-"

    @property
    def label(self) -> str:
        """The policy's name in job keys, the results file and the report: the preset's, or the base model
        directory's (lower case, e.g. ``qwen3-1.7b``)."""
        if self.base_model is None:
            return self.policy
        name = re.sub(r"[^a-z0-9.]+", "-", Path(self.base_model.rstrip("/")).name.lower()).strip("-")
        if not name:
            raise ValueError(f"--base-model {self.base_model!r}: its directory name gives no label")
        return name

    @property
    def sft_config(self) -> str:
        """The warm start's config (``envace.cli.demo.PRESETS``)."""
        return _preset(self.policy).sft_config

    @property
    def rl_config(self) -> str:
        """The RL arms' (and the tests') config."""
        return _preset(self.policy).rl_config

    def root(self, seed: int) -> str:
        """Where one seed's runs of this scope go."""
        return f"{self.out}/{self.tag}seed{seed}"

    def key(self, seed: int, name: str) -> str:
        """A job's key: ``s0-warm``, ``smollm2-desk-s1-eval-a``."""
        return f"{self.tag}s{seed}-{name}"

    def on_domain(self, config: str) -> list[str]:
        """The overrides that move ``config``'s task sets to this scope's domain."""
        from envace.cli.demo import domain_overrides

        return domain_overrides(config, self.domain)

    def splits(self) -> dict[str, str]:
        """The test splits: the domain's test tasks and its held-out templates."""
        return {"test": f"builtin:{self.domain}-test", "heldout": f"builtin:{self.domain}-heldout"}


def _preset(policy: str) -> Any:
    from envace.cli.demo import PRESETS

    if policy not in PRESETS:
        raise ValueError(f"--policy {policy!r}: one of {sorted(PRESETS)}")
    return PRESETS[policy]


@dataclass
class Job:
    """One unit of work: a stage of one seed, run after the jobs it depends on."""

    key: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...]
    needs: tuple[str, ...] = ()
    extra: Callable[[dict[str, dict[str, Any]]], tuple[Any, ...]] = field(default=lambda results: ())
    checkpoints: tuple[str, ...] | None = None
    """The needs whose checkpoints this job reads (None: every need); the others lend it only their results."""
    again: Callable[[dict[str, Any]], tuple[Any, ...]] = field(default=lambda recorded: ())
    """Extra arguments of a recorded job trained again (its checkpoint was gone), from its recorded result."""
    retest: bool = False
    """A test that runs again, as ``<key>@<first 12 hex digits>``, on a checkpoint it reads that was trained again
    with weights unlike the recorded ones (``--accept-rebuilt``): the jobs trained from that rebuild pair with it."""

    def reads(self) -> tuple[str, ...]:
        """The jobs whose checkpoints must be on disk before this one runs."""
        return self.needs if self.checkpoints is None else self.checkpoints


# --- jobs (each runs in a worker process) ----------------------------------------------------------------------------


def _seed_args(settings: Settings, seed: int) -> list[str]:
    """``seed_everything``, and for a pretrained policy, whose initial weights a seed cannot change, the order of the
    training tasks (``data.seed``). Without it SmolLM2's seed-1 warm start was bit-identical to seed 0's: SFT from
    the same weights on the same batches draws no random number that matters. Seed 0 keeps the default order."""
    order = [] if _preset(settings.policy).seeds_weights else [f"--data.seed={seed}"]
    return [f"--seed_everything={seed}", *order]


def warm_start(settings: Settings, seed: int, unvalidated: bool = False) -> dict[str, Any]:
    """Train the warm start of ``seed`` to its validation plateau; export its best weights.

    Args:
        settings: the scope.
        seed: the seed.
        unvalidated: train it again without validating (see ``validation_chose_nothing``): the same weights, sooner.
    """
    from envace.cli.demo import fit

    root = f"{settings.root(seed)}/warm"
    weights = [f"--model.init_args.policy.init_args.seed={seed}"] if _preset(settings.policy).seeds_weights else []
    world = world_stage(settings, seed) if settings.world_steps else None
    start = [f"--model.init_args.policy.init_args.name_or_path={world.export_dir}"] if world else settings.base()
    quiet = ["--trainer.limit_val_batches=0", "--model.init_args.export_best=null"] if unvalidated else []
    stage = fit(settings.sft_config, f"{root}/policy", root, [
        *_seed_args(settings, seed), *weights, *settings.on_domain(settings.sft_config), *settings.demo_args("sft"),
        *start, f"--trainer.max_steps={settings.sft_max_steps}", *settings.extra_sft, *settings.extra_warm, *quiet,
    ])
    validations = _validations(root)
    result = {"seconds": stage.seconds, "steps": stage.steps, "policy": stage.export_dir,
              "weights_sha256": weights_digest(stage.export_dir),
              "val_success_best": max(validations.values(), default=float("nan")), "val_steps": sorted(validations),
              **_prefixed(stage.metrics, "val/")}
    if world:
        result.update(world_seconds=world.seconds, world_steps=world.steps, seconds=stage.seconds + world.seconds)
    return result


def validation_chose_nothing(recorded: dict[str, Any]) -> bool:
    """Whether a recorded warm start validated once, after its last step: then its exported weights are its last
    ones, and validation (many generations) is skipped when it is trained again. Validating earlier could change
    the exported step or, by drawing random numbers, later training. The weights' SHA-256 checks the claim."""
    return recorded.get("val_steps") == [recorded.get("steps")]


def world_stage(settings: Settings, seed: int) -> Any:
    """The warm start's first stage: the rehearse role alone learns the world from the recorded tool responses of
    the SFT config's demonstrations (``act_weight=0``), ``world_steps`` steps, no validation; its ``StageResult``."""
    from envace.cli.demo import fit

    root = f"{settings.root(seed)}/world"
    return fit(settings.sft_config, f"{root}/policy", root, [
        *_seed_args(settings, seed), *settings.on_domain(settings.sft_config), *settings.base(),
        "--model.init_args.act_weight=0", f"--trainer.max_steps={settings.world_steps}",
        "--trainer.limit_val_batches=0", "--model.init_args.export_best=null", *settings.extra_sft,
    ])


def weights_digest(policy: str) -> str:
    """SHA-256 of an exported policy's weight files (``*.safetensors``, in name order): the fingerprint that tells
    whether a checkpoint trained again from its seed is the one recorded."""
    import hashlib

    digest = hashlib.sha256()
    files = sorted(Path(policy).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{policy}: no *.safetensors weights to fingerprint")
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def rl_arm(settings: Settings, seed: int, arm: str) -> dict[str, Any]:
    """Train arm ``arm`` of ``seed`` from its warm start: a, b or c, or a lever (a variant of a) by its arm key."""
    from envace.cli.demo import fit

    lever = dict(settings.levers).get(arm.removeprefix(LEVER_PREFIX)) if arm.startswith(LEVER_PREFIX) else None
    world = WORLDS["a"] if lever is not None else WORLDS[arm]
    root, spec = f"{settings.root(seed)}/{arm}", _world_spec(settings.rl_config, world)
    stage = fit(settings.rl_config, f"{root}/policy", root, [
        *_seed_args(settings, seed), f"--model.policy.init_args.name_or_path={settings.root(seed)}/warm/policy",
        *settings.on_domain(settings.rl_config), f"--model.world={json.dumps(spec)}",
        f"--trainer.max_steps={settings.rl_steps}",
        "--trainer.limit_val_batches=0", *_curve_args(settings), *settings.demo_args("rl"), *settings.extra_rl,
        *(lever or ()),
    ])
    result = {"seconds": stage.seconds, "policy": stage.export_dir, "weights_sha256": weights_digest(stage.export_dir),
              "real_calls": stage.metrics.get("train/real_calls_total", float("nan")),
              "world": spec}
    logged = _scalars(root, ("train/rollout_time_s", "train/update_time_s", "val/fidelity_exact_match",
                             "val/imagined_success", "val/success_act"))
    if logged.get("train/rollout_time_s"):  # training alone, without the curve's validations: arm (e)'s budget
        result["train_seconds"] = sum(logged["train/rollout_time_s"].values()) + sum(
            logged.get("train/update_time_s", {}).values())
    if settings.curve_every:
        result["curve"] = {name.removeprefix("val/"): sorted(values.items()) for name, values in logged.items()
                           if name.startswith("val/")}
    return result


def _world_spec(config: str, world: str) -> dict[str, Any]:
    """The ``--model.world`` of an RL arm (``class_path`` and ``init_args``): ``world`` with the rehearse prompt
    settings of ``config``'s world (a ``RehearseWorld``), so that every arm's policy rehearses in the format its warm
    start learned (``think``: its alignment rows, fidelity probes and imagined episodes), and a frozen simulator
    answers in it too. Real tools carry the settings for the policy's rehearse role (``RealWorld.rehearse``)."""
    settings = _rehearse_settings(config)
    init = {"rehearse": {"class_path": WORLDS["a"], "init_args": settings}} if world == WORLDS["b"] else settings
    return {"class_path": world, "init_args": init}


def _rehearse_settings(config: str) -> dict[str, Any]:
    """The ``init_args`` of ``config``'s training world.

    Raises:
        ValueError: the config's ``model.world`` is not an ``envace.worlds.RehearseWorld``.
    """
    import yaml

    model = yaml.safe_load(Path(config).read_text())["model"]
    world = model.get("init_args", model).get("world")
    spec = {"class_path": world} if isinstance(world, str) else dict(world or {})
    if spec.get("class_path") != WORLDS["a"]:
        raise ValueError(f"{config}: model.world is {spec.get('class_path')!r}; the study's RL config must train in "
                         f"{WORLDS['a']}, whose prompt settings every arm shares")
    return dict(spec.get("init_args") or {})


def _curve_args(settings: Settings) -> list[str]:
    """Validation every ``curve_every`` steps on ``curve_tasks`` validation tasks: the curves of rehearsal fidelity,
    imagined and real success during RL (none when ``curve_every`` is 0)."""
    if not settings.curve_every:
        return []
    return ["--trainer.limit_val_batches=1", f"--trainer.val_check_interval={settings.curve_every}",
            f"--data.val_tasks=builtin:{settings.domain}-val:{settings.curve_tasks}",
            f"--data.eval_batch_size={settings.curve_tasks}"]


def _scalars(root: str, tags: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the TensorBoard scalars logged under ``root`` (tags never logged are absent)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, dict[int, float]] = {}
    for events in sorted(Path(root).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in set(tags) & set(acc.Tags()["scalars"]):
            found.setdefault(tag, {}).update({e.step: float(e.value) for e in acc.Scalars(tag)})
    return found


def sft_continued(settings: Settings, seed: int, seconds: float) -> dict[str, Any]:
    """Arm (e): SFT from the warm start on the same demonstrations for ``seconds`` of wall-clock time."""
    from envace.cli.demo import fit

    root = f"{settings.root(seed)}/e"
    hours, rest = divmod(int(round(seconds)), 3600)
    stage = fit(settings.sft_config, f"{root}/policy", root, [
        *_seed_args(settings, seed), *settings.on_domain(settings.sft_config), *settings.demo_args("sft"),
        "--model.init_args.policy=envace.policy.HFPolicy",
        f"--model.init_args.policy.init_args.name_or_path={settings.root(seed)}/warm/policy",
        "--trainer.callbacks=[]", "--model.init_args.export_best=null", "--trainer.max_steps=-1",
        "--trainer.limit_val_batches=0",
        f"--trainer.max_time=00:{hours:02d}:{rest // 60:02d}:{rest % 60:02d}", *settings.extra_sft,
    ])
    return {"seconds": stage.seconds, "policy": stage.export_dir, "real_calls": 0.0}


def evaluate(settings: Settings, seed: int, arm: str, policy: str) -> dict[str, Any]:
    """Real-environment test of one checkpoint on every split."""
    from envace.cli.demo import evaluate as test

    splits = {k: v if settings.eval_tasks is None else f"{v}:{settings.eval_tasks}"
              for k, v in settings.splits().items()}
    overrides = [*_except_test_tasks(settings.on_domain(settings.rl_config)),
                 f"--model.init_args.test_group_by={GROUP}", *settings.extra_eval]
    return {split: test(settings.rl_config, policy, tasks, f"{settings.root(seed)}/eval", overrides)
            for split, tasks in splits.items()}


GROUP = "template"
"""The task metadata key an evaluation also reports success by (``success_act/template=NAME``): the built-in
domains' task templates, which need from one to four calls."""


def _except_test_tasks(overrides: list[str]) -> list[str]:
    """A domain's overrides without its test set: an evaluation names the split it tests."""
    return [o for o in overrides if not o.startswith("--data.test_tasks=")]


REHEARSED_ARMS = {"a": "envace", "d": "base"}
"""The arms whose policies rehearse privately at test time: EnvACE's and its warm start."""


def rehearse_at_test(settings: Settings, seed: int, arm: str, policy: str) -> dict[str, Any]:
    """Test-time private rehearsal of one checkpoint on the domain's test split: every budget, parallel and
    sequential (``callbacks.rehearsal_budget.RehearsalBudgetAblation`` in ``envace test``); its record."""
    from envace.cli.lightning import cli_main

    root = f"{settings.root(seed)}/rehearsal/{arm}"
    limit = settings.eval_tasks if settings.rehearsal_tasks is None else settings.rehearsal_tasks
    callback = {"class_path": "callbacks.rehearsal_budget.RehearsalBudgetAblation",
                "init_args": {"tasks": settings.splits()["test"], "limit": limit,
                              "budgets": list(settings.rehearsal_budgets), "modes": ["parallel", "sequential"],
                              "seed": seed, "selector": {"class_path": settings.rehearsal_selector},
                              "batch_size": 16, "output_dir": root}}
    cli = cli_main([
        "test", "--config", settings.rl_config, "--model.init_args.policy=envace.policy.HFPolicy",
        f"--model.init_args.policy.init_args.name_or_path={policy}", *settings.on_domain(settings.rl_config),
        f"--data.test_tasks={settings.splits()['test']}:1", "--trainer.limit_test_batches=1",
        "--trainer.logger=false", f"--trainer.default_root_dir={root}", f"--seed_everything={seed}",
        "--model.init_args.eval_imagined=false", "--model.init_args.eval_fidelity=false",
        f"--trainer.callbacks={json.dumps([callback])}", *settings.extra_eval,
    ])
    (ablation,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "RehearsalBudgetAblation"]
    return ablation.history[-1]


def _prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith(prefix)}


def _validations(root: str) -> dict[int, float]:
    """``{optimiser step: val/success_act}`` of the warm start under ``root``. The step is one more than TensorBoard's,
    since Lightning logs a validation during fit before counting the batch whose end triggered it."""
    return {step + 1: value for step, value in _scalars(root, ("val/success_act",)).get("val/success_act", {}).items()}


def _run(job_key: str, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...], path: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.basicConfig(level=logging.WARNING)
    result = fn(*args)
    Path(path).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


# --- scheduling ------------------------------------------------------------------------------------------------------


def plan(settings: Settings, seeds: list[int]) -> list[Job]:
    """Every job of the study, with its dependencies.

    The tiny study (workers in parallel) starts every warm start first, the longest jobs, which every arm needs. A
    real-model study runs one job at a time across sessions whose checkpoints do not survive, so it keeps each seed's
    jobs together and tests each checkpoint right after it is trained: a warm start is trained again at most once a
    session, and an RL arm never.
    """
    per_seed = [_seed_jobs(settings, s) for s in seeds]  # each starts with its warm start
    if settings.tag:
        jobs = [job for seed_jobs in per_seed for job in seed_jobs]
    else:
        jobs = [seed_jobs[0] for seed_jobs in per_seed] + [job for seed_jobs in per_seed for job in seed_jobs[1:]]
    return jobs + _lever_jobs(settings, seeds)


def _seed_jobs(settings: Settings, s: int) -> list[Job]:
    """One seed's jobs: its warm start and (d)'s test, then per RL arm its training and tests, (e) after (a)."""
    k = settings.key

    def tested(arm: str, source: str) -> list[Job]:
        jobs = [Job(k(s, f"eval-{arm}"), evaluate, (settings, s, arm), (source,),
                    lambda r: (r[source]["policy"],), retest=arm == "d")]
        if settings.tag and arm in REHEARSED_ARMS:  # the real-model study also rehearses privately at test time
            jobs.append(Job(k(s, f"rehearsal-{arm}"), rehearse_at_test, (settings, s, arm), (source,),
                            lambda r: (r[source]["policy"],)))
        return jobs

    warm = k(s, "warm")
    jobs = [Job(warm, warm_start, (settings, s), again=_again_unvalidated), *tested("d", warm)]
    for arm in ("a", "b", "c"):
        jobs += [Job(k(s, arm), rl_arm, (settings, s, arm), (warm,)), *tested(arm, k(s, arm))]
        if arm == "a":  # (e) starts from the warm start, for (a)'s training time: (a)'s checkpoint is not read
            jobs += [Job(k(s, "e"), sft_continued, (settings, s), (warm, k(s, "a")),
                         lambda r: (r[k(s, "a")].get("train_seconds", r[k(s, "a")]["seconds"]),), (warm,)),
                     *tested("e", k(s, "e"))]
    return jobs


def _again_unvalidated(recorded: dict[str, Any]) -> tuple[Any, ...]:
    return (validation_chose_nothing(recorded),)


def _lever_jobs(settings: Settings, seeds: list[int]) -> list[Job]:
    """The levers' jobs, after the main arms (the study's table comes first)."""
    k = settings.key
    jobs = []
    for name, _ in settings.levers:
        arm = LEVER_PREFIX + name
        for s in seeds:
            jobs.append(Job(k(s, arm), rl_arm, (settings, s, arm), (k(s, "warm"),)))
            jobs.append(Job(k(s, f"eval-{arm}"), evaluate, (settings, s, arm), (k(s, arm),),
                            lambda r, s=s, arm=arm: (r[k(s, arm)]["policy"],)))
    return jobs


def run_all(jobs: list[Job], out: str, workers: int, record: str | None = None,
            max_jobs: int | None = None, accept_rebuilt: bool = False,
            retests: list[Job] | None = None) -> dict[str, dict[str, Any]]:
    """Run ``jobs`` respecting their dependencies, ``workers`` at a time; reuse results saved by an earlier run.

    Args:
        jobs: the plan.
        out: where each job's result is saved as ``<key>.json`` (beside its checkpoints).
        workers: jobs in parallel.
        record: a results file kept in version control: every job recorded there counts as done, and each job that
            finishes is added to it at once, with the fingerprints of the checkpoints it read (``starts_from``). A
            recorded job whose checkpoint (its ``policy``) is gone but which a pending job needs runs again from its
            seed; its recorded result is kept.
        max_jobs: start at most this many jobs (one arm at a time: ``--max-jobs 1``); None runs all.
        accept_rebuilt: a checkpoint trained again whose weights differ from the recorded ones (another CPU's
            arithmetic) is used rather than refused; the tests marked ``retest`` run again on it, as
            ``<key>@<fingerprint>``, so that the jobs trained from it pair with a test of what they started from.
        retests: where those tests are found (default: ``jobs``; a selection may have left them out).

    Returns:
        Every result known (saved, recorded, or run now); a plan cut by ``max_jobs`` leaves jobs out.

    Raises:
        RuntimeError: a checkpoint trained again differs from the recorded one and ``accept_rebuilt`` is off.
    """
    results: dict[str, dict[str, Any]] = {}
    for job in jobs:
        saved = Path(out, f"{job.key}.json")
        if saved.is_file():
            results[job.key] = json.loads(saved.read_text(encoding="utf-8"))
    recorded = read_record(record) if record else {}
    rebuilt = {key: _rebuilt_unlike(key, recorded.get(key), result, record, accept_rebuilt)
               for key, result in results.items()}  # trained again by an earlier run into this --out
    results.update({key: value for key, value in recorded.items() if key not in results})
    pending = [j for j in jobs if j.key not in results]
    needed = {n for j in pending for n in j.reads()}
    rebuild = [j for j in jobs if j.key in needed and j.key in results and not _checkpoint_present(results[j.key])]
    for job in rebuild:  # its checkpoint is gone (a fresh clone): train it again from its seed
        del results[job.key]
    again = {job.key: job.again(recorded.get(job.key) or {}) for job in rebuild}
    tests = [j for j in (jobs if retests is None else retests) if j.retest]
    pending = _retests(tests, rebuilt, results) + [j for j in jobs if j.key not in results]
    running: dict[Future, Job] = {}
    started = 0
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        while pending or running:
            room = workers - len(running) if max_jobs is None else min(workers - len(running), max_jobs - started)
            for job in [j for j in pending if all(n in results for n in j.needs)][: max(room, 0)]:
                pending.remove(job)
                args = job.args + job.extra(results) + again.get(job.key, ())
                running[pool.submit(_run, job.key, job.fn, args, str(Path(out, f"{job.key}.json")))] = job
                started += 1
                print(f"started {job.key}", flush=True)  # noqa: T201
            if not running:
                if max_jobs is not None and started >= max_jobs:
                    break
                raise RuntimeError(f"jobs whose dependencies failed: {[j.key for j in pending]}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                results[job.key] = {**future.result(), **_starts_from(job, results)}  # a failed job stops the study
                rebuilt[job.key] = _rebuilt_unlike(job.key, recorded.get(job.key), results[job.key], record,
                                                   accept_rebuilt)
                pending[:0] = _retests(tests, {job.key: rebuilt[job.key]}, results)
                if record:  # a job trained again keeps its recorded result; it adds only what the record lacks
                    add_to_record(record, job.key, {**results[job.key], **recorded.get(job.key, {})})
                print(f"finished {job.key}", flush=True)  # noqa: T201
    return results


def _rebuilt_unlike(key: str, recorded: dict[str, Any] | None, rebuilt: dict[str, Any], record: str | None,
                    accept: bool) -> str | None:
    """A checkpoint trained again from its seed should be the recorded one, bit for bit (its weights' SHA-256), or
    the arms tested from it would not share what the record says they share.

    Returns:
        The rebuild's fingerprint where it differs from the recorded one and ``accept`` holds; None where they agree
        (or either has none).

    Raises:
        RuntimeError: the fingerprints differ and ``accept`` is off, naming the job and the record.
    """
    if not recorded or "weights_sha256" not in recorded or "weights_sha256" not in rebuilt:
        return None
    if recorded["weights_sha256"] == rebuilt["weights_sha256"]:
        return None
    if accept:
        return rebuilt["weights_sha256"]
    raise RuntimeError(
        f"{key}: trained again from its seed (its checkpoint was gone), its weights differ from those {record} "
        f"records (SHA-256 {rebuilt['weights_sha256'][:12]}... against {recorded['weights_sha256'][:12]}...): "
        "the jobs still to run would not start from the checkpoint the recorded ones did. Rerun with the same "
        "OMP_NUM_THREADS, torch and CPU as the recorded run; or pass --accept-rebuilt to train them from this one, "
        "its own (d) tested again beside them; or start this scope again with a fresh --record")


def _starts_from(job: Job, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``starts_from``: the fingerprint of each checkpoint ``job`` read (where its result has one)."""
    shas = {need: results[need]["weights_sha256"] for need in job.reads()
            if "weights_sha256" in results.get(need, {})}
    return {"starts_from": shas} if shas else {}


def _retests(tests: list[Job], rebuilt: dict[str, str | None], done: dict[str, dict[str, Any]]) -> list[Job]:
    """The ``retest`` jobs to run again, each as ``<key>@<fingerprint>``, on the checkpoints trained again unlike
    the recorded ones (``rebuilt``: key to fingerprint, None where alike); those already done are left out."""
    return [replace(job, key=variant, retest=False) for job in tests for need in job.reads()
            if rebuilt.get(need) and (variant := f"{job.key}@{rebuilt[need][:12]}") not in done]


def _checkpoint_present(result: dict[str, Any]) -> bool:
    """A result without a checkpoint (an evaluation) needs none; one with a ``policy`` needs that directory."""
    policy = result.get("policy")
    return policy is None or Path(policy, "config.json").is_file()


def read_record(path: str) -> dict[str, dict[str, Any]]:
    """The results file (``{job key: result}``); an absent file is an empty record.

    Raises:
        ValueError: the file is not a JSON object of objects, naming the file.
    """
    file = Path(path)
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object mapping job keys to result objects")
    return data


def add_to_record(path: str, key: str, result: dict[str, Any]) -> None:
    """Add one job's result to the results file, written whole to a temporary file first (never half-written)."""
    data = read_record(path)
    data[key] = result
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n", encoding="utf-8")
    tmp.replace(file)


# --- report ----------------------------------------------------------------------------------------------------------


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _spread(values: list[float]) -> str:
    """``mean ± std`` of the seeds measured; one seed has no spread, so it is named, not shown as ``± 0.000``."""
    if not values:
        return "pending"
    mean, std = _stats(values)
    return f"{mean:.3f} ± {std:.3f}" if len(values) > 1 else f"{mean:.3f} (1 seed)"


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


SPLIT_SIZES = {"test": 256, "heldout": 128}
"""Tasks in each packaged split of a built-in domain (what an evaluation without ``--eval-tasks`` runs)."""


def scoped_report(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings],
                  command: str, tiny_report: str = "") -> str:
    """The real-model study's report: one table per domain, arms (a)-(e), and the SUMMARY over seeds and domains.

    Every cell is read from ``results`` (the results file); an arm not run yet shows ``pending``, and the SUMMARY
    then covers what is there (``nan`` when nothing is).
    """
    def metric(scope: Settings, arm: str, seed: int, split: str, key: str = "success_act") -> float:
        value = results.get(scope.key(seed, f"eval-{arm}"), {}).get(split, {}).get(key)
        return float("nan") if value is None else float(value)

    def known(values: list[float]) -> list[float]:
        return [v for v in values if v == v]

    def cell(values: list[float], signed: bool = False) -> str:
        have = known(values)
        if not have:
            return "pending"
        mean, std = _stats(have)
        each = " / ".join("–" if v != v else (f"{v:+.3f}" if signed else f"{v:.3f}") for v in values)
        spread = f" ± {std:.3f}" if len(have) > 1 else ""  # one seed: its value alone, the others shown as –
        return f"{mean:+.3f}{spread} ({each})" if signed else f"{mean:.3f}{spread} ({each})"

    def job(scope: Settings, arm: str, seed: int) -> dict[str, Any]:
        return results.get(scope.key(seed, {"d": "warm"}.get(arm, arm)), {})

    def pair(scope: Settings, arm: str, base: str, seed: int) -> str:
        """What ``arm`` pairs with: ``base``, or for (d) its retest on the rebuilt warm start ``arm`` started from."""
        start = job(scope, arm, seed).get("starts_from", {}).get(scope.key(seed, "warm"))
        warm = job(scope, "d", seed).get("weights_sha256")
        return f"d@{start[:12]}" if base == "d" and start and warm and start != warm else base

    def paired(scope: Settings, arm: str, base: str, split: str) -> list[float]:
        return [metric(scope, arm, s, split) - metric(scope, pair(scope, arm, base, s), s, split) for s in seeds]

    lines = [f"# Controlled study on a real language model: {scopes[0].label}", "",
             f"Produced by `{command}` (seeds {', '.join(map(str, seeds))}; {scopes[0].rl_steps} RL steps per arm). "
             "Real success: the real environment, greedy, on every test task and every held-out-template task of "
             "the domain (256 and 128) unless the command says `--eval-tasks`. Paired differences are per seed "
             "(the arms of a seed share its warm start). SE: the binomial standard error of one evaluation at that "
             "success rate. See docs/study.md for the protocol and the analysis.", ""]
    for scope in scopes:
        n = {split: scope.eval_tasks or size for split, size in SPLIT_SIZES.items()}
        lines += [f"## {scope.domain}", "",
                  "| arm | real success, test | SE | minus (d), paired | minus (b), paired | real success, held-out "
                  "| imagined success, test | fidelity EM, test | real tool calls (all seeds) | wall s / run |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for arm, title in ARMS.items():
            test = [metric(scope, arm, s, "test") for s in seeds]
            have = known(test)
            se = f"{math.sqrt(statistics.fmean(have) * (1 - statistics.fmean(have)) / n['test']):.3f}" if have else ""
            calls = [job(scope, arm, s).get("real_calls") for s in seeds]
            spent = (int(sum(c for c in calls if c is not None)) if any(c is not None for c in calls) else "pending")
            seconds = known([float(job(scope, arm, s).get("seconds", float("nan"))) for s in seeds])
            lines.append(
                f"| ({arm}) {title} | {cell(test)} | {se} | "
                f"{cell(paired(scope, arm, 'd', 'test'), True) if arm != 'd' else '–'} | "
                f"{cell(paired(scope, arm, 'b', 'test'), True) if arm != 'b' else '–'} | "
                f"{cell([metric(scope, arm, s, 'heldout') for s in seeds])} | "
                f"{cell([metric(scope, arm, s, 'test', 'imagined_success') for s in seeds])} | "
                f"{cell([metric(scope, arm, s, 'test', 'fidelity_exact_match') for s in seeds])} | "
                f"{'–' if arm == 'd' else spent} | "
                f"{f'{statistics.fmean(seconds):.0f}' if seconds else 'pending'} |")
        warm = [results.get(scope.key(s, "warm")) for s in seeds]
        lines += ["", "Warm starts (best validation success / steps / seconds): " + ", ".join(
            f"seed {s}: " + (f"{w.get('val_success_best', float('nan')):.3f} / {w.get('steps', 0):.0f} / "
                             f"{w.get('seconds', 0):.0f} s" if w else "pending") for s, w in zip(seeds, warm)) + ".",
                  ""]
        rebuilt = [(s, arm, pair(scope, arm, "d", s)) for s in seeds for arm in ARMS]
        if any(base != "d" for _, _, base in rebuilt):
            lines += ["Trained from a warm start trained again, whose weights differ from the recorded one's: "
                      + ", ".join(f"seed {s} ({arm}), paired with that rebuild's own test ({base}: "
                                  f"{metric(scope, base, s, 'test'):.3f}; the recorded (d): "
                                  f"{metric(scope, 'd', s, 'test'):.3f})" for s, arm, base in rebuilt if base != "d")
                      + ". Their differences against arms trained from the recorded warm start are not paired.", ""]
    lines += template_table(results, seeds, scopes)
    lines += rehearsal_table(results, seeds, scopes)
    lines += curve_table(results, seeds, scopes)
    lines += scale_table(results, seeds, scopes, tiny_report)
    gains = [g for scope in scopes for g in known(paired(scope, "a", "d", "test"))]
    versus_real = [g for scope in scopes for g in known(paired(scope, "a", "b", "test"))]
    arm_a = [results[scope.key(s, "a")] for scope in scopes for s in seeds if scope.key(s, "a") in results]

    def mean(values: list[float]) -> str:
        return f"{statistics.fmean(values):.3f}" if values else "nan"

    std = f"{_stats(gains)[1]:.3f}" if len(gains) > 1 else "nan"  # a spread needs two paired gains
    calls = f"{sum(float(r.get('real_calls', 0.0)) for r in arm_a):.0f}" if arm_a else "nan"  # nan: (a) not run yet
    rehearsal = {arm: rehearsal_gain(results, seeds, scopes, arm) for arm in REHEARSED_ARMS}
    lines.append(f"SUMMARY gain={mean(gains)} std={std} gain_vs_real={mean(versus_real)} "
                 f"real_calls_rl={calls} rehearsal_gain_envace={rehearsal['a']} "
                 f"rehearsal_gain_base={rehearsal['d']}")
    return "\n".join(lines)


def _rehearsal_success(results: dict[str, dict[str, Any]], scope: Settings, seed: int, arm: str, mode: str,
                       budget: int) -> float:
    rows = results.get(scope.key(seed, f"rehearsal-{arm}"), {}).get("rows", [])
    found = [r["success"] for r in rows if r["mode"] == mode and r["budget"] == budget]
    return float(found[0]) if found else float("nan")


def rehearsal_gain(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings], arm: str) -> str:
    """Best budget (> 0, either mode) minus budget 0, on means over the seeds and domains whose rehearsal of ``arm``
    is recorded (as ``gain`` covers what is recorded); ``nan`` until one is."""
    budgets = scopes[0].rehearsal_budgets
    recorded = [(scope, s) for scope in scopes for s in seeds if scope.key(s, f"rehearsal-{arm}") in results]

    def mean_at(mode: str, budget: int) -> float:
        values = [_rehearsal_success(results, scope, s, arm, mode, budget) for scope, s in recorded]
        return statistics.fmean(values) if values and all(v == v for v in values) else float("nan")

    plain = mean_at("parallel", 0)
    best = [mean_at(mode, b) for mode in ("parallel", "sequential") for b in budgets if b > 0]
    best = [b for b in best if b == b]
    return f"{max(best) - plain:.3f}" if best and plain == plain else "nan"


def rehearsal_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings]) -> list[str]:
    """Test-time private rehearsal: real success per budget and mode, for EnvACE's policy (a) and its warm start (d)."""
    budgets = scopes[0].rehearsal_budgets
    limit = scopes[0].eval_tasks if scopes[0].rehearsal_tasks is None else scopes[0].rehearsal_tasks
    tasks = "every test task" if limit is None else f"the first {limit} test tasks"
    lines = ["## Private rehearsal at test time", "",
             f"Real success on {tasks} with *budget* imagined attempts before each committed act turn "
             f"(`{scopes[0].rehearsal_selector.rsplit('.', 1)[-1]}` commits), means ± std over seeds.", "",
             "| domain | policy | mode | " + " | ".join(f"budget {b}" for b in budgets) + " |",
             "|---|---|---|" + "---|" * len(budgets)]
    for scope in scopes:
        for arm, name in REHEARSED_ARMS.items():
            for mode in ("parallel", "sequential"):
                cells = []
                for b in budgets:
                    values = [_rehearsal_success(results, scope, s, arm, mode, b) for s in seeds]
                    have = [v for v in values if v == v]
                    cells.append(_spread(have))
                lines.append(f"| {scope.domain} | {name} ({arm}) | {mode} | " + " | ".join(cells) + " |")
    return lines + [""]


def _per_domain(heading: list[str], tables: list[list[str]]) -> list[str]:
    """One section of per-domain tables under ``heading``: nothing when no domain has a table yet."""
    tables = [table for table in tables if table]
    return heading + [line for table in tables for line in table] if tables else []


def template_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings]) -> list[str]:
    """Real success per task template and arm (means over the seeds whose evaluation reported it), per domain."""
    prefix = f"success_act/{GROUP}="

    def table(scope: Settings) -> list[str]:
        evals = {arm: [results.get(scope.key(s, f"eval-{arm}"), {}) for s in seeds] for arm in ARMS}
        rows = sorted({(split, key[len(prefix):]) for per_seed in evals.values() for e in per_seed
                       for split, metrics in e.items() if isinstance(metrics, dict)
                       for key in metrics if key.startswith(prefix)}, key=lambda r: (r[0] != "test", r[1]))
        if not rows:
            return []
        lines = [f"| {scope.domain}: split | template | tasks | calls | " + " | ".join(f"({a})" for a in ARMS) + " |",
                 "|---|---|---|---|" + "---|" * len(ARMS)]
        calls = _template_calls(scope)
        for split, name in rows:
            tasks = next((e[split].get(f"tasks/{GROUP}={name}") for per_seed in evals.values() for e in per_seed
                          if f"tasks/{GROUP}={name}" in e.get(split, {})), None)
            cells = [_mean_and_seeds([e.get(split, {}).get(prefix + name) for e in evals[arm]]) for arm in ARMS]
            lines.append(f"| {split} | {name} | {'–' if tasks is None else f'{tasks:.0f}'} | "
                         f"{calls.get((split, name), '–')} | " + " | ".join(cells) + " |")
        return lines + [""]

    heading = ["## Real success by task template", "",
               "Each template is one kind of request; *calls*: how many calls its success requires. Means over the "
               "seeds whose evaluation reported templates, and each seed's value in brackets (– for a seed whose "
               "evaluation did not report them).", ""]
    return _per_domain(heading, [table(scope) for scope in scopes])


def _mean_and_seeds(values: list[float | None]) -> str:
    """The mean of the reported values; over several seeds also each seed's (``–`` where none was reported)."""
    have = [float(v) for v in values if v is not None]
    if not have:
        return "–"
    each = " / ".join("–" if v is None else f"{float(v):.3f}" for v in values)
    return f"{statistics.fmean(have):.3f}" + (f" ({each})" if len(values) > 1 else "")


def _template_calls(scope: Settings) -> dict[tuple[str, str], str]:
    """``{(split, template): required calls}`` of the domain's built-in splits (a range where they vary)."""
    from envace.builtin.task_sets import load_task_set

    found: dict[tuple[str, str], set[int]] = {}
    for split, spec in scope.splits().items():
        for task in load_task_set(spec):
            name = str(task.metadata.get(GROUP, ""))
            found.setdefault((split, name), set()).add(len(task.success.calls) if task.success else 0)
    return {k: "-".join(map(str, sorted({min(v), max(v)}))) for k, v in found.items()}


def curve_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings]) -> list[str]:
    """Rehearsal fidelity (exact match on validation tasks) during RL, per RL arm: means over seeds per step."""
    def table(scope: Settings) -> list[str]:
        curves = {arm: [results.get(scope.key(s, arm), {}).get("curve", {}).get("fidelity_exact_match", [])
                        for s in seeds] for arm in ("a", "b", "c")}
        steps = sorted({int(step) for per_seed in curves.values() for curve in per_seed for step, _ in curve})
        if not steps:
            return []
        lines = [f"| {scope.domain}: arm | " + " | ".join(f"step {t}" for t in steps) + " |",
                 "|---|" + "---|" * len(steps)]
        for arm, per_seed in curves.items():
            cells = []
            for step in steps:
                values = [v for curve in per_seed for t, v in curve if int(t) == step]
                cells.append(f"{statistics.fmean(values):.3f}" if values else "–")
            lines.append(f"| ({arm}) | " + " | ".join(cells) + " |")
        return lines + [""]

    heading = ["## Rehearsal fidelity during RL", "",
               "Exact match of the rehearsed responses to the reference calls of the validation tasks "
               "(`--curve-tasks`), teacher-forced, greedy, every `--curve-every` steps; means over seeds.", ""]
    return _per_domain(heading, [table(scope) for scope in scopes])


TINY_ROW = re.compile(r"^\| \(([a-e])\) [^|]+\| ([0-9.]+) ± ([0-9.]+) \([^|]*\| ([0-9.]+) ± ([0-9.]+) ", re.M)


def scale_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings],
                tiny_report: str) -> list[str]:
    """The tiny policy's bank study (its section of the report, as it was written) beside this policy's, arm by arm."""
    tiny = {arm: (f"{m:.3f} ± {s:.3f}", f"{hm:.3f} ± {hs:.3f}") for arm, m, s, hm, hs in
            ((a, float(m), float(s), float(hm), float(hs)) for a, m, s, hm, hs in TINY_ROW.findall(tiny_report))}
    if not tiny:
        return []
    bank = next((scope for scope in scopes if scope.domain == "bank"), None)
    lines = ["## Scale: the tiny policy beside this one (bank)", "",
             "The tiny policy's numbers are its controlled study's (the `controlled_study` section of this file); "
             "both are real success, greedy, on the bank test split and held-out templates, means ± std over seeds.",
             "", f"| arm | tiny, test | tiny, held-out | {scopes[0].label}, test | {scopes[0].label}, held-out |",
             "|---|---|---|---|---|"]
    for arm, title in ARMS.items():
        mine = []
        for split in ("test", "heldout"):
            values = [float(results.get(bank.key(s, f"eval-{arm}"), {}).get(split, {}).get("success_act", "nan"))
                      for s in seeds] if bank else []
            have = [v for v in values if v == v]
            mine.append(_spread(have))
        small = tiny.get(arm, ("–", "–"))
        lines.append(f"| ({arm}) {title} | {small[0]} | {small[1]} | {mine[0]} | {mine[1]} |")
    return lines + [""]


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


def _section(text: str, name: str) -> str:
    """The ``name`` section of a report (between its markers), or empty."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    return text[text.index(begin) + len(begin):text.index(end)] if begin in text and end in text else ""


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


def select(jobs: list[Job], patterns: list[str]) -> list[Job]:
    """The jobs whose keys match one of ``patterns`` (shell-style, ``fnmatch``), with every job they need, in plan
    order: a session that can afford one block (an arm's training and its tests) runs exactly that block.

    Raises:
        ValueError: a pattern matches no job, naming it.
    """
    keys = {job.key for job in jobs}
    for pattern in patterns:
        if not fnmatch.filter(keys, pattern):
            raise ValueError(f"--only {pattern}: matches no job of this study (its jobs are e.g. {min(keys)})")
    needs = {job.key: job.needs for job in jobs}
    chosen = {key for key in keys if any(fnmatch.fnmatchcase(key, p) for p in patterns)}
    frontier = list(chosen)
    while frontier:
        for need in needs[frontier.pop()]:
            if need not in chosen:
                chosen.add(need)
                frontier.append(need)
    return [job for job in jobs if job.key in chosen]


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
    parser.add_argument("--eval", action="append", default=[], metavar="OVERRIDE",
                        help="an extra `envace test` argument of every evaluation and test-time rehearsal (repeatable; "
                             "e.g. --eval=--model.rollout.engine=vllm)")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME:OVERRIDE",
                        help="a variant of arm (a) named NAME with an extra `envace fit` argument (repeat a NAME to "
                             "add arguments); trained from the same warm starts and reported in its own table")
    parser.add_argument("--policy", default="tiny", choices=("tiny", "smollm2"),
                        help="the policy (envace.cli.demo's presets: their SFT and RL configs)")
    parser.add_argument("--domains", nargs="+", default=["bank"], choices=("bank", "desk"))
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
    write_section(args.report, f"{SECTION}_{label}", text)
    print(text)  # noqa: T201


if __name__ == "__main__":
    main()
