"""PPO/GRPO clipped policy-gradient loss with dual clipping, per token.

This module owns the policy-gradient term only; aggregation over tokens is done by the caller with an aggregator
from :mod:`envace.losses.aggregation`.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| is clamped to this before exp (as in verl), so exp never overflows


class ClippedPolicyLoss:
    """Clipped surrogate loss (PPO) with asymmetric clip range and dual clip (Ye et al. 2020, as in verl).

    Per token, with ``ratio = exp(logps - old_logps)`` (log-ratio clamped to ``[-20, 20]``) and row advantage ``A``::

        pg1  = -A * ratio
        pg2  = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)
        loss = max(pg1, pg2)
        loss = min(loss, -A * dual_clip)   where A < 0 (only if dual_clip is not None)

    ``old_logps`` and ``advantages`` are treated as constants (detached).

    Args:
        clip_low: lower clip ``epsilon`` (ratio floor ``1 - clip_low``).
        clip_high: upper clip ``epsilon`` (ratio ceiling ``1 + clip_high``).
        dual_clip: dual-clip constant ``c > 1`` bounding the loss of negative-advantage tokens, or None to disable.

    Raises:
        ValueError: if a clip value is negative, ``clip_low >= 1`` or ``dual_clip <= 1``.
    """

    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = 3.0) -> None:
        if not 0.0 <= clip_low < 1.0:
            raise ValueError(f"envace/losses/policy.py: clip_low must be in [0, 1), got {clip_low}")
        if not clip_high >= 0.0:
            raise ValueError(f"envace/losses/policy.py: clip_high must be >= 0, got {clip_high}")
        if dual_clip is not None and not dual_clip > 1.0:
            raise ValueError(f"envace/losses/policy.py: dual_clip must be > 1 (or None), got {dual_clip}")
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.dual_clip = dual_clip

    def __call__(
        self, logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-token loss and statistics.

        Args:
            logps: ``[N, T]`` current per-token log-probs (carry the gradient).
            old_logps: ``[N, T]`` log-probs of the rollout (behaviour) policy.
            advantages: ``[N]`` finite advantage of each row, spread over its tokens.
            mask: ``[N, T]`` float 0/1 tokens the loss applies to.

        Returns:
            ``(per_token_loss [N, T], stats)``; the loss is zero where ``mask`` is zero. ``stats`` holds 0-dim detached
            masked means over ``mask``: ``clip_frac`` (the clipped branch is active), ``dual_clip_frac`` (the dual
            clip is active), ``ratio_mean`` and ``approx_kl`` (``0.5 * (logps - old_logps) ** 2``).

        Raises:
            ValueError: on mismatched shapes or non-finite advantages.
        """
        _check_args(logps, old_logps, advantages, mask)
        log_ratio = (logps - old_logps.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [N, T]
        ratio = torch.exp(log_ratio)  # [N, T]
        adv = advantages.detach().to(logps.dtype)[:, None]  # [N, 1]
        pg1 = -adv * ratio  # [N, T]
        pg2 = -adv * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)  # [N, T]
        clipped = torch.maximum(pg1, pg2)  # [N, T]
        loss, dual_active = self._dual_clip(clipped, adv)
        on = mask > 0
        loss = torch.where(on, loss, torch.zeros_like(loss))
        stats = {
            "clip_frac": masked_mean((pg2 > pg1).to(mask.dtype), mask),
            "dual_clip_frac": masked_mean(dual_active.to(mask.dtype), mask),
            "ratio_mean": masked_mean(ratio.detach(), mask),
            "approx_kl": masked_mean(0.5 * log_ratio.detach() ** 2, mask),
        }
        return loss, stats

    def _dual_clip(self, clipped: Tensor, adv: Tensor) -> tuple[Tensor, Tensor]:
        """Apply the dual clip to negative-advantage tokens; return the loss and where the dual clip is active."""
        if self.dual_clip is None:
            return clipped, torch.zeros_like(clipped, dtype=torch.bool)
        bound = -adv * self.dual_clip  # [N, 1]
        negative = adv < 0  # [N, 1]
        active = negative & (clipped > bound)  # [N, T]
        return torch.where(negative, torch.minimum(clipped, bound), clipped), active

    def __repr__(self) -> str:
        return f"ClippedPolicyLoss(clip_low={self.clip_low}, clip_high={self.clip_high}, dual_clip={self.dual_clip})"


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Detached 0-dim mean of ``values`` over ``mask`` (0 when the mask is empty).

    Args:
        values: ``[N, T]`` values.
        mask: ``[N, T]`` float 0/1 mask.
    """
    values = values.detach()
    total = torch.where(mask > 0, values * mask, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp_min(1.0)


def _check_args(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor) -> None:
    """Validate shapes and advantages of :meth:`ClippedPolicyLoss.__call__`."""
    shapes = {"logps": logps.shape, "old_logps": old_logps.shape, "mask": mask.shape}
    if logps.dim() != 2 or len(set(shapes.values())) > 1:
        raise ValueError(f"envace/losses/policy.py: expected equal [N, T] shapes, got {dict(shapes)}")
    if advantages.shape != logps.shape[:1]:
        raise ValueError(
            f"envace/losses/policy.py: advantages must be [N] = {tuple(logps.shape[:1])}, "
            f"got {tuple(advantages.shape)}"
        )
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError("envace/losses/policy.py: advantages must be finite (NaN rewards must map to 0 advantage)")
