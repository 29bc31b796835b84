"""Parity with the official runners: scripted outputs scored by envace's harnesses and by the benchmarks' own code.

Each ``Case`` is one scripted policy on one benchmark entry: the act outputs it writes (and, for tau^2's user mode,
what its user says). ``run_case`` plays it through envace's harness (the rollout under the benchmark's loop rules,
then envace's scoring) and through the official code (``envace.benchmarks.official``: bfcl-eval's ``evaluate_task``
with its decoder on envace's episodes written as an official result file; tau^2's ``run_task``, its agent and user
answering from the same script), and reports both verdicts. ``cases`` builds, for a sample of entries of
every category envace scores, the gold answer and perturbations of each kind the official loops treat specially:
wrong values, missing, extra and reordered calls, over-long turns and step limits, excluded and held-back functions,
output the official decoder reads differently, plain-text endings, tool errors.

``benchmarks/harness_check.py`` prints the agreement; ``tests/integration/test_parity_bfcl.py`` and
``test_parity_tau2.py`` require it to be total.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envace.benchmarks import (
    bfcl,
    bfcl_ast,
    bfcl_ast_gold,
    bfcl_data,
    bfcl_env,
    tau2,
    tau2_eval,
    tau2_rules,
    tau2_tasks,
    tau2_world,
)
from envace.benchmarks.bfcl_loop import split_response

MULTI_TURN_PER_CATEGORY = 2
SINGLE_TURN_PER_CATEGORY = 2
TAU2_SOLO_TASKS = 4
TAU2_USER_TASKS = 2


@dataclass(frozen=True)
class Case:
    """One scripted policy on one entry.

    Attributes:
        benchmark: ``bfcl_multi_turn``, ``bfcl_single_turn`` or ``tau2``.
        category: the BFCL category, or ``<domain>/<solo|user>`` for tau^2.
        entry_id: the entry or task id.
        kind: what the script does (``gold``, ``wrong_value``, ``over_long_turn``, ...).
        outputs: the act role's outputs, in order (one for a single-turn entry).
        user: tau^2 user mode: what the user says, in order (``###STOP###`` ends the conversation).
        limits: tau^2 only: ``(max_steps, max_errors)``.
    """

    benchmark: str
    category: str
    entry_id: str
    kind: str
    outputs: tuple[str, ...]
    user: tuple[str, ...] = ()
    limits: tuple[int, int] = (tau2_rules.MAX_STEPS, tau2_rules.MAX_ERRORS)

    @property
    def name(self) -> str:
        """``<category>/<entry id>/<kind>``."""
        return f"{self.category}/{self.entry_id}/{self.kind}"


@dataclass
class Verdict:
    """Both verdicts on a case: pass/fail (BFCL) or reward (tau^2), with what each side said."""

    case: Case
    envace: float
    official: float
    envace_detail: str = ""
    official_detail: str = ""
    notes: list[str] = field(default_factory=list)
    official_crash: str = ""
    """Why the official runner itself reports no verdict (its verdict is then the one its checkers computed)."""

    @property
    def agree(self) -> bool:
        """The verdicts are equal (and so are the termination reasons, for tau^2)."""
        return self.envace == self.official and (self.case.benchmark != "tau2"
                                                 or self.envace_detail == self.official_detail)

    def describe(self) -> str:
        """``<case>: envace <verdict> (<detail>), official <verdict> (<detail>)``."""
        crash = f"; the official runner crashes: {self.official_crash}" if self.official_crash else ""
        return (f"{self.case.name}: envace {self.envace} ({self.envace_detail}), official {self.official} "
                f"({self.official_detail}){crash}")


def block(name: Any, arguments: Any) -> str:
    """One ``<tool_call>`` block as envace's templates write it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def blocks(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Several calls in one act turn."""
    return "\n".join(block(name, args) for name, args in calls)


# ---------------------------------------------------------------------------------------------------------------------
# BFCL multi-turn
# ---------------------------------------------------------------------------------------------------------------------

Step = str
Turn = list[Step]


def _gold_turns(entry: bfcl_data.BFCLEntry) -> list[list[tuple[str, dict[str, Any]]]]:
    env = bfcl_env.BFCLEnvironment(entry)
    return [[(c.name, bfcl_env.bind_arguments(env, c)) for text in turn for c in bfcl_env.parse_calls(text)]
            for turn in entry.ground_truth]


def _close(turns: list[Turn]) -> tuple[str, ...]:
    """Every turn's steps, each turn closed by a plain-text step."""
    return tuple(step for turn in turns for step in [*turn, "Done."])


def _dummy_arguments(entry: bfcl_data.BFCLEntry, name: str,
                     gold: list[list[tuple[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Arguments for ``name``: what the entry's gold calls give parameters of the same name, else a value by type."""
    known = {k: v for turn in gold for _, args in turn for k, v in args.items()}
    doc = bfcl_data._function_docs().get(name, {"parameters": {"properties": {}, "required": []}})
    by_type = {"string": "envace", "integer": 1, "float": 1.0, "number": 1.0, "boolean": True, "array": [], "dict": {}}
    properties = doc["parameters"].get("properties", {})
    return {p: known.get(p, by_type.get(properties[p].get("type", "string"), "envace"))
            for p in doc["parameters"].get("required", []) if p in properties}


def _first_with_calls(gold: list[list[tuple[str, dict[str, Any]]]], least: int = 1) -> int | None:
    return next((i for i, turn in enumerate(gold) if len(turn) >= least), None)


def _changed(value: Any) -> Any:
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    return value


def multi_turn_scripts(entry: bfcl_data.BFCLEntry) -> dict[str, tuple[str, ...]]:
    """The gold answer and every perturbation that applies to the entry, as act outputs."""
    gold = _gold_turns(entry)
    base: list[Turn] = [[blocks(turn)] if turn else [] for turn in gold]
    scripts = {"gold": _close(base),
               "one_call_per_step": _close([[block(n, a) for n, a in turn] for turn in gold])}
    first = _first_with_calls(gold)
    if first is None:
        return scripts

    def edit(turn_index: int, steps: Turn) -> tuple[str, ...]:
        turns = copy.deepcopy(base)
        turns[turn_index] = steps
        return _close(turns)

    calls = gold[first]
    name, args = calls[0]
    if args:
        key = next(iter(args))
        scripts["wrong_value"] = edit(first, [blocks([(name, {**args, key: _changed(args[key])}), *calls[1:]])])
    last = max(i for i, turn in enumerate(gold) if turn)
    scripts["missing_call"] = edit(last, [blocks(gold[last][:-1])] if len(gold[last]) > 1 else [])
    scripts["extra_call"] = edit(first, [blocks(calls), block(name, args)])
    several = _first_with_calls(gold, 2)
    if several is not None:
        scripts["order"] = edit(several, [blocks(gold[several][::-1])])
    scripts["twenty_steps"] = edit(first, [blocks(calls)] + [block(name, args)] * 19)
    scripts["over_long_turn"] = edit(first, [blocks(calls)] + [block(name, args)] * 20)
    scripts["over_long_last_turn"] = edit(last, [blocks(gold[last])] + [block(*gold[last][0])] * 20)
    excluded = entry.raw.get("excluded_function") or []
    if excluded:
        scripts["excluded_function"] = edit(first, [blocks(calls), block(excluded[0],
                                                                         _dummy_arguments(entry, excluded[0], gold))])
    missed = entry.raw.get("missed_function") or {}
    if missed:
        held = next(iter(missed.values()))[0]
        scripts["held_back_function"] = edit(0, [block(held, _dummy_arguments(entry, held, gold)), *base[0]])
    compact = "\n".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)
    scripts["off_format_no_newlines"] = edit(first, [compact])
    listed = "<tool_call>\n" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "\n</tool_call>"
    scripts["off_format_json_list"] = edit(first, [listed])
    scripts["off_format_valid_then_malformed"] = edit(first, [blocks(calls) + "\n<tool_call>\n{not json\n</tool_call>"])
    scripts["off_format_no_arguments"] = edit(first, ["<tool_call>\n" + json.dumps({"name": name}) + "\n</tool_call>"])
    as_strings = "\n".join(block(n, json.dumps(a)) for n, a in calls)
    scripts["arguments_as_json_string"] = edit(first, [as_strings])
    scripts["reasoning_before_calls"] = edit(first, ["<think>\n" + block("ls", {}) + "\n</think>\n\n" + blocks(calls)])
    scripts["plain_text_ending"] = edit(first, [])
    scripts["unknown_function"] = edit(first, [blocks(calls), block("envace_not_a_function", {"x": 1})])
    scripts["unsafe_argument_name"] = edit(first, [blocks(calls), block(name, {"x=1)#": "y"})])
    return scripts


def multi_turn_cases(per_category: int = MULTI_TURN_PER_CATEGORY) -> list[Case]:
    """Cases for the first ``per_category`` entries of every multi-turn category that have each feature."""
    out = []
    for category in bfcl_data.MULTI_TURN:
        for entry in bfcl_data.load_multi_turn(category, limit=per_category):
            out += [Case("bfcl_multi_turn", category, entry.id, kind, script)
                    for kind, script in multi_turn_scripts(entry).items()]
    return out


def _envace_multi_turn(case: Case, tokenizer: Any) -> tuple[bool, str, dict[str, Any]]:
    from envace.benchmarks.scripted import ScriptedPolicy

    (entry,) = bfcl_data.load_multi_turn(case.category, ids=[case.entry_id])
    result = bfcl.evaluate_multi_turn([entry], ScriptedPolicy(tokenizer, list(case.outputs)), tokenizer)
    return result["valid"][entry.id], result["errors"].get(entry.id, ""), result["results"][0]


# ---------------------------------------------------------------------------------------------------------------------
# BFCL single-turn
# ---------------------------------------------------------------------------------------------------------------------


def single_turn_scripts(entry: bfcl_ast.ASTEntry) -> dict[str, str]:
    """The gold output and perturbations (wrong value, missing call, off-format outputs, plain text)."""
    gold = bfcl_ast_gold.gold_output(entry)
    calls = [] if entry.category in bfcl_ast.IRRELEVANCE else (
        [{entry.functions[0]["name"]: {}}] if entry.category in bfcl_ast.RELEVANCE else bfcl_ast_gold.gold_calls(entry))
    pairs = [(n, a) for call in calls for n, a in call.items()]
    scripts = {"gold": gold, "plain_text": "I cannot help with that."}
    if not pairs:
        scripts["a_call"] = block(entry.functions[0]["name"], {})
        return scripts
    name, args = pairs[0]
    if args:
        key = next(iter(args))
        scripts["wrong_value"] = blocks([(name, {**args, key: _changed(args[key])}), *pairs[1:]])
    scripts["missing_call"] = blocks(pairs[:-1]) if len(pairs) > 1 else ""
    scripts["extra_call"] = blocks([*pairs, pairs[0]])
    scripts["off_format_no_newlines"] = "".join(
        f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in pairs)
    scripts["off_format_json_list"] = "<tool_call>\n" + json.dumps(
        [{"name": n, "arguments": a} for n, a in pairs]) + "\n</tool_call>"
    scripts["off_format_valid_then_malformed"] = blocks(pairs) + "\n<tool_call>\n{not json\n</tool_call>"
    scripts["arguments_as_json_string"] = "\n".join(block(n, json.dumps(a)) for n, a in pairs)
    scripts["reasoning_before_calls"] = "<think>\nLet me see.\n</think>\n\n" + blocks(pairs)
    return scripts


def single_turn_cases(per_category: int = SINGLE_TURN_PER_CATEGORY) -> list[Case]:
    """Cases for the first ``per_category`` entries of every single-turn category."""
    return [Case("bfcl_single_turn", category, entry.id, kind, (text,))
            for category in bfcl_ast.SINGLE_TURN
            for entry in bfcl_ast.load_single_turn(category, limit=per_category)
            for kind, text in single_turn_scripts(entry).items()]


def _envace_single_turn(case: Case, tokenizer: Any) -> tuple[bool, str, dict[str, Any]]:
    (entry,) = bfcl_ast.load_single_turn(case.category, ids=[case.entry_id])
    engine = bfcl_ast_gold.GoldASTEngine([entry], tokenizer, outputs={entry.id: case.outputs[0]})
    result = bfcl_ast.evaluate_single_turn([entry], engine, tokenizer)
    response = split_response(result["outputs"][entry.id])[1]  # what BFCL's inference saves: no reasoning
    return result["valid"][entry.id], result["errors"].get(entry.id, ""), {"id": entry.id, "result": response}


# ---------------------------------------------------------------------------------------------------------------------
# tau^2
# ---------------------------------------------------------------------------------------------------------------------

STOP = tau2_tasks.STOP_TOKEN


def _actions(task: Any, requestor: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [(a.name, dict(a.arguments)) for a in task.evaluation_criteria.actions or []
            if requestor is None or a.requestor == requestor]


def solo_scripts(task: Any) -> dict[str, tuple[tuple[str, ...], tuple[int, int]]]:
    """Solo-mode scripts: ``{kind: (act outputs, (max_steps, max_errors))}``."""
    actions = _actions(task)
    calls = [block(n, a) for n, a in actions]
    done = block("done", {})
    default = (tau2_rules.MAX_STEPS, tau2_rules.MAX_ERRORS)
    scripts = {
        "gold": ((*calls, done), default),
        "plain_text_ending": ((*calls, "I have fixed the issue."), default),
        "stop_token_in_text": ((*calls, f"Finished. {STOP}"), default),
        "missing_action": ((*calls[:-1], done), default),
        "done_with_another_call": ((*calls[:-1], blocks([actions[-1], ("done", {})])), default),
        "text_first": (("Let me look at the ticket.", *calls, done), default),
        "too_many_errors": ((*[block("envace_not_a_tool", {})] * 10, *calls, done), default),
        "unknown_arguments": ((block(actions[0][0], {"envace": 1}), *calls, done), default),
        "step_limit": ((*calls, *calls, done), (2 * len(calls) + 1, tau2_rules.MAX_ERRORS)),
        "stop_on_the_limit_step": ((*calls, done), (2 * len(calls), tau2_rules.MAX_ERRORS)),
        "error_limit": ((*[block("envace_not_a_tool", {})] * 3, *calls, done), (tau2_rules.MAX_STEPS, 3)),
    }
    return scripts


def user_scripts(task: Any) -> dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[int, int]]]:
    """User-mode scripts: ``{kind: (act outputs, user lines, (max_steps, max_errors))}``.

    The user's own gold actions (telecom's phone) are its tool calls, one per message, before it stops.
    """
    actions = _actions(task, "assistant")
    calls = [block(n, a) for n, a in actions]
    acts = tuple(block(n, a) for n, a in _actions(task, "user"))
    said = " ".join(task.evaluation_criteria.communicate_info or []) or "Done."
    default = (tau2_rules.MAX_STEPS, tau2_rules.MAX_ERRORS)
    opening = "Hello, I need help with my request."
    extra_steps = 2 * len(acts)
    return {
        "gold": ((*calls, said), (opening, *acts, STOP), default),
        "agent_writes_stop_token": ((*calls, STOP, said), (opening, "Anything else?", *acts, STOP), default),
        "missing_action": ((*calls[:-1], said), (opening, *acts, STOP), default),
        "user_never_stops": ((*calls, said, "Sure.", "Sure."), (opening, "More?", "More?", *acts, STOP),
                             (2 * len(calls) + 4 + extra_steps, tau2_rules.MAX_ERRORS)),
        "unknown_tool": ((block("envace_not_a_tool", {}), *calls, said), (opening, *acts, STOP), default),
    }


def tau2_cases(solo_tasks: int = TAU2_SOLO_TASKS, user_tasks: int = TAU2_USER_TASKS) -> list[Case]:
    """Solo cases on telecom's first base tasks with gold actions; user-mode cases on every domain's first ones."""
    out = []
    for task in _solo_tasks()[:solo_tasks]:
        out += [Case("tau2", "telecom/solo", str(task.id), kind, outputs, limits=limits)
                for kind, (outputs, limits) in solo_scripts(task).items()]
    for domain in tau2.DOMAINS:
        for task in _user_tasks(domain)[:user_tasks]:
            out += [Case("tau2", f"{domain}/user", str(task.id), kind, outputs, user=user, limits=limits)
                    for kind, (outputs, user, limits) in user_scripts(task).items()]
    return out


def _solo_tasks() -> list[Any]:
    return [t for t in tau2.load_tasks("telecom", "base") if getattr(t, "ticket", None) and _actions(t)]


def _user_tasks(domain: str) -> list[Any]:
    return [t for t in tau2.load_tasks(domain, "base") if _actions(t, "assistant") and not _needs_judge(t)]


def _needs_judge(task: Any) -> bool:
    from tau2.data_model.tasks import RewardType

    criteria = task.evaluation_criteria
    return criteria is not None and RewardType.NL_ASSERTION in set(criteria.reward_basis)


def _envace_tau2(case: Case, tokenizer: Any) -> tuple[float, str]:
    from envace.benchmarks.scripted import ScriptedPolicy
    from envace.worlds.users import ScriptedUser

    domain, mode = case.category.split("/")
    (task,) = tau2.load_tasks(domain, "base", ids=[case.entry_id])
    tools = tau2_world.Tau2UserTools() if domain in tau2.SOLO_DOMAINS else None  # the domains where the user has tools
    user = ScriptedUser({case.entry_id: list(case.user)}, tools=tools) if mode == "user" else None
    max_steps, max_errors = case.limits
    result = tau2_eval.evaluate([task], ScriptedPolicy(tokenizer, list(case.outputs)), tokenizer, domain, mode,
                                user=user, max_steps=max_steps, max_errors=max_errors)
    return result["rewards"][case.entry_id][0], result["endings"][case.entry_id][0]


def _official_tau2(case: Case) -> tuple[float, str]:
    from envace.benchmarks.official_tau2 import tau2_official_run

    domain, mode = case.category.split("/")
    (task,) = tau2.load_tasks(domain, "base", ids=[case.entry_id])
    max_steps, max_errors = case.limits
    return tau2_official_run(task, domain, mode == "solo", list(case.outputs), list(case.user),
                             max_steps=max_steps, max_errors=max_errors)


# ---------------------------------------------------------------------------------------------------------------------
# Running cases
# ---------------------------------------------------------------------------------------------------------------------


def cases() -> list[Case]:
    """The written cases: BFCL multi-turn and single-turn, tau^2 solo and user mode.

    ``parity_generated.all_cases`` adds the generated ones.
    """
    return multi_turn_cases() + single_turn_cases() + tau2_cases()


def run_case(case: Case, tokenizer: Any) -> Verdict:
    """Both verdicts on one case (``tokenizer`` renders the scripted policy's prompts)."""
    from envace.benchmarks.official import bfcl_official_result, bfcl_official_verdicts

    if case.benchmark == "tau2":
        reward, ending = _envace_tau2(case, tokenizer)
        official_reward, official_ending = _official_tau2(case)
        return Verdict(case, reward, official_reward, ending, official_ending)
    run = _envace_multi_turn if case.benchmark == "bfcl_multi_turn" else _envace_single_turn
    valid, error, _ = run(case, tokenizer)
    result = bfcl_official_result(case.category, case.entry_id, list(case.outputs))
    official = bfcl_official_verdicts(case.category, [result])[case.entry_id]
    return Verdict(case, float(valid), float(official["valid"]), error, official.get("error_type", ""),
                   official_crash=official.get("crash", ""))


def run_cases(selected: list[Case], tokenizer: Any) -> Iterator[Verdict]:
    """``run_case`` over ``selected``, in order."""
    for case in selected:
        yield run_case(case, tokenizer)
