"""BFCL-v4 single-turn categories (non-live, live, relevance), scored with BFCL's own AST checker.

The entries come from the pinned ``bfcl-eval`` package (``bfcl_eval/data/BFCL_v4_<category>.json`` and
``possible_answer/``). As in BFCL's function-calling (FC) mode, the policy sees the entry's first user turn with its
function docs as tools (no system prompt); the docs carry BFCL's language hints (Java and JavaScript parameters become
strings in the language's syntax). Generation is token-in/token-out through an envace ``Engine``; each output's
``<tool_call>`` blocks become ``[{name: arguments}, ...]``, the checker's model output.

Scoring:

- AST categories use BFCL's ``ast_checker`` (function name, required and unknown arguments, types, allowed values,
  order-free matching for ``parallel``) with the entry's function docs as BFCL's eval runner passes them: without
  the language hints, since the Java/JavaScript type converters need the original types. Outputs are decoded by
  bfcl-eval's own decoder for the ``<tool_call>`` format (``decode_calls``); one it rejects "failed to decode"
  (invalid), as in BFCL.
- ``irrelevance`` and ``live_irrelevance`` are correct when the output holds no decodable call, ``live_relevance``
  when it holds at least one (BFCL's ``relevance_file_runner`` rule); live_relevance is reported, not aggregated.

The checker shim: ``bfcl_eval.eval_checker.ast_eval.ast_checker`` imports ``bfcl_eval.constants.model_config``,
which imports every model SDK BFCL supports (not installed with ``--no-deps``). The checker reads one thing from
it: ``MODEL_CONFIG_MAPPING[model_name.replace("_", "/")].underscore_to_dot``, which says whether the model's
function names had ``.`` turned into ``_``. ``load_checker`` imports the real module when it imports; otherwise it
runs the checker's own source file under a private module name, with a stand-in ``model_config`` (one key,
``CHECKER_MODEL_NAME``, ``underscore_to_dot=False``: envace keeps dotted names) present in ``sys.modules`` only
while that source runs. ``sys.modules`` is left as it was: the stand-in is removed (or the previous module put
back), and the ``bfcl_eval`` modules a failed real import left behind are dropped.

Safety: model output is never ``eval``ed. Calls are read with ``json`` (``bfcl_loop.decode_ast``), and BFCL's AST
checker compares values and runs regex-based Java/JavaScript type converters; it does not ``eval`` either.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType, SimpleNamespace
from typing import Any

from envace.benchmarks.bfcl import MULTI_TURN, _data_dir, _json_schema, _jsonl, refuse_not_run, require_bfcl

SIMPLE = ("simple_python", "simple_java", "simple_javascript")
"""The three ``simple`` categories (their mean is BFCL's ``simple``)."""

NON_LIVE_AST = (*SIMPLE, "multiple", "parallel", "parallel_multiple")
"""Non-live AST categories (400/100/50/200/200/200 entries)."""

LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
"""Live AST categories (258/1053/16/24 entries)."""

AST_CATEGORIES = NON_LIVE_AST + LIVE_AST
"""Categories scored by BFCL's AST checker against ``possible_answer``."""

IRRELEVANCE = ("irrelevance", "live_irrelevance")
"""Correct when the output holds no decodable call (240/884 entries)."""

RELEVANCE = ("live_relevance",)
"""Correct when the output holds at least one call (16 entries; reported, not in the aggregate)."""

SINGLE_TURN = AST_CATEGORIES + IRRELEVANCE + RELEVANCE
"""Every category this module loads."""

CHECKER_MODEL_NAME = "Qwen_Qwen3-8B-FC"
"""The model name handed to BFCL's checker: a real ``MODEL_CONFIG_MAPPING`` key (``/`` written ``_``, as BFCL
does) whose ``underscore_to_dot`` is False, the same answer the stand-in gives."""

NO_CALL_GOLD = "None of the provided functions can do this."
"""The gold output of an irrelevance entry: plain text."""

_CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_PRIVATE_CHECKER = "_envace_bfcl_ast_checker"
_CHECKER_NEEDS = (  # the checker's real imports, loaded before trying it so a failed try never drops them
    "bfcl_eval.constants.enums",
    "bfcl_eval.constants.type_mappings",
    "bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter",
    "bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter",
)
_ABSENT = object()

# ---------------------------------------------------------------------------------------------------------------------
# BFCL's checker
# ---------------------------------------------------------------------------------------------------------------------


@cache
def load_checker() -> ModuleType:
    """BFCL's ``ast_checker`` module: the real one when it imports, else its source run with a stand-in config.

    Raises:
        ImportError: bfcl-eval is not installed.
    """
    require_bfcl()
    for name in _CHECKER_NEEDS:
        importlib.import_module(name)
    before = set(sys.modules)
    try:
        return importlib.import_module(_CHECKER)
    except ImportError:  # a model SDK is missing: model_config imports them all
        _drop_new_bfcl_modules(before)
    return _checker_from_source()


def _drop_new_bfcl_modules(before: set[str]) -> None:
    """Remove the ``bfcl_eval`` modules (and parent attributes) a failed import added to ``sys.modules``."""
    for name in sorted(set(sys.modules) - before, reverse=True):
        if not name.startswith("bfcl_eval."):
            continue
        module = sys.modules.pop(name)
        parent_name, _, child = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is not None and getattr(parent, child, None) is module:
            delattr(parent, child)


def _checker_from_source() -> ModuleType:
    """Run the checker's source file as a private module, with the stand-in ``model_config`` while it runs."""
    found = importlib.util.find_spec(_CHECKER)
    origin = found.origin if found is not None else None
    spec = importlib.util.spec_from_file_location(_PRIVATE_CHECKER, origin) if origin else None
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot find the source of BFCL's checker ({_CHECKER})")
    module = importlib.util.module_from_spec(spec)
    stand_in = ModuleType(_MODEL_CONFIG, "envace's stand-in: the one model config BFCL's AST checker reads")
    stand_in.MODEL_CONFIG_MAPPING = {  # type: ignore[attr-defined]
        CHECKER_MODEL_NAME.replace("_", "/"): SimpleNamespace(underscore_to_dot=False)}
    previous = sys.modules.get(_MODEL_CONFIG, _ABSENT)
    sys.modules[_MODEL_CONFIG] = stand_in
    try:
        spec.loader.exec_module(module)
    finally:
        if previous is _ABSENT:
            del sys.modules[_MODEL_CONFIG]
        else:
            sys.modules[_MODEL_CONFIG] = previous
    return module


def language(category: str) -> str:
    """The checker's language of a category: ``java``, ``javascript`` or ``python``."""
    if "javascript" in category:
        return "javascript"
    return "java" if "java" in category else "python"


# ---------------------------------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ASTEntry:
    """One single-turn entry.

    Attributes:
        id: e.g. ``simple_python_0`` or ``live_simple_0-0-0``.
        category: one of ``SINGLE_TURN``.
        messages: the chat the policy sees (the entry's ``question[0]``; no system prompt, as in FC mode).
        functions: the function docs as shipped (BFCL's eval runner gives these to the checker).
        tools: OpenAI tool schemas of the docs with BFCL's language hints (what the policy sees); dotted names kept.
        answer: the possible answers (``[{name: {arg: [allowed values]}}]``); None for (ir)relevance categories.
    """

    id: str
    category: str
    messages: tuple[dict[str, Any], ...] = field(repr=False, compare=False)
    functions: tuple[dict[str, Any], ...] = field(repr=False, compare=False)
    tools: tuple[dict[str, Any], ...] = field(repr=False, compare=False)
    answer: list[dict[str, Any]] | None = field(repr=False, compare=False)

    @property
    def language(self) -> str:
        """``python``, ``java`` or ``javascript``."""
        return language(self.category)


def _check_category(category: str) -> None:
    """Refuse categories this module does not run, saying where they are (or why not)."""
    refuse_not_run(category)
    if category in MULTI_TURN or category.startswith("multi_turn"):
        raise ValueError(f"'{category}' is a multi-turn category: use envace.benchmarks.bfcl.load_multi_turn")
    if category not in SINGLE_TURN:
        raise ValueError(f"unknown BFCL single-turn category '{category}'; valid: {', '.join(SINGLE_TURN)}")


@cache
def _category_files(category: str) -> tuple[tuple[dict[str, Any], ...], dict[str, list[dict[str, Any]]]]:
    data = _data_dir()
    raws = tuple(_jsonl(data / f"BFCL_v4_{category}.json"))
    path = data / "possible_answer" / f"BFCL_v4_{category}.json"
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(path)} if path.is_file() else {}
    return raws, answers


