"""Role-wise GRPO advantages: one scalar per training row, baselined within its (task, role) group.

This module owns the advantage estimator only. It is pure tensor code (torch only), fully vectorised with
``index_add_`` / ``scatter_reduce``: no Python loop over rows. Group ids are built by the caller; build them from
``(task, role)`` pairs with :func:`role_group_ids` so that act rows and rehearse rows of a task are baselined
separately (role-wise GRPO).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Baseline = Literal["episode", "row"]


def role_group_ids(task_index: Tensor, role: Tensor) -> Tensor:
    """Dense group ids, one per distinct ``(task, role)`` pair.

    Args:
        task_index: ``[N]`` integer task (GRPO group) index of each row.
        role: ``[N]`` integer ``Role`` value of each row.

    Returns:
        ``[N]`` long tensor with values in ``[0, number of distinct pairs)``; two rows share an id iff they share
        both task and role.

    Raises:
        ValueError: if the inputs are not 1-D tensors of the same length.
    """
    _check_1d(task_index=task_index, role=role)
    pairs = torch.stack([task_index.long(), role.long()], dim=1)  # [N, 2]
    _, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    return inverse


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    episode_ids: Tensor,
    *,
    baseline: Baseline = "episode",
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages ``A = r - mean`` (optionally ``/ (std + eps)``), with the mean taken within each group.

    The statistics are computed over *units*: rows for ``baseline="row"``, episodes for ``baseline="episode"``.

    * ``"row"`` (the authors' reference, "step-weighted"): ``mean_g = mean of the rewards of the group's rows``.
    * ``"episode"`` (default; a deliberate deviation): each episode's rows in the group are first averaged, and
      ``mean_g = mean over episodes of those per-episode means``. An episode with many rows (many rehearsed calls)
      then weighs as much in the baseline as an episode with one.

    ``std`` (with ``scale_by_std``) is the population standard deviation (``unbiased=False``) over the same units.

    Degenerate cases give exactly 0:

    * NaN reward ("not applicable"): the row gets 0 and is left out of mean and std (an episode whose rows are all
      NaN is left out as a unit).
    * a group with fewer than two units (one episode in ``"episode"`` mode, one row in ``"row"`` mode): 0, there
      is no baseline information.
    * a group whose valid rewards are all equal: 0.

    With ``scale_by_std`` a group whose unit std is ``<= eps`` (possible in ``"episode"`` mode when episode means
    tie while rows differ) is left unscaled rather than blown up by ``1 / eps``.

    Args:
        rewards: ``[N]`` float rewards, NaN for rows with no applicable reward.
        group_ids: ``[N]`` long group id of each row (any integer values; equal ids form one group).
        episode_ids: ``[N]`` long episode id of each row (only read in ``"episode"`` mode).
        baseline: ``"episode"`` or ``"row"``, see above.
        scale_by_std: divide by ``std + eps``.
        eps: stabiliser of the std division.

    Returns:
        ``[N]`` advantages, same dtype as ``rewards``, all finite.

    Raises:
        ValueError: on mismatched shapes, non-integer ids, non-float rewards or an unknown ``baseline``.
    """
    _check_inputs(rewards, group_ids, episode_ids, baseline)
    r = rewards.double()  # [N]; float64 so that tied rewards give tied means
    valid = ~torch.isnan(r)  # [N]
    r0 = torch.where(valid, r, torch.zeros_like(r))  # [N]
    _, group = torch.unique(group_ids, return_inverse=True)  # [N] dense in [0, G)
    n_groups = int(group.max().item()) + 1 if group.numel() else 0
    unit = _unit_ids(group, episode_ids, baseline)  # [N] dense in [0, U)

    unit_mean, unit_valid, unit_group = _unit_means(r0, valid, unit, group)  # [U] each
    n_units = _scatter_sum(unit_valid.double(), unit_group, n_groups)  # [G]
    group_mean = _scatter_sum(torch.where(unit_valid, unit_mean, 0.0), unit_group, n_groups) / n_units.clamp_min(1)

    adv = r0 - group_mean[group]  # [N]
    if scale_by_std:
        dev2 = torch.where(unit_valid, (unit_mean - group_mean[unit_group]) ** 2, 0.0)  # [U]
        std = (_scatter_sum(dev2, unit_group, n_groups) / n_units.clamp_min(1)).sqrt()  # [G]
        scale = torch.where(std > eps, std + eps, torch.ones_like(std))  # [G]
        adv = adv / scale[group]
    keep = valid & (n_units[group] >= 2) & ~_all_equal(r, valid, group, n_groups)[group]  # [N]
    return torch.where(keep, adv, torch.zeros_like(adv)).to(rewards.dtype)


