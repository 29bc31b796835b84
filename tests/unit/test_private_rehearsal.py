"""Private rehearsal at test time (rollout.private_rehearsal, rollout.rehearsing) with scripted generations.

The act engine's script lists, in call order, the imagined attempts' act turns and the committed turns; the rehearse
engine's script the rehearsed responses. Every test checks that the budget is spent exactly, that the real
environment only ever sees committed calls, and that the act row holds only the committed turns, never the memory.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from helpers import ScriptedEngine, act_texts, call_text, result_text

from envace.builtin.bank import Bank
from envace.envs.real import tool_schemas_from_class
from envace.policy.chat import decode, encode, render
from envace.rollout.config import RolloutConfig
from envace.rollout.private_rehearsal import (
    MEMORY_HEADER,
    Attempt,
    GuardedCommit,
    JudgedCommit,
    MajorityCommit,
    OutcomeMajorityCommit,
    PrivateRehearsal,
    memory_text,
)
from envace.rollout.rehearsing import RehearsingRunner
from envace.rollout.runner import EpisodeRunner
from envace.types import EnvSpec, Episode, ExpectedCall, SuccessSpec, Task, ToolCall
from envace.worlds import RealWorld, RehearseWorld

CALL_A1 = call_text("get_balance", {"account": "A1"})
CALL_B2 = call_text("get_balance", {"account": "B2"})
TASK = Task(
    id="bank-a1",
    messages=({"role": "system", "content": "You are a bank assistant."},
              {"role": "user", "content": "What is the balance of account A1?"}),
    tools=tuple(tool_schemas_from_class(Bank)),
    success=SuccessSpec(calls=(ExpectedCall("get_balance", {"account": "A1"}),)),
    environment=EnvSpec("envace.builtin.bank.Bank", {"balances": {"A1": 120, "B2": 50}, "fee": 1}),
)


@pytest.fixture
def tok(tiny_tokenizer):
    return tiny_tokenizer


def run(tok, budget: PrivateRehearsal, act: list[str], rehearse: list[str], selector: Any = None,
        tasks: list[Task] | None = None, **config: Any) -> tuple[list[Episode], ScriptedEngine, ScriptedEngine,
                                                                   RehearsingRunner]:
    act_engine, rehearse_engine = ScriptedEngine(tok, act), ScriptedEngine(tok, rehearse)
    world, prompter = RealWorld(), RehearseWorld()
    world.bind(tok, model=None)
    prompter.bind(tok, model=None)
    runner = RehearsingRunner(tok, RolloutConfig(**{"check_render": True, "act_temperature": 0.0, **config}),
                              budget, prompter, selector)
    tasks = tasks or [TASK]
    episodes = runner.run(tasks, list(range(len(tasks))), act_engine, world, world_engine=rehearse_engine)
    assert act_engine.remaining == 0 and rehearse_engine.remaining == 0, "script not fully consumed"
    return episodes, act_engine, rehearse_engine, runner



def test_parallel_rehearsal_before_each_step_spends_the_budget_exactly(tok):
    budget = PrivateRehearsal(rehearsals=2, mode="parallel", granularity="step", horizon=1)
    act = [CALL_A1, CALL_B2,  # step 1: the two imagined attempts (one act turn each)
           CALL_A1,  # the committed turn, written with the memory
           "120", "120",  # step 2: two imagined answers (no call: nothing to rehearse)
           "120"]  # committed
    (ep,), act_engine, rehearse_engine, _ = run(tok, budget, act, [result_text({"balance": 120}),
                                                                   result_text({"balance": 50})])
    assert [len(call) for call in act_engine.calls] == [2, 1, 2, 1] and rehearse_engine.call_count == 1
    assert ep.stats.private_rehearsals == 4 and ep.stats.private_real_calls == 0 and ep.stats.private_commits == 0
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})] and ep.stats.real_calls == 1  # committed only
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == ['{"account": "A1", "balance": 120}']
    assert act_texts(tok, ep) == [CALL_A1, "120"] and MEMORY_HEADER not in decode(tok, ep.act.token_ids)
    # the attempts start from the real prompt; the committed turn's prompt is it plus the memory, ids kept
    real_prompt = act_engine.calls[0][0]
    assert act_engine.calls[0] == [real_prompt, real_prompt]
    commit = decode(tok, act_engine.calls[1][0])
    memory = memory_text([], 300).splitlines()[0]
    assert memory in commit and 'get_balance({"account": "B2"}) -> {"balance": 50}' in commit
    transcript = [dict(m) for m in TASK.messages]
    closed = render(tok, transcript, list(TASK.tools), add_generation_prompt=False)
    assert act_engine.calls[1][0][: len(encode(tok, closed))] == real_prompt[: len(encode(tok, closed))]
    generated = sum(len(encode(tok, t)) + 1 for t in act[:2] + act[3:5])
    rehearsed = sum(len(g) for g in rehearse_engine.generated)
    assert ep.stats.private_tokens == generated + rehearsed


def test_task_granularity_rehearses_once_with_a_horizon(tok):
    budget = PrivateRehearsal(rehearsals=3, granularity="task", horizon=2)
    act = [CALL_A1, CALL_A1, CALL_B2, "120", "120", "50",  # three attempts, two act turns each
           CALL_A1, "120"]  # the committed episode: no rehearsal before its second turn
    rehearse = [result_text({"balance": 120})] * 2 + [result_text({"balance": 50})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse)
    assert [len(call) for call in act_engine.calls] == [3, 3, 1, 1] and ep.stats.private_rehearsals == 3
    assert "answer: 50" in decode(tok, act_engine.calls[2][0]) and ep.final_answer == "120"


def test_sequential_attempts_see_the_earlier_ones(tok):
    budget = PrivateRehearsal(rehearsals=2, mode="sequential", granularity="task", horizon=1)
    act = [CALL_B2, CALL_A1, CALL_A1, "120"]
    rehearse = [result_text({"balance": 50}), result_text({"balance": 120})]
    (ep,), act_engine, rehearse_engine, _ = run(tok, budget, act, rehearse)
    assert [len(call) for call in act_engine.calls] == [1, 1, 1, 1] and rehearse_engine.call_count == 2
    first, second, commit = (decode(tok, act_engine.calls[i][0]) for i in range(3))
    assert MEMORY_HEADER not in first
    assert "Attempt 1: get_balance" in second and "Attempt 2" not in second
    assert "Attempt 1: get_balance" in commit and "Attempt 2: get_balance" in commit
    assert ep.stats.private_rehearsals == 2 and ep.stats.real_calls == 1


def test_greedy_first_plays_each_parallel_rehearsals_first_attempt_at_temperature_0(tok):
    budget = PrivateRehearsal(rehearsals=2, granularity="task", horizon=2, temperature=0.7, greedy_first=True)
    act = [CALL_A1, CALL_B2,  # turn 1 of the attempts: the greedy one in its own batch, then the sampled one
           "120", "50",  # their answers: a tie, so the earliest attempt, the greedy one, is committed
           "120"]  # the committed episode's second turn (task granularity: no rehearsal before it)
    rehearse = [result_text({"balance": 120}), result_text({"balance": 50})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse, selector=OutcomeMajorityCommit())
    assert [len(call) for call in act_engine.calls] == [1, 1, 1, 1, 1]
    assert [p.temperature for p in act_engine.params] == [0.0, 0.7, 0.0, 0.7, 0.0]
    assert ep.stats.private_commits == 1 and ep.calls == [ToolCall("get_balance", {"account": "A1"})]
    assert ep.stats.private_rehearsals == 2 and ep.final_answer == "120"


def test_greedy_first_plays_the_first_sequential_attempt_at_temperature_0(tok):
    budget = PrivateRehearsal(rehearsals=2, mode="sequential", granularity="task", horizon=1, greedy_first=True)
    act = [CALL_B2, CALL_A1, CALL_A1, "120"]  # greedy attempt, sampled attempt (with the memory), committed turns
    rehearse = [result_text({"balance": 50}), result_text({"balance": 120})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse)
    assert [p.temperature for p in act_engine.params] == [0.0, 1.0, 0.0, 0.0]
    assert "Attempt 1: get_balance" in decode(tok, act_engine.calls[1][0])  # the sampled one saw the greedy one
    assert ep.stats.private_rehearsals == 2 and ep.stats.real_calls == 1


def test_majority_commit_takes_the_attempts_own_tokens(tok):
    budget = PrivateRehearsal(rehearsals=3, granularity="task", horizon=1)
    act = [CALL_B2, CALL_A1, CALL_A1, "120"]  # no committed generation for turn 1: the majority is taken
    rehearse = [result_text({"balance": 50}), result_text({"balance": 120}), result_text({"balance": 120})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse, selector=MajorityCommit())
    assert [len(call) for call in act_engine.calls] == [3, 1] and ep.stats.private_commits == 1
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})] and act_texts(tok, ep) == [CALL_A1, "120"]


def test_judged_commit_picks_an_attempt_the_policy_judged_done(tok):
    budget = PrivateRehearsal(rehearsals=2, granularity="task", horizon=2)
    act = [CALL_B2, CALL_A1, "50", "120",  # two attempts
           "no", "yes",  # the policy's verdicts on them
           "120"]  # the committed episode's second turn (the first is attempt 2's)
    rehearse = [result_text({"balance": 50}), result_text({"balance": 120})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse, selector=JudgedCommit())
    assert [len(call) for call in act_engine.calls] == [2, 2, 2, 1]
    assert "Accomplished?" in decode(tok, act_engine.calls[2][0])
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})] and ep.stats.private_commits == 1


def test_no_budget_is_the_plain_runner(tok):
    act = [CALL_A1, "120"]
    (ep,), act_engine, _, _ = run(tok, PrivateRehearsal(rehearsals=0), act, [])
    plain_engine = ScriptedEngine(tok, act)
    world = RealWorld()
    world.bind(tok, model=None)
    (plain,) = EpisodeRunner(tok, RolloutConfig(act_temperature=0.0)).run([TASK], [0], plain_engine, world)
    assert act_engine.calls == plain_engine.calls and ep.act.token_ids == plain.act.token_ids
    assert ep.stats.private_rehearsals == 0 and ep.stats.private_tokens == 0


def test_a_token_cap_stops_rehearsing_once_spent(tok):
    budget = PrivateRehearsal(rehearsals=1, granularity="step", horizon=1, max_tokens=1)
    act = [CALL_A1, CALL_A1, "120"]  # one attempt, then the cap is spent: the second turn is not rehearsed
    (ep,), act_engine, _, _ = run(tok, budget, act, [result_text({"balance": 120})])
    assert [len(call) for call in act_engine.calls] == [1, 1, 1] and ep.stats.private_rehearsals == 1


def test_bad_budgets_are_refused_by_field() -> None:
    with pytest.raises(ValueError, match="mode: 'both'"):
        PrivateRehearsal(rehearsals=1, mode="both")
    with pytest.raises(ValueError, match="rehearsals and horizon must be >= 0"):
        PrivateRehearsal(rehearsals=-1)
    with pytest.raises(ValueError, match="granularity: 'turn'"):
        PrivateRehearsal(granularity="turn")


def test_outcome_majority_commits_an_attempt_that_reached_the_majority_answer(tok):
    budget = PrivateRehearsal(rehearsals=3, granularity="task", horizon=2)
    act = [CALL_B2, CALL_A1, CALL_A1, "50", "120", "120",  # attempts 2 and 3 agree on the (rehearsed) answer 120
           "120"]  # the committed episode's second turn; its first is attempt 2's
    rehearse = [result_text({"balance": 50}), result_text({"balance": 120}), result_text({"balance": 120})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse, selector=OutcomeMajorityCommit())
    assert [len(call) for call in act_engine.calls] == [3, 3, 1] and ep.stats.private_commits == 1
    assert ep.calls == [ToolCall("get_balance", {"account": "A1"})] and ep.final_answer == "120"


def test_selectors_on_hand_built_attempts() -> None:
    from envace.rollout.private_rehearsal import Attempt

    def attempt(key: str, answer: str | None, verdict: bool | None = None) -> Attempt:
        return Attempt([], answer, [1], key, verdict=verdict)

    a, b, c = attempt("x", "5"), attempt("y", " 7 "), attempt("y", "7")
    assert MajorityCommit().select([a, b, c]) is b  # first turn "y" twice
    assert MajorityCommit(min_share=0.9).select([a, b, c]) is None
    assert OutcomeMajorityCommit().select([a, b, c]) is b  # answer 7 twice (normalised)
    assert OutcomeMajorityCommit().select([attempt("x", None), attempt("z", None), attempt("z", "")]).first_key == "z"
    assert JudgedCommit().select([attempt("x", "5", True), b, attempt("y", "7", False)]).first_key == "x"
    assert JudgedCommit().select([a, b]) is None


BROKEN_CALL = '<tool_call>\n{"name": "get_balance", "arguments": {"account": \n</tool_call>'


def test_guarded_commit_keeps_the_greedy_turn_unless_only_it_is_imagined_to_fail() -> None:
    def attempt(key: str, *, greedy: bool = False, errors: int = 0, malformed: bool = False,
                finished: bool = True) -> Attempt:
        return Attempt([], None, [1], key, greedy=greedy, errors=errors, first_malformed=malformed,
                       first_finished=finished)

    plain, failing = attempt("g", greedy=True), attempt("g", greedy=True, errors=1)
    x, y, broken = attempt("x"), attempt("y"), attempt("z", malformed=True)
    guarded = GuardedCommit()
    assert guarded.select([plain, x, y]) is plain  # sound: budget 0's turn, whatever the others imagined
    assert guarded.select([failing, broken, y, attempt("y")]) is y  # only the sound alternatives count
    assert guarded.select([failing, broken, attempt("w", finished=False)]) is failing  # none sound: abstain
    assert guarded.select([failing, attempt("g")]) is failing  # the same turn sampled again is no alternative
    assert guarded.select([attempt("g", greedy=True, malformed=True), x]) is x
    assert GuardedCommit(min_share=0.6).select([failing, x, y]) is failing  # x and y split: no majority
    assert guarded.select([]) is None
    with pytest.raises(ValueError, match="greedy_first=True"):
        guarded.select([x, y])
    with pytest.raises(ValueError, match="min_share"):
        GuardedCommit(min_share=1.5)


def test_guarded_commit_takes_another_turn_where_the_greedy_one_is_imagined_to_fail(tok):
    budget = PrivateRehearsal(rehearsals=2, granularity="task", horizon=1, greedy_first=True)
    act = [CALL_B2, CALL_A1,  # the greedy attempt and a sampled one
           "120"]  # the committed episode's second turn; its first is the sampled attempt's
    rehearse = [result_text({"error": "KeyError: 'B2'"}), result_text({"balance": 120})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse, selector=GuardedCommit())
    assert ep.stats.private_commits == 1 and ep.calls == [ToolCall("get_balance", {"account": "A1"})]
    assert ep.final_answer == "120" and ep.stats.private_real_calls == 0
    # the episode keeps what was imagined and which attempt was committed, for the study of what rehearsal changed
    ((turn, attempts, committed),) = ep.private_attempts
    assert (turn, committed) == (0, 1) and [a["greedy"] for a in attempts] == [True, False]
    assert attempts[0]["turns"] == [[["get_balance", {"account": "B2"}, '{"error": "KeyError: \'B2\'"}']]]
    assert [a["errors"] for a in attempts] == [1, 0] and attempts[1]["turns"][0][0][2] == '{"balance": 120}'


def test_guarded_commit_never_takes_a_malformed_sampled_turn(tok):
    budget = PrivateRehearsal(rehearsals=2, granularity="task", horizon=1, greedy_first=True)
    act = [CALL_B2, BROKEN_CALL,  # the greedy attempt (imagined to fail) and a malformed sampled one
           "50"]  # the committed episode's second turn: the greedy first turn was kept
    seen: list[list[Attempt]] = []

    class Recording(GuardedCommit):
        def select(self, attempts: list[Attempt]) -> Attempt | None:
            seen.append(attempts)
            return super().select(attempts)

    (ep,), _, _, _ = run(tok, budget, act, [result_text({"error": "no such account"})], selector=Recording())
    (greedy, sampled), = seen
    assert (greedy.greedy, greedy.errors, greedy.first_malformed) == (True, 1, False)
    assert (sampled.greedy, sampled.first_malformed) == (False, True)
    assert ep.calls == [ToolCall("get_balance", {"account": "B2"})] and ep.final_answer == "50"


def test_a_guarded_commit_without_the_greedy_attempt_is_refused_before_any_episode(tok):
    from callbacks.rehearsal_budget import RehearsalBudgetAblation

    prompter = RehearseWorld()
    prompter.bind(tok, model=None)
    with pytest.raises(ValueError, match="greedy_first=True"):
        RehearsingRunner(tok, RolloutConfig(), PrivateRehearsal(rehearsals=2), prompter, GuardedCommit())
    with pytest.raises(ValueError, match="greedy_first"):
        RehearsalBudgetAblation(selector=GuardedCommit())
    RehearsalBudgetAblation(selector=GuardedCommit(), greedy_first=True)
    RehearsingRunner(tok, RolloutConfig(), PrivateRehearsal(rehearsals=0), prompter, GuardedCommit())  # no rehearsal


def test_an_environment_s_declared_error_prefixes_count_as_imagined_errors() -> None:
    from envace.rollout.private_rehearsal import error_prefixes, response_is_error

    task = replace(TASK, environment=EnvSpec("envace.envs.mcp.MCPEnvironment",
                                               {"command": "x", "error_prefixes": ["Database error:"]}))
    assert error_prefixes(task) == ("Database error:",) and error_prefixes(TASK) == ()
    assert response_is_error("Database error: no such table: book", error_prefixes(task))
    assert not response_is_error("[{'copies': 1}]", error_prefixes(task))
    assert response_is_error('{"error": "KeyError"}') and not response_is_error('{"balance": 3}')


def test_the_committed_prompt_is_the_real_conversation_plus_the_memory_and_nothing_else(tok, monkeypatch):
    from envace.envs.real import RealEnvironment

    executed: list[str] = []
    original = RealEnvironment.execute
    monkeypatch.setattr(RealEnvironment, "execute",
                        lambda self, call: executed.append(call.name) or original(self, call))
    budget = PrivateRehearsal(rehearsals=2, mode="parallel", granularity="step", horizon=2)
    act = [CALL_B2, CALL_A1, "50", "120",  # step 1: two attempts of two turns
           CALL_A1,  # committed
           "120", "121",  # step 2: two attempts answer at once
           "120"]  # committed
    rehearse = [result_text({"balance": 50}), result_text({"balance": 120})]
    (ep,), act_engine, _, _ = run(tok, budget, act, rehearse)
    assert executed == ["get_balance"]  # the committed call only: 4 imagined calls and answers reached no environment
    real = '{"account": "A1", "balance": 120}'
    transcript = [dict(m) for m in TASK.messages] + [{"role": "assistant", "content": CALL_A1},
                                                     {"role": "tool", "content": real}]
    commit = decode(tok, act_engine.calls[-1][0])
    memory = commit[commit.index(MEMORY_HEADER): commit.rindex("<|im_end|>")]
    assert memory.count("Attempt ") == 2 and "answer: 121" in memory
    expected = render(tok, [*transcript, {"role": "system", "content": memory}], list(TASK.tools),
                      add_generation_prompt=True)
    assert commit == expected  # the real history (real responses only), the memory, the generation header


def test_a_benchmark_harness_rehearses_privately_and_only_committed_calls_reach_it(tok):
    pytest.importorskip("tau2")
    from envace.benchmarks.tau2 import load_tasks
    from envace.benchmarks.tau2_eval import evaluate

    task = load_tasks("telecom", "test")[0]  # gold: toggle_data_saver_mode, then toggle_roaming (phone tools, solo)
    saver, roaming = call_text("toggle_data_saver_mode", {}), call_text("toggle_roaming", {})
    engine = ScriptedEngine(tok, [
        roaming, saver,  # two imagined first turns (the same engine plays both roles)...
        result_text({"roaming": True}), result_text({"data_saver": False}),  # ...answered by the rehearse role
        saver,  # the committed first turn (the memory in its prompt)
        roaming, call_text("done", {}),  # granularity task: no more rehearsal; tau^2's stop
    ])
    budget = PrivateRehearsal(rehearsals=2, granularity="task", horizon=1)
    result = evaluate([task], engine, tok, "telecom", "solo", rehearsal=budget)
    (episode,) = result["episodes"]
    assert engine.remaining == 0 and result["rewards"] == {task.id: [1.0]}
    assert episode.stats.private_rehearsals == 2 and episode.stats.real_calls == 2  # the committed calls only
    assert [c.name for c in episode.calls] == ["toggle_data_saver_mode", "toggle_roaming"]
