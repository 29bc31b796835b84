"""An oracle policy for the built-in help desk tasks: the act role's turns that solve a task.

Like the bank's oracle (``envace.builtin.oracle``), it solves a task independently of how it was generated: it reads
the user's request (never the success specification or the reference trajectory), keeps its own copy of the hidden
tickets (the task's environment arguments, which only an oracle may see) under the domain's rules, and follows the
system prompt: one call per turn; report from the last response; the first error ends the task with
``error: ...``. It never runs the ``HelpDesk``, so running its turns in the real environment checks the generator, the
desk and the success specifications against each other.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from envace.builtin.oracle import OracleError, call_text
from envace.types import Task, ToolCall

__all__ = ["OracleError", "oracle_plan", "oracle_turns", "parse_request"]

_QUESTIONS = (
    (re.compile(r"What is the status of ticket (\w+)\?"), "get_ticket", "status"),
    (re.compile(r"Who is ticket (\w+) assigned to\?"), "get_ticket", "assignee"),
    (re.compile(r"Which tickets are assigned to (\w+)\?"), "find_tickets", "tickets"),
)
_UPDATES = (
    (re.compile(r"assign ticket (\w+) to (\w+)"), lambda m: ToolCall("assign", {"ticket": m[1], "agent": m[2]})),
    (re.compile(r"close ticket (\w+)"), lambda m: ToolCall("set_status", {"ticket": m[1], "status": "closed"})),
    (re.compile(r"reopen ticket (\w+)"), lambda m: ToolCall("set_status", {"ticket": m[1], "status": "open"})),
    (re.compile(r"mark ticket (\w+) as pending"),
     lambda m: ToolCall("set_status", {"ticket": m[1], "status": "pending"})),
)
_REPORTS = {"tell me its status": "status", "tell me its title": "title", "tell me who it is assigned to": "assignee"}
_FIND_REPORT = re.compile(r"tell me which tickets are assigned to (\w+)")


class _Desk:
    """The oracle's own model of the desk: the tickets, the agents and the error rules."""

    def __init__(self, tickets: dict[str, dict[str, Any]], agents: list[str]) -> None:
        self.tickets = copy.deepcopy(tickets)
        self.agents = list(agents)

    def apply(self, call: ToolCall) -> str | None:
        """Apply a call; returns the error answer if it fails (nothing changes then)."""
        args = call.arguments
        if "ticket" in args and args["ticket"] not in self.tickets:
            return f"error: unknown ticket {args['ticket']}"
        if "agent" in args and args["agent"] not in self.agents:
            return f"error: unknown agent {args['agent']}"
        if call.name == "assign":
            if self.tickets[args["ticket"]]["status"] == "closed":
                return f"error: ticket {args['ticket']} is closed"
            self.tickets[args["ticket"]]["assignee"] = args["agent"]
        elif call.name == "set_status":
            if args["status"] == "closed" and self.tickets[args["ticket"]]["assignee"] is None:
                return f"error: ticket {args['ticket']} has no assignee"
            self.tickets[args["ticket"]]["status"] = args["status"]
        return None

    def report(self, call: ToolCall, what: str) -> str:
        """The answer after ``call``: a field of its ticket, or an agent's ticket ids."""
        if what == "tickets":
            owned = sorted(t for t, r in self.tickets.items() if r["assignee"] == call.arguments["agent"])
            return " ".join(owned) or "none"
        value = self.tickets[call.arguments["ticket"]][what]
        return "nobody" if value is None else str(value)


def parse_request(question: str) -> tuple[list[ToolCall], str]:
    """The calls a desk request asks for, in order, and what the answer reports (a ticket field or ``tickets``).

    Raises:
        OracleError: the text is not a desk request.
    """
    for pattern, tool, what in _QUESTIONS:
        if match := pattern.fullmatch(question):
            key = "agent" if tool == "find_tickets" else "ticket"
            return [ToolCall(tool, {key: match.group(1)})], what
    if not question.endswith("."):
        raise OracleError(f"not a desk request: {question!r}")
    *clauses, report = question[:-1].split(", then ")
    clauses = [clause[:1].lower() + clause[1:] for clause in clauses]  # the first clause starts with a capital
    calls = [_update(clause, question) for clause in clauses]
    if not calls:
        raise OracleError(f"not a desk request: {question!r}")
    if report in _REPORTS:
        return calls, _REPORTS[report]
    if match := _FIND_REPORT.fullmatch(report):
        return [*calls, ToolCall("find_tickets", {"agent": match.group(1)})], "tickets"
    raise OracleError(f"not a desk report: {report!r} in {question!r}")


def _update(clause: str, question: str) -> ToolCall:
    for pattern, build in _UPDATES:
        if match := pattern.fullmatch(clause):
            return build(match)
    raise OracleError(f"not a desk update: {clause!r} in {question!r}")


def oracle_plan(task: Task) -> tuple[list[ToolCall], str]:
    """The calls the oracle makes on ``task`` and its final answer.

    Raises:
        OracleError: the task has no environment or its last message is not a desk request.
    """
    if task.environment is None:
        raise OracleError(f"task '{task.id}' has no environment; the oracle reads the hidden tickets from it")
    calls, what = parse_request(task.messages[-1]["content"])
    desk = _Desk(task.environment.init_args["tickets"], task.environment.init_args["agents"])
    for i, call in enumerate(calls):
        error = desk.apply(call)
        if error is not None:
            return calls[: i + 1], error
    return calls, desk.report(calls[-1], what)


def oracle_turns(task: Task) -> list[str]:
    """The act role's assistant texts, turn by turn: one tool call per turn, then the final answer."""
    calls, answer = oracle_plan(task)
    return [call_text(call) for call in calls] + [answer]
