"""``envace test --model.test_group_by=KEY``: success and task counts per value of ``metadata[KEY]``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli.lightning import cli_main

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


def bank_task(task_id: str, answer: str, metadata: dict | None) -> dict:
    """A task the scripted act role (get_balance A1, then "120") solves exactly when ``answer`` is "120"."""
    record = {
        "id": task_id,
        "messages": [{"role": "user", "content": "What is the balance of account A1?"}],
        "success": {"calls": [{"name": "get_balance", "arguments": {"account": "A1"}}], "answer": {"equals": answer}},
        "environment": {"class_path": "envace.builtin.bank.Bank", "init_args": {"balances": {"A1": 120}}},
    }
    if metadata is not None:
        record["metadata"] = metadata
    return record


@pytest.mark.slow
def test_envace_test_logs_success_per_metadata_value(tmp_path: Path, scripted_act: None) -> None:
    tasks = [
        bank_task("e1", "120", {"difficulty": "easy"}),
        bank_task("e2", "120", {"difficulty": "easy", "other": 1}),
        bank_task("h1", "120", {"difficulty": "hard / long"}),
        bank_task("h2", "999", {"difficulty": "hard / long"}),
        bank_task("n1", "999", None),
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")
    args = ["test", "--config", TINY, f"--data.test_tasks={path}", "--data.eval_batch_size=2",
            "--model.test_group_by=difficulty", "--model.eval_imagined=false", "--model.eval_fidelity=false",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.callbacks=[]"]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["test/success_act"] == pytest.approx(3 / 5)
    expected = {
        "test/success_act/difficulty=easy": 1.0, "test/tasks/difficulty=easy": 2.0,
        "test/success_act/difficulty=hard_long": 0.5, "test/tasks/difficulty=hard_long": 2.0,
        "test/success_act/difficulty=none": 0.0, "test/tasks/difficulty=none": 1.0,
    }
    assert {k: v for k, v in metrics.items() if "difficulty=" in k} == pytest.approx(expected)
