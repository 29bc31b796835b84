"""PlateauStopping: flat validations before ``start_step`` neither set the best score nor count towards patience."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn

from callbacks.plateau import PlateauStopping


class _Strategy:
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002 (Lightning's name)
        return decision


def _trainer(step: int, value: float) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step, callback_metrics={"val/success": torch.tensor(value)}, should_stop=False,
        fast_dev_run=False, sanity_checking=False, state=SimpleNamespace(fn=TrainerFn.FITTING),
        strategy=_Strategy(), current_epoch=0,
    )


def _run(callback: PlateauStopping, history: list[tuple[int, float]]) -> list[bool]:
    stops = []
    for step, value in history:
        trainer = _trainer(step, value)
        callback.on_validation_end(trainer, None)
        stops.append(trainer.should_stop)
    return stops


FLAT_THEN_JUMP = [(100, 0.0), (200, 0.0), (300, 0.0), (400, 0.0), (500, 0.05), (600, 0.3), (700, 0.6)]


def test_flat_start_ends_plain_early_stopping_but_not_plateau_stopping() -> None:
    plain = PlateauStopping(start_step=0, monitor="val/success", mode="max", patience=2, min_delta=0.02)
    assert _run(plain, FLAT_THEN_JUMP)[2]  # 0.0 three times: patience 2 reached at step 300
    late = PlateauStopping(start_step=500, monitor="val/success", mode="max", patience=2, min_delta=0.02)
    assert not any(_run(late, FLAT_THEN_JUMP))
    assert late.best_score.item() == pytest.approx(0.6)


def test_plateau_after_start_step_stops_after_patience() -> None:
    cb = PlateauStopping(start_step=500, monitor="val/success", mode="max", patience=2, min_delta=0.02)
    stops = _run(cb, [(500, 0.5), (600, 0.8), (700, 0.81), (800, 0.805)])
    assert stops == [False, False, False, True]  # 0.81 and 0.805 are within min_delta of 0.8: stop at step 800


def test_negative_start_step_is_refused() -> None:
    with pytest.raises(ValueError, match="start_step"):
        PlateauStopping(start_step=-1, monitor="val/success")
