"""An exported policy records its rehearse prompt format; a later stage with other prompts is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.policy.hf import HFPolicy
from envace.training.module import EnvACEModule
from envace.training.sft import SFTModule
from envace.worlds import FrozenWorld, HybridWorld, RealWorld, RehearseWorld
from envace.worlds.rehearse import FORMAT_FILE, check_rehearse_format, save_rehearse_format


def test_the_saved_format_round_trips_and_names_every_setting_a_rehearse_role_reads(tmp_path: Path) -> None:
    path = save_rehearse_format(RehearseWorld("Play it.", all_tools=True, think=True, max_prompt_tokens=99), tmp_path)
    assert path == tmp_path / FORMAT_FILE
    assert json.loads(path.read_text()) == {"system_prompt": "Play it.", "show_act_reasoning": False,
                                            "all_tools": True, "think": True}  # not the prompt budget
    check_rehearse_format(RehearseWorld("Play it.", all_tools=True, think=True, max_prompt_tokens=7), tmp_path)
    check_rehearse_format(RehearseWorld(), tmp_path / "elsewhere")  # no record there: nothing to check
    check_rehearse_format(RehearseWorld(), None)  # a policy without a local directory


def test_other_settings_are_refused_with_the_file_and_both_values(tmp_path: Path) -> None:
    save_rehearse_format(RehearseWorld(think=True), tmp_path)
    with pytest.raises(ValueError) as err:
        check_rehearse_format(RehearseWorld(all_tools=True), tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / FORMAT_FILE}: ")
    assert "all_tools: trained False, here True" in message and "think: trained True, here False" in message
    assert "RealWorld(rehearse=RehearseWorld(" in message


def test_a_record_naming_fewer_settings_compares_those_and_a_broken_one_is_named(tmp_path: Path) -> None:
    (tmp_path / FORMAT_FILE).write_text('{"think": true}')
    check_rehearse_format(RehearseWorld(think=True, all_tools=True), tmp_path)
    (tmp_path / FORMAT_FILE).write_text("{think")
    with pytest.raises(ValueError, match=rf"{FORMAT_FILE}: not valid JSON"):
        check_rehearse_format(RehearseWorld(), tmp_path)
    (tmp_path / FORMAT_FILE).write_text("[true]")
    with pytest.raises(ValueError, match="expected a JSON object .* got list"):
        check_rehearse_format(RehearseWorld(), tmp_path)


@pytest.mark.parametrize(("world", "refused"), [
    (RehearseWorld(), True),
    (RealWorld(), True),  # real tools: the alignment rows and probes would use plain prompts
    (RealWorld(rehearse=RehearseWorld(think=True)), False),
    (FrozenWorld(), True),  # the simulator of a thinking warm start must think too
    (FrozenWorld(think=True), False),
    (HybridWorld(rehearse=RehearseWorld(think=True)), False),
    (RehearseWorld(think=True), False),
])
def test_rl_refuses_a_thinking_warm_start_with_plain_rehearse_prompts_before_loading_it(
        tmp_path: Path, world, refused: bool) -> None:
    save_rehearse_format(RehearseWorld(think=True), tmp_path)  # a warm start's record, and no weights at all
    policy = HFPolicy(str(tmp_path))
    module = EnvACEModule(policy, world=world)
    policy.build = _loading  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="think: trained True, here False") if refused else pytest.raises(_Loading):
        module.configure_model()


class _Loading(Exception):
    """The policy's weights were about to be loaded: the format check passed."""


def _loading() -> None:
    raise _Loading


def test_sft_checks_its_rehearse_world_against_the_policy_it_continues(tmp_path: Path) -> None:
    save_rehearse_format(RehearseWorld(think=True), tmp_path)
    with pytest.raises(ValueError, match="think: trained True, here False"):
        SFTModule(HFPolicy(str(tmp_path))).configure_model()
