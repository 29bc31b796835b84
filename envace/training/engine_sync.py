"""Keeping a separate rollout engine (vLLM) in step with the trained policy: its weights, and its sleep.

The engine itself is built by the engine factory (``envace.evaluation.evaluator.policy_engine``, which keeps it on the
module as ``_vllm_engine``); ``EngineSync`` remembers which weights it holds and hands it new ones after an optimiser
step changed them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch


class EngineSync:
    """Which global step's weights a separate rollout engine holds, and where its role adapters are written."""

    def __init__(self) -> None:
        self.adapter_dir: tempfile.TemporaryDirectory[str] | None = None  # role adapters as the vLLM engine reads them
        self.step: int | None = None  # the global step whose weights that engine holds

    def sync(self, engine: Any, model: torch.nn.Module, role_adapters: tuple[str, str] | None,
             step: int) -> float | None:
        """Give a separate rollout engine (vLLM) the policy's weights if an optimiser step changed them since.

        A sleeping engine (``rollout.vllm.sleep``) is woken first. Returns the seconds the sync took, or None when
        nothing was synced (the engine is current, or the policy generates with the trained model itself: ``engine``
        is None).
        """
        if engine is None:
            return None
        engine.wake_up()
        if self.step == step:
            return None
        from envace.engines.weights import policy_weights, write_adapter

        if role_adapters:  # the base is frozen: each role's adapter goes through vLLM's LoRA support
            if self.adapter_dir is None:
                self.adapter_dir = tempfile.TemporaryDirectory(prefix="envace-adapters-")
            start = time.perf_counter()
            for name in role_adapters:
                engine.load_adapter(name, write_adapter(model, name, Path(self.adapter_dir.name, name)))
            seconds = time.perf_counter() - start
        else:
            seconds = engine.load_weights(policy_weights(model))
        self.step = step
        return seconds

    @staticmethod
    def rest(engine: Any, sleep: bool) -> None:
        """With ``rollout.vllm.sleep`` (``sleep``), the vLLM engine gives its GPU memory back until the next rollout."""
        if engine is not None and sleep:
            engine.sleep()
