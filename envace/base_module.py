"""What envace's LightningModules share: the DataModule's sampler connection and one optimiser over the policy."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable

from envace.data.datamodule import RolloutDataModule


class PolicyModule(L.LightningModule):
    """Base class: subclasses build ``self.model`` in ``configure_model`` and set ``self.optimizer_factory``."""

    model: torch.nn.Module | None
    optimizer_factory: OptimizerCallable

    def setup(self, stage: str) -> None:
        """Hand the DataModule this module as its sampler (``sample_rollouts``)."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if isinstance(datamodule, RolloutDataModule):
            datamodule.connect(self)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """One optimiser over every trainable parameter (with a shared policy, both roles' heads share it)."""
        assert self.model is not None
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the policy has no trainable parameters")
        return self.optimizer_factory(params)
