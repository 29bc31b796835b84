"""When a CPU run gives freed host memory back to the system (``training.memory.FreedMemory``), on scripted readings."""

from __future__ import annotations

import pytest

import envace.training.memory
from envace.training.memory import FreedMemory

GB = 10**9


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[str]]:
    """Resident-memory readings to hand out, and a log of the trims."""
    readings: list[int] = []
    trims: list[str] = []
    monkeypatch.setattr(envace.training.memory, "_rss", lambda: readings.pop(0))
    monkeypatch.setattr(envace.training.memory, "return_freed_memory", lambda: trims.append("trim") is None)
    return readings, trims


def test_the_first_step_trims_every_micro_batch_then_only_above_the_measured_working_set(scripted) -> None:
    readings, trims = scripted
    freed = FreedMemory(slack=0.1)
    assert freed.check() and freed.check()  # no floor yet: nothing read, both trim
    readings += [2 * GB]  # the first optimiser step trims and takes the floor
    assert freed.check(step_end=True) and len(trims) == 3 and freed.floor == 2 * GB
    # a micro-batch on the trimmed heap leaves 2.0 GB over the floor: the working set; 2.0 <= 1.1 x 2.0 keeps it
    readings += [4 * GB]
    assert not freed.check() and freed.working == 2 * GB
    readings += [int(4.2 * GB)]  # 2.2 GB over: at the ceiling, kept (not on a fresh heap, so not measured)
    assert not freed.check() and freed.working == 2 * GB
    readings += [int(4.3 * GB)]  # 2.3 GB > 2.2 GB: fragmented blocks go back
    assert freed.check() and len(trims) == 4
    readings += [int(3.9 * GB)]  # fresh again: 1.9 GB measured; the working set stays the largest, 2.0 GB
    assert not freed.check() and freed.working == 2 * GB and len(trims) == 4
    readings += [int(4.1 * GB)]  # an optimiser step under the ceiling keeps the heap and the floor
    assert not freed.check(step_end=True) and freed.floor == 2 * GB and len(trims) == 4
    readings += [int(4.5 * GB), int(2.1 * GB)]  # one over it trims and takes the new floor
    assert freed.check(step_end=True) and freed.floor == int(2.1 * GB) and len(trims) == 5
    readings += [int(4.5 * GB)]  # the next micro-batch runs on a trimmed heap: 2.4 GB is the new working set
    assert not freed.check() and freed.working == int(4.5 * GB) - int(2.1 * GB)


def test_a_release_always_trims_and_takes_the_floor(scripted) -> None:
    readings, trims = scripted
    freed = FreedMemory()
    readings += [3 * GB, int(2.5 * GB)]
    assert freed.release() and freed.floor == 3 * GB
    assert freed.release() and freed.floor == int(2.5 * GB) and len(trims) == 2 and freed.trims == 2


def test_without_slack_a_larger_micro_batch_on_a_trimmed_heap_raises_the_working_set(scripted) -> None:
    readings, trims = scripted
    freed = FreedMemory(slack=0.0)
    readings += [GB, 3 * GB]
    freed.release()
    assert not freed.check() and freed.working == 2 * GB
    readings += [int(3.5 * GB), int(4.5 * GB)]  # 2.5 GB over a 2.0 GB ceiling: trimmed; then 3.5 GB on a fresh heap
    assert freed.check() and not freed.check()
    assert freed.working == int(3.5 * GB) and len(trims) == 2


def test_a_negative_slack_is_refused() -> None:
    with pytest.raises(ValueError, match="slack must be >= 0"):
        FreedMemory(slack=-0.1)


def test_a_rollout_returns_its_freed_memory_only_over_the_ceiling(scripted) -> None:
    from envace.training.base import PolicyModule

    readings, trims = scripted
    module = PolicyModule()  # on CPU
    readings += [GB]
    module.return_freed_memory()  # a validation: always trims, and takes the floor
    readings += [3 * GB]
    module.return_freed_memory("micro_batch")  # on the trimmed heap: a 2 GB working set
    readings += [int(2.5 * GB)]  # the rollout's freed keys and values, within it: kept for the update to reuse
    module.return_freed_memory("rollout")
    assert len(trims) == 1
    readings += [int(3.5 * GB), GB]  # more than it: given back, and the floor taken again
    module.return_freed_memory("rollout")
    assert len(trims) == 2 and module.freed_memory.floor == GB


