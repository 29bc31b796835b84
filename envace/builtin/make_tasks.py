"""Procedural generator of the built-in bank tasks (``builtin:bank``).

Four kinds of task, in rotation: a balance lookup (1 call), a deposit then the new balance (1 call), a transfer then
the target's balance (2 calls), and a withdrawal that overdraws (1 call, the answer is ``error``). The reference
trajectory's tool responses come from running the real ``Bank``. Deterministic given the seed.

Usage: ``python -m envace.builtin.make_tasks --n 64 --seed 0 --out envace/builtin/bank_tasks.jsonl``
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from typing import Any

from envace.builtin.bank import Bank
from envace.data.tasks import write_tasks
from envace.envs.real import RealEnvironment, tool_schemas_from_class
from envace.types import EnvSpec, ExpectedAnswer, ExpectedCall, SuccessSpec, Task, ToolCall

logger = logging.getLogger(__name__)

BANK_CLASS_PATH = "envace.builtin.bank.Bank"
ACCOUNTS = tuple(f"{letter}{digit}" for letter in "ABCDEF" for digit in range(1, 10))
KINDS = ("balance", "deposit", "transfer", "overdraw")
SYSTEM_PROMPT = (
    "You are a bank assistant. Use the tools to look up and change accounts. When you are done, reply with the "
    "final number only, or with the single word 'error' if an operation failed."
)


def generate_tasks(n: int, seed: int) -> list[Task]:
    """Generate ``n`` bank tasks.

    Args:
        n: number of tasks (kinds rotate: balance, deposit, transfer, overdraw).
        seed: random seed; the same seed gives the same tasks.
    """
    rng = random.Random(seed)
    tools = tuple(tool_schemas_from_class(Bank))
    return [_make_task(f"bank-{i:04d}", KINDS[i % len(KINDS)], rng, tools) for i in range(n)]


def _make_task(task_id: str, kind: str, rng: random.Random, tools: tuple[dict[str, Any], ...]) -> Task:
    names = rng.sample(ACCOUNTS, rng.randint(3, 5))
    balances = {name: rng.randint(1, 40) * 5 for name in names}  # 5..200
    fee = rng.choice((0, 0, 1, 2))
    question, calls = _plan(kind, rng, balances)
    environment = EnvSpec(class_path=BANK_CLASS_PATH, init_args={"balances": balances, "fee": fee})
    reference, answer = _run_reference(environment, calls)
    return Task(
        id=task_id,
        messages=({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}),
        tools=tools,
        success=SuccessSpec(
            calls=tuple(ExpectedCall(name=c.name, arguments=c.arguments) for c in calls),
            ordered=True,
            answer=ExpectedAnswer(equals=answer),
        ),
        reference=reference,
        world_context=_world_context(balances, fee),
        environment=environment,
    )


def _plan(kind: str, rng: random.Random, balances: dict[str, int]) -> tuple[str, list[ToolCall]]:
    """The user's request and the calls that fulfil it."""
    account = rng.choice(sorted(balances))
    if kind == "balance":
        return f"What is the balance of account {account}?", [ToolCall("get_balance", {"account": account})]
    if kind == "deposit":
        amount = rng.randint(1, 50)
        question = f"Deposit {amount} into account {account}, then tell me its new balance."
        return question, [ToolCall("deposit", {"account": account, "amount": amount})]
    if kind == "transfer":
        target = rng.choice(sorted(set(balances) - {account}))
        amount = rng.randint(1, max(1, balances[account] // 2))
        question = f"Transfer {amount} from account {account} to account {target}, then tell me {target}'s balance."
        calls = [ToolCall("transfer", {"source": account, "target": target, "amount": amount})]
        return question, calls + [ToolCall("get_balance", {"account": target})]
    amount = balances[account] + rng.randint(1, 50)  # overdraw: always more than the balance
    question = f"Withdraw {amount} from account {account} and tell me the new balance."
    return question, [ToolCall("withdraw", {"account": account, "amount": amount})]


def _run_reference(environment: EnvSpec, calls: list[ToolCall]) -> tuple[tuple[dict[str, Any], ...], str]:
    """Run the calls on the real bank; returns the reference trajectory and the correct final answer."""
    env = RealEnvironment(environment)
    messages: list[dict[str, Any]] = []
    content, ok = "", True
    for call in calls:
        content, ok = env.execute(call)
        tool_call = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        messages.append({"role": "tool", "name": call.name, "content": content})
    answer = str(json.loads(content)["balance"]) if ok else "error"
    messages.append({"role": "assistant", "content": answer})
    return tuple(messages), answer


def _world_context(balances: dict[str, int], fee: int) -> str:
    accounts = ", ".join(f"{name}: {balance}" for name, balance in balances.items())
    return (
        f"Bank accounts and balances: {accounts}. "
        f"Fee per withdrawal or transfer: {fee}, charged to the source account on top of the amount "
        "(deposits are free). "
        "Unknown accounts, non-positive amounts and overdrafts fail with an error object such as "
        '{"error": "ValueError: insufficient funds in \'<account>\': balance <balance>, requested <amount + fee>"}.'
    )


def main(argv: list[str] | None = None) -> None:
    """Command line: generate the tasks and write them as JSONL."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="number of tasks")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--out", default="envace/builtin/bank_tasks.jsonl", help="output JSONL file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_tasks(generate_tasks(args.n, args.seed), args.out)
    logger.info("wrote %d tasks to %s", args.n, args.out)


if __name__ == "__main__":
    main()
