"""Prediction-error shaping of the rehearse reward, where the real response of a call is known.

A rehearsed response is compared with the recorded real response by the F1 of their leaves: each JSON value is
flattened into the set of ``(path, canonical leaf value)`` pairs, where a path is the tuple of object keys and array
indices from the root and an empty object or array is itself a leaf. Identical values score 1.0.
"""

from __future__ import annotations

import json

from envace.roles.compare import leaf_f1
from envace.types import Rehearsal


class PredictionErrorShaping:
    """Shaping term ``-coef * (1 - leaf_f1(rehearsed, real))`` for calls whose real response is known."""

    def __init__(self, coef: float = 0.5) -> None:
        """Configure the shaping.

        Args:
            coef: weight of the prediction error (>= 0).
        """
        if coef < 0:
            raise ValueError(f"coef must be >= 0, got {coef}")
        self.coef = coef

    def __call__(self, rehearsal: Rehearsal) -> float | None:
        """The shaping term of one rehearsal.

        Args:
            rehearsal: the rehearsed call, the content the act role saw, and ``real``: the real response of the call
                in the episode's state, when known (from an audit replay, a real or cached answer, or the task's
                recorded reference in the same state).

        Returns:
            The non-positive shaping term, or None when the real response is unknown or a content is not JSON.
        """
        if rehearsal.real is None:
            return None
        try:
            predicted, real = json.loads(rehearsal.content), json.loads(rehearsal.real)
        except json.JSONDecodeError:
            return None
        return -self.coef * (1.0 - leaf_f1(predicted, real))
