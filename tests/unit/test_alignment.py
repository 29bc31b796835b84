"""World-model alignment rows: reference steps, teacher-forced targets under the rehearse prompt, caching."""

from __future__ import annotations

from functools import cache

import pytest
from torch import nn

from envace.builtin.task_sets import resolve_task_path
from envace.data.tasks import load_tasks
from envace.types import Role, Task, ToolCall
from envace.world_model.alignment import AlignmentRows, reference_steps
from envace.worlds.base import ToolRequest
from envace.worlds.rehearse import RehearseWorld


@cache
def bank() -> dict[str, Task]:
    return {t.id: t for t in load_tasks(resolve_task_path("builtin:bank"))}


# bank-0000: one reference call; bank-0002: two calls in two assistant turns
TRANSFER = ToolCall("transfer", {"source": "B7", "target": "F6", "amount": 120})
TRANSFER_REAL = '{"source": "B7", "balance": 45, "target": "F6", "amount": 120, "fee": 5}'
D9 = ToolCall("get_balance", {"account": "F6"})
D9_REAL = '{"account": "F6", "balance": 290}'


@pytest.fixture
def world(tiny_tokenizer) -> RehearseWorld:
    world = RehearseWorld()
    world.bind(tiny_tokenizer, nn.Identity())
    return world


def test_reference_steps_pair_calls_with_recorded_content_and_history() -> None:
    task = bank()["bank-train-0002-transfer_target"]
    steps = reference_steps(task)
    assert [(call, content) for call, content, _ in steps] == [(TRANSFER, TRANSFER_REAL), (D9, D9_REAL)]
    # first call: the history is the task's initial chat; second: plus the first call and its response
    assert steps[0][2] == list(task.messages)
    assert steps[1][2] == list(task.messages) + list(task.reference[:2])
    assert steps[1][2][-1]["role"] == "tool" and steps[1][2][-2]["role"] == "assistant"


def test_reference_steps_parallel_calls_share_history() -> None:
    base = bank()["bank-train-0000-balance"]
    call = {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "C9"}}}
    other = {"type": "function", "function": {"name": "get_balance", "arguments": '{"account": "F4"}'}}
    reference = (
        {"role": "assistant", "content": "", "tool_calls": [call, other]},
        {"role": "tool", "name": "get_balance", "content": "c9"},
        {"role": "tool", "name": "get_balance", "content": "f4"},
    )
    task = Task(id="par", messages=base.messages, tools=base.tools, success=base.success, reference=reference)
    steps = reference_steps(task)
    assert [(c.arguments["account"], content) for c, content, _ in steps] == [("C9", "c9"), ("F4", "f4")]
    assert steps[0][2] == steps[1][2] == list(base.messages)  # both before the assistant message
    assert reference_steps(Task(id="none", messages=base.messages, tools=base.tools, success=base.success)) == []


def test_rows_layout_and_target(world: RehearseWorld, tiny_tokenizer) -> None:
    task = bank()["bank-train-0002-transfer_target"]
    rows = AlignmentRows(tiny_tokenizer, world, max_per_task=8).rows([task])
    assert len(rows) == 2
    for row, (call, content, history) in zip(rows, reference_steps(task)):
        prompt = world.prompt(ToolRequest(task, call, history, None, 0, 0))
        n = len(prompt.ids)
        assert row.token_ids[:n] == prompt.ids  # the exact rehearse prompt of that call
        assert row.role_ids[:n] == prompt.roles
        assert row.loss_mask == [0] * n + [1] * (len(row) - n)  # 1 exactly on the target
        target = tiny_tokenizer.decode(row.token_ids[n:], skip_special_tokens=False)
        assert target == f"<execution_result>\n{content}\n</execution_result><|im_end|>"
        assert row.token_ids[-1] == tiny_tokenizer.eos_token_id
        assert len(row.role_ids) == len(row.token_ids) == len(row.loss_mask)
        assert row.align and row.role == Role.REHEARSE and row.episode_index == -1 and row.reward == 0.0


def test_recorded_content_is_normalised_like_a_parsed_rehearsal(world: RehearseWorld, tiny_tokenizer) -> None:
    base = bank()["bank-train-0000-balance"]
    call = {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "C9"}}}
    reference = (
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "name": "get_balance", "content": '{"account":"C9",  "balance":160}'},  # compact spacing
        {"role": "tool", "name": "get_balance", "content": "plain text"},  # not JSON
    )
    task = Task(id="norm", messages=base.messages, tools=base.tools, success=base.success, reference=reference)
    rows = AlignmentRows(tiny_tokenizer, world, max_per_task=8).rows([task])
    targets = [tiny_tokenizer.decode([t for t, m in zip(r.token_ids, r.loss_mask) if m]) for r in rows]
    assert targets == [
        '<execution_result>\n{"account": "C9", "balance": 160}\n</execution_result><|im_end|>',
        '<execution_result>\n{"result": "plain text"}\n</execution_result><|im_end|>',
    ]


