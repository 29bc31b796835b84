"""Procedural generator of the built-in bank tasks and their packaged splits (``builtin:bank`` and friends).

This module owns turning templates (``envace.builtin.templates``) into tasks: it draws a hidden world (3 to 5 accounts
with balances 10..200 in steps of 10 and a fee of 0 or 5), draws the template's parameters, runs the call plan on the
real ``Bank`` through ``RealEnvironment`` (the reference trajectory's responses are real), and writes the success
specification: every call of the plan with all its arguments, in order, no extra call, and the exact answer.

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

import argparse
import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.builtin import TASK_SETS
from envace.builtin.bank import Bank
from envace.builtin.templates import (
    ACCOUNTS,
    HELD_OUT_TEMPLATES,
    OK,
    STEP,
    TEMPLATES,
    TRAIN_TEMPLATES,
    Plan,
    Redraw,
    Template,
    World,
    answer_from_responses,
)
from envace.data.tasks import task_to_record
from envace.envs.real import RealEnvironment, tool_schemas_from_class
from envace.types import EnvSpec, ExpectedAnswer, ExpectedCall, SuccessSpec, Task, ToolCall, canonical_json

logger = logging.getLogger(__name__)

BANK_CLASS_PATH = "envace.builtin.bank.Bank"
PACKAGE_DIR = Path(__file__).parent
MAX_TASKS = 100_000  # most tasks per call; also the stride between the task seeds of two seeds
FEES = (0, 0, 0, 5)  # a world's fee is drawn from these (0 in three worlds of four)
BUCKETS = 3  # train, val and test each own one hash bucket of the task space
MAX_DRAWS = 1_000  # draws per task before giving up (a bucket is hit with probability 1/3 per draw)
SYSTEM_PROMPT = (
    "You are a bank assistant. Use the tools, one call per turn. Deposit and withdraw return the new balance; after a "
    "transfer, call get_balance for each account to report. Then reply with the requested balances only, in the "
    "order asked, separated by spaces. If a call fails, stop and reply with the error and the account, e.g. "
    "'error: insufficient funds in A1' or 'error: unknown account B7'."
)
"""The act role's system prompt: how to call, when to look balances up, and the answer formats."""


@dataclass(frozen=True)
class Split:
    """A packaged split of the bank tasks.

    Attributes:
        name: split name (part of every task id: ``bank-<name>-<index>-<template>``).
        seed: generation seed (task ``i`` uses ``seed * MAX_TASKS + i``).
        size: number of tasks in the packaged file.
        templates: the templates it rotates through.
        bucket: the hash bucket of the task space it owns (None: no partition, the held-out split).
        file: the packaged file name in ``envace/builtin/``.
    """

    name: str
    seed: int
    size: int
    templates: tuple[str, ...]
    bucket: int | None
    file: str


SPLITS: dict[str, Split] = {
    "train": Split("train", 1, 160, TRAIN_TEMPLATES, 0, TASK_SETS["bank"]),
    "val": Split("val", 2, 128, TRAIN_TEMPLATES, 1, TASK_SETS["bank-val"]),
    "test": Split("test", 3, 256, TRAIN_TEMPLATES, 2, TASK_SETS["bank-test"]),
    "heldout": Split("heldout", 4, 128, HELD_OUT_TEMPLATES, None, TASK_SETS["bank-heldout"]),
}
"""The packaged splits by name."""


# --- public API ------------------------------------------------------------------------------------------------------


def generate_tasks(n: int, seed: int, templates: Sequence[str] | None = None) -> list[Task]:
    """Generate ``n`` bank tasks, rotating through ``templates``; ids are ``bank-s<seed>-<index>-<template>``.

    Args:
        n: number of tasks, 1..``MAX_TASKS``.
        seed: non-negative seed; the same arguments give the same tasks.
        templates: template names (see ``envace.builtin.templates.TEMPLATES``); default: the training templates.

    Raises:
        ValueError: ``n`` or ``seed`` out of range, or an unknown template name.
    """
    names = TRAIN_TEMPLATES if templates is None else _check_templates(templates)
    return _generate(n, seed, names, prefix=f"bank-s{seed}", bucket=None)


def generate_split(name: str, n: int | None = None) -> list[Task]:
    """Generate a split: ``train``, ``val`` or ``test`` (training templates) or ``heldout`` (held-out templates).

    Args:
        name: the split.
        n: number of tasks (default: the packaged size). A larger ``n`` extends the packaged tasks.

    Raises:
        ValueError: unknown split name, or ``n`` out of range.
    """
    if name not in SPLITS:
        raise ValueError(f"unknown split '{name}'; valid: {', '.join(SPLITS)}")
    split = SPLITS[name]
    return _generate(split.size if n is None else n, split.seed, split.templates, f"bank-{name}", split.bucket)


def template_of(task: Task) -> str:
    """The template name of a generated bank task (the last part of its id).

    Raises:
        ValueError: the id does not end with a template name.
    """
    name = task.id.rsplit("-", 1)[-1]
    if name not in TEMPLATES:
        raise ValueError(f"task id '{task.id}' does not end with a template name ({', '.join(TEMPLATES)})")
    return name


def task_key(task: Task) -> str:
    """The identity of a generated task's content: its template, world and request (not its id)."""
    assert task.environment is not None, f"task '{task.id}' has no environment"
    args = task.environment.init_args
    return _key(template_of(task), World(args["balances"], args["fee"]), task.messages[-1]["content"])


