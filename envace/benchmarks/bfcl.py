"""BFCL-v4 multi-turn: entries as envace tasks, policy evaluation under BFCL's loop, and the training export.

The four multi-turn categories run on BFCL's executable Python environments (file system, trading bot, travel,
vehicle, messages, posting, tickets, math). The entries, categories and splits of the pinned ``bfcl-eval`` package
are read by ``envace.benchmarks.bfcl_data``. envace never ``eval``s model output:

- ``parse_calls`` (``envace.benchmarks.bfcl_env``) reads BFCL's Python-call syntax (``[f(a=1), g('x')]``) with
  ``ast``: every call must be a plain function name with literal arguments, anything else is refused
  (``UnsafeCallError``);
- ``BFCLEnvironment`` (``envace.benchmarks.bfcl_env``) holds one fresh instance of each involved class per rollout;
  a decoded call runs as BFCL's executor runs its text (``envace.benchmarks.bfcl_exec``: the same observation, read
  with ``ast``, never ``eval``-ed), a ground-truth call by method name, and results are serialised as BFCL does;
- converted tasks (``to_task``) name ``BFCLToolbox`` as their environment, so envace's ``RealWorld`` runs them;
- policies run under BFCL's own inference loop (``envace.benchmarks.bfcl_loop``: bfcl-eval's decoder for the
  ``<tool_call>`` format, every decoded call executed, the force-quit after a turn's 21st step), and each episode is
  scored as the pinned ``eval_runner`` scores it (``envace.benchmarks.bfcl_check``): ``multi_turn:force_terminated``
  when it answered fewer turns than the entry has, otherwise BFCL's ``multi_turn_checker`` (state check and response
  check per turn). That checker ``eval``s call strings, so it only ever gets text that is a call of literal
  arguments (``canonical_call``, ``bfcl_loop.checker_call``); its module-level instance cache is cleared after every
  check.

The train split's entries become envace training tasks with their gold references (``training_task``,
``export_training_tasks``, ``python -m envace.benchmarks.bfcl --export OUT.jsonl``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from envace.benchmarks.bfcl_check import score_episode
from envace.benchmarks.bfcl_data import (
    EVAL_EVERY,
    MULTI_TURN,
    BFCLEntry,
    _function_docs,
    _json_schema,
    load_multi_turn,
    split_ids,
)
from envace.benchmarks.bfcl_env import BFCLEnvironment, PyCall, bind_arguments, parse_calls
from envace.benchmarks.scripted import ScriptedPolicy

# ---------------------------------------------------------------------------------------------------------------------
# Entries as envace tasks, a world over their environments, and policy evaluation
# ---------------------------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling the provided functions. In each turn, call "
    "the functions needed; when the request is done (or cannot be done), reply in plain text."
)
"""The system message of converted entries (BFCL's FC mode sends the function docs and the user turns only)."""


def tool_schemas(entry: BFCLEntry) -> list[dict[str, Any]]:
    """OpenAI function schemas of the entry's functions: its classes' public methods minus ``excluded_function``."""
    excluded = set(entry.raw.get("excluded_function") or [])
    names = [n for n in BFCLEnvironment(entry).methods if n not in excluded]
    docs = _function_docs()
    return [{"type": "function", "function": {"name": n, "description": docs[n]["description"],
                                              "parameters": _json_schema(docs[n]["parameters"])}}
            for n in names if n in docs]


def to_task(entry: BFCLEntry) -> Any:
    """The entry as an envace ``Task``: its first turn as the chat, the others as ``user_turns``.

    A ``miss_func`` entry's held-out functions are ``tool_unlocks`` of the turn that brings them; that turn's user
    message is BFCL's own prompt for added functions, with their schemas (the rendered tool list cannot change
    mid-conversation). ``success`` lists the gold calls (for envace's own rewards); the benchmark's score is BFCL's
    checker (``evaluate_multi_turn``).
    """
    from envace.types import EnvSpec, ExpectedCall, SuccessSpec, Task

    env = BFCLEnvironment(entry)
    expected = tuple(ExpectedCall(c.name, bind_arguments(env, c)) for turn in entry.ground_truth for text in turn
                     for c in parse_calls(text))
    schemas = tool_schemas(entry)
    missed = {int(turn): tuple(names) for turn, names in (entry.raw.get("missed_function") or {}).items()}
    later = [_turn_messages(turn, missed.get(index, ()), schemas) for index, turn in enumerate(entry.turns)][1:]
    return Task(
        id=entry.id,
        messages=({"role": "system", "content": SYSTEM_PROMPT}, *entry.turns[0]),
        tools=tuple(schemas),
        success=SuccessSpec(calls=expected, ordered=True),
        user_turns=tuple(later),
        tool_unlocks=tuple(missed.get(index, ()) for index in range(1, len(entry.turns))) if missed else (),
        environment=EnvSpec("envace.benchmarks.bfcl.BFCLToolbox", {"category": entry.category, "entry_id": entry.id}),
    )


def _turn_messages(turn: tuple[dict[str, Any], ...], added: tuple[str, ...],
                   schemas: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """A turn's user messages; a turn that brings functions gets BFCL's prompt for them, with their schemas."""
    if not added:
        return tuple(turn)
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

    docs = json.dumps([s for s in schemas if s["function"]["name"] in added])
    text = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)
    return (*turn, {"role": "user", "content": text})


def evaluate_multi_turn(entries: list[BFCLEntry], engine: Any, tokenizer: Any, rollout: Any | None = None,
                        rehearsal: Any = None, selector: Any = None) -> dict[str, Any]:
    """Run a policy on ``entries`` under BFCL's inference loop and score each episode as BFCL's runner does.

    Returns ``{"accuracy": f, "valid": {id: bool}, "errors": {id: BFCL's error type of each failed entry},
    "results": [official result-file lines], "episodes": [...], "unwritable": [ids of failed entries whose calls
    hold a lone surrogate: bfcl-eval's runner crashes writing their scores; envace reports its checker's
    verdict]}``. ``engine`` generates the act role (greedy unless ``rollout`` says otherwise). The loop is BFCL's
    (``bfcl_loop.BFCLRules``): bfcl-eval's decoder for envace's ``<tool_call>`` format, every decoded call executed
    (no schema or name check), and the force-quit of a turn after its 21st step. ``rollout``'s own budgets (turns,
    calls, context) still apply; an episode they end before its last turn is force-terminated for BFCL.
    ``rehearsal`` (``envace.rollout.private_rehearsal.PrivateRehearsal``) makes the policy rehearse privately before its
    committed turns, with ``selector`` choosing what it commits; the real environment sees committed calls only.
    """
    from envace.benchmarks.bfcl_loop import BFCLRules, result_entry, unwritable, warn_unwritable
    from envace.rollout.config import RolloutConfig
    from envace.rollout.rehearsing import make_runner
    from envace.worlds import RealWorld

    config = rollout or RolloutConfig(act_temperature=0.0, max_turns=100_000, max_tool_calls=100_000,
                                      max_context_tokens=32768)
    # BFCL's loop: no schema or name check before a call runs, and its own step limit (BFCLRules), not the runner's
    config = replace(config, max_steps_per_user_turn=0, validate_calls=False)
    tasks = [to_task(e) for e in entries]
    world = RealWorld()  # each task's environment is its entry's BFCLToolbox
    runner = make_runner(tokenizer, config, rehearsal, selector, rules=BFCLRules())
    episodes = runner.run(tasks, list(range(len(tasks))), engine, world, world_engine=engine)
    verdicts = {e.id: score_episode(e, ep) for e, ep in zip(entries, episodes)}
    valid = {i: bool(v["valid"]) for i, v in verdicts.items()}
    errors = {i: str(v.get("error_type", "")) for i, v in verdicts.items() if not v["valid"]}
    unwritten = [e.id for e, ep in zip(entries, episodes) if not valid[e.id]
                 and unwritable([[c.name, c.arguments] for _, calls in ep.call_steps for c in calls])]
    warn_unwritable(unwritten)
    return {"accuracy": sum(valid.values()) / len(valid) if valid else 0.0, "valid": valid, "errors": errors,
            "results": [result_entry(e.id, ep) for e, ep in zip(entries, episodes)], "episodes": episodes,
            "unwritable": unwritten}


class GoldPolicy(ScriptedPolicy):
    """A policy that replays one entry's ground truth through the rollout.

    Per turn it answers with one act turn holding all the turn's gold calls (``<tool_call>`` blocks, arguments named
    from the method signatures), then a plain-text answer. It serves one episode at a time.
    """

    def __init__(self, entry: BFCLEntry, tokenizer: Any) -> None:
        env = BFCLEnvironment(entry)
        script = []
        for turn in entry.ground_truth:
            calls = [c for text in turn for c in parse_calls(text)]
            if calls:
                script.append("\n".join(
                    "<tool_call>\n" + json.dumps({"name": c.name, "arguments": bind_arguments(env, c)})
                    + "\n</tool_call>" for c in calls))
            script.append("Done.")
        super().__init__(tokenizer, script)


# ---------------------------------------------------------------------------------------------------------------------
# Training tasks (the train split only)
# ---------------------------------------------------------------------------------------------------------------------


class BFCLToolbox:
    """A BFCL entry's environment as an envace real environment (a toolbox: ``envace.envs.real.is_toolbox``).

    Args:
        category: the entry's category.
        entry_id: the entry id.
    """

    def __init__(self, category: str, entry_id: str) -> None:
        (entry,) = load_multi_turn(category, ids=[entry_id])
        self.env = BFCLEnvironment(entry)

    def tool_names(self) -> list[str]:
        """Every public method of the entry's classes."""
        return list(self.env.methods)

    accepts_any_name = True
    """Every name reaches ``call_tool``: BFCL's executor runs whatever name the decoder read (a name with spaces
    around it runs as the bare name; an unknown one is its ``name '...' is not defined`` error)."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one decoded call as BFCL's executor does (``BFCLEnvironment.execute_decoded``)."""
        return self.env.execute_decoded(name, arguments)


def reference_messages(entry: BFCLEntry) -> list[dict[str, Any]]:
    """The gold continuation of the entry's first user turn, with the real responses of a replay.

    Per turn: the turn's user messages (after the first turn; with BFCL's prompt for the functions a ``miss_func``
    turn brings, as ``to_task`` delivers it), one assistant message with the turn's gold calls and their tool
    responses, then a plain-text close ("Done.").
    """
    env = BFCLEnvironment(entry)
    schemas = tool_schemas(entry)
    missed = {int(turn): tuple(names) for turn, names in (entry.raw.get("missed_function") or {}).items()}
    messages: list[dict[str, Any]] = []
    for index, (turn, gold) in enumerate(zip(entry.turns, entry.ground_truth)):
        if index > 0:
            messages += [dict(m) for m in _turn_messages(turn, missed.get(index, ()), schemas)]
        calls = [c for text in gold for c in parse_calls(text)]
        if calls:
            bound = [bind_arguments(env, c) for c in calls]
            tool_calls = [{"type": "function", "function": {"name": c.name, "arguments": args}}
                          for c, args in zip(calls, bound)]
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
            messages += [{"role": "tool", "name": c.name, "content": env.execute(PyCall(c.name, (), tuple(a.items())))}
                         for c, a in zip(calls, bound)]
        messages.append({"role": "assistant", "content": "Done."})
    return messages


def training_task(entry: BFCLEntry) -> Any:
    """A train-split entry as an envace training task, for SFT, alignment, rehearsal and real RL.

    It is ``to_task`` (whose environment is the entry's ``BFCLToolbox``) plus its reference: gold calls with real
    responses.

    Raises:
        ValueError: the entry is held out for evaluation (``split_ids``).
    """
    number = int(entry.id.rsplit("_", 1)[1])
    if number % EVAL_EVERY == 0:
        raise ValueError(f"{entry.id} is held out for evaluation (ids divisible by {EVAL_EVERY}); train on the others")
    task = to_task(entry)
    return replace(task, reference=tuple(reference_messages(entry)))


def export_training_tasks(categories: list[str], path: str | Path) -> dict[str, int]:
    """Write the train split of ``categories`` as an envace task file (JSON Lines); returns counts.

    Entries whose gold calls break their own tool schemas (a handful: BFCL never checks them), or call a function
    before the turn that brings it, cannot be envace training tasks and are skipped (counted).
    """
    from envace.data.tasks import write_tasks

    entries = [e for category in categories for e in load_multi_turn(category, ids=split_ids(category)[0])]
    return write_tasks((training_task(e) for e in entries), path)


def main(argv: list[str] | None = None) -> None:
    """``python -m envace.benchmarks.bfcl --export OUT.jsonl [--categories ...]``: write training tasks."""
    import argparse

    parser = argparse.ArgumentParser(description="Export BFCL-v4 multi-turn train-split entries as envace tasks.")
    parser.add_argument("--export", required=True, metavar="OUT.jsonl")
    parser.add_argument("--categories", nargs="+", default=["multi_turn_base"],
                        choices=MULTI_TURN)
    args = parser.parse_args(argv)
    counts = export_training_tasks(args.categories, args.export)
    print(f"{args.export}: {counts}")  # noqa: T201 (a command line's result)


if __name__ == "__main__":
    main()