def test_max_per_task_and_group_index(world: RehearseWorld, tiny_tokenizer) -> None:
    ids = ["bank-train-0000-balance", "bank-train-0002-transfer_target", "bank-train-0001-deposit"]
    tasks = [bank()[i] for i in ids]  # 1, 2 and 1 reference calls
    one = AlignmentRows(tiny_tokenizer, world, max_per_task=1).rows(tasks)
    assert [r.group_index for r in one] == [0, 1, 2]
    first_only = AlignmentRows(tiny_tokenizer, world, max_per_task=8).rows([tasks[1]])[0]
    assert one[1].token_ids == first_only.token_ids  # the first call of the reference is kept
    rows = AlignmentRows(tiny_tokenizer, world, max_per_task=8).rows(tasks)
    assert [r.group_index for r in rows] == [0, 1, 1, 2]  # group index = the task's position in the list
    assert all(r.align for r in rows)
    assert AlignmentRows(tiny_tokenizer, world, max_per_task=0).rows(tasks) == []


def test_cache_returns_the_same_rows(world: RehearseWorld, tiny_tokenizer) -> None:
    task, other = bank()["bank-train-0002-transfer_target"], bank()["bank-train-0000-balance"]
    builder = AlignmentRows(tiny_tokenizer, world, max_per_task=8)
    first = builder.rows([task])
    again = builder.rows([other, task])  # task now at position 1
    assert [r.token_ids for r in again[1:]] == [r.token_ids for r in first]
    assert all(a.token_ids is b.token_ids for a, b in zip(again[1:], first))  # built once, served from the cache
    assert [r.group_index for r in first] == [0, 0] and [r.group_index for r in again] == [0, 1, 1]


def test_demonstration_rows_render_each_task_once_and_follow_batch_positions(tiny_tokenizer, monkeypatch) -> None:
    from envace.world_model.alignment import DemonstrationRows

    calls = []
    render = tiny_tokenizer.apply_chat_template

    def counting(*args, **kwargs):
        calls.append(1)
        return render(*args, **kwargs)

    monkeypatch.setattr(tiny_tokenizer, "apply_chat_template", counting)
    first, second = bank()["bank-train-0000-balance"], bank()["bank-train-0002-transfer_target"]
    rows = DemonstrationRows(tiny_tokenizer, teacher_forced=True)
    a = rows.rows([first, second])
    b = rows.rows([second, first])
    assert len(calls) == 2  # one render per task id
    assert [r.group_index for r in a] == [0, 1] and [r.group_index for r in b] == [0, 1]
    assert b[0].token_ids == a[1].token_ids and all(r.align and r.role == Role.ACT for r in a + b)
    assert any(b[0].loss_mask) and not all(b[0].loss_mask)  # assistant tokens only
    assert DemonstrationRows(tiny_tokenizer).rows([first])[0].align is False


def test_a_thinking_rehearse_role_trains_the_recorded_working_first(tiny_tokenizer) -> None:
    from envace.roles.parsing import parse_execution_result
    from envace.roles.rehearse import THINK_RULE

    task = bank()["bank-train-0002-transfer_target"]
    thinking = RehearseWorld(think=True)
    thinking.bind(tiny_tokenizer, nn.Identity())
    rows = AlignmentRows(tiny_tokenizer, thinking, max_per_task=8).rows([task])
    workings = ["B7 has 170. Requested 120 + fee 5 = 125. 125 <= 170, so 170 - 125 = 45.", "F6 has 170 + 120 = 290."]
    for row, (call, content, history), working in zip(rows, reference_steps(task), workings, strict=True):
        prompt = thinking.prompt(ToolRequest(task, call, history, None, 0, 0))
        assert THINK_RULE in tiny_tokenizer.decode(prompt.ids)
        target = tiny_tokenizer.decode(row.token_ids[len(prompt.ids):], skip_special_tokens=False)
        assert target == f"<think>\n{working}\n</think>\n<execution_result>\n{content}\n</execution_result><|im_end|>"
        assert parse_execution_result(target.removesuffix("<|im_end|>")).content == content  # the result alone
    plain = RehearseWorld()
    plain.bind(tiny_tokenizer, nn.Identity())
    assert THINK_RULE not in tiny_tokenizer.decode(plain.prompt(ToolRequest(task, TRANSFER, [], None, 0, 0)).ids)
    (first, _) = AlignmentRows(tiny_tokenizer, plain, max_per_task=8).rows([task])
    assert "<think>" not in tiny_tokenizer.decode(first.token_ids)  # not thinking: the result alone, as before


def test_long_responses_count_the_working_only_when_thinking(tiny_tokenizer) -> None:
    from envace.world_model.alignment import long_responses

    task = bank()["bank-train-0002-transfer_target"]
    _, total, plain = long_responses([task], tiny_tokenizer, 1000)
    _, _, thinking = long_responses([task], tiny_tokenizer, 1000, think=True)
    assert total == 2 and thinking > plain


