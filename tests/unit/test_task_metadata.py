"""Task ``metadata``: kept and written back, never rendered or trained on; test success grouped by one of its keys."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import ScriptedEngine, make_row

from envace.data.reference_format import row_to_task
from envace.data.task_parsing import parse_task
from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks, write_tasks
from envace.evaluation.evaluator import NO_VALUE, GroupedSuccess, PolicyEvaluator, group_value, metric_name_part
from envace.policy import TinyPolicy
from envace.policy.chat import decode
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.training.sft import SFTModule
from envace.types import Episode, EpisodeStats, Role, Sample
from envace.world_model.alignment import AlignmentRows, DemonstrationRows
from envace.worlds import RealWorld
from envace.worlds.rehearse import RehearseWorld

MARKER = "zqxmetadatamarker"
"""A word that appears in a task's metadata only: it must never reach a prompt or a training row."""


def bank_record(task_id: str = "t1", **extra: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "messages": [{"role": "user", "content": "Balance of A1?"}],
        "success": {"calls": [{"name": "get_balance", "arguments": {"account": "A1"}}], "answer": {"equals": "120"}},
        "reference": [
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}]},
            {"role": "tool", "name": "get_balance", "content": '{"account": "A1", "balance": 120}'},
            {"role": "assistant", "content": "120"},
        ],
        "environment": {"class_path": "envace.builtin.bank.Bank", "init_args": {"balances": {"A1": 120}}},
        **extra,
    }


def write(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --- the field -------------------------------------------------------------------------------------------------------


def test_metadata_is_kept_and_round_trips(tmp_path: Path) -> None:
    meta = {"difficulty": "hard", "source": {"file": "a.csv", "row": 7}, "tags": ["x", 1]}
    path = write(tmp_path, [bank_record("t1", metadata=meta), bank_record("t2"), bank_record("t3", metadata=None)])
    first, second, third = load_tasks(path)
    assert first.metadata == meta
    assert second.metadata == {} and third.metadata == {}
    out = tmp_path / "out.jsonl"
    assert write_tasks([first, second], out) == {"written": 2, "skipped_schema": 0}
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["metadata"] == meta and "metadata" not in records[1]
    assert [t.metadata for t in load_tasks(out)] == [meta, {}]


@pytest.mark.parametrize("value, kind", [([1, 2], "array"), ("easy", "string"), (3, "number"), (True, "boolean")])
def test_metadata_must_be_an_object(tmp_path: Path, value: Any, kind: str) -> None:
    path = write(tmp_path, [bank_record("t1"), bank_record("t2", metadata=value)])
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path)
    assert str(info.value).startswith(f"{path}:2: field 'metadata': must be a JSON object, got ")
    assert kind in str(info.value)


def test_metadata_is_never_rendered_nor_trained_on(tiny_tokenizer) -> None:
    task = parse_task(bank_record(metadata={"note": MARKER, MARKER: 1}))
    act = ScriptedEngine(tiny_tokenizer, ['<tool_call>{"name": "get_balance", "arguments": {"account": "A1"}}'
                                          '</tool_call>', "120"])
    (episode,) = EpisodeRunner(tiny_tokenizer, RolloutConfig(check_render=True)).run([task], [0], act, RealWorld())
    assert episode.final_answer == "120" and episode.stats.real_calls == 1
    rendered = [decode(tiny_tokenizer, p) for call in act.calls for p in call]
    rendered.append(decode(tiny_tokenizer, episode.act.token_ids))
    prompter = RehearseWorld()
    prompter.bind(tiny_tokenizer, None)
    rows = AlignmentRows(tiny_tokenizer, prompter, 4).rows([task]) + DemonstrationRows(tiny_tokenizer).rows([task])
    assert len(rows) == 2
    rendered += [decode(tiny_tokenizer, row.token_ids) for row in rows]
    assert all(MARKER not in text for text in rendered)


def test_reference_rows_keep_their_data_source() -> None:
    assert row_to_task(make_row(1)).metadata == {"data_source": "checklist"}
    row = make_row(2)
    del row["data_source"]
    assert row_to_task(row).metadata == {}


# --- grouping --------------------------------------------------------------------------------------------------------


