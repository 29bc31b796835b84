"""What private rehearsal changed against plain acting (``evaluation.rehearsal_anatomy``), on hand-made records."""

from __future__ import annotations

import json

import pytest

from envace.evaluation.rehearsal_anatomy import anatomy, markdown, read_episodes


def call(name: str, **arguments: object) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}


def tool(content: str, name: str = "get_balance") -> dict:
    return {"role": "tool", "name": name, "content": content}


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


REFUSED = {"role": "tool", "name": "error", "content": '{"error": {"code": "JSON_DECODE_ERROR", "message": "x"}}'}
USER = {"role": "user", "content": "What is the balance of A1?"}


def episode(task: str, success: bool, *messages: dict, attempts: list | None = None) -> dict:
    record = {"task": task, "success": success, "messages": [USER, *messages]}
    if attempts is not None:
        record["private_attempts"] = attempts
    return record


def tried(committed: int | None, *attempts: dict, turn: int = 0) -> dict:
    return {"act_turn": turn, "attempts": list(attempts), "committed": committed}


def attempt(response: str | None = None, *, malformed: bool = False, finished: bool = True) -> dict:
    turns = [[["get_balance", {"account": "B2"}, response]]] if response is not None else []
    return {"turns": turns, "answer": None, "first_key": "k", "greedy": False, "first_finished": finished,
            "first_malformed": malformed, "errors": 0, "tokens": 5, "verdict": None}


RIGHT = (call("get_balance", account="A1"), tool('{"balance": 120}'), answer("120"))


def test_each_changed_outcome_is_put_down_to_its_cause() -> None:
    plain = {
        "t1": episode("t1", True, *RIGHT),
        "t2": episode("t2", True, *RIGHT),
        "t3": episode("t3", True, *RIGHT),
        "t4": episode("t4", False, call("get_balance", account="B2"), tool('{"balance": 50}'), answer("50")),
        "t5": episode("t5", True, *RIGHT),
        "t6": episode("t6", True, *RIGHT),
        "t7": episode("t7", True, *RIGHT),
    }
    wrong_b2 = (call("get_balance", account="B2"), tool('{"balance": 50}'), answer("50"))
    rehearsed = {
        # a sampled attempt whose first turn was malformed was committed
        "t1": episode("t1", False, answer(""), REFUSED, answer("?"),
                      attempts=[tried(1, attempt('{"balance": 1}'), attempt(malformed=True))]),
        # the committed attempt imagined B2's balance as 120; the real one is 50
        "t2": episode("t2", False, *wrong_b2, attempts=[tried(0, attempt('{"balance": 120}'))]),
        # it imagined 50 exactly, and committed it anyway
        "t3": episode("t3", False, *wrong_b2, attempts=[tried(0, attempt('{"balance": 50}'))]),
        # a gain: the act role wrote the right call with the memory in its prompt
        "t4": episode("t4", True, *RIGHT, attempts=[tried(None, attempt('{"balance": 50}'))]),
        # the same turns, another outcome (an answer reached after identical calls differs)
        "t5": episode("t5", False, *RIGHT, attempts=[tried(0, attempt('{"balance": 120}'))]),
        # a file written before attempts were recorded
        "t6": episode("t6", False, *wrong_b2),
        # unchanged: not counted
        "t7": episode("t7", True, *RIGHT, attempts=[tried(0, attempt('{"balance": 120}'))]),
    }
    result = anatomy(plain, rehearsed)
    causes = {c.task: (c.change, c.cause, c.turn) for c in result.changes}
    assert causes == {"t1": ("right_to_wrong", "malformed_commit", 0), "t2": ("right_to_wrong", "wrong_imagined", 0),
                      "t3": ("right_to_wrong", "right_imagined", 0), "t4": ("wrong_to_right", "memory_rewrite", 0),
                      "t5": ("right_to_wrong", "same_turns", None), "t6": ("right_to_wrong", "no_record", 0)}
    assert "imagined ['{\"balance\": 120}'] / real ['{\"balance\": 50}']" in result.changes[1].detail
    counts = result.counts()
    assert counts["right_to_wrong"]["malformed_commit"] == 1 and sum(counts["right_to_wrong"].values()) == 5
    table = markdown([("bank, envace, parallel b2", result)])
    assert "| bank, envace, parallel b2 | 7 | right_to_wrong | 1 | 1 | 1 | 0 | 1 | 1 | 5 |" in table
    assert "| bank, envace, parallel b2 | 7 | wrong_to_right | 0 | 0 | 0 | 1 | 0 | 0 | 1 |" in table


