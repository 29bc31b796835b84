"""Bad input fails early, in one line naming the problem, before any model is built."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli import cli_main as main
from envace.data.tasks import TaskFormatError

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


@pytest.fixture
def no_model_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was built before the bad input was reported")

    monkeypatch.setattr("envace.policy.hf.build_model", refuse)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "no tasks"),
        ('{"id": "t1", "messages": [}\n', ":1:"),
        ('{"id": "t1"}\n', "messages"),
    ],
)
def test_bad_task_file_fails_before_the_model_is_built(
    tmp_path: Path, no_model_build: None, content: str, expected: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with mock.patch.object(sys, "argv", ["envace"]), pytest.raises(TaskFormatError) as err:
        main(["fit", "--config", TINY, f"--data.train_tasks={path}", "--data.val_tasks=null",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    message = str(err.value)
    assert "\n" not in message and "tasks.jsonl" in message and expected in message


def test_missing_task_file_names_the_path(tmp_path: Path, no_model_build: None) -> None:
    missing = tmp_path / "nope.jsonl"
    with mock.patch.object(sys, "argv", ["envace"]), pytest.raises(TaskFormatError, match="nope.jsonl"):
        main(["fit", "--config", TINY, f"--data.train_tasks={missing}", "--data.val_tasks=null",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
