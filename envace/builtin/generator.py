"""Task generation shared by the built-in domains: templates drawn on hidden worlds, run on the real tools, split.

A built-in domain (``envace.builtin.make_tasks`` for the bank, ``envace.builtin.desk_tasks`` for the help desk) is a
``Domain``: its tool class, the act role's system prompt, its templates (what a task asks and how it is solved), how
a hidden world is drawn and described to the rehearse role, and how the final answer follows from the real tool
responses. This module turns a domain into tasks the same way for every domain:

- **Determinism.** Task ``i`` of ``generate_tasks(domain, n, seed)`` is drawn from its own random source seeded
  ``seed * MAX_TASKS + i``: a larger ``n`` only appends tasks, and two seeds never share a task seed.
- **Disjointness.** Train, val and test share templates, so they partition the space of tasks instead: a task's
  identity (template, world, request; ``task_key``) is hashed into ``BUCKETS`` buckets and each split keeps only the
  draws of its own. The held-out split uses templates no other split has.
- **Real references.** The plan's calls run on the real tool class through ``RealEnvironment`` up to the first
  error; the recorded responses are the reference trajectory and the answer is derived from them. A template whose
  draw does not reach the outcome it was built for (an error it should have met, or one it should not) is a
  generator bug and raises.
- **Success specification.** Every call of the plan with all its arguments, in order, no extra call, the exact
  answer.
- **Labels.** Each task's ``metadata`` is ``{"template": NAME}``: ``envace test --model.test_group_by=template``
  reports success per template.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from envace.data.task_records import task_to_record
from envace.envs.real import RealEnvironment, tool_schemas_from_class
from envace.types import EnvSpec, ExpectedAnswer, ExpectedCall, SuccessSpec, Task, ToolCall, canonical_json

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent
MAX_TASKS = 100_000  # most tasks per call; also the stride between the task seeds of two seeds
BUCKETS = 3  # train, val and test each own one hash bucket of the task space
MAX_DRAWS = 1_000  # draws per task before giving up (a bucket is hit with probability 1/3 per draw)
OK = "ok"
"""The outcome of a plan that succeeds; any other outcome is a phrase its error answer contains."""


class Plan(Protocol):
    """What a template drew: the request, the calls that solve it and the outcome it was drawn to reach."""

    question: str
    outcome: str

    def calls(self) -> list[ToolCall]:
        """Every call of the solution, in order (an error plan stops at its failing call when run)."""
        ...


class Redraw(Exception):
    """The drawn world cannot host the template's request (e.g. no ticket fits); draw another world."""


@dataclass(frozen=True)
class Template:
    """A named kind of task.

    Attributes:
        name: template name (the last part of every task id).
        held_out: used only by the held-out test split (a composition never seen in training).
        calls: number of calls of a solution (for an error template: up to and including the failing call).
        summary: one line for the docs.
        draw: draws the parameters from a random source and a world; raises ``Redraw`` when the world cannot host
            the template.
    """

    name: str
    held_out: bool
    calls: int
    summary: str
    draw: Callable[[random.Random, Any], Plan]


