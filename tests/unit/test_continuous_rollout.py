"""Per-episode scheduling (``rollout.continuous``) runs the same state machine as lock-step micro-steps.

``KeyedEngine`` generates a function of the prompt alone, so an episode's transcript cannot depend on which order
generations finish in: a continuous rollout, whatever its order (several seeds), must give exactly the lock-step
rollout's episodes, token for token, through valid calls, two calls in one turn, malformed calls, truncated turns,
malformed rehearsals, turn limits and final answers.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import pytest
from helpers import KeyedEngine, call_text, result_text, truncated

from envace.builtin.bank import Bank
from envace.envs.real import tool_schemas_from_class
from envace.policy.chat import decode
from envace.roles.rehearse import default_system_prompt
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import EnvSpec, Episode, SuccessSpec, Task
from envace.worlds import RealWorld, RehearseWorld

CALL_A1 = call_text("get_balance", {"account": "A1"})
CALL_B2 = call_text("get_balance", {"account": "B2"})
FIRST_TURNS = [CALL_A1, f"{CALL_A1}\n{CALL_B2}", '<tool_call>\n{"name": "get_balance", "arguments": {', "It is 120.",
               truncated(CALL_A1[:12])]
LATER_TURNS = [CALL_B2, "It is 120.", CALL_A1]
REHEARSALS = [result_text({"account": "A1", "balance": 120}), result_text({"account": "B2", "balance": 50}),
              "no result block here"]
QUESTIONS = ["What is the balance of A1?", "And B2?", "Balance of A1 please.", "Tell me about B2.", "How much in A1?",
             "Is A1 above 100?", "What do I have?"]


def bank_task(i: int) -> Task:
    return Task(id=f"bank-{i}", messages=({"role": "system", "content": "You are a bank assistant."},
                                          {"role": "user", "content": QUESTIONS[i]}),
                tools=tuple(tool_schemas_from_class(Bank)), success=SuccessSpec(calls=()),
                environment=EnvSpec("envace.builtin.bank.Bank", {"balances": {"A1": 120, "B2": 50}, "fee": 1}))


TASKS = [bank_task(i) for i in range(len(QUESTIONS))]


def picker(tok) -> Any:
    """The generation for a prompt: a rehearsal, a first act turn or a later one, chosen by the prompt's hash."""
    marker = default_system_prompt()[:40]

    def pick(prompt: list[int]) -> Any:
        text = decode(tok, prompt)
        key = zlib.crc32(str(prompt).encode())
        if marker in text:
            return REHEARSALS[key % len(REHEARSALS)]
        options = LATER_TURNS if "<tool_response>" in text else FIRST_TURNS
        return options[key % len(options)]

    return pick


def summary(episode: Episode) -> tuple:
    """Everything an episode holds that training or scoring reads."""
    rehearsals = [(r.call, r.content, r.ok, r.sample.token_ids if r.sample else None,
                   r.sample.loss_mask if r.sample else None) for r in episode.rehearsals]
    return (episode.task.id, episode.group_index, episode.act.token_ids, episode.act.role_ids, episode.act.loss_mask,
            episode.messages, rehearsals, dataclasses.asdict(episode.stats), episode.final_answer)


class Unstaged:
    """A world that generates with the policy's engine in one ``respond`` (no stages), as ``HybridWorld`` does."""

    generates_with_policy = True

    def __init__(self) -> None:
        self.inner = RehearseWorld()

    def bind(self, tokenizer, model) -> None:
        self.inner.bind(tokenizer, model)

    def open(self, task):
        return None

    def respond(self, requests, engine, params):
        return self.inner.respond(requests, engine, params)


def roll(tok, world_kind: str, continuous: bool, seed: int = 0) -> tuple[list[Episode], KeyedEngine]:
    world = {"rehearse": RehearseWorld, "real": RealWorld, "unstaged": Unstaged}[world_kind]()
    world.bind(tok, model=None)
    engine = KeyedEngine(tok, picker(tok), seed=seed, continuous=True)
    config = RolloutConfig(max_turns=3, check_render=True, continuous=continuous)
    tasks = [t for t in TASKS for _ in range(2)]
    groups = [i for i in range(len(TASKS)) for _ in range(2)]
    return EpisodeRunner(tok, config).run(tasks, groups, engine, world), engine


