"""The EnvACE objective: act and rehearse heads (role-wise clipped PG), alignment and imitation NLL, k3 KL.

This module owns how the loss terms are combined. It never computes aggregation weights itself: the caller computes
``weights_act``, ``weights_rehearse`` and ``weights_align`` ONCE on the whole minibatch with
:func:`envace.losses.aggregation.role_weights` (aggregator, full mask, that head's row selection) and slices them
row-wise to each micro-batch. Summing this objective over the micro-batches then gives exactly the full-minibatch
loss and gradient (gradient-accumulation invariance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from envace.losses.align import alignment_nll
from envace.losses.kl import k3_kl
from envace.losses.policy import ClippedPolicyLoss
from envace.types import Role


@dataclass
class LossWeights:
    """Coefficients of the heads in the total loss.

    Attributes:
        act: weight of the act-role policy-gradient head.
        rehearse: weight of the rehearse-role policy-gradient head.
        align: weight of the world-model alignment NLL (teacher-forced rehearse rows).
        kl: weight of the k3 KL to the reference policy (on act and rehearse tokens).
        imitate: weight of the imitation NLL (teacher-forced act rows of demonstrations).
    """

    act: float = 1.0
    rehearse: float = 1.0
    align: float = 0.0
    kl: float = 0.0
    imitate: float = 0.0


def envace_objective(
    logps: Tensor,
    old_logps: Tensor,
    ref_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    row_role: Tensor,
    is_align: Tensor,
    weights_act: Tensor,
    weights_rehearse: Tensor,
    weights_align: Tensor,
    policy_loss: ClippedPolicyLoss,
    loss_weights: LossWeights,
    weights_imitate: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Total loss of one (micro-)batch and its statistics.

    ``total = act * l_act + rehearse * l_rehearse + align * l_align + imitate * l_imitate + kl * l_kl`` with::

        l_act      = sum(policy_loss(mask on act rows)        * weights_act)
        l_rehearse = sum(policy_loss(mask on rehearse rows)   * weights_rehearse)
        l_align    = sum(alignment_nll(mask on align rows)    * weights_align)
        l_imitate  = sum(alignment_nll(mask on imitate rows)  * weights_imitate)   (0 without weights_imitate)
        l_kl       = sum(k3_kl(logps, ref_logps) * (weights_act + weights_rehearse))   (0 without ref_logps)

    Act rows are non-align rows with ``row_role == Role.ACT``, rehearse rows non-align rows with
    ``row_role == Role.REHEARSE``. Teacher-forced (``is_align``) rows are alignment rows when their role is
    ``Role.REHEARSE`` (recorded tool responses) and imitation rows when it is ``Role.ACT`` (demonstrated act turns).
    Each head also masks its own rows, so a head never sees another head's tokens even if its weights were wrong.
    Teacher-forced rows have no advantage: their entry of ``advantages`` is ignored.

    Args:
        logps: ``[N, T]`` current per-token log-probs (carry the gradient).
        old_logps: ``[N, T]`` rollout-policy log-probs.
        ref_logps: ``[N, T]`` reference-policy log-probs, or None (no KL term).
        advantages: ``[N]`` row advantages (finite on act and rehearse rows).
        mask: ``[N, T]`` float 0/1 loss mask.
        row_role: ``[N]`` integer ``Role`` of each row (``Role.ACT`` or ``Role.REHEARSE``).
        is_align: ``[N]`` bool, True on alignment rows.
        weights_act: ``[N, T]`` act-head aggregation weights (computed on the whole minibatch, then sliced).
        weights_rehearse: ``[N, T]`` rehearse-head aggregation weights (likewise).
        weights_align: ``[N, T]`` alignment aggregation weights (likewise).
        policy_loss: the clipped policy loss.
        loss_weights: head coefficients.
        weights_imitate: ``[N, T]`` imitation aggregation weights (likewise), or None (no imitation term).

    Returns:
        ``(total, stats)``; ``stats`` holds detached 0-dim tensors ``loss``, ``loss_act``, ``loss_rehearse``,
        ``loss_align``, ``loss_imitate``, ``kl`` (the unweighted head values), and per role ``clip_frac_*``,
        ``dual_clip_frac_*``, ``approx_kl_*`` over that role's masked tokens.

    Raises:
        ValueError: on mismatched shapes.
    """
    if weights_imitate is None:
        weights_imitate = torch.zeros_like(weights_align)
    _check_shapes(logps, old_logps, ref_logps, mask, row_role, is_align, weights_act, weights_rehearse, weights_align,
                  weights_imitate)
    is_align = is_align.bool()
    act_rows = ~is_align & (row_role == int(Role.ACT))  # [N]
    rehearse_rows = ~is_align & (row_role == int(Role.REHEARSE))  # [N]
    imitate_rows = is_align & (row_role == int(Role.ACT))  # [N]
    align_rows = is_align & ~imitate_rows  # [N]
    advantages = torch.where(act_rows | rehearse_rows, advantages, torch.zeros_like(advantages))  # [N]

    pg_act, stats_act = policy_loss(logps, old_logps, advantages, _rows(mask, act_rows))
    pg_rehearse, stats_rehearse = policy_loss(logps, old_logps, advantages, _rows(mask, rehearse_rows))
    l_act = (pg_act * weights_act).sum()
    l_rehearse = (pg_rehearse * weights_rehearse).sum()
    l_align = (alignment_nll(logps, _rows(mask, align_rows)) * weights_align).sum()
    l_imitate = (alignment_nll(logps, _rows(mask, imitate_rows)) * weights_imitate).sum()
    l_kl = _kl_head(logps, ref_logps, weights_act + weights_rehearse)

    w = loss_weights
    total = w.act * l_act + w.rehearse * l_rehearse + w.align * l_align + w.imitate * l_imitate + w.kl * l_kl
    heads = {"loss": total, "loss_act": l_act, "loss_rehearse": l_rehearse, "loss_align": l_align,
             "loss_imitate": l_imitate, "kl": l_kl}
    stats = {name: value.detach() for name, value in heads.items()}
    for suffix, role_stats in (("act", stats_act), ("rehearse", stats_rehearse)):
        for key in ("clip_frac", "dual_clip_frac", "approx_kl"):
            stats[f"{key}_{suffix}"] = role_stats[key]
    return total, stats


