"""Raw generations read as a served model's are: vLLM's ``hermes`` tool parser, for tau^2.

tau^2 talks to a model through litellm's chat API, so what it sees of a generation is the message the serving stack
returns. For the ``<tool_call>`` format of envace's templates (Hermes / Qwen) that stack is vLLM with
``--tool-call-parser hermes``; ``hermes_message`` reads a generation as its ``Hermes2ProToolParser.extract_tool_calls``
does (vLLM 0.32, non-streaming), so envace's tau^2 loop and the official runner in the parity harness read the same
raw text the same way. ``tests/with_vllm`` checks it against the parser itself where vLLM is installed.
"""

from __future__ import annotations

import json
import re

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_START = "<tool_call>"


def hermes_message(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """A raw generation as vLLM's ``hermes`` tool parser reads it: ``(content, [(name, arguments JSON), ...])``.

    Without ``<tool_call>`` the text is the content. Otherwise every block (closed, or open to the end of the text)
    must be JSON with a string ``name`` and an ``arguments`` value, which is re-serialised with
    ``json.dumps(..., ensure_ascii=False)``; the content is the text before the first block (None when empty). A
    block that fails makes the whole text the content, without calls. ``json.loads`` is Python's: ``NaN``,
    ``Infinity``, numbers out of float range (``inf``) and lone surrogate escapes are read, as vLLM reads them.
    """
    if _START not in text:
        return text, []
    try:
        found = [json.loads(closed if closed else rest) for closed, rest in _BLOCK.findall(text)]
        calls = []
        for item in found:
            name, arguments = item["name"], json.dumps(item["arguments"], ensure_ascii=False)
            if not isinstance(name, str):  # vLLM's FunctionCall.name is a pydantic str: no coercion
                raise TypeError(f"a tool call name must be a string, got {type(name).__name__}")
            calls.append((name, arguments))
    except Exception:  # noqa: BLE001 - the parser's own rule: any failure leaves the whole text as content
        return text, []
    content = text[: text.find(_START)]
    return content or None, calls
