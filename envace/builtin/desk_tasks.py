"""The built-in help desk tasks and their packaged splits (``builtin:desk`` and friends).

The desk is the second built-in domain, built to be unlike the bank: its state is strings (ticket titles, statuses
and assignees), its responses are records looked up and updated rather than sums, and its answers are copied values
rather than numbers. This module owns its generation settings: how a hidden world is drawn (3 to 5 tickets with
distinct titles, 3 or 4 agents on the desk), what the act role is told (``SYSTEM_PROMPT``) and the rehearse role
knows (``world_context``), and the four splits. ``envace.builtin.generator`` generates the tasks exactly as it does
the bank's (real responses, hash-partitioned train/val/test, held-out templates; docs/builtin-domain.md): call
``generator.generate_split(DESK, "test")`` and friends with ``DESK``.

Usage: ``python -m envace.builtin.desk_tasks`` rewrites the four packaged files;
``python -m envace.builtin.desk_tasks --n 100 --seed 7 --templates status,find --out my_tasks.jsonl`` writes a
custom set.
"""

from __future__ import annotations

import json
import random

from envace.builtin import generator
from envace.builtin.desk import HelpDesk
from envace.builtin.desk_templates import (
    AGENTS,
    HELD_OUT_TEMPLATES,
    TEMPLATES,
    TICKET_IDS,
    TITLES,
    TRAIN_TEMPLATES,
    World,
    answer_from_responses,
    working,
)
from envace.builtin.generator import Split, standard_splits

DESK_CLASS_PATH = "envace.builtin.desk.HelpDesk"
STATUS_WEIGHTS = ("open", "open", "pending", "closed")  # a ticket's status is drawn from these
SYSTEM_PROMPT = (
    "You are a help desk assistant. Use the tools, one call per turn. To close a ticket, set its status to closed; "
    "to reopen it, set it to open. assign and set_status return the ticket after the change. Then reply with the "
    "requested value only: a status, a title, an agent's name (nobody if the ticket is unassigned), or ticket ids "
    "separated by spaces (none if there are none). If a call fails, stop and reply with the error and the ticket or "
    "agent, e.g. 'error: unknown ticket T123', 'error: unknown agent zoe', 'error: ticket T123 is closed' or "
    "'error: ticket T123 has no assignee'."
)
"""The act role's system prompt: how to call and the answer formats."""

SPLITS: dict[str, Split] = standard_splits("desk", 11, (200, 128, 256, 128), TRAIN_TEMPLATES, HELD_OUT_TEMPLATES)
"""The packaged splits by name (the training split holds 20 tasks of each of the 10 training templates)."""


def draw_world(rng: random.Random) -> World:
    """A hidden world: 3 to 5 tickets (ascending ids, distinct titles; a closed ticket has an assignee), 3-4 agents."""
    agents = rng.sample(AGENTS, rng.randint(3, 4))
    ids = sorted(rng.sample(TICKET_IDS, rng.randint(3, 5)))
    tickets = {}
    for ticket, title in zip(ids, rng.sample(TITLES, len(ids)), strict=True):
        status = rng.choice(STATUS_WEIGHTS)
        assignee = rng.choice(agents) if status == "closed" else rng.choice([*agents, None])
        tickets[ticket] = {"title": title, "status": status, "assignee": assignee}
    return World(tickets, agents)


def world_context(world: World) -> str:
    """The facts the rehearse role needs to play the desk (never shown to the act role)."""
    tickets = "; ".join(f"{tid}: {json.dumps(record, ensure_ascii=False)}" for tid, record in world.tickets.items())
    return (
        f"Help desk tickets: {tickets}. Agents on the desk: {', '.join(world.agents)}. Any other ticket id or agent "
        "is unknown. get_ticket, assign and set_status return the ticket after the call: "
        '{"ticket": "<id>", "title": ..., "status": ..., "assignee": ...}; find_tickets returns '
        '{"agent": "<name>", "tickets": [the ids assigned to the agent, ascending]}. A closed ticket cannot be '
        "assigned; a ticket with no assignee cannot be closed. A failed call changes nothing and returns "
        '{"error": "ValueError: unknown ticket \'<id>\'"}, {"error": "ValueError: unknown agent \'<name>\'"}, '
        '{"error": "ValueError: ticket \'<id>\' is closed"} or {"error": "ValueError: ticket \'<id>\' has no '
        'assignee"}.'
    )


DESK = generator.Domain(
    name="desk",
    environment=HelpDesk,
    class_path=DESK_CLASS_PATH,
    system_prompt=SYSTEM_PROMPT,
    templates=TEMPLATES,
    splits=SPLITS,
    world_type=World,
    draw_world=draw_world,
    world_context=world_context,
    answer=answer_from_responses,
    working=working,
)
"""The help desk domain, as ``envace.builtin.generator`` generates it."""


def main(argv: list[str] | None = None) -> None:
    """Command line: rewrite the packaged split files, or write a custom task set with ``--out``."""
    generator.main(DESK, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
