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

BFCL's checker is loaded by ``envace.benchmarks.bfcl_ast_checker`` (without the model SDKs its model table imports);
gold outputs that validate the harness are written by ``envace.benchmarks.bfcl_ast_gold``.

Safety: model output is never ``eval``ed. Calls are read with ``json`` (``bfcl_loop.decode_ast``), and BFCL's AST
checker compares values and runs regex-based Java/JavaScript type converters; it does not ``eval`` either.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from envace.benchmarks.bfcl_ast_checker import CHECKER_MODEL_NAME, load_checker
from envace.benchmarks.bfcl_data import MULTI_TURN, _data_dir, _json_schema, _jsonl, refuse_not_run

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
        raise ValueError(f"'{category}' is a multi-turn category: use envace.benchmarks.bfcl_data.load_multi_turn")
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
