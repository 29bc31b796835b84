"""Rehearsal fidelity: how faithful the policy's rehearsed tool responses are to the recorded real ones.

This module owns the fidelity measurement of ``docs/benchmarks.md`` (rehearsal fidelity), teacher-forced on a task
split's reference calls: the canonicalisation κ of a response, the per-probe scores (exact match, leaf F1, key match,
parse rate, error agreement), their accumulation as a torchmetrics ``Metric`` (summed across ranks), a per-tool
breakdown, and the probes themselves (each reference call with the REAL prefix as history, rehearsed greedily in one
batched generation). Leaf F1 is the one of the rehearse reward's prediction-error shaping
(``envace.rewards.shaping.leaf_f1``), so the shaping and this metric measure the same thing.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from envace.data.task_reference import reference_steps
from envace.engines.base import Engine, SamplingParams, sessions
from envace.roles.compare import ProbeScore, score_reply
from envace.types import Task
from envace.worlds.base import ToolReply, ToolRequest
from envace.worlds.rehearse import RehearseWorld

METRIC_NAMES = {
    "exact_match": "exact_match",
    "leaf_f1": "leaf_f1",
    "key_match": "key_match",
    "parse_ok": "parse_rate",
    "error_agree": "error_agreement",
}
"""``ProbeScore`` field -> name of its mean in ``RehearsalFidelity.compute`` and ``per_tool``."""

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
