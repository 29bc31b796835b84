"""Task templates of the built-in bank domain: the request wording, the call plan and the answer format.

This module owns what a bank task asks and how it must be solved. A template draws its parameters (accounts and
amounts) from a world (the hidden balances and fee) and returns a ``Plan``: the user's request, the state-changing
calls, the accounts to report with ``get_balance`` afterwards, and the outcome it is built to reach (success, or a
specific error). ``envace.builtin.make_tasks`` runs the plan on the real ``Bank`` and derives the answer with
``answer_from_responses``; ``envace.builtin.oracle`` solves the same requests independently.

Answer formats (the act role's final message):

* balances: the requested balances only, in the order asked, separated by one space (``"160"``, ``"45 130"``);
* errors: ``error: <reason> <account>``, for example ``error: insufficient funds in A1`` or
  ``error: unknown account B7`` (the first failing call ends the task).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from envace.builtin.generator import OK, Redraw, Template
from envace.types import ToolCall

ACCOUNTS = tuple(f"{letter}{digit}" for letter in "ABCDEF" for digit in range(1, 10))
"""Every account id a task can mention (a world holds 3 to 5 of them; the others are unknown)."""

INSUFFICIENT_FUNDS = "insufficient funds"
UNKNOWN_ACCOUNT = "unknown account"
_ERROR_PATTERN = re.compile(r"^ValueError: (unknown account|insufficient funds in) '([^']+)'")


@dataclass(frozen=True)
class World:
    """The hidden state of one task: the initial balances and the fee.

    Attributes:
        balances: initial balance of each account.
        fee: fee charged to the source of every withdrawal and transfer.
    """

    balances: dict[str, int]
    fee: int

    def spendable(self, account: str) -> int:
        """The largest amount ``account`` can withdraw or transfer at the start (its balance minus the fee)."""
        return self.balances[account] - self.fee


@dataclass(frozen=True)
class Plan:
    """What a template asks for and how it is solved.

    Attributes:
        question: the user's request.
        operations: the calls that change state, in order (empty for a balance question).
        report: accounts whose balance is looked up with ``get_balance`` after the operations and reported in this
            order; empty means "report the balance the last operation returned".
        outcome: the outcome the parameters were drawn to reach: ``OK``, ``INSUFFICIENT_FUNDS`` or
            ``UNKNOWN_ACCOUNT``.
    """

    question: str
    operations: tuple[ToolCall, ...]
    report: tuple[str, ...]
    outcome: str = OK

    def calls(self) -> list[ToolCall]:
        """The full call plan: the operations, then one ``get_balance`` per reported account."""
        return list(self.operations) + [get_balance(account) for account in self.report]


# --- calls and wording -----------------------------------------------------------------------------------------------


def get_balance(account: str) -> ToolCall:
    """A ``get_balance`` call."""
    return ToolCall("get_balance", {"account": account})


def deposit(account: str, amount: int) -> ToolCall:
    """A ``deposit`` call."""
    return ToolCall("deposit", {"account": account, "amount": amount})


def withdraw(account: str, amount: int) -> ToolCall:
    """A ``withdraw`` call."""
    return ToolCall("withdraw", {"account": account, "amount": amount})


def transfer(source: str, target: str, amount: int) -> ToolCall:
    """A ``transfer`` call."""
    return ToolCall("transfer", {"source": source, "target": target, "amount": amount})


def _clause(call: ToolCall) -> str:
    """The request clause of one operation, e.g. ``transfer 30 from account A1 to account B2``."""
    args = call.arguments
    if call.name == "deposit":
        return f"deposit {args['amount']} into account {args['account']}"
    if call.name == "withdraw":
        return f"withdraw {args['amount']} from account {args['account']}"
    if call.name == "transfer":
        return f"transfer {args['amount']} from account {args['source']} to account {args['target']}"
    raise ValueError(f"'{call.name}' is not an operation")


def _report_clause(report: tuple[str, ...]) -> str:
    if not report:
        return "tell me its new balance"
    if len(report) == 1:
        return f"tell me {report[0]}'s balance"
    return "tell me the balances of " + " and ".join(report)


def request(operations: tuple[ToolCall, ...], report: tuple[str, ...]) -> str:
    """The user's request: ``What is the balance of account A1?`` or the operations' clauses then the report.

    Example: ``Transfer 30 from account A1 to account B2, then tell me B2's balance.``
    """
    if not operations:
        return f"What is the balance of account {report[0]}?"
    text = ", then ".join([_clause(call) for call in operations] + [_report_clause(report)])
    return text[0].upper() + text[1:] + "."


def _plan(operations: tuple[ToolCall, ...], report: tuple[str, ...], outcome: str = OK) -> Plan:
    return Plan(request(operations, report), operations, report, outcome)


# --- answers ---------------------------------------------------------------------------------------------------------


def error_answer(message: str) -> str:
    """The canonical answer for a tool error message, e.g. ``error: insufficient funds in A1``.

    The two errors a bank task can reach give ``error: unknown account <id>`` and ``error: insufficient funds in <id>``.

    Args:
        message: the ``error`` text of a tool response, e.g. ``ValueError: insufficient funds in 'A1': ...``.

    Raises:
        ValueError: the message is not one of the errors a bank task can reach.
    """
    match = _ERROR_PATTERN.match(message)
    if match is None:
        raise ValueError(f"no canonical answer for the tool error {message!r}")
    return f"error: {match.group(1)} {match.group(2)}"


def answer_from_responses(plan: Plan, contents: list[str]) -> str:
    """The final answer of ``plan`` from the real responses of its calls.

    The first error response ends the task: its canonical error (``error_answer``) is the answer.

    Args:
        plan: the plan whose calls (``plan.calls()``) were executed in order.
        contents: the JSON text of each response, in order, up to the first error.
    """
    values: list[dict[str, Any]] = []
    for content in contents:
        value = json.loads(content)
        if "error" in value:
            return error_answer(value["error"])
        values.append(value)
    reported = values[-len(plan.report) :] if plan.report else values[-1:]
    return " ".join(str(value["balance"]) for value in reported)


# --- the environment's working ---------------------------------------------------------------------------------------


def working(world: World, done: list[ToolCall], call: ToolCall) -> str:
    """The bank's reasoning for ``call`` after the successful calls ``done``: the balances it reads, the check, the sum.

    Each account's current balance is written as its initial balance with every earlier change
    (``B2 has 40 + 60 = 100``), so that a rehearse role that learns to write it first has the history in front of
    it; a debit shows the requested amount with the fee and the comparison with the balance. Examples::

        A1 has 120. Requested 40 + fee 5 = 45. 45 <= 120, so 120 - 45 = 75.
        B2 has 40 + 60 = 100.
        C3 has 150. Requested 160 + fee 0 = 160. 160 > 150: insufficient funds.
        X9 is not an account.
    """
    history = {account: [balance] for account, balance in world.balances.items()}
    for earlier in done:
        _apply(history, earlier, world.fee)
    args = call.arguments
    if call.name == "get_balance":
        return _known(history, args["account"]) or f"{_has(history, args['account'])}."
    if call.name == "deposit":
        account, amount = args["account"], args["amount"]
        if (missing := _known(history, account)) is not None:
            return missing
        balance = sum(history[account])
        return f"{_has(history, account)}. {balance} + {amount} = {balance + amount}."
    source = args["account"] if call.name == "withdraw" else args["source"]
    if call.name == "transfer" and (missing := _known(history, args["target"])) is not None:
        return missing  # the bank looks the target up first
    if (missing := _known(history, source)) is not None:
        return missing
    balance, requested = sum(history[source]), args["amount"] + world.fee
    head = f"{_has(history, source)}. Requested {args['amount']} + fee {world.fee} = {requested}."
    if requested > balance:
        return f"{head} {requested} > {balance}: insufficient funds."
    return f"{head} {requested} <= {balance}, so {balance} - {requested} = {balance - requested}."


def _known(history: dict[str, list[int]], account: str) -> str | None:
    return None if account in history else f"{account} is not an account."


def _has(history: dict[str, list[int]], account: str) -> str:
    """``A1 has 120``, or with earlier changes ``A1 has 120 + 60 - 65 = 115``."""
    initial, *changes = history[account]
    if not changes:
        return f"{account} has {initial}"
    terms = " ".join(f"+ {c}" if c >= 0 else f"- {-c}" for c in changes)
    return f"{account} has {initial} {terms} = {sum(history[account])}"


def _apply(history: dict[str, list[int]], call: ToolCall, fee: int) -> None:
    """Record a successful state change of ``call`` (a lookup changes nothing)."""
    args = call.arguments
    if call.name == "deposit":
        history[args["account"]].append(args["amount"])
    elif call.name == "withdraw":
        history[args["account"]].append(-(args["amount"] + fee))
    elif call.name == "transfer":
        history[args["source"]].append(-(args["amount"] + fee))
        history[args["target"]].append(args["amount"])


# --- parameter draws -------------------------------------------------------------------------------------------------


STEP = 10
"""Balances and amounts are multiples of this, so the rehearse role's arithmetic is a small table of whole numbers."""