def test_a_restart_measures_the_working_set_again(scripted) -> None:
    """After a validation the ceiling is measured anew: a working set an earlier heap left does not raise it."""
    readings, trims = scripted
    freed = FreedMemory()
    readings += [GB, 4 * GB]
    freed.release()
    assert not freed.check() and freed.working == 3 * GB  # a 3 GB working set on the first heap
    readings += [int(1.5 * GB)]
    assert freed.restart() and freed.floor == int(1.5 * GB) and freed.working == 0 and len(trims) == 2
    readings += [int(3.5 * GB)]  # the first micro-batch after it runs on the trimmed heap: 2 GB, the new ceiling
    assert not freed.check() and freed.working == 2 * GB
    readings += [int(4.0 * GB)]  # 2.5 GB over the floor: within the old 3 GB, over the new 2 GB, so trimmed
    assert freed.check() and len(trims) == 3


def test_a_validation_takes_the_floor_after_writing_the_best_weights(scripted, tmp_path) -> None:
    """The floor counts what the validation left (the write of the best weights included): nothing is counted twice."""
    from types import SimpleNamespace

    import torch

    from envace.training.base import PolicyModule

    readings, trims = scripted
    module = PolicyModule()
    module.model = torch.nn.Linear(1, 1, bias=False)
    module.configure_export("out", "val/success_act")
    module._trainer = SimpleNamespace(  # type: ignore[assignment]
        sanity_checking=False, state=SimpleNamespace(fn="fit"), global_step=5, is_global_zero=True,
        default_root_dir=str(tmp_path), callback_metrics={"val/success_act": torch.tensor(0.5)})
    order: list[str] = []
    keep = module.best.keep
    module.best.keep = lambda *a, **k: (order.append("best"), keep(*a, **k))[1]  # type: ignore[method-assign]
    readings += [2 * GB]
    module.on_validation_end()
    assert order == ["best"] and trims == ["trim"] and module.freed_memory.floor == 2 * GB
    assert module.best.path is not None and module.best.path.is_file()


def test_rows_longer_than_those_since_the_last_trim_run_on_a_trimmed_heap(scripted) -> None:
    """Blocks that shorter rows freed do not fit a longer row's tensors: the heap is trimmed before such a row."""
    readings, trims = scripted
    freed = FreedMemory()
    assert not freed.before(2048) and not trims  # the first step: no floor yet, every micro-batch is trimmed after
    readings += [GB]
    freed.release()  # the floor; the heap is fresh
    assert not freed.before(800) and freed.longest == 800 and len(trims) == 1
    assert not freed.before(1000)  # 1.25 x 800: within, the freed blocks are reused
    assert freed.longest == 1000 and len(trims) == 1
    assert freed.before(1251) and len(trims) == 2  # longer than 1.25 x 1000: trimmed first
    assert freed.fresh and freed.longest == 1251
    assert not freed.before(1500) and not freed.before(700) and len(trims) == 2
    readings += [int(2.5 * GB)]  # the micro-batch after the trim measures the working set: 1.5 GB
    assert not freed.check() and freed.working == int(1.5 * GB)
    readings += [int(3.5 * GB)]  # over it after a micro-batch: trimmed, and the rows counted from anew
    assert freed.check() and freed.longest == 0 and len(trims) == 3
    assert not freed.before(4000) and len(trims) == 3  # the first rows after a trim run on the trimmed heap


def test_the_training_modules_trim_before_longer_rows(scripted) -> None:
    from envace.training.base import PolicyModule

    readings, trims = scripted
    module = PolicyModule()  # on CPU
    module.before_micro_batch(900)  # no freed-memory tracker yet (no step ran): nothing to do
    readings += [GB]
    module.return_freed_memory()
    module.before_micro_batch(500)
    module.before_micro_batch(900)
    assert len(trims) == 2 and module.freed_memory.longest == 900