@dataclass(frozen=True)
class Split:
    """A packaged split of a domain's tasks.

    Attributes:
        name: split name (part of every task id: ``<domain>-<name>-<index>-<template>``).
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


def standard_splits(name: str, first_seed: int, sizes: tuple[int, int, int, int], train: tuple[str, ...],
                    held_out: tuple[str, ...]) -> dict[str, Split]:
    """A domain's four splits: train, val, test (training templates) and heldout (held-out templates).

    Train, val and test own hash buckets 0, 1 and 2; the seeds run from ``first_seed`` to ``first_seed + 3``; the
    files are ``<name>_tasks.jsonl``, ``<name>_val.jsonl``, ``<name>_test.jsonl`` and ``<name>_heldout.jsonl``.

    Args:
        name: the domain's name.
        first_seed: the train split's seed.
        sizes: the packaged sizes of train, val, test and heldout.
        train: the training templates.
        held_out: the held-out templates.
    """
    files = (f"{name}_tasks.jsonl", f"{name}_val.jsonl", f"{name}_test.jsonl", f"{name}_heldout.jsonl")
    specs = zip(("train", "val", "test", "heldout"), sizes, files, (train, train, train, held_out), (0, 1, 2, None))
    return {split: Split(split, first_seed + i, size, templates, bucket, file)
            for i, (split, size, file, templates, bucket) in enumerate(specs)}


@dataclass(frozen=True)
class Domain:
    """A built-in tool domain: everything generation needs to know about it.

    Attributes:
        name: the domain's name, the first part of every task id.
        environment: the tool class (its public typed methods are the tools).
        class_path: its import path, written into every task's environment.
        system_prompt: the act role's system prompt.
        templates: every template by name, training templates first.
        splits: the packaged splits by name (``train``, ``val``, ``test``, ``heldout``).
        world_type: the dataclass of a hidden world; a task's environment arguments are its fields.
        draw_world: draws a hidden world from a random source.
        world_context: the facts the rehearse role needs to play the world (never shown to the act role).
        answer: the final answer of a plan from the JSON text of its calls' real responses, in order, up to the
            first error.
        working: the environment's reasoning for a call, from the world and the successful calls before it: the
            state the call reads, the check it must pass, the arithmetic. It is recorded as the reference tool
            message's ``reasoning``, which a thinking rehearse role (``RehearseWorld(think=True)``) learns to write
            before the result. None records none.
        environment_spec: a world's environment (default: ``class_path`` built with the world's fields), e.g. an
            MCP server with the world as its initial state.
        tool_schemas: the tool schemas where the environment is a toolbox (an MCP server's); the task files then
            list them. None derives them from ``environment``'s methods.
        world_from_spec: a task's world from its environment (default: the world's fields are its arguments).
        success: a task's success specification from its plan, its reference calls, their answer and its world
            (default: every call with all its arguments, in order, no extra call, the exact answer).
    """

    name: str
    environment: type
    class_path: str
    system_prompt: str
    templates: Mapping[str, Template]
    splits: Mapping[str, Split]
    world_type: type
    draw_world: Callable[[random.Random], Any]
    world_context: Callable[[Any], str]
    answer: Callable[[Plan, list[str]], str]
    working: Callable[[Any, list[ToolCall], ToolCall], str] | None = None
    environment_spec: Callable[[Any], EnvSpec] | None = None
    tool_schemas: Callable[[], tuple[dict[str, Any], ...]] | None = None
    world_from_spec: Callable[[EnvSpec], Any] | None = None
    success: Callable[[Plan, list[ToolCall], str, Any], SuccessSpec] | None = None

    def tools(self) -> tuple[dict[str, Any], ...]:
        """The tool schemas: the toolbox's (``tool_schemas``), or derived from the environment class."""
        if self.tool_schemas is not None:
            return self.tool_schemas()
        return tuple(tool_schemas_from_class(self.environment))

    def spec_of(self, world: Any) -> EnvSpec:
        """The environment of a task whose hidden world is ``world``."""
        if self.environment_spec is not None:
            return self.environment_spec(world)
        return EnvSpec(class_path=self.class_path, init_args=dataclasses.asdict(world))

    def world_of(self, task: Task) -> Any:
        """The hidden world of one of this domain's tasks (from its environment)."""
        assert task.environment is not None, f"task '{task.id}' has no environment"
        if self.world_from_spec is not None:
            return self.world_from_spec(task.environment)
        return self.world_type(**task.environment.init_args)


# --- public API ------------------------------------------------------------------------------------------------------


def generate_tasks(domain: Domain, n: int, seed: int, templates: Sequence[str] | None = None) -> list[Task]:
    """Generate ``n`` tasks, rotating through ``templates``; ids are ``<domain>-s<seed>-<index>-<template>``.

    Args:
        domain: the domain.
        n: number of tasks, 1..``MAX_TASKS``.
        seed: non-negative seed; the same arguments give the same tasks.
        templates: template names; default: the domain's training templates.

    Raises:
        ValueError: ``n`` or ``seed`` out of range, or an unknown template name.
    """
    names = train_templates(domain) if templates is None else _check_templates(domain, templates)
    return _generate(domain, n, seed, names, prefix=f"{domain.name}-s{seed}", bucket=None)