def _multiple(rng: random.Random, low: int, high: int) -> int:
    """A multiple of ``STEP`` in ``[low, high]``.

    Raises:
        Redraw: there is none.
    """
    first, last = -(-low // STEP), high // STEP
    if first > last:
        raise Redraw(f"no multiple of {STEP} in [{low}, {high}]")
    return rng.randint(first, last) * STEP


def _accounts(rng: random.Random, world: World, k: int) -> list[str]:
    """``k`` distinct accounts of the world."""
    return rng.sample(sorted(world.balances), k)


def _unknown(rng: random.Random, world: World) -> str:
    return rng.choice(sorted(set(ACCOUNTS) - set(world.balances)))


def _draw_balance(rng: random.Random, world: World) -> Plan:
    (a,) = _accounts(rng, world, 1)
    return _plan((), (a,))


def _draw_deposit(rng: random.Random, world: World) -> Plan:
    (a,) = _accounts(rng, world, 1)
    return _plan((deposit(a, _multiple(rng, STEP, 50)),), ())


def _draw_withdraw(rng: random.Random, world: World) -> Plan:
    (a,) = _accounts(rng, world, 1)
    return _plan((withdraw(a, _multiple(rng, STEP, world.spendable(a))),), ())


def _draw_transfer_target(rng: random.Random, world: World) -> Plan:
    a, b = _accounts(rng, world, 2)
    return _plan((transfer(a, b, _multiple(rng, STEP, world.spendable(a))),), (b,))


def _draw_transfer_both(rng: random.Random, world: World) -> Plan:
    a, b = _accounts(rng, world, 2)
    return _plan((transfer(a, b, _multiple(rng, STEP, world.spendable(a))),), (a, b))


def _draw_insufficient_funds(rng: random.Random, world: World) -> Plan:
    (a,) = _accounts(rng, world, 1)
    amount = _multiple(rng, world.spendable(a) + 1, world.balances[a] + 50)  # amount + fee > balance
    return _plan((withdraw(a, amount),), (), INSUFFICIENT_FUNDS)


def _draw_unknown_account(rng: random.Random, world: World) -> Plan:
    return _plan((), (_unknown(rng, world),), UNKNOWN_ACCOUNT)


def _draw_deposit_transfer(rng: random.Random, world: World) -> Plan:
    a, b = _accounts(rng, world, 2)
    added = _multiple(rng, STEP, 50)
    amount = _multiple(rng, STEP, world.spendable(a) + added)
    return _plan((deposit(a, added), transfer(a, b, amount)), (b,))


def _chain(rng: random.Random, world: World, *, overdraw: bool) -> tuple[tuple[ToolCall, ...], list[str]]:
    """Two chained transfers A -> B -> C; the second overdraws B when ``overdraw``."""
    a, b, c = _accounts(rng, world, 3)
    first = _multiple(rng, STEP, world.spendable(a))
    spendable_b = world.spendable(b) + first  # B after receiving the first transfer, minus the fee
    second = _multiple(rng, spendable_b + 1, spendable_b + 50) if overdraw else _multiple(rng, STEP, spendable_b)
    return (transfer(a, b, first), transfer(b, c, second)), [a, b, c]


def _draw_transfer_chain(rng: random.Random, world: World) -> Plan:
    operations, (_, _, c) = _chain(rng, world, overdraw=False)
    return _plan(operations, (c,))


def _draw_transfer_chain_both(rng: random.Random, world: World) -> Plan:
    operations, (_, b, c) = _chain(rng, world, overdraw=False)
    return _plan(operations, (b, c))


def _draw_chain_insufficient(rng: random.Random, world: World) -> Plan:
    operations, (_, _, c) = _chain(rng, world, overdraw=True)
    return _plan(operations, (c,), INSUFFICIENT_FUNDS)


_T = Template
TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        _T("balance", False, 1, "balance lookup", _draw_balance),
        _T("deposit", False, 1, "deposit, then report the new balance", _draw_deposit),
        _T("transfer_target", False, 2, "transfer, then report the target's balance", _draw_transfer_target),
        _T("withdraw", False, 1, "withdraw, then report the new balance", _draw_withdraw),
        _T("insufficient_funds", False, 1, "a withdrawal that overdraws (error)", _draw_insufficient_funds),
        _T("transfer_both", False, 3, "transfer, then report both balances", _draw_transfer_both),
        _T("unknown_account", False, 1, "balance of an account that does not exist (error)", _draw_unknown_account),
        _T("deposit_transfer", True, 3, "deposit, transfer, then report the target", _draw_deposit_transfer),
        _T("transfer_chain", True, 3, "two chained transfers, then report the last", _draw_transfer_chain),
        _T("transfer_chain_both", True, 4, "two chained transfers, then report both", _draw_transfer_chain_both),
        _T("chain_insufficient", True, 2, "chained transfers, second overdraws (error)", _draw_chain_insufficient),
    )
}
"""Every template by name, training templates first (in the order a training split rotates through them)."""

TRAIN_TEMPLATES = tuple(name for name, t in TEMPLATES.items() if not t.held_out)
HELD_OUT_TEMPLATES = tuple(name for name, t in TEMPLATES.items() if t.held_out)
