"""The multi-turn episode state machine, batched over episodes and roles.

Each micro-step does at most two batched generations: one for every episode waiting on the act role, then one
(inside the world) for every tool call waiting on a response. An episode alternates ACT -> WORLD -> ACT ... until the
act role answers in plain text or a budget ends it. Malformed model output never raises: it is counted in
``EpisodeStats`` and answered with a structured error tool message (or ends the episode, if so configured).

Faults are isolated per episode: a world whose ``open`` raises (the environment's constructor), a reply that carries a
``failure`` (a toolbox that raised, an environment left unusable by a timed-out call), or a ``respond`` that raises
(every episode of that batch) fails the episode (``EpisodeStats.fail``) and ends it; the other episodes go on.

The rollout's settings are ``RolloutConfig`` (``envace.rollout.config``). ``EpisodeRunner`` keeps the turn loop; its
user-turn steps (``envace.rollout.user_turns``) and its limit and accounting steps (``envace.rollout.limits``) are
mixins, and the state of one running episode is ``_Live`` (``envace.rollout.state``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from envace.engines.base import ContinuousEngine, Engine, Generation, SamplingParams, sessions
from envace.engines.stream import RenderDiverged, TokenStream, append_messages, context_stream
from envace.policy.chat import TemplateError, decode
from envace.roles.parsing import CallError
from envace.rollout.config import RolloutConfig
from envace.rollout.limits import EpisodeLimits
from envace.rollout.rules import LoopRules
from envace.rollout.state import _Live
from envace.rollout.user_turns import UserTurns
from envace.types import Episode, Role, Sample, Task, ToolCall, error_text
from envace.worlds.base import ToolReply, ToolRequest, World, failed_reply
from envace.worlds.users import UserSimulator


@dataclass
class _Staged:
    """An episode's calls in flight with a staged world: their requests, rehearse prompts, and generations so far."""

    requests: list[ToolRequest]
    prompts: list[TokenStream]
    generations: dict[int, Generation]