@pytest.mark.parametrize("world_kind", ["rehearse", "real", "unstaged"])
def test_continuous_scheduling_gives_the_lockstep_episodes_in_any_finishing_order(tiny_tokenizer, world_kind) -> None:
    lockstep, engine = roll(tiny_tokenizer, world_kind, continuous=False)
    assert engine.submitted == [] and engine.generate_calls > 0
    expected = [summary(e) for e in lockstep]
    outcomes = {(e.stats.act_turns, e.final_answer is not None, e.stats.turn_limit) for e in lockstep}
    assert len(outcomes) >= 3, "the script should exercise several paths"
    for seed in range(4):
        episodes, engine = roll(tiny_tokenizer, world_kind, continuous=True, seed=seed)
        assert [summary(e) for e in episodes] == expected
        # a staged world's rehearsals are submitted one by one; an unstaged one generates its batch, while the
        # act requests still running go on (and finish) beside it
        assert (engine.generate_calls > 0) == (world_kind == "unstaged")
        later = [i for i, p in enumerate(engine.submitted) if "<tool_response>" in decode(tiny_tokenizer, p)]
        assert any(engine.running_at[i] for i in later), "a later turn should join requests still running"


def test_a_world_whose_prompts_raise_fails_its_episode_only(tiny_tokenizer) -> None:
    class Broken(RehearseWorld):
        def prompts(self, requests):
            if any(r.task.id == "bank-0" for r in requests):
                raise RuntimeError("no prompt for you")
            return super().prompts(requests)

    world = Broken()
    world.bind(tiny_tokenizer, model=None)
    engine = KeyedEngine(tiny_tokenizer, lambda p: CALL_A1 if "<tool_response>" not in decode(tiny_tokenizer, p)
                         else "It is 120.")
    engine.pick = lambda p, base=engine.pick: (REHEARSALS[0] if default_system_prompt()[:40] in decode(
        tiny_tokenizer, p) else base(p))
    episodes = EpisodeRunner(tiny_tokenizer, RolloutConfig(check_render=True)).run(TASKS[:3], [0, 1, 2], engine,
                                                                                    world)
    assert episodes[0].stats.failed and "Broken.prompts" in episodes[0].stats.failure
    assert "no prompt for you" in episodes[0].stats.failure
    assert [e.final_answer for e in episodes[1:]] == ["It is 120.", "It is 120."]
    assert not any(e.stats.failed for e in episodes[1:])


def test_an_engine_without_a_queue_and_sharded_ranks_run_lockstep(tiny_tokenizer) -> None:
    world = RehearseWorld()
    world.bind(tiny_tokenizer, model=None)
    plain = KeyedEngine(tiny_tokenizer, picker(tiny_tokenizer), continuous=False)
    EpisodeRunner(tiny_tokenizer, RolloutConfig(max_turns=3)).run(TASKS, list(range(len(TASKS))), plain, world)
    assert plain.submitted == [] and plain.generate_calls > 0
    queued = KeyedEngine(tiny_tokenizer, picker(tiny_tokenizer))
    EpisodeRunner(tiny_tokenizer, RolloutConfig(max_turns=3)).run(TASKS, list(range(len(TASKS))), queued, world,
                                                                  any_active=lambda active: active)
    assert queued.submitted == [] and queued.generate_calls > 0
    other = KeyedEngine(tiny_tokenizer, picker(tiny_tokenizer))  # a world engine on another queue
    EpisodeRunner(tiny_tokenizer, RolloutConfig(max_turns=3)).run(TASKS, list(range(len(TASKS))), queued, world,
                                                                  world_engine=other)
    assert other.submitted == [] and other.generate_calls > 0
