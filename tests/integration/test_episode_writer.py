"""``EpisodeWriter`` under ``envace test``: one line per test episode, agreeing with the logged success, and the
built-in tasks' template labels give success per template."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.builtin.task_sets import load_task_set
from envace.cli.lightning import cli_main as main

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "lit_configs" / "tiny.yaml")
sys.path.insert(0, str(Path(__file__).parent))
from test_fit_tiny import _scalars  # noqa: E402


@pytest.mark.slow
def test_every_test_episode_is_written_and_agrees_with_the_logged_success(tmp_path: Path,
                                                                         scripted_act: None) -> None:
    # the scripted act role calls get_balance(A1), then answers "120"
    out = tmp_path / "episodes"
    callback = json.dumps([{"class_path": "callbacks.episode_writer.EpisodeWriter",
                            "init_args": {"output_dir": str(out)}}])
    args = ["test", "--config", TINY, f"--trainer.default_root_dir={tmp_path}", f"--trainer.callbacks={callback}",
            "--data.test_tasks=builtin:bank-test:6", "--data.eval_batch_size=4", "--model.test_group_by=template",
            "--model.eval_imagined=false", "--model.eval_fidelity=false"]
    with mock.patch.object(sys, "argv", ["envace"]):
        main(args)
    records = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    tasks = load_task_set("builtin:bank-test:6")
    assert [r["task"] for r in records] == [t.id for t in tasks]  # both batches, in order, once
    for record, task in zip(records, tasks, strict=True):
        assert record["metadata"] == {"template": task.id.split("-", 3)[3]}
        assert record["calls"] == [{"name": "get_balance", "arguments": {"account": "A1"}}]
        assert record["final_answer"] == "120" and record["stats"]["real_calls"] == 1
        assert [m["role"] for m in record["messages"]][-3:] == ["assistant", "tool", "assistant"]
    scalars = _scalars(tmp_path)
    success = sum(r["success"] for r in records) / len(records)
    assert scalars["test/success_act"][-1] == pytest.approx(success)
    for template in {r["metadata"]["template"] for r in records}:
        mine = [r["success"] for r in records if r["metadata"]["template"] == template]
        assert scalars[f"test/tasks/template={template}"][-1] == len(mine)
        assert scalars[f"test/success_act/template={template}"][-1] == pytest.approx(sum(mine) / len(mine))


def test_an_unknown_split_is_refused_by_name() -> None:
    from callbacks.episode_writer import EpisodeWriter

    with pytest.raises(ValueError, match="splits: 'train'"):
        EpisodeWriter(splits=["train"])
