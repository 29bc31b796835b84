"""Chat-template rendering for token-in/token-out rollouts.

This module owns every call to ``apply_chat_template`` made by the rollout runner. A prompt is rendered once; after
each generated turn the runner appends only the *text delta* the template adds for the new messages (tool responses
and the next generation prompt), so generated tokens are never re-tokenised. That is only sound when the template is
prefix-preserving: rendering a conversation must start with the rendering of every earlier snapshot of it. The checks
here reject templates that are not (for example Qwen3's, which drops earlier reasoning).

Transcript conventions: an assistant turn is stored as ``{"role": "assistant", "content": <raw generated text>}``
(tool calls stay inside the text as ``<tool_call>`` blocks, no ``tool_calls`` field), so rendering the transcript
reproduces the generated text exactly; a tool response is ``{"role": "tool", "content": <text>}``.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from envace.errors import UserError

Message = dict[str, Any]

_PROBE_TOOL_NAME = "envace_probe_tool"
_PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL_NAME,
            "description": "Probe tool used to check that the chat template renders tools.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
]


class TemplateError(UserError, ValueError):
    """The chat template cannot be used for incremental (token-in/token-out) rendering."""


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
) -> str:
    """Render ``messages`` with the tokenizer's chat template.

    Args:
        tokenizer: tokenizer holding the chat template.
        messages: the conversation.
        tools: tool schemas (OpenAI function format); passed to the template only when non-empty.
        add_generation_prompt: append the header that opens the next assistant turn.

    Returns:
        The rendered text (not tokenised).
    """
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def render_delta(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    new_messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """Text the template adds when ``new_messages`` are appended to ``messages``.

    The delta is ``render(messages + new_messages, add_generation_prompt)`` minus ``render(messages,
    add_generation_prompt=False)``. It therefore starts *after* the template's complete rendering of ``messages``:
    when ``messages`` ends with an assistant turn, the text that closes that turn (for ChatML ``<|im_end|>\\n``) is
    not part of the delta; see ``turn_tail``.

    Args:
        tokenizer: tokenizer holding the chat template.
        messages: the conversation rendered so far.
        new_messages: messages appended to it (e.g. the tool responses of one turn).
        tools: tool schemas, as for ``render``.
        add_generation_prompt: end the delta with the header of the next assistant turn.

    Returns:
        The delta text.

    Raises:
        TemplateError: the shorter rendering is not a prefix of the longer one.
    """
    before = render(tokenizer, messages, tools, add_generation_prompt=False)
    after = render(tokenizer, messages + new_messages, tools, add_generation_prompt=add_generation_prompt)
    if not after.startswith(before):
        raise TemplateError(
            f"chat template is not prefix-preserving: rendering {len(messages)} messages is not a prefix of rendering "
            f"them plus {len(new_messages)} new message(s) (first difference at character "
            f"{_first_difference(before, after)}); token-in/token-out rollouts need a prefix-preserving template"
        )
    return after[len(before) :]


def turn_tail(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
) -> str:
    """Text the template writes after the content of the final assistant message of ``messages``.

    For ChatML templates this is ``<|im_end|>\\n``. A runner that stopped generating at the eos token holds the
    prompt plus the generated text; appending this tail (minus an eos it already generated) and then
    ``render_delta`` reproduces the full rendering.

    Args:
        tokenizer: tokenizer holding the chat template.
        messages: a conversation whose last message is ``{"role": "assistant", "content": <text>}``.
        tools: tool schemas, as for ``render``.

    Returns:
        The closing text of the final assistant turn.

    Raises:
        ValueError: the last message is not an assistant message.
        TemplateError: the rendering does not contain the prompt followed by the assistant content verbatim.
    """
    last = messages[-1]
    if last["role"] != "assistant":
        raise ValueError(f"turn_tail needs an assistant message last, got role {last['role']!r}")
    head = render(tokenizer, messages[:-1], tools, add_generation_prompt=True) + last["content"]
    full = render(tokenizer, messages, tools, add_generation_prompt=False)
    if not full.startswith(head):
        raise TemplateError(
            "chat template does not render the assistant content verbatim after the generation prompt "
            f"(first difference at character {_first_difference(head, full)})"
        )
    return full[len(head) :]


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` without BOS/EOS insertion (chat templates already write every special token).

    A lone surrogate (a tool that echoes a ``\\udXXX`` JSON escape back) has no UTF-8 form, and tokenizers refuse
    it: it is written as its escape text (``\\udfff``), which is what the model's own JSON said.
    """
    return tokenizer.encode(encodable(text), add_special_tokens=False)


def encodable(text: str) -> str:
    """``text`` with every lone surrogate written as its backslash escape (the text unchanged otherwise)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """Exact text of ``ids``: special tokens kept, no clean-up of spaces (so streams and renders stay comparable)."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_prefix_preserving(
    tokenizer: PreTrainedTokenizerBase,
    messages_sequence: list[list[Message]],
    tools: list[dict[str, Any]] | None,
) -> None:
    """Check that each conversation snapshot renders as a prefix of the next one.

    Args:
        tokenizer: tokenizer holding the chat template.
        messages_sequence: growing snapshots of one conversation (each extends the previous one).
        tools: tool schemas, as for ``render``.

    Raises:
        ValueError: a snapshot does not extend the previous one.
        TemplateError: naming the index of the first message whose addition breaks prefix preservation.
    """
    for prev, cur in zip(messages_sequence, messages_sequence[1:]):
        if cur[: len(prev)] != prev:
            raise ValueError(f"snapshot with {len(cur)} messages does not extend the one with {len(prev)} messages")
        before = render(tokenizer, prev, tools, add_generation_prompt=False)
        after = render(tokenizer, cur, tools, add_generation_prompt=False)
        if not after.startswith(before):
            raise TemplateError(
                f"chat template is not prefix-preserving at message {len(prev)} (role {cur[len(prev)]['role']!r}): "
                f"adding it changes the rendering of earlier messages at character {_first_difference(before, after)}"
            )


def check_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Check that the tokenizer has a chat template that renders tool schemas.

    Args:
        tokenizer: tokenizer to check.

    Raises:
        ValueError: no chat template, or a template that ignores ``tools``.
    """
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template; envace renders every prompt with it"
        )
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Hi."}]
    text = render(tokenizer, messages, _PROBE_TOOLS, add_generation_prompt=True)
    if _PROBE_TOOL_NAME not in text:
        raise ValueError(
            f"chat template of tokenizer {tokenizer.name_or_path!r} does not render `tools`; envace needs a "
            "tool-calling template: set the policy's chat_template to the packaged 'chatml-tools' or to a jinja file "
            "(e.g. --model.policy.init_args.chat_template=chatml-tools)"
        )


def _first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (``min(len)`` when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
