"""BFCL's official inference loop, mirrored: its decoder, its step limit, and its result files.

bfcl-eval scores a model by running ``BaseHandler.inference_multi_turn_prompting`` and then re-reading the saved raw
outputs with the model family's decoder (``eval_runner._evaluate_single_multi_turn_entry``). envace writes
``<tool_call>\\n{json}\\n</tool_call>`` blocks (the Hermes / Qwen format of its chat templates), so the decoder it
mirrors is bfcl-eval's ``QwenFCHandler`` (Qwen2.5 / Qwen3 function calling), read here line by line:

- blocks are found with the regex ``<tool_call>\\n(.*?)\\n</tool_call>`` (a block without those newlines is not a
  block); a block whose body Python's ``json.loads`` cannot read is skipped, the others are kept (``NaN``,
  ``Infinity`` and numbers out of float range are read, as ``inf`` and ``nan``);
- every kept block must hold a JSON object with ``name`` and ``arguments`` (a JSON list inside one block, a missing
  key, or arguments that are not an object or a JSON string of one make the whole step undecodable);
- the text after the last ``</think>`` is the response (the reasoning before it is dropped).

The loop's rules (``BFCLRules``): a step that decodes to no call (plain text, or undecodable output) ends the user
turn; every decoded call is executed, whatever its name (excluded and held-back functions run; an unknown name is an
execution error); a turn whose 21st step has run is force-quit, and the entry ends there: the runner then marks it
``multi_turn:force_terminated`` unless that turn was the last one. ``result_entry`` writes an episode in the official
result-file format, so bfcl-eval's own runner can score envace's runs.

Execution and safety: BFCL runs a decoded call as Python text (``name(key=repr(value), ...)``, ``eval``-ed), so a
name or key with spaces around it runs as the bare name and ``inf``/``nan`` are undefined names.
``envace.benchmarks.bfcl_exec`` gives the same observation without ``eval``, and ``checker_call`` hands BFCL's
``eval``-based checker only text that is a call of literal arguments (anything else becomes a call to an undefined
function: envace never runs model text).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from envace.roles.parsing import ParsedTurn
from envace.rollout.rules import LoopRules, awaiting_tools, current_turn_steps
from envace.types import Episode, ToolCall

MAXIMUM_STEP_LIMIT = 20
"""bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT: a turn is force-quit once its step count exceeds it."""

FORCE_TERMINATED = "multi_turn:force_terminated"
"""The runner's error type for an entry whose inference was force-quit before its last turn."""

UNDEFINED_CALL = "envace_undefined_function()"
"""What call text envace does not let run becomes for BFCL's checker (an undefined name: ``bfcl_exec.Refused``)."""

_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_THINK_CLOSE = "</think>"


class DecodeError(ValueError):
    """Output that bfcl-eval's decoder for this format cannot decode (the step then ends the turn)."""


def split_response(text: str) -> tuple[str, str]:
    """``(reasoning, response)`` as QwenFCHandler splits a generation: around the first and last ``</think>``."""
    if _THINK_CLOSE not in text:
        return "", text
    parts = text.split(_THINK_CLOSE)
    return parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n"), parts[-1].lstrip("\n")


def tool_call_objects(response: str) -> list[Any]:
    """The decoded JSON of every block (``_extract_tool_calls``): bodies ``json.loads`` cannot read are skipped.

    Python's ``json.loads``, as BFCL's: ``NaN``, ``Infinity``, out-of-range numbers (``inf``) and lone surrogate
    escapes are read; what raises (malformed text, an integer of more digits than Python converts, nesting past the
    recursion limit) is skipped.
    """
    found = []
    for body in _BLOCK.findall(response):
        try:
            found.append(json.loads(body))
        except Exception:  # noqa: BLE001,S112 - BFCL's own rule: ``except Exception: pass``
            continue
    return found


def _call_name(item: dict[str, Any]) -> str:
    """The call's name as BFCL's call text writes it (``f"{name}(...)"``: ``str`` of a JSON scalar)."""
    name = item["name"]
    if isinstance(name, list | dict):  # unhashable: BFCL's dict construction raises
        raise DecodeError(f"a tool call name must be a JSON scalar, got {json.dumps(name)}")
    return str(name)


def decode_execute(response: str) -> list[ToolCall]:
    """``QwenFCHandler.decode_execute``: the calls of one step's response, in order ([] when there is none).

    Raises:
        DecodeError: a block holds something other than a call object, or a call's arguments are not an object.
    """
    items = tool_call_objects(response)
    if any(not isinstance(item, dict) for item in items):
        raise DecodeError("model did not return a list of function calls")
    calls = []
    for item in items:
        if "name" not in item or "arguments" not in item:
            raise DecodeError("a tool call lacks 'name' or 'arguments'")
        arguments = item["arguments"]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except Exception as exc:  # noqa: BLE001 - anything json.loads raises fails the step, as in BFCL
                raise DecodeError(f"arguments string is not JSON: {exc}") from exc
        if not isinstance(arguments, dict):
            raise DecodeError("a tool call's arguments are not a JSON object")
        calls.append(ToolCall(_call_name(item), arguments))
    return calls


