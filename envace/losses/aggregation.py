"""Token aggregation: per-token weights that turn a ``[N, T]`` per-token loss into one scalar.

This module owns the aggregation modes. Each mode maps a mask to weights ``w`` such that
``loss = (per_token_loss * w).sum()``. The weights depend on the whole minibatch (token and row counts), so they are
computed ONCE on the full minibatch and then sliced row-wise for each micro-batch. Because the per-token losses are
row-local, the sum over micro-batches of ``(per_token_loss[rows] * w[rows]).sum()`` equals the full-minibatch loss,
so gradient accumulation gives exactly the full-minibatch gradient regardless of how rows are split.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class TokenAggregator(Protocol):
    """Common protocol of the aggregation modes."""

    def weights(self, mask: Tensor) -> Tensor:
        """Per-token weights ``[N, T]`` (zero wherever ``mask`` is zero) for ``loss = (per_token_loss * w).sum()``.

        Args:
            mask: ``[N, T]`` float 0/1 mask of the tokens the loss applies to.
        """
        ...


class TokenMean:
    """Mean over all masked tokens of the minibatch: ``w = mask / mask.sum()`` (all zeros if the mask is empty)."""

    def weights(self, mask: Tensor) -> Tensor:
        """See :class:`TokenAggregator`."""
        _check_mask(mask)
        total = mask.sum()
        return mask / total.clamp_min(1.0)  # [N, T]; total == 0 implies mask == 0, so the result is 0


class SeqMeanTokenMean:
    """Mean over tokens within each row, then mean over the rows that have at least one token.

    ``w[i, t] = mask[i, t] / (count_i * R)`` with ``count_i = sum_t mask[i, t]`` and ``R = #{i : count_i > 0}``.
    """

    def weights(self, mask: Tensor) -> Tensor:
        """See :class:`TokenAggregator`."""
        _check_mask(mask)
        count = mask.sum(dim=-1, keepdim=True)  # [N, 1]
        n_rows = (count > 0).sum().to(mask.dtype)  # []
        return mask / (count.clamp_min(1.0) * n_rows.clamp_min(1.0))  # [N, T]


class ConstantNorm:
    """Dr.GRPO "constant-normalised" aggregation: each row's token SUM divided by a constant, then mean over rows.

    ``w[i, t] = mask[i, t] / (constant * R)`` with ``R`` the number of rows that have at least one masked token.
    ``constant`` is typically the maximum generation length, so that per-token weights do not depend on the
    length of the row (no length bias).

    Args:
        constant: positive normaliser.

    Raises:
        ValueError: if ``constant <= 0``.
    """

    def __init__(self, constant: float) -> None:
        if not constant > 0:
            raise ValueError(f"envace/losses/aggregation.py: ConstantNorm.constant must be > 0, got {constant}")
        self.constant = float(constant)

    def weights(self, mask: Tensor) -> Tensor:
        """See :class:`TokenAggregator`."""
        _check_mask(mask)
        n_rows = (mask.sum(dim=-1) > 0).sum().to(mask.dtype)  # []
        return mask / (self.constant * n_rows.clamp_min(1.0))  # [N, T]

    def __repr__(self) -> str:
        return f"ConstantNorm(constant={self.constant})"


def _check_mask(mask: Tensor) -> None:
    """Raise ValueError unless ``mask`` is a 2-D float tensor."""
    if mask.dim() != 2 or not mask.is_floating_point():
        raise ValueError(
            f"envace/losses/aggregation.py: mask must be a [N, T] float tensor, got shape {tuple(mask.shape)} "
            f"dtype {mask.dtype}"
        )


def role_weights(aggregator: TokenAggregator, mask: Tensor, select: Tensor) -> Tensor:
    """Aggregation weights restricted to the selected rows: ``aggregator.weights(mask * select[:, None])``.

    Call this on the WHOLE minibatch and slice the result per micro-batch.

    Args:
        aggregator: the aggregation mode.
        mask: ``[N, T]`` float loss mask.
        select: ``[N]`` bool rows to keep.

    Returns:
        ``[N, T]`` weights, zero on unselected rows.
    """
    if select.shape != mask.shape[:1]:
        raise ValueError(
            f"envace/losses/aggregation.py: select must be [N] = {tuple(mask.shape[:1])}, got {tuple(select.shape)}"
        )
    return aggregator.weights(mask * select.to(mask.dtype)[:, None])


__all__ = ["ConstantNorm", "SeqMeanTokenMean", "TokenAggregator", "TokenMean", "role_weights"]
