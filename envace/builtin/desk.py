"""A small deterministic IT help desk: the second built-in real environment, with string-valued state.

Where the bank's responses are arithmetic on balances, the desk's are lookups and updates of records: tickets with a
title, a status and an assignee, worked by a team of agents. Each public method is a tool (typed, with a Google-style
docstring, so its JSON schema is derived automatically). Errors are raised as ``ValueError`` with a specific message;
``RealEnvironment`` turns them into observations.
"""

from __future__ import annotations

from typing import Literal

Status = Literal["open", "pending", "closed"]
STATUSES: tuple[str, ...] = ("open", "pending", "closed")


class HelpDesk:
    """Tickets (a title, a status and an assignee or none) and the agents on the desk.

    Attributes:
        tickets: each ticket's record by id: ``{"title": str, "status": str, "assignee": str | None}``.
        agents: the agents on the desk; any other name is unknown.
    """

    def __init__(self, tickets: dict[str, dict], agents: list[str]) -> None:
        """Open the desk.

        Args:
            tickets: each ticket's record by id (copied, never mutated).
            agents: the agents on the desk.
        """
        self.tickets = {tid: dict(record) for tid, record in tickets.items()}
        self.agents = list(agents)

    def get_ticket(self, ticket: str) -> dict:
        """Look a ticket up.

        Args:
            ticket: The ticket id, for example "T123".

        Returns:
            The ticket's id, title, status and assignee (null when unassigned).
        """
        return self._record(ticket)

    def find_tickets(self, agent: str) -> dict:
        """List the tickets assigned to an agent.

        Args:
            agent: The agent's name, for example "ana".

        Returns:
            The agent and the ids of the tickets assigned to them, in ascending order.
        """
        self._agent(agent)
        return {"agent": agent, "tickets": sorted(t for t, r in self.tickets.items() if r["assignee"] == agent)}

    def assign(self, ticket: str, agent: str) -> dict:
        """Assign a ticket to an agent; a closed ticket cannot be assigned.

        Args:
            ticket: The ticket id, for example "T123".
            agent: The agent's name, for example "ana".

        Returns:
            The ticket after the change: its id, title, status and assignee.
        """
        record = self._ticket(ticket)
        self._agent(agent)
        if record["status"] == "closed":
            raise ValueError(f"ticket '{ticket}' is closed")
        record["assignee"] = agent
        return self._record(ticket)

    def set_status(self, ticket: str, status: Status) -> dict:
        """Set a ticket's status; a ticket without an assignee cannot be closed.

        Args:
            ticket: The ticket id, for example "T123".
            status: The new status.

        Returns:
            The ticket after the change: its id, title, status and assignee.
        """
        record = self._ticket(ticket)
        if status not in STATUSES:
            raise ValueError(f"unknown status '{status}'")
        if status == "closed" and record["assignee"] is None:
            raise ValueError(f"ticket '{ticket}' has no assignee")
        record["status"] = status
        return self._record(ticket)

    def _ticket(self, ticket: str) -> dict:
        if ticket not in self.tickets:
            raise ValueError(f"unknown ticket '{ticket}'")
        return self.tickets[ticket]

    def _agent(self, agent: str) -> None:
        if agent not in self.agents:
            raise ValueError(f"unknown agent '{agent}'")

    def _record(self, ticket: str) -> dict:
        record = self._ticket(ticket)
        return {"ticket": ticket, "title": record["title"], "status": record["status"], "assignee": record["assignee"]}
