"""World-model alignment term: teacher-forced negative log-likelihood of recorded real tool responses.

Alignment rows render the rehearse prompt of a recorded real call followed by the real tool response; the target
mask covers that response. This module owns the per-token NLL only; aggregation is done by the caller.
"""

from __future__ import annotations

from torch import Tensor


def alignment_nll(logps: Tensor, target_mask: Tensor) -> Tensor:
    """Per-token negative log-likelihood ``-logps * target_mask``.

    Args:
        logps: ``[N, T]`` per-token log-probs of the teacher-forced targets.
        target_mask: ``[N, T]`` float 0/1 mask of the target (real tool response) tokens.

    Returns:
        ``[N, T]`` NLL, zero off the target.

    Raises:
        ValueError: on mismatched shapes.
    """
    if logps.shape != target_mask.shape:
        raise ValueError(
            f"envace/losses/align.py: logps {tuple(logps.shape)} and target_mask {tuple(target_mask.shape)} "
            "differ in shape"
        )
    return -logps * target_mask
