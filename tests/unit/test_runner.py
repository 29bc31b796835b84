"""Tests for envace.rollout.runner: the episode state machine driven by scripted generations.

Every test checks the token-level bookkeeping as well as the semantic outcome: the act row holds the scripted ids
verbatim with ``Role.ACT`` and loss mask 1 exactly there; each rehearse row is the recorded rehearse prompt plus the
scripted ids with ``Role.REHEARSE`` and loss mask 1 exactly on them; and the act stream decodes to the chat template's
render of the transcript (``check_render=True`` checks this after every tool delivery, ``assert_render`` at the end).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from helpers import ScriptedEngine, ScriptEntry, call_text, entry_ids, result_text, truncated

from envace.builtin.bank import Bank
from envace.builtin.task_sets import resolve_task_path
from envace.data.tasks import load_tasks
from envace.engines.base import HFEngine
from envace.envs.real import tool_schemas_from_class
from envace.policy import TinyPolicy
from envace.policy.chat import encode, render
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import (
    EnvSpec,
    Episode,
    EpisodeStats,
    ExpectedAnswer,
    ExpectedCall,
    Role,
    Sample,
    SuccessSpec,
    Task,
    ToolCall,
)
from envace.worlds import RealWorld, RehearseWorld, World

BALANCES = {"A1": 120, "B2": 50}
WORLD_CONTEXT = "Bank accounts and balances: A1: 120, B2: 50. Fee per withdrawal or transfer: 1."




CALL_A1 = call_text("get_balance", {"account": "A1"})
CALL_B2 = call_text("get_balance", {"account": "B2"})
RESULT_A1 = result_text({"account": "A1", "balance": 120})
RESULT_B2 = result_text({"account": "B2", "balance": 50})
CONTENT_A1 = '{"account": "A1", "balance": 120}'  # json.dumps of the parsed result
CONTENT_B2 = '{"account": "B2", "balance": 50}'
BAD_JSON_CALL = '<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"\n</tool_call>'


def bank_task(task_id: str = "bank-a1", question: str = "What is the balance of account A1?") -> Task:
    """A one-question bank task with the built-in Bank's tools and environment."""
    return Task(
        id=task_id,
        messages=(
            {"role": "system", "content": "You are a bank assistant. Reply with the final number only."},
            {"role": "user", "content": question},
        ),
        tools=tuple(tool_schemas_from_class(Bank)),
        success=SuccessSpec(
            calls=(ExpectedCall("get_balance", {"account": "A1"}),), answer=ExpectedAnswer(equals="120")
        ),
        world_context=WORLD_CONTEXT,
        environment=EnvSpec("envace.builtin.bank.Bank", {"balances": BALANCES, "fee": 1}),
    )


TASK = bank_task()


@pytest.fixture
def tok(tiny_tokenizer):
    """The tiny tokenizer (its chat template renders every prompt)."""
    return tiny_tokenizer


def rehearse_world(tok, **kwargs: Any) -> RehearseWorld:
    world = RehearseWorld(**kwargs)
    world.bind(tok, model=None)  # RehearseWorld ignores the model
    return world


def run(
    tok,
    act_script: list[str | ScriptEntry],
    rehearse_script: Sequence[str | ScriptEntry] = (),
    *,
    tasks: list[Task] | None = None,
    world: World | None = None,
    **config: Any,
) -> tuple[list[Episode], ScriptedEngine, ScriptedEngine]:
    """Run scripted episodes (one of ``TASK`` by default) with render checks on; returns episodes and both engines."""
    tasks = tasks or [TASK]
    act = ScriptedEngine(tok, act_script)
    rehearse = ScriptedEngine(tok, list(rehearse_script))
    runner = EpisodeRunner(tok, RolloutConfig(**{"check_render": True, **config}))
    world = world if world is not None else rehearse_world(tok)
    episodes = runner.run(tasks, list(range(len(tasks))), act, world, world_engine=rehearse)
    assert act.remaining == 0 and rehearse.remaining == 0, "script not fully consumed"
    return episodes, act, rehearse


# -- bookkeeping assertions --------------------------------------------------------------------------------------------


def role_runs(row: Sample, role: Role) -> list[list[int]]:
    """The ids of each maximal run of consecutive tokens with ``role``."""
    runs: list[list[int]] = []
    previous = None
    for token, r in zip(row.token_ids, row.role_ids):
        if r == role:
            if previous != role:
                runs.append([])
            runs[-1].append(token)
        previous = r
    return runs


