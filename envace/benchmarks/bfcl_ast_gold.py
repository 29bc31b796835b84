"""BFCL-v4 single-turn gold outputs, for validating the harness: answers encoded as a policy would write them.

``gold_calls`` takes each answer's first allowed values (Java and JavaScript arguments written as the language's
source strings, as the policy is asked for them), ``gold_output`` writes them as ``<tool_call>`` blocks (plain text
for irrelevance), and ``GoldASTEngine`` answers each entry's prompt with its gold (or a scripted) output, so
``envace.benchmarks.bfcl_ast.evaluate_single_turn`` runs on it as on a model.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from envace.benchmarks.bfcl_ast import IRRELEVANCE, RELEVANCE, ASTEntry, prompt_ids

NO_CALL_GOLD = "None of the provided functions can do this."
"""The gold output of an irrelevance entry: plain text."""


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
