"""Generation engines: the narrow interface the rollout runner and the worlds generate through.

An engine turns token-id prompts into generated token ids. It never decodes or re-tokenises: callers keep the ids
exactly as generated. ``HFEngine`` wraps ``transformers`` ``generate``; tests use a scripted engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from peft import PeftModel
from torch import nn
from transformers import GenerationConfig


@dataclass(frozen=True)
class SamplingParams:
    """How one role samples.

    Attributes:
        max_new_tokens: generation budget of one turn.
        temperature: sampling temperature; 0 means greedy.
        top_p: nucleus sampling mass.
        top_k: top-k cut-off; 0 disables it.
        min_new_tokens: stop tokens are masked until this many tokens were generated (0: never); benchmarks use it
            to fix the work of a call.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0


@dataclass
class Generation:
    """One generated continuation.

    Attributes:
        token_ids: the generated ids, the stop token included when one was produced.
        finished: True if a stop token ended it, False if ``max_new_tokens`` cut it.
        logprobs: the engine's log-probability of each generated token, when the engine reports them (vLLM); the
            trainer's own log-probs stay the behaviour policy's, these measure how far the engine drifts from it.
    """

    token_ids: list[int]
    finished: bool
    logprobs: list[float] | None = None


class Engine(Protocol):
    """Generates continuations of token-id prompts."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Generate one continuation per prompt, in order."""
        ...


class ContinuousEngine(Engine, Protocol):
    """An engine that takes requests one at a time and runs them all in its own batches (``VLLMEngine``).

    ``EpisodeRunner`` schedules per episode on such an engine (``rollout.continuous``). ``generate`` still works: it
    waits for its own requests while the others keep running, and keeps the others' results for ``wait``.

    Attributes:
        queue: the request queue; engines that share one (a base model and its role adapters) share tickets, so
            one ``wait`` serves both roles.
    """

    queue: object

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        """Queue one prompt; returns its ticket."""
        ...

    def wait(self) -> list[tuple[int, Generation]]:
        """Block until at least one submitted request has finished; every finished one with its ticket."""
        ...


@contextmanager
def sessions(*engines: Engine | None) -> Iterator[None]:
    """Open the rollout session of every engine that has one (``CachedEngine`` keeps its prefix cache inside it)."""
    with ExitStack() as stack:
        seen: set[int] = set()
        for engine in engines:
            session = getattr(engine, "session", None)
            if session is not None and id(engine) not in seen:
                seen.add(id(engine))
                stack.enter_context(session())
        yield


def cut_at_stop(ids: list[int], stop_ids: set[int], pad_id: int) -> Generation:
    """Cut a raw generated row after its first stop token; drop trailing padding otherwise."""
    for i, t in enumerate(ids):
        if t in stop_ids:
            return Generation(ids[: i + 1], True)
    while ids and ids[-1] == pad_id and pad_id not in stop_ids:
        ids = ids[:-1]
    return Generation(ids, False)


class HFEngine:
    """Batched sampling with ``transformers`` ``generate`` on the live (trained) model.

    Args:
        model: the causal LM (plain, peft-wrapped or FSDP-wrapped).
        pad_id: padding token id.
        stop_ids: ids that end a turn (the chat template's end-of-turn token and the EOS token).
        max_batch_size: most prompts per ``generate`` call; longer lists are split.
        synced_gpus: keep all ranks generating until every rank is done (needed under FSDP/ZeRO-3 so that
            sharded forwards stay in lockstep).
        adapter_context: optional context-manager factory entered around generation (e.g. to select a role's LoRA
            adapter).
    """

    def __init__(
        self,
        model: nn.Module,
        pad_id: int,
        stop_ids: list[int],
        max_batch_size: int = 64,
        synced_gpus: bool = False,
        adapter_context: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.model = model
        self.pad_id = pad_id
        self.stop_ids = sorted(set(stop_ids))
        self.max_batch_size = max_batch_size
        self.synced_gpus = synced_gpus
        self.adapter_context = adapter_context
        self.generated_tokens = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Generate continuations; see ``Engine.generate``."""
        out: list[Generation] = []
        chunks = [prompts[s : s + self.max_batch_size] for s in range(0, len(prompts), self.max_batch_size)]
        calls = self._peer_chunks(len(chunks))  # agreed before any generation collective starts
        for chunk in chunks:
            out.extend(self._generate_chunk(chunk, params))
        for _ in range(calls - len(chunks)):
            # Lockstep: a rank with fewer chunks joins its peers' remaining generate calls with a dummy prompt.
            self._generate_chunk([[self.pad_id]], SamplingParams(max_new_tokens=1))
        self.generated_tokens += sum(len(g.token_ids) for g in out)
        return out

    def _peer_chunks(self, mine: int) -> int:
        """The most ``generate`` calls any rank makes for this request (``mine`` on a single process)."""
        if not (self.synced_gpus and torch.distributed.is_initialized()):
            return mine
        count = torch.tensor([mine], device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return int(count.item())

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [n, L] left-padded
        attention_mask = torch.zeros_like(input_ids)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        with self._generation_mode(), torch.no_grad():
            seqs = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=self._config(params),
                synced_gpus=self.synced_gpus,
            )  # [n, L + new]
        new = seqs[:, width:].tolist()
        return [cut_at_stop(row, set(self.stop_ids), self.pad_id) for row in new]

    def _config(self, params: SamplingParams) -> GenerationConfig:
        """A complete generation config for ``params``.

        Built from scratch, so that no default of the checkpoint's ``generation_config.json`` (a repetition penalty,
        Qwen's top_k=20, ...) changes the sampling distribution the loss assumes.
        """
        sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=params.min_new_tokens,
            do_sample=params.temperature > 0,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            **(sampling if params.temperature > 0 else {}),
        )

    @contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """Eval mode (no dropout, KV cache on) and blank generation defaults, restored afterwards."""
        was_training = self.model.training
        hf_model = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
        checkpoint_defaults = hf_model.generation_config
        hf_model.generation_config = GenerationConfig()  # transformers fills unset values from this: keep it blank
        self.model.eval()
        try:
            with self.adapter_context() if self.adapter_context is not None else nullcontext():
                yield
        finally:
            self.model.train(was_training)
            hf_model.generation_config = checkpoint_defaults