class EpisodeRunner(UserTurns, EpisodeLimits):
    """Runs episodes of tasks with an act engine and a world.

    Args:
        tokenizer: the policy's tokenizer (its chat template renders every prompt).
        config: budgets and sampling.
        rules: how act turns are read and when a benchmark's own loop ends an episode (``envace.rollout.rules``;
            default: envace's parser, no extra ending).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: RolloutConfig,
                 rules: LoopRules | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.rules = rules or LoopRules()
        self._prompts: dict[int, TokenStream] = {}  # within a run: a group's G episodes share one first prompt
        self.turn_gate: Callable[[Episode], bool] | None = None

    def run(
        self,
        tasks: list[Task],
        group_indices: list[int],
        engine: Engine,
        world: World,
        world_engine: Engine | None = None,
        any_active: Callable[[bool], bool] | None = None,
        user: UserSimulator | None = None,
        turn_gate: Callable[[Episode], bool] | None = None,
    ) -> list[Episode]:
        """Run one episode per task until all are done.

        Args:
            tasks: one entry per episode (a task repeated G times gives a group of G).
            group_indices: GRPO group of each episode.
            engine: generates the act role.
            world: answers tool calls.
            world_engine: generates the rehearse role (default: ``engine``; differs with per-role adapters).
            any_active: cross-rank reduction of "some episode is still running" for sharded models: every rank then
                runs the same number of micro-steps and joins each batched generation, with a one-token dummy
                prompt when it has nothing to generate. None on a single process.
            user: writes the user's turns after the scripted ones of tasks with ``Task.user`` (``envace.worlds.users``);
            it
                generates with its own model, never the policy's engine.
            turn_gate: called when the act role has answered a user turn and another would follow; False ends the
                episode there (``gate_stop``), as the EnvACE authors end a conversation whose required checklist
                standard was unmet (``ChecklistReward.continue_after_turn``). A gate that raises fails the episode.

        Raises:
            ValueError: a task whose messages end with an assistant message (the user opens) without a simulator.
        """
        self.user = user
        self.turn_gate = turn_gate
        self._prompts = {}
        live = [self._start(i, t, g, world) for i, (t, g) in enumerate(zip(tasks, group_indices))]
        self._prompts = {}
        lockstep = any_active is not None
        reduce = any_active or (lambda active: active)
        with sessions(engine, world_engine):  # a caching engine reuses each turn's prefix within this rollout
            if not lockstep and self._schedules_per_episode(engine, world_engine):
                self._run_continuous(live, engine, world, world_engine or engine)
            while reduce(any(not s.done for s in live)):
                self._user_step([s for s in live if s.awaiting_user and not s.done])
                self._apply_rules(live)
                self._act_step([s for s in live if not s.done], engine, lockstep)
                self._apply_rules(live)
                self._world_step([s for s in live if s.pending], world, world_engine or engine, lockstep)
                self._apply_rules(live)
        return [self._finish(s) for s in live]

    # -- per-episode scheduling -------------------------------------------------------------------------------------

    continuous_capable = True  # a runner whose act turns need more than one generation (private rehearsal) says no

    def _schedules_per_episode(self, engine: Engine, world_engine: Engine | None) -> bool:
        """``rollout.continuous`` on an engine that takes requests one at a time, both roles on one request queue."""
        queue = getattr(engine, "queue", None)
        shared = world_engine is None or getattr(world_engine, "queue", None) is queue
        return self.config.continuous and self.continuous_capable and queue is not None and shared

    def _run_continuous(self, live: list[_Live], engine: ContinuousEngine, world: World,
                        world_engine: ContinuousEngine) -> None:
        """Run every episode to its end, each generation submitted as soon as its episode is ready for it.

        An episode is idle (its next step can be taken) or in flight (waiting for its act turn or for the rehearsed
        responses of its calls). Each pass takes every idle episode's next step (the user's turn, the rules, an act
        submission, its tool calls), then waits for the engine to finish at least one request and hands each
        finished generation to its episode. A world that generates with the policy's engine in stages (a
        ``RehearseWorld``: ``prompts`` then ``replies``) submits each call's prompt; any other world answers in one
        ``respond`` while the engine's other requests keep running (``VLLMEngine.generate`` steps them all).
        """
        flight: dict[int, tuple[_Live, int | None]] = {}  # ticket -> its episode, and its call's index (act: None)
        staged: dict[int, _Staged] = {}  # id(episode) -> its calls' rehearse prompts and generations so far
        staging = _generates_with_policy(world) and callable(getattr(world, "replies", None))
        while any(not s.done for s in live):
            busy = {id(f[0]) for f in flight.values()}
            idle = [s for s in live if not s.done and id(s) not in busy]
            self._user_step([s for s in idle if s.awaiting_user])
            self._apply_rules(idle)
            for s in self._ready_to_act([s for s in idle if not s.done and not s.pending]):
                flight[engine.submit(s.stream.ids, self.config.act_params())] = (s, None)
            due = [s for s in idle if not s.done and s.pending]
            if staging:
                for s in due:
                    self._stage_world(s, world, world_engine, flight, staged)
            else:
                self._world_step(due, world, world_engine, lockstep=False)
            self._apply_rules(due)
            if not flight:
                continue
            for ticket, gen in engine.wait():
                s, call = flight.pop(ticket)
                if call is None:
                    self._take_act_turn(s, gen)
                    self._apply_rules([s])
                    continue
                stage = staged[id(s)]
                stage.generations[call] = gen
                if len(stage.generations) == len(stage.requests):
                    del staged[id(s)]
                    self._take_replies(s, self._staged_replies(world, stage))
                    self._apply_rules([s])

    def _stage_world(self, s: _Live, world: Any, engine: ContinuousEngine,
                     flight: dict[int, tuple[_Live, int | None]], staged: dict[int, _Staged]) -> None:
        """Submit the rehearse prompt of each of the episode's calls (an episode with none is answered at once)."""
        requests = [r for r in s.pending if isinstance(r, ToolRequest)]
        try:
            prompts = world.prompts(requests) if requests else []
        except Exception as exc:  # noqa: BLE001 - fails this episode only
            self._take_replies(s, [failed_reply(f"{type(world).__name__}.prompts", exc, source="world")
                                   for _ in requests])
            return
        if not requests:
            self._take_replies(s, [])
            return
        staged[id(s)] = _Staged(requests, prompts, {})
        params = self.config.rehearse_params()
        for index, prompt in enumerate(prompts):
            flight[engine.submit(prompt.ids, params)] = (s, index)

    def _staged_replies(self, world: Any, stage: _Staged) -> list[ToolReply]:
        generations = [stage.generations[i] for i in range(len(stage.requests))]
        try:
            return world.replies(stage.requests, stage.prompts, generations)
        except Exception as exc:  # noqa: BLE001 - fails this episode only
            return [failed_reply(f"{type(world).__name__}.replies", exc, source="world") for _ in stage.requests]

    # -- episode lifecycle ------------------------------------------------------------------------------------------

    def _start(self, index: int, task: Task, group: int, world: World) -> _Live:
        messages = [dict(m) for m in task.messages]
        opens = messages[-1]["role"] == "assistant"  # a greeting: the simulated user writes the first message
        if opens and not self._simulates(task):
            raise ValueError(f"task '{task.id}': its messages end with an assistant message, so the user opens the "
                             "conversation; that needs Task.user and a user simulator (EpisodeRunner.run(user=...))")
        stream = None if opens else self._first_prompt(task, messages)
        act = Sample([], [], [], Role.ACT, episode_index=index, group_index=group)
        episode = Episode(task=task, group_index=group, messages=[dict(m) for m in messages], act=act)
        episode.stats.user_turns = 0 if opens else 1
        try:
            handle = world.open(task)
        except Exception as exc:  # noqa: BLE001 - fails this episode only
            episode.stats.fail(f"{type(world).__name__}.open: {error_text(exc)}")
            return _Live(episode, stream, messages, None, done=True)
        return _Live(episode, stream, messages, handle, awaiting_user=opens)

    def _first_prompt(self, task: Task, messages: list[dict[str, Any]]) -> TokenStream:
        """The task's rendered first prompt: rendered once per task object in a run, copied for each episode."""
        rendered = self._prompts.get(id(task))
        if rendered is None:
            rendered = self._prompts[id(task)] = context_stream(self.tokenizer, messages, task.visible_tools())
        return TokenStream(list(rendered.ids), list(rendered.roles), list(rendered.mask), rendered.text)

    def _finish(self, s: _Live) -> Episode:
        stream = s.stream or TokenStream()
        act = s.episode.act
        act.token_ids, act.role_ids, act.loss_mask = stream.ids, stream.roles, stream.mask
        act.engine_logps = _known(stream.engine_logps)
        s.episode.earlier_act = [Sample(r.ids, r.roles, r.mask, Role.ACT, act.episode_index, act.group_index,
                                        engine_logps=_known(r.engine_logps)) for r in s.closed]
        for number, (row, generations) in enumerate(zip(s.episode.act_rows(), s.generated)):
            check_trained_tokens(row, generations, f"episode {act.episode_index} (task '{s.episode.task.id}'), "
                                 f"act row {number}")
        return s.episode

    # -- act role ---------------------------------------------------------------------------------------------------

    def _act_step(self, states: list[_Live], engine: Engine, lockstep: bool) -> None:
        states = self._ready_to_act(states)
        if not states:
            if lockstep:
                self._dummy_generate(engine)
            return
        for s, gen in zip(states, self._generate_act(states, engine)):
            self._take_act_turn(s, gen)

    def _generate_act(self, states: list[_Live], engine: Engine) -> list[Generation]:
        """The act turn of every ready episode, in one batched generation (a rehearsing runner rehearses first)."""
        return engine.generate([s.stream.ids for s in states], self.config.act_params())

    def _take_act_turn(self, s: _Live, gen: Generation) -> None:
        stats = s.episode.stats
        stats.act_turns += 1
        s.turn_steps += 1
        stats.act_truncated += int(not gen.finished)
        body = gen.token_ids[:-1] if gen.finished else gen.token_ids
        raw = decode(self.tokenizer, body)
        text = decode(self.tokenizer, gen.token_ids)
        s.stream.extend(gen.token_ids, Role.ACT, text, trained=True, logps=gen.logprobs)
        s.generated[-1].append(list(gen.token_ids))
        s.transcript.append({"role": "assistant", "content": raw})
        s.episode.act_outputs.append((s.user_turn, raw))
        turn = self.rules.parse(raw)
        stats.act_parse_errors += int(turn.malformed)
        history = list(s.episode.messages)
        items = [self._check(c, s) for c in turn.calls]
        valid = [c for c in items if isinstance(c, ToolCall)]
        s.episode.messages.append(_assistant_message(turn.content, turn.reasoning, valid))
        if not items:
            s.episode.final_answer = turn.content.strip()
            self._next_user_turn(s)
        elif len(s.episode.calls) + len(valid) > self.config.max_tool_calls:
            stats.call_limit = True
            s.done = True
        elif len(valid) < len(items) and self.config.on_call_error == "end":
            stats.ended_by_error = True
            self._deliver(s, [(e, e) for e in items if isinstance(e, CallError)])
            s.done = True
        else:
            s.episode.calls.extend(valid)
            if valid:
                s.episode.call_steps.append((s.user_turn, list(valid)))
            s.pending = [self._request(c, s, history, turn.reasoning) if isinstance(c, ToolCall) else c for c in items]

    def _request(self, call: ToolCall, s: _Live, history: list[dict[str, Any]], reasoning: str) -> ToolRequest:
        ep = s.episode
        return ToolRequest(ep.task, call, history, s.handle, ep.act.episode_index, ep.group_index, reasoning)

    # -- world ------------------------------------------------------------------------------------------------------

    def _world_step(self, states: list[_Live], world: World, engine: Engine, lockstep: bool) -> None:
        requests = [r for s in states for r in s.pending if isinstance(r, ToolRequest)]
        if not requests:
            if lockstep and _generates_with_policy(world):
                self._dummy_generate(engine)
            replies: list[ToolReply] = []
        else:
            try:
                replies = world.respond(requests, engine, self.config.rehearse_params())
            except Exception as exc:  # noqa: BLE001 - fails the episodes of this batch only
                replies = [failed_reply(f"{type(world).__name__}.respond", exc, source="world") for _ in requests]
        answers = iter(replies)
        for s in states:
            self._take_replies(s, [next(answers) for r in s.pending if isinstance(r, ToolRequest)])

    def _take_replies(self, s: _Live, replies: list[ToolReply]) -> None:
        """Record the world's replies to the episode's calls (in order), deliver them, and decide what comes next."""
        answers = iter(replies)
        pairs = [(r, next(answers) if isinstance(r, ToolRequest) else r) for r in s.pending]
        s.pending = []
        self._record(s, pairs)
        failure = next((r.failure for _, r in pairs if isinstance(r, ToolReply) and r.failure), None)
        if failure is not None:  # the episode cannot go on: nothing is delivered, it ends failed
            s.episode.stats.fail(failure)
            s.done = True
            return
        self._deliver(s, pairs)
        self._after_tools(s, pairs)

    def _deliver(self, s: _Live, pairs: list[tuple[ToolRequest | CallError, ToolReply | CallError]]) -> None:
        """Append one tool message per call, in call order, to the transcript, the messages and the token stream."""
        new = []
        for req, reply in pairs:
            name = req.call.name if isinstance(req, ToolRequest) else "error"
            content = reply.to_content() if isinstance(reply, CallError) else reply.content
            new.append({"role": "tool", "name": name, "content": content})
        s.transcript.extend({"role": "tool", "content": m["content"]} for m in new)
        s.episode.messages.extend(new)
        self._append(s, Role.TOOL)
        if self.config.check_render:
            self.check_render(s)

    def _append(self, s: _Live, role: Role) -> None:
        """Extend the act row with the template's render of the transcript's new messages (and the next header).

        When the render rewrites text already in the row (``RenderDiverged``), ``on_rerender: new_row`` closes the
        row and opens a new one holding the re-rendered context (untrained); ``error`` raises, naming the row.
        """
        tools = s.episode.task.visible_tools()
        try:
            append_messages(s.stream, self.tokenizer, s.transcript, tools, role)
        except RenderDiverged as err:
            where = (f"episode {s.episode.act.episode_index} (task '{s.episode.task.id}'), act row {len(s.closed)}, "
                     f"adding a {s.transcript[-1]['role']} message")
            if self.config.on_rerender == "error":
                raise TemplateError(f"{where}: {err}; set rollout.on_rerender: new_row to train such a template "
                                    "with one row per rewrite") from err
            s.closed.append(s.stream)
            s.generated.append([])
            s.stream = context_stream(self.tokenizer, s.transcript, tools)
            s.episode.stats.rerenders += 1

    def _dummy_generate(self, engine: Engine) -> None:
        engine.generate([[self.tokenizer.eos_token_id]], SamplingParams(max_new_tokens=1))

    def check_render(self, s: _Live) -> None:
        """Debug check: the act stream decodes to the template's render of the transcript."""
        from envace.policy.chat import render

        assert s.stream is not None
        expected = render(self.tokenizer, s.transcript, s.episode.task.visible_tools(), add_generation_prompt=True)
        decoded = decode(self.tokenizer, s.stream.ids)
        if decoded != expected or s.stream.text != expected:
            raise AssertionError(f"token stream of episode {s.episode.act.episode_index} diverged from the render")


