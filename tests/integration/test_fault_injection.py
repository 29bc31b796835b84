"""Fault injection through ``envace fit`` on the tiny config (real world, scripted act role): a broken environment
constructor, a hung tool, a NaN reward and a NaN loss in the same run; then a run whose every episode fails, and a
run whose loss is never finite. The run survives what it can, and the TensorBoard scalars say what happened."""

from __future__ import annotations

import functools
import logging
import math
import sys
from pathlib import Path

import pytest
from helpers import RELEASE

import envace.training.optimise
from envace.builtin.bank import Bank
from envace.training.module import EnvACEModule
from envace.types import Episode

sys.path.insert(0, str(Path(__file__).parent))
from test_fit_tiny import _fit, _scalars  # noqa: E402

REAL_WORLD = ["--model.world=envace.worlds.RealWorld", "--model.world.init_args.tool_timeout_s=0.2"]
REWARDS = '--model.rewards=[{"class_path": "envace.rewards.TaskSuccess"}, ' \
          '{"class_path": "test_fault_injection.NanForEpisodeFive"}]'


class NanForEpisodeFive:
    """A broken reward: NaN for the sixth episode of every rollout, 0 for the others."""

    def __call__(self, episode: Episode) -> float:
        return float("nan") if episode.act.episode_index == 5 else 0.0


@pytest.fixture
def faulty_bank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 4th environment built in every 8 raises; the 5th ``get_balance`` call in every 7 hangs."""
    built, called = [0], [0]
    init, get_balance = Bank.__init__, Bank.get_balance

    def flaky_init(self, *args, **kwargs):
        built[0] += 1
        if built[0] % 8 == 4:
            raise ConnectionError("database unreachable")
        init(self, *args, **kwargs)

    @functools.wraps(get_balance)  # the tool schema is read from it
    def hanging_get_balance(self, account: str) -> dict:
        called[0] += 1
        if called[0] % 7 == 5:
            RELEASE.wait(5)
        return get_balance(self, account)

    monkeypatch.setattr(Bank, "__init__", flaky_init)
    monkeypatch.setattr(Bank, "get_balance", hanging_get_balance)


def _poison_loss(monkeypatch: pytest.MonkeyPatch, steps: set[int] | None) -> None:
    """The objective returns NaN in the optimiser steps numbered ``steps`` (0-based, counting skipped ones); None: in
    every step."""
    objective, optimise = envace.training.optimise.envace_objective, EnvACEModule._optimise
    count, poisoned = [0], [False]

    def nan_objective(*args, **kwargs):
        total, stats = objective(*args, **kwargs)
        if poisoned[0]:
            total = total * float("nan")
            stats = {**stats, "loss_act": stats["loss_act"] * float("nan")}
        return total, stats

    def counted_optimise(self, mb):
        poisoned[0] = steps is None or count[0] in steps
        count[0] += 1
        return optimise(self, mb)

    monkeypatch.setattr(envace.training.optimise, "envace_objective", nan_objective)
    monkeypatch.setattr(EnvACEModule, "_optimise", counted_optimise)


@pytest.mark.slow
def test_a_run_survives_a_broken_environment_a_hung_tool_a_nan_reward_and_a_nan_loss(
    tmp_path: Path, scripted_act: None, faulty_bank: None, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _poison_loss(monkeypatch, steps={0})
    with caplog.at_level(logging.WARNING, logger="envace.training.module"):
        cli = _fit(tmp_path, *REAL_WORLD, REWARDS)
    assert cli.trainer.global_step == 2  # the first optimiser step was skipped, the run went on to max_steps
    scalars = _scalars(tmp_path)
    assert scalars["train/nonfinite_skips"] == [1.0, 0.0, 0.0]
    # per rollout of 8 episodes: one environment failed to build, one episode's reward was NaN
    assert scalars["train/failed_episodes"] == [2.0, 2.0, 2.0]
    assert scalars["train/tool_timeouts"] == [1.0, 1.0, 1.0]  # the hung call was answered with a timeout error
    assert len(scalars["train/loss"]) == 2 and all(math.isfinite(v) for v in scalars["train/loss"])
    messages = [r.getMessage() for r in caplog.records if r.name == "envace.training.module"]
    assert any("RealWorld.open: ConnectionError: database unreachable" in m for m in messages)
    assert any("reward NanForEpisodeFive: returned nan" in m for m in messages)
    assert len(messages) == 6  # once per cause per step


@pytest.mark.slow
def test_a_rollout_whose_every_episode_failed_skips_the_update(tmp_path: Path, scripted_act: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_init(self, *args, **kwargs):
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(Bank, "__init__", broken_init)
    with pytest.warns(UserWarning, match="every episode of the rollout failed; the update is skipped"):
        cli = _fit(tmp_path, *REAL_WORLD, "--trainer.max_steps=-1", "--trainer.max_epochs=1",
                   "--trainer.limit_train_batches=2")
    assert cli.trainer.global_step == 0  # no optimiser step
    scalars = _scalars(tmp_path)
    assert scalars["train/failed_episodes"] == [8.0, 8.0] and "train/loss" not in scalars


@pytest.mark.slow
def test_steps_that_keep_failing_stop_the_run_naming_the_cause(tmp_path: Path, scripted_act: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An always-failing setup never reaches ``max_steps`` (skipped updates take no optimiser step): it stops."""
    def broken_init(self, *args, **kwargs):
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(Bank, "__init__", broken_init)
    with pytest.raises(RuntimeError, match=r"2 training steps in a row had every episode fail .*ConnectionError: "
                                           r"database unreachable.*grpo.max_failed_steps=2"):
        _fit(tmp_path, *REAL_WORLD, "--model.grpo.max_failed_steps=2")


@pytest.mark.slow
def test_a_loss_that_stays_non_finite_stops_the_run_with_a_clear_error(tmp_path: Path, scripted_act: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _poison_loss(monkeypatch, steps=None)
    with pytest.raises(RuntimeError, match=r"2 consecutive optimiser steps had a non-finite loss or gradient \(the "
                                           r"last at optimiser step 0: non-finite loss_act, grad_norm\)"):
        _fit(tmp_path, *REAL_WORLD, "--model.grpo.max_nonfinite_steps=2")

