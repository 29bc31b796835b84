"""Hybrid worlds: each turn's calls answered by the real environment, the response cache or rehearsal, by schedule.

A ``MixSchedule`` gives the probabilities of the three backends at every optimiser step (a linear curriculum from
``start`` to ``end``, e.g. from real to rehearsed). Each act turn (or each episode, with ``granularity="episode"``)
draws one backend, reproducibly from ``(seed, step, episode, turn)``:

- ``real``: the task's real environment executes the call. Its state must reflect every call of the episode, so the
  calls it has not seen yet (answered by the cache or by rehearsal) are replayed on it first; those executions are
  real calls spent too. Every real answer is recorded in the cache.
- ``cache``: the recorded real response of the call in this state (``ResponseCache``); a miss goes to ``on_miss``.
- ``rehearse``: the rehearse backend writes the response (the trained policy, or a frozen simulator).

Live fidelity probes: whenever a call is answered by the real environment or the cache, the policy's rehearse role
also answers it (in the same batched generation as the rehearsed calls, never shown to the act role), and the two
are scored (``envace.roles.compare.ProbeScore``). The real answer also travels with the reply as a grounding target.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn
from transformers import PreTrainedTokenizerBase

from envace.engines.base import Engine, SamplingParams
from envace.envs.real import DEFAULT_TOOL_TIMEOUT_S, RealEnvironment
from envace.roles.compare import score_reply
from envace.types import Task, ToolCall
from envace.worlds.base import ToolReply, ToolRequest, failed_reply
from envace.worlds.cache import ResponseCache
from envace.worlds.rehearse import RehearseWorld, alignment_prompter

Source = Literal["real", "cache", "rehearse"]
SOURCES: tuple[Source, ...] = ("real", "cache", "rehearse")


@dataclass(frozen=True)
class Mix:
    """Relative weights of the backends answering a turn (normalised to probabilities).

    Attributes:
        real: weight of the real environment.
        cache: weight of the response cache.
        rehearse: weight of rehearsal.
    """

    real: float = 0.0
    cache: float = 0.0
    rehearse: float = 1.0

    def __post_init__(self) -> None:
        for name in SOURCES:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"mix.{name} must be a finite number >= 0, got {value!r}")
        if self.real + self.cache + self.rehearse <= 0:
            raise ValueError("mix: real, cache and rehearse are all 0; at least one must be positive")

    def probabilities(self) -> dict[Source, float]:
        """The normalised weights, keyed by backend."""
        total = self.real + self.cache + self.rehearse
        return {name: getattr(self, name) / total for name in SOURCES}

    def toward(self, other: Mix, t: float) -> Mix:
        """The probabilities ``(1 - t) * self + t * other``."""
        a, b = self.probabilities(), other.probabilities()
        return Mix(**{name: (1 - t) * a[name] + t * b[name] for name in SOURCES})

    def grounded(self, boost: float) -> Mix:
        """Move up to ``boost`` of the rehearse probability to real and cache.

        It is shared in their ratio, or all goes to real when both are 0.
        """
        p = self.probabilities()
        moved = min(max(boost, 0.0), p["rehearse"])
        if moved == 0:
            return Mix(**p)
        grounded = p["real"] + p["cache"]
        real_part = p["real"] / grounded if grounded > 0 else 1.0
        return Mix(p["real"] + moved * real_part, p["cache"] + moved * (1 - real_part), p["rehearse"] - moved)


@dataclass(frozen=True)
class MixSchedule:
    """The backend mix at each optimiser step.

    ``start`` for ``warmup`` steps, then linearly to ``end`` over ``steps`` steps, then ``end``.

    Attributes:
        start: the mix at step 0.
        end: the mix once the ramp is over (the whole run with ``steps=0`` and ``warmup=0``).
        steps: length of the linear ramp (0: jump to ``end`` after the warm-up).
        warmup: steps at ``start`` before the ramp.
    """

    start: Mix = field(default_factory=Mix)
    end: Mix = field(default_factory=Mix)
    steps: int = 0
    warmup: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "warmup"):
            if getattr(self, name) < 0:
                raise ValueError(f"schedule.{name} must be >= 0, got {getattr(self, name)}")

    def at(self, step: int) -> Mix:
        """The mix at optimiser step ``step``."""
        if step < self.warmup:
            return self.start
        t = 1.0 if self.steps == 0 else min(1.0, (step - self.warmup) / self.steps)
        return self.start.toward(self.end, t)


@dataclass
class _Episode:
    """One episode's view of the backends."""

    task: Task
    serial: int
    calls: list[ToolCall] = field(default_factory=list)  # every call answered so far, in order
    env: RealEnvironment | None = None
    synced: int = 0  # calls[:synced] were executed by ``env``
    turn: int = 0
    source: Source | None = None  # the episode's backend (granularity "episode")