def decode_ast(response: str) -> list[dict[str, dict[str, Any]]]:
    """``QwenFCHandler.decode_ast``: ``[{name: arguments}, ...]`` for BFCL's single-turn checkers.

    Raises:
        DecodeError: a block holds something other than a call object, or a call lacks ``name`` or an object of
            ``arguments`` (the AST decoder does not read a JSON string of arguments).
    """
    items = tool_call_objects(response)
    if any(not isinstance(item, dict) for item in items):
        raise DecodeError("model did not return a list of function calls")
    decoded = []
    for item in items:
        if "name" not in item or not isinstance(item.get("arguments"), dict):
            raise DecodeError("a tool call lacks 'name' or an object of 'arguments'")
        decoded.append({_call_name(item): dict(item["arguments"])})
    return decoded


def decode_turn(text: str) -> ParsedTurn:
    """One act turn as BFCL's loop reads it: its calls, or none (plain text, or output the decoder rejects)."""
    reasoning, response = split_response(text)
    try:
        calls = decode_execute(response)
    except DecodeError:
        return ParsedTurn(content=response.strip(), reasoning=reasoning, calls=[], malformed=True)
    match = _BLOCK.search(response)
    content = response[:match.start()] if calls and match else response
    malformed = not calls and "<tool_call>" in response  # a block BFCL's decoder does not see (counted only)
    return ParsedTurn(content=content.strip(), reasoning=reasoning, calls=list(calls), malformed=malformed)


class BFCLRules(LoopRules):
    """BFCL's multi-turn inference loop: its decoder, and the force-quit after ``MAXIMUM_STEP_LIMIT`` + 1 steps."""

    name = "bfcl"

    def parse(self, text: str) -> ParsedTurn:
        """``decode_turn``."""
        return decode_turn(text)

    def stop_reason(self, episode: Episode) -> str:
        """``multi_turn:force_terminated`` once the current turn's executed steps exceed the limit."""
        if awaiting_tools(episode):
            return ""
        return FORCE_TERMINATED if current_turn_steps(episode) > MAXIMUM_STEP_LIMIT else ""


def checker_call(call: ToolCall, methods: dict[str, str], instances: dict[str, Any]) -> str:
    """The call text BFCL's checker ``eval``s (``bfcl_exec.official_text``).

    Only a call of literal arguments (``bfcl_exec.checker_text``) goes as written; text envace does not let run
    becomes ``UNDEFINED_CALL``.
    """
    from envace.benchmarks.bfcl_exec import checker_text, official_text

    return checker_text(official_text(call.name, call.arguments), methods, instances) or UNDEFINED_CALL


def turns_reached(episode: Episode) -> int:
    """User turns the episode was given (the official result file has one list per turn reached)."""
    return episode.stats.user_turns


def result_entry(entry_id: str, episode: Episode) -> dict[str, Any]:
    """The episode as one line of bfcl-eval's result file: ``{"id", "result": [[step response, ...], ...]}``.

    One list per user turn reached, holding every act step's response (reasoning removed), the closing plain-text
    step included, as ``inference_multi_turn_prompting`` saves them.
    """
    result: list[list[str]] = [[] for _ in range(turns_reached(episode))]
    for turn, text in episode.act_outputs:
        result[turn].append(split_response(text)[1])
    return {"id": entry_id, "result": result}


def unwritable(value: Any) -> bool:
    """A string in ``value`` (or a key) that UTF-8 cannot encode: a lone surrogate, from a ``\\udXXX`` JSON escape.

    bfcl-eval writes its score file as UTF-8 with ``ensure_ascii=False``, so it crashes on a failed entry whose
    record holds one (``warn_unwritable``).
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(unwritable(k) or unwritable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(unwritable(v) for v in value)
    return False


def warn_unwritable(entry_ids: list[str]) -> None:
    """Warn that bfcl-eval's runner could not write the scores of these failed entries (see ``unwritable``)."""
    if entry_ids:
        logging.getLogger(__name__).warning(
            "BFCL: %d failed entries hold a lone surrogate (a \\udXXX escape) in their calls (%s); bfcl-eval's "
            "runner crashes writing a score record that holds one (the decoded calls of a single-turn entry; what "
            "reached a multi-turn entry's results or state); envace reports its checker's verdict (invalid)",
            len(entry_ids), ", ".join(entry_ids[:5]))

