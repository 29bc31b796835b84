"""Token streams: token ids with per-token roles and loss masks, built while rendering and generating.

A stream is only ever extended: prompt segments are rendered once with the tokenizer's chat template and encoded;
generated ids are appended exactly as generated; observations (tool responses) are appended as the encoded text
delta between the template's render of the longer conversation and the text the stream already holds. Nothing is
re-tokenised, so the ids the policy generated are the ids it is trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase

from envace.policy.chat import TemplateError, encode, render
from envace.types import Role


class RenderDiverged(TemplateError):
    """The template's render of the longer conversation rewrote text already in the stream.

    Attributes:
        at: index of the first character of the stream's text that the new render changed.
    """

    def __init__(self, at: int) -> None:
        super().__init__(
            "the chat template is not prefix-preserving: rendering the longer conversation changed text already in "
            f"the token stream (at character {at})"
        )
        self.at = at

MESSAGE_ROLES = {"system": Role.SYSTEM, "user": Role.USER, "tool": Role.TOOL}


@dataclass
class TokenStream:
    """A growing token sequence.

    Attributes:
        ids: token ids.
        roles: one ``Role`` value per token.
        mask: 1 on tokens trained in this stream's row.
        text: the text the ids decode to (kept to compute template deltas without decoding).
        engine_logps: one per token: the generating engine's log-prob of a generated token, NaN elsewhere (prompts,
            and engines that report none).
    """

    ids: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    text: str = ""
    engine_logps: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.engine_logps:
            self.engine_logps = [math.nan] * len(self.ids)
        elif len(self.engine_logps) != len(self.ids):
            raise ValueError(f"TokenStream: {len(self.engine_logps)} log-probs for {len(self.ids)} tokens")

    def extend(self, ids: list[int], role: Role, text: str, *, trained: bool = False,
               logps: list[float] | None = None) -> None:
        """Append ``ids`` (which decode to ``text``) with one role, and the engine's log-probs of them if known."""
        if logps is not None and len(logps) != len(ids):
            raise ValueError(f"TokenStream.extend: {len(logps)} log-probs for {len(ids)} tokens")
        self.ids.extend(ids)
        self.roles.extend([int(role)] * len(ids))
        self.mask.extend([int(trained)] * len(ids))
        self.engine_logps.extend(logps if logps is not None else [math.nan] * len(ids))
        self.text += text

    def __len__(self) -> int:
        return len(self.ids)


def prompt_stream(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> TokenStream:
    """Render ``messages`` plus the generation prompt, message by message, so each token gets its message's role.

    Consecutive tool messages (the responses to parallel calls) are one segment: templates such as Qwen's wrap them
    in one block that closes only after the last one, so the render after the first is not a prefix of the whole.
    A prefix the template refuses to render (Llama 3.1's needs a user message to put the tools in) joins the next
    segment, with that segment's role.
    """
    stream = TokenStream()
    for i in range(1, len(messages) + 1):
        if i < len(messages) and messages[i - 1]["role"] == messages[i]["role"] == "tool":
            continue
        try:
            text = render(tokenizer, messages[:i], tools, add_generation_prompt=False)
        except jinja2.TemplateError:
            if i == len(messages):
                raise
            continue  # the template refuses this prefix (Llama 3.1 puts tools in the first user message): merge it
        _append_delta(stream, tokenizer, text, MESSAGE_ROLES.get(messages[i - 1]["role"], Role.SYSTEM))
    _append_delta(stream, tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True), Role.SYSTEM)
    return stream


def context_stream(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> TokenStream:
    """``prompt_stream``, or, when the template rewrites earlier messages as later ones arrive, one untrained segment.

    A template such as Qwen3's renders an assistant turn's reasoning only after the last user message, so the
    message-by-message render of a conversation with several user turns is not a prefix chain; its tokens then get
    the role ``Role.SYSTEM`` (context) as a whole. The ids are always the encoding of the template's render.
    """
    try:
        return prompt_stream(tokenizer, messages, tools)
    except RenderDiverged:
        stream = TokenStream()
        _append_delta(stream, tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True), Role.SYSTEM)
        return stream


def append_messages(
    stream: TokenStream,
    tokenizer: PreTrainedTokenizerBase,
    transcript: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    role: Role,
) -> None:
    """Append the template's rendering of the transcript's new tail (plus the generation prompt) to ``stream``.

    ``transcript`` is the whole conversation including the new messages; assistant messages in it carry the raw
    generated text, so the stream's text is a prefix of the render.

    Raises:
        RenderDiverged: the template's render rewrote text already in the stream (not prefix-preserving here).
    """
    _append_delta(stream, tokenizer, render(tokenizer, transcript, tools, add_generation_prompt=True), role)


def _append_delta(stream: TokenStream, tokenizer: PreTrainedTokenizerBase, full: str, role: Role) -> None:
    if not full.startswith(stream.text):
        raise RenderDiverged(_first_difference(stream.text, full))
    delta = full[len(stream.text) :]
    if delta:
        stream.extend(encode(tokenizer, delta), role, delta)


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
