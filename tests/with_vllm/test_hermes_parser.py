"""``envace.benchmarks.hermes.hermes_message`` reads raw generations as vLLM's own ``hermes`` tool parser does."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from envace.benchmarks.hermes import hermes_message  # noqa: E402
from envace.benchmarks.parity_families import ESCAPES, NUMBERS, WHITESPACE, block_text  # noqa: E402

PIECES = st.sampled_from([
    "", "Sure.", "\n", "<think>\nplan\n</think>\n", block_text("ls", {}), block_text(" cd ", {"folder ": "x"}),
    "<tool_call>\n{not json\n</tool_call>", '<tool_call>{"name": 1, "arguments": {}}</tool_call>',
    '<tool_call>\n{"name": "x"}\n</tool_call>', "<tool_call>\n" + json.dumps(["a"]) + "\n</tool_call>",
    '<tool_call>{"name": "ls", "arguments": {}}', "</tool_call>", "<tool_call>", *WHITESPACE,
    *(block_text("cd", {}, raw=raw, key="folder") for raw in NUMBERS + ESCAPES),
])


@pytest.fixture(scope="module")
def parser(smollm2_dir):
    from transformers import AutoTokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    return Hermes2ProToolParser(AutoTokenizer.from_pretrained(smollm2_dir))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(PIECES, max_size=5))
def test_the_same_content_and_calls_as_vllms_parser(parser, pieces: list[str]) -> None:
    text = "".join(pieces)
    found = parser.extract_tool_calls(text, request=None)
    content, calls = hermes_message(text)
    assert content == found.content
    assert calls == [(c.function.name, c.function.arguments) for c in found.tool_calls]
