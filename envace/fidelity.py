"""Rehearsal fidelity: how faithful the policy's rehearsed tool responses are to the recorded real ones.

This module owns the fidelity measurement of ``docs/benchmarks.md`` (rehearsal fidelity), teacher-forced on a task
split's reference calls: the canonicalisation κ of a response, the per-probe scores (exact match, leaf F1, key match,
parse rate, error agreement), their accumulation as a torchmetrics ``Metric`` (summed across ranks), a per-tool
breakdown, and the probes themselves (each reference call with the REAL prefix as history, rehearsed greedily in one
batched generation). Leaf F1 is the one of the rehearse reward's prediction-error shaping
(``envace.rewards.shaping.leaf_f1``), so the shaping and this metric measure the same thing.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from envace.data.tasks import reference_steps
from envace.rewards.shaping import leaf_f1
from envace.roles.parsing import json_type_name
from envace.rollout.engine import Engine, SamplingParams, sessions
from envace.types import Task, canonical_json, is_error_value
from envace.worlds.base import ToolReply, ToolRequest
from envace.worlds.rehearse import RehearseWorld

SIGNIFICANT_DIGITS = 4
"""Floats are compared rounded to this many significant digits."""

METRIC_NAMES = {
    "exact_match": "exact_match",
    "leaf_f1": "leaf_f1",
    "key_match": "key_match",
    "parse_ok": "parse_rate",
    "error_agree": "error_agreement",
}
"""``ProbeScore`` field -> name of its mean in ``RehearsalFidelity.compute`` and ``per_tool``."""

# ---------------------------------------------------------------------------------------------------------------------
# Canonicalisation
# ---------------------------------------------------------------------------------------------------------------------


def _parse(text: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` is JSON, else ``(False, text.strip())``."""
    try:
        return True, json.loads(text)
    except json.JSONDecodeError:
        return False, text.strip()


def _round_float(value: float) -> float | int:
    """``value`` rounded to ``SIGNIFICANT_DIGITS`` significant digits; a whole result becomes an int."""
    if value.is_integer():
        return int(value)  # exact: never round a whole number (12345.0 stays 12345)
    rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    return int(rounded) if rounded.is_integer() else rounded


