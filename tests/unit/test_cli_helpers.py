"""The command's helpers without a CLI: jsonargparse messages to one line, config keys to file:line, and
``--ckpt_path=last`` to the newest last checkpoint under the run's root."""

from __future__ import annotations

import os
from pathlib import Path

from envace.cli.lightning import latest_last_checkpoint
from envace.errors import argument_error_message, config_files, locate_key

CONFIG = """trainer:
  max_steps: 3
model:
  optimizer:
    class_path: torch.optim.AdamW
    init_args:
      lrr: 0.1
  rollout:
    max_turnz: 5
  callbacks:
    - class_path: x.Y
      init_args:
        every: 2
"""

UNION = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'envace.training.module.EnvACEModule':
        Group 'rollout' does not accept option 'max_turnz'
    - Expected a <class 'NoneType'>
  Given value type: <class 'dict'>
  Given value: {'policy': {'class_path': 'envace.policy.TinyPolicy'}}"""


def test_keys_are_found_through_init_args_and_lists(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    assert locate_key("trainer.max_steps", [str(path)]) == f"{path}:2"
    assert locate_key("model.optimizer.lrr", [str(path)]) == f"{path}:7"
    assert locate_key("model.rollout.max_turnz", [str(path)]) == f"{path}:9"
    assert locate_key("model.callbacks.every", [str(path)]) == f"{path}:13"
    assert locate_key("model.nothing", [str(path)]) is None
    assert locate_key("trainer.max_steps", [str(tmp_path / "missing.yaml")]) is None


def test_the_last_config_that_sets_a_key_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(CONFIG)
    second.write_text("x: 1\ntrainer:\n  max_steps: 9\n")
    assert locate_key("trainer.max_steps", [str(first), str(second)]) == f"{second}:3"


def test_a_union_report_becomes_one_line_naming_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    message = argument_error_message(UNION, ["fit", "--config", str(path)])
    assert message == f"{path}:9: model.rollout.max_turnz: unknown key"


def test_a_key_set_on_the_command_line_names_the_argument() -> None:
    text = ('Parser key "model":\n  Errors:\n'
            '    - Problem with given class_path \'envace.training.module.EnvACEModule\':\n'
            '        Parser key "rollout.max_turns":\n'
            "          Expected a <class 'int'>. Got value: abc\n    - Expected a <class 'NoneType'>")
    message = argument_error_message(text, ["fit", "--model.rollout.max_turns=abc"])
    assert message == "command-line argument --model.rollout.max_turns=abc: Expected a <class 'int'>. Got abc"
    assert argument_error_message("unrecognized arguments: --trainer.max_stepz=3", []) == (
        "unrecognised command-line argument(s): --trainer.max_stepz=3")


def test_config_files_of_a_command_line() -> None:
    assert config_files(["fit", "--config", "a.yaml", "-c", "b.yaml", "--config=c.yaml", "--config"]) == [
        "a.yaml", "b.yaml", "c.yaml"]


def test_ckpt_path_last_is_the_newest_last_checkpoint_under_the_root(tmp_path: Path) -> None:
    assert latest_last_checkpoint(tmp_path) is None
    old = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    new = tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last-v1.ckpt"
    other = tmp_path / "lightning_logs" / "version_2" / "checkpoints" / "last_layer.ckpt"
    for i, path in enumerate((old, new, other)):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
        os.utime(path, ns=(10**18 + i, 10**18 + i))
    assert latest_last_checkpoint(tmp_path) == new  # last_layer.ckpt is not a last checkpoint
    os.utime(old, ns=(2 * 10**18, 2 * 10**18))
    assert latest_last_checkpoint(tmp_path) == old
