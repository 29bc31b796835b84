"""Tests for envace.policy.chat: incremental (token-in/token-out) rendering and template checks."""

from __future__ import annotations

import pytest
from helpers import BALANCE_TOOLS as TOOLS

from envace.policy.chat import (
    TemplateError,
    check_chat_template,
    check_prefix_preserving,
    encode,
    render,
    render_delta,
    turn_tail,
)
from envace.policy.tiny import build_tokenizer

SYSTEM = {"role": "system", "content": "You are a bank agent."}
USER = {"role": "user", "content": "What are the balances of A-1 and B-2?"}
CALLS = (
    '<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "A-1"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "B-2"}}\n</tool_call>'
)
ACT_1 = {"role": "assistant", "content": CALLS}  # raw generated text, tool calls inline
TOOL_A = {"role": "tool", "content": '{"balance": 10}'}
TOOL_B = {"role": "tool", "content": '{"balance": 20}'}
ACT_2 = {"role": "assistant", "content": "A-1 has 10 and B-2 has 20."}
# the growing snapshots a rollout renders: prompt, + act turn, + parallel tool responses, + final answer
SNAPSHOTS = [
    [SYSTEM, USER],
    [SYSTEM, USER, ACT_1],
    [SYSTEM, USER, ACT_1, TOOL_A, TOOL_B],
    [SYSTEM, USER, ACT_1, TOOL_A, TOOL_B, ACT_2],
]

# drops the content of every assistant message that is not the last message (like Qwen3 dropping old reasoning)
DROPPING_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and not loop.last %}{{- '<|im_start|>assistant\n<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
# ChatML without tools support
NO_TOOLS_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def _tokenizer_with(template: str | None):
    tok = build_tokenizer()  # a fresh object: the session fixture is never mutated
    tok.chat_template = template
    return tok


def test_tiny_template_is_prefix_preserving_for_rollouts(tiny_tokenizer) -> None:
    check_prefix_preserving(tiny_tokenizer, SNAPSHOTS, TOOLS)
    check_prefix_preserving(tiny_tokenizer, SNAPSHOTS, None)


def test_raw_assistant_text_is_rendered_verbatim(tiny_tokenizer) -> None:
    prompt = render(tiny_tokenizer, SNAPSHOTS[0], TOOLS, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat are the balances of A-1 and B-2?<|im_end|>\n<|im_start|>assistant\n")
    assert "get_balance" in prompt
    full = render(tiny_tokenizer, SNAPSHOTS[1], TOOLS, add_generation_prompt=False)
    assert full == prompt + CALLS + "<|im_end|>\n"
    assert turn_tail(tiny_tokenizer, SNAPSHOTS[1], TOOLS) == "<|im_end|>\n"


def test_render_delta_of_parallel_tool_responses(tiny_tokenizer) -> None:
    delta = render_delta(tiny_tokenizer, SNAPSHOTS[1], [TOOL_A, TOOL_B], TOOLS)
    # both responses share one user turn, then the next assistant header opens
    assert delta == (
        "<|im_start|>user"
        '\n<tool_response>\n{"balance": 10}\n</tool_response>'
        '\n<tool_response>\n{"balance": 20}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_incremental_rollout_text_equals_full_render(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    text = render(tok, SNAPSHOTS[0], TOOLS, add_generation_prompt=True)  # the prompt, rendered once
    text += CALLS + turn_tail(tok, SNAPSHOTS[1], TOOLS)  # generated text + template's turn close
    text += render_delta(tok, SNAPSHOTS[1], [TOOL_A, TOOL_B], TOOLS)  # observations + next header
    text += ACT_2["content"] + turn_tail(tok, SNAPSHOTS[3], TOOLS)
    assert text == render(tok, SNAPSHOTS[3], TOOLS, add_generation_prompt=False)


def test_render_delta_without_generation_prompt(tiny_tokenizer) -> None:
    delta = render_delta(tiny_tokenizer, SNAPSHOTS[2], [ACT_2], None, add_generation_prompt=False)
    assert delta == "<|im_start|>assistant\nA-1 has 10 and B-2 has 20.<|im_end|>\n"


def test_empty_tools_render_like_no_tools(tiny_tokenizer) -> None:
    with_empty = render(tiny_tokenizer, SNAPSHOTS[0], [], add_generation_prompt=True)
    assert with_empty == render(tiny_tokenizer, SNAPSHOTS[0], None, add_generation_prompt=True)
    assert "# Tools" not in with_empty


def test_encode_adds_no_special_tokens(tiny_tokenizer) -> None:
    ids = encode(tiny_tokenizer, "<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") in ids
    assert encode(tiny_tokenizer, "") == []


def test_dropping_template_is_rejected() -> None:
    tok = _tokenizer_with(DROPPING_TEMPLATE)
    with pytest.raises(TemplateError, match="at message 3 \\(role 'tool'\\)"):
        check_prefix_preserving(tok, SNAPSHOTS, None)
    with pytest.raises(TemplateError, match="not prefix-preserving"):
        render_delta(tok, SNAPSHOTS[1], [TOOL_A], None)


def test_check_prefix_preserving_rejects_non_extending_snapshots(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="does not extend"):
        check_prefix_preserving(tiny_tokenizer, [[SYSTEM, USER], [SYSTEM, ACT_2]], None)


def test_check_chat_template(tiny_tokenizer) -> None:
    check_chat_template(tiny_tokenizer)
    with pytest.raises(ValueError, match="has no chat template"):
        check_chat_template(_tokenizer_with(None))
    with pytest.raises(ValueError, match="does not render `tools`"):
        check_chat_template(_tokenizer_with(NO_TOOLS_TEMPLATE))


def test_turn_tail_needs_assistant_last(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="assistant message last"):
        turn_tail(tiny_tokenizer, SNAPSHOTS[2], None)


def test_a_prompt_holding_parallel_tool_responses_streams_as_the_render(tiny_tokenizer) -> None:
    from envace.engines.stream import prompt_stream
    from envace.types import Role

    messages = [*SNAPSHOTS[2], {"role": "user", "content": "Thanks. And now?"}]  # a history with parallel responses
    stream = prompt_stream(tiny_tokenizer, messages, TOOLS)
    assert stream.text == render(tiny_tokenizer, messages, TOOLS, add_generation_prompt=True)
    tool_tokens = [t for t, r in zip(stream.ids, stream.roles) if r == Role.TOOL]
    assert '{"balance": 10}' in tiny_tokenizer.decode(tool_tokens) and '{"balance": 20}' in tiny_tokenizer.decode(
        tool_tokens)