def generate_split(domain: Domain, name: str, n: int | None = None) -> list[Task]:
    """Generate a split: ``train``, ``val`` or ``test`` (training templates) or ``heldout`` (held-out templates).

    Args:
        domain: the domain.
        name: the split.
        n: number of tasks (default: the packaged size). A larger ``n`` extends the packaged tasks.

    Raises:
        ValueError: unknown split name, or ``n`` out of range.
    """
    if name not in domain.splits:
        raise ValueError(f"unknown split '{name}'; valid: {', '.join(domain.splits)}")
    split = domain.splits[name]
    return _generate(domain, split.size if n is None else n, split.seed, split.templates, f"{domain.name}-{name}",
                     split.bucket)


def train_templates(domain: Domain) -> tuple[str, ...]:
    """The domain's training templates, in rotation order."""
    return tuple(name for name, t in domain.templates.items() if not t.held_out)


def held_out_templates(domain: Domain) -> tuple[str, ...]:
    """The domain's held-out templates, in rotation order."""
    return tuple(name for name, t in domain.templates.items() if t.held_out)


def template_of(domain: Domain, task: Task) -> str:
    """The template name of a generated task (the last part of its id).

    Raises:
        ValueError: the id does not end with one of the domain's template names.
    """
    name = task.id.rsplit("-", 1)[-1]
    if name not in domain.templates:
        raise ValueError(f"task id '{task.id}' does not end with a template name ({', '.join(domain.templates)})")
    return name


def task_key(domain: Domain, task: Task) -> str:
    """The identity of a generated task's content: its template, world and request (not its id)."""
    return _key(template_of(domain, task), domain.world_of(task), task.messages[-1]["content"])


def render_tasks(domain: Domain, tasks: list[Task]) -> str:
    """JSONL text of tasks, one record per line.

    Without ``tools`` where the loader derives them from the environment class; a toolbox domain's records keep them.

    Raises:
        ValueError: a task's tools are not the domain's (they could not be derived back).
    """
    tools = domain.tools()
    lines = []
    for task in tasks:
        if task.tools != tools:
            raise ValueError(f"task '{task.id}': its tools are not the {domain.name} domain's; render_tasks would "
                             "lose them")
        record = task_to_record(task)
        if domain.tool_schemas is None:
            del record["tools"]
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def write_split_files(domain: Domain, out_dir: str | Path = PACKAGE_DIR) -> list[Path]:
    """Write every split's file into ``out_dir`` (default: the package); returns the paths written."""
    paths = []
    for split in domain.splits.values():
        path = Path(out_dir) / split.file
        path.write_text(render_tasks(domain, generate_split(domain, split.name)), encoding="utf-8")
        paths.append(path)
    return paths


def run_reference(
    environment: EnvSpec, plan: Plan, answer: Callable[[Plan, list[str]], str],
    explain: Callable[[list[ToolCall], ToolCall], str] | None = None,
) -> tuple[tuple[dict[str, Any], ...], list[ToolCall], str]:
    """Run the plan's calls on the real environment until the first error.

    Args:
        environment: the task's environment.
        plan: the drawn plan.
        answer: the domain's answer from the responses (``Domain.answer``).
        explain: the environment's working for a call given the calls before it (``Domain.working`` on the task's
            world); recorded as each tool message's ``reasoning``. None records none.

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
        response = {"role": "tool", "name": call.name, "content": content}
        if explain is not None:
            response["reasoning"] = explain(list(calls), call)
        messages.append(response)
        calls.append(call)
        contents.append(content)
        if not ok:
            break
    final = answer(plan, contents)
    messages.append({"role": "assistant", "content": final})
    return tuple(messages), calls, final


# --- generation ------------------------------------------------------------------------------------------------------


def _check_templates(domain: Domain, templates: Sequence[str]) -> tuple[str, ...]:
    if isinstance(templates, str) or not templates:
        raise ValueError(f"templates must be a non-empty list of template names, got {templates!r}")
    for name in templates:
        if name not in domain.templates:
            raise ValueError(f"unknown template '{name}'; valid: {', '.join(domain.templates)}")
    return tuple(templates)


def _check_range(n: int, seed: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TASKS:
        raise ValueError(f"n must be an integer in [1, {MAX_TASKS}], got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _generate(domain: Domain, n: int, seed: int, templates: tuple[str, ...], prefix: str,
              bucket: int | None) -> list[Task]:
    """Task ``i`` uses template ``templates[i % len]`` and the random source ``seed * MAX_TASKS + i``."""
    _check_range(n, seed)
    tools = domain.tools()
    seen: set[str] = set()
    tasks = []
    for i in range(n):
        template = domain.templates[templates[i % len(templates)]]
        world, plan = _draw(domain, random.Random(seed * MAX_TASKS + i), template, bucket, seen)
        tasks.append(_make_task(domain, f"{prefix}-{i:04d}-{template.name}", template.name, world, plan, tools))
    return tasks


def _draw(domain: Domain, rng: random.Random, template: Template, bucket: int | None,
          seen: set[str]) -> tuple[Any, Plan]:
    """Draw a world and the template's parameters until the task is new and falls in ``bucket``."""
    for _ in range(MAX_DRAWS):
        world = domain.draw_world(rng)
        try:
            plan = template.draw(rng, world)
        except Redraw:
            continue
        key = _key(template.name, world, plan.question)
        if key not in seen and (bucket is None or _bucket(key) == bucket):
            seen.add(key)
            return world, plan
    raise RuntimeError(f"template '{template.name}': no new task in bucket {bucket} after {MAX_DRAWS} draws")