def _canonical_value(value: Any) -> Any:
    """κ of a decoded JSON value: keys sorted, floats rounded, whole floats as ints."""
    if isinstance(value, float):
        return _round_float(value)
    if isinstance(value, dict):
        return {key: _canonical_value(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_canonical_value(item) for item in value]
    return value


def canonical(text: str) -> Any:
    """κ: the canonical form of a tool response text.

    The decoded JSON value when ``text`` is JSON (keys sorted, floats rounded to ``SIGNIFICANT_DIGITS`` significant
    digits, whole floats as ints), else the stripped string. Compare canonical forms with ``canonical_text``.

    Args:
        text: a tool response (JSON or free text).
    """
    return _canonical_value(_parse(text)[1])


def canonical_text(text: str) -> str:
    """The canonical JSON text of ``canonical(text)``: two responses are an exact match when these are equal."""
    return canonical_json(canonical(text))


# ---------------------------------------------------------------------------------------------------------------------
# Per-probe scores
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeScore:
    """The fidelity scores of one rehearsed response against the real one (each in [0, 1]).

    Attributes:
        exact_match: 1 when the canonical forms are equal.
        leaf_f1: F1 of the ``(path, value)`` leaf sets of the canonical forms; token F1 over whitespace tokens when
            both are strings (free text).
        key_match: 1 when both are objects with the same top-level keys, or neither is an object and both have the
            same JSON type.
        parse_ok: 1 when the prediction parses as JSON or the real response does not.
        error_agree: 1 when both or neither are errors (``is_error``).
    """

    exact_match: float
    leaf_f1: float
    key_match: float
    parse_ok: float
    error_agree: float


def is_error(text: str) -> bool:
    """Whether a tool response reports an error.

    An error is a JSON object whose ``"error"`` value is truthy (``envace.types.is_error_value``: a tool that raised,
    or one that returned an error object), or a string (free text, a JSON string, or the ``{"result": text}``
    wrapper a rehearsal of free text takes) starting with ``"Error"``.

    Args:
        text: a tool response.
    """
    value = canonical(text)
    if isinstance(value, dict) and list(value) == ["result"]:
        value = value["result"]
    if isinstance(value, dict):
        return is_error_value(value)
    return isinstance(value, str) and value.startswith("Error")


def token_f1(predicted: str, reference: str) -> float:
    """F1 of the multisets of whitespace tokens: ``2 * |common| / (|predicted| + |reference|)``; two blanks give 1.

    Args:
        predicted: the rehearsed text.
        reference: the real text.
    """
    pred, ref = Counter(predicted.split()), Counter(reference.split())
    total = sum(pred.values()) + sum(ref.values())
    if total == 0:
        return 1.0
    return 2 * sum((pred & ref).values()) / total


def _key_match(predicted: Any, real: Any) -> bool:
    if isinstance(predicted, dict) and isinstance(real, dict):
        return set(predicted) == set(real)
    return json_type_name(predicted) == json_type_name(real)


def score_response(predicted: str, real: str) -> ProbeScore:
    """Score one rehearsed response against the real one (see ``ProbeScore``).

    Args:
        predicted: the rehearsed response text.
        real: the real (recorded) response text.
    """
    pred, ref = canonical(predicted), canonical(real)
    f1 = token_f1(pred, ref) if isinstance(pred, str) and isinstance(ref, str) else leaf_f1(pred, ref)
    parse_ok = _parse(predicted)[0] or not _parse(real)[0]
    return ProbeScore(
        exact_match=float(canonical_json(pred) == canonical_json(ref)),
        leaf_f1=f1,
        key_match=float(_key_match(pred, ref)),
        parse_ok=float(parse_ok),
        error_agree=float(is_error(predicted) == is_error(real)),
    )


def broken_contract_score(error_content: str, real: str) -> ProbeScore:
    """The score of a rehearsal that broke the output contract: 0 everywhere but error agreement.

    Args:
        error_content: the error message substituted for the broken rehearsal.
        real: the real response text.
    """
    return ProbeScore(0.0, 0.0, 0.0, 0.0, float(is_error(error_content) == is_error(real)))


# ---------------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------------


class RehearsalFidelity(Metric):
    """Means of the probe scores over every probe seen (on every rank: the sums and the count are summed).

    ``compute`` returns ``exact_match``, ``leaf_f1``, ``key_match``, ``parse_rate`` and ``error_agreement`` (means,
    NaN before any probe) and ``probes`` (the count).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    exact_match: Tensor
    leaf_f1: Tensor
    key_match: Tensor
    parse_ok: Tensor
    error_agree: Tensor
    probes: Tensor

    def __init__(self) -> None:
        super().__init__()
        for name in (*METRIC_NAMES, "probes"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: list[ProbeScore]) -> None:
        """Add the scores of a batch of probes.

        Args:
            scores: one score per probe.
        """
        totals = _totals(scores)
        self.exact_match += totals["exact_match"]
        self.leaf_f1 += totals["leaf_f1"]
        self.key_match += totals["key_match"]
        self.parse_ok += totals["parse_ok"]
        self.error_agree += totals["error_agree"]
        self.probes += len(scores)

    def compute(self) -> dict[str, Tensor]:
        """The means and the probe count."""
        return {
            "exact_match": self.exact_match / self.probes,
            "leaf_f1": self.leaf_f1 / self.probes,
            "key_match": self.key_match / self.probes,
            "parse_rate": self.parse_ok / self.probes,
            "error_agreement": self.error_agree / self.probes,
            "probes": self.probes.clone(),
        }


class LiveFidelity(nn.Module):
    """Running fidelity of live probes, over all tools and per tool (one ``RehearsalFidelity`` each).

    On several ranks, ``declare`` every tool name first (the same on every rank): ``compute`` syncs each metric, and
    the ranks must compute the same metrics in the same order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.overall = RehearsalFidelity()
        self.tools = nn.ModuleDict()
        self._names: dict[str, str] = {}  # module key -> tool name

    def declare(self, tools: list[str]) -> None:
        """Create the metrics of ``tools`` (idempotent)."""
        for tool in tools:
            key = _module_key(tool)
            if key not in self.tools:
                self.tools[key] = RehearsalFidelity().to(self.overall.device)
                self._names[key] = tool

    def update(self, scores: list[ProbeScore], tools: list[str]) -> None:
        """Add probe scores, each with the name of its tool.

        Raises:
            ValueError: ``scores`` and ``tools`` differ in length.
        """
        if len(scores) != len(tools):
            raise ValueError(f"LiveFidelity.update: {len(scores)} scores but {len(tools)} tool names")
        self.declare(sorted(set(tools)))
        self.overall.update(scores)
        groups: dict[str, list[ProbeScore]] = defaultdict(list)
        for score, tool in zip(scores, tools):
            groups[tool].append(score)
        for tool, group in groups.items():
            self.tools[_module_key(tool)].update(group)

    def compute_and_reset(self) -> dict[str, float]:
        """The means since the last call, then start a new window.

        Keys: ``<metric>`` over all tools and ``<tool>/<metric>`` per tool (only what has probes), with ``probes``
        (the count) for each.
        """
        out: dict[str, float] = {}
        for prefix, metric in [("", self.overall)] + [(self._names[k] + "/", m) for k, m in sorted(self.tools.items())]:
            with warnings.catch_warnings():  # a window without probes is normal (torchmetrics warns on it)
                warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
                values = metric.compute()
            metric.reset()
            if values["probes"] > 0:
                out.update({prefix + name: float(value) for name, value in values.items()})
        return out


def _module_key(tool: str) -> str:
    """A module-dict key for a tool name (which may hold dots)."""
    return "t_" + tool.replace(".", "__dot__")


def _totals(scores: list[ProbeScore]) -> dict[str, float]:
    """Sum of each ``ProbeScore`` field over ``scores``, keyed by field name."""
    totals = dict.fromkeys(METRIC_NAMES, 0.0)
    for score in scores:
        for name, value in asdict(score).items():
            totals[name] += value
    return totals


def summarize(scores: list[ProbeScore]) -> dict[str, float]:
    """The means of ``scores`` under ``METRIC_NAMES`` plus ``probes`` (the count); means are NaN when empty.

    Args:
        scores: probe scores.
    """
    count = len(scores)
    out = {METRIC_NAMES[name]: total / count if count else math.nan for name, total in _totals(scores).items()}
    out["probes"] = float(count)
    return out


def per_tool(scores: list[ProbeScore], tools: list[str]) -> dict[str, dict[str, float]]:
    """The ``summarize`` of each tool's probes, keyed by tool name (in order of first appearance).

    Args:
        scores: probe scores.
        tools: the tool name of each probe, parallel to ``scores``.

    Raises:
        ValueError: ``scores`` and ``tools`` differ in length.
    """
    if len(scores) != len(tools):
        raise ValueError(f"per_tool: {len(scores)} scores but {len(tools)} tool names")
    groups: dict[str, list[ProbeScore]] = defaultdict(list)
    for score, tool in zip(scores, tools):
        groups[tool].append(score)
    return {tool: summarize(group) for tool, group in groups.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Probe:
    """One teacher-forced fidelity probe: a reference call (with the real prefix as history) and its real response.

    Attributes:
        request: the call as the rehearse role gets it.
        real: the recorded real response text.
    """

    request: ToolRequest
    real: str

    @property
    def tool(self) -> str:
        """The called tool's name."""
        return self.request.call.name


def reference_probes(tasks: list[Task], max_per_task: int | None = None) -> list[Probe]:
    """One probe per reference call of each task, history = the task's chat plus the REAL reference prefix.

    Args:
        tasks: the tasks; a task's position is its probes' ``episode_index`` and ``group_index``.
        max_per_task: most probes per task (its first reference calls); None for all.

    Raises:
        ValueError: ``max_per_task`` is negative.
    """
    if max_per_task is not None and max_per_task < 0:
        raise ValueError(f"max_per_task must be >= 0 or None, got {max_per_task}")
    return [
        Probe(ToolRequest(task, call, history, None, index, index), real)
        for index, task in enumerate(tasks)
        for call, real, history in reference_steps(task)[:max_per_task]
    ]


def rehearsal_target(real: str) -> str:
    """The form a faithful rehearsal of ``real`` takes: the JSON re-dumped, free text wrapped as ``{"result": ...}``.

    The same target the world-model alignment rows train towards (``envace.alignment``).

    Args:
        real: the recorded real response text.
    """
    ok, value = _parse(real)
    return json.dumps(value if ok else {"result": real}, ensure_ascii=False)


def score_reply(reply: ToolReply, real: str) -> ProbeScore:
    """Score a rehearse world's reply against the real response ``real`` (see ``rehearse_probes``).

    Args:
        reply: the rehearsed reply.
        real: the real response text.
    """
    target = rehearsal_target(real)
    if reply.parse_error:
        return broken_contract_score(reply.content, target)
    return score_response(reply.content, target)


def rehearse_probes(probes: list[Probe], world: RehearseWorld, engine: Engine, max_new_tokens: int) -> list[ProbeScore]:
    """Rehearse every probe greedily in one batched generation and score each reply against its real response.

    A reply is scored against ``rehearsal_target(probe.real)``; one whose rehearsal broke the output contract scores
    0 on everything but error agreement, computed on its substituted error content.

    Args:
        probes: the probes.
        world: the (bound) rehearse world that renders the prompts and parses the outputs.
        engine: generates with the policy.
        max_new_tokens: generation budget of one rehearsal.
    """
    replies = rehearse_replies(probes, world, engine, max_new_tokens)
    return [score_reply(reply, probe.real) for reply, probe in zip(replies, probes, strict=True)]


def rehearse_replies(probes: list[Probe], world: RehearseWorld, engine: Engine, max_new_tokens: int
                     ) -> list[ToolReply]:
    """Rehearse every probe greedily in one batched generation: the replies, in the probes' order (unscored).

    Args:
        probes: the probes.
        world: the (bound) rehearse world that renders the prompts and parses the outputs.
        engine: generates with the policy.
        max_new_tokens: generation budget of one rehearsal.
    """
    if not probes:
        return []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    with sessions(engine):  # a caching engine computes the probes' shared prompt prefixes once
        return world.respond([probe.request for probe in probes], engine, params)