def assert_act_row(tok, episode: Episode, act_script: list[str | ScriptEntry]) -> None:
    """ACT role and loss mask 1 exactly on the generated ids, which are the scripted ids verbatim, in order."""
    row = episode.act
    assert row.role == Role.ACT and row.episode_index >= 0
    assert len(row.token_ids) == len(row.role_ids) == len(row.loss_mask)
    act_positions = [i for i, r in enumerate(row.role_ids) if r == Role.ACT]
    assert act_positions == [i for i, m in enumerate(row.loss_mask) if m == 1]
    assert role_runs(row, Role.ACT) == [entry_ids(tok, e) for e in act_script]
    assert Role.REHEARSE not in row.role_ids
    assert row.role_ids[0] == Role.SYSTEM


def assert_rehearse_rows(tok, episode: Episode, prompts: list[list[int]], script: list[str | ScriptEntry]) -> None:
    """Each rehearse row is its recorded prompt plus its scripted ids; REHEARSE role and mask 1 exactly on the ids."""
    rows = [r.sample for r in episode.rehearsals]
    assert len(rows) == len(prompts) == len(script)
    for row, prompt, entry in zip(rows, prompts, script):
        generated = entry_ids(tok, entry)
        assert row is not None and row.role == Role.REHEARSE and not row.align
        assert row.token_ids == prompt + generated
        assert row.loss_mask == [0] * len(prompt) + [1] * len(generated)
        assert row.role_ids[len(prompt) :] == [int(Role.REHEARSE)] * len(generated)
        assert Role.REHEARSE not in row.role_ids[: len(prompt)]
        assert (row.episode_index, row.group_index) == (episode.act.episode_index, episode.group_index)


def assert_render(tok, episode: Episode, act_script: list[str | ScriptEntry]) -> None:
    """The final act stream decodes to the template's render of the transcript (raw act text, tool contents)."""
    entries = iter(ScriptEntry(e) if isinstance(e, str) else e for e in act_script)
    last = None
    transcript = []
    for m in episode.messages:
        if m["role"] == "assistant":
            last = next(entries)
            transcript.append({"role": "assistant", "content": last.text})
        else:
            transcript.append({"role": m["role"], "content": m["content"]})
    decoded = tok.decode(episode.act.token_ids, skip_special_tokens=False)
    tools = list(episode.task.tools)
    if transcript[-1]["role"] != "assistant":
        assert decoded == render(tok, transcript, tools, add_generation_prompt=True)
        return
    # the stream stops where generation stopped: after the eos (finished) or mid-turn (truncated)
    tail = "\n" if last.finished else tok.eos_token + "\n"
    full = render(tok, transcript, tools, add_generation_prompt=False)
    assert full.endswith(tail) and decoded == full[: -len(tail)]


def assert_bookkeeping(
    tok, episode: Episode, act_script: list[str | ScriptEntry], rehearse: ScriptedEngine | None = None
) -> None:
    """All token-level checks of one single-episode run."""
    assert_act_row(tok, episode, act_script)
    assert_render(tok, episode, act_script)
    if rehearse is not None:
        assert_rehearse_rows(tok, episode, rehearse.prompts, rehearse.script)


def tool_delta(*contents: str) -> str:
    """What the template appends after a finished act turn for its tool responses, plus the generation prompt."""
    blocks = "".join(f"\n<tool_response>\n{c}\n</tool_response>" for c in contents)
    return f"\n<|im_start|>user{blocks}<|im_end|>\n<|im_start|>assistant\n"


def tool_messages(episode: Episode) -> list[dict[str, Any]]:
    return [m for m in episode.messages if m["role"] == "tool"]


def error_of(message: dict[str, Any]) -> dict[str, str]:
    assert message["role"] == "tool" and message["name"] == "error"
    return json.loads(message["content"])["error"]


# -- 1. a valid call ---------------------------------------------------------------------------------------------------


def test_valid_call_is_rehearsed_and_answered(tok):
    script = [CALL_A1, "120"]
    (ep,), act, rehearse = run(tok, script, [RESULT_A1])
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})]
    assert ep.final_answer == "120"
    assert ep.stats == EpisodeStats(act_turns=2, rehearse_calls=1)
    assert ep.messages[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}],
    }
    assert ep.messages[3] == {"role": "tool", "name": "get_balance", "content": CONTENT_A1}
    assert ep.messages[4] == {"role": "assistant", "content": "120"}
    assert len(ep.rehearsals) == 1 and ep.rehearsals[0].ok and ep.rehearsals[0].content == CONTENT_A1
    assert act.params == [RolloutConfig().act_params()] * 2
    assert rehearse.params == [RolloutConfig().rehearse_params()]
    assert_bookkeeping(tok, ep, script, rehearse)


