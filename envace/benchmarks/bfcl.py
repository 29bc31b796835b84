"""BFCL-v4 multi-turn: the entries of the pinned ``bfcl-eval`` package, a safe executor, and BFCL's own checker.

The four multi-turn categories run on BFCL's executable Python environments (file system, trading bot, travel,
vehicle, messages, posting, tickets, math). envace never ``eval``s model output:

- ``parse_calls`` reads BFCL's Python-call syntax (``[f(a=1), g('x')]``) with ``ast``: every call must be a plain
  function name with literal arguments, anything else is refused (``UnsafeCallError``);
- ``BFCLEnvironment`` holds one fresh instance of each involved class per rollout; a decoded call runs as BFCL's
  executor runs its text (``envace.benchmarks.bfcl_exec``: the same observation, read with ``ast``, never
  ``eval``-ed), a ground-truth call by method name, and results are serialised as BFCL does;
- converted tasks (``to_task``) name ``BFCLToolbox`` as their environment, so envace's ``RealWorld`` runs them;
- policies run under BFCL's own inference loop (``envace.benchmarks.bfcl_loop``: bfcl-eval's decoder for the
  ``<tool_call>`` format, every decoded call executed, the force-quit after a turn's 21st step), and each episode is
  scored as the pinned ``eval_runner`` scores it: ``multi_turn:force_terminated`` when it answered fewer turns than
  the entry has, otherwise BFCL's ``multi_turn_checker`` (state check and response check per turn). That checker
  ``eval``s call strings, so it only ever gets text that is a call of literal arguments (``canonical_call``,
  ``bfcl_loop.checker_call``); its module-level instance cache is cleared after every check.

The package is an optional dependency (installed by ``scripts/setup_env.sh``); ``require_bfcl`` names it when it is
missing. Importing ``bfcl_eval``'s configuration writes folders under ``BFCL_PROJECT_ROOT``, which is pointed at a
temporary folder unless the user set it.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from envace.benchmarks.scripted import ScriptedPolicy

MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
"""The multi-turn categories (each 200 entries in bfcl-eval 2026.3.23)."""

NEEDS_NETWORK = {
    "web_search": "it queries a live search API (SerpAPI) over the network",
    "web_search_base": "it queries a live search API (SerpAPI) over the network",
    "web_search_no_snippet": "it queries a live search API (SerpAPI) over the network",
    "memory_vector": "its memory backend downloads a sentence-embedding model from a hub when imported",
}
"""BFCL-v4 agentic categories that cannot run offline, with the reason (the offline aggregate leaves them out)."""

NOT_RUN = {
    **NEEDS_NETWORK,
    "memory_kv": "each entry questions a memory that BFCL's prerequisite conversations (memory_prereq_conversation) "
                 "write to disk first, run one after another as a chain; envace's harness does not run that chain, "
                 "so it refuses the category rather than score it without the memory",
    "memory_rec_sum": "each entry questions a memory that BFCL's prerequisite conversations "
                      "(memory_prereq_conversation) write to disk first, run one after another as a chain; envace's "
                      "harness does not run that chain, so it refuses the category rather than score it without the "
                      "memory",
    "format_sensitivity": "it is not scored (BFCL's NON_SCORING_CATEGORY) and BFCL runs it only for prompting "
                          "models, re-asking non-live entries with the function docs and answer format written in "
                          "the prompt; envace's policies are function-calling models (tools through the chat "
                          "template), for which BFCL skips it too",
}
"""Every BFCL-v4 category envace does not run, with the reason (none of them is in the offline aggregate)."""


def refuse_not_run(category: str) -> None:
    """Raise the reason a category in ``NOT_RUN`` is not run (nothing for the others).

    Raises:
        ValueError: naming the category and why, and that it is left out of the offline score, not counted as 0.
    """
    if category in NOT_RUN:
        raise ValueError(f"BFCL category '{category}' is not run: {NOT_RUN[category]} (it is left out of the offline "
                         "score, not counted as 0)")

PACKAGE_HINT = "pip install --no-deps bfcl-eval==2026.3.23 (scripts/setup_env.sh installs it with its light needs)"


def require_bfcl() -> Any:
    """Import ``bfcl_eval`` (with ``BFCL_PROJECT_ROOT`` outside site-packages), or say how to install it.

    Raises:
        ImportError: the package is missing, in one line naming the install.
    """
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "envace-bfcl"))
    try:
        return importlib.import_module("bfcl_eval")
    except ImportError as exc:
        raise ImportError(f"BFCL needs the optional package bfcl-eval: {PACKAGE_HINT}") from exc


def _data_dir() -> Path:
    return Path(require_bfcl().__file__).parent / "data"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BFCLEntry:
    """One multi-turn entry with its ground truth.

    Attributes:
        id: e.g. ``multi_turn_base_0``.
        category: one of ``MULTI_TURN``.
        turns: the user messages of each turn (a turn may be empty in ``miss_func``).
        ground_truth: the gold calls of each turn, in BFCL's Python-call syntax.
        raw: the entry as the package ships it (``initial_config``, ``involved_classes``, ``excluded_function``,
            ``missed_function``, ...): BFCL's checker reads it.
    """

    id: str
    category: str
    turns: tuple[tuple[dict[str, Any], ...], ...]
    ground_truth: tuple[tuple[str, ...], ...]
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def involved_classes(self) -> list[str]:
        """The environment classes the entry uses."""
        return list(self.raw["involved_classes"])

    @property
    def long_context(self) -> bool:
        """The long-context variant of the environments (BFCL's own rule)."""
        return "long_context" in self.category


@cache
def _category_files(category: str) -> tuple[tuple[dict[str, Any], ...], dict[str, list[list[str]]]]:
    data = _data_dir()
    entries = tuple(_jsonl(data / f"BFCL_v4_{category}.json"))
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return entries, answers


def load_multi_turn(category: str, ids: list[str] | None = None, limit: int | None = None) -> list[BFCLEntry]:
    """The entries of a multi-turn category (all, the given ``ids``, or the first ``limit``).

    Raises:
        ValueError: an unknown category or id (the valid ones are listed).
        ImportError: bfcl-eval is not installed.
    """
    refuse_not_run(category)
    if category not in MULTI_TURN:
        raise ValueError(f"unknown BFCL multi-turn category '{category}'; valid: {', '.join(MULTI_TURN)}")
    raws, answers = _category_files(category)
    by_id = {raw["id"]: raw for raw in raws}
    if ids is not None:
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            sample = ", ".join(list(by_id)[:3])
            raise ValueError(f"unknown {category} id(s) {unknown}; valid ids are {category}_0 to "
                             f"{category}_{len(by_id) - 1} (e.g. {sample})")
        raws = tuple(by_id[i] for i in ids)
    raws = raws[:limit] if limit is not None else raws
    return [
        BFCLEntry(raw["id"], category, tuple(tuple(t) for t in raw["question"]),
                  tuple(tuple(calls) for calls in answers[raw["id"]]), raw)
        for raw in raws
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Safe calls
# ---------------------------------------------------------------------------------------------------------------------


class UnsafeCallError(ValueError):
    """Text that is not a list of plain function calls with literal arguments."""


@dataclass(frozen=True)
class PyCall:
    """A parsed call: a function name, literal positional arguments and literal keyword arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as exc:
        raise UnsafeCallError(f"not a literal argument in {text!r}: {ast.unparse(node)}") from exc


def _call(node: ast.expr, text: str) -> PyCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise UnsafeCallError(f"not a plain function call in {text!r}: {ast.unparse(node)}")
    if any(k.arg is None for k in node.keywords):
        raise UnsafeCallError(f"**kwargs are not allowed in {text!r}")
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise UnsafeCallError(f"*args are not allowed in {text!r}")
    args = tuple(_literal(a, text) for a in node.args)
    kwargs = tuple((k.arg, _literal(k.value, text)) for k in node.keywords if k.arg is not None)
    return PyCall(node.func.id, args, kwargs)


def parse_calls(text: str) -> list[PyCall]:
    """Calls from BFCL's Python syntax: one call ``f(a=1)`` or a list ``[f(a=1), g('x')]``.

    Raises:
        UnsafeCallError: not Python, or something other than plain calls with literal arguments.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise UnsafeCallError(f"not Python call syntax: {text!r}") from exc
    nodes = tree.elts if isinstance(tree, ast.List | ast.Tuple) else [tree]
    return [_call(node, text) for node in nodes]


def canonical_call(call: PyCall) -> str:
    """``name(arg, key=value)`` with ``repr`` literals: the only form handed to BFCL's ``eval``-based checker."""
    parts = [repr(a) for a in call.args] + [f"{k}={v!r}" for k, v in call.kwargs]
    return f"{call.name}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------------------------------------
# The executable environment
# ---------------------------------------------------------------------------------------------------------------------


class BFCLEnvironment:
    """Fresh instances of an entry's classes, loaded with its initial configuration.

    ``execute_decoded`` runs a decoded call as BFCL's executor runs its text (``envace.benchmarks.bfcl_exec``);
    ``execute`` runs a parsed ground-truth call by method name.

    Attributes:
        instances: BFCL's instance name (``bfcl_exec.instance_name``) -> instance.
        methods: public method name -> bound method (a later class's method wins, as in BFCL's executor).
        method_instances: public method name -> instance name.
    """

    def __init__(self, entry: BFCLEntry) -> None:
        require_bfcl()
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        from envace.benchmarks.bfcl_exec import instance_name

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        self.method_instances: dict[str, str] = {}
        for name in entry.involved_classes:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
            instance = cls()
            if name not in STATELESS_CLASSES:
                config = copy.deepcopy(entry.raw["initial_config"].get(name, {}))
                instance._load_scenario(config, long_context=entry.long_context)
            key = instance_name(entry.id, name)
            self.instances[key] = instance
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self.methods[method_name] = method
                    self.method_instances[method_name] = key

    def execute(self, call: PyCall) -> str:
        """Run one parsed call by method name.

        A refused or unknown name, or a raising tool, gives BFCL's ``Error during execution``.
        """
        from envace.benchmarks.bfcl_exec import FORBIDDEN_NAMES, serialise

        if call.name in FORBIDDEN_NAMES:  # refused by name before anything runs, as BFCL's executor does
            return f"Error during execution: Function call {call.name} is not allowed."
        method = self.methods.get(call.name)
        if method is None:
            return f"Error during execution: name '{call.name}' is not defined"
        args, kwargs = copy.deepcopy((call.args, dict(call.kwargs)))  # the environment may keep (and mutate) them
        try:
            return serialise(method(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - a tool error is an observation, as in BFCL
            return f"Error during execution: {exc}"

    def execute_decoded(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one decoded call as BFCL's executor runs its text (``bfcl_exec.run_text``).

        Text that would do more than call with literal arguments under ``eval`` is not run: it is answered as a
        call of an undefined name (``bfcl_exec.REFUSED``).
        """
        from envace.benchmarks.bfcl_exec import Refused, official_text, refused_observation, run_text

        text = official_text(name, copy.deepcopy(arguments))
        try:
            return run_text(text, self.instances, self.method_instances)
        except Refused as exc:
            return refused_observation(exc)


# ---------------------------------------------------------------------------------------------------------------------
# Scoring with BFCL's checker
# ---------------------------------------------------------------------------------------------------------------------


def check_multi_turn(entry: BFCLEntry, calls: list[list[list[PyCall]]]) -> dict[str, Any]:
    """BFCL's verdict on parsed calls (``calls[turn][step]``, every turn): ``{"valid": bool, ...}``.

    For gold answers and other ``parse_calls`` output; an episode is scored with ``score_episode``.
    """
    if len(calls) != len(entry.ground_truth):
        raise ValueError(f"{entry.id}: {len(calls)} turns of calls for {len(entry.ground_truth)} turns")
    return check_decoded(entry, [[[canonical_call(c) for c in step] for step in turn] for turn in calls])


def check_decoded(entry: BFCLEntry, decoded: list[list[list[str]]]) -> dict[str, Any]:
    """The pinned runner's verdict (``eval_runner._evaluate_single_multi_turn_entry``) on call strings per step.

    ``decoded[turn][step]`` holds one step's call strings (``canonical_call`` or ``bfcl_loop.checker_call``: the
    only forms handed to the checker's ``eval``). Fewer turns than the entry has is BFCL's
    ``multi_turn:force_terminated``; otherwise ``multi_turn_checker`` alone decides (the runner imports
    ``multi_turn_irrelevance_checker`` but never calls it, so calls in a turn whose ground truth is empty, the
    miss_func / miss_param turns, fail the entry only through the state they leave for later turns).
    """
    require_bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    from envace.benchmarks.bfcl_loop import FORCE_TERMINATED

    if len(decoded) != len(entry.ground_truth):
        return {"valid": False, "error_type": FORCE_TERMINATED,
                "error_message": [f"{len(decoded)} turns answered of {len(entry.ground_truth)}: the inference was "
                                  "force-terminated"]}
    truth = [list(turn) for turn in entry.ground_truth]
    model_name = f"envace_{uuid.uuid4().hex}"  # BFCL caches instances in module globals, keyed by model name
    try:
        return checker.multi_turn_checker(decoded, truth, entry.raw, entry.category, model_name)
    finally:
        cache_globals = vars(multi_turn_utils)
        for key in [k for k in cache_globals if k.startswith(model_name)]:
            del cache_globals[key]


def score_episode(entry: BFCLEntry, episode: Any) -> dict[str, Any]:
    """BFCL's verdict on an episode run under ``bfcl_loop.BFCLRules``: its executed steps, per user turn reached.

    An episode that failed (``EpisodeStats.failed``: the environment could not run) is invalid, as an inference
    error is upstream.
    """
    if episode.stats.failed:
        return {"valid": False, "error_type": "multi_turn:inference_error", "error_message": [episode.stats.failure]}
    return check_decoded(entry, episode_calls(entry, episode))


def gold_calls(entry: BFCLEntry) -> list[list[list[PyCall]]]:
    """The ground truth as a rollout: each turn's gold calls in one step (no step for an empty turn)."""
    return [[[c for text in turn for c in parse_calls(text)]] if turn else [] for turn in entry.ground_truth]


# ---------------------------------------------------------------------------------------------------------------------
# Entries as envace tasks, a world over their environments, and policy evaluation
# ---------------------------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling the provided functions. In each turn, call "
    "the functions needed; when the request is done (or cannot be done), reply in plain text."
)
"""The system message of converted entries (BFCL's FC mode sends the function docs and the user turns only)."""

_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def _json_schema(node: Any) -> Any:
    """BFCL's parameter schema dialect (``dict``, ``float``, ``tuple``, ``any``) as JSON Schema."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str) and value in _TYPES:
            if _TYPES[value] is not None:
                out[key] = _TYPES[value]
        elif key in ("properties",) and isinstance(value, dict):
            out[key] = {name: _json_schema(schema) for name, schema in value.items()}
        else:
            out[key] = _json_schema(value)
    return out


@cache
def _function_docs() -> dict[str, dict[str, Any]]:
    """Every multi-turn function doc, by name."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    docs = {}
    for module in CLASS_FILE_PATH_MAPPING.values():
        path = _data_dir() / "multi_turn_func_doc" / f"{module.rsplit('.', 1)[-1]}.json"
        if path.is_file():
            docs.update({doc["name"]: doc for doc in _jsonl(path)})
    return docs


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


def bind_arguments(env: BFCLEnvironment, call: PyCall) -> dict[str, Any]:
    """The call's arguments by parameter name (positional ones named from the method's signature)."""
    method = env.methods.get(call.name)
    if method is None:
        return dict(call.kwargs)
    bound = inspect.signature(method).bind_partial(*call.args, **dict(call.kwargs))
    return dict(bound.arguments)


def episode_calls(entry: BFCLEntry, episode: Any) -> list[list[list[str]]]:
    """An episode's executed steps as the checker's call strings, ``[turn][step]``, one list per user turn reached.

    Turns past the last one reached are absent (BFCL's force-terminated entries have fewer turns than the entry).
    """
    from envace.benchmarks.bfcl_loop import checker_call, turns_reached

    methods, instances = _call_names(tuple(entry.involved_classes))
    turns: list[list[list[str]]] = [[] for _ in range(min(turns_reached(episode), len(entry.ground_truth)))]
    for turn, calls in episode.call_steps:
        turns[turn].append([checker_call(c, methods, instances) for c in calls])
    return turns


@functools.cache
def _call_names(classes: tuple[str, ...]) -> tuple[dict[str, str], dict[str, None]]:
    """``(method -> instance name, instance names)`` of the classes, as BFCL's executor maps them.

    Any entry id will do: the shape of a call text does not depend on the entry id in the instance names.
    """
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    from envace.benchmarks.bfcl_exec import instance_name

    methods: dict[str, str] = {}
    for name in classes:
        key = instance_name("envace_check", name)
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        methods.update({m: key for m, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
                        if not m.startswith("_")})
    return methods, {key: None for key in set(methods.values())}


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
    from envace.rollout.rehearsing import make_runner
    from envace.rollout.runner import RolloutConfig
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

EVAL_EVERY = 4
"""Entry ``<category>_<n>`` with ``n % EVAL_EVERY == 0`` is held out for evaluation (50 of each 200); the rest
(150) may be trained on. BFCL ships no split of its own; a policy trained on the train split is scored on the eval
split (``split_ids``), never on all 200."""


def split_ids(category: str) -> tuple[list[str], list[str]]:
    """``(train ids, eval ids)`` of a category."""
    ids = [entry.id for entry in load_multi_turn(category)]
    held_out = [i for i in ids if int(i.rsplit("_", 1)[1]) % EVAL_EVERY == 0]
    return [i for i in ids if i not in held_out], held_out


SPLITS = ("all", "train", "eval")
"""Which entries of a multi-turn category: all 200 (the benchmark's number), or one side of ``split_ids``."""


def load_split(category: str, split: str = "all", limit: int | None = None) -> list[BFCLEntry]:
    """The entries of ``split`` (first ``limit``): score a policy trained on the train split on ``eval`` only.

    Raises:
        ValueError: an unknown split or category (the valid ones are named).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown BFCL split '{split}'; valid: {', '.join(SPLITS)}")
    if split == "all":
        return load_multi_turn(category, limit=limit)
    train, held_out = split_ids(category)
    ids = train if split == "train" else held_out
    return load_multi_turn(category, ids=ids[:limit] if limit is not None else ids)


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
