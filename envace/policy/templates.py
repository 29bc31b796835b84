"""Chat templates a policy can be given instead of its tokenizer's own: packaged ones by name, or a user's jinja file.

A model whose template ignores ``tools`` (SmolLM2's plain ChatML, many base models) cannot be trained as an agent
with it: envace renders every prompt with the tokenizer's template, and the act role must see the tool schemas.
``HFPolicy(chat_template=...)`` replaces the template after loading the tokenizer; the exported tokenizer keeps it.

Packaged:

- ``chatml-tools``: ChatML with tools in the system prompt (Qwen2.5's wording: the schemas inside ``<tools>``,
  calls as ``<tool_call>`` JSON blocks, responses as ``<tool_response>`` blocks in a user turn), and
  ``{% generation %}`` marks on assistant turns. It is prefix-preserving, so every rollout is one row per episode.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from envace.errors import UserError

PACKAGED_TEMPLATES = {"chatml-tools": "chatml_tools.jinja"}


class ChatTemplateError(UserError, ValueError):
    """A chat template that cannot be loaded (an unknown name, a missing or unreadable file)."""


def load_chat_template(spec: str) -> str:
    """The jinja text of ``spec``: a packaged template's name (``PACKAGED_TEMPLATES``) or a path to a jinja file.

    Raises:
        ChatTemplateError: ``spec`` is neither a packaged name nor a readable, non-empty file.
    """
    if spec in PACKAGED_TEMPLATES:
        return resources.files("envace.templates").joinpath(PACKAGED_TEMPLATES[spec]).read_text(encoding="utf-8")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ChatTemplateError(f"chat_template {spec!r}: not a packaged template "
                                f"({', '.join(sorted(PACKAGED_TEMPLATES))}) and no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ChatTemplateError(f"chat_template {spec}: cannot read it: {err}") from err
    if not text.strip():
        raise ChatTemplateError(f"chat_template {spec}: the file is empty")
    return text
