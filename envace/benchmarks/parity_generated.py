"""The generated parity cases: ``parity_families`` perturbations of gold answers, drawn from seeded generators.

``generated_cases`` is the fixed sample ``benchmarks/harness_check.py`` counts and the tests run: for every entry of
``parity``'s sample, ``GENERATED_PER_FAMILY`` drawn perturbations per family, from a ``random.Random`` seeded by the
entry (the same cases on every run). The tests also draw fresh ones with hypothesis through the same builders.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import Any

from envace.benchmarks import bfcl_ast, bfcl_ast_gold, bfcl_data, parity, tau2
from envace.benchmarks import parity_families as families
from envace.benchmarks.parity import Case, Turn
from envace.benchmarks.parity_families import Draw

GENERATED_PER_FAMILY = 2
"""Drawn perturbations per family, entry and benchmark (``generated_cases``)."""


def generated_multi_turn_scripts(entry: bfcl_data.BFCLEntry, draw: Draw, count: int) -> dict[str, tuple[str, ...]]:
    """``count`` drawn perturbations per family of the entry's first turn with calls (``gen_<family>_<n>``).

    Every turn is then closed as in ``multi_turn_scripts``, and the script padded with closing messages.
    """
    gold = parity._gold_turns(entry)
    first = parity._first_with_calls(gold)
    if first is None:
        return {}
    base: list[Turn] = [[parity.blocks(turn)] if turn else [] for turn in gold]
    scripts = {}
    for family in families.FAMILIES:
        for n in range(count):
            turns = copy.deepcopy(base)
            turns[first] = families.perturb(family, gold[first], draw)
            scripts[f"gen_{family}_{n}"] = parity._close(turns) + ("Done.",) * len(gold)
    return scripts


def generated_multi_turn_cases(per_category: int = parity.MULTI_TURN_PER_CATEGORY,
                               count: int = GENERATED_PER_FAMILY) -> list[Case]:
    """Generated cases (``parity_families``) on the first ``per_category`` entries of every multi-turn category.

    They are drawn from a generator seeded by the entry id: the same cases on every run.
    """
    out = []
    for category in bfcl_data.MULTI_TURN:
        for entry in bfcl_data.load_multi_turn(category, limit=per_category):
            draw = seeded_draw(entry.id)
            out += [Case("bfcl_multi_turn", category, entry.id, kind, script)
                    for kind, script in generated_multi_turn_scripts(entry, draw, count).items()]
    return out


def generated_single_turn_scripts(entry: bfcl_ast.ASTEntry, draw: Draw, count: int) -> dict[str, str]:
    """``count`` drawn perturbations per family of the entry's gold calls, each one output (the steps joined).

    Irrelevance and relevance entries perturb a call of their first function.
    """
    if entry.category in bfcl_ast.IRRELEVANCE or entry.category in bfcl_ast.RELEVANCE:
        pairs = [(entry.functions[0]["name"], {})]
    else:
        pairs = [(n, a) for call in bfcl_ast_gold.gold_calls(entry) for n, a in call.items()]
    return {f"gen_{family}_{n}": "\n".join(families.perturb(family, pairs, draw))
            for family in families.FAMILIES for n in range(count)}


def generated_single_turn_cases(per_category: int = 1, count: int = 1) -> list[Case]:
    """Generated cases on the first ``per_category`` entries of every single-turn category (seeded by entry id)."""
    return [Case("bfcl_single_turn", category, entry.id, kind, (text,))
            for category in bfcl_ast.SINGLE_TURN
            for entry in bfcl_ast.load_single_turn(category, limit=per_category)
            for kind, text in generated_single_turn_scripts(entry, seeded_draw(entry.id), count).items()]


def generated_solo_scripts(task: Any, draw: Draw, count: int,
                           kinds: Sequence[str] = families.FAMILIES) -> dict[str, tuple[str, ...]]:
    """Drawn perturbations per family of one gold message of a solo script (the others as in ``gold``)."""
    actions = parity._actions(task)
    done = parity.block("done", {})
    return {f"gen_{family}_{n}": (*_one_perturbed(actions, family, draw), done, done)
            for family in kinds for n in range(count)}


def _one_perturbed(actions: list[tuple[str, dict[str, Any]]], family: str, draw: Draw) -> list[str]:
    """The gold messages (one call each), one of them, drawn, replaced by ``family``'s perturbation."""
    at = draw(range(len(actions)))
    messages = [parity.block(name, args) for name, args in actions]
    messages[at:at + 1] = families.perturb(family, [actions[at]], draw)
    return messages


def generated_user_scripts(task: Any, draw: Draw, count: int, kinds: Sequence[str] = families.FAMILIES,
                           ) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Drawn perturbations per family of one gold message of a user-mode script: ``{kind: (agent, user)}``."""
    actions = parity._actions(task, "assistant")
    acts = tuple(parity.block(n, a) for n, a in parity._actions(task, "user"))
    said = " ".join(task.evaluation_criteria.communicate_info or []) or "Done."
    user = ("Hello, I need help with my request.", *acts, parity.STOP, parity.STOP, parity.STOP)
    return {f"gen_{family}_{n}": ((*_one_perturbed(actions, family, draw), said, "Done.", "Done."), user)
            for family in kinds for n in range(count)}


def generated_tau2_cases(solo_tasks: int = parity.TAU2_SOLO_TASKS, user_tasks: int = parity.TAU2_USER_TASKS,
                         count: int = GENERATED_PER_FAMILY) -> list[Case]:
    """Generated cases on the tasks of ``tau2_cases`` (seeded by domain and task id)."""
    out = []
    for task in parity._solo_tasks()[:solo_tasks]:
        out += [Case("tau2", "telecom/solo", str(task.id), kind, outputs)
                for kind, outputs in generated_solo_scripts(task, seeded_draw(f"solo/{task.id}"), count).items()]
    for domain in tau2.DOMAINS:
        for task in parity._user_tasks(domain)[:user_tasks]:
            draw = seeded_draw(f"{domain}/{task.id}")
            out += [Case("tau2", f"{domain}/user", str(task.id), kind, outputs, user=user)
                    for kind, (outputs, user) in generated_user_scripts(task, draw, count).items()]
    return out


def seeded_draw(seed: str) -> Draw:
    """A ``Draw`` from ``random.Random(seed)``: the same choices on every run."""
    rng = random.Random(seed)
    return lambda options: rng.choice(list(options))


def generated_cases() -> list[Case]:
    """The generated perturbations (``parity_families``) of every benchmark."""
    return generated_multi_turn_cases() + generated_single_turn_cases() + generated_tau2_cases()


def all_cases() -> list[Case]:
    """Every case: the written ones (``parity.cases``), then the generated ones."""
    return parity.cases() + generated_cases()
