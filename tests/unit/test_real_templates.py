"""Token-in/token-out with the chat templates of the model families users train, on a real BPE tokenizer.

The template texts are the ones TRL's wheel ships (``trl/chat_templates``: Qwen2.5, Qwen3, Llama 3.1), set on
SmolLM2's own 49152-token byte-level BPE tokenizer with the family's control tokens added, so nothing here is a
stand-in template or a tokenizer fitted to the domain. Each conversation is driven through ``EpisodeRunner`` by
scripted generations (``helpers.ScriptedEngine``) against the real bank environment, with ``check_render`` on (the
act stream equals the template's render after every delivery). The runner itself checks on every row that the
trained tokens are exactly the generated ids (``check_trained_tokens``); the tests check it again from the engine's
record, independently.

Qwen3 keeps ``<think>`` blocks only for assistant turns after the last user message, so the second user turn
rewrites the first turn's messages: the next generation must start a new row from the re-rendered context.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
from helpers import ScriptedEngine, call_text

from envace.builtin.bank import Bank
from envace.envs.real import tool_schemas_from_class
from envace.policy.chat import TemplateError, check_chat_template, decode, render
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner, check_trained_tokens
from envace.types import EnvSpec, Episode, ExpectedAnswer, ExpectedCall, Role, Sample, SuccessSpec, Task
from envace.worlds import RealWorld

# The family's control tokens (absent from SmolLM2's vocabulary) and its end-of-turn token, which generation stops on.
FAMILIES = {
    "qwen2_5": (["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "qwen3": (["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "llama3_1": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>"),
}
THINK_1 = "<think>\nThe user wants the balance of A1, so I call get_balance.\n</think>\n\n"
THINK_2 = "<think>\nThe tool says 120.\n</think>\n\n"
BALANCE = call_text("get_balance", {"account": "A1"})
DEPOSIT = call_text("deposit", {"account": "A1", "amount": 5})
FOLLOW_UP = {"role": "user", "content": "Now deposit 5 into A1 and tell me the new balance."}


def trl_template(name: str) -> str:
    """The template text TRL's wheel ships (the package is located, never imported)."""
    spec = importlib.util.find_spec("trl")
    assert spec is not None and spec.submodule_search_locations, "trl is in requirements.lock; run scripts/test.sh"
    return (Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / f"{name}.jinja").read_text()


@pytest.fixture(params=sorted(FAMILIES))
def family(request, smollm2_tokenizer):
    """``(name, tokenizer)`` for each family (``family_tokenizer``)."""
    return request.param, family_tokenizer(smollm2_tokenizer, request.param)


def family_tokenizer(smollm2_tokenizer, name: str):
    """SmolLM2's tokenizer with the family's template, control tokens and stop token."""
    specials, eos = FAMILIES[name]
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.eos_token = eos
    if name == "llama3_1":
        tok.bos_token = "<|begin_of_text|>"
    tok.chat_template = trl_template(name)
    return tok


def two_turn_task() -> Task:
    """A bank question, then a follow-up user turn, answered with the real bank tools."""
    return Task(
        id="bank-two-turns",
        messages=({"role": "system", "content": "You are a bank assistant."},
                  {"role": "user", "content": "What is the balance of account A1?"}),
        tools=tuple(tool_schemas_from_class(Bank)),
        success=SuccessSpec(calls=(ExpectedCall("get_balance", {"account": "A1"}),),
                            answer=ExpectedAnswer(equals="125")),
        environment=EnvSpec("envace.builtin.bank.Bank", {"balances": {"A1": 120}, "fee": 1}),
        user_turns=((FOLLOW_UP,),),
    )


def run(tok, script: list[str], **config) -> tuple[Episode, ScriptedEngine]:
    engine = ScriptedEngine(tok, script)
    world = RealWorld()
    world.bind(tok, model=None)
    runner = EpisodeRunner(tok, RolloutConfig(check_render=True, **config))
    (episode,) = runner.run([two_turn_task()], [0], engine, world)
    assert engine.remaining == 0 and not episode.stats.failed, episode.stats.failure
    return episode, engine


def trained_spans(row: Sample) -> list[list[int]]:
    spans, current = [], []
    for token, trained in zip(row.token_ids, row.loss_mask):
        if trained:
            current.append(token)
        elif current:
            spans, current = [*spans, current], []
    return spans + ([current] if current else [])


