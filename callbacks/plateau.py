"""Early stopping at a plateau that only starts counting once learning has begun."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping


class PlateauStopping(EarlyStopping):
    """Lightning's ``EarlyStopping``, ignoring every validation before ``start_step``.

    A small model learns a tool protocol in a jump, after hundreds of steps at a success of exactly 0. Plain
    ``EarlyStopping`` counts those flat validations, and its stop request is sticky: once ``patience`` is reached it
    stays set, so ``trainer.min_steps`` only delays the stop, it ends the run at ``min_steps`` even if the metric has
    started to climb since. Here those validations neither set the best score nor count towards ``patience``.

    Args:
        start_step: validations before this many optimiser steps are ignored.
        **kwargs: ``EarlyStopping``'s arguments (``monitor``, ``mode``, ``patience``, ``min_delta``, ...).
    """

    def __init__(self, start_step: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.start_step = start_step

    def _should_skip_check(self, trainer: L.Trainer) -> bool:
        return super()._should_skip_check(trainer) or trainer.global_step < self.start_step
