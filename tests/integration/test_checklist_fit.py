"""A tiny ``envace fit`` on rows in the EnvACE authors' format, scored by the checklist reward with a scripted
judge: the checklist pass rates and the judge counters reach TensorBoard, and a judge that fails masks its group."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
from helpers import make_row
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envace.cli.lightning import cli_main
from envace.rewards import ChecklistReward, ScriptedJudge

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


def _fit(tmp_path: Path, judge: ScriptedJudge, *extra: str) -> dict[str, list[float]]:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([make_row(i) for i in range(4)]), encoding="utf-8")
    args = ["--config", TINY, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]",
            f"--data.train_tasks=reference:{rows}", f"--data.val_tasks=reference:{rows}",
            "--model.world=envace.worlds.RehearseWorld", "--model.eval_world=envace.worlds.RehearseWorld",
            "--model.audit=null", "--model.guard=null", "--model.grpo.group_size=2",
            "--model.rollout.act_max_new_tokens=16", "--model.rollout.rehearse_max_new_tokens=16",
            "--model.rollout.max_steps_per_user_turn=2", *extra]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args, run=False)
    cli.model.rewards = [ChecklistReward(judge)]
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except RuntimeError as err:
        if "JudgeUnavailable" not in str(err):
            raise
        (tmp_path / "stopped.txt").write_text(str(err), encoding="utf-8")
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    return {tag: [e.value for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


@pytest.mark.slow
def test_a_tiny_fit_on_reference_rows_logs_checklist_pass_rates(tmp_path: Path) -> None:
    judge = ScriptedJudge(lambda request: request.standard == 0)  # the first standard of every turn passes
    scalars = _fit(tmp_path, judge)
    assert judge.calls > 0
    assert sum(scalars["train/checklist/judge_calls"]) == judge.calls
    assert set(scalars["train/checklist/pass_rate/1.1"]) == {1.0}
    assert set(scalars["train/checklist/pass_rate/1.2"]) == {0.0}
    assert set(scalars["train/checklist/judge_failures"]) == {0.0}
    assert set(scalars["train/judge_masked_episodes"]) == {0.0}
    assert "train/loss" in scalars


@pytest.mark.slow
def test_a_failed_verdict_masks_its_group_instead_of_scoring_zero(tmp_path: Path) -> None:
    seen: list[str] = []

    def first_request_fails(request):  # the judge drops the very first request it gets (a timeout, say)
        seen.append(request.prompt)
        return None if request.prompt == seen[0] else request.standard == 0

    scalars = _fit(tmp_path, ScriptedJudge(first_request_fails, retries=0))
    # step 1: the first judged episode failed; its group partner was judged fine but is masked with it
    assert scalars["train/judge_masked_episodes"] == [1.0, 0.0]
    assert scalars["train/failed_episodes"] == [2.0, 0.0]
    assert scalars["train/checklist/judge_failures"][0] == 1.0
    assert len(scalars["train/loss"]) == 2  # the other group still trained at step 1


@pytest.mark.slow
def test_a_judge_that_always_fails_stops_the_run_instead_of_scoring_zero(tmp_path: Path) -> None:
    scalars = _fit(tmp_path, ScriptedJudge(lambda request: None), "--model.grpo.max_failed_steps=3")
    assert min(scalars["train/checklist/judge_failures"]) > 0
    assert scalars["train/failed_episodes"] == [4.0, 4.0]  # every episode, none scored 0; the 3rd step stops
    assert "train/loss" not in scalars  # nothing left to learn from: the update was skipped, not fed zeros
    # no optimiser step is ever taken, so the run stops on grpo.max_failed_steps, naming the judge failure
    stopped = (tmp_path / "stopped.txt").read_text(encoding="utf-8")
    assert "3 training steps in a row had every episode fail" in stopped and "gave no verdict" in stopped
