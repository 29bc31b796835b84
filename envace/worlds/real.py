"""The classic baseline: every call is executed by the task's real environment."""

from __future__ import annotations

import concurrent.futures
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.engines.base import Engine, SamplingParams
from envace.envs.real import DEFAULT_TOOL_TIMEOUT_S, RealEnvironment
from envace.types import Task
from envace.worlds.base import ToolReply, ToolRequest, failed_reply
from envace.worlds.rehearse import RehearseWorld


class RealWorld:
    """Executes calls on a fresh instance of the task's environment class per episode (no rehearse rows).

    A tool that raises is a normal error observation. A call that exceeds ``tool_timeout_s`` is answered with a
    timeout error and leaves its episode's environment unusable (``envace.envs.real``); an exception elsewhere (the
    constructor, a toolbox's ``call_tool``, a call on an unusable environment) fails that episode only.

    Args:
        tool_timeout_s: most seconds an environment's constructor and each tool call may take (0: no limit).
        concurrency: episodes whose calls run at once (each episode's own calls stay in order). Tool servers in
            processes of their own (``envace.envs.mcp``, up to its ``max_servers``) answer that many calls in the
            time of one; Python environment classes share the interpreter and gain little. 1: one call at a time.
        rehearse: the prompt settings of the policy's rehearse role where the module still trains or probes it (its
            world-model alignment rows, fidelity evaluation): e.g. ``RehearseWorld(think=True)`` for a warm start
            that learned to think before it answers. This world never rehearses a call (default: the plain prompts).
    """

    rehearses = False
    """No call is ever answered by the policy's rehearse role (the fidelity gate does not apply)."""

    def __init__(self, tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S, rehearse: RehearseWorld | None = None,
                 concurrency: int = 1) -> None:
        if not tool_timeout_s >= 0:
            raise ValueError(f"tool_timeout_s must be >= 0 (0: no limit), got {tool_timeout_s}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.tool_timeout_s = tool_timeout_s
        self.rehearse = rehearse
        self.concurrency = concurrency

    def begin_rollout(self, step: int) -> None:
        """Nothing is scheduled."""

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Nothing to bind: a real world does not generate."""

    def open(self, task: Task) -> Any:
        """Instantiate the task's environment."""
        if task.environment is None:
            raise ValueError(f"task '{task.id}' has no 'environment'; the real world needs one to execute its tools")
        return RealEnvironment(task.environment, self.tool_timeout_s)

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Execute each call on its episode's environment (``concurrency`` episodes at once), replies in order."""
        if self.concurrency == 1 or len(requests) < 2:
            return [_execute(req) for req in requests]
        episodes: dict[int, list[int]] = {}  # an episode's calls run in order, on one thread
        for i, req in enumerate(requests):
            episodes.setdefault(id(req.handle), []).append(i)
        replies: list[ToolReply | None] = [None] * len(requests)

        def run(indices: list[int]) -> None:
            for i in indices:
                replies[i] = _execute(requests[i])

        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(episodes)),
                                                   thread_name_prefix="envace-real-calls") as pool:
            for future in [pool.submit(run, indices) for indices in episodes.values()]:
                future.result()  # _execute catches what a call raises: only a bug in it surfaces here
        return [reply for reply in replies if reply is not None]


def _execute(req: ToolRequest) -> ToolReply:
    """Run one call on its episode's environment; an exception fails that episode only (the runner ends it)."""
    env: RealEnvironment = req.handle
    timeouts = env.timeouts
    try:
        content, _ = env.execute(req.call)
    except Exception as exc:  # noqa: BLE001 - fails this episode only
        return failed_reply(f"environment {env.spec.class_path} ({req.call.name})", exc, real_calls=1)
    timed_out = env.timeouts - timeouts
    return ToolReply(content=content, ok=True, source="real", real_calls=1,
                     real_content=None if timed_out else content, timeouts=timed_out)