def test_a_later_turn_that_differs_is_found() -> None:
    first = (call("get_balance", account="A1"), tool('{"balance": 120}'))
    plain = {"t": episode("t", True, *first, answer("120"))}
    rehearsed = {"t": episode("t", False, *first, call("get_balance", account="A1"), tool('{"balance": 120}'),
                              answer("121"), attempts=[tried(1, attempt(), attempt(), turn=1)])}
    (change,) = anatomy(plain, rehearsed).changes
    assert (change.turn, change.cause) == (1, "wrong_imagined")  # committed an attempt that imagined no response


def test_episode_files_are_read_with_clear_errors(tmp_path) -> None:
    good = tmp_path / "b0.jsonl"
    good.write_text(json.dumps(episode("t1", True, *RIGHT)) + "\n\n" + json.dumps(episode("t2", False)) + "\n")
    assert sorted(read_episodes(good)) == ["t1", "t2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(episode("t1", True)) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_episodes(bad)
    bad.write_text(json.dumps({"success": True}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: an episode record needs a 'task'"):
        read_episodes(bad)
    bad.write_text(json.dumps(episode("t1", True)) + "\n" + json.dumps(episode("t1", False)) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: task 't1' appears twice"):
        read_episodes(bad)
    with pytest.raises(ValueError, match="different tasks"):
        anatomy(read_episodes(good), {"t1": episode("t1", True)})


def test_the_benchmark_sets_each_rehearsing_setting_beside_plain_acting(tmp_path, capsys) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "rehearsal_anatomy.py"
    spec = importlib.util.spec_from_file_location("rehearsal_anatomy_benchmark", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    wrong = (call("get_balance", account="B2"), tool('{"balance": 50}'), answer("50"))
    plain = [episode("t1", True, *RIGHT), episode("t2", False, *wrong)]
    rehearsed = [episode("t1", False, *wrong, attempts=[tried(0, attempt('{"balance": 120}'))]),
                 episode("t2", True, *RIGHT, attempts=[tried(None, attempt('{"balance": 50}'))])]
    for mode in ("parallel", "sequential"):
        for budget, records in ((0, plain), (2, rehearsed)):
            name = f"rehearsal_budget_step0_{mode}_b{budget}.jsonl"
            (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    script.main([f"envace={tmp_path}", "--details"])
    out = capsys.readouterr().out
    assert "| envace, step 0, sequential, budget 2 | 2 | right_to_wrong | 0 | 1 | 0 | 0 | 0 | 0 | 1 |" in out
    assert "- envace, step 0, parallel, budget 2: t1 right_to_wrong (wrong_imagined, turn 0)" in out
    assert out.strip().splitlines()[-1] == ("SUMMARY right_to_wrong=2 wrong_to_right=2 malformed_commit=0 "
                                            "wrong_imagined=2 right_imagined=0 memory_rewrite=0 same_turns=0 "
                                            "no_record=0")
    (tmp_path / "rehearsal_budget_step0_parallel_b0.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="plain-acting episodes"):
        script.main([f"envace={tmp_path}"])
    (tmp_path / "nothing").mkdir()
    with pytest.raises(FileNotFoundError, match="write_episodes: true"):
        script.main([f"empty={tmp_path / 'nothing'}"])
