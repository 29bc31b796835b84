"""The rollout engine against the trainer: drift statistics and the truncated importance-sampling correction.

A separate rollout engine (vLLM) samples with its own kernels, so the probability it gave a token differs a little
from the trainer's for the same weights. The update's behaviour log-probs stay the trainer's; this measures the gap
and, optionally, reweights each generated token's policy-gradient term by ``min(pi_trainer / pi_engine, cap)``
(truncated importance sampling, the correction verl and TRL offer for the same mismatch).
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0
"""Bound on ``|log pi_trainer - log pi_engine|`` before exponentiating (as the policy loss bounds its log-ratio)."""


def engine_correction(old_logps: Tensor, engine_logps: Tensor, mask: Tensor,
                      cap: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token importance weights and drift statistics.

    Args:
        old_logps: ``[N, T]`` the trainer's behaviour log-probs (treated as constants).
        engine_logps: ``[N, T]`` the engine's log-probs of the same tokens, NaN where the engine reported none.
        mask: ``[N, T]`` the tokens the policy gradient trains.
        cap: the truncation ``C`` of ``min(pi_trainer / pi_engine, C)``, or None for weights of 1 (measure only).

    Returns:
        ``(weights [N, T], stats)``. Weights are 1 wherever the engine's log-prob is unknown. ``stats`` holds
        ``[sum, count]`` pairs over the masked tokens with a known engine log-prob: ``engine_gap_logp``
        (``|log pi_trainer - log pi_engine|``), ``engine_gap_kl`` (k3 estimate of ``KL(pi_engine || pi_trainer)``
        from the engine's samples: ``r - 1 - log r`` with ``r = pi_trainer / pi_engine``) and
        ``engine_gap_tis_clipped`` (tokens whose ratio exceeds ``cap``; 0 without one).
    """
    known = mask.bool() & torch.isfinite(engine_logps)  # [N, T]
    log_ratio = torch.where(known, old_logps.detach() - torch.nan_to_num(engine_logps), 0.0)  # [N, T]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # [N, T]
    count = known.sum().float()
    clipped = known & (ratio > cap) if cap is not None else torch.zeros_like(known)
    stats = {
        "engine_gap_logp": torch.stack([log_ratio.abs()[known].sum(), count]),
        "engine_gap_kl": torch.stack([(ratio - 1.0 - log_ratio)[known].sum(), count]),
        "engine_gap_tis_clipped": torch.stack([clipped.sum().float(), count]),
    }
    if cap is None:
        return torch.ones_like(ratio), stats
    return torch.where(known, ratio.clamp(max=cap), torch.ones_like(ratio)), stats
