"""The built-in bank tasks and their packaged splits (``builtin:bank`` and friends).

This module owns the bank domain's generation settings: how a hidden world is drawn (3 to 5 accounts with balances
10..200 in steps of 10 and a fee of 0 or 5), what the act role is told (``SYSTEM_PROMPT``) and the rehearse role
knows (``world_context``), and the four splits. ``envace.builtin.generator`` does the generation itself, the same
way for every built-in domain: each task's plan runs on the real ``Bank`` through ``RealEnvironment`` (the reference
trajectory's responses are real), and the success specification is every call of the plan with all its arguments,
in order, no extra call, and the exact answer.

Determinism: task ``i`` of ``generate_tasks(n, seed)`` is drawn from its own random source seeded with
``seed * MAX_TASKS + i``, so a larger ``n`` only appends tasks and two seeds never share a task seed. The splits
use seeds 1 (train), 2 (val), 3 (test) and 4 (heldout). Train, val and test also partition the space of tasks: a
task goes to the split whose bucket its (template, world, request) key hashes to, so no two of them can hold the same
task whatever their sizes. The held-out split uses only the held-out templates.

Usage: ``python -m envace.builtin.make_tasks`` rewrites the four packaged files;
``python -m envace.builtin.make_tasks --n 100 --seed 7 --templates balance,deposit --out my_tasks.jsonl`` writes a
custom set.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envace.builtin import generator
from envace.builtin.bank import Bank
from envace.builtin.generator import BUCKETS, MAX_DRAWS, MAX_TASKS, PACKAGE_DIR, Split, standard_splits
from envace.builtin.templates import (
    ACCOUNTS,
    HELD_OUT_TEMPLATES,
    STEP,
    TEMPLATES,
    TRAIN_TEMPLATES,
    Plan,
    World,
    answer_from_responses,
    working,
)
from envace.types import EnvSpec, Task, ToolCall

__all__ = [
    "BANK", "BANK_CLASS_PATH", "BUCKETS", "FEES", "MAX_DRAWS", "MAX_TASKS", "PACKAGE_DIR", "SPLITS", "SYSTEM_PROMPT",
    "Split", "generate_split", "generate_tasks", "main", "render_tasks", "run_reference", "task_key", "template_of",
    "world_context", "write_split_files",
]  # fmt: skip

BANK_CLASS_PATH = "envace.builtin.bank.Bank"
FEES = (0, 0, 0, 5)  # a world's fee is drawn from these (0 in three worlds of four)
SYSTEM_PROMPT = (
    "You are a bank assistant. Use the tools, one call per turn. Deposit and withdraw return the new balance; after a "
    "transfer, call get_balance for each account to report. Then reply with the requested balances only, in the "
    "order asked, separated by spaces. If a call fails, stop and reply with the error and the account, e.g. "
    "'error: insufficient funds in A1' or 'error: unknown account B7'."
)
"""The act role's system prompt: how to call, when to look balances up, and the answer formats."""

SPLITS: dict[str, Split] = standard_splits("bank", 1, (160, 128, 256, 128), TRAIN_TEMPLATES, HELD_OUT_TEMPLATES)
"""The packaged splits by name."""


def draw_world(rng: random.Random) -> World:
    """A hidden world: 3 to 5 accounts, balances 10..200 in steps of 10, a fee of 0 (three in four) or 5."""
    names = rng.sample(ACCOUNTS, rng.randint(3, 5))
    return World({name: rng.randint(1, 20) * STEP for name in names}, rng.choice(FEES))


def world_context(world: World) -> str:
    """The facts the rehearse role needs to play the bank (never shown to the act role)."""
    accounts = ", ".join(f"{name}: {balance}" for name, balance in world.balances.items())
    return (
        f"Bank accounts and balances: {accounts}. Any other account id is unknown. "
        f"Fee per withdrawal or transfer: {world.fee}, charged to the source account on top of the amount "
        "(deposits are free). A failed call changes nothing and returns "
        '{"error": "ValueError: unknown account \'<id>\'"} or '
        '{"error": "ValueError: insufficient funds in \'<id>\': balance <balance>, requested <amount + fee>"}.'
    )


BANK = generator.Domain(
    name="bank",
    environment=Bank,
    class_path=BANK_CLASS_PATH,
    system_prompt=SYSTEM_PROMPT,
    templates=TEMPLATES,
    splits=SPLITS,
    world_type=World,
    draw_world=draw_world,
    world_context=world_context,
    answer=answer_from_responses,
    working=working,
)
"""The bank domain, as ``envace.builtin.generator`` generates it."""


def generate_tasks(n: int, seed: int, templates: Sequence[str] | None = None) -> list[Task]:
    """Generate ``n`` bank tasks, rotating through ``templates``; ids are ``bank-s<seed>-<index>-<template>``.

    Args:
        n: number of tasks, 1..``MAX_TASKS``.
        seed: non-negative seed; the same arguments give the same tasks.
        templates: template names (see ``envace.builtin.templates.TEMPLATES``); default: the training templates.

    Raises:
        ValueError: ``n`` or ``seed`` out of range, or an unknown template name.
    """
    return generator.generate_tasks(BANK, n, seed, templates)


def generate_split(name: str, n: int | None = None) -> list[Task]:
    """Generate a split: ``train``, ``val`` or ``test`` (training templates) or ``heldout`` (held-out templates).

    Raises:
        ValueError: unknown split name, or ``n`` out of range.
    """
    return generator.generate_split(BANK, name, n)


def template_of(task: Task) -> str:
    """The template name of a generated bank task (the last part of its id).

    Raises:
        ValueError: the id does not end with a template name.
    """
    return generator.template_of(BANK, task)


def task_key(task: Task) -> str:
    """The identity of a generated task's content: its template, world and request (not its id)."""
    return generator.task_key(BANK, task)


def render_tasks(tasks: list[Task]) -> str:
    """JSONL text of tasks, one record per line, without ``tools`` (the loader derives them from the environment).

    Raises:
        ValueError: a task's tools are not the bank's (they could not be derived back).
    """
    return generator.render_tasks(BANK, tasks)


def write_split_files(out_dir: str | Path = PACKAGE_DIR) -> list[Path]:
    """Write every split's file into ``out_dir`` (default: the package); returns the paths written."""
    return generator.write_split_files(BANK, out_dir)


def run_reference(environment: EnvSpec, plan: Plan) -> tuple[tuple[dict[str, Any], ...], list[ToolCall], str]:
    """Run the plan's calls on the real bank until the first error.

    Returns:
        The reference trajectory (one assistant turn per call, its real tool response with the bank's working as
        ``reasoning``, then the answer), the calls made, and the final answer.
    """
    world = World(**environment.init_args)
    return generator.run_reference(environment, plan, answer_from_responses,
                                   lambda done, call: working(world, done, call))


def main(argv: list[str] | None = None) -> None:
    """Command line: rewrite the packaged split files, or write a custom task set with ``--out``."""
    generator.main(BANK, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