def _unit_ids(group: Tensor, episode_ids: Tensor, baseline: Baseline) -> Tensor:
    """Dense unit id of each row: the row itself (``"row"``) or its (group, episode) pair (``"episode"``)."""
    if baseline == "row":
        return torch.arange(group.numel(), device=group.device)
    pairs = torch.stack([group, episode_ids.long()], dim=1)  # [N, 2]
    _, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    return inverse


def _unit_means(r0: Tensor, valid: Tensor, unit: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-unit mean of valid rewards, whether the unit has any valid row, and the unit's dense group id."""
    n_unit = int(unit.max().item()) + 1 if unit.numel() else 0
    total = _scatter_sum(r0, unit, n_unit)  # [U]
    count = _scatter_sum(valid.double(), unit, n_unit)  # [U]
    unit_group = torch.zeros(n_unit, dtype=torch.long, device=unit.device).scatter_(0, unit, group)  # [U]
    return total / count.clamp_min(1), count > 0, unit_group


def _all_equal(r: Tensor, valid: Tensor, group: Tensor, n_groups: int) -> Tensor:
    """``[G]`` True where every valid reward of the group is identical (groups with no valid row: False)."""
    inf = torch.full_like(r, float("inf"))
    hi = torch.full((n_groups,), -float("inf"), dtype=r.dtype, device=r.device)
    lo = torch.full((n_groups,), float("inf"), dtype=r.dtype, device=r.device)
    hi = hi.scatter_reduce(0, group, torch.where(valid, r, -inf), reduce="amax")
    lo = lo.scatter_reduce(0, group, torch.where(valid, r, inf), reduce="amin")
    return hi == lo


def _scatter_sum(values: Tensor, index: Tensor, size: int) -> Tensor:
    """``out[i] = sum of values[j] with index[j] == i``, ``out`` of length ``size``."""
    return torch.zeros(size, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def _check_1d(**tensors: Tensor) -> None:
    """Raise ValueError unless every tensor is 1-D and all have the same length."""
    lengths = {name: tuple(t.shape) for name, t in tensors.items()}
    if any(len(shape) != 1 for shape in lengths.values()) or len(set(lengths.values())) > 1:
        raise ValueError(f"envace/training/advantages.py: expected 1-D tensors of equal length [N], got shapes "
                         f"{lengths}")


def _check_inputs(rewards: Tensor, group_ids: Tensor, episode_ids: Tensor, baseline: str) -> None:
    """Validate the arguments of :func:`group_advantages`."""
    _check_1d(rewards=rewards, group_ids=group_ids, episode_ids=episode_ids)
    if not rewards.is_floating_point():
        raise ValueError(f"envace/training/advantages.py: rewards must be a float tensor, got dtype {rewards.dtype}")
    for name, ids in (("group_ids", group_ids), ("episode_ids", episode_ids)):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"envace/training/advantages.py: {name} must be an integer (long) tensor, got dtype "
                             f"{ids.dtype}")
    if baseline not in ("episode", "row"):
        raise ValueError(f"envace/training/advantages.py: baseline must be 'episode' or 'row', got {baseline!r}")
