"""``export_best`` keeps the weights of the best validation in a file; of tied validations, the latest."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from envace.training.base import PolicyModule
from envace.training.best import CHECKPOINT_KEY, BestWeights


class Module(PolicyModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Linear(1, 1, bias=False)
        self.configure_export("out", "val/success_act")


def validate(module: Module, score: float, weight: float, step: int, root: Path, rank_zero: bool = True) -> None:
    with torch.no_grad():
        module.model.weight.fill_(weight)
    module._trainer = SimpleNamespace(  # type: ignore[assignment]
        sanity_checking=False, state=SimpleNamespace(fn="fit"), global_step=step, is_global_zero=rank_zero,
        default_root_dir=str(root), callback_metrics={"val/success_act": torch.tensor(score)},
    )
    module.on_validation_end()


def kept(module: Module) -> tuple[float, float]:
    assert module.best is not None and module.best.score is not None
    return module.best.score, float(module.best.load()["weight"].item())


def test_the_latest_of_tied_validations_is_kept(tmp_path: Path) -> None:
    module = Module()
    validate(module, 0.5, weight=1.0, step=10, root=tmp_path)
    assert kept(module) == (0.5, 1.0)
    validate(module, 0.75, weight=2.0, step=20, root=tmp_path)
    assert kept(module) == (0.75, 2.0)
    validate(module, 0.75, weight=3.0, step=30, root=tmp_path)  # a tie: the later weights win
    assert kept(module) == (0.75, 3.0)
    validate(module, 0.5, weight=4.0, step=40, root=tmp_path)  # worse: kept as they were
    assert kept(module) == (0.75, 3.0) and module.best is not None and module.best.step == 30


def test_the_kept_weights_are_a_copy_in_one_file(tmp_path: Path) -> None:
    module = Module()
    validate(module, 0.25, weight=1.0, step=1, root=tmp_path)
    with torch.no_grad():
        module.model.weight.fill_(9.0)
    assert kept(module) == (0.25, 1.0)
    validate(module, 0.5, weight=2.0, step=2, root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best_weights-step2.pt"]  # the one before is removed


def test_an_unlogged_metric_is_an_error() -> None:
    module = Module()
    module._trainer = SimpleNamespace(  # type: ignore[assignment]
        sanity_checking=False, state=SimpleNamespace(fn="fit"), global_step=0, callback_metrics={"val/other": 1.0})
    with pytest.raises(KeyError, match="export_best='val/success_act' is not a logged metric"):
        module.on_validation_end()


def test_only_global_rank_zero_writes(tmp_path: Path) -> None:
    module = Module()
    validate(module, 0.5, weight=1.0, step=3, root=tmp_path, rank_zero=False)
    assert module.best is not None and module.best.score == 0.5 and module.best.step == 3
    assert not any(tmp_path.iterdir())


def test_a_checkpoint_restores_the_best_and_a_missing_file_starts_over(tmp_path: Path) -> None:
    module = Module()
    validate(module, 0.5, weight=1.0, step=10, root=tmp_path)
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    resumed = Module()
    resumed.on_load_checkpoint(checkpoint)
    assert kept(resumed) == (0.5, 1.0) and resumed.best is not None and resumed.best.step == 10
    module.best.remove()  # type: ignore[union-attr]
    again = Module()
    with pytest.warns(UserWarning, match=r"best weights \(step 10\) are gone"):
        again.on_load_checkpoint(checkpoint)
    assert again.best is not None and again.best.score is None
    other = BestWeights("val/other")
    with pytest.warns(UserWarning, match="tracked 'val/success_act'"):
        other.load_state_dict(checkpoint[CHECKPOINT_KEY])
    assert other.score is None


def test_a_failed_write_keeps_the_best_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = Module()
    validate(module, 0.5, weight=1.0, step=1, root=tmp_path)

    def full(*_: object, **__: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="No space left"):
        validate(module, 0.75, weight=2.0, step=2, root=tmp_path)
    monkeypatch.undo()
    assert kept(module) == (0.5, 1.0) and module.best is not None and module.best.step == 1


def test_a_resume_finds_the_best_a_validation_at_the_checkpoints_step_wrote(tmp_path: Path) -> None:
    """A checkpoint saved at step 20 runs before step 20's validation: its best (step 10) was replaced by step 20's."""
    module = Module()
    validate(module, 0.5, weight=1.0, step=10, root=tmp_path)
    checkpoint: dict = {"global_step": 20}
    module.on_save_checkpoint(checkpoint)
    validate(module, 0.75, weight=2.0, step=20, root=tmp_path)  # removes step 10's file
    resumed = Module()
    resumed.on_load_checkpoint(checkpoint)
    assert kept(resumed) == (0.75, 2.0) and resumed.best is not None and resumed.best.step == 20
    validate(module, 1.0, weight=3.0, step=30, root=tmp_path)  # a best after the checkpoint: not the resumed run's
    again = Module()
    with pytest.warns(UserWarning, match="are gone"):
        again.on_load_checkpoint(checkpoint)
    assert again.best is not None and again.best.score is None
