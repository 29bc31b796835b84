"""The classic baseline: every call is executed by the task's real environment."""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.envs.real import RealEnvironment
from envace.rollout.engine import Engine, SamplingParams
from envace.types import Task
from envace.worlds.base import ToolReply, ToolRequest


class RealWorld:
    """Executes calls on a fresh instance of the task's environment class per episode (no rehearse rows)."""

    def begin_rollout(self, step: int) -> None:
        """Nothing is scheduled."""

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Nothing to bind: a real world does not generate."""

    def open(self, task: Task) -> Any:
        """Instantiate the task's environment."""
        if task.environment is None:
            raise ValueError(f"task '{task.id}' has no 'environment'; the real world needs one to execute its tools")
        return RealEnvironment(task.environment)

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Execute each call on its episode's environment."""
        replies = []
        for req in requests:
            content, _ = req.handle.execute(req.call)
            replies.append(ToolReply(content=content, ok=True, source="real", real_calls=1,
                                     real_content=content))
        return replies