def test_second_act_prompt_extends_the_first_verbatim(tok):
    (ep,), act, _ = run(tok, [CALL_A1, "120"], [RESULT_A1])
    [first], [second] = act.calls
    [generated], _ = act.outputs
    assert tok.decode(first, skip_special_tokens=False) == render(
        tok, list(TASK.messages), list(TASK.tools), add_generation_prompt=True
    )
    assert second[: len(first) + len(generated)] == first + generated  # token-level prefix preservation
    tail = second[len(first) + len(generated) :]
    assert tail == encode(tok, tool_delta(CONTENT_A1))
    assert tok.decode(tail, skip_special_tokens=False).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert ep.act.token_ids == second + act.outputs[1][0]
    start = len(first) + len(generated)
    assert ep.act.role_ids[start : start + len(tail)] == [int(Role.TOOL)] * len(tail)


def test_rehearse_prompt_shows_world_context_and_the_call(tok):
    _, _, rehearse = run(tok, [CALL_A1, "120"], [RESULT_A1])
    [[prompt]] = rehearse.calls
    text = tok.decode(prompt, skip_special_tokens=False)
    assert WORLD_CONTEXT in text
    assert 'Call to execute:\n{"name": "get_balance", "arguments": {"account": "A1"}}' in text
    assert "User: What is the balance of account A1?" in text
    assert text.endswith("<|im_start|>assistant\n")


# -- 2-4, 6. bad calls -------------------------------------------------------------------------------------------------


def test_malformed_call_gets_error_feedback_without_rehearsal(tok):
    script = [BAD_JSON_CALL, "120"]
    (ep,), act, rehearse = run(tok, script)
    assert error_of(ep.messages[3])["code"] == "JSON_DECODE_ERROR"
    assert ep.stats == EpisodeStats(act_turns=2, act_parse_errors=1)
    assert rehearse.call_count == 0 and ep.rehearsals == [] and ep.calls == []
    assert ep.final_answer == "120"
    assert act.calls[1][0][-len(encode(tok, tool_delta(ep.messages[3]["content"]))) :] == encode(
        tok, tool_delta(ep.messages[3]["content"])
    )
    assert_bookkeeping(tok, ep, script, rehearse)


def test_malformed_call_ends_the_episode_when_configured(tok):
    script = [BAD_JSON_CALL]
    (ep,), act, rehearse = run(tok, script, on_call_error="end")
    assert ep.stats == EpisodeStats(act_turns=1, act_parse_errors=1, ended_by_error=True)
    assert act.call_count == 1 and rehearse.call_count == 0
    assert ep.final_answer is None and ep.calls == []
    assert error_of(ep.messages[-1])["code"] == "JSON_DECODE_ERROR"
    assert_bookkeeping(tok, ep, script)


@pytest.mark.parametrize(
    ("call", "code", "named", "counter"),
    [
        (call_text("get_loan", {"account": "A1"}), "UNKNOWN_TOOL", "get_loan", "unknown_tools"),
        (call_text("deposit", {"account": "A1", "amount": "5"}), "INVALID_ARGUMENTS", "amount", "invalid_arguments"),
    ],
)
def test_invalid_call_gets_error_feedback_without_rehearsal(tok, call, code, named, counter):
    script = [call, "error"]
    (ep,), _, rehearse = run(tok, script)
    error = error_of(ep.messages[3])
    assert error["code"] == code and named in error["message"]
    assert ep.stats == EpisodeStats(act_turns=2, **{counter: 1})
    assert rehearse.call_count == 0 and ep.calls == [] and ep.rehearsals == []
    assert "tool_calls" not in ep.messages[2]  # the semantic message lists schema-valid calls only
    assert_bookkeeping(tok, ep, script)


def test_mixed_valid_and_invalid_calls_keep_call_order(tok):
    bad = call_text("deposit", {"account": "A1", "amount": "5"})
    script = [bad + "\n" + CALL_A1, "120"]
    (ep,), _, rehearse = run(tok, script, [RESULT_A1])
    first, second = tool_messages(ep)
    assert error_of(first)["code"] == "INVALID_ARGUMENTS"
    assert second == {"role": "tool", "name": "get_balance", "content": CONTENT_A1}
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})]
    assert ep.stats == EpisodeStats(act_turns=2, invalid_arguments=1, rehearse_calls=1)
    assert [len(c) for c in rehearse.calls] == [1]
    assert_bookkeeping(tok, ep, script, rehearse)


# -- 5. parallel calls -------------------------------------------------------------------------------------------------


