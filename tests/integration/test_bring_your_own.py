"""A user's own environment class and task file work with no change to envace."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
from helpers import ScriptedEngine

from envace.cli.lightning import cli_main
from envace.data.tasks import load_tasks
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.worlds import RealWorld

USER_MODULE = '''
class Notes:
    """A notebook: the user's own environment."""

    def __init__(self, notes: list[str]) -> None:
        self._notes = list(notes)

    def add_note(self, text: str) -> dict:
        """Add a note.

        Args:
            text: the note.
        """
        self._notes.append(text)
        return {"count": len(self._notes)}

    def count_notes(self) -> dict:
        """How many notes there are."""
        return {"count": len(self._notes)}
'''

TASK = {
    "id": "notes-1",
    "messages": [{"role": "user", "content": "Add the note 'milk' and tell me how many notes there are."}],
    "success": {"calls": [{"name": "add_note", "arguments": {"text": "milk"}}], "answer": {"equals": "3"}},
    "environment": {"class_path": "user_notes.Notes", "init_args": {"notes": ["a", "b"]}},
}


@pytest.fixture
def task_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "user_notes.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "notes.jsonl"
    path.write_text(json.dumps(TASK) + "\n")
    return path


def test_user_environment_tools_are_derived_and_executed(task_file: Path, tiny_tokenizer) -> None:
    (task,) = load_tasks(task_file)
    assert sorted(t["function"]["name"] for t in task.tools) == ["add_note", "count_notes"]
    act = ScriptedEngine(tiny_tokenizer, ['<tool_call>{"name": "add_note", "arguments": {"text": "milk"}}</tool_call>',
                                          "3"])
    world = RealWorld()
    (episode,) = EpisodeRunner(tiny_tokenizer, RolloutConfig(check_render=True)).run([task], [0], act, world)
    assert episode.stats.real_calls == 1
    assert json.loads(episode.messages[2]["content"]) == {"count": 3}
    assert episode.final_answer == "3"


@pytest.mark.slow
def test_envace_validate_runs_a_user_task_file(task_file: Path, tmp_path: Path) -> None:
    config = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(["validate", "--config", config, f"--data.val_tasks={task_file}", "--data.eval_batch_size=1",
                        f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    assert "val/success_act" in cli.trainer.callback_metrics
