"""KL penalty to the reference policy, per token (Schulman's k3 estimator).

This module owns the per-token KL estimate only; aggregation is done by the caller with an aggregator.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # the log-ratio is clamped to [-20, 20] before exp: exp(20) ~ 4.9e8 stays finite in fp32


def k3_kl(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Schulman's k3 estimate of ``KL(pi || pi_ref)`` per token: ``exp(d) - d - 1`` with ``d = ref_logps - logps``.

    Non-negative (``e^d >= 1 + d``) and unbiased for tokens sampled from ``pi``. ``d`` is clamped to ``[-20, 20]``
    before ``exp`` for numerical stability (beyond that the gradient is zero, as in verl).

    Args:
        logps: ``[N, T]`` current per-token log-probs.
        ref_logps: ``[N, T]`` reference-policy per-token log-probs (treated as constants).

    Returns:
        ``[N, T]`` per-token KL estimate (unmasked; weight it with an aggregator).

    Raises:
        ValueError: on mismatched shapes.
    """
    if logps.shape != ref_logps.shape:
        raise ValueError(
            f"envace/losses/kl.py: logps {tuple(logps.shape)} and ref_logps {tuple(ref_logps.shape)} differ in shape"
        )
    d = (ref_logps.detach() - logps).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [N, T]
    return torch.exp(d) - d - 1.0
