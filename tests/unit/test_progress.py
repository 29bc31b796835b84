"""Progress lines: the format (hand-computed times), and a line at least every interval while one step runs long."""

from __future__ import annotations

import logging
import math
import time
from types import SimpleNamespace

import pytest

from envace.runtime.progress import ProgressLines, format_duration


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (9.4, "9s"), (75.0, "1m15s"), (3725.0, "1h02m")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def _trainer(**kw: object) -> SimpleNamespace:
    base = dict(is_global_zero=True, max_steps=40, global_step=0, callback_metrics={}, sanity_checking=False,
                num_test_batches=[4], num_val_batches=[2], state=SimpleNamespace(fn="fit"))
    return SimpleNamespace(**{**base, **kw})


def test_a_line_shows_step_metrics_elapsed_and_time_left() -> None:
    progress = ProgressLines(interval_s=1000)
    trainer = _trainer()
    progress.on_train_start(trainer, None)
    started = progress._stage.started
    trainer.global_step = 10
    trainer.callback_metrics = {"train/success_act": 0.5, "train/loss_act": 1.25, "other": 3.0}
    progress.on_train_batch_end(trainer, None)
    # 10 of 40 steps in 62 s: 186 s (3m06s) left at that pace
    assert progress.line(now=started + 62) == (
        "fit: step 10/40 (25%) | train/success_act 0.500 train/loss_act 1.250 | 1m02s elapsed, about 3m06s left")
    progress.on_train_end(trainer, None)


def test_an_endless_fit_has_no_total_and_no_estimate() -> None:
    progress = ProgressLines(interval_s=1000)
    trainer = _trainer(max_steps=-1)
    progress.on_train_start(trainer, None)
    trainer.global_step = 3
    progress.on_train_batch_end(trainer, None)
    assert progress.line(now=progress._stage.started + 5) == "fit: step 3 | 5s elapsed"
    assert progress._stage.total == math.inf
    progress.on_train_end(trainer, None)


def test_lines_keep_coming_while_one_step_runs_long(caplog: pytest.LogCaptureFixture) -> None:
    progress = ProgressLines(interval_s=0.2)
    trainer = _trainer()
    with caplog.at_level(logging.INFO, logger="envace.runtime.progress"):
        progress.on_train_start(trainer, None)
        time.sleep(1.0)  # one long step: no hook runs, the timer writes the lines
        beats = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fit: step 0/40")]
        trainer.global_step = 40
        progress.on_train_end(trainer, None)
        after = len(caplog.records)
        time.sleep(0.5)
    assert len(beats) >= 2  # 1 s at one line per 0.2 s (the timer wakes at most every 0.2 s)
    assert caplog.records[0].getMessage() == "fit: started, 40 steps"
    assert caplog.records[after - 1].getMessage().startswith("fit: finished, step 40/40 (100%)")
    assert len(caplog.records) == after  # the timer stopped with the stage


def test_test_batches_are_counted_and_other_ranks_stay_quiet(caplog: pytest.LogCaptureFixture) -> None:
    progress = ProgressLines(interval_s=1000)
    with caplog.at_level(logging.INFO, logger="envace.runtime.progress"):
        quiet = _trainer(is_global_zero=False)
        progress.on_test_start(quiet, None)
        progress.on_test_batch_end(quiet, None)
        assert not caplog.records
        trainer = _trainer()
        progress.on_test_start(trainer, None)
        for _ in range(4):
            progress.on_test_batch_end(trainer, None)
        progress.on_test_end(trainer, None)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "test: started, 4 batches"
    assert messages[-1].startswith("test: finished, batch 4/4 (100%)")


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        ProgressLines(interval_s=0)
