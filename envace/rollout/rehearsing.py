"""The rehearsing runner: ``EpisodeRunner`` with private rehearsal before committed act turns.

See ``envace.rollout.private_rehearsal`` for the procedure. Imagined attempts are forks of an episode's live state (its
token
stream, transcript and messages) whose calls are answered by the policy's rehearse role (a ``RehearseWorld``):
the real environment is never called for them. The committed turn is generated from the real token stream with the
memory message spliced in before the generation prompt (the stream's own ids are kept, never re-tokenised), or is
the first turn of an attempt a selector picked; either way the committed ids are appended to the real stream, which
never holds the memory.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from envace.engines.base import Engine, Generation, SamplingParams
from envace.engines.stream import TokenStream, context_stream
from envace.policy.chat import decode, encode, render
from envace.roles.parsing import CallError
from envace.rollout.config import RolloutConfig
from envace.rollout.private_rehearsal import (
    Attempt,
    JudgedCommit,
    MemoryCommit,
    PrivateRehearsal,
    Selector,
    attempt_of,
    check_selector,
)
from envace.rollout.private_rehearsal import memory_text as format_memory
from envace.rollout.rules import LoopRules
from envace.rollout.runner import EpisodeRunner
from envace.rollout.state import _Live
from envace.types import Episode, Role, Task
from envace.worlds.base import World
from envace.worlds.rehearse import RehearseWorld
from envace.worlds.users import UserSimulator

JUDGE_PROMPT = (
    "You review an attempt an assistant imagined before acting. The tool responses in it were predicted, not "
    "observed. Answer with one word: yes if the attempt accomplishes the user's latest request, no otherwise."
)


class RehearsingRunner(EpisodeRunner):
    """Runs episodes whose committed act turns are preceded by private rehearsal (lock-step micro-steps only).

    Args:
        tokenizer: the policy's tokenizer.
        config: budgets and sampling of the committed episode.
        rehearsal: the rehearsal budget and mode.
        prompter: renders the rehearse role's prompts (the policy's own rehearse world, bound to ``tokenizer``).
        selector: what to commit after a rehearsal (default: generate with the memory).
        rules: the benchmark's loop rules (``envace.rollout.rules``); imagined attempts are read with them too.
    """

    continuous_capable = False  # a committed turn first needs its rehearsal's generations

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: RolloutConfig, rehearsal: PrivateRehearsal,
                 prompter: RehearseWorld, selector: Selector | None = None, rules: LoopRules | None = None) -> None:
        super().__init__(tokenizer, config, rules)
        check_selector(selector, rehearsal)
        self.rehearsal = rehearsal
        self.prompter = prompter
        self.selector = selector or MemoryCommit()
        self.rehearse_engine: Engine | None = None
        self.rerendered = 0  # memory prompts that had to re-render the stream (no token boundary before its header)

    def run(self, tasks: list[Task], group_indices: list[int], engine: Engine, world: World,
            world_engine: Engine | None = None, any_active: Any = None, user: UserSimulator | None = None
            ) -> list[Episode]:
        """``EpisodeRunner.run`` with private rehearsal (single process or replicated ranks: no lockstep).

        Raises:
            ValueError: a cross-rank lockstep (``any_active``): sharded models cannot rehearse privately yet.
        """
        if any_active is not None and self.rehearsal.rehearsals > 0:
            raise ValueError("private rehearsal runs without cross-rank lockstep: evaluate a sharded (FSDP) model on "
                             "one process, or export it and evaluate the export")
        self.rehearse_engine = world_engine or engine
        return super().run(tasks, group_indices, engine, world, world_engine, any_active, user)

    # -- the committed turn -----------------------------------------------------------------------------------------

    def _generate_act(self, states: list[_Live], engine: Engine) -> list[Generation]:
        """Rehearse for the episodes due, then generate (or take) every committed turn in one batch."""
        due = [s for s in states if self._due(s)]
        attempts = self._rehearse(due, engine) if due else {}
        out: dict[int, Generation] = {}
        prompts: dict[int, list[int]] = {}
        for s in states:
            tried = attempts.get(id(s))
            chosen = self.selector.select(tried) if tried else None
            if tried:
                index = next((i for i, a in enumerate(tried) if a is chosen), None)
                s.episode.private_attempts.append((s.episode.stats.act_turns, [a.record() for a in tried], index))
            if chosen is not None:
                out[id(s)] = Generation(list(chosen.first_turn), chosen.first_finished)
                s.episode.stats.private_commits += 1
            elif tried:
                memory = format_memory(tried, self.rehearsal.max_response_chars)
                s.episode.private_memory.append((s.episode.stats.act_turns, memory))
                prompts[id(s)] = self._memory_stream(s, memory).ids
            else:
                prompts[id(s)] = s.stream.ids
        waiting = [s for s in states if id(s) in prompts]
        if waiting:
            generations = engine.generate([prompts[id(s)] for s in waiting], self.config.act_params())
            out.update({id(s): g for s, g in zip(waiting, generations)})
        return [out[id(s)] for s in states]

    def _due(self, s: _Live) -> bool:
        budget = self.rehearsal
        if budget.rehearsals == 0 or (budget.granularity == "task" and s.episode.stats.act_turns > 0):
            return False
        return budget.max_tokens is None or s.episode.stats.private_tokens < budget.max_tokens

    # -- imagined attempts ------------------------------------------------------------------------------------------

    def _rehearse(self, due: list[_Live], engine: Engine) -> dict[int, list[Attempt]]:
        """``rehearsals`` attempts per due episode: all at once (parallel) or one round at a time (sequential)."""
        attempts: dict[int, list[Attempt]] = {id(s): [] for s in due}
        rounds = 1 if self.rehearsal.mode == "parallel" else self.rehearsal.rehearsals
        per_round = self.rehearsal.rehearsals if self.rehearsal.mode == "parallel" else 1
        for round_ in range(rounds):
            forks = [(s, self._fork(s, attempts[id(s)])) for s in due for _ in range(per_round)]
            first_round = self.rehearsal.greedy_first and round_ == 0  # each rehearsal's first attempt is greedy
            greedy = {id(f) for _, f in forks[::per_round]} if first_round else set()
            for s, attempt in zip([s for s, _ in forks], self._play([f for _, f in forks], engine, greedy)):
                attempts[id(s)].append(attempt)
                s.episode.stats.private_rehearsals += 1
                s.episode.stats.private_tokens += attempt.tokens
        if isinstance(self.selector, JudgedCommit):
            self._judge(due, attempts, engine)
        return attempts

    def _fork(self, s: _Live, earlier: list[Attempt]) -> _Live:
        """A copy of the episode's live state whose calls the rehearse role answers (with the earlier memory)."""
        branch = _Live(_fork_episode(s.episode), _fork_stream(s.stream), list(s.transcript),
                       self.prompter.open(s.episode.task), user_turn=s.user_turn, turn_steps=s.turn_steps,
                       unlocked=set(s.unlocked))
        if earlier:  # sequential: this attempt sees the memory of the earlier ones
            text = format_memory(earlier, self.rehearsal.max_response_chars)
            branch.stream = self._memory_stream(s, text)
            branch.transcript = branch.transcript + [self._memory_message(text)]
        return branch

    def _play(self, branches: list[_Live], engine: Engine, greedy: set[int] | None = None) -> list[Attempt]:
        """Play every branch in the rehearsed world for at most ``horizon`` act turns; read each as an attempt.

        The branches in ``greedy`` (by ``id``) act at temperature 0, the others at the rehearsal's temperature.
        """
        assert self.rehearse_engine is not None
        greedy = greedy or set()
        sampled = replace(self.config.act_params(), temperature=self.rehearsal.temperature)
        plain = replace(sampled, temperature=0.0)
        starts = [(len(b.episode.messages), b.episode.stats.real_calls, len(b.episode.rehearsals)) for b in branches]
        first: dict[int, Generation] = {}
        malformed: dict[int, bool] = {}
        tokens = {id(b): 0 for b in branches}
        answered: set[int] = set()
        for _ in range(self.rehearsal.horizon or self.config.max_turns):
            active = [b for b in branches if not b.done and not b.awaiting_user and id(b) not in answered]
            if not active:
                break
            for b, gen in zip(active, self._generate_split(active, engine, sampled, plain, greedy)):
                first.setdefault(id(b), gen)
                tokens[id(b)] += len(gen.token_ids)
                before = _refusals(b)
                self._take_act_turn(b, gen)
                if id(b) not in malformed:  # its first turn: broken, or holding a call the rollout refused
                    malformed[id(b)] = _refusals(b) != before or any(isinstance(p, CallError) for p in b.pending)
                if not b.pending:
                    answered.add(id(b))
            pending = [b for b in active if b.pending]
            if pending:
                self._world_step(pending, self.prompter, self.rehearse_engine, False)
        attempts = [self._attempt(b, start, first[id(b)], tokens[id(b)]) for b, start in zip(branches, starts)]
        for b, attempt in zip(branches, attempts):
            attempt.greedy, attempt.first_malformed = id(b) in greedy, malformed.get(id(b), False)
        return attempts

    @staticmethod
    def _generate_split(active: list[_Live], engine: Engine, sampled: SamplingParams, plain: SamplingParams,
                        greedy: set[int]) -> list[Generation]:
        """One act turn of every active branch: the greedy ones in one batch, the sampled ones in another."""
        out: dict[int, Generation] = {}
        for params, group in ((plain, [b for b in active if id(b) in greedy]),
                              (sampled, [b for b in active if id(b) not in greedy])):
            if group:
                out.update(zip(map(id, group), engine.generate([b.stream.ids for b in group], params)))
        return [out[id(b)] for b in active]

    def _attempt(self, branch: _Live, start: tuple[int, int, int], first: Generation, tokens: int) -> Attempt:
        messages, real_calls, rehearsals = start
        if branch.episode.stats.real_calls != real_calls:  # the rehearse world never executes: a broken invariant
            raise AssertionError("a private rehearsal made a real call")
        rehearsed = branch.episode.rehearsals[rehearsals:]
        tokens += sum(sum(r.sample.loss_mask) for r in rehearsed if r.sample is not None)
        attempt = attempt_of(branch.episode, messages, first.token_ids, tokens)
        attempt.first_finished = first.finished
        return attempt

    # -- judging (JudgedCommit) -------------------------------------------------------------------------------------

    def _judge(self, due: list[_Live], attempts: dict[int, list[Attempt]], engine: Engine) -> None:
        """The policy's own verdict on each attempt (greedy yes/no); its tokens count against the budget."""
        pairs = [(s, a) for s in due for a in attempts[id(s)]]
        prompts = [self._judge_prompt(s, a) for s, a in pairs]
        generations = engine.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
        for (s, attempt), gen in zip(pairs, generations):
            attempt.verdict = decode(self.tokenizer, gen.token_ids).strip().lower().startswith("yes")
            s.episode.stats.private_tokens += len(gen.token_ids)

    def _judge_prompt(self, s: _Live, attempt: Attempt) -> list[int]:
        request = next((m["content"] for m in reversed(s.episode.messages) if m["role"] == "user"), "")
        summary = format_memory([attempt], self.rehearsal.max_response_chars).splitlines()[-1]
        chat = [{"role": "system", "content": JUDGE_PROMPT},
                {"role": "user", "content": f"The user's request: {request}\n{summary}\nAccomplished?"}]
        return encode(self.tokenizer, render(self.tokenizer, chat, None, add_generation_prompt=True))

    # -- the memory in a prompt -------------------------------------------------------------------------------------

    def _memory_message(self, text: str) -> dict[str, Any]:
        return {"role": self.rehearsal.memory_role, "content": text}

    def _memory_stream(self, s: _Live, text: str) -> TokenStream:
        """The episode's stream with the memory message before its generation prompt, the stream's ids kept."""
        tools = s.episode.task.visible_tools()
        closed = render(self.tokenizer, s.transcript, tools, add_generation_prompt=False)
        full = render(self.tokenizer, s.transcript + [self._memory_message(text)], tools, add_generation_prompt=True)
        cut = _header_tokens(self.tokenizer, s.stream, closed)
        if cut is None or not full.startswith(closed):
            self.rerendered += 1
            return context_stream(self.tokenizer, s.transcript + [self._memory_message(text)], tools)
        keep = len(s.stream) - cut
        stream = TokenStream(s.stream.ids[:keep], s.stream.roles[:keep], s.stream.mask[:keep], closed,
                             s.stream.engine_logps[:keep])
        stream.extend(encode(self.tokenizer, full[len(closed):]), Role.SYSTEM, full[len(closed):])
        return stream