def _select(category: str, raws: tuple[dict[str, Any], ...], ids: list[str] | None) -> list[dict[str, Any]]:
    if ids is None:
        return list(raws)
    by_id = {raw["id"]: raw for raw in raws}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        sample = ", ".join(list(by_id)[:3])
        raise ValueError(f"unknown {category} id(s) {unknown}; {category} has {len(by_id)} ids, e.g. {sample}")
    return [by_id[i] for i in ids]


def tool_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI tool schema (BFCL's schema dialect converted, the name kept as is)."""
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": _json_schema(doc["parameters"])}}


def _entry(category: str, raw: dict[str, Any], answer: list[dict[str, Any]] | None) -> ASTEntry:
    from bfcl_eval.utils import _func_doc_language_specific_pre_processing as add_hints

    hinted = add_hints(copy.deepcopy(raw["function"]), category)
    return ASTEntry(raw["id"], category, tuple(copy.deepcopy(raw["question"][0])),
                    tuple(copy.deepcopy(raw["function"])), tuple(tool_schema(d) for d in hinted),
                    copy.deepcopy(answer))


def load_single_turn(category: str, ids: list[str] | None = None, limit: int | None = None) -> list[ASTEntry]:
    """The entries of a single-turn category (all, the given ``ids``, or the first ``limit``).

    Raises:
        ValueError: an unknown category or id (the valid ones are listed), a multi-turn category (named elsewhere),
            or a category that needs the network.
        ImportError: bfcl-eval is not installed.
    """
    _check_category(category)
    raws, answers = _category_files(category)
    selected = _select(category, raws, ids)
    selected = selected[:limit] if limit is not None else selected
    return [_entry(category, raw, answers.get(raw["id"])) for raw in selected]


# ---------------------------------------------------------------------------------------------------------------------
# Decoding and checking
# ---------------------------------------------------------------------------------------------------------------------


def decode_calls(text: str) -> list[dict[str, dict[str, Any]]] | None:
    """The checker's model output for one generation: ``[{name: arguments}, ...]``, or None ("failed to decode").

    bfcl-eval's own decoder for the ``<tool_call>`` format (``QwenFCHandler.decode_ast``, mirrored in
    ``envace.benchmarks.bfcl_loop.decode_ast``): plain text gives ``[]``; a block BFCL's decoder rejects makes the
    whole output undecodable, a block it cannot read as JSON is skipped.
    """
    from envace.benchmarks.bfcl_loop import DecodeError, decode_ast, split_response

    try:
        return decode_ast(split_response(text)[1])
    except DecodeError:
        return None


def _has_call(calls: list[dict[str, Any]] | None) -> bool:
    """BFCL's relevance rule: the output decoded and is not empty (``is_empty_output``)."""
    from bfcl_eval.utils import is_empty_output

    return calls is not None and not is_empty_output(calls)


def _check_relevance(entry: ASTEntry, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    has_call = _has_call(calls)
    if entry.category in IRRELEVANCE:
        if not has_call:
            return {"valid": True, "error": []}
        return {"valid": False, "error": ["Valid syntax. Successfully decode AST when it should not."],
                "error_type": "irrelevance_error:decoder_success"}
    if has_call:
        return {"valid": True, "error": []}
    return {"valid": False, "error": ["Invalid syntax. Failed to decode AST when it should have."],
            "error_type": "relevance_error:decoder_failed"}


def _check_ast(entry: ASTEntry, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.utils import is_function_calling_format_output

    if calls is None:
        return {"valid": False, "error": ["Invalid syntax. Failed to decode AST."],
                "error_type": "ast_decoder:decoder_failed"}
    if not is_function_calling_format_output(calls):
        return {"valid": False, "error": ["Did not output in the specified format."],
                "error_type": "ast_decoder:decoder_wrong_output_format"}
    checker = load_checker()
    try:  # copies: the checker must never change an entry
        return checker.ast_checker(copy.deepcopy(list(entry.functions)), copy.deepcopy(calls),
                                   copy.deepcopy(entry.answer), Language(entry.language), entry.category,
                                   CHECKER_MODEL_NAME)
    except Exception as exc:  # noqa: BLE001 - a model output BFCL's checker cannot handle is a wrong answer
        return {"valid": False, "error": [f"BFCL's checker raised {type(exc).__name__}: {exc}"],
                "error_type": "ast_checker:exception"}


def check_entry(entry: ASTEntry, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """BFCL's verdict on decoded calls (``decode_calls``; None = failed to decode): ``{"valid": bool, ...}``.

    AST categories go through BFCL's ``ast_checker``; (ir)relevance categories follow ``relevance_file_runner``.
    """
    if entry.category in IRRELEVANCE or entry.category in RELEVANCE:
        return _check_relevance(entry, calls)
    return _check_ast(entry, calls)


# ---------------------------------------------------------------------------------------------------------------------
# Policy evaluation
# ---------------------------------------------------------------------------------------------------------------------


def prompt_ids(entry: ASTEntry, tokenizer: Any) -> list[int]:
    """The entry's prompt tokens: its messages and tools in the tokenizer's chat template, generation prompt added."""
    from envace.engines.stream import prompt_stream

    return prompt_stream(tokenizer, [dict(m) for m in entry.messages], list(entry.tools)).ids


def _generation_text(tokenizer: Any, generation: Any) -> str:
    """The generated text, without the final stop token of a finished generation."""
    from envace.policy.chat import decode

    ids = generation.token_ids[:-1] if generation.finished else generation.token_ids
    return decode(tokenizer, list(ids))


def generate_outputs(entries: list[ASTEntry], engine: Any, tokenizer: Any, params: Any,
                     batch_size: int) -> dict[str, str]:
    """One generation per entry (``batch_size`` prompts per ``engine.generate`` call): ``{id: text}``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    outputs: dict[str, str] = {}
    for start in range(0, len(entries), batch_size):
        chunk = entries[start:start + batch_size]
        generations = engine.generate([prompt_ids(e, tokenizer) for e in chunk], params)
        outputs.update({e.id: _generation_text(tokenizer, g) for e, g in zip(chunk, generations, strict=True)})
    return outputs


def evaluate_single_turn(entries: list[ASTEntry], engine: Any, tokenizer: Any, max_new_tokens: int = 1024,
                         temperature: float = 0.0, top_p: float = 1.0, batch_size: int = 16) -> dict[str, Any]:
    """Generate one answer per entry with ``engine`` and score it with BFCL's rules.

    Returns:
        ``{"accuracy": f, "valid": {id: bool}, "outputs": {id: text}, "errors": {id: BFCL's error type of each
        failed entry}, "categories": {category: accuracy}, "counts": {category: n}, "unwritable": [ids of failed
        entries whose calls hold a lone surrogate: bfcl-eval crashes writing their scores; envace reports its
        checker's verdict]}`` (accuracy over all entries; 0.0 for none). An output BFCL's checker raises on is a
        failed entry with error type ``ast_checker:exception``.
    """
    from envace.benchmarks.bfcl_loop import unwritable, warn_unwritable
    from envace.engines.base import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    outputs = generate_outputs(entries, engine, tokenizer, params, batch_size)
    decoded = {e.id: decode_calls(outputs[e.id]) for e in entries}
    verdicts = {e.id: check_entry(e, decoded[e.id]) for e in entries}
    valid = {i: bool(v["valid"]) for i, v in verdicts.items()}
    errors = {i: v.get("error_type", "") for i, v in verdicts.items() if not v["valid"]}
    unwritten = [i for i in valid if not valid[i] and unwritable(decoded[i])]
    warn_unwritable(unwritten)
    counts: dict[str, int] = {}
    passed: dict[str, int] = {}
    for entry in entries:
        counts[entry.category] = counts.get(entry.category, 0) + 1
        passed[entry.category] = passed.get(entry.category, 0) + valid[entry.id]
    return {"accuracy": sum(valid.values()) / len(valid) if valid else 0.0, "valid": valid, "outputs": outputs,
            "errors": errors, "categories": {c: passed[c] / n for c, n in counts.items()}, "counts": counts,
            "unwritable": unwritten}


# ---------------------------------------------------------------------------------------------------------------------
# Gold outputs (harness validation)
# ---------------------------------------------------------------------------------------------------------------------


def first_allowed(value: Any) -> Any:
    """A nested answer value with every inner list of allowed values replaced by its first value.

    Dicts in answers map each key to a list of allowed values (``""`` = may be omitted), at any depth (a dict
    argument, or the dicts of a list-of-dicts argument); other lists are values.
    """
    if isinstance(value, dict):
        return {k: first_allowed(v[0]) for k, v in value.items()
                if not (isinstance(v, list) and v and v[0] == "")} if _is_alternatives(value) else value
    if isinstance(value, list):
        return [first_allowed(v) for v in value]
    return value


def _is_alternatives(value: dict[str, Any]) -> bool:
    return all(isinstance(v, list) and v for v in value.values())


def _java_scalar(value: Any, java_type: str | None) -> str:
    """A scalar in Java source syntax, as BFCL's Java type converter reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if java_type == "long":
        return f"{value}L"
    return f"{value}f" if java_type == "float" else str(value)


def _java_element(value: Any) -> str:
    """A value inside a Java collection literal (``parse_java_value`` syntax: strings quoted)."""
    return json.dumps(value) if isinstance(value, str) else _java_scalar(value, None)


def _java_literal(value: Any, schema: dict[str, Any]) -> str:
    """An argument value as a string of Java source (FC mode: every Java argument is a string)."""
    java_type, item_type = schema.get("type"), schema.get("items", {}).get("type")
    if isinstance(value, str):
        return value
    if java_type == "Array":
        items = ", ".join(v if isinstance(v, str) else _java_scalar(v, item_type) for v in value)
        return f"new {item_type or 'Object'}[]{{{items}}}"
    if java_type == "ArrayList":
        quote = "'" if item_type == "char" else '"'
        items = ", ".join(f"{quote}{v}{quote}" if isinstance(v, str) else _java_scalar(v, item_type) for v in value)
        return f"new ArrayList<>(Arrays.asList({items}))" if value else "new ArrayList<>()"
    if java_type == "HashMap":
        puts = " ".join(f"put({json.dumps(k)}, {_java_element(v)});" for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return _java_scalar(value, java_type)


def _js_literal(value: Any, schema: dict[str, Any]) -> str:
    """An argument value as a string of JavaScript source (FC mode: every JavaScript argument is a string)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if schema.get("type") == "Bigint":
        return f"{value}n"
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def _encode_argument(value: Any, schema: dict[str, Any], lang: str) -> Any:
    if lang == "java":
        return _java_literal(value, schema)
    return _js_literal(value, schema) if lang == "javascript" else value


_OMIT = object()


def _gold_value(alternatives: list[Any], required: bool, documented: bool) -> Any:
    """The first allowed value (``_OMIT`` for ``""``, "may be omitted").

    A required parameter takes its first value other than ``""``; one missing from the function doc is omitted
    whenever the answer allows it (the checker rejects undocumented arguments).
    """
    if not documented and "" in alternatives:
        return _OMIT
    candidates = [a for a in alternatives if a != ""] if required else alternatives
    return _OMIT if not candidates or candidates[0] == "" else first_allowed(candidates[0])


def _gold_call(name: str, arguments: dict[str, list[Any]], doc: dict[str, Any], lang: str) -> dict[str, Any]:
    properties, required = doc.get("properties", {}), set(doc.get("required", ()))
    values = {p: _gold_value(alts, p in required, p in properties) for p, alts in arguments.items()}
    return {name: {p: _encode_argument(v, properties.get(p, {}), lang) for p, v in values.items() if v is not _OMIT}}


def gold_calls(entry: ASTEntry) -> list[dict[str, Any]]:
    """The answer's calls, each argument at its first allowed value (``_gold_value``), as ``{name: args}``.

    Java and JavaScript values are written as the language's source strings (what the policy is asked for).
    """
    docs = {doc["name"]: doc["parameters"] for doc in entry.functions}
    return [_gold_call(name, arguments, docs.get(name, {}), entry.language)
            for answer in entry.answer or [] for name, arguments in answer.items()]


def gold_output(entry: ASTEntry) -> str:
    """A model output that should pass: ``<tool_call>`` blocks of ``gold_calls``, or plain text for irrelevance.

    live_relevance has no answer and any call passes: its gold is a call of the first function with no arguments.
    """
    if entry.category in IRRELEVANCE:
        return NO_CALL_GOLD
    calls = [{entry.functions[0]["name"]: {}}] if entry.category in RELEVANCE else gold_calls(entry)
    return "\n".join(f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
                     for call in calls for name, args in call.items())


class GoldASTEngine:
    """An ``Engine`` that answers each known entry's prompt with its ``gold_output`` (plus the end-of-turn token).

    A few entries of different categories share one prompt (e.g. a live_simple and a live_irrelevance entry with
    the same question and functions); such a prompt gets their answers in turn, in the order of ``entries``.

    Args:
        entries: the entries it knows.
        tokenizer: the tokenizer that renders the prompts and encodes the answers.
        outputs: other answers than the gold ones, by entry id (scripted outputs, e.g. perturbed ones).
    """

    def __init__(self, entries: list[ASTEntry], tokenizer: Any, outputs: dict[str, str] | None = None) -> None:
        from envace.policy.chat import encode

        self.answers: dict[tuple[int, ...], deque[list[int]]] = {}
        for entry in entries:
            text = outputs[entry.id] if outputs and entry.id in outputs else gold_output(entry)
            answer = encode(tokenizer, text) + [tokenizer.eos_token_id]
            self.answers.setdefault(tuple(prompt_ids(entry, tokenizer)), deque()).append(answer)

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        """The gold answer of each prompt.

        Raises:
            KeyError: a prompt of no known entry.
        """
        from envace.engines.base import Generation

        return [Generation(list(self._next(tuple(p))), True) for p in prompts]

    def _next(self, prompt: tuple[int, ...]) -> list[int]:
        """The prompt's next answer (its answers rotate)."""
        queue = self.answers[prompt]
        queue.rotate(-1)
        return queue[-1]


# ---------------------------------------------------------------------------------------------------------------------
# The offline aggregate
# ---------------------------------------------------------------------------------------------------------------------

AGGREGATE_NOTE = (
    "bfcl_offline = (10*NonLive + 10*Live + 10*Irrelevance + 30*MultiTurn) / 60: BFCL-v4's weights without the "
    "agentic 40% (web search needs a live search API, memory_vector a hub model, memory_kv and memory_rec_sum "
    "BFCL's chained prerequisite conversations), so it is not BFCL-v4 overall"
)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _component(accuracy: dict[str, float], keys: tuple[str, ...], missing: list[str]) -> list[float] | None:
    """The accuracies of ``keys``, or None (after noting the absent ones in ``missing``)."""
    absent = [k for k in keys if k not in accuracy]
    missing += absent
    return None if absent else [float(accuracy[k]) for k in keys]


def _live(accuracy: dict[str, float], counts: dict[str, int], missing: list[str]) -> float | None:
    values = _component(accuracy, LIVE_AST, missing)
    if values is None:
        return None
    uncounted = [k for k in LIVE_AST if counts.get(k, 0) <= 0]
    if uncounted:
        raise ValueError(f"Live is count-weighted: give counts (> 0) for {', '.join(uncounted)}")
    return sum(v * counts[k] for v, k in zip(values, LIVE_AST)) / sum(counts[k] for k in LIVE_AST)


def offline_aggregate(accuracy: dict[str, float], counts: dict[str, int]) -> dict[str, Any]:
    """BFCL's aggregation over the offline categories (benchmarks.md 6(b)); accuracies are fractions in [0, 1].

    ``simple`` = mean(simple_python, simple_java, simple_javascript); NonLive = mean(simple, multiple, parallel,
    parallel_multiple); Live = count-weighted mean of the live AST categories (``counts`` gives the weights);
    Irrelevance = mean(irrelevance, live_irrelevance); MultiTurn = mean of the four ``multi_turn_*`` accuracies (the
    caller supplies them, e.g. from ``envace.benchmarks.bfcl.evaluate_multi_turn``).

    A component whose inputs are not all given is None and its absent keys are listed under ``missing``; then
    ``bfcl_offline`` is None too (a partial score is never passed off as the aggregate). ``live_relevance`` is
    reported when given and never aggregated.

    Raises:
        ValueError: a live AST accuracy without a positive count.
    """
    missing: list[str] = []
    simple = _component(accuracy, SIMPLE, missing)
    rest = _component(accuracy, ("multiple", "parallel", "parallel_multiple"), missing)
    non_live = _mean([_mean(simple), *rest]) if simple is not None and rest is not None else None
    live = _live(accuracy, counts, missing)
    irr = _component(accuracy, IRRELEVANCE, missing)
    multi = _component(accuracy, MULTI_TURN, missing)
    parts = {"non_live": non_live, "live": live, "irrelevance": None if irr is None else _mean(irr),
             "multi_turn": None if multi is None else _mean(multi)}
    total = None if missing else (10 * parts["non_live"] + 10 * parts["live"] + 10 * parts["irrelevance"]
                                  + 30 * parts["multi_turn"]) / 60
    return {**parts, "simple": None if simple is None else _mean(simple), "bfcl_offline": total,
            "live_relevance": accuracy.get("live_relevance"), "missing": missing, "note": AGGREGATE_NOTE}
