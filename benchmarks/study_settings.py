"""The controlled study's design: its configs, arms and worlds, its levers, and the ``Settings`` of one scope.

A scope is one policy on one domain: where its seeds' runs go, its job keys, its configs and the overrides its stages
share. ``benchmarks/controlled_study.py`` is the command line; ``study_plan`` lists and runs the jobs,
``study_jobs`` holds what each job does and ``study_report`` writes the tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
LEVER_PREFIX = "L-"
"""Arm key of a lever (``L-<name>``): a variant of arm (a) with extra overrides."""

GROUP = "template"
"""The task metadata key an evaluation also reports success by (``success_act/template=NAME``): the built-in
domains' task templates, which need from one to four calls."""
REHEARSED_ARMS = {"a": "envace", "d": "base"}
"""The arms whose policies rehearse privately at test time: EnvACE's and its warm start."""


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