def make_runner(tokenizer: PreTrainedTokenizerBase, config: RolloutConfig, rehearsal: PrivateRehearsal | None = None,
                selector: Selector | None = None, rules: LoopRules | None = None) -> EpisodeRunner:
    """A plain runner, or with a rehearsal budget a rehearsing one whose attempts use the packaged rehearse prompt.

    ``rules``: a benchmark's loop rules (``envace.rollout.rules.LoopRules``; default: envace's own).
    """
    if rehearsal is None or rehearsal.rehearsals == 0:
        return EpisodeRunner(tokenizer, config, rules)
    prompter = RehearseWorld()
    prompter.bind(tokenizer, model=None)
    return RehearsingRunner(tokenizer, config, rehearsal, prompter, selector, rules)


def _refusals(s: _Live) -> tuple[int, int, int, bool]:
    """What an act turn that the rollout refuses changes: malformed turns, unknown tools, invalid arguments, an end."""
    stats = s.episode.stats
    return stats.act_parse_errors, stats.unknown_tools, stats.invalid_arguments, stats.ended_by_error


def _fork_episode(episode: Episode) -> Episode:
    """A copy the attempt can grow: its own lists and counters (messages are only ever appended, never edited)."""
    return replace(episode, messages=list(episode.messages), act=copy.copy(episode.act),
                   earlier_act=list(episode.earlier_act),
                   rehearsals=list(episode.rehearsals), calls=list(episode.calls),
                   call_steps=list(episode.call_steps), private_memory=list(episode.private_memory),
                   private_attempts=list(episode.private_attempts),
                   act_outputs=list(episode.act_outputs),
                   stats=replace(episode.stats))


def _fork_stream(stream: TokenStream | None) -> TokenStream:
    assert stream is not None, "an episode waiting for its user's first message has nothing to rehearse from"
    return TokenStream(list(stream.ids), list(stream.roles), list(stream.mask), stream.text,
                       list(stream.engine_logps))


def _header_tokens(tokenizer: PreTrainedTokenizerBase, stream: TokenStream, closed: str) -> int | None:
    """How many trailing ids of ``stream`` are its generation prompt (the text after ``closed``), if on a boundary."""
    if not stream.text.startswith(closed):
        return None
    header = stream.text[len(closed):]
    for count in range(0, min(len(stream), 64) + 1):
        tail = stream.ids[len(stream) - count:] if count else []
        if decode(tokenizer, tail) == header:
            return count
    return None