def test_parallel_calls_are_rehearsed_in_one_batch(tok):
    script = [CALL_A1 + "\n" + CALL_B2, "170"]
    (ep,), act, rehearse = run(tok, script, [RESULT_A1, RESULT_B2])
    assert [len(c) for c in rehearse.calls] == [2]  # one generate call, both prompts
    texts = [tok.decode(p, skip_special_tokens=False) for p in rehearse.prompts]
    assert '"arguments": {"account": "A1"}}\n\nAnswer' in texts[0]
    assert '"arguments": {"account": "B2"}}\n\nAnswer' in texts[1]
    assert tool_messages(ep) == [
        {"role": "tool", "name": "get_balance", "content": CONTENT_A1},
        {"role": "tool", "name": "get_balance", "content": CONTENT_B2},
    ]
    assert act.calls[1][0][-len(encode(tok, tool_delta(CONTENT_A1, CONTENT_B2))) :] == encode(
        tok, tool_delta(CONTENT_A1, CONTENT_B2)
    )
    assert ep.stats == EpisodeStats(act_turns=2, rehearse_calls=2)
    assert [r.call.arguments["account"] for r in ep.rehearsals] == ["A1", "B2"]
    assert_bookkeeping(tok, ep, script, rehearse)


# -- 7. budgets --------------------------------------------------------------------------------------------------------


def test_turn_limit_ends_a_calling_episode(tok):
    script = [CALL_A1, CALL_B2]
    (ep,), act, rehearse = run(tok, script, [RESULT_A1, RESULT_B2], max_turns=2)
    assert ep.stats == EpisodeStats(act_turns=2, rehearse_calls=2, turn_limit=True)
    assert act.call_count == 2 and ep.final_answer is None
    assert_bookkeeping(tok, ep, script, rehearse)


def test_call_limit_ends_the_turn_that_would_exceed_it(tok):
    script = [CALL_A1, CALL_A1 + "\n" + CALL_B2]
    (ep,), _, rehearse = run(tok, script, [RESULT_A1], max_tool_calls=2)
    # 1 call made + 2 in the second turn = 3 > 2: the second turn is not executed
    assert ep.stats == EpisodeStats(act_turns=2, rehearse_calls=1, call_limit=True)
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})]
    assert_bookkeeping(tok, ep, script, rehearse)


def test_context_limit_before_any_generation(tok):
    prompt = EpisodeRunner(tok, RolloutConfig())._start(0, TASK, 0, rehearse_world(tok)).stream
    (ep,), act, _ = run(tok, [], act_max_new_tokens=32, max_context_tokens=len(prompt) + 31)
    assert ep.stats == EpisodeStats(context_limit=True)
    assert act.call_count == 0
    assert ep.act.token_ids == prompt.ids and ep.act.role_ids == prompt.roles and set(ep.act.loss_mask) == {0}


def test_context_limit_after_a_turn(tok):
    prompt = EpisodeRunner(tok, RolloutConfig())._start(0, TASK, 0, rehearse_world(tok)).stream
    script = [CALL_A1]
    # the first turn just fits (len(prompt) + 32 <= cap); the second prompt is longer, so it does not
    (ep,), act, rehearse = run(tok, script, [RESULT_A1], act_max_new_tokens=32, max_context_tokens=len(prompt) + 32)
    assert ep.stats == EpisodeStats(act_turns=1, rehearse_calls=1, context_limit=True)
    assert act.call_count == 1
    assert_bookkeeping(tok, ep, script, rehearse)


# -- 8. malformed rehearsals -------------------------------------------------------------------------------------------

BAD_REHEARSALS = [
    ("The balance is 120.", "NO_EXECUTION_RESULT"),
    ('<execution_result>\n{"balance": 120,}\n</execution_result>', "RESULT_JSON_DECODE_ERROR"),
]


@pytest.mark.parametrize(("output", "code"), BAD_REHEARSALS)
def test_malformed_rehearsal_is_fed_back(tok, output, code):
    script = [CALL_A1, "error"]
    (ep,), _, rehearse = run(tok, script, [output])
    [message] = tool_messages(ep)
    assert message["name"] == "get_balance" and json.loads(message["content"])["error"]["code"] == code
    assert ep.stats == EpisodeStats(act_turns=2, rehearse_calls=1, rehearse_parse_errors=1)
    assert not ep.rehearsals[0].ok and ep.final_answer == "error"
    assert_bookkeeping(tok, ep, script, rehearse)  # the malformed rehearsal is still a trained row


@pytest.mark.parametrize(("output", "code"), BAD_REHEARSALS)
def test_malformed_rehearsal_ends_the_episode_when_configured(tok, output, code):
    script = [CALL_A1]
    (ep,), act, rehearse = run(tok, script, [output], on_world_error="end")
    assert ep.stats == EpisodeStats(act_turns=1, rehearse_calls=1, rehearse_parse_errors=1, ended_by_error=True)
    assert act.call_count == 1 and ep.final_answer is None
    assert json.loads(ep.messages[-1]["content"])["error"]["code"] == code
    assert_bookkeeping(tok, ep, script, rehearse)


