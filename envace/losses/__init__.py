"""Loss terms of EnvACE training (pure tensor code).

Loss terms of EnvACE training (pure tensor code): the token aggregators, the clipped policy loss, the k3 KL, the
alignment NLL and the combined objective.

May import: envace.types, envace.errors.
"""

from envace.losses.aggregation import ConstantNorm, SeqMeanTokenMean, TokenAggregator, TokenMean, role_weights
from envace.losses.align import alignment_nll
from envace.losses.kl import k3_kl
from envace.losses.objective import LossWeights, envace_objective
from envace.losses.policy import ClippedPolicyLoss, masked_mean

__all__ = [
    "ClippedPolicyLoss",
    "ConstantNorm",
    "LossWeights",
    "SeqMeanTokenMean",
    "TokenAggregator",
    "TokenMean",
    "alignment_nll",
    "envace_objective",
    "k3_kl",
    "masked_mean",
    "role_weights",
]