def check_trained_tokens(row: Sample, generations: list[list[int]], where: str) -> None:
    """Token-in/token-out: the row's trained tokens are exactly its generations' ids, each one contiguous, in order.

    Raises:
        AssertionError: naming ``where`` and how the row differs (a trained token that was not generated is a
            re-tokenised or edited generation, which would train the policy on ids it never sampled).
    """
    spans, current = [], []
    for token, trained in zip(row.token_ids, row.loss_mask):
        if trained:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    expected = [g for g in generations if g]
    if len(spans) != len(expected):
        raise AssertionError(f"{where}: {len(spans)} trained spans for {len(expected)} generations")
    for k, (span, gen) in enumerate(zip(spans, expected)):
        if span != gen:
            raise AssertionError(f"{where}: trained span {k} differs from the ids the policy generated "
                                 f"({len(span)} tokens against {len(gen)}): a re-tokenised generation")


def _generates_with_policy(world: World) -> bool:
    """The world answers through the policy's engine, so an idle rank must join with a dummy generation.

    A real world never generates and a frozen simulator generates with its own engine: ranks that answer calls then
    make no policy generation in the world step, so an idle rank must not make one either.
    """
    return bool(getattr(world, "generates_with_policy", False))


def _assistant_message(content: str, reasoning: str, calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def _known(logps: list[float]) -> list[float] | None:
    """A row's engine log-probs, or None when its engine reported none."""
    return list(logps) if any(not math.isnan(x) for x in logps) else None
