"""Loop rules: how an episode's act turns are read, and when a benchmark's own loop would have ended it.

``EpisodeRunner`` is benchmark-neutral. A benchmark whose official inference loop reads model output with its own
decoder, or ends a conversation by its own rules (BFCL's force-quit after 20 steps in a turn, tau^2's step and error
limits), hands the runner a ``LoopRules`` that says so; the runner asks it to read every committed act turn
(``parse``) and, after every phase of the loop, whether an episode must end (``stop_reason``). The default is
envace's own protocol: ``envace.roles.parsing.parse_act_output`` and no extra ending.
"""

from __future__ import annotations

from typing import Any

from envace.roles.parsing import ParsedTurn, parse_act_output
from envace.types import Episode


class LoopRules:
    """envace's own loop: its tolerant ``<tool_call>`` parser, no ending besides the rollout's budgets.

    Subclasses mirror a benchmark's inference loop; each method must be a pure function of its arguments and of the
    episode (it is called at every phase, so it must give the same answer when nothing changed).
    """

    name = "envace"

    def parse(self, text: str) -> ParsedTurn:
        """Read one act turn (the decoded generation, stop token removed)."""
        return parse_act_output(text)

    def stop_reason(self, episode: Episode) -> str:
        """A non-empty reason ends the episode now (kept in ``EpisodeStats.stop_reason``); ``""`` lets it go on."""
        return ""


def awaiting_tools(episode: Episode) -> bool:
    """The last message is an act turn whose calls have not been answered yet (the loop is between two phases)."""
    last: dict[str, Any] = episode.messages[-1] if episode.messages else {}
    return last.get("role") == "assistant" and bool(last.get("tool_calls"))


def current_turn_steps(episode: Episode) -> int:
    """Act turns with calls in the user turn being answered (``call_steps`` of the last delivered user turn)."""
    turn = episode.stats.user_turns - 1
    return sum(1 for index, _ in episode.call_steps if index == turn)
