"""Task templates of the built-in help desk domain: the request wording, the call plan and the answer format.

This module owns what a desk task asks and how it must be solved. A template draws its parameters (tickets and
agents) from a world (the hidden tickets and the agents on the desk) and returns a ``Plan``: the user's request, the
calls, what the answer reports, and the outcome it is built to reach (success, or a specific error).
``envace.builtin.desk_tasks`` runs the plan on the real ``HelpDesk`` and derives the answer with
``answer_from_responses``; ``envace.builtin.desk_oracle`` solves the same requests independently.

Answer formats (the act role's final message) are values copied from the last response, never computed:

* a field of the ticket the last call returned: a status (``open``), a title (``vpn down``), or an assignee
  (``ana``; ``nobody`` when unassigned);
* an agent's tickets: the ids in ascending order, separated by one space (``T105 T230``; ``none`` when empty);
* errors: ``error: unknown ticket T123``, ``error: unknown agent zoe``, ``error: ticket T123 is closed`` or
  ``error: ticket T123 has no assignee`` (the first failing call ends the task).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from envace.builtin.generator import OK, Redraw, Template
from envace.types import ToolCall

TICKET_IDS = tuple(f"T{n}" for n in range(100, 1000))
"""Every ticket id a task can mention (a world holds 3 to 5 of them; the others are unknown)."""
AGENTS = ("ana", "ben", "chen", "dara", "eli", "farah", "gus", "hana", "ivan", "jo", "kai", "lena")
"""Every agent name a task can mention (3 or 4 of them are on a world's desk)."""
TITLES = (
    "printer jam", "vpn down", "password reset", "laptop slow", "email bounce", "screen flicker", "disk full",
    "wifi drops", "badge broken", "mouse dead", "app crash", "phone setup", "license expired", "backup failed",
    "keyboard stuck", "monitor dark", "account locked", "update stuck", "camera off", "sound missing",
)  # fmt: skip
"""Ticket titles (a world's tickets have distinct ones)."""

UNKNOWN_TICKET = "unknown ticket"
UNKNOWN_AGENT = "unknown agent"
CLOSED = "is closed"
NO_ASSIGNEE = "has no assignee"
_ERROR_PATTERN = re.compile(r"^ValueError: (?:(unknown ticket|unknown agent) '([^']+)'|ticket '([^']+)' "
                            r"(is closed|has no assignee))$")
FIELDS = ("status", "title", "assignee")
"""Ticket fields a request can ask for."""
TICKETS = "tickets"
"""The report of an agent's ticket list."""


@dataclass(frozen=True)
class World:
    """The hidden state of one task: the tickets and the agents on the desk.

    Attributes:
        tickets: each ticket's record by id (ascending ids): ``{"title", "status", "assignee"}``; a closed ticket
            always has an assignee.
        agents: the agents on the desk.
    """

    tickets: dict[str, dict[str, Any]]
    agents: list[str]

    def where(self, **fields: Any) -> list[str]:
        """Ids of the tickets whose fields equal ``fields``; ``status="!closed"`` means any status but closed."""
        def matches(record: dict[str, Any]) -> bool:
            for key, value in fields.items():
                if value == "!closed" and record[key] == "closed":
                    return False
                if value != "!closed" and record[key] != value:
                    return False
            return True

        return [tid for tid, record in self.tickets.items() if matches(record)]


@dataclass(frozen=True)
class Plan:
    """What a template asks for and how it is solved.

    Attributes:
        question: the user's request.
        operations: every call of the solution, in order.
        report: what the answer reports from the last response: a ticket field (``FIELDS``) or ``TICKETS``.
        outcome: the outcome the parameters were drawn to reach: ``OK``, ``UNKNOWN_TICKET``, ``UNKNOWN_AGENT``,
            ``CLOSED`` or ``NO_ASSIGNEE``.
    """

    question: str
    operations: tuple[ToolCall, ...]
    report: str
    outcome: str = OK

    def calls(self) -> list[ToolCall]:
        """The full call plan."""
        return list(self.operations)


# --- calls and wording -----------------------------------------------------------------------------------------------


def get_ticket(ticket: str) -> ToolCall:
    """A ``get_ticket`` call."""
    return ToolCall("get_ticket", {"ticket": ticket})


def find_tickets(agent: str) -> ToolCall:
    """A ``find_tickets`` call."""
    return ToolCall("find_tickets", {"agent": agent})


def assign(ticket: str, agent: str) -> ToolCall:
    """An ``assign`` call."""
    return ToolCall("assign", {"ticket": ticket, "agent": agent})


def set_status(ticket: str, status: str) -> ToolCall:
    """A ``set_status`` call."""
    return ToolCall("set_status", {"ticket": ticket, "status": status})


_STATUS_VERBS = {"closed": "close ticket {t}", "open": "reopen ticket {t}", "pending": "mark ticket {t} as pending"}
_REPORTS = {"status": "tell me its status", "title": "tell me its title", "assignee": "tell me who it is assigned to"}


def _clause(call: ToolCall) -> str:
    """The request clause of one update, e.g. ``assign ticket T105 to ana`` or ``close ticket T105``."""
    args = call.arguments
    if call.name == "assign":
        return f"assign ticket {args['ticket']} to {args['agent']}"
    if call.name == "set_status":
        return _STATUS_VERBS[args["status"]].format(t=args["ticket"])
    raise ValueError(f"'{call.name}' is not an update")


def request(operations: tuple[ToolCall, ...], report: str) -> str:
    """The user's request for a plan.

    A lone lookup is a question (``What is the status of ticket T105?``, ``Who is ticket T105 assigned to?``,
    ``Which tickets are assigned to ana?``); updates are clauses joined by ``, then `` and end with the report
    (``Assign ticket T105 to ana, then tell me its status.``).
    """
    *updates, last = operations
    if last.name == "get_ticket" and not updates:
        ticket = last.arguments["ticket"]
        return f"Who is ticket {ticket} assigned to?" if report == "assignee" else (
            f"What is the {report} of ticket {ticket}?")
    if last.name == "find_tickets":
        tail = f"which tickets are assigned to {last.arguments['agent']}"
        if not updates:
            return tail[0].upper() + tail[1:] + "?"
        clauses = [_clause(call) for call in updates] + [f"tell me {tail}"]
    else:
        clauses = [_clause(call) for call in operations] + [_REPORTS[report]]
    text = ", then ".join(clauses)
    return text[0].upper() + text[1:] + "."


def _plan(operations: tuple[ToolCall, ...], report: str, outcome: str = OK) -> Plan:
    return Plan(request(operations, report), operations, report, outcome)


# --- answers ---------------------------------------------------------------------------------------------------------


def error_answer(message: str) -> str:
    """The canonical answer for a tool error message, e.g. ``error: ticket T105 is closed``.

    Raises:
        ValueError: the message is not one of the errors a desk task can reach.
    """
    match = _ERROR_PATTERN.match(message)
    if match is None:
        raise ValueError(f"no canonical answer for the tool error {message!r}")
    if match.group(1):
        return f"error: {match.group(1)} {match.group(2)}"
    return f"error: ticket {match.group(3)} {match.group(4)}"


def report_value(value: dict[str, Any], report: str) -> str:
    """The answer text of one response: a field (``nobody`` for no assignee) or the ticket ids (``none``)."""
    if report == TICKETS:
        return " ".join(value["tickets"]) or "none"
    field = value[report]
    return "nobody" if field is None else str(field)


def answer_from_responses(plan: Plan, contents: list[str]) -> str:
    """The final answer of ``plan`` from the real responses of its calls (the first error ends the task).

    Args:
        plan: the plan whose calls were executed in order.
        contents: the JSON text of each response, in order, up to the first error.
    """
    value: dict[str, Any] = {}
    for content in contents:
        value = json.loads(content)
        if "error" in value:
            return error_answer(value["error"])
    return report_value(value, plan.report)


# --- the environment's working ---------------------------------------------------------------------------------------


def working(world: World, done: list[ToolCall], call: ToolCall) -> str:
    """The desk's reasoning for ``call`` after the successful calls ``done``: what it reads, then what it decides.

    It first lists what the call looks up (the ticket ids, or the agents), says whether the named one is there, then
    quotes the ticket's record as it stands after ``done`` (the world context's JSON with every earlier change
    applied) and states the check the call passes or fails. A rehearse role that learns to write this copies the
    record from its context before it answers, instead of guessing whether a ticket exists, is closed or has an
    assignee. Examples::

        Tickets: T105 T230 T318. T105: {"title": "vpn down", "status": "open", "assignee": "ana"}.
        Tickets: T105 T230 T318. T999 is not one of them.
        Tickets: T105 T230 T318. Agents: ana ben chen. T230: {..., "status": "closed", ...}. It is closed: it cannot
        be assigned.
        Tickets: T105 T230 T318. T318: {..., "assignee": null}. It has no assignee: it cannot be closed.
        Agents: ana ben chen. Assignees: T105 ana, T230 ben, T318 none. Tickets assigned to chen: none.
    """
    tickets = {tid: dict(record) for tid, record in world.tickets.items()}
    for earlier in done:
        _update(tickets, earlier)
    args = call.arguments
    ticket, agent = args.get("ticket"), args.get("agent")
    agents = f"Agents: {' '.join(world.agents)}."
    if call.name == "find_tickets":
        if agent not in world.agents:
            return f"{agents} {agent} is not one of them."
        assignees = ", ".join(f"{tid} {record['assignee'] or 'none'}" for tid, record in sorted(tickets.items()))
        owned = sorted(tid for tid, record in tickets.items() if record["assignee"] == agent)
        return f"{agents} Assignees: {assignees}. Tickets assigned to {agent}: {' '.join(owned) or 'none'}."
    steps = [f"Tickets: {' '.join(sorted(tickets))}."]
    if ticket not in tickets:
        return f"{steps[0]} {ticket} is not one of them."
    if agent is not None:
        steps.append(agents)
        if agent not in world.agents:
            return " ".join([*steps, f"{agent} is not one of them."])
    record = tickets[ticket]
    steps.append(f"{ticket}: {json.dumps(record, ensure_ascii=False)}.")  # as the world context writes it
    if call.name == "assign":
        steps.append("It is closed: it cannot be assigned." if record["status"] == "closed"
                     else f"Assignee {record['assignee'] or 'none'} -> {agent}.")
    elif call.name == "set_status":
        refused = args["status"] == "closed" and record["assignee"] is None
        steps.append("It has no assignee: it cannot be closed." if refused
                     else f"Status {record['status']} -> {args['status']}.")
    return " ".join(steps)


def _update(tickets: dict[str, dict[str, Any]], call: ToolCall) -> None:
    """Record a successful change of ``call`` (a lookup changes nothing)."""
    if call.name == "assign":
        tickets[call.arguments["ticket"]]["assignee"] = call.arguments["agent"]
    elif call.name == "set_status":
        tickets[call.arguments["ticket"]]["status"] = call.arguments["status"]


# --- parameter draws -------------------------------------------------------------------------------------------------


def _pick(rng: random.Random, candidates: list[str]) -> str:
    """One of ``candidates``.

    Raises:
        Redraw: there is none.
    """
    if not candidates:
        raise Redraw("the world has no fitting ticket or agent")
    return rng.choice(candidates)


def _other_agent(rng: random.Random, world: World, ticket: str) -> str:
    """An agent on the desk who does not hold ``ticket``."""
    return _pick(rng, [a for a in world.agents if a != world.tickets[ticket]["assignee"]])


def _draw_status(rng: random.Random, world: World) -> Plan:
    return _plan((get_ticket(_pick(rng, list(world.tickets))),), "status")


def _draw_assignee(rng: random.Random, world: World) -> Plan:
    return _plan((get_ticket(_pick(rng, list(world.tickets))),), "assignee")


def _draw_find(rng: random.Random, world: World) -> Plan:
    return _plan((find_tickets(_pick(rng, world.agents)),), TICKETS)


def _draw_reassign(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, world.where(status="!closed"))
    return _plan((assign(ticket, _other_agent(rng, world, ticket)),), "status")


def _draw_close(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, [t for t in world.where(status="!closed") if world.tickets[t]["assignee"] is not None])
    return _plan((set_status(ticket, "closed"),), "title")


def _draw_reopen(rng: random.Random, world: World) -> Plan:
    return _plan((set_status(_pick(rng, world.where(status="closed")), "open"),), "assignee")


def _draw_unknown_ticket(rng: random.Random, world: World) -> Plan:
    unknown = rng.choice(sorted(set(TICKET_IDS) - set(world.tickets)))
    return _plan((get_ticket(unknown),), "status", UNKNOWN_TICKET)


def _draw_unknown_agent(rng: random.Random, world: World) -> Plan:
    return _plan((find_tickets(rng.choice(sorted(set(AGENTS) - set(world.agents)))),), TICKETS, UNKNOWN_AGENT)


def _draw_closed_ticket(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, world.where(status="closed"))
    return _plan((assign(ticket, _other_agent(rng, world, ticket)),), "status", CLOSED)


def _draw_no_assignee(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, world.where(status="!closed", assignee=None))
    return _plan((set_status(ticket, "closed"),), "title", NO_ASSIGNEE)


def _draw_assign_close(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, world.where(status="!closed", assignee=None))
    return _plan((assign(ticket, _pick(rng, world.agents)), set_status(ticket, "closed")), "title")


def _draw_assign_find(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, world.where(status="!closed"))
    agent = _other_agent(rng, world, ticket)
    return _plan((assign(ticket, agent), find_tickets(agent)), TICKETS)


def _draw_close_reassign(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, [t for t in world.where(status="!closed") if world.tickets[t]["assignee"] is not None])
    return _plan((set_status(ticket, "closed"), assign(ticket, _other_agent(rng, world, ticket))), "status", CLOSED)


def _draw_reopen_reassign(rng: random.Random, world: World) -> Plan:
    ticket = _pick(rng, world.where(status="closed"))
    return _plan((set_status(ticket, "open"), assign(ticket, _other_agent(rng, world, ticket))), "status")


_T = Template
TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        _T("status", False, 1, "a ticket's status", _draw_status),
        _T("assignee", False, 1, "who a ticket is assigned to (or nobody)", _draw_assignee),
        _T("find", False, 1, "an agent's tickets (or none)", _draw_find),
        _T("reassign", False, 1, "assign a ticket to another agent, then report its status", _draw_reassign),
        _T("close", False, 1, "close an assigned ticket, then report its title", _draw_close),
        _T("reopen", False, 1, "reopen a closed ticket, then report its assignee", _draw_reopen),
        _T("unknown_ticket", False, 1, "status of a ticket that does not exist (error)", _draw_unknown_ticket),
        _T("unknown_agent", False, 1, "tickets of an agent who is not on the desk (error)", _draw_unknown_agent),
        _T("closed_ticket", False, 1, "assign a closed ticket (error)", _draw_closed_ticket),
        _T("no_assignee", False, 1, "close an unassigned ticket (error)", _draw_no_assignee),
        _T("assign_close", True, 2, "assign an unassigned ticket, close it, report its title", _draw_assign_close),
        _T("assign_find", True, 2, "assign a ticket, then list the new assignee's tickets", _draw_assign_find),
        _T("close_reassign", True, 2, "close a ticket, then assign it (error)", _draw_close_reassign),
        _T("reopen_reassign", True, 2, "reopen a closed ticket, then assign it, report its status",
           _draw_reopen_reassign),
    )
}
"""Every template by name, training templates first (in the order a training split rotates through them)."""

TRAIN_TEMPLATES = tuple(name for name, t in TEMPLATES.items() if not t.held_out)
HELD_OUT_TEMPLATES = tuple(name for name, t in TEMPLATES.items() if t.held_out)