def test_group_values_are_sanitised_for_metric_names() -> None:
    def value(meta: dict[str, Any]) -> str:
        return group_value(parse_task(bank_record(metadata=meta)), "k")

    assert value({"k": "easy"}) == "easy"
    assert value({"k": "hard / long"}) == "hard_long"
    assert value({"k": "a.b-c_d"}) == "a.b-c_d"
    assert value({"k": "été"}) == "_t_"
    assert value({"k": ""}) == "empty"
    assert value({"k": 3.0}) == "3" and value({"k": True}) == "true"
    assert value({"k": {"b": 1, "a": [2]}}) == "_a_2_b_1_"  # canonical JSON {"a":[2],"b":1}
    assert value({}) == value({"k": None}) == value({"other": "x"}) == NO_VALUE == "none"
    assert metric_name_part("data source") == "data_source"


def episode(group: str | None, success: bool, failed: bool = False) -> Episode:
    meta = {} if group is None else {"level": group}
    stats = EpisodeStats()
    if failed:
        stats.fail("environment: boom")
    act = Sample([1], [int(Role.ACT)], [1], Role.ACT, 0, 0)
    return Episode(parse_task(bank_record(metadata=meta)), 0, [], act, stats=stats, success=success)


def test_grouped_success_counts_hand_computed() -> None:
    grouped = GroupedSuccess("level")
    grouped.update([episode("easy", True), episode("easy", False), episode("easy", True)])
    grouped.update([episode("hard", False), episode("hard", True, failed=True), episode(None, True)])
    assert grouped.compute() == {
        "success_act/level=easy": pytest.approx(2 / 3), "tasks/level=easy": 3.0,
        "success_act/level=hard": 0.0, "tasks/level=hard": 2.0,  # the failed episode is left out of the mean
        "success_act/level=none": 1.0, "tasks/level=none": 1.0,
    }
    other = {"easy": [1, 1, 1], "mid": [2, 2, 1]}
    merged = grouped.merge([grouped.counts, other])
    assert merged == {"easy": [4, 4, 3], "hard": [2, 1, 0], "none": [1, 1, 1], "mid": [2, 2, 1]}
    assert grouped.compute(merged)["success_act/level=easy"] == 0.75
    assert list(grouped.compute(merged)) == [f"{m}/level={g}" for g in ("easy", "hard", "mid", "none")
                                             for m in ("success_act", "tasks")]
    with pytest.raises(ValueError, match="non-empty"):
        GroupedSuccess("")


def test_the_evaluator_logs_the_groups_of_test_only_and_resets() -> None:
    evaluator = PolicyEvaluator(RealWorld(), RehearseWorld(), [], RolloutConfig(), fidelity=False, imagined=False,
                                group_by="level")
    logged: list[dict[str, float]] = []
    module = SimpleNamespace(trainer=SimpleNamespace(world_size=1),
                             log_dict=lambda values, sync_dist: logged.append(dict(values)))
    assert evaluator.grouped is not None
    evaluator.grouped.update([episode("a b", True), episode("a b", False)])
    evaluator.log_epoch(module, "val")  # type: ignore[arg-type]
    assert logged == []
    evaluator.log_epoch(module, "test")  # type: ignore[arg-type]
    assert logged == [{"test/success_act/level=a_b": 0.5, "test/tasks/level=a_b": 2.0}]
    evaluator.log_epoch(module, "test")  # type: ignore[arg-type]
    assert len(logged) == 1  # counted once: reset after logging, nothing new to log


def test_modules_take_test_group_by() -> None:
    from envace.training.module import EnvACEModule

    module = EnvACEModule(TinyPolicy(), test_group_by="difficulty")
    assert module.evaluator.grouped is not None and module.evaluator.grouped.key == "difficulty"
    assert EnvACEModule(TinyPolicy()).evaluator.grouped is None
    sft = SFTModule(TinyPolicy(), eval_world=RealWorld(), test_group_by="difficulty")
    assert sft.evaluator is not None and sft.evaluator.grouped is not None
    with pytest.raises(ValueError, match="test_group_by needs eval_world"):
        SFTModule(TinyPolicy(), test_group_by="difficulty")
