"""Shared pieces of the benchmark reports (the training callback and ``benchmarks/evaluate_policy.py``).

Score keys, the routing of BFCL categories to their harnesses, the labels every report carries, and helper models
described in words.
"""

from __future__ import annotations

from typing import Any

BFCL_COMPONENTS = ("non_live", "live", "irrelevance", "multi_turn")
"""The components of BFCL's offline aggregate (``envace.benchmarks.bfcl_ast.offline_aggregate``)."""

BFCL_AGENTIC_NOTE = ("not BFCL-v4 overall: the agentic 40% is left out (web search and vector memory need the network; "
                     "key-value and summary memory need BFCL's prerequisite-conversation chain, not run)")

ORDER_MATCH_NOTE = "UNOFFICIAL proxy (final orders vs required ones); VitaBench's official score is the rubric judge"


def bfcl_key(category: str) -> str:
    """The score key of a BFCL category (``irrelevance`` is ``bfcl_non_live_irrelevance``: see the module doc)."""
    return "bfcl_non_live_irrelevance" if category == "irrelevance" else f"bfcl_{category}"


def split_bfcl_categories(categories: list[str]) -> tuple[list[str], list[str]]:
    """Route BFCL categories to their harnesses: ``(multi-turn, single-turn)``, each in the given order.

    Raises:
        ValueError: a repeated or unknown category (the valid ones are listed), or one envace does not run
            (``bfcl_data.NOT_RUN``, with the reason), each naming ``bfcl_categories``.
    """
    from envace.benchmarks import bfcl_ast, bfcl_data

    multi, single = [], []
    for category in categories:
        if category in multi or category in single:
            raise ValueError(f"bfcl_categories: '{category}' is listed twice")
        if category in bfcl_data.MULTI_TURN:
            multi.append(category)
        elif category in bfcl_ast.SINGLE_TURN:
            single.append(category)
        elif category in bfcl_data.NOT_RUN:
            try:
                bfcl_data.refuse_not_run(category)
            except ValueError as exc:
                raise ValueError(f"bfcl_categories: {exc}") from exc
        else:
            raise ValueError(f"bfcl_categories: unknown BFCL category '{category}'; valid: "
                             f"{', '.join(bfcl_data.MULTI_TURN + bfcl_ast.SINGLE_TURN)}")
    return multi, single


def describe_model(model: Any) -> str:
    """A helper model in words, for reports: its policy's class and checkpoint (or settings), or ``none``."""
    if model is None:
        return "none"
    policy = model.policy
    if policy is None:
        return f"ChatModel over {type(model.engine).__name__}"
    path = getattr(policy, "name_or_path", None)
    if path is not None:
        return f"{type(policy).__name__}({path})"
    settings = ", ".join(f"{k}={v}" for k, v in vars(policy).items() if isinstance(v, bool | int | float | str))
    return f"{type(policy).__name__}({settings})"
