"""Progress lines for long runs: what stage, how far, a metric, time spent and time left, also when redirected.

A progress bar redraws one terminal line; written to a file or a pipe it says nothing until the end. ``ProgressLines``
logs a plain line (logger ``envace.runtime.progress``, to stderr) when a stage starts and ends, and at least every
``interval_s`` seconds in between: a background timer writes a line even while one long step or rollout runs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import lightning as L

logger = logging.getLogger("envace.runtime.progress")

DEFAULT_METRICS = (
    "train/success_act", "train/loss_act", "train/loss_rehearse", "train/loss", "train/sft_loss_act",
    "train/sft_loss_rehearse", "val/success_act",
)
"""Metrics shown when logged (the first ``max_metrics`` of them that the run has)."""


def ensure_handler() -> None:
    """Give envace's loggers a stderr handler at INFO when the application configured none (as Lightning does)."""
    root = logging.getLogger("envace")
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    if root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


def format_duration(seconds: float) -> str:
    """``75.0`` -> ``"1m15s"``; ``3725.0`` -> ``"1h02m"``; ``9.4`` -> ``"9s"``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def elapsed_text(elapsed: float, done: float, total: float) -> str:
    """``"1m05s elapsed, about 3m15s left"``.

    No estimate before the first unit is done, after the last, or when the total is unknown (``inf``).
    """
    text = f"{format_duration(elapsed)} elapsed"
    if math.isfinite(total) and 0 < done < total:
        text += f", about {format_duration(elapsed / done * (total - done))} left"
    return text


@dataclass
class _Stage:
    """The stage being reported: its name, how far it is, and when it started."""

    name: str
    done: int
    total: float
    started: float
    unit: str


class ProgressLines(L.Callback):
    """A progress line at least every ``interval_s`` seconds on rank zero during fit, validation and test.

    Example line: ``fit: step 12/40 (30%) | train/success_act 0.500 | 1m02s elapsed, about 2m25s left``.

    Args:
        interval_s: the most seconds between two lines while a stage runs.
        metrics: logged metrics to show, when present (first ``max_metrics`` of them).
        max_metrics: how many metrics a line shows at most.
    """

    def __init__(self, interval_s: float = 30.0, metrics: tuple[str, ...] = DEFAULT_METRICS,
                 max_metrics: int = 3) -> None:
        if not interval_s > 0:
            raise ValueError(f"ProgressLines: interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.metrics = tuple(metrics)
        self.max_metrics = max_metrics
        self._stage: _Stage | None = None
        self._metrics: dict[str, float] = {}
        self._last = 0.0
        self._fit_started: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    # stages ---------------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start reporting the fit (steps out of ``max_steps``)."""
        self._start(trainer, "fit", trainer.global_step, _fit_total(trainer), "step")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """Count a step; a line if ``interval_s`` passed."""
        self._advance(trainer, trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The fit's last line."""
        self._end(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Report validation batches (a fit's own line resumes afterwards)."""
        if not trainer.sanity_checking:
            self._start(trainer, "validate", 0, _batches(trainer.num_val_batches), "batch")

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """Count a validation batch."""
        if not trainer.sanity_checking:
            self._advance(trainer, self._stage.done + 1 if self._stage else 1)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The validation's last line; then back to the fit."""
        if trainer.sanity_checking:
            return
        self._end(trainer)
        if trainer.state.fn == "fit":
            self._resume_fit(trainer)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Report test batches."""
        self._start(trainer, "test", 0, _batches(trainer.num_test_batches), "batch")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """Count a test batch."""
        self._advance(trainer, self._stage.done + 1 if self._stage else 1)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The test's last line."""
        self._end(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Stop the timer."""
        self._stop_timer()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Stop the timer."""
        self._stop_timer()

    # the line -------------------------------------------------------------------------------------------------

    def line(self, now: float | None = None) -> str:
        """The current progress line."""
        with self._lock:
            stage, metrics = self._stage, dict(self._metrics)
        if stage is None:
            return ""
        now = time.monotonic() if now is None else now
        elapsed = now - stage.started
        parts = [f"{stage.name}: {stage.unit} {stage.done}"]
        if math.isfinite(stage.total):
            percent = 100 * stage.done / stage.total if stage.total else 100
            parts[0] += f"/{int(stage.total)} ({percent:.0f}%)"
        shown = [f"{k} {v:.3f}" for k, v in metrics.items()][: self.max_metrics]
        timing = elapsed_text(elapsed, stage.done, stage.total)
        return " | ".join([parts[0], *([" ".join(shown)] if shown else []), timing])

    def _start(self, trainer: L.Trainer, name: str, done: int, total: float, unit: str) -> None:
        if not trainer.is_global_zero:
            return
        ensure_handler()
        with self._lock:
            self._stage = _Stage(name, done, total, time.monotonic(), unit)
            if name == "fit":
                self._fit_started = self._stage.started
        plural = "batches" if unit == "batch" else f"{unit}s"
        self._emit(f"{name}: started" + (f", {int(total)} {plural}" if math.isfinite(total) else ""))
        self._start_timer()

    def _resume_fit(self, trainer: L.Trainer) -> None:
        """Back to the fit after a validation, keeping its start time."""
        with self._lock:
            started = time.monotonic() if self._fit_started is None else self._fit_started
            self._stage = _Stage("fit", trainer.global_step, _fit_total(trainer), started, "step")
        self._start_timer()

    def _advance(self, trainer: L.Trainer, done: int) -> None:
        if not trainer.is_global_zero or self._stage is None:
            return
        with self._lock:
            self._stage.done = done
            self._metrics = _pick(trainer.callback_metrics, self.metrics)
        if time.monotonic() - self._last >= self.interval_s:
            self._emit(self.line())

    def _end(self, trainer: L.Trainer) -> None:
        if not trainer.is_global_zero or self._stage is None:
            return
        with self._lock:
            self._metrics = _pick(trainer.callback_metrics, self.metrics)
            if self._stage.name == "fit":
                self._stage.done = trainer.global_step
        self._emit(self.line().replace(": ", ": finished, ", 1))
        self._stop_timer()

    def _emit(self, text: str) -> None:
        if text:
            logger.info(text)
        self._last = time.monotonic()

    # the timer: a line even while one step runs longer than interval_s ------------------------------------------

    def _start_timer(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return
        self._stop.clear()
        self._timer = threading.Thread(target=self._beat, name="envace-progress", daemon=True)
        self._timer.start()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.interval_s, 5.0)):
            if time.monotonic() - self._last >= self.interval_s:
                self._emit(self.line())

    def _stop_timer(self) -> None:
        self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join(timeout=10)
        self._timer = None

def _fit_total(trainer: L.Trainer) -> float:
    """The fit's ``max_steps`` (inf when it has none)."""
    return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else math.inf


def _batches(counts: Any) -> float:
    """The total number of batches of Lightning's per-dataloader counts (inf when unknown)."""
    try:
        total = float(sum(counts))
    except TypeError:
        return math.inf
    return total if math.isfinite(total) else math.inf


def _pick(metrics: dict[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    """The ``names`` present in ``metrics``, as floats, in ``names``' order."""
    picked = {}
    for name in names:
        if name in metrics:
            try:
                picked[name] = float(metrics[name])
            except (TypeError, ValueError):
                continue
    return picked
