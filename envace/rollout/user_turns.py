"""User turns of a running episode: the task's scripted turns, a simulated user's turns, and the turn gate.

``UserTurns`` is a mixin of ``EpisodeRunner`` (``envace.rollout.runner``): after the act role answers a user turn in
plain text (or the step limit cuts its turn) the runner calls ``_next_user_turn``, which delivers the task's next
scripted turn (``Task.user_turns``, with the tools it unlocks), hands over to the simulated user (``_user_step``, one
batched ``UserSimulator.respond`` per micro-step), or ends the episode (``max_user_turns``, the turn gate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from envace.engines.stream import context_stream
from envace.rollout.config import RolloutConfig
from envace.rollout.state import _Live
from envace.types import Episode, Role, Task, error_text
from envace.worlds.users import UserRequest, UserSimulator


class UserTurns:
    """The runner's user-turn steps (mixed into ``EpisodeRunner``, which provides ``_append`` and ``check_render``)."""

    tokenizer: PreTrainedTokenizerBase
    config: RolloutConfig
    user: UserSimulator | None
    turn_gate: Callable[[Episode], bool] | None

    def _user_step(self, states: list[_Live]) -> None:
        """The simulated user writes the next message of every episode waiting for it (one batched call)."""
        if not states:
            return
        assert self.user is not None
        requests = [UserRequest(s.episode.task, s.episode.messages, s.user_state, s.handle, s.episode.act.episode_index)
                    for s in states]
        for s, reply in zip(states, self.user.respond(requests)):
            s.awaiting_user = False
            stats = s.episode.stats
            if reply.failed:
                stats.user_failures += 1
                s.done = True
            elif reply.stop:
                stats.user_stop = True
                if reply.content:  # kept in the conversation, never shown to the act role
                    s.episode.messages.append({"role": "user", "content": reply.content})
                s.done = True
            else:
                self._deliver_user(s, [{"role": "user", "content": reply.content}])

    def _next_user_turn(self, s: _Live, cut: bool = False) -> None:
        """Deliver the task's next user turn, hand over to the simulated user, or end the episode.

        ``cut``: the act role's turn was cut by the step limit while the stream already holds the generation prompt
        of its next message; that message is closed empty, so the stream stays the template's render.
        """
        turns = s.episode.task.user_turns
        closing = [{"role": "assistant", "content": ""}] if cut else []
        if self._user_turns_spent(s):  # scripted or simulated, the conversation ends at max_user_turns
            s.episode.stats.user_turn_limit = s.user_turn < len(turns) or self._simulates(s.episode.task)
            s.done = True
            return
        more = s.user_turn < len(turns) or self._simulates(s.episode.task)
        if more and not cut and not self._gate_passes(s):
            s.done = True
            return
        if s.user_turn < len(turns):
            unlocks = s.episode.task.tool_unlocks
            s.unlocked.update(unlocks[s.user_turn] if s.user_turn < len(unlocks) else ())
            s.user_turn += 1
            self._deliver_user(s, closing + [dict(m) for m in turns[s.user_turn - 1]])
        elif self._simulates(s.episode.task):
            if closing:  # the cut turn is closed now, so the user sees a finished conversation
                s.transcript.extend(closing)
                s.episode.messages.extend(closing)
            s.awaiting_user = True
        else:
            s.done = True

    def _gate_passes(self, s: _Live) -> bool:
        """The turn gate lets the conversation go on (no gate: always); a gate that raises fails the episode."""
        if self.turn_gate is None:
            return True
        try:
            if self.turn_gate(s.episode):
                return True
        except Exception as exc:  # noqa: BLE001 - a broken judge fails this episode only, never the rollout
            s.episode.stats.fail(f"turn gate: {error_text(exc)}")
            return False
        s.episode.stats.gate_stop = True
        return False

    def _user_turns_spent(self, s: _Live) -> bool:
        limit = self.config.max_user_turns
        return 0 < limit <= s.episode.stats.user_turns

    def _deliver_user(self, s: _Live, messages: list[dict[str, Any]]) -> None:
        """Append a user turn to the transcript, the messages and the act stream (built here if the user opened)."""
        s.turn_steps = 0
        s.episode.stats.user_turns += 1
        s.transcript.extend(messages)
        s.episode.messages.extend(messages)
        if s.stream is None:
            s.stream = context_stream(self.tokenizer, s.transcript, s.episode.task.visible_tools())
        else:
            self._append(s, Role.USER)
        if self.config.check_render:
            self.check_render(s)

    def _simulates(self, task: Task) -> bool:
        return self.user is not None and task.user is not None
