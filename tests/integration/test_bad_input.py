"""Bad input fails early, in one line naming the problem, before any model is built."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli.lightning import cli_main as main
from envace.data.task_schema import TaskFormatError

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


def test_checkpoint_from_another_tokenizer_is_refused(tmp_path: Path) -> None:
    from envace.policy import HFPolicy
    from envace.policy.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    small = build_tokenizer(vocab_size=600)  # another tokenizer, with fewer tokens
    model = build_model(small, hidden=16, layers=1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"has \d+ tokens but the model's embedding has \d+ rows; .*another tokenizer"):
        HFPolicy(str(tmp_path)).build()


def test_generator_parameters_out_of_range_and_unknown_templates_are_named() -> None:
    from envace.builtin.make_tasks import generate_tasks

    with pytest.raises(ValueError, match="n"):
        generate_tasks(0, seed=1)
    with pytest.raises(ValueError, match="seed"):
        generate_tasks(3, seed=-1)
    with pytest.raises(ValueError, match="no_such_template"):
        generate_tasks(3, seed=1, templates=["balance", "no_such_template"])
