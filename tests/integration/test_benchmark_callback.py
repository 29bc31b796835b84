"""The benchmark evaluation callback during a tiny ``fit``: it runs BFCL multi-turn and tau^2 telecom (solo) subsets
with the policy, logs the scores to TensorBoard and writes the results files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli import cli_main as main

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")
sys.path.insert(0, str(Path(__file__).parent))
from test_fit_tiny import _scalars  # noqa: E402

CALLBACK = json.dumps([{
    "class_path": "callbacks.benchmark_eval.BenchmarkEvaluation",
    "init_args": {"every_n_steps": 1, "bfcl_limit": 1, "tau2_limit": 1, "act_max_new_tokens": 8},
}])


def _run(tmp_path: Path, command: str, *extra: str):
    """``envace <command>`` on the tiny config with the callback; returns the CLI and the callback."""
    args = [command, "--config", TINY, f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.callbacks={CALLBACK}",
            "--model.rollout.max_turns=2", "--model.rollout.act_max_new_tokens=8", *extra]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(args)
    return cli, next(c for c in cli.trainer.callbacks if type(c).__name__ == "BenchmarkEvaluation")


@pytest.mark.slow
def test_benchmark_scores_are_logged_during_a_tiny_fit(tmp_path: Path) -> None:
    _, callback = _run(tmp_path, "fit", "--trainer.max_steps=2", "--trainer.limit_val_batches=0")
    assert [r["step"] for r in callback.history] == [1, 2]  # every step; the final one is not repeated at fit end
    scalars = _scalars(tmp_path)
    for tag in ("bench/bfcl_multi_turn_base", "bench/tau2_telecom_solo_pass1", "bench/tau2_floor"):
        assert tag in scalars and len(scalars[tag]) == 2 and all(0.0 <= v <= 1.0 for v in scalars[tag]), tag
    written = sorted(p.name for p in tmp_path.rglob("results_step*"))
    assert written == ["results_step1.json", "results_step1.md", "results_step2.json", "results_step2.md"]


def test_bad_settings_are_refused_by_name() -> None:
    from callbacks.benchmark_eval import BenchmarkEvaluation

    with pytest.raises(ValueError, match="bfcl_categories: 'multi_turn_composite' is not a multi-turn category"):
        BenchmarkEvaluation(bfcl_categories=["multi_turn_composite"])
    with pytest.raises(ValueError, match="tau2_split: 'dev'"):
        BenchmarkEvaluation(tau2_split="dev")


@pytest.mark.slow
def test_the_callback_scores_a_checkpoint_under_envace_test(tmp_path: Path) -> None:
    _, callback = _run(tmp_path, "test", "--trainer.limit_test_batches=1", "--data.test_tasks=builtin:bank-test:2")
    assert len(callback.history) == 1 and set(callback.history[0]["scores"]) == {
        "bfcl_multi_turn_base", "tau2_telecom_solo_pass1", "tau2_floor"}
