"""The five classes of scoring differences an audit of the parity check found, each scored alike on both sides.

Every case runs from the same raw generations on both sides (``envace.benchmarks.parity.run_case``): envace's
rollout with a scripted engine, and bfcl-eval's own inference loop (``official.bfcl_official_result``) or tau^2's
``run_task`` (``official_tau2.tau2_official_run``) with only the model request scripted.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tau2")

from envace.benchmarks import bfcl_data, bfcl_loop, parity  # noqa: E402
from envace.benchmarks.parity_families import block_text  # noqa: E402

ENTRY = "multi_turn_base_0"  # turn 1: cd(folder='document'), mkdir(dir_name='temp'), mv(...)


def multi_turn_case(kind: str, first_turn: list[str]) -> parity.Case:
    """multi_turn_base_0's gold answer with its first turn's steps replaced (every turn closed, the script padded)."""
    (entry,) = bfcl_data.load_multi_turn("multi_turn_base", ids=[ENTRY])
    gold = parity._gold_turns(entry)
    turns = [[parity.blocks(turn)] if turn else [] for turn in gold]
    turns[0] = first_turn
    return parity.Case("bfcl_multi_turn", "multi_turn_base", ENTRY, kind,
                       parity._close(turns) + ("Done.",) * len(gold))


def first_calls() -> list[tuple[str, dict]]:
    (entry,) = bfcl_data.load_multi_turn("multi_turn_base", ids=[ENTRY])
    return parity._gold_turns(entry)[0]


def tau2_case(mode: str, inserted: str) -> parity.Case:
    """A gold tau^2 script with one agent message inserted before its last one."""
    if mode == "solo":
        task = parity._solo_tasks()[0]
        calls = [parity.block(n, a) for n, a in parity._actions(task)]
        outputs = (*calls, inserted, parity.block("done", {}))
        return parity.Case("tau2", "telecom/solo", str(task.id), "inserted", outputs)
    task = parity._user_tasks("airline")[0]
    calls = [parity.block(n, a) for n, a in parity._actions(task, "assistant")]
    said = " ".join(task.evaluation_criteria.communicate_info or []) or "Done."
    user = ("Hello, I need help with my request.", parity.STOP, parity.STOP, parity.STOP)
    return parity.Case("tau2", "airline/user", str(task.id), "inserted", (*calls, inserted, said, "Done."), user=user)


# -- class 1: an empty, whitespace-only or end-of-sequence-only agent message fails tau^2's run --------------------


@pytest.mark.parametrize("mode", ["solo", "user"])
@pytest.mark.parametrize("text", ["", " ", "\n\t "], ids=["eos_only", "space", "whitespace"])
def test_an_empty_agent_message_fails_the_run_as_in_tau2(mode: str, text: str, tiny_tokenizer) -> None:
    """tau^2 refuses a message with neither text nor calls (``AssistantMessage.validate``, after ``generate``'s
    retries, which a greedy model answers alike): the run fails, 0 with ``agent_error``. The script ends with what
    would otherwise score (the user's stop after the gold actions), so continuing would be visible."""
    verdict = parity.run_case(tau2_case(mode, text), tiny_tokenizer)
    assert (verdict.official, verdict.official_detail) == (0.0, "agent_error")
    assert verdict.agree, verdict.describe()


# -- class 2: a function name or argument key with spaces around it runs, as BFCL's eval runs it --------------------


@pytest.mark.parametrize("where", ["name", "key"])
@pytest.mark.parametrize("space", [" ", "\t", "\n", "  \n"])
def test_a_spaced_name_or_key_runs_as_in_bfcl(where: str, space: str, tiny_tokenizer) -> None:
    calls = first_calls()
    name, args = calls[0]
    if where == "name":
        edited = (space + name + space if space != "\n" else name + space, args)
    else:
        key = next(iter(args))
        edited = (name, {(key + space if k == key else k): v for k, v in args.items()})
    case = multi_turn_case(f"spaced_{where}", ["\n".join(block_text(n, a) for n, a in [edited, *calls[1:]])])
    verdict = parity.run_case(case, tiny_tokenizer)
    assert verdict.agree, verdict.describe()


def test_a_spaced_name_passes_where_bfcl_passes_it(tiny_tokenizer) -> None:
    calls = first_calls()
    name, args = calls[0]
    case = multi_turn_case("spaced", ["\n".join(block_text(n, a) for n, a in [(" " + name, args), *calls[1:]])])
    verdict = parity.run_case(case, tiny_tokenizer)
    assert (verdict.official, verdict.envace) == (1.0, 1.0), verdict.describe()


# -- class 3: numbers out of float range and non-finite numbers are read, as Python's json reads them --------------


@pytest.mark.parametrize("alone", [False, True], ids=["beside_calls", "alone_in_its_step"])
@pytest.mark.parametrize("raw", ["1e400", "-1e400", "NaN", "Infinity", "1" + "0" * 400, "9" * 5000])
def test_out_of_range_and_non_finite_numbers_in_a_multi_turn_step(raw: str, alone: bool, tiny_tokenizer) -> None:
    """BFCL decodes ``1e400`` as ``inf`` and runs the call: ``inf`` is then an undefined name in its call text, an
    error observation, and the turn goes on (a 5000-digit integer is more than Python converts: the block is
    skipped). Alone in its step, a refused block would end the turn there and shift every later step."""
    calls = first_calls()
    name, args = calls[0]
    odd = block_text(name, args, raw=raw, key=next(iter(args)))
    steps = [odd, parity.blocks(calls)] if alone else ["\n".join([odd] + [block_text(n, a) for n, a in calls[1:]])]
    verdict = parity.run_case(multi_turn_case("number", steps), tiny_tokenizer)
    assert verdict.agree, verdict.describe()


@pytest.mark.parametrize("raw", ["NaN", "1e400", "-Infinity"])
def test_a_non_finite_argument_is_a_call_in_an_irrelevance_entry(raw: str, tiny_tokenizer) -> None:
    """The official decoder accepts the call, so the irrelevance entry fails (envace used to refuse the call and
    pass it)."""
    from envace.benchmarks import bfcl_ast

    (entry,) = bfcl_ast.load_single_turn("irrelevance", limit=1)
    text = block_text(entry.functions[0]["name"], {}, raw=raw, key="x")
    verdict = parity.run_case(parity.Case("bfcl_single_turn", "irrelevance", entry.id, "number", (text,)),
                              tiny_tokenizer)
    assert (verdict.official, verdict.envace) == (0.0, 0.0), verdict.describe()


# -- class 4: a lone surrogate escape -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ['"\\ud800"', '"a\\udfffb"'])
def test_a_lone_surrogate_in_a_multi_turn_step(raw: str, tiny_tokenizer) -> None:
    calls = first_calls()
    name, args = calls[0]
    odd = block_text(name, args, raw=raw, key=next(iter(args)))
    for steps in (["\n".join([odd] + [block_text(n, a) for n, a in calls[1:]])], [odd, parity.blocks(calls)]):
        verdict = parity.run_case(multi_turn_case("surrogate", steps), tiny_tokenizer)
        assert verdict.agree, verdict.describe()


@pytest.mark.parametrize("category", ["simple_python", "irrelevance"])
def test_a_lone_surrogate_the_official_runner_cannot_write_is_reported_not_crashed_on(category: str,
                                                                                      tiny_tokenizer) -> None:
    """bfcl-eval writes a failed entry's record, decoded calls included, as UTF-8: a lone surrogate crashes it.
    The harness reports the verdict its checkers computed (read back with the score file written ASCII-escaped),
    says that the official runner crashes, and agrees with envace's verdict."""
    from envace.benchmarks import bfcl_ast

    (entry,) = bfcl_ast.load_single_turn(category, limit=1)
    text = block_text(entry.functions[0]["name"], {}, raw='"\\ud800"', key="x")
    verdict = parity.run_case(parity.Case("bfcl_single_turn", category, entry.id, "surrogate", (text,)),
                              tiny_tokenizer)
    assert "cannot write its score file" in verdict.official_crash
    assert (verdict.official, verdict.envace) == (0.0, 0.0) and verdict.agree, verdict.describe()


# -- class 5: the harness sees decoder-driven differences -----------------------------------------------------------


def test_the_harness_sees_a_decoder_that_splits_steps_differently(tiny_tokenizer, monkeypatch) -> None:
    """Both sides start from raw text: with envace's old strict JSON reader put back (NaN refused), envace ends the
    first turn at a step BFCL runs, every later step shifts a turn, and the harness reports it. Fed envace's own
    decoded episode, the official scorer saw the shifted turns too and agreed."""
    calls = first_calls()
    name, args = calls[0]
    alone = block_text(name, args, raw="NaN", key=next(iter(args)))  # a step of one call BFCL runs (an error)
    case = multi_turn_case("decoder", [alone, parity.blocks(calls)])
    assert parity.run_case(case, tiny_tokenizer).agree

    def strict(response: str) -> list:
        from envace.roles.parsing import loads_json

        found = []
        for body in bfcl_loop._BLOCK.findall(response):
            try:
                found.append(loads_json(body))
            except ValueError:
                continue
        return found

    monkeypatch.setattr(bfcl_loop, "tool_call_objects", strict)
    verdict = parity.run_case(case, tiny_tokenizer)
    assert not verdict.agree, verdict.describe()
    assert json.loads('{"x": NaN}')  # the official reader's JSON: Python's
