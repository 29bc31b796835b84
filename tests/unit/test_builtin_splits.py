"""The built-in bank splits: templates, determinism, disjointness, specific answers and the oracle's 100%."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import run_oracle

from envace.builtin import TASK_SETS
from envace.builtin.make_tasks import (
    MAX_TASKS,
    SPLITS,
    SYSTEM_PROMPT,
    generate_split,
    generate_tasks,
    main,
    render_tasks,
    run_reference,
    task_key,
    template_of,
    world_context,
    write_split_files,
)
from envace.builtin.oracle import OracleError, call_text, oracle_plan, oracle_turns, parse_request
from envace.builtin.task_sets import load_task_set, resolve_task_path
from envace.builtin.templates import (
    ACCOUNTS,
    HELD_OUT_TEMPLATES,
    TEMPLATES,
    TRAIN_TEMPLATES,
    Plan,
    World,
    deposit,
    error_answer,
    get_balance,
    transfer,
    withdraw,
)
from envace.data.task_reference import reference_calls
from envace.data.task_schema import TaskFormatError
from envace.data.tasks import load_tasks
from envace.envs.real import RealEnvironment
from envace.rewards.task_success import TaskSuccess, task_score
from envace.types import EnvSpec, ExpectedAnswer, SuccessSpec, Task, ToolCall

NAMES = {
    "train": "builtin:bank",
    "val": "builtin:bank-val",
    "test": "builtin:bank-test",
    "heldout": "builtin:bank-heldout",
}
ERROR_TEMPLATES = ("insufficient_funds", "unknown_account", "chain_insufficient")


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Task]]:
    """The packaged splits, loaded from their files."""
    return {split: load_task_set(name) for split, name in NAMES.items()}


def all_tasks(splits: dict[str, list[Task]]) -> list[Task]:
    return [task for tasks in splits.values() for task in tasks]


# --- names, sizes, templates -----------------------------------------------------------------------------------------


def test_builtin_names_resolve_to_the_split_files() -> None:
    assert resolve_task_path("builtin:bank").name == "bank_tasks.jsonl"
    assert resolve_task_path("builtin:bank-train") == resolve_task_path("builtin:bank")
    assert resolve_task_path("builtin:bank-val").name == "bank_val.jsonl"
    assert resolve_task_path("builtin:bank-test").name == "bank_test.jsonl"
    assert resolve_task_path("builtin:bank-heldout").name == "bank_heldout.jsonl"
    with pytest.raises(TaskFormatError) as info:
        resolve_task_path("builtin:bank-training")
    message = str(info.value)
    assert "unknown built-in task set 'builtin:bank-training'" in message
    assert "available: bank, bank-heldout, bank-test, bank-train, bank-val, desk, desk-heldout" in message
    assert {SPLITS[s].file for s in SPLITS} == {f for name, f in TASK_SETS.items() if name.startswith("bank")}


def test_split_sizes_and_templates(splits: dict[str, list[Task]]) -> None:
    assert {s: len(t) for s, t in splits.items()} == {"train": 160, "val": 128, "test": 256, "heldout": 128}
    assert TRAIN_TEMPLATES == (
        "balance", "deposit", "transfer_target", "withdraw", "insufficient_funds", "transfer_both", "unknown_account",
    )  # fmt: skip
    assert HELD_OUT_TEMPLATES == ("deposit_transfer", "transfer_chain", "transfer_chain_both", "chain_insufficient")
    for split, tasks in splits.items():
        expected = HELD_OUT_TEMPLATES if split == "heldout" else TRAIN_TEMPLATES
        assert [template_of(t) for t in tasks] == [expected[i % len(expected)] for i in range(len(tasks))]
        assert [t.metadata for t in tasks] == [{"template": template_of(t)} for t in tasks]  # test_group_by=template
        assert all(t.id.startswith(f"bank-{split}-") for t in tasks)
    # 160 = 7 * 22 + 6: the first six templates get 23 tasks, unknown_account 22
    assert Counter(template_of(t) for t in splits["train"])["unknown_account"] == 22


def test_call_counts_match_the_templates(splits: dict[str, list[Task]]) -> None:
    counts = {"balance": 1, "deposit": 1, "withdraw": 1, "transfer_target": 2, "transfer_both": 3,
              "insufficient_funds": 1, "unknown_account": 1, "deposit_transfer": 3, "transfer_chain": 3,
              "transfer_chain_both": 4, "chain_insufficient": 2}  # fmt: skip
    for task in all_tasks(splits):
        name = template_of(task)
        assert len(task.success.calls) == counts[name] == TEMPLATES[name].calls, task.id
        assert len(reference_calls(task)) == counts[name]


def test_answers_are_specific_errors_exactly_on_the_error_templates(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        answer = task.success.answer
        assert answer is not None and answer.equals is not None
        last_call = task.success.calls[-1].arguments
        if template_of(task) == "unknown_account":
            assert answer.equals == f"error: unknown account {last_call['account']}"
        elif template_of(task) in ERROR_TEMPLATES:
            source = last_call.get("source", last_call.get("account"))
            assert answer.equals == f"error: insufficient funds in {source}"
        else:
            assert all(part.isdigit() for part in answer.equals.split(" ")), task.id


def test_success_spec_is_the_whole_plan(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        assert task.success.ordered and task.success.forbid_extra_calls
        for expected, (call, _) in zip(task.success.calls, reference_calls(task), strict=True):
            assert expected.name == call.name and expected.arguments == call.arguments  # every argument is checked


def test_world_context_goes_to_the_rehearse_role_only(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        assert task.world_context is not None and task.environment is not None
        balances = task.environment.init_args["balances"]
        assert all(f"{account}: {balance}" in task.world_context for account, balance in balances.items())
        assert task.messages[0]["content"] == SYSTEM_PROMPT
        assert all("balances:" not in m["content"] and "Fee per" not in m["content"] for m in task.messages)


def test_world_context_text() -> None:
    text = world_context(World({"A1": 120, "B2": 5}, fee=2))
    assert text.startswith("Bank accounts and balances: A1: 120, B2: 5. Any other account id is unknown. ")
    assert "Fee per withdrawal or transfer: 2, charged to the source account" in text


# --- determinism, disjointness, files --------------------------------------------------------------------------------


def test_generation_is_deterministic_and_prefix_stable() -> None:
    first = generate_split("val")
    assert generate_split("val") == first
    assert generate_split("val", n=10) == first[:10]  # a larger n only appends tasks
    assert generate_tasks(12, seed=5) == generate_tasks(12, seed=5)
    other = generate_tasks(12, seed=6)
    assert {task_key(t) for t in generate_tasks(12, seed=5)}.isdisjoint(task_key(t) for t in other)
    assert [t.id for t in generate_tasks(2, seed=5, templates=["deposit"])] == [
        "bank-s5-0000-deposit", "bank-s5-0001-deposit",
    ]  # fmt: skip


def test_packaged_splits_are_disjoint(splits: dict[str, list[Task]]) -> None:
    ids = [t.id for t in all_tasks(splits)]
    keys = [task_key(t) for t in all_tasks(splits)]
    assert len(set(ids)) == len(ids) and len(set(keys)) == len(keys)
    train_templates = {template_of(t) for s in ("train", "val", "test") for t in splits[s]}
    assert train_templates == set(TRAIN_TEMPLATES)
    assert {template_of(t) for t in splits["heldout"]} == set(HELD_OUT_TEMPLATES)
    assert {SPLITS[s].seed for s in SPLITS} == {1, 2, 3, 4}


def test_train_val_test_partition_the_task_space_at_any_size() -> None:
    """Each of train, val and test keeps only the tasks of its own hash bucket, so a larger train never meets test."""
    big_train = {task_key(t) for t in generate_split("train", n=600)}
    assert big_train.isdisjoint(task_key(t) for t in generate_split("test"))
    assert big_train.isdisjoint(task_key(t) for t in generate_split("val"))


def test_packaged_files_equal_the_generator(tmp_path: Path) -> None:
    written = write_split_files(tmp_path)
    assert [p.name for p in written] == [SPLITS[s].file for s in ("train", "val", "test", "heldout")]
    for split, name in NAMES.items():
        packaged = resolve_task_path(name)
        assert (tmp_path / packaged.name).read_bytes() == packaged.read_bytes(), f"{packaged.name} is stale"
        assert load_tasks(packaged) == generate_split(split)  # tools derived from the class equal the generated ones
    assert resolve_task_path("builtin:bank").stat().st_size < 350_000


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--out-dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({SPLITS[s].file for s in SPLITS})
    out = tmp_path / "custom.jsonl"
    main(["--out", str(out), "--n", "3", "--seed", "9", "--templates", "deposit,withdraw"])
    assert out.read_text(encoding="utf-8") == render_tasks(generate_tasks(3, 9, ["deposit", "withdraw"]))
    with pytest.raises(SystemExit):
        main(["--out", str(out), "--templates", "deposit,teleport"])
    assert "unknown template 'teleport'; valid: balance, deposit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: generate_tasks(0, 1), r"n must be an integer in \[1, 100000\], got 0"),
        (lambda: generate_tasks(MAX_TASKS + 1, 1), "n must be an integer in"),
        (lambda: generate_tasks(True, 1), "got True"),
        (lambda: generate_tasks(2, -1), "seed must be a non-negative integer, got -1"),
        (lambda: generate_tasks(2, 1, ["balance", "teleport"]), "unknown template 'teleport'; valid: balance"),
        (lambda: generate_tasks(2, 1, "balance"), "templates must be a non-empty list"),
        (lambda: generate_tasks(2, 1, []), "templates must be a non-empty list"),
        (lambda: generate_split("training"), "unknown split 'training'; valid: train, val, test, heldout"),
        (lambda: generate_split("val", n=0), "n must be an integer in"),
    ],
)
def test_bad_generator_parameters(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_template_of_rejects_foreign_ids() -> None:
    task = generate_tasks(1, 0)[0]
    with pytest.raises(ValueError, match="does not end with a template name"):
        template_of(replace(task, id="bank-0000"))


# --- answers and the success specification ---------------------------------------------------------------------------


def test_reference_on_a_hand_computed_plan() -> None:
    env = EnvSpec("envace.builtin.bank.Bank", {"balances": {"A1": 100, "B2": 20}, "fee": 2})
    plan = Plan("Transfer 30 ...", (transfer("A1", "B2", 30),), ("A1", "B2"))
    reference, calls, answer = run_reference(env, plan)
    assert calls == [transfer("A1", "B2", 30), get_balance("A1"), get_balance("B2")]
    assert answer == "68 50"  # A1: 100 - 30 - fee 2 = 68; B2: 20 + 30 = 50
    overdraw = Plan("...", (transfer("A1", "B2", 99), transfer("B2", "A1", 5)), ("A1",))
    _, calls, answer = run_reference(env, overdraw)
    assert answer == "error: insufficient funds in A1" and len(calls) == 1  # 99 + 2 > 100: the first call fails
    assert reference[-1] == {"role": "assistant", "content": "68 50"}


def test_error_answer_is_canonical() -> None:
    assert error_answer("ValueError: insufficient funds in 'A1': balance 5, requested 10") == (
        "error: insufficient funds in A1"
    )
    assert error_answer("ValueError: unknown account 'X9'") == "error: unknown account X9"
    with pytest.raises(ValueError, match="no canonical answer"):
        error_answer("ValueError: amount must be positive, got 0")


def _wrong_accounts(task: Task, call: ToolCall, key: str) -> list[ToolCall]:
    """``call`` with its ``key`` account replaced by another account of the world, then by an unknown one."""
    assert task.environment is not None
    world = sorted(task.environment.init_args["balances"])
    value = call.arguments[key]
    others = (next(a for a in world if a != value), next(a for a in ACCOUNTS if a not in world and a != value))
    return [ToolCall(call.name, {**call.arguments, key: other}) for other in others]


def _real_answer(task: Task, calls: list[ToolCall]) -> tuple[list[ToolCall], str]:
    """Run ``calls`` on the real bank until the first error; the canonical answer the responses support."""
    assert task.environment is not None
    env, made, last = RealEnvironment(task.environment), [], ""
    for call in calls:
        last, ok = env.execute(call)
        made.append(call)
        if not ok:
            message = json.loads(last)["error"]
            specific = message.startswith(("ValueError: unknown account", "ValueError: insufficient funds"))
            return made, error_answer(message) if specific else f"error: {message}"
    return made, str(json.loads(last)["balance"])


def test_a_wrong_account_never_satisfies_the_spec(splits: dict[str, list[Task]]) -> None:
    """Swap one account argument of one call and run the path for real: the spec is never fully met."""
    for task in all_tasks(splits):
        plan = [call for call, _ in reference_calls(task)]
        for i, call in enumerate(plan):
            for key in ("account", "source", "target"):
                for wrong in _wrong_accounts(task, call, key) if key in call.arguments else []:
                    made, answer = _real_answer(task, plan[:i] + [wrong] + plan[i + 1 :])
                    assert task_score(task, made, answer) < 1.0, (task.id, wrong)
                    assert task_score(task, made, task.success.answer.equals) < 1.0, (task.id, wrong)


def test_error_answers_name_the_failing_account(splits: dict[str, list[Task]]) -> None:
    """On error tasks, the real answer of a path whose failing call names another account is a different answer."""
    for task in all_tasks(splits):
        if template_of(task) not in ERROR_TEMPLATES:
            continue
        plan = [call for call, _ in reference_calls(task)]
        failing = plan[-1]
        key = "source" if failing.name == "transfer" else "account"
        for wrong in _wrong_accounts(task, failing, key):
            _, answer = _real_answer(task, plan[:-1] + [wrong])
            assert answer != task.success.answer.equals, (task.id, wrong, answer)


def test_bare_error_extra_calls_and_wrong_amounts_fail(splits: dict[str, list[Task]]) -> None:
    for task in splits["train"][:21]:  # three rounds of the seven training templates
        plan = [call for call, _ in reference_calls(task)]
        expected = task.success.answer.equals
        assert task_score(task, plan, expected) == 1.0
        assert task_score(task, plan, "error") < 1.0
        assert task_score(task, plan + [get_balance(plan[0].arguments.get("account", "A1"))], expected) == 0.0
        if "amount" in plan[0].arguments:
            more = ToolCall(plan[0].name, {**plan[0].arguments, "amount": plan[0].arguments["amount"] + 1})
            assert task_score(task, [more] + plan[1:], expected) < 1.0


# --- the oracle ------------------------------------------------------------------------------------------------------


def bank_task(question: str, balances: dict[str, int], fee: int) -> Task:
    env = EnvSpec("envace.builtin.bank.Bank", {"balances": balances, "fee": fee})
    messages = ({"role": "user", "content": question},)
    return Task("t", messages, (), SuccessSpec(answer=ExpectedAnswer("x")), environment=env)


@pytest.mark.parametrize(
    ("question", "calls", "answer"),
    [
        # B2: 20 + 30 = 50, then 50 - 45 - fee 2 = 3; A1: 100 - 30 - 2 = 68, then 68 + 45 = 113
        (
            "Transfer 30 from account A1 to account B2, then transfer 45 from account B2 to account A1, "
            "then tell me the balances of B2 and A1.",
            [transfer("A1", "B2", 30), transfer("B2", "A1", 45), get_balance("B2"), get_balance("A1")],
            "3 113",
        ),
        # 20 + 30 = 50 in B2; 49 + fee 2 = 51 > 50
        (
            "Transfer 30 from account A1 to account B2, then transfer 49 from account B2 to account A1, "
            "then tell me A1's balance.",
            [transfer("A1", "B2", 30), transfer("B2", "A1", 49)],
            "error: insufficient funds in B2",
        ),
        # deposits are free: 20 + 7 = 27
        ("Deposit 7 into account B2, then tell me its new balance.", [deposit("B2", 7)], "27"),
        # 100 - 10 - 2 = 88
        ("Withdraw 10 from account A1, then tell me its new balance.", [withdraw("A1", 10)], "88"),
        ("What is the balance of account C3?", [get_balance("C3")], "error: unknown account C3"),
    ],
)
def test_oracle_on_hand_computed_tasks(question: str, calls: list[ToolCall], answer: str) -> None:
    task = bank_task(question, {"A1": 100, "B2": 20}, fee=2)
    assert oracle_plan(task) == (calls, answer)
    assert oracle_turns(task) == [call_text(c) for c in calls] + [answer]


def test_oracle_call_text_is_the_chat_template_format() -> None:
    expected = '<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>'
    assert call_text(get_balance("A1")) == expected


def test_oracle_rejects_what_it_cannot_read() -> None:
    with pytest.raises(OracleError, match="not a bank request"):
        parse_request("Tell me a joke.")
    with pytest.raises(OracleError, match="not a bank operation: 'borrow 5 from account A1'"):
        parse_request("Borrow 5 from account A1, then tell me its new balance.")
    with pytest.raises(OracleError, match="has no environment"):
        oracle_plan(replace(bank_task("What is the balance of account A1?", {}, 0), environment=None))


def test_oracle_agrees_with_every_success_spec(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        calls, answer = oracle_plan(task)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in task.success.calls]
        assert answer == task.success.answer.equals


@pytest.mark.parametrize("split", list(NAMES))
def test_oracle_solves_every_task_in_the_real_environment(split: str, splits, tiny_tokenizer) -> None:
    tasks = splits[split]
    episodes = run_oracle(tiny_tokenizer, tasks, [oracle_turns(task) for task in tasks])
    reward = TaskSuccess()
    assert [reward(ep) for ep in episodes] == [1.0] * len(tasks)  # 100% of the tasks
    for ep, task in zip(episodes, tasks):
        assert ep.final_answer == task.success.answer.equals
        assert ep.stats.real_calls == len(task.success.calls) and ep.stats.rehearse_calls == 0
        assert [m["content"] for m in ep.messages if m["role"] == "tool"] == [c for _, c in reference_calls(task)]


def test_generated_builtin_sets_extend_the_packaged_files() -> None:
    from envace.builtin.task_sets import load_task_set

    packaged = load_tasks(resolve_task_path("builtin:bank-val"))
    generated = load_task_set(f"builtin:bank-val:{len(packaged) + 5}")
    assert generated[: len(packaged)] == packaged and len(generated) == len(packaged) + 5
    assert load_task_set("builtin:bank:3") == load_tasks(resolve_task_path("builtin:bank"))[:3]


@pytest.mark.parametrize(
    ("spec", "message"),
    [("builtin:bank:0", "1..100000"), ("builtin:bank:x", "integer"), ("builtin:nope:5", "unknown built-in")],
)
def test_generated_builtin_set_errors_name_the_spec(spec: str, message: str) -> None:
    from envace.builtin.task_sets import load_task_set

    with pytest.raises(TaskFormatError, match=message) as err:
        load_task_set(spec)
    assert spec in str(err.value)


def test_amounts_and_balances_are_multiples_of_ten() -> None:
    for task in generate_split("train", 120):
        balances = task.environment.init_args["balances"]
        assert all(b % 10 == 0 and 10 <= b <= 200 for b in balances.values())
        assert task.environment.init_args["fee"] in (0, 5)
        for call in task.success.calls:
            assert call.arguments.get("amount", 10) % 10 == 0


@pytest.mark.parametrize(
    ("done", "call", "expected"),
    [
        ([], withdraw("A1", 40), "A1 has 100. Requested 40 + fee 2 = 42. 42 <= 100, so 100 - 42 = 58."),
        ([], withdraw("B2", 20), "B2 has 20. Requested 20 + fee 2 = 22. 22 > 20: insufficient funds."),
        ([transfer("A1", "B2", 30)], get_balance("B2"), "B2 has 20 + 30 = 50."),
        ([transfer("A1", "B2", 30), deposit("A1", 5)], get_balance("A1"), "A1 has 100 - 32 + 5 = 73."),
        ([], deposit("B2", 7), "B2 has 20. 20 + 7 = 27."),
        ([], transfer("A1", "C3", 5), "C3 is not an account."),  # the bank looks the target up first
        ([], get_balance("C3"), "C3 is not an account."),
    ],
)
def test_the_banks_working_on_hand_computed_states(done: list[ToolCall], call: ToolCall, expected: str) -> None:
    from envace.builtin.templates import working

    assert working(World({"A1": 100, "B2": 20}, fee=2), done, call) == expected


def test_every_reference_response_records_the_banks_working(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        tools = [m for m in task.reference if m["role"] == "tool"]
        assert all(m["reasoning"].endswith(".") for m in tools), task.id
        assert all(("insufficient funds" in m["reasoning"]) == ("insufficient funds" in m["content"]) for m in tools)