def test_the_alignment_prompter_keeps_thinking() -> None:
    from envace.worlds.rehearse import alignment_prompter

    assert alignment_prompter(RehearseWorld(think=True)).think and not alignment_prompter(RehearseWorld()).think


def test_a_frozen_simulator_of_a_thinking_warm_start_thinks(tiny_tokenizer) -> None:
    from envace.roles.rehearse import THINK_RULE
    from envace.worlds import FrozenWorld
    from envace.worlds.rehearse import alignment_prompter

    task = bank()["bank-train-0002-transfer_target"]
    request = ToolRequest(task, TRANSFER, [], None, 0, 0)
    for think in (True, False):
        frozen = FrozenWorld(think=think)
        RehearseWorld.bind(frozen, tiny_tokenizer, nn.Identity())  # the prompts alone (no frozen copy to build)
        assert (THINK_RULE in tiny_tokenizer.decode(frozen.prompt(request).ids)) is think
        assert alignment_prompter(frozen).think is think  # the policy's own rows and probes think as it does


def test_live_pairs_give_rows_only_to_a_rehearse_role_that_does_not_think(tiny_tokenizer) -> None:
    from envace.types import Episode, EpisodeStats, Rehearsal, Sample

    task = bank()["bank-train-0002-transfer_target"]
    request = ToolRequest(task, TRANSFER, [], None, 0, 3)
    real = Rehearsal(TRANSFER, TRANSFER_REAL, True, source="real", real=TRANSFER_REAL, request=request)
    rehearsed = Rehearsal(D9, D9_REAL, True, source="rehearse", real=None, request=request)
    episode = Episode(task, 3, [], Sample([1], [0], [0], Role.ACT, 0, 3), rehearsals=[real, rehearsed],
                      stats=EpisodeStats())
    plain, thinking = RehearseWorld(), RehearseWorld(think=True)
    for world in (plain, thinking):
        world.bind(tiny_tokenizer, nn.Identity())
    (row,) = AlignmentRows(tiny_tokenizer, plain, max_per_task=8).live_rows([episode], max_rows=8)
    assert row.align and row.group_index == 3  # the real answer, not the rehearsed one
    target = tiny_tokenizer.decode([t for t, m in zip(row.token_ids, row.loss_mask) if m], skip_special_tokens=False)
    assert target == f"<execution_result>\n{TRANSFER_REAL}\n</execution_result><|im_end|>"
    # no working is known for a live pair: the result alone would teach a thinking role to stop working
    assert AlignmentRows(tiny_tokenizer, thinking, max_per_task=8).live_rows([episode], max_rows=8) == []


def test_rows_longer_than_the_rollout_context_are_cut_and_untrained_ones_dropped(world, tiny_tokenizer) -> None:
    from envace.types import Sample
    from envace.world_model.alignment import DemonstrationRows, RowCap

    row = Sample(list(range(10)), [0] * 6 + [4] * 4, [0] * 6 + [1] * 4, Role.REHEARSE, -1, -1)
    cap = RowCap(8)
    with pytest.warns(UserWarning, match=r"a rehearse row of 10 tokens is longer than rollout.max_context_tokens=8"):
        cut = cap(row, "a rehearse row")
    assert cut is not None and cut.token_ids == list(range(8)) and cut.loss_mask == [0] * 6 + [1, 1]
    assert cut.role_ids == [0] * 6 + [4, 4]
    assert RowCap(6)(row, "a rehearse row") is None  # nothing trained left: dropped
    assert RowCap(10)(row, "x") is row and RowCap(0)(row, "x") is row  # within the cap, or no cap
    assert (cap.cut, cap.dropped) == (1, 0)

    task = bank()["bank-train-0002-transfer_target"]
    whole = AlignmentRows(tiny_tokenizer, world, max_per_task=8).rows([task])
    act = DemonstrationRows(tiny_tokenizer).rows([task])[0]
    n = min(len(r) for r in whole) - 1  # every row is cut; the rehearse rows' targets are their last tokens
    with pytest.warns(UserWarning, match="longer than rollout.max_context_tokens"):
        capped = AlignmentRows(tiny_tokenizer, world, max_per_task=8, cap=RowCap(n)).rows([task])
    assert [len(r) for r in capped] == [n] * len(capped) and len(capped) <= len(whole)
    assert all(any(r.loss_mask) for r in capped)
    first_trained = act.loss_mask.index(1)
    with pytest.warns(UserWarning, match="an act row"):
        (short,) = DemonstrationRows(tiny_tokenizer, cap=RowCap(first_trained + 1)).rows([task])
    assert short.token_ids == act.token_ids[: first_trained + 1] and sum(short.loss_mask) == 1
