"""README's "Bring your own environment" walkthrough, run as written: its class, its task line, its command.

The example is read out of README.md, so the walkthrough cannot drift from what envace accepts.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from unittest import mock

import pytest
from helpers import ScriptedEngine

from envace.cli.lightning import cli_main
from envace.data.tasks import load_tasks
from envace.rewards.scoring import score_episodes
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.worlds import RealWorld

ROOT = Path(__file__).parents[2]
SECTION = "## Bring your own environment"


def walkthrough() -> dict[str, str]:
    """The section's code blocks by language (``python``, ``json``, ``bash``), exactly one of each."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no '{SECTION}' section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    languages = [language for language, _ in blocks]
    assert sorted(languages) == ["bash", "json", "python"], languages
    return dict(blocks)


def command_args(command: str) -> tuple[dict[str, str], list[str]]:
    """``(environment variables, arguments after the envace executable)`` of the walkthrough's command."""
    words = shlex.split(command.replace("\\\n", " "))
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    executable = words.pop(0)
    assert Path(executable).name == "envace", executable
    return env, words


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The walkthrough's module and task file written where its command runs (cwd), importable as it says."""
    blocks = walkthrough()
    env, args = command_args(blocks["bash"])
    assert env == {"PYTHONPATH": "."}, "the walkthrough must say how its module is found"
    (line,) = blocks["json"].strip().splitlines()
    record = json.loads(line)
    module = record["environment"]["class_path"].rpartition(".")[0]
    train = next(a.split("=", 1)[1] for a in args if a.startswith("--data.train_tasks="))
    assert re.search(rf"`{re.escape(module)}\.py`", (ROOT / "README.md").read_text(encoding="utf-8"))
    (tmp_path / f"{module}.py").write_text(blocks["python"], encoding="utf-8")
    (tmp_path / train).write_text(line + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # the config's callbacks package, as from the repository root
    monkeypatch.syspath_prepend(str(tmp_path))  # PYTHONPATH=.
    return {"train": train, "module": module}


def test_the_walkthrough_task_is_solved_by_a_correct_agent(files: dict[str, str], tiny_tokenizer) -> None:
    (task,) = load_tasks(Path(files["train"]))
    assert task.environment is not None and task.metadata == {"difficulty": "easy"}
    assert [t["function"]["name"] for t in task.tools] == ["count"]  # derived from the class
    (call,) = task.success.calls
    assert task.success.answer is not None
    act = ScriptedEngine(tiny_tokenizer, [
        f'<tool_call>{json.dumps({"name": call.name, "arguments": call.arguments})}</tool_call>',
        task.success.answer.equals,
    ])
    (episode,) = EpisodeRunner(tiny_tokenizer, RolloutConfig(check_render=True)).run([task], [0], act, RealWorld())
    score_episodes([episode], [])
    assert json.loads(episode.messages[-2]["content"]) == {"item": "apple", "count": 3}  # the class answered
    assert episode.success and episode.stats.real_calls == 1


@pytest.mark.slow
def test_the_walkthrough_command_trains(files: dict[str, str], tmp_path: Path) -> None:
    _, args = command_args(walkthrough()["bash"])
    config = args.index("--config") + 1
    args[config] = str(ROOT / args[config])  # a repository path, as from the repository root
    args += ["--trainer.max_steps=1", "--trainer.num_sanity_val_steps=0", "--trainer.val_check_interval=1",
             "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]",
             f"--trainer.default_root_dir={tmp_path}", "--model.rollout.max_turns=2",
             "--model.rollout.act_max_new_tokens=16", "--model.rollout.rehearse_max_new_tokens=16",
             "--model.grpo.group_size=2"]
    assert args[0] == "fit"
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args)
    assert cli.trainer.global_step == 1
    (task,) = cli.datamodule.tasks["train"]
    assert task.environment is not None and task.environment.class_path == f"{files['module']}.Shelf"
    metrics = cli.trainer.callback_metrics
    assert "train/success_act" in metrics and 0.0 <= float(metrics["val/success_act"]) <= 1.0  # validated on it
