"""Test helpers: a scripted generation engine for driving the rollout state machine without a model.

``ScriptedEngine`` implements ``envace.engines.base.Engine``: it answers every prompt with the next entry of a
predetermined script (in call order, prompts of one call in order), encoded with the policy tokenizer, and records
everything it was asked. Use one engine for the act role and another (passed as ``world_engine``) for the rehearse
role to script the two roles separately.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from envace.engines.base import Generation, SamplingParams
from envace.policy.chat import encode

RELEASE = threading.Event()
"""What a deliberately hung tool waits on in the fault tests; set after every test (tests/conftest.py), so no worker
thread outlives the session."""

BALANCE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_balance",
            "description": "Balance of an account",
            "parameters": {"type": "object", "properties": {"account_id": {"type": "string"}}, "required": []},
        },
    }
]
"""One tool schema for template and tokenizer tests."""


@dataclass(frozen=True)
class ScriptEntry:
    """One scripted generation.

    Attributes:
        text: the generated text (without the stop token).
        finished: True: the eos id is appended and the generation is finished; False: a truncated generation (no
            eos, ``finished=False``), as when ``max_new_tokens`` cuts it.
    """

    text: str
    finished: bool = True


def truncated(text: str) -> ScriptEntry:
    """A script entry cut by the token budget: no eos appended, ``finished=False``."""
    return ScriptEntry(text, finished=False)


def entry_ids(tokenizer: PreTrainedTokenizerBase, entry: str | ScriptEntry) -> list[int]:
    """The token ids a script entry generates: its encoded text, plus the eos id when it is finished."""
    entry = entry if isinstance(entry, ScriptEntry) else ScriptEntry(entry)
    return encode(tokenizer, entry.text) + ([tokenizer.eos_token_id] if entry.finished else [])


class ScriptedEngine:
    """An ``Engine`` that replays a script and records its calls.

    Args:
        tokenizer: the tokenizer that encodes the script (the policy's).
        script: one entry per prompt it will be asked, across all calls, in order; a plain string is a finished
            entry.

    Attributes:
        calls: the prompts of each ``generate`` call, in call order.
        params: the sampling parameters of each call.
        outputs: the generated ids of each call, parallel to ``calls``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, script: list[str | ScriptEntry]) -> None:
        self.tokenizer = tokenizer
        self.script = [e if isinstance(e, ScriptEntry) else ScriptEntry(e) for e in script]
        self.calls: list[list[list[int]]] = []
        self.params: list[SamplingParams] = []
        self.outputs: list[list[list[int]]] = []

    @property
    def call_count(self) -> int:
        """Number of ``generate`` calls so far."""
        return len(self.calls)

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt received, flattened across calls, in order."""
        return [p for call in self.calls for p in call]

    @property
    def generated(self) -> list[list[int]]:
        """Every generation returned, flattened across calls, in order (parallel to ``prompts``)."""
        return [g for call in self.outputs for g in call]

    @property
    def remaining(self) -> int:
        """Script entries not used yet."""
        return len(self.script) - len(self.prompts)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Answer each prompt with the next script entry; see ``Engine.generate``.

        Raises:
            AssertionError: the script has fewer entries left than prompts were given.
        """
        start = len(self.prompts)
        if start + len(prompts) > len(self.script):
            raise AssertionError(
                f"scripted engine exhausted: call {len(self.calls)} asks for {len(prompts)} generation(s), "
                f"only {len(self.script) - start} script entries left"
            )
        entries = self.script[start : start + len(prompts)]
        generations = [Generation(entry_ids(self.tokenizer, e), e.finished) for e in entries]
        self.calls.append([list(p) for p in prompts])
        self.params.append(params)
        self.outputs.append([list(g.token_ids) for g in generations])
        return generations