def test_truncated_rehearsal_is_counted(tok):
    script = [CALL_A1, "120"]
    (ep,), _, rehearse = run(tok, script, [truncated('<execution_result>\n{"account": "A1", "bal')])
    assert ep.stats == EpisodeStats(act_turns=2, rehearse_calls=1, rehearse_parse_errors=1, rehearse_truncated=1)
    assert_bookkeeping(tok, ep, script, rehearse)


# -- 9. truncated act turns --------------------------------------------------------------------------------------------


def test_truncated_act_call_is_malformed_and_render_stays_exact(tok):
    script = [truncated('<tool_call>\n{"name": "get_balance", "argu'), "120"]
    (ep,), act, _ = run(tok, script)
    assert ep.stats == EpisodeStats(act_turns=2, act_parse_errors=1, act_truncated=1)
    assert error_of(ep.messages[3])["code"] == "MALFORMED_TOOL_CALL"
    # the template closes the cut turn: that eos follows the generated ids but was not generated (not ACT, mask 0)
    [first], [second] = act.calls
    end = len(first) + len(act.outputs[0][0])
    assert second[end] == tok.eos_token_id and ep.act.role_ids[end] != Role.ACT and ep.act.loss_mask[end] == 0
    assert_bookkeeping(tok, ep, script)


def test_truncated_final_answer_ends_the_episode(tok):
    script = [truncated("The balance is 12")]
    (ep,), _, _ = run(tok, script)
    assert ep.stats == EpisodeStats(act_turns=1, act_truncated=1)
    assert ep.final_answer == "The balance is 12"
    assert ep.act.token_ids[-1] != tok.eos_token_id
    assert_bookkeeping(tok, ep, script)


# -- 10. batching ------------------------------------------------------------------------------------------------------


def test_episodes_are_batched_per_micro_step_and_finish_at_different_times(tok):
    tasks = [bank_task("a", "Balance of A1?"), bank_task("b", "Say 42."), bank_task("c", "Deposit 5 into B2.")]
    deposit = call_text("deposit", {"account": "B2", "amount": 5})
    scripts = {0: [CALL_A1, "120"], 1: ["42"], 2: [CALL_B2, deposit, "55"]}
    # micro-step k generates turn k of every episode still running, in episode order
    act_script = [CALL_A1, "42", CALL_B2, "120", deposit, "55"]
    rehearse_script = [RESULT_A1, RESULT_B2, result_text({"account": "B2", "balance": 55})]
    episodes, act, rehearse = run(tok, act_script, rehearse_script, tasks=tasks)
    assert [len(c) for c in act.calls] == [3, 2, 1]
    assert [len(c) for c in rehearse.calls] == [2, 1]
    assert [e.stats.act_turns for e in episodes] == [2, 1, 3]
    assert [e.final_answer for e in episodes] == ["120", "42", "55"]
    assert [e.task.id for e in episodes] == ["a", "b", "c"]
    assert [(e.act.episode_index, e.group_index) for e in episodes] == [(0, 0), (1, 1), (2, 2)]
    for i, ep in enumerate(episodes):
        assert_act_row(tok, ep, scripts[i])
        assert_render(tok, ep, scripts[i])
    # each later prompt continues its own episode's stream
    assert act.calls[1][0][: len(act.calls[0][0]) + len(act.outputs[0][0])] == act.calls[0][0] + act.outputs[0][0]
    assert act.calls[1][1][: len(act.calls[0][2]) + len(act.outputs[0][2])] == act.calls[0][2] + act.outputs[0][2]
    rows = rehearse.prompts
    assert_rehearse_rows(tok, episodes[0], [rows[0]], [RESULT_A1])
    assert_rehearse_rows(tok, episodes[2], [rows[1], rows[2]], rehearse_script[1:])


def test_group_of_the_same_task(tok):
    episodes, act, _ = run(tok, ["120", "121"], tasks=[TASK, TASK])
    assert [len(c) for c in act.calls] == [2] and act.calls[0][0] == act.calls[0][1]
    assert [e.final_answer for e in episodes] == ["120", "121"]


# -- lockstep (sharded models) -----------------------------------------------------------------------------------------


def other_ranks_busy_for(steps: int):
    """An ``any_active`` reduction where other ranks keep running for ``steps`` micro-steps."""
    counter = iter(range(10_000))

    def any_active(active: bool) -> bool:
        return next(counter) < steps or active

    return any_active


