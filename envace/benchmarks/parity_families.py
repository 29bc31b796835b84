"""Generated perturbations of raw model text for the parity check (``envace.benchmarks.parity``).

Each family rewrites a gold answer's raw text the way a model's output can differ from it, choosing where and how
through a ``Draw`` (``draw(options) -> one of them``): ``random.Random(seed).choice`` for
``benchmarks/harness_check.py`` (a fixed, reproducible sample), ``hypothesis``'s ``data.draw(sampled_from(...))``
in the tests (which explore with ``HYPOTHESIS_PROFILE=dev`` and shrink). The families:

- ``whitespace``: spaces, tabs, newlines, form feeds or non-ASCII spaces around a function name or an argument key;
- ``number``: an argument written as a number outside float range (``1e400``, a 400-digit or a 5000-digit integer),
  ``NaN``, ``Infinity``, an underflow, or a negative zero;
- ``escape``: a string argument written with a lone surrogate escape, a surrogate pair, ``\\u0000``, an escaped
  slash, or a raw control character (not JSON);
- ``split``: one turn's calls split over steps at chosen places, the blocks separated and preceded differently
  (nothing, blank lines, text, reasoning), some blocks malformed;
- ``empty``: an empty, whitespace-only or end-of-sequence-only message (a generation that is only the stop token)
  inserted at a chosen place.

Every generated script is padded with closing messages, so neither side runs out when a perturbation moves the end.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
Draw = Callable[[Sequence[T]], T]
Call = tuple[str, dict[str, Any]]

WHITESPACE = (" ", "  ", "\t", "\n", "\r", "\x0c", " \n", "\u00a0", "\u3000")
NUMBERS = ("1e400", "-1e400", "1E+999", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "9" * 5000, "1e-400",
           "-0.0", "-0")
ESCAPES = ('"\\ud800"', '"a\\udfffb"', '"\\ud83d\\ude00"', '"\\u0000"', '"\\/tmp"', '"tab\there"', '"\\u00e9t\\u00e9"',
           '"line\\nbreak"')
EMPTY = ("", " ", "\n", "\t\n ", "\n\n")
FAMILIES = ("whitespace", "number", "escape", "split", "empty")
_TOKEN = "@@envace-raw-token@@"


def block_text(name: Any, arguments: Any, raw: str | None = None, key: str | None = None) -> str:
    """One ``<tool_call>`` block; with ``raw``, the argument ``key`` is written as that raw JSON text."""
    if raw is not None:
        arguments = {**arguments, key: _TOKEN}
    body = json.dumps({"name": name, "arguments": arguments})
    if raw is not None:
        body = body.replace(json.dumps(_TOKEN), raw)
    return "<tool_call>\n" + body + "\n</tool_call>"


def _spaced(text: str, draw: Draw) -> str:
    space = draw(WHITESPACE)
    side = draw(("before", "after", "both"))
    return (space if side != "after" else "") + text + (space if side != "before" else "")


def whitespace_step(calls: Sequence[Call], draw: Draw) -> str:
    """The step's blocks, one call's name or one argument key spaced."""
    index = draw(range(len(calls)))
    name, args = calls[index]
    if args and draw(("name", "key")) == "key":
        key = draw(list(args))
        args = {(_spaced(k, draw) if k == key else k): v for k, v in args.items()}
    else:
        name = _spaced(name, draw)
    edited = [*calls[:index], (name, args), *calls[index + 1:]]
    return "\n".join(block_text(n, a) for n, a in edited)


def raw_value_step(calls: Sequence[Call], draw: Draw, values: Sequence[str]) -> str:
    """The step's blocks, one argument written as raw JSON text from ``values`` (a new key if the call has none)."""
    index = draw(range(len(calls)))
    name, args = calls[index]
    key = draw(list(args)) if args else "value"
    blocks = [block_text(n, a) for n, a in calls]
    blocks[index] = block_text(name, args, raw=draw(values), key=key)
    return "\n".join(blocks)


def split_steps(calls: Sequence[Call], draw: Draw) -> list[str]:
    """The calls over one or more steps, cut at drawn places, each step's blocks joined and preceded as drawn."""
    steps: list[list[Call]] = [[calls[0]]]
    for call in calls[1:]:
        if draw((False, True)):
            steps.append([call])
        else:
            steps[-1].append(call)
    texts = []
    for step in steps:
        joiner = draw(("\n", "", "\n\n", " "))
        lead = draw(("", "Sure.\n", "<think>\nplan\n</think>\n\n", "\n"))
        tail = draw(("", "", "\n<tool_call>\n{not json\n</tool_call>", "<tool_call>{\"name\": 1}</tool_call>",
                     "\n<tool_call>\n" + json.dumps({"name": "x"}) + "\n</tool_call>"))
        texts.append(lead + joiner.join(block_text(n, a) for n, a in step) + tail)
    return texts


def perturb(family: str, calls: Sequence[Call], draw: Draw) -> list[str]:
    """One turn's steps under ``family`` (``calls``: the turn's gold calls, at least one)."""
    if family == "whitespace":
        return [whitespace_step(calls, draw)]
    if family == "number":
        return [raw_value_step(calls, draw, NUMBERS)]
    if family == "escape":
        return [raw_value_step(calls, draw, ESCAPES)]
    if family == "split":
        return split_steps(calls, draw)
    if family == "empty":
        steps, empty = ["\n".join(block_text(n, a) for n, a in calls)], draw(EMPTY)
        return [empty, *steps] if draw(("before", "after")) == "before" else [*steps, empty]
    raise ValueError(f"unknown perturbation family {family!r}; choose from {', '.join(FAMILIES)}")