class ListKeeper:
    """A real environment that keeps the list it is given and mutates it later (as BFCL's posting API does)."""

    def __init__(self) -> None:
        self.kept: list[str] = []

    def keep(self, items: list[str]) -> dict:
        """Keep a list.

        Args:
            items: The list to keep.
        """
        self.kept = items
        return {"kept": len(items)}

    def add(self, item: str) -> dict:
        """Add an item to the kept list.

        Args:
            item: The item to add.
        """
        self.kept.append(item)
        return {"kept": len(self.kept)}


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call block as the act role writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def result_text(value: Any) -> str:
    """A rehearsed response as the rehearse role writes it."""
    return f"<execution_result>\n{json.dumps(value)}\n</execution_result>"


def act_texts(tokenizer: PreTrainedTokenizerBase, episode: Any) -> list[str]:
    """The decoded runs of an episode's act-role tokens (the policy's own turns), special tokens dropped."""
    from envace.types import Role

    runs: list[list[int]] = []
    current: list[int] = []
    for token, role in zip(episode.act.token_ids, episode.act.role_ids):
        if role == Role.ACT:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    return [tokenizer.decode(r, skip_special_tokens=True) for r in runs]


# -- rows in the EnvACE authors' training format (envace.data.reference_format) -------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }},
]


def standard(question: str, weight: float = 0.5, required: bool = False) -> dict[str, Any]:
    return {
        "question": question,
        "focus_on": "assistant.tool_calls",
        "pass_condition": "The call names the right city.",
        "failure_examples": ["calls get_time instead"],
        "evidence": [{"snippet": "get_weather(city='Paris')"}],
        "weight": weight,
        "required_for_next_turn": required,
    }


def make_row(index: int = 7, tools_as_string: bool = True) -> dict[str, Any]:
    system = {"role": "system", "content": "You are a helpful assistant."}
    first = {"role": "user", "content": "Weather in Paris?"}
    conversation = [
        system,
        first,
        {"role": "assistant", "content": "<think>look it up</think>", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}},
        ]},
        {"role": "tool", "name": "get_weather", "content": '{"sky": "rain"}'},
        {"role": "tool", "name": "get_time", "content": '{"time": "10:00"}'},
        {"role": "assistant", "content": "Rain, 10:00."},
        {"role": "user", "content": "And in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ]},
        {"role": "tool", "name": "get_weather", "content": '{"sky": "snow"}'},
        {"role": "assistant", "content": "Snow."},
    ]
    return {
        "messages": [system, first],
        "data_source": "checklist",
        "extra_info": {
            "index": index,
            "original_index": f"orig-{index}",
            "tools": json.dumps(TOOLS) if tools_as_string else copy.deepcopy(TOOLS),
            "messages": conversation,
            "interaction_kwargs": {"checklist_list": [[
                [standard("Weather of Paris asked?", 0.7, True), standard("Time asked?", 0.3)],
                [standard("Weather of Oslo asked?", 1.0)],
            ]]},
        },
    }


def run_oracle(tokenizer: PreTrainedTokenizerBase, tasks: list[Any], turns: list[list[str]]) -> list[Any]:
    """Run the oracle's act turns of ``tasks`` through ``EpisodeRunner`` against the real tools; the episodes.

    All episodes run together, so the act engine's script interleaves them: step k asks every episode still running,
    in order. Every scripted turn must be used.
    """
    from envace.rollout.config import RolloutConfig
    from envace.rollout.runner import EpisodeRunner
    from envace.worlds import RealWorld

    script = [t[k] for k in range(max(map(len, turns))) for t in turns if len(t) > k]
    act = ScriptedEngine(tokenizer, script)
    world = RealWorld()
    world.bind(tokenizer, model=None)
    config = RolloutConfig(max_turns=5, max_tool_calls=4, act_max_new_tokens=64, max_context_tokens=8192)
    episodes = EpisodeRunner(tokenizer, config).run(
        tasks, list(range(len(tasks))), act, world, world_engine=ScriptedEngine(tokenizer, [])
    )
    assert act.remaining == 0
    return episodes