def test_lockstep_rank_joins_every_generation_of_a_rehearse_world(tok):
    # rank with one episode answering at once, other ranks busy 3 micro-steps: one act and one rehearse generation
    # per micro-step (dummies when idle), as on the busy ranks
    act = ScriptedEngine(tok, ["120", "", ""])
    rehearse = ScriptedEngine(tok, ["", "", ""])
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True))
    runner.run([TASK], [0], act, rehearse_world(tok), rehearse, any_active=other_ranks_busy_for(3))
    assert (act.call_count, rehearse.call_count) == (3, 3)
    assert act.calls[1:] == [[[tok.eos_token_id]]] * 2 and [p.max_new_tokens for p in act.params[1:]] == [1, 1]


def test_lockstep_rank_never_generates_for_a_real_world(tok):
    # busy ranks with a RealWorld never generate in the world step, so an idle rank must not either (a lone dummy
    # forward of a sharded model would wait forever for the other ranks)
    act = ScriptedEngine(tok, [CALL_A1, "120", ""])
    rehearse = ScriptedEngine(tok, [])
    world = RealWorld()
    world.bind(tok, model=None)
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True))
    runner.run([TASK], [0], act, world, rehearse, any_active=other_ranks_busy_for(3))
    assert (act.call_count, rehearse.call_count) == (3, 0)


# -- 11. the real world ------------------------------------------------------------------------------------------------


def test_real_world_executes_calls_on_the_bank(tok):
    deposit = call_text("deposit", {"account": "A1", "amount": 5})
    script = [deposit, CALL_A1, "125"]
    world = RealWorld()
    world.bind(tok, model=None)
    interleaved = [entry for entry in script for _ in range(2)]  # micro-step k: turn k of both episodes
    episodes, act, rehearse = run(tok, interleaved, tasks=[TASK, TASK], world=world)
    assert rehearse.call_count == 0 and [len(c) for c in act.calls] == [2, 2, 2]
    for ep in episodes:  # each episode has its own fresh bank: 120 + 5 = 125 in both
        assert [m["content"] for m in tool_messages(ep)] == [
            '{"account": "A1", "balance": 125}',
            '{"account": "A1", "balance": 125}',
        ]
        assert ep.stats == EpisodeStats(act_turns=3, real_calls=2, real_answers=2)
        assert [r.sample for r in ep.rehearsals] == [None, None] and ep.samples() == [ep.act]
        assert_act_row(tok, ep, script)
        assert_render(tok, ep, script)


def test_real_world_reports_tool_errors_as_content(tok):
    script = [call_text("withdraw", {"account": "B2", "amount": 50}), "error"]
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, script, world=world)
    # 50 + fee 1 = 51 > 50
    assert tool_messages(ep)[0]["content"] == (
        '{"error": "ValueError: insufficient funds in \'B2\': balance 50, requested 51"}'
    )
    assert ep.stats == EpisodeStats(act_turns=2, real_calls=1, real_answers=1)
    assert_bookkeeping(tok, ep, script)


def test_real_world_on_a_builtin_bank_task(tok):
    task = load_tasks(resolve_task_path("builtin:bank"))[0]  # "What is the balance of account F3?"; F3 holds 180
    script = [call_text("get_balance", {"account": "F3"}), "180"]
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, rehearse = run(tok, script, tasks=[task], world=world)
    assert tool_messages(ep) == [{"role": "tool", "name": "get_balance", "content": task.reference[1]["content"]}]
    assert task.reference[1]["content"] == '{"account": "F3", "balance": 180}'
    assert ep.stats == EpisodeStats(act_turns=2, real_calls=1, real_answers=1) and rehearse.call_count == 0
    assert ep.calls == [ToolCall("get_balance", {"account": "F3"})] and ep.final_answer == "180"
    assert_bookkeeping(tok, ep, script)

# -- 12. what the rehearse role sees -----------------------------------------------------------------------------------

REASONING_SCRIPT = ["<think>secret plan</think>\n" + CALL_A1, "<think>second thought</think>\n" + CALL_B2, "done"]


@pytest.mark.parametrize("show", [False, True])
def test_rehearse_prompt_hides_act_reasoning_unless_asked(tok, show):
    world = rehearse_world(tok, show_act_reasoning=show)
    (ep,), _, rehearse = run(tok, REASONING_SCRIPT, [RESULT_A1, RESULT_B2], world=world)
    first, second = (tok.decode(p, skip_special_tokens=False) for p in rehearse.prompts)
    assert ep.messages[2]["reasoning"] == "secret plan"
    assert "secret plan" in tok.decode(ep.act.token_ids)  # the act row keeps it
    assert WORLD_CONTEXT in first and WORLD_CONTEXT in second
    if show:
        assert "Assistant: <think>secret plan</think>\n<tool_call>" in second  # earlier turn, in the history
        assert "second thought" in second  # the calling turn's own reasoning
    else:
        assert "secret plan" not in first + second and "<think>" not in first + second
    assert_bookkeeping(tok, ep, REASONING_SCRIPT, rehearse)


