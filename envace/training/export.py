"""A policy written in Hugging Face format, as ``envace fit`` exports it and ``envace export`` (``envace.cli.export``).

A folder holds the weights, the tokenizer and ``envace_rehearse.json``, the rehearse prompt settings the policy was
trained with (``envace.worlds.rehearse.save_rehearse_format``), so a later stage refuses a policy prompted otherwise.
A LoRA policy is written twice: ``adapter`` (``peft``'s format) and ``merged``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from peft import PeftModel

from envace.worlds.rehearse import RehearseWorld, save_rehearse_format


def export(model: Any, tokenizer: Any, out: str | Path, merged: bool = True,
           prompter: RehearseWorld | None = None) -> dict[str, str]:
    """Write ``<out>/adapter`` (LoRA policies) and ``<out>/merged``; returns what was written where.

    With ``prompter`` (the module's rehearse prompts), each folder records its format (``save_rehearse_format``).
    """
    out = Path(out)
    folders = {}
    if isinstance(model, PeftModel):
        folders["adapter"] = (model, out / "adapter")
    if merged:
        folders["merged"] = (copy.deepcopy(model).merge_and_unload() if isinstance(model, PeftModel) else model,
                             out / "merged")
    for weights, where in folders.values():
        save_policy(weights, tokenizer, where, prompter)
    return {kind: str(where) for kind, (_, where) in folders.items()}


def save_policy(model: Any, tokenizer: Any, where: str | Path, prompter: RehearseWorld | None = None) -> None:
    """Write one policy folder: weights and tokenizer in Hugging Face format, and the rehearse prompt format.

    The format (``save_rehearse_format``) is written with ``prompter`` only. ``envace fit``'s export writes the same.
    """
    model.save_pretrained(where)
    tokenizer.save_pretrained(where)
    if prompter is not None:
        save_rehearse_format(prompter, where)
