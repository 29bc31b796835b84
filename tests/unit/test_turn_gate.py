"""The rollout's turn gate: a conversation ends after a user turn whose required checklist standard was unmet (the
EnvACE authors' termination), a gate that raises fails only its episode, and the gate's verdicts are reused when the
episode is scored."""

from __future__ import annotations

import pytest
from helpers import ScriptedEngine
from test_runner import CALL_A1, call_text, two_turn_task

from envace.rewards.checklist import ChecklistReward
from envace.rewards.judges import JudgeUnavailable, ScriptedJudge
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import Episode, Standard, Task
from envace.worlds import RealWorld

DEPOSIT = call_text("deposit", {"account": "A1", "amount": 5})


@pytest.fixture
def tok(tiny_tokenizer):
    """The tiny tokenizer (its chat template renders every prompt)."""
    return tiny_tokenizer


def _run(tok, script: list[str], gate, task: Task | None = None) -> tuple[Episode, ScriptedEngine]:
    world = RealWorld()
    world.bind(tok, model=None)
    engine = ScriptedEngine(tok, script)
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True))
    (episode,) = runner.run([task or two_turn_task()], [0], engine, world, turn_gate=gate)
    assert engine.remaining == 0, "script not fully consumed"
    return episode, engine


def test_a_closed_gate_ends_the_conversation_after_the_answer(tok) -> None:
    seen: list[int] = []

    def gate(episode: Episode) -> bool:
        seen.append(len(episode.messages))
        return False

    episode, _ = _run(tok, [CALL_A1, "120"], gate)
    assert seen == [5]  # asked once, after the first turn's answer (system, user, call, tool, answer)
    assert episode.stats.gate_stop and not episode.stats.failed and episode.stats.user_turns == 1
    assert [m["role"] for m in episode.messages][-1] == "assistant" and episode.final_answer == "120"


def test_an_open_gate_is_asked_only_when_another_turn_would_follow(tok) -> None:
    calls: list[int] = []
    episode, _ = _run(tok, [CALL_A1, "120", DEPOSIT, "125"], lambda e: calls.append(1) is None)
    assert calls == [1] and episode.stats.user_turns == 2 and not episode.stats.gate_stop


def test_a_gate_that_raises_fails_only_its_episode(tok) -> None:
    def gate(episode: Episode) -> bool:
        raise JudgeUnavailable("judge http://127.0.0.1:1/v1 unreachable")

    episode, _ = _run(tok, [CALL_A1, "120"], gate)
    assert episode.stats.failed and episode.stats.failure.startswith("turn gate: JudgeUnavailable: judge http")
    assert not episode.stats.gate_stop


def _checklist_task() -> Task:
    def standard(question: str, required: bool) -> Standard:
        return Standard(question, "assistant.tool_calls", "passes", weight=0.5, required_for_next_turn=required)

    turns = ((standard("balance read?", True), standard("polite?", False)), (standard("deposit made?", False),))
    return Task(**{**two_turn_task().__dict__, "checklists": (turns,)})


@pytest.mark.parametrize("required_met", [True, False])
def test_the_checklist_gate_follows_the_required_standard_and_its_verdicts_are_reused(tok,
                                                                                      required_met: bool) -> None:
    judge = ScriptedJudge(lambda r: r.standard == 0 and required_met if r.turn == 0 else True)
    reward = ChecklistReward(judge)
    script = [CALL_A1, "120", DEPOSIT, "125"] if required_met else [CALL_A1, "120"]
    episode, _ = _run(tok, script, reward.continue_after_turn, _checklist_task())
    assert episode.stats.gate_stop is not required_met
    asked = judge.calls
    assert asked == 4  # turn 1: 2 steps x 2 standards
    score = reward(episode)
    assert judge.calls - asked == (2 if required_met else 0)  # turn 1 from the cache; turn 2 (2 steps) asked once
    # score = sum of turn rewards / 1 checklist / 2 turns: turn 1 earns 0.5 (the required standard) or 0
    assert score == pytest.approx((0.5 + 0.5) / 2 if required_met else 0.0)
    rates = reward.metrics()
    assert rates["checklist/pass_rate/1.1"] == (1.0 if required_met else 0.0)  # counted once, at scoring