def render_tasks(tasks: list[Task]) -> str:
    """JSONL text of tasks, one record per line, without ``tools`` (the loader derives them from the environment).

    Raises:
        ValueError: a task's tools are not the bank's (they could not be derived back).
    """
    bank_tools = tuple(tool_schemas_from_class(Bank))
    lines = []
    for task in tasks:
        if task.tools != bank_tools:
            raise ValueError(f"task '{task.id}': its tools are not the bank's; render_tasks would lose them")
        record = task_to_record(task)
        del record["tools"]
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def write_split_files(out_dir: str | Path = PACKAGE_DIR) -> list[Path]:
    """Write every split's file into ``out_dir`` (default: the package); returns the paths written."""
    paths = []
    for split in SPLITS.values():
        path = Path(out_dir) / split.file
        path.write_text(render_tasks(generate_split(split.name)), encoding="utf-8")
        paths.append(path)
    return paths


# --- generation ------------------------------------------------------------------------------------------------------


def _check_templates(templates: Sequence[str]) -> tuple[str, ...]:
    if isinstance(templates, str) or not templates:
        raise ValueError(f"templates must be a non-empty list of template names, got {templates!r}")
    for name in templates:
        if name not in TEMPLATES:
            raise ValueError(f"unknown template '{name}'; valid: {', '.join(TEMPLATES)}")
    return tuple(templates)


def _check_range(n: int, seed: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TASKS:
        raise ValueError(f"n must be an integer in [1, {MAX_TASKS}], got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _generate(n: int, seed: int, templates: tuple[str, ...], prefix: str, bucket: int | None) -> list[Task]:
    """Task ``i`` uses template ``templates[i % len]`` and the random source ``seed * MAX_TASKS + i``."""
    _check_range(n, seed)
    tools = tuple(tool_schemas_from_class(Bank))
    seen: set[str] = set()
    tasks = []
    for i in range(n):
        template = TEMPLATES[templates[i % len(templates)]]
        world, plan = _draw(random.Random(seed * MAX_TASKS + i), template, bucket, seen)
        tasks.append(_make_task(f"{prefix}-{i:04d}-{template.name}", world, plan, tools))
    return tasks


def _draw(rng: random.Random, template: Template, bucket: int | None, seen: set[str]) -> tuple[World, Plan]:
    """Draw a world and the template's parameters until the task is new and falls in ``bucket``."""
    for _ in range(MAX_DRAWS):
        names = rng.sample(ACCOUNTS, rng.randint(3, 5))
        world = World({name: rng.randint(1, 20) * STEP for name in names}, rng.choice(FEES))
        try:
            plan = template.draw(rng, world)
        except Redraw:
            continue
        key = _key(template.name, world, plan.question)
        if key not in seen and (bucket is None or _bucket(key) == bucket):
            seen.add(key)
            return world, plan
    raise RuntimeError(f"template '{template.name}': no new task in bucket {bucket} after {MAX_DRAWS} draws")


def _key(template: str, world: World, question: str) -> str:
    return canonical_json({"template": template, "balances": world.balances, "fee": world.fee, "question": question})


def _bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % BUCKETS


def _make_task(task_id: str, world: World, plan: Plan, tools: tuple[dict[str, Any], ...]) -> Task:
    environment = EnvSpec(class_path=BANK_CLASS_PATH, init_args={"balances": dict(world.balances), "fee": world.fee})
    reference, calls, answer = run_reference(environment, plan)
    _check_outcome(task_id, plan, answer)
    return Task(
        id=task_id,
        messages=({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": plan.question}),
        tools=tools,
        success=SuccessSpec(
            calls=tuple(ExpectedCall(name=call.name, arguments=call.arguments) for call in calls),
            ordered=True,
            answer=ExpectedAnswer(equals=answer),
            forbid_extra_calls=True,
        ),
        reference=reference,
        world_context=world_context(world),
        environment=environment,
    )


def _check_outcome(task_id: str, plan: Plan, answer: str) -> None:
    """The real bank reached the outcome the template drew its parameters for (a generator bug otherwise)."""
    reached = answer.startswith(f"error: {plan.outcome}") if plan.outcome != OK else not answer.startswith("error")
    if not reached:
        raise RuntimeError(f"task '{task_id}': expected outcome '{plan.outcome}', the real bank gave '{answer}'")


def run_reference(environment: EnvSpec, plan: Plan) -> tuple[tuple[dict[str, Any], ...], list[ToolCall], str]:
    """Run the plan's calls on the real environment until the first error.

    Returns:
        The reference trajectory (one assistant turn per call, its real tool response, then the answer), the calls
        made, and the final answer.
    """
    env = RealEnvironment(environment)
    messages: list[dict[str, Any]] = []
    calls, contents = [], []
    for call in plan.calls():
        content, ok = env.execute(call)
        tool_call = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        messages.append({"role": "tool", "name": call.name, "content": content})
        calls.append(call)
        contents.append(content)
        if not ok:
            break
    answer = answer_from_responses(plan, contents)
    messages.append({"role": "assistant", "content": answer})
    return tuple(messages), calls, answer


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


# --- command line ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Command line: rewrite the packaged split files, or write a custom task set with ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(PACKAGE_DIR), help="where the split files go (default: package)")
    parser.add_argument("--out", help="write a custom set to this file instead of the splits")
    parser.add_argument("--n", type=int, default=64, help="custom set: number of tasks")
    parser.add_argument("--seed", type=int, default=0, help="custom set: seed")
    parser.add_argument("--templates", help="custom set: comma-separated template names (default: training ones)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.out is None:
        for path in write_split_files(args.out_dir):
            logger.info("wrote %s", path)
        return
    templates = None if args.templates is None else args.templates.split(",")
    try:
        tasks = generate_tasks(args.n, args.seed, templates)
    except ValueError as exc:
        parser.error(str(exc))
    Path(args.out).write_text(render_tasks(tasks), encoding="utf-8")
    logger.info("wrote %d tasks to %s", len(tasks), args.out)


if __name__ == "__main__":
    main()
