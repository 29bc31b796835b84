"""An oracle policy for the built-in bank tasks: the act role's turns that solve a task.

This module owns solving a bank task independently of how it was generated. The oracle reads the user's request
(never the success specification or the reference trajectory), keeps its own ledger of the hidden balances (the
task's environment arguments, which only an oracle may see) under the domain's rules, and follows the system
prompt: one call per turn; a deposit or withdrawal reports the balance it returns; after a transfer, one
``get_balance`` per reported account; the first error ends the task with ``error: <reason> <account>``. It never runs
the ``Bank``, so running its turns in the real environment checks the generator, the bank and the success
specifications against each other.
"""

from __future__ import annotations

import json
import re

from envace.types import Task, ToolCall

_BALANCE_QUESTION = re.compile(r"What is the balance of account (\w+)\?")
_DEPOSIT = re.compile(r"deposit (\d+) into account (\w+)")
_WITHDRAW = re.compile(r"withdraw (\d+) from account (\w+)")
_TRANSFER = re.compile(r"transfer (\d+) from account (\w+) to account (\w+)")
_REPORT = re.compile(r"tell me (?:its new balance|(\w+)'s balance|the balances of (\w+) and (\w+))\.")


class OracleError(ValueError):
    """The oracle cannot read a task (not a bank request, or no environment)."""


class _Ledger:
    """The oracle's own model of the bank: balances, the fee and the error rules."""

    def __init__(self, balances: dict[str, int], fee: int) -> None:
        self.balances = dict(balances)
        self.fee = fee

    def apply(self, call: ToolCall) -> str | None:
        """Apply an operation; returns the error answer if it fails (the ledger is then unchanged)."""
        args = call.arguments
        if call.name == "withdraw":
            return self._debit(args["account"], args["amount"])
        credited = args["account"] if call.name == "deposit" else args["target"]
        error = self._unknown(credited)  # a transfer checks its target before debiting the source
        if error is None and call.name == "transfer":
            error = self._debit(args["source"], args["amount"])
        if error is None:
            self.balances[credited] += args["amount"]
        return error

    def _unknown(self, account: str) -> str | None:
        return None if account in self.balances else f"error: unknown account {account}"

    def _debit(self, account: str, amount: int) -> str | None:
        error = self._unknown(account)
        if error is None and amount + self.fee > self.balances[account]:
            error = f"error: insufficient funds in {account}"
        if error is None:
            self.balances[account] -= amount + self.fee
        return error


def parse_request(question: str) -> tuple[list[ToolCall], list[str] | None]:
    """The operations a bank request asks for and the accounts to report.

    Args:
        question: the user's request, e.g. ``Deposit 5 into account A1, then tell me its new balance.``

    Returns:
        The operations in order, and the accounts to report with ``get_balance`` (None: report the balance the last
        operation returns).

    Raises:
        OracleError: the text is not a bank request.
    """
    match = _BALANCE_QUESTION.fullmatch(question)
    if match:
        return [], [match.group(1)]
    *clauses, report = question.split(", then ")
    clauses = [clause[:1].lower() + clause[1:] for clause in clauses]  # the first clause starts with a capital
    operations = [_operation(clause, question) for clause in clauses]
    match = _REPORT.fullmatch(report)
    if not operations or match is None:
        raise OracleError(f"not a bank request: {question!r}")
    accounts = [a for a in match.groups() if a is not None]
    return operations, accounts or None


def _operation(clause: str, question: str) -> ToolCall:
    if match := _DEPOSIT.fullmatch(clause):
        return ToolCall("deposit", {"account": match.group(2), "amount": int(match.group(1))})
    if match := _WITHDRAW.fullmatch(clause):
        return ToolCall("withdraw", {"account": match.group(2), "amount": int(match.group(1))})
    if match := _TRANSFER.fullmatch(clause):
        amount, source, target = int(match.group(1)), match.group(2), match.group(3)
        return ToolCall("transfer", {"source": source, "target": target, "amount": amount})
    raise OracleError(f"not a bank operation: {clause!r} in {question!r}")


def oracle_plan(task: Task) -> tuple[list[ToolCall], str]:
    """The calls the oracle makes on ``task`` and its final answer.

    Raises:
        OracleError: the task has no environment or its last message is not a bank request.
    """
    if task.environment is None:
        raise OracleError(f"task '{task.id}' has no environment; the oracle reads the hidden balances from it")
    operations, report = parse_request(task.messages[-1]["content"])
    ledger = _Ledger(task.environment.init_args["balances"], task.environment.init_args.get("fee", 0))
    calls: list[ToolCall] = []
    for call in operations:
        calls.append(call)
        error = ledger.apply(call)
        if error is not None:
            return calls, error
    if report is None:
        return calls, str(ledger.balances[operations[-1].arguments["account"]])
    for account in report:
        calls.append(ToolCall("get_balance", {"account": account}))
        if account not in ledger.balances:
            return calls, f"error: unknown account {account}"
    return calls, " ".join(str(ledger.balances[account]) for account in report)


def call_text(call: ToolCall) -> str:
    """A tool call turn exactly as the act role writes it: ``<tool_call>\\n{json}\\n</tool_call>``."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def oracle_turns(task: Task) -> list[str]:
    """The act role's assistant texts, turn by turn: one tool call per turn, then the final answer."""
    calls, answer = oracle_plan(task)
    return [call_text(call) for call in calls] + [answer]
