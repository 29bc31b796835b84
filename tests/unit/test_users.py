"""Tests for simulated users (envace.worlds.users) in the episode state machine, with scripted act roles and users."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import ScriptedEngine, act_texts, call_text

from envace.builtin.bank import Bank
from envace.engines.chat_model import ChatModel
from envace.envs.real import tool_schemas_from_class
from envace.policy.chat import encode, render
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import EnvSpec, Episode, Role, SuccessSpec, Task, ToolCall
from envace.worlds import RealWorld
from envace.worlds.users import ModelUser, ScriptedUser, UserReply, UserRequest

BALANCES = {"A1": 120, "B2": 50}
GREETING = {"role": "assistant", "content": "Hi! How can I help you today?"}



CALL_A1 = call_text("get_balance", {"account": "A1"})
CALL_B2 = call_text("get_balance", {"account": "B2"})


@pytest.fixture
def tok(tiny_tokenizer):
    return tiny_tokenizer


def user_task(task_id: str = "bank-user", opens: bool = False) -> Task:
    """A bank task whose later turns come from a simulated user (who opens, with ``opens``)."""
    first = [GREETING] if opens else [{"role": "user", "content": "What is the balance of account A1?"}]
    return Task(
        id=task_id,
        messages=({"role": "system", "content": "You are a bank assistant."}, *first),
        tools=tuple(tool_schemas_from_class(Bank)),
        success=SuccessSpec(calls=()),
        environment=EnvSpec("envace.builtin.bank.Bank", {"balances": BALANCES, "fee": 1}),
        user="You are Ann. You want the balances of A1 and then B2.",
    )


def run(tok, act: list[str], tasks: list[Task], user: Any, **config: Any) -> list[Episode]:
    engine = ScriptedEngine(tok, act)
    world = RealWorld()
    world.bind(tok, model=None)
    runner = EpisodeRunner(tok, RolloutConfig(**{"check_render": True, **config}))
    episodes = runner.run(tasks, list(range(len(tasks))), engine, world, user=user)
    assert engine.remaining == 0, "act script not fully consumed"
    return episodes



def test_the_simulated_user_takes_over_after_the_scripted_turns(tok):
    user = ScriptedUser({"bank-user": ["And B2?", None]})
    (ep,) = run(tok, [CALL_A1, "120", CALL_B2, "50"], [user_task()], user)  # check_render after every turn
    roles = [m["role"] for m in ep.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
    assert ep.messages[5] == {"role": "user", "content": "And B2?"}
    assert ep.stats.user_turns == 2 and ep.stats.user_stop and not ep.stats.user_turn_limit
    assert ep.call_steps == [(0, [ToolCall("get_balance", {"account": "A1"})]),
                             (0, [ToolCall("get_balance", {"account": "B2"})])]  # no scripted user turn index moves
    assert act_texts(tok, ep) == [CALL_A1, "120", CALL_B2, "50"]  # only the policy's tokens are trained
    assert Role.USER in ep.act.role_ids and all(m == 0 for m, r in zip(ep.act.loss_mask, ep.act.role_ids)
                                                if r == Role.USER)


def test_the_user_opens_after_a_greeting(tok):
    user = ScriptedUser({"bank-user": ["What is the balance of A1?", None]})
    (ep,) = run(tok, [CALL_A1, "120"], [user_task(opens=True)], user)
    assert [m["role"] for m in ep.messages] == ["system", "assistant", "user", "assistant", "tool", "assistant"]
    assert ep.stats.user_turns == 1 and ep.stats.user_stop
    prompt = render(tok, [dict(m) for m in ep.messages[:3]], list(user_task().tools), add_generation_prompt=True)
    assert ep.act.token_ids[: len(encode(tok, prompt))] == encode(tok, prompt)


def test_a_user_who_opens_needs_a_simulator(tok):
    with pytest.raises(ValueError, match="task 'bank-user'.*user opens"):
        run(tok, [], [user_task(opens=True)], user=None)


def test_max_user_turns_ends_a_talkative_user(tok):
    user = ScriptedUser({"bank-user": ["And B2?", "And A1 again?", "Once more?"]})
    (ep,) = run(tok, ["120", "50", "120"], [user_task()], user, max_user_turns=3)
    assert ep.stats.user_turns == 3 and ep.stats.user_turn_limit and not ep.stats.user_stop
    assert [m["content"] for m in ep.messages if m["role"] == "user"] == [
        "What is the balance of account A1?", "And B2?", "And A1 again?"]


def test_scripted_user_turns_come_before_the_simulator(tok):
    task = Task(**{**user_task().__dict__, "user_turns": (({"role": "user", "content": "Scripted second."},),)})
    user = ScriptedUser({"bank-user": ["Simulated third.", None]})
    (ep,) = run(tok, ["a", "b", "c"], [task], user)
    assert [m["content"] for m in ep.messages if m["role"] == "user"] == [
        "What is the balance of account A1?", "Scripted second.", "Simulated third."]


def test_a_failed_user_reply_ends_the_episode_and_is_counted(tok):
    class Failing:
        def respond(self, requests: list[UserRequest]) -> list[UserReply]:
            return [UserReply("", failed=True, reason="down") for _ in requests]

    (ep,) = run(tok, ["120"], [user_task()], Failing())
    assert ep.stats.user_failures == 1 and not ep.stats.user_stop and ep.final_answer == "120"


def test_the_users_of_waiting_episodes_are_asked_in_one_batch(tok):
    class Recorder(ScriptedUser):
        batches: list[int] = []

        def respond(self, requests: list[UserRequest]) -> list[UserReply]:
            self.batches.append(len(requests))
            return super().respond(requests)

    user = Recorder({"a": ["more", None], "b": ["more", None]})
    run(tok, ["1", "2", "3", "4"], [user_task("a"), user_task("b")], user)
    assert user.batches == [2, 2]


# -- ModelUser ---------------------------------------------------------------------------------------------------------


def model_user(tok, replies: list[str], **kwargs: Any) -> tuple[ModelUser, ScriptedEngine]:
    engine = ScriptedEngine(tok, replies)
    return ModelUser(ChatModel.from_engine(engine, tok), **kwargs), engine


def test_the_model_user_sees_the_conversation_from_the_users_side(tok):
    user, engine = model_user(tok, ["And B2? ###STOP###"], guidelines="Play the user.")
    (ep,) = run(tok, [CALL_A1, "120"], [user_task()], user)
    view = user.view(UserRequest(ep.task, ep.messages[:-1], {}))
    assert view == [
        {"role": "system", "content": "Play the user.\n\n# Your instructions\n" + user_task().user},
        {"role": "assistant", "content": "What is the balance of account A1?"},
        {"role": "user", "content": "120"},  # the tool call and its response are hidden from the user
    ]
    assert engine.prompts[0] == encode(tok, render(tok, view, None, add_generation_prompt=True))
    assert ep.stats.user_stop and ep.messages[-1] == {"role": "user", "content": "And B2?"}  # marker removed
    assert ep.stats.user_turns == 1  # the stopping message never reaches the act role


def test_an_overflowing_user_chat_fails_instead_of_guessing(tok):
    engine = ScriptedEngine(tok, [])
    user = ModelUser(ChatModel.from_engine(engine, tok, max_prompt_tokens=5))
    (ep,) = run(tok, ["120"], [user_task()], user)
    assert ep.stats.user_failures == 1 and engine.call_count == 0


class Phone:
    """Tools the user operates itself: a switch on the user's phone, kept in the episode's handle."""

    def schemas(self, request: UserRequest) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "toggle_wifi", "description": "Toggle wifi",
                                                  "parameters": {"type": "object", "properties": {}}}}]

    def call(self, request: UserRequest, call: ToolCall) -> str:
        request.state["wifi"] = not request.state.get("wifi", False)
        return json.dumps({"wifi": request.state["wifi"]})


def test_a_user_with_tools_uses_them_before_writing(tok):
    user, engine = model_user(tok, [call_text("toggle_wifi", {}), "Done, wifi is on.", "Thanks ###STOP###"],
                              tools=Phone())
    (ep,) = run(tok, ["Please turn on wifi.", "Great."], [user_task()], user)
    assert [m["content"] for m in ep.messages if m["role"] == "user"][1:] == ["Done, wifi is on.", "Thanks"]
    # the second round of the first reply saw its own call and the phone's answer; the agent never does
    assert '{"wifi": true}' in tok.decode(engine.prompts[1]) and "toggle_wifi" in tok.decode(engine.prompts[1])
    assert all(m["role"] != "tool" for m in ep.messages[4:])
    assert not any("toggle_wifi" in (m.get("content") or "") for m in ep.messages)


def test_the_user_must_write_after_max_tool_steps(tok):
    user, engine = model_user(tok, [call_text("toggle_wifi", {}), "On it." + call_text("toggle_wifi", {})],
                              tools=Phone(), max_tool_steps=1)
    (ep,) = run(tok, ["x", "y"], [user_task()], user, max_user_turns=2)
    assert engine.call_count == 2  # one tool round; the second reply's calls are dropped and its text is sent
    assert ep.messages[-2] == {"role": "user", "content": "On it."} and ep.stats.user_turn_limit


def test_a_user_who_fails_to_open_leaves_no_empty_training_row(tok):
    class Failing:
        def respond(self, requests: list[UserRequest]) -> list[UserReply]:
            return [UserReply("", failed=True, reason="down") for _ in requests]

    (ep,) = run(tok, [], [user_task(opens=True)], Failing())
    assert ep.stats.user_failures == 1 and ep.stats.user_turns == 0 and ep.act.token_ids == []
    assert ep.samples() == []  # an all-padding row would make the update's attention NaN


def test_a_scripted_user_with_tools_runs_its_tool_lines_before_it_speaks() -> None:
    """A line of ``<tool_call>`` blocks is the user operating its own tools (telecom's phone): the calls run, the next
    line is the reply; without tools the same line is just text."""

    class Phone:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, Any]]] = []

        def schemas(self, request: UserRequest) -> list[dict[str, Any]]:
            return []

        def call(self, request: UserRequest, call: ToolCall) -> str:
            self.calls.append((call.name, call.arguments))
            return "ok"

    toggle = call_text("toggle_airplane_mode", {})
    lines = {"bank-user": ["Hi.", toggle, call_text("check_status", {"verbose": True}), "Done. ###STOP###"]}
    phone = Phone()
    user = ScriptedUser(lines, tools=phone)
    request = UserRequest(task=user_task(), messages=[], state={})
    assert user.respond([request]) == [UserReply("Hi.")]
    assert user.respond([request]) == [UserReply("Done.", stop=True)]
    assert phone.calls == [("toggle_airplane_mode", {}), ("check_status", {"verbose": True})]
    assert request.state["tool_calls"] == 2
    plain = UserRequest(task=user_task(), messages=[], state={})
    assert ScriptedUser(lines).respond([plain, plain])[1].content == toggle.strip()
