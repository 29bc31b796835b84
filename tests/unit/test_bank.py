"""The built-in bank, the real-environment runner and the generated bank tasks."""

from __future__ import annotations

import json

import pytest

from envace.builtin.bank import Bank
from envace.builtin.make_tasks import generate_tasks, main
from envace.builtin.task_sets import load_task_set
from envace.data.task_parsing import parse_task
from envace.data.task_records import task_to_record
from envace.data.task_reference import reference_calls
from envace.data.tasks import load_tasks
from envace.envs.real import EnvironmentClassError, RealEnvironment, import_class, tool_schemas_from_class
from envace.rewards.task_success import task_score
from envace.types import EnvSpec, ToolCall

BANK = "envace.builtin.bank.Bank"


def test_bank_operations() -> None:
    bank = Bank({"A1": 120, "B2": 10}, fee=1)
    assert bank.get_balance("A1") == {"account": "A1", "balance": 120}
    assert bank.deposit("B2", 5) == {"account": "B2", "balance": 15}  # deposits are free: 10 + 5
    assert bank.withdraw("A1", 20) == {"account": "A1", "balance": 99, "fee": 1}  # 120 - 20 - 1
    # 99 - 30 - 1 = 68 for the source, 15 + 30 = 45 for the target
    assert bank.transfer("A1", "B2", 30) == {"source": "A1", "balance": 68, "target": "B2", "amount": 30, "fee": 1}
    assert bank.balances == {"A1": 68, "B2": 45}
    assert bank.deposit("A1", 2.0) == {"account": "A1", "balance": 70}  # an integral float is accepted


def test_bank_does_not_mutate_init_args() -> None:
    balances = {"A1": 5}
    Bank(balances).deposit("A1", 1)
    assert balances == {"A1": 5}


@pytest.mark.parametrize(
    ("method", "args", "message"),
    [
        ("get_balance", ("X9",), "unknown account 'X9'"),
        ("withdraw", ("A1", 9), "insufficient funds in 'A1': balance 5, requested 10"),  # 9 + fee 1
        ("withdraw", ("A1", 0), "amount must be positive, got 0"),
        ("deposit", ("A1", -3), "amount must be positive, got -3"),
        ("deposit", ("A1", 2.5), "amount must be an integer, got 2.5"),
        ("deposit", ("A1", True), "amount must be an integer, got True"),
        ("transfer", ("A1", "A1", 1), "source and target must differ"),
        ("transfer", ("A1", "X9", 1), "unknown account 'X9'"),
    ],
)
def test_bank_errors(method: str, args: tuple, message: str) -> None:
    bank = Bank({"A1": 5, "B2": 0}, fee=1)
    with pytest.raises(ValueError, match=message):
        getattr(bank, method)(*args)
    assert bank.balances == {"A1": 5, "B2": 0}  # a failed operation changes nothing


def test_tool_schemas_from_class() -> None:
    schemas = tool_schemas_from_class(Bank)
    assert [s["function"]["name"] for s in schemas] == ["get_balance", "deposit", "withdraw", "transfer"]
    transfer = schemas[3]["function"]["parameters"]
    assert transfer["required"] == ["source", "target", "amount"]
    assert transfer["properties"]["amount"]["type"] == "integer"
    schemas[0]["function"]["name"] = "mutated"  # callers get copies
    assert tool_schemas_from_class(Bank)[0]["function"]["name"] == "get_balance"


class Undocumented:
    def ok(self, x: int) -> int:
        """Fine.

        Args:
            x: a number.
        """
        return x

    def no_docstring(self, y: int) -> int:
        return y


def test_tool_schemas_name_the_bad_method() -> None:
    with pytest.raises(EnvironmentClassError, match=r"'Undocumented\.no_docstring' cannot be converted"):
        tool_schemas_from_class(Undocumented)


def test_import_class_errors() -> None:
    assert import_class(BANK) is Bank
    with pytest.raises(EnvironmentClassError, match="environment class 'envace.builtin.bank.Vault' not found"):
        import_class("envace.builtin.bank.Vault")
    with pytest.raises(EnvironmentClassError, match="environment class 'nopkg.mod.X' not found"):
        import_class("nopkg.mod.X")
    with pytest.raises(EnvironmentClassError, match="not found"):
        import_class("Bank")