def assert_token_in_token_out(tok, episode: Episode, engine: ScriptedEngine) -> None:
    """Every generation is trained exactly once, verbatim, in order; nothing else is trained; ACT role on it."""
    rows = episode.act_rows()
    assert [span for row in rows for span in trained_spans(row)] == engine.generated
    for row in rows:
        assert all((r == Role.ACT) == bool(m) for r, m in zip(row.role_ids, row.loss_mask))
        assert len(row.token_ids) == len(row.role_ids) == len(row.loss_mask)
    opening = decode(tok, rows[0].token_ids[: rows[0].loss_mask.index(1)])  # system, tools, first user message
    assert all(decode(tok, row.token_ids[: row.loss_mask.index(1)]).startswith(opening) for row in rows[1:])


def test_each_family_renders_tools(family) -> None:
    _, tok = family
    check_chat_template(tok)  # the act role sees the tool schemas


@pytest.mark.parametrize("thinking", [False, True])
def test_two_user_turns_one_row_or_a_new_row_per_rewrite(family, thinking) -> None:
    name, tok = family
    think_1, think_2 = (THINK_1, THINK_2) if thinking else ("", "")
    script = [think_1 + BALANCE, think_2 + "The balance is 120.", think_1 + DEPOSIT, think_2 + "125"]
    episode, engine = run(tok, script)
    assert episode.final_answer == "125" and episode.stats.user_turns == 2 and episode.stats.act_turns == 4
    assert [r.content for r in episode.rehearsals][0].startswith('{"account": "A1", "balance": 120')
    assert_token_in_token_out(tok, episode, engine)
    rewrites = name == "qwen3" and thinking  # Qwen3 drops the first turn's reasoning once the follow-up arrives
    assert episode.stats.rerenders == int(rewrites) and len(episode.earlier_act) == int(rewrites)
    if rewrites:
        first, second = episode.earlier_act[0], episode.act
        assert trained_spans(first) == engine.generated[:2] and trained_spans(second) == engine.generated[2:]
        context = second.token_ids[: second.loss_mask.index(1)]
        assert decode(tok, context) == render(tok, _transcript(script[:2], episode), list(two_turn_task().tools),
                                              add_generation_prompt=True)
        assert "so I call get_balance" not in decode(tok, context)  # the re-rendered context, not the old row
        assert all(r == Role.SYSTEM for r in second.role_ids[: len(context)])  # context: never trained


def _transcript(first_turn: list[str], episode: Episode) -> list[dict]:
    """The transcript the act role's third generation saw: both first-turn generations, the tool reply, the user."""
    tool = episode.messages[3]
    return [*two_turn_task().messages, {"role": "assistant", "content": first_turn[0]},
            {"role": "tool", "content": tool["content"]}, {"role": "assistant", "content": first_turn[1]}, FOLLOW_UP]


def test_llama_trims_a_turn_so_the_next_generation_starts_a_new_row(smollm2_tokenizer) -> None:
    tok = family_tokenizer(smollm2_tokenizer, "llama3_1")  # its template trims assistant turns
    script = [BALANCE + "\n", "120", DEPOSIT, "125"]  # a trailing newline the template's `| trim` drops
    episode, engine = run(tok, script)
    assert episode.stats.rerenders == 1 and len(episode.earlier_act) == 1
    assert_token_in_token_out(tok, episode, engine)


def test_on_rerender_error_names_the_row_and_the_message(smollm2_tokenizer) -> None:
    tok = family_tokenizer(smollm2_tokenizer, "qwen3")
    script = [THINK_1 + BALANCE, THINK_2 + "The balance is 120.", THINK_1 + DEPOSIT, THINK_2 + "125"]
    with pytest.raises(TemplateError, match=r"task 'bank-two-turns'\), act row 0, adding a user message: .*"
                                            r"on_rerender: new_row"):
        run(tok, script[:2], on_rerender="error")


def test_the_runner_check_refuses_a_retokenised_generation() -> None:
    row = Sample([5, 6, 7, 8, 9], [0, 2, 2, 0, 2], [0, 1, 1, 0, 1], Role.ACT, 0, 0)
    check_trained_tokens(row, [[6, 7], [9]], "row")  # the generations, verbatim
    with pytest.raises(AssertionError, match=r"episode 3, act row 1: trained span 1 differs .* re-tokenised"):
        check_trained_tokens(row, [[6, 7], [10]], "episode 3, act row 1")
    with pytest.raises(AssertionError, match="2 trained spans for 1 generations"):
        check_trained_tokens(row, [[6, 7]], "row")