def test_rehearse_prompt_shows_the_calling_turns_reasoning_when_asked(tok):
    world = rehearse_world(tok, show_act_reasoning=True)
    _, _, rehearse = run(tok, REASONING_SCRIPT[:1] + ["done"], [RESULT_A1], world=world)
    assert "secret plan" in tok.decode(rehearse.prompts[0], skip_special_tokens=False)


# -- 13. determinism with the tiny model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine():
    model, tokenizer = TinyPolicy().build()
    return HFEngine(model, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id]), tokenizer


def rows(episodes: list[Episode]) -> list[tuple[list[int], list[int], list[int]]]:
    return [(s.token_ids, s.role_ids, s.loss_mask) for e in episodes for s in e.samples()]


def sampled_run(engine: HFEngine, tokenizer, seed: int, act: Any = None) -> list[Episode]:
    config = RolloutConfig(act_max_new_tokens=12, rehearse_max_new_tokens=12, max_turns=2, check_render=True)
    torch.manual_seed(seed)
    return EpisodeRunner(tokenizer, config).run(
        [TASK, TASK], [0, 0], act or engine, rehearse_world(tokenizer), world_engine=engine
    )


def test_sampling_is_deterministic_under_a_seed(tiny_engine):
    engine, tokenizer = tiny_engine
    first, again, other = (sampled_run(engine, tokenizer, seed) for seed in (7, 7, 8))
    assert rows(first) == rows(again)
    assert rows(first) != rows(other)  # the comparison can fail: another seed samples other ids
    for ep in first:
        assert set(ep.act.loss_mask) == {0, 1}
        assert ep.act.loss_mask == [int(r == Role.ACT) for r in ep.act.role_ids]


def test_sampled_rehearsals_are_deterministic_under_a_seed(tiny_engine):
    engine, tokenizer = tiny_engine
    # scripted act role, sampled rehearse role: the random model's responses are malformed, fed back as errors
    runs = [sampled_run(engine, tokenizer, 7, ScriptedEngine(tokenizer, [CALL_A1] * 4)) for _ in range(2)]
    assert rows(runs[0]) == rows(runs[1])
    for ep in runs[0]:
        assert ep.stats.rehearse_calls == 2 and ep.stats.turn_limit
        for r in ep.rehearsals:
            assert r.sample is not None
            generated = [t for t, m in zip(r.sample.token_ids, r.sample.loss_mask) if m]
            assert 0 < len(generated) <= 12
            assert r.sample.role_ids[-len(generated) :] == [int(Role.REHEARSE)] * len(generated)



# -- multi-turn conversations (later user turns) -----------------------------------------------------------------------


def two_turn_task() -> Task:
    follow_up = ({"role": "user", "content": "Now deposit 5 into A1 and tell me the new balance."},)
    return Task(**{**TASK.__dict__, "id": "bank-two-turns", "user_turns": (follow_up,)})


def test_a_plain_answer_delivers_the_next_user_turn(tok):
    task = two_turn_task()
    deposit = call_text("deposit", {"account": "A1", "amount": 5})
    script = [CALL_A1, "120", deposit, "125"]
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, script, tasks=[task], world=world)  # check_render: the stream equals the template
    roles = [m["role"] for m in ep.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
    assert ep.messages[5] == task.user_turns[0][0]
    assert ep.call_steps == [(0, [ToolCall("get_balance", {"account": "A1"})]),
                             (1, [ToolCall("deposit", {"account": "A1", "amount": 5})])]
    assert ep.final_answer == "125" and ep.stats.user_turns == 2 and ep.stats.act_turns == 4
    assert_act_row(tok, ep, script)  # only the act role's tokens are trained; the user turn is not
    user_ids = encode(tok, task.user_turns[0][0]["content"])
    assert any(ep.act.token_ids[i : i + len(user_ids)] == user_ids for i in range(len(ep.act.token_ids)))


def test_max_user_turns_also_caps_scripted_user_turns(tok):
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, [CALL_A1, "120"], tasks=[two_turn_task()], world=world, max_user_turns=1)
    assert ep.stats.user_turn_limit and ep.stats.user_turns == 1 and ep.final_answer == "120"
    assert [m["role"] for m in ep.messages][-1] == "assistant"  # the second user turn was never delivered