def _key(template: str, world: Any, question: str) -> str:
    return canonical_json({"template": template, **dataclasses.asdict(world), "question": question})


def _bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % BUCKETS


def _make_task(
    domain: Domain, task_id: str, template: str, world: Any, plan: Plan, tools: tuple[dict[str, Any], ...]
) -> Task:
    environment = domain.spec_of(world)
    explain = None if domain.working is None else functools.partial(domain.working, world)
    reference, calls, answer = run_reference(environment, plan, domain.answer, explain)
    _check_outcome(task_id, plan, answer)
    success = domain.success(plan, calls, answer, world) if domain.success is not None else SuccessSpec(
        calls=tuple(ExpectedCall(name=call.name, arguments=call.arguments) for call in calls),
        ordered=True,
        answer=ExpectedAnswer(equals=answer),
        forbid_extra_calls=True,
    )
    return Task(
        id=task_id,
        messages=({"role": "system", "content": domain.system_prompt}, {"role": "user", "content": plan.question}),
        tools=tools,
        success=success,
        reference=reference,
        world_context=domain.world_context(world),
        environment=environment,
        metadata={"template": template},  # envace test --model.init_args.test_group_by=template: success per template
    )


def _check_outcome(task_id: str, plan: Plan, answer: str) -> None:
    """The real tools reached the outcome the template drew its parameters for (a generator bug otherwise)."""
    failed = answer.startswith("error: ")
    reached = not failed if plan.outcome == OK else failed and plan.outcome in answer
    if not reached:
        raise RuntimeError(f"task '{task_id}': expected outcome '{plan.outcome}', the real tools gave '{answer}'")


# --- command line ----------------------------------------------------------------------------------------------------


def main(domain: Domain, argv: list[str] | None = None, description: str | None = None) -> None:
    """Command line: rewrite the domain's packaged split files, or write a custom task set with ``--out``."""
    parser = argparse.ArgumentParser(description=description or f"Generate the built-in {domain.name} tasks.")
    parser.add_argument("--out-dir", default=str(PACKAGE_DIR), help="where the split files go (default: package)")
    parser.add_argument("--out", help="write a custom set to this file instead of the splits")
    parser.add_argument("--n", type=int, default=64, help="custom set: number of tasks")
    parser.add_argument("--seed", type=int, default=0, help="custom set: seed")
    parser.add_argument("--templates", help="custom set: comma-separated template names (default: training ones)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.out is None:
        for path in write_split_files(domain, args.out_dir):
            logger.info("wrote %s", path)
        return
    templates = None if args.templates is None else args.templates.split(",")
    try:
        tasks = generate_tasks(domain, args.n, args.seed, templates)
    except ValueError as exc:
        parser.error(str(exc))
    Path(args.out).write_text(render_tasks(domain, tasks), encoding="utf-8")
    logger.info("wrote %d tasks to %s", len(tasks), args.out)
