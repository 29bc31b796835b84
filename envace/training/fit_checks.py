"""What ``EnvACEModule`` checks before training starts: the run's peak memory workload and the fidelity gate.

``rl_workload`` bounds the token sizes of a role-wise GRPO run's peak from its config (``PolicyModule.check_memory``
compares their estimate with the memory there is); ``check_fidelity_gate`` refuses to start rehearsal RL from a policy
whose rehearsals match too few of the recorded real responses.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from envace.engines.base import Engine
from envace.rollout.config import RolloutConfig
from envace.training.memory import Workload
from envace.training.update import GRPOConfig
from envace.types import Task
from envace.world_model.fidelity import reference_probes, rehearse_probes
from envace.worlds.rehearse import RehearseWorld


def rl_workload(grpo: GRPOConfig, rollout: RolloutConfig, datamodule: Any) -> Workload:
    """The token sizes of this run's peak, bounded from the config (the rows depend on what is sampled).

    A micro-batch holds up to ``grpo.micro_batch_tokens`` padded tokens, or one row of up to
    ``rollout.max_context_tokens``; without a budget, ``grpo.micro_batch_size`` such rows. Half its positions are
    taken as scored (generated). The engine generates a step's episodes (or an evaluation batch) at once.
    """
    g, r = grpo, rollout
    tokens = max(g.micro_batch_tokens, r.max_context_tokens) if g.micro_batch_tokens else (
        g.micro_batch_size * r.max_context_tokens)
    episodes = getattr(datamodule, "batch_size", 1) * g.group_size
    rows = min(max(episodes, getattr(datamodule, "eval_batch_size", 0)), r.generate_batch_size)
    return Workload(tokens, tokens // 2, rows if r.engine != "vllm" else 0, r.max_context_tokens,
                    r.cache_tokens if r.engine == "cached" else 0, budget_key="model.grpo.micro_batch_tokens",
                    generation_key="data.batch_size (or rollout.generate_batch_size)")


def check_fidelity_gate(gate: float, tasks: list[Task], prompter: RehearseWorld, engine: Engine,
                        max_new_tokens: int, strategy: Any, device: torch.device) -> None:
    """Rehearse every reference call of ``tasks`` (teacher-forced) and stop unless ``gate`` of them match exactly.

    The exact-match rate is averaged over ranks (``strategy.reduce``: a collective on several ranks).

    Raises:
        ValueError: no task has a reference call to probe, or the rate is below ``gate``.
    """
    probes = reference_probes(tasks)
    if not probes:
        raise ValueError("fidelity_gate is set but no validation or training task has a reference call to probe")
    with torch.no_grad():
        scores = rehearse_probes(probes, prompter, engine, max_new_tokens)
    exact = sum(score.exact_match for score in scores) / len(scores)
    exact = float(strategy.reduce(torch.tensor(exact, device=device), reduce_op="mean"))
    rank_zero_info(f"fidelity gate: rehearsal exact match {exact:.3f} on {len(scores)} reference calls "
                   f"(gate {gate})")
    if exact < gate:
        raise ValueError(
            f"fidelity gate: the policy rehearses {exact:.3f} of the reference calls exactly, below "
            f"fidelity_gate={gate}; train the warm start longer (or on more world-model data) "
            "before rehearsal RL, or lower the gate"
        )
