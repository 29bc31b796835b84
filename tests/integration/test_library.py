"""The built-in library domain on the real SQLite MCP server: its splits, success by answer and database state, and
every template solved in the real environment by replaying its reference calls. No server outlives the tests."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from helpers import ScriptedEngine  # noqa: E402
from mcp_procs import installed_server  # noqa: E402

from envace.builtin import TASK_SETS, domain_of  # noqa: E402
from envace.builtin.generator import generate_split, render_tasks, task_key, template_of  # noqa: E402
from envace.builtin.library import HELD_OUT_TEMPLATES, TEMPLATES, TRAIN_TEMPLATES, World  # noqa: E402
from envace.builtin.library_tasks import LIBRARY, SERVER  # noqa: E402
from envace.builtin.task_sets import load_task_set  # noqa: E402
from envace.data.task_reference import reference_calls  # noqa: E402
from envace.envs.mcp_pool import close_pools  # noqa: E402
from envace.rewards.scoring import score_episodes  # noqa: E402
from envace.rewards.task_success import TaskSuccess, task_score  # noqa: E402
from envace.rollout.config import RolloutConfig  # noqa: E402
from envace.rollout.runner import EpisodeRunner  # noqa: E402
from envace.types import ToolCall  # noqa: E402
from envace.worlds import RealWorld  # noqa: E402

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def splits() -> dict[str, list]:
    return {name: load_task_set(f"builtin:library{'' if name == 'train' else '-' + name}")
            for name in ("train", "val", "test", "heldout")}


@pytest.fixture
def at_root(monkeypatch: pytest.MonkeyPatch):
    """Where the task files' server command points (the repository root); the server installed; none left after."""
    installed_server("sqlite", "mcp-server-sqlite")
    monkeypatch.chdir(ROOT)
    yield
    close_pools()


def test_names_sizes_and_templates(splits) -> None:
    assert {k for k in TASK_SETS if k.startswith("library")} == {
        "library", "library-train", "library-val", "library-test", "library-heldout"}
    assert domain_of("library-test") is LIBRARY
    assert [len(splits[s]) for s in ("train", "val", "test", "heldout")] == [320, 128, 256, 128]
    for name in ("train", "val", "test"):
        assert set(Counter(template_of(LIBRARY, t) for t in splits[name])) == set(TRAIN_TEMPLATES)
    assert set(Counter(template_of(LIBRARY, t) for t in splits["heldout"])) == set(HELD_OUT_TEMPLATES)
    assert set(TEMPLATES) == set(TRAIN_TEMPLATES) | set(HELD_OUT_TEMPLATES)
    task = splits["test"][0]
    assert sorted(t["function"]["name"] for t in task.tools) == [
        "create_table", "describe_table", "list_tables", "read_query", "write_query"]  # no append_insight
    assert task.environment is not None and task.environment.init_args["command"] == SERVER


def test_splits_are_disjoint_and_worlds_read_back(splits) -> None:
    keys = {name: {task_key(LIBRARY, t) for t in tasks} for name, tasks in splits.items()}
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"] and not keys["val"] & keys["test"]
    world = LIBRARY.world_of(splits["val"][0])
    assert isinstance(world, World) and LIBRARY.spec_of(world) == splits["val"][0].environment


def test_every_reference_succeeds_and_wrong_effects_fail(splits) -> None:
    for tasks in splits.values():
        for task in tasks:
            calls = [call for call, _ in reference_calls(task)]
            assert task_score(task, calls, task.success.answer.equals) == 1.0, task.id
    lend = next(t for t in splits["test"] if template_of(LIBRARY, t) == "lend")
    calls = [call for call, _ in reference_calls(lend)]
    answer = lend.success.answer.equals
    rewritten = [ToolCall(c.name, {"query": c.arguments["query"].replace("copies - 1", "copies-1").lower()})
                 if c.name == "write_query" else c for c in calls]
    assert task_score(lend, rewritten, answer) == 1.0  # other SQL text, same effect
    assert task_score(lend, calls[:-1], answer) == 0.5  # no loan recorded
    question = next(t for t in splits["test"]
                    if template_of(LIBRARY, t) == "copies" and t.success.state.tables["loans"])
    stray = [*(c for c, _ in reference_calls(question)), ToolCall("write_query", {"query": "DELETE FROM loans"})]
    assert task_score(question, stray, question.success.answer.equals) == 0.5  # a question answered with a write


@pytest.mark.slow
def test_a_two_step_fit_rehearses_the_library_and_validates_on_the_real_server(at_root, tmp_path: Path) -> None:
    import sys
    from unittest import mock

    from envace.cli.lightning import cli_main
    from envace.envs.mcp_pool import pool_counts

    args = ["fit", "--config", "lit_configs/tiny.yaml", "--data.train_tasks=envace/builtin/library_tasks.jsonl:8",
            "--data.val_tasks=envace/builtin/library_val.jsonl:4", "--data.batch_size=2", "--data.eval_batch_size=4",
            "--model.world=envace.worlds.RehearseWorld", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
            "--trainer.num_sanity_val_steps=0", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]", f"--trainer.default_root_dir={tmp_path}", "--model.grpo.group_size=2",
            "--model.rollout.act_max_new_tokens=16"]
    before = pool_counts().get("mcp/calls", 0.0)
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args)
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 2 and float(metrics["train/real_calls"]) == 0  # rehearsal only
    assert 0.0 <= float(metrics["val/success_act"]) <= 1.0  # validated on the real server:
    made = float(metrics["val/real_calls"])  # the untrained policy's well-formed calls, each answered by it
    assert pool_counts().get("mcp/calls", 0.0) - before == made


def test_every_template_is_solved_in_the_real_database(splits, at_root, tiny_tokenizer) -> None:
    tasks = []
    for split in ("test", "heldout"):
        seen: set[str] = set()
        for task in splits[split]:
            name = template_of(LIBRARY, task)
            if name not in seen:
                seen.add(name)
                tasks.append(task)
    turns = [[f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>"
              for c, _ in reference_calls(t)] + [t.success.answer.equals] for t in tasks]
    script = [t[k] for k in range(max(map(len, turns))) for t in turns if len(t) > k]
    config = RolloutConfig(max_turns=6, max_tool_calls=5, act_max_new_tokens=96, max_context_tokens=8192)
    episodes = EpisodeRunner(tiny_tokenizer, config).run(tasks, list(range(len(tasks))),
                                                          ScriptedEngine(tiny_tokenizer, script), RealWorld())
    score_episodes(episodes, [TaskSuccess()])
    for task, episode in zip(tasks, episodes):
        assert not episode.stats.failed, episode.stats.failure
        recorded = [content for _, content in reference_calls(task)]
        assert [m["content"] for m in episode.messages if m["role"] == "tool"] == recorded, task.id
        assert episode.success, task.id


def test_generation_is_deterministic_and_packaged(at_root, tmp_path: Path) -> None:
    val = generate_split(LIBRARY, "val", 24)
    packaged = (ROOT / "envace" / "builtin" / "library_val.jsonl").read_text().splitlines()
    assert render_tasks(LIBRARY, val).splitlines() == packaged[:24]
