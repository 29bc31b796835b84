"""``export_best`` keeps the weights of the best validation; of tied validations, the latest."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from envace.training.base import PolicyModule


class Module(PolicyModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Linear(1, 1, bias=False)
        self.configure_export("out", "val/success_act")


def validate(module: Module, score: float, weight: float, step: int) -> None:
    with torch.no_grad():
        module.model.weight.fill_(weight)
    module._trainer = SimpleNamespace(  # type: ignore[assignment]
        sanity_checking=False, state=SimpleNamespace(fn="fit"), global_step=step,
        callback_metrics={"val/success_act": torch.tensor(score)},
    )
    module.on_validation_end()


def kept(module: Module) -> tuple[float, float]:
    assert module.best is not None
    return module.best[0], float(module.best[1]["weight"].item())


def test_the_latest_of_tied_validations_is_kept() -> None:
    module = Module()
    validate(module, 0.5, weight=1.0, step=10)
    assert kept(module) == (0.5, 1.0)
    validate(module, 0.75, weight=2.0, step=20)
    assert kept(module) == (0.75, 2.0)
    validate(module, 0.75, weight=3.0, step=30)  # a tie: the later weights win
    assert kept(module) == (0.75, 3.0)
    validate(module, 0.5, weight=4.0, step=40)  # worse: kept as they were
    assert kept(module) == (0.75, 3.0)


def test_the_kept_weights_are_a_copy() -> None:
    module = Module()
    validate(module, 0.25, weight=1.0, step=1)
    with torch.no_grad():
        module.model.weight.fill_(9.0)
    assert kept(module) == (0.25, 1.0)


def test_an_unlogged_metric_is_an_error() -> None:
    module = Module()
    module._trainer = SimpleNamespace(  # type: ignore[assignment]
        sanity_checking=False, state=SimpleNamespace(fn="fit"), global_step=0, callback_metrics={"val/other": 1.0})
    with pytest.raises(KeyError, match="export_best='val/success_act' is not a logged metric"):
        module.on_validation_end()


def test_a_better_validation_refreshes_the_one_host_copy_in_place() -> None:
    module = Module()
    validate(module, 0.5, weight=1.0, step=10)
    assert module.best is not None
    copy = module.best[1]["weight"]
    assert copy.data_ptr() != module.model.weight.data_ptr()  # a copy, not the live weights
    validate(module, 0.75, weight=2.0, step=20)
    assert kept(module) == (0.75, 2.0) and module.best[1]["weight"] is copy  # written into, not reallocated
    with torch.no_grad():
        module.model.weight.fill_(3.0)  # training goes on: the kept copy does not follow the live weights
    assert kept(module) == (0.75, 2.0)