class HybridWorld:
    """Answers each turn with the real environment, the response cache or rehearsal, drawn from a schedule.

    Args:
        schedule: the backend mix over optimiser steps.
        rehearse: the rehearse backend: ``RehearseWorld`` (the trained policy; default) or ``FrozenWorld``.
        cache: the response cache (default: in memory, stateful, seeded from the tasks' references).
        granularity: draw a backend per act ``turn`` or once per ``episode``.
        on_miss: who answers a cache miss: ``rehearse`` or ``real``.
        probe: shadow every real or cached answer with the policy's own rehearsal and score it (live fidelity).
        seed: seed of the backend draws.
        tool_timeout_s: most seconds a real environment's constructor and each real call may take (0: no limit). A
            call past it is answered with a timeout error (never cached) and its episode's environment is unusable:
            the episode fails at its next real answer (``envace.envs.real``).
    """

    generates_with_policy = True  # exactly one policy generation per respond (rehearsals and probes batched)

    def __init__(
        self,
        schedule: MixSchedule = MixSchedule(),  # noqa: B008 (frozen)
        rehearse: RehearseWorld | None = None,
        cache: ResponseCache | None = None,
        granularity: Literal["turn", "episode"] = "turn",
        on_miss: Literal["rehearse", "real"] = "rehearse",
        probe: bool = True,
        seed: int = 0,
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        if not tool_timeout_s >= 0:
            raise ValueError(f"tool_timeout_s must be >= 0 (0: no limit), got {tool_timeout_s}")
        if granularity not in ("turn", "episode"):
            raise ValueError(f"granularity must be 'turn' or 'episode', got {granularity!r}")
        if on_miss not in ("rehearse", "real"):
            raise ValueError(f"on_miss must be 'rehearse' or 'real', got {on_miss!r}")
        self.schedule = schedule
        self.rehearse = rehearse if rehearse is not None else RehearseWorld()
        self.cache = cache if cache is not None else ResponseCache()
        self.granularity = granularity
        self.on_miss = on_miss
        self.probe = probe
        self.seed = seed
        self.tool_timeout_s = tool_timeout_s
        self.prompter = alignment_prompter(self.rehearse)  # the policy's own rehearse role, for the probes
        self.step = 0
        self.boost = 0.0  # rehearse probability moved to real and cache by a collusion guard
        self._serial = 0

    @property
    def rehearses(self) -> bool:
        """Some call may be answered by rehearsal: the schedule gives it weight, or a cache miss goes to it."""
        mixes = (self.schedule.start, self.schedule.end)
        if any(m.rehearse > 0 for m in mixes):
            return True
        return self.on_miss == "rehearse" and any(m.cache > 0 for m in mixes)

    # -- schedule ---------------------------------------------------------------------------------------------------

    @property
    def mix(self) -> Mix:
        """The mix of the current step (the schedule's, grounded by ``boost``)."""
        return self.schedule.at(self.step).grounded(self.boost)

    def begin_rollout(self, step: int) -> None:
        """Set the step the schedule is read at."""
        self.step = step
        self._serial = 0

    def ground(self, amount: float) -> None:
        """Move ``amount`` more of the rehearse probability to real and cache, for the rest of the run."""
        self.boost = min(1.0, self.boost + amount)

    def metrics(self) -> dict[str, float]:
        """The current mix and the cache's size and hit rate."""
        p = self.mix.probabilities()
        lookups = self.cache.hits + self.cache.misses
        return {
            "mix_real": p["real"],
            "mix_cache": p["cache"],
            "mix_rehearse": p["rehearse"],
            "cache_entries": float(len(self.cache)),
            "cache_hit_rate": self.cache.hits / lookups if lookups else 0.0,
        }

    def _draw(self, *key: Any) -> Source:
        rng = random.Random(":".join(str(k) for k in (self.seed, self.step, *key)))
        p = self.mix.probabilities()
        return rng.choices(SOURCES, weights=[p[s] for s in SOURCES])[0]

    # -- world protocol ---------------------------------------------------------------------------------------------

    def bind(self, tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
        """Bind the rehearse backend and the probes' prompter to the policy."""
        self.rehearse.bind(tokenizer, model)
        self.prompter.bind(tokenizer, model)

    def open(self, task: Task) -> _Episode:
        """Start an episode (its real environment is created on its first real answer)."""
        episode = _Episode(task, self._serial)
        self._serial += 1
        if self.granularity == "episode":
            episode.source = self._draw("episode", episode.serial)
        return episode

    def respond(self, requests: list[ToolRequest], engine: Engine, params: SamplingParams) -> list[ToolReply]:
        """Answer each request by its turn's backend; rehearse and probe the rest in one batched generation."""
        replies: list[ToolReply | None] = [None] * len(requests)
        to_rehearse: list[int] = []
        turns: dict[int, Source] = {}
        for i, req in enumerate(requests):
            ep: _Episode = req.handle
            if id(ep) not in turns:
                turns[id(ep)] = ep.source or self._draw("turn", ep.serial, ep.turn)
                ep.turn += 1
            reply = self._answer(ep, req.call, turns[id(ep)])
            if reply is None:
                to_rehearse.append(i)
            else:
                replies[i] = reply
            ep.calls.append(req.call)
        # real or cached answers only: a timeout or a failure has no real response to score the shadow against
        probes = [i for i, r in enumerate(replies) if r is not None and r.real_content is not None and self.probe]
        self._generate(requests, replies, to_rehearse, probes, engine, params)
        return [r for r in replies if r is not None]

    # -- backends ---------------------------------------------------------------------------------------------------

    def _answer(self, ep: _Episode, call: ToolCall, source: Source) -> ToolReply | None:
        """The real or cached reply, or None when rehearsal answers."""
        if source == "cache":
            content = self.cache.get(ep.task, ep.calls, call)
            if content is not None:
                return ToolReply(content=content, ok=True, source="cache", real_content=content)
            source = self.on_miss
        if source == "real":
            return self._execute(ep, call)
        return None

    def _execute(self, ep: _Episode, call: ToolCall) -> ToolReply:
        """Bring the episode's real environment up to date, then execute ``call`` on it.

        A constructor or a toolbox that raises, or an environment left unusable by a timed-out call, fails the
        episode (a failure reply); a timed-out call is answered with its timeout error, which is never cached.
        """
        spec = ep.task.environment
        if spec is None:
            raise ValueError(f"task '{ep.task.id}' has no 'environment'; a hybrid world with a real share needs one")
        spent = 0
        try:
            if ep.env is None:
                ep.env = RealEnvironment(spec, self.tool_timeout_s)
            for index in range(ep.synced, len(ep.calls)):
                spent += 1
                content, _ = ep.env.execute(ep.calls[index])
                if ep.env.unusable is None:
                    self.cache.put(ep.task, ep.calls[:index], ep.calls[index], content)
            spent += 1
            content, _ = ep.env.execute(call)
        except Exception as exc:  # noqa: BLE001 - fails this episode only (the runner ends it)
            return failed_reply(f"environment {spec.class_path} ({call.name})", exc, real_calls=spent)
        ep.synced = len(ep.calls) + 1  # ``call`` is appended to ``ep.calls`` by the caller
        if ep.env.unusable is not None:  # this call timed out
            return ToolReply(content=content, ok=True, source="real", real_calls=spent, timeouts=1)
        self.cache.put(ep.task, ep.calls, call, content)
        return ToolReply(content=content, ok=True, source="real", real_calls=spent, real_content=content)

    def _generate(self, requests: list[ToolRequest], replies: list[ToolReply | None], to_rehearse: list[int],
                  probes: list[int], engine: Engine, params: SamplingParams) -> None:
        """Rehearse ``to_rehearse`` and the shadow ``probes`` (in one policy generation when the policy rehearses)."""
        policy_rehearses = self.rehearse.generates_with_policy
        if policy_rehearses:
            batch = [requests[i] for i in to_rehearse + probes]
            generated = self.rehearse.respond(batch, engine, params)  # one generation, possibly empty (lockstep)
            rehearsed, shadows = generated[: len(to_rehearse)], generated[len(to_rehearse) :]
        else:
            rehearsed = self.rehearse.respond([requests[i] for i in to_rehearse], engine, params)
            shadows = self.prompter.respond([requests[i] for i in probes], engine, params)
        for i, reply in zip(to_rehearse, rehearsed):
            replies[i] = reply
        for i, shadow in zip(probes, shadows):
            answered = replies[i]
            assert answered is not None and answered.real_content is not None
            answered.probe = score_reply(shadow, answered.real_content)


class CacheWorld(HybridWorld):
    """Every call answered from the response cache; a miss is answered by ``on_miss`` (rehearsal by default).

    Args:
        cache: the response cache (default: in memory, stateful, seeded from the tasks' references).
        on_miss: who answers a miss: ``rehearse`` or ``real``.
        rehearse: the rehearse backend for misses (default: the trained policy).
        probe: shadow every cached answer with the policy's rehearsal and score it (live fidelity).
        tool_timeout_s: with ``on_miss: real``, most seconds a real call may take (0: no limit).
    """

    def __init__(
        self,
        cache: ResponseCache | None = None,
        on_miss: Literal["rehearse", "real"] = "rehearse",
        rehearse: RehearseWorld | None = None,
        probe: bool = True,
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        only_cache = Mix(real=0.0, cache=1.0, rehearse=0.0)
        super().__init__(MixSchedule(only_cache, only_cache), rehearse, cache, "turn", on_miss, probe,
                         tool_timeout_s=tool_timeout_s)