def test_real_environment_execute() -> None:
    env = RealEnvironment(EnvSpec(BANK, {"balances": {"A1": 120}, "fee": 0}))
    deposit = ToolCall("deposit", {"account": "A1", "amount": 5})
    assert env.execute(deposit) == ('{"account": "A1", "balance": 125}', True)
    content, ok = env.execute(ToolCall("withdraw", {"account": "A1", "amount": 500}))
    assert not ok
    assert json.loads(content) == {"error": "ValueError: insufficient funds in 'A1': balance 125, requested 500"}
    content, ok = env.execute(ToolCall("get_balance", {"account": "A1", "extra": 1}))
    assert not ok and json.loads(content)["error"].startswith("TypeError:")
    assert env.calls_made == 3


@pytest.mark.parametrize("name", ["__init__", "_balance", "_debit", "balances", "__class__", "fee"])
def test_real_environment_refuses_non_tools(name: str) -> None:
    env = RealEnvironment(EnvSpec(BANK, {"balances": {"A1": 1}}))
    content, ok = env.execute(ToolCall(name, {}))
    assert not ok and json.loads(content)["error"].startswith(f"unknown tool '{name}'")
    assert env.calls_made == 0


def test_real_environments_are_independent() -> None:
    spec = EnvSpec(BANK, {"balances": {"A1": 1}})
    first, second = RealEnvironment(spec), RealEnvironment(spec)
    first.execute(ToolCall("deposit", {"account": "A1", "amount": 1}))
    assert second.execute(ToolCall("get_balance", {"account": "A1"}))[0] == '{"account": "A1", "balance": 1}'
    assert spec.init_args == {"balances": {"A1": 1}}


def test_generate_tasks_deterministic_and_templates() -> None:
    tasks = generate_tasks(8, seed=3)
    assert [task_to_record(t) for t in tasks] == [task_to_record(t) for t in generate_tasks(8, seed=3)]
    assert [task_to_record(t) for t in tasks] != [task_to_record(t) for t in generate_tasks(8, seed=4)]
    first_calls = [t.success.calls[0].name for t in tasks[:7]]
    assert first_calls == ["get_balance", "deposit", "transfer", "withdraw", "withdraw", "transfer", "get_balance"]
    assert [len(t.success.calls) for t in tasks[:7]] == [1, 1, 2, 1, 1, 3, 1]
    overdraw = tasks[4]  # insufficient_funds: the answer names the account
    assert overdraw.success.answer is not None
    account = overdraw.success.calls[0].arguments["account"]
    assert overdraw.success.answer.equals == f"error: insufficient funds in {account}"
    for task in tasks:
        assert parse_task(task_to_record(task)) == task  # every generated task passes the loader


@pytest.mark.parametrize("name", ["builtin:bank", "builtin:bank-val", "builtin:bank-test", "builtin:bank-heldout"])
def test_references_satisfy_their_own_success_spec(name: str) -> None:
    """Replay each reference on a fresh real bank: same responses, and the task scores 1.0."""
    for task in load_task_set(name):
        assert task.environment is not None
        env = RealEnvironment(task.environment)
        pairs = reference_calls(task)
        for call, recorded in pairs:
            assert env.execute(call)[0] == recorded
        final_answer = task.reference[-1]["content"]
        assert task_score(task, [call for call, _ in pairs], final_answer) == 1.0
        assert task_score(task, [], final_answer) < 1.0  # the calls matter


def test_world_context_lists_balances_and_fee() -> None:
    task = generate_tasks(1, seed=0)[0]
    assert task.world_context is not None and task.environment is not None
    for account, balance in task.environment.init_args["balances"].items():
        assert f"{account}: {balance}" in task.world_context
    assert f"Fee per withdrawal or transfer: {task.environment.init_args['fee']}" in task.world_context


def test_packaged_file_matches_generator(tmp_path) -> None:
    main(["--out-dir", str(tmp_path)])
    assert load_tasks(tmp_path / "bank_tasks.jsonl") == load_task_set("builtin:bank")
