"""The controlled study's jobs: what each one trains or tests, for one seed, in a worker process.

The warm start (after its optional world stage), the RL arms and their levers, SFT continued (arm (e)), the test of a
checkpoint in the real environment, test-time private rehearsal, and the fingerprint of exported weights that tells
whether a checkpoint trained again is the recorded one. Each returns the result that ``study_plan.run_all`` saves and
records; ``study_plan.plan`` lists them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from study_settings import GROUP, LEVER_PREFIX, WORLDS, Settings, _preset


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


def _except_test_tasks(overrides: list[str]) -> list[str]:
    """A domain's overrides without its test set: an evaluation names the split it tests."""
    return [o for o in overrides if not o.startswith("--data.test_tasks=")]


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
                              "greedy_first": _needs_greedy(settings.rehearsal_selector),
                              "write_episodes": True,  # what rehearsal changed, task by task (rehearsal_anatomy.py)
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


def _needs_greedy(class_path: str) -> bool:
    """Whether the selector at ``class_path`` needs each rehearsal's first attempt greedy (``GuardedCommit``)."""
    import importlib

    module, _, name = class_path.rpartition(".")
    return bool(getattr(getattr(importlib.import_module(module), name), "needs_greedy", False))


def _prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith(prefix)}


def _validations(root: str) -> dict[int, float]:
    """``{optimiser step: val/success_act}`` of the warm start under ``root``. The step is one more than TensorBoard's,
    since Lightning logs a validation during fit before counting the batch whose end triggered it."""
    return {step + 1: value for step, value in _scalars(root, ("val/success_act",)).get("val/success_act", {}).items()}