def test_the_step_limit_moves_on_to_the_next_user_turn_and_then_ends(tok):
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, [CALL_A1, CALL_A1], tasks=[two_turn_task()], world=world, max_steps_per_user_turn=1)
    assert ep.stats.step_limits == 2 and ep.stats.user_turns == 2 and ep.final_answer is None
    assert [turn for turn, _ in ep.call_steps] == [0, 1]
    # the cut turn is closed by an empty assistant message before the next user turn (the stream stays the render)
    roles = [m["role"] for m in ep.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"]
    assert ep.messages[4] == {"role": "assistant", "content": ""}


def test_an_environment_never_mutates_the_recorded_call(tok):
    from envace.envs.real import RealEnvironment

    env = RealEnvironment(EnvSpec("helpers.ListKeeper"))
    call = ToolCall("keep", {"items": ["a"]})
    env.execute(call)
    env.execute(ToolCall("add", {"item": "b"}))
    assert call.arguments == {"items": ["a"]}  # the environment got a copy


def test_schema_checks_can_be_left_to_the_environment(tok):
    bad = call_text("get_balance", {"account": 5})  # the schema wants a string
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, [bad, "?"], world=world, validate_calls=False)
    assert ep.stats.invalid_arguments == 0 and ep.stats.real_calls == 1
    assert tool_messages(ep)[0]["content"] == '{"error": "ValueError: unknown account \'5\'"}'


def test_a_tool_brought_by_a_later_user_turn_is_hidden_until_then(tok):
    deposit = call_text("deposit", {"account": "A1", "amount": 5})
    task = Task(**{**two_turn_task().__dict__, "tool_unlocks": (("deposit",),)})
    assert "deposit" not in {t["function"]["name"] for t in task.visible_tools()}
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, [deposit, "?", deposit, "125"], tasks=[task], world=world)  # check_render: never rendered
    first, second = tool_messages(ep)
    assert error_of(first)["code"] == "UNKNOWN_TOOL"
    assert "deposit" not in error_of(first)["message"].split("available:")[1]  # hidden tools are never listed
    assert second["content"] == '{"account": "A1", "balance": 125}' and ep.stats.unknown_tools == 1
    # a protocol without call checks (BFCL's executor) lets the environment answer it at once
    (ep,), _, _ = run(tok, [deposit, "125", "?"], tasks=[task], world=world, validate_calls=False)
    assert tool_messages(ep)[0]["content"] == '{"account": "A1", "balance": 125}'


# -- loop rules: a benchmark's own decoder and endings -----------------------------------------------------------------


def test_without_call_checks_an_unknown_tool_reaches_the_environment(tok):
    world = RealWorld()
    world.bind(tok, model=None)
    (ep,), _, _ = run(tok, [call_text("open_vault", {}), "?"], world=world, validate_calls=False)
    assert ep.stats.unknown_tools == 0 and [c.name for c in ep.calls] == ["open_vault"]
    assert "unknown tool 'open_vault'" in tool_messages(ep)[0]["content"]  # the environment's own answer


def test_loop_rules_read_every_act_turn_and_end_episodes_where_the_benchmark_would(tok):
    from envace.roles.parsing import ParsedTurn
    from envace.rollout.rules import LoopRules, awaiting_tools

    class TwoCallsAtMost(LoopRules):
        """Reads 'A1!' as a call, and ends an episode once two calls have been answered."""

        def parse(self, text: str) -> ParsedTurn:
            if text == "A1!":
                return ParsedTurn(content="", calls=[ToolCall("get_balance", {"account": "A1"})])
            return super().parse(text)

        def stop_reason(self, episode: Episode) -> str:
            return "two_calls" if len(episode.calls) >= 2 and not awaiting_tools(episode) else ""

    world = RealWorld()
    world.bind(tok, model=None)
    act = ScriptedEngine(tok, ["A1!", CALL_A1, CALL_B2])
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True), TwoCallsAtMost())
    (ep,) = runner.run([TASK], [0], act, world)
    assert act.remaining == 1  # the third turn was never asked for
    assert ep.stats.stop_reason == "two_calls" and ep.stats.real_calls == 2 and ep.final_answer is None
    assert ep.act_outputs == [(0, "A1!"), (0, CALL_A1)]  # the raw texts, as generated
    assert [m["role"] for m in ep.messages][-1] == "tool"  # both calls were answered before the rule ended it


def test_a_loop_rule_that_raises_fails_its_episode_only(tok):
    from envace.rollout.rules import LoopRules

    class Broken(LoopRules):
        def stop_reason(self, episode: Episode) -> str:
            if episode.task.id == "bank-b2":
                raise RuntimeError("judge unavailable")
            return ""

    world = RealWorld()
    world.bind(tok, model=None)
    tasks = [TASK, bank_task("bank-b2", "What is the balance of account B2?")]
    act = ScriptedEngine(tok, [CALL_A1, "120"])
    (ok, broken) = EpisodeRunner(tok, RolloutConfig(), Broken()).run(tasks, [0, 1], act, world)
    assert ok.final_answer == "120" and not ok.stats.failed
    assert broken.stats.failed and "Broken.stop_reason: RuntimeError: judge unavailable" in broken.stats.failure
