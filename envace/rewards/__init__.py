"""Rewards of finished episodes.

Rewards of finished episodes (pluggable by ``class_path``), the rehearse-role shaping term, and scoring a batch of
episodes with them (``scoring``).

May import: envace.worlds and the packages below it (not envace.rollout: rewards read finished episodes).
"""

from envace.rewards.base import Reward
from envace.rewards.checklist import ChecklistReward
from envace.rewards.format import FormatPenalty
from envace.rewards.judges import HTTPJudge, LocalJudge, ScriptedJudge
from envace.rewards.observed import ObservedAnswerSuccess
from envace.rewards.shaping import PredictionErrorShaping
from envace.rewards.task_success import TaskSuccess, task_score
from envace.roles.compare import leaf_f1

__all__ = [
    "ChecklistReward",
    "HTTPJudge",
    "LocalJudge",
    "ScriptedJudge",
    "FormatPenalty",
    "ObservedAnswerSuccess",
    "PredictionErrorShaping",
    "Reward",
    "TaskSuccess",
    "leaf_f1",
    "task_score",
]
