"""pass^k and pass@k over repeated trials of the same tasks (tau^2-Bench, VitaBench).

``pass^k`` (tau^2's reliability metric) is the chance that k trials drawn without replacement from a task's n trials
all succeed, averaged over tasks: ``(1/T) * sum_t C(c_t, k) / C(n_t, k)``. ``pass@k`` is the chance that at least one
of them succeeds: ``(1/T) * sum_t (1 - C(n_t - c_t, k) / C(n_t, k))``. With k = 1 both are the mean success rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def _counts(trials: Sequence[Sequence[bool]], k: int) -> list[tuple[int, int]]:
    """``(n, c)`` per task, checked: every task has at least ``k`` trials."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not trials:
        raise ValueError("no tasks: pass^k needs at least one task's trials")
    counts = []
    for index, task in enumerate(trials):
        n = len(task)
        if n < k:
            raise ValueError(f"task {index} has {n} trials; pass^{k} needs at least {k}")
        counts.append((n, sum(bool(t) for t in task)))
    return counts


def pass_hat_k(trials: Sequence[Sequence[bool]], k: int) -> float:
    """tau^2's pass^k: the mean over tasks of ``C(c, k) / C(n, k)``.

    Args:
        trials: per task, the success of each of its trials.
        k: trials that must all succeed.

    Raises:
        ValueError: ``k`` < 1, no tasks, or a task with fewer than ``k`` trials.
    """
    counts = _counts(trials, k)
    return sum(comb(c, k) / comb(n, k) for n, c in counts) / len(counts)


def pass_at_k(trials: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k: the mean over tasks of ``1 - C(n - c, k) / C(n, k)`` (at least one of k trials succeeds).

    Raises:
        ValueError: as ``pass_hat_k``.
    """
    counts = _counts(trials, k)
    return sum(1 - comb(n - c, k) / comb(n, k) for n, c in counts) / len(counts)
