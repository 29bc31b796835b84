"""BFCL-v4 multi-turn scoring: BFCL's own checker on parsed calls, call strings and episodes.

Each episode is scored as the pinned ``eval_runner`` scores it (``score_episode``): ``multi_turn:force_terminated``
when it answered fewer turns than the entry has, otherwise BFCL's ``multi_turn_checker`` (state check and response
check per turn). That checker ``eval``s call strings, so it only ever gets text that is a call of literal arguments
(``envace.benchmarks.bfcl_env.canonical_call``, ``bfcl_loop.checker_call``); its module-level instance cache is
cleared after every check. ``gold_calls`` gives an entry's ground truth as parsed calls, for ``check_multi_turn``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import uuid
from typing import Any

from envace.benchmarks.bfcl_data import BFCLEntry, require_bfcl
from envace.benchmarks.bfcl_env import PyCall, canonical_call, parse_calls

# ---------------------------------------------------------------------------------------------------------------------
# Scoring with BFCL's checker
# ---------------------------------------------------------------------------------------------------------------------


def check_multi_turn(entry: BFCLEntry, calls: list[list[list[PyCall]]]) -> dict[str, Any]:
    """BFCL's verdict on parsed calls (``calls[turn][step]``, every turn): ``{"valid": bool, ...}``.

    For gold answers and other ``parse_calls`` output; an episode is scored with ``score_episode``.
    """
    if len(calls) != len(entry.ground_truth):
        raise ValueError(f"{entry.id}: {len(calls)} turns of calls for {len(entry.ground_truth)} turns")
    return check_decoded(entry, [[[canonical_call(c) for c in step] for step in turn] for turn in calls])


def check_decoded(entry: BFCLEntry, decoded: list[list[list[str]]]) -> dict[str, Any]:
    """The pinned runner's verdict (``eval_runner._evaluate_single_multi_turn_entry``) on call strings per step.

    ``decoded[turn][step]`` holds one step's call strings (``canonical_call`` or ``bfcl_loop.checker_call``: the
    only forms handed to the checker's ``eval``). Fewer turns than the entry has is BFCL's
    ``multi_turn:force_terminated``; otherwise ``multi_turn_checker`` alone decides (the runner imports
    ``multi_turn_irrelevance_checker`` but never calls it, so calls in a turn whose ground truth is empty, the
    miss_func / miss_param turns, fail the entry only through the state they leave for later turns).
    """
    require_bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    from envace.benchmarks.bfcl_loop import FORCE_TERMINATED

    if len(decoded) != len(entry.ground_truth):
        return {"valid": False, "error_type": FORCE_TERMINATED,
                "error_message": [f"{len(decoded)} turns answered of {len(entry.ground_truth)}: the inference was "
                                  "force-terminated"]}
    truth = [list(turn) for turn in entry.ground_truth]
    model_name = f"envace_{uuid.uuid4().hex}"  # BFCL caches instances in module globals, keyed by model name
    try:
        return checker.multi_turn_checker(decoded, truth, entry.raw, entry.category, model_name)
    finally:
        cache_globals = vars(multi_turn_utils)
        for key in [k for k in cache_globals if k.startswith(model_name)]:
            del cache_globals[key]


def score_episode(entry: BFCLEntry, episode: Any) -> dict[str, Any]:
    """BFCL's verdict on an episode run under ``bfcl_loop.BFCLRules``: its executed steps, per user turn reached.

    An episode that failed (``EpisodeStats.failed``: the environment could not run) is invalid, as an inference
    error is upstream.
    """
    if episode.stats.failed:
        return {"valid": False, "error_type": "multi_turn:inference_error", "error_message": [episode.stats.failure]}
    return check_decoded(entry, episode_calls(entry, episode))


def gold_calls(entry: BFCLEntry) -> list[list[list[PyCall]]]:
    """The ground truth as a rollout: each turn's gold calls in one step (no step for an empty turn)."""
    return [[[c for text in turn for c in parse_calls(text)]] if turn else [] for turn in entry.ground_truth]


# ---------------------------------------------------------------------------------------------------------------------
# Episodes as the checker's call strings
# ---------------------------------------------------------------------------------------------------------------------


def episode_calls(entry: BFCLEntry, episode: Any) -> list[list[list[str]]]:
    """An episode's executed steps as the checker's call strings, ``[turn][step]``, one list per user turn reached.

    Turns past the last one reached are absent (BFCL's force-terminated entries have fewer turns than the entry).
    """
    from envace.benchmarks.bfcl_loop import checker_call, turns_reached

    methods, instances = _call_names(tuple(entry.involved_classes))
    turns: list[list[list[str]]] = [[] for _ in range(min(turns_reached(episode), len(entry.ground_truth)))]
    for turn, calls in episode.call_steps:
        turns[turn].append([checker_call(c, methods, instances) for c in calls])
    return turns


@functools.cache
def _call_names(classes: tuple[str, ...]) -> tuple[dict[str, str], dict[str, None]]:
    """``(method -> instance name, instance names)`` of the classes, as BFCL's executor maps them.

    Any entry id will do: the shape of a call text does not depend on the entry id in the instance names.
    """
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    from envace.benchmarks.bfcl_exec import instance_name

    methods: dict[str, str] = {}
    for name in classes:
        key = instance_name("envace_check", name)
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        methods.update({m: key for m, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
                        if not m.startswith("_")})
    return methods, {key: None for key in set(methods.values())}
