"""The mutable state of one running episode (``_Live``), shared by the runner and its turn and limit steps.

``EpisodeRunner`` (``envace.rollout.runner``) keeps one per episode; the user-turn steps (``user_turns``), the limit and
accounting steps (``limits``) and the rehearsing runner's forks (``rehearsing``) read and update it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envace.engines.stream import TokenStream
from envace.roles.parsing import CallError
from envace.types import Episode
from envace.worlds.base import ToolRequest


@dataclass
class _Live:
    """Mutable state of one running episode."""

    episode: Episode
    stream: TokenStream | None  # None until a simulated user has written the opening message
    transcript: list[dict[str, Any]]  # messages as rendered: assistant content is the raw generated text
    handle: Any
    pending: list[ToolRequest | CallError] = field(default_factory=list)
    done: bool = False
    user_turn: int = 0  # index of the user turn being answered (0: the task's own messages)
    turn_steps: int = 0  # act turns in this user turn
    unlocked: set[str] = field(default_factory=set)  # hidden tools the user turns delivered so far brought
    awaiting_user: bool = False  # the simulated user writes next
    user_state: dict[str, Any] = field(default_factory=dict)  # the user simulator's scratch space
    closed: list[TokenStream] = field(default_factory=list)  # earlier act rows (the template rewrote their text)
    generated: list[list[list[int]]] = field(default_factory=lambda: [[]])  # per row: its act generations' ids