class KeyedEngine:
    """An engine whose generation is a function of the prompt alone, usable in lock-step or per-episode scheduling.

    ``pick(prompt_ids) -> ScriptEntry | str`` decides each generation, so a rollout gives the same episodes whatever
    order its generations run in. As a ``ContinuousEngine`` (``submit``/``wait``), each ``wait`` finishes a random
    non-empty subset of the running requests (``seed``): the order per-episode scheduling must tolerate.

    Attributes:
        submitted: every submitted prompt, in order, with the tickets still running at the time (``running_at``).
        generate_calls: ``generate`` calls made (a lock-step rollout's micro-steps, or a world's own batch).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, pick: Any, seed: int = 0, continuous: bool = True) -> None:
        import random

        self.tokenizer, self.pick = tokenizer, pick
        self.rng = random.Random(seed)
        self.running: dict[int, Generation] = {}
        self.done: dict[int, Generation] = {}
        self.submitted: list[list[int]] = []
        self.running_at: list[set[int]] = []
        self.generate_calls = 0
        self.generated_tokens = 0
        if continuous:
            self.queue = object()

    def _make(self, prompt: list[int]) -> Generation:
        entry = self.pick(list(prompt))
        entry = entry if isinstance(entry, ScriptEntry) else ScriptEntry(entry)
        gen = Generation(entry_ids(self.tokenizer, entry), entry.finished)
        self.generated_tokens += len(gen.token_ids)
        return gen

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """The generations of ``prompts``; running submitted requests may finish meanwhile (kept for ``wait``)."""
        self.generate_calls += 1
        if self.running:
            self._finish_some()
        return [self._make(p) for p in prompts]

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        """Queue one prompt."""
        ticket = len(self.submitted)
        self.running_at.append(set(self.running))
        self.submitted.append(list(prompt))
        self.running[ticket] = self._make(prompt)
        return ticket

    def wait(self) -> list[tuple[int, Generation]]:
        """Finish a random non-empty subset of the running requests; return every finished unread one."""
        if not self.running and not self.done:
            raise RuntimeError("wait with nothing running")
        if not self.done:
            self._finish_some()
        out = sorted(self.done.items())
        self.done.clear()
        return out

    def _finish_some(self) -> None:
        tickets = sorted(self.running)
        for t in self.rng.sample(tickets, self.rng.randint(1, len(tickets))):
            self.done[t] = self.running.pop(t)


def load_benchmark(name: str) -> Any:
    """Import ``benchmarks/<name>.py`` as the module ``name`` (registered in ``sys.modules``, as the worker processes
    a study spawns import it by that name); the caller pops it when done."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def shared_rows(prefix_len: int, tails: list[int], first_scored: int) -> tuple[Any, Any, Any]:
    """Right-padded rows that start with one common prefix of random tokens; scored from ``first_scored`` on.

    Returns ``input_ids``, ``attention_mask`` and the scored positions.  # [N, T], [N, T], [N, T]
    """
    import torch

    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(5, 3000, (prefix_len,), generator=g)
    width = prefix_len + max(tails)
    ids = torch.zeros(len(tails), width, dtype=torch.long)
    mask = torch.zeros(len(tails), width, dtype=torch.long)
    scored = torch.zeros(len(tails), width)
    for i, tail in enumerate(tails):
        ids[i, :prefix_len] = prefix
        ids[i, prefix_len : prefix_len + tail] = torch.randint(5, 3000, (tail,), generator=g)
        mask[i, : prefix_len + tail] = 1
        scored[i, first_scored : prefix_len + tail] = 1
    return ids, mask, scored


def counting_prefix_passes() -> tuple[list[int], Any]:
    """A patch of ``envace.policy.logprobs.prefix_states`` that records the length of every shared prefix computed, and
    that record."""
    from unittest import mock

    import envace.policy.logprobs

    calls: list[int] = []
    real = envace.policy.logprobs.prefix_states

    def counted(model: Any, input_ids: Any, attention_mask: Any) -> Any:
        calls.append(input_ids.shape[1])
        return real(model, input_ids, attention_mask)

    return calls, mock.patch.object(envace.policy.logprobs, "prefix_states", counted)