def _rows(mask: Tensor, select: Tensor) -> Tensor:
    """``mask`` restricted to the selected rows: ``mask * select[:, None]``."""
    return mask * select.to(mask.dtype)[:, None]  # [N, T]


def _kl_head(logps: Tensor, ref_logps: Tensor | None, weights: Tensor) -> Tensor:
    """Aggregated k3 KL over the weighted tokens, or a zero scalar without a reference."""
    if ref_logps is None:
        return torch.zeros((), dtype=logps.dtype, device=logps.device)
    return (k3_kl(logps, ref_logps) * weights).sum()


def _check_shapes(
    logps: Tensor,
    old_logps: Tensor,
    ref_logps: Tensor | None,
    mask: Tensor,
    row_role: Tensor,
    is_align: Tensor,
    weights_act: Tensor,
    weights_rehearse: Tensor,
    weights_align: Tensor,
    weights_imitate: Tensor,
) -> None:
    """Raise ValueError unless every token tensor is ``[N, T]`` and every row tensor ``[N]``."""
    token = {"logps": logps, "old_logps": old_logps, "mask": mask, "weights_act": weights_act}
    token |= {"weights_rehearse": weights_rehearse, "weights_align": weights_align, "weights_imitate": weights_imitate}
    if ref_logps is not None:
        token["ref_logps"] = ref_logps
    rows = {"row_role": row_role, "is_align": is_align}
    bad = {name: tuple(t.shape) for name, t in token.items() if t.shape != logps.shape or t.dim() != 2}
    bad |= {name: tuple(t.shape) for name, t in rows.items() if t.shape != logps.shape[:1]}
    if bad:
        raise ValueError(
            f"envace/losses/objective.py: expected [N, T] = {tuple(logps.shape)} token tensors and [N] row tensors, "
            f"got {bad}"
        )
