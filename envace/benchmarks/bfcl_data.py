"""BFCL-v4 data: the pinned ``bfcl-eval`` package, its categories, the multi-turn entries and splits, function docs.

``MULTI_TURN`` names the multi-turn categories and ``NOT_RUN`` every category envace does not run, with the reason
(``refuse_not_run``). ``load_multi_turn`` reads a multi-turn category's entries and ground truth (``BFCLEntry``);
``split_ids`` / ``load_split`` give BFCL's entries split into train and eval sides (BFCL ships no split of its
own). ``_json_schema`` converts BFCL's parameter schema dialect to JSON Schema, and ``_function_docs`` reads every
multi-turn function doc; the single-turn categories are loaded by ``envace.benchmarks.bfcl_ast``.

The package is an optional dependency (installed by ``scripts/setup_env.sh``); ``require_bfcl`` names it when it is
missing. Importing ``bfcl_eval``'s configuration writes folders under ``BFCL_PROJECT_ROOT``, which is pointed at a
temporary folder unless the user set it.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
"""The multi-turn categories (each 200 entries in bfcl-eval 2026.3.23)."""

NEEDS_NETWORK = {
    "web_search": "it queries a live search API (SerpAPI) over the network",
    "web_search_base": "it queries a live search API (SerpAPI) over the network",
    "web_search_no_snippet": "it queries a live search API (SerpAPI) over the network",
    "memory_vector": "its memory backend downloads a sentence-embedding model from a hub when imported",
}
"""BFCL-v4 agentic categories that cannot run offline, with the reason (the offline aggregate leaves them out)."""

NOT_RUN = {
    **NEEDS_NETWORK,
    "memory_kv": "each entry questions a memory that BFCL's prerequisite conversations (memory_prereq_conversation) "
                 "write to disk first, run one after another as a chain; envace's harness does not run that chain, "
                 "so it refuses the category rather than score it without the memory",
    "memory_rec_sum": "each entry questions a memory that BFCL's prerequisite conversations "
                      "(memory_prereq_conversation) write to disk first, run one after another as a chain; envace's "
                      "harness does not run that chain, so it refuses the category rather than score it without the "
                      "memory",
    "format_sensitivity": "it is not scored (BFCL's NON_SCORING_CATEGORY) and BFCL runs it only for prompting "
                          "models, re-asking non-live entries with the function docs and answer format written in "
                          "the prompt; envace's policies are function-calling models (tools through the chat "
                          "template), for which BFCL skips it too",
}
"""Every BFCL-v4 category envace does not run, with the reason (none of them is in the offline aggregate)."""


def refuse_not_run(category: str) -> None:
    """Raise the reason a category in ``NOT_RUN`` is not run (nothing for the others).

    Raises:
        ValueError: naming the category and why, and that it is left out of the offline score, not counted as 0.
    """
    if category in NOT_RUN:
        raise ValueError(f"BFCL category '{category}' is not run: {NOT_RUN[category]} (it is left out of the offline "
                         "score, not counted as 0)")

PACKAGE_HINT = "pip install --no-deps bfcl-eval==2026.3.23 (scripts/setup_env.sh installs it with its light needs)"


def require_bfcl() -> Any:
    """Import ``bfcl_eval`` (with ``BFCL_PROJECT_ROOT`` outside site-packages), or say how to install it.

    Raises:
        ImportError: the package is missing, in one line naming the install.
    """
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "envace-bfcl"))
    try:
        return importlib.import_module("bfcl_eval")
    except ImportError as exc:
        raise ImportError(f"BFCL needs the optional package bfcl-eval: {PACKAGE_HINT}") from exc


def _data_dir() -> Path:
    return Path(require_bfcl().__file__).parent / "data"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BFCLEntry:
    """One multi-turn entry with its ground truth.

    Attributes:
        id: e.g. ``multi_turn_base_0``.
        category: one of ``MULTI_TURN``.
        turns: the user messages of each turn (a turn may be empty in ``miss_func``).
        ground_truth: the gold calls of each turn, in BFCL's Python-call syntax.
        raw: the entry as the package ships it (``initial_config``, ``involved_classes``, ``excluded_function``,
            ``missed_function``, ...): BFCL's checker reads it.
    """

    id: str
    category: str
    turns: tuple[tuple[dict[str, Any], ...], ...]
    ground_truth: tuple[tuple[str, ...], ...]
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def involved_classes(self) -> list[str]:
        """The environment classes the entry uses."""
        return list(self.raw["involved_classes"])

    @property
    def long_context(self) -> bool:
        """The long-context variant of the environments (BFCL's own rule)."""
        return "long_context" in self.category


@cache
def _category_files(category: str) -> tuple[tuple[dict[str, Any], ...], dict[str, list[list[str]]]]:
    data = _data_dir()
    entries = tuple(_jsonl(data / f"BFCL_v4_{category}.json"))
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return entries, answers


def load_multi_turn(category: str, ids: list[str] | None = None, limit: int | None = None) -> list[BFCLEntry]:
    """The entries of a multi-turn category (all, the given ``ids``, or the first ``limit``).

    Raises:
        ValueError: an unknown category or id (the valid ones are listed).
        ImportError: bfcl-eval is not installed.
    """
    refuse_not_run(category)
    if category not in MULTI_TURN:
        raise ValueError(f"unknown BFCL multi-turn category '{category}'; valid: {', '.join(MULTI_TURN)}")
    raws, answers = _category_files(category)
    by_id = {raw["id"]: raw for raw in raws}
    if ids is not None:
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            sample = ", ".join(list(by_id)[:3])
            raise ValueError(f"unknown {category} id(s) {unknown}; valid ids are {category}_0 to "
                             f"{category}_{len(by_id) - 1} (e.g. {sample})")
        raws = tuple(by_id[i] for i in ids)
    raws = raws[:limit] if limit is not None else raws
    return [
        BFCLEntry(raw["id"], category, tuple(tuple(t) for t in raw["question"]),
                  tuple(tuple(calls) for calls in answers[raw["id"]]), raw)
        for raw in raws
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------------------------------

EVAL_EVERY = 4
"""Entry ``<category>_<n>`` with ``n % EVAL_EVERY == 0`` is held out for evaluation (50 of each 200); the rest
(150) may be trained on. BFCL ships no split of its own; a policy trained on the train split is scored on the eval
split (``split_ids``), never on all 200."""


def split_ids(category: str) -> tuple[list[str], list[str]]:
    """``(train ids, eval ids)`` of a category."""
    ids = [entry.id for entry in load_multi_turn(category)]
    held_out = [i for i in ids if int(i.rsplit("_", 1)[1]) % EVAL_EVERY == 0]
    return [i for i in ids if i not in held_out], held_out


SPLITS = ("all", "train", "eval")
"""Which entries of a multi-turn category: all 200 (the benchmark's number), or one side of ``split_ids``."""


def load_split(category: str, split: str = "all", limit: int | None = None) -> list[BFCLEntry]:
    """The entries of ``split`` (first ``limit``): score a policy trained on the train split on ``eval`` only.

    Raises:
        ValueError: an unknown split or category (the valid ones are named).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown BFCL split '{split}'; valid: {', '.join(SPLITS)}")
    if split == "all":
        return load_multi_turn(category, limit=limit)
    train, held_out = split_ids(category)
    ids = train if split == "train" else held_out
    return load_multi_turn(category, ids=ids[:limit] if limit is not None else ids)


# ---------------------------------------------------------------------------------------------------------------------
# Function docs
# ---------------------------------------------------------------------------------------------------------------------

_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def _json_schema(node: Any) -> Any:
    """BFCL's parameter schema dialect (``dict``, ``float``, ``tuple``, ``any``) as JSON Schema."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str) and value in _TYPES:
            if _TYPES[value] is not None:
                out[key] = _TYPES[value]
        elif key in ("properties",) and isinstance(value, dict):
            out[key] = {name: _json_schema(schema) for name, schema in value.items()}
        else:
            out[key] = _json_schema(value)
    return out


@cache
def _function_docs() -> dict[str, dict[str, Any]]:
    """Every multi-turn function doc, by name."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    docs = {}
    for module in CLASS_FILE_PATH_MAPPING.values():
        path = _data_dir() / "multi_turn_func_doc" / f"{module.rsplit('.', 1)[-1]}.json"
        if path.is_file():
            docs.update({doc["name"]: doc for doc in _jsonl(path)})
    return docs
