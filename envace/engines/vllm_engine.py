"""``VLLMEngine``: the rollout on a colocated vLLM engine, token ids in, token ids and log-probs out.

The engine lives in the trainer's process (vLLM's in-process engine core, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), on
the trainer's device, one per rank with tensor parallelism 1: the trainer hands it weights directly, with no server
and no copy through another process. Prompts go in as token ids (``TokensPrompt``) and come back as token ids with
each sampled token's log-probability under the engine; nothing is detokenised or re-tokenised.

After every optimiser step the trainer calls ``load_weights`` with the policy's current weights (full weights, or a
LoRA policy's merged ones); vLLM's own ``load_weights`` of the model class maps Hugging Face names onto its fused
layers, and the prefix cache is cleared, since keys and values computed by the old weights are stale. On a GPU,
``sleep`` and ``wake_up`` release and regain the engine's memory (weights and KV cache) around the update
(``enable_sleep_mode``).

vLLM is optional: ``pip install envace[vllm]`` on a CUDA machine, or ``scripts/setup_vllm_env.sh`` for the community
CPU build in its own environment (it needs an older transformers than envace's main environment).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from envace.engines.base import Generation, SamplingParams


@dataclass(frozen=True)
class VLLMOptions:
    """The vLLM engine's settings (``model.rollout.vllm``, used with ``model.rollout.engine: vllm``).

    Attributes:
        dtype: the engine's dtype (``auto``: the checkpoint's); match the trainer's for small log-prob gaps.
        gpu_memory_utilization: share of the GPU's memory vLLM may take (weights and KV cache) beside the trainer.
        kv_cache_gib: on CPU, the KV cache size in whole GiB.
        max_model_len: the longest prompt plus continuation (default: the model's).
        sleep: release the engine's GPU memory while the trainer updates (vLLM's sleep mode).
        enable_prefix_caching: reuse the keys and values of shared prompt prefixes.
        seed: the engine's sampling seed.
    """

    dtype: str = "auto"
    gpu_memory_utilization: float = 0.3
    kv_cache_gib: int = 1
    max_model_len: int | None = None
    sleep: bool = False
    enable_prefix_caching: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.kv_cache_gib < 1:
            raise ValueError(f"rollout.vllm.kv_cache_gib must be at least 1, got {self.kv_cache_gib}")


INSTALL_HINT = ("vLLM is not installed: pip install 'envace[vllm]' on a CUDA machine, or bash "
                "scripts/setup_vllm_env.sh for the CPU build (its own environment, .venv-vllm)")


def require_vllm() -> Any:
    """Import ``vllm`` with its engine core in this process, or say how to install it.

    Raises:
        ImportError: vLLM is missing, with the install command.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the trainer hands the engine its weights
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise ValueError("VLLMEngine needs vLLM's engine core in the trainer's process: unset "
                         "VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0")
    return vllm


class VLLMEngine:
    """Generates with a colocated vLLM engine (see the module docstring).

    Args:
        model: a Hugging Face model directory (or name) vLLM loads; the trainer's weights replace its weights at the
            first ``load_weights``.
        stop_ids: ids that end a turn (the chat template's end-of-turn token and the EOS token).
        dtype: the engine's dtype (``auto``: the checkpoint's; match the trainer's for small log-prob gaps).
        max_model_len: the longest prompt plus continuation (default: the model's).
        gpu_memory_utilization: share of the GPU's memory vLLM may take (weights and KV cache) beside the trainer.
        kv_cache_gib: on CPU, the KV cache size in whole GiB (``VLLM_CPU_KVCACHE_SPACE``).
        enable_prefix_caching: reuse the keys and values of shared prompt prefixes (a multi-turn rollout's earlier
            turns, a group's shared prompt).
        enable_sleep_mode: allow ``sleep``/``wake_up`` (GPU only).
        seed: the engine's sampling seed.
        max_lora_rank: serve LoRA adapters of at most this rank on top of the loaded weights (``load_adapter``,
            ``adapter``): the per-role adapters of the noshare variant. None: no LoRA.
        llm_kwargs: further ``vllm.LLM`` arguments (e.g. ``{"enforce_eager": False}``).
    """

    def __init__(
        self,
        model: str,
        stop_ids: list[int],
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_gib: int = 1,
        enable_prefix_caching: bool = True,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        max_lora_rank: int | None = None,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        vllm = require_vllm()
        self.stop_ids = sorted(set(stop_ids))
        self.sync_seconds: list[float] = []
        self.asleep = False
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        kwargs: dict[str, Any] = {
            "model": model, "dtype": dtype, "seed": seed, "enable_prefix_caching": enable_prefix_caching,
            "enforce_eager": not on_gpu, "tensor_parallel_size": 1, "max_model_len": max_model_len,
            "generation_config": "vllm",  # sampling is the role's alone, not the checkpoint's defaults
            "logprobs_mode": "processed_logprobs",  # after temperature, as the trainer computes them
        }
        if on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        if max_lora_rank is not None:
            kwargs.update(enable_lora=True, max_lora_rank=_lora_rank_slot(max_lora_rank), max_loras=2)
        self.llm = vllm.LLM(**{**kwargs, **(llm_kwargs or {})})
        self._tokens_prompt = vllm.inputs.TokensPrompt
        self._sampling = vllm.SamplingParams
        self._final_only = vllm.sampling_params.RequestOutputKind.FINAL_ONLY
        self._lora_request = vllm.lora.request.LoRARequest
        self._adapters: dict[str, Any] = {}  # adapter name -> its LoRARequest (shared with every view)
        self.adapter_name: str | None = None  # a view's adapter (``adapter``)
        self.queue = _Queue()

    @classmethod
    def from_options(cls, model: str, stop_ids: list[int], options: VLLMOptions, max_lora_rank: int | None = None,
                     llm_kwargs: dict[str, Any] | None = None) -> VLLMEngine:
        """An engine with ``options`` (``model.rollout.vllm``)."""
        return cls(model, stop_ids, dtype=options.dtype, max_model_len=options.max_model_len,
                   gpu_memory_utilization=options.gpu_memory_utilization, kv_cache_gib=options.kv_cache_gib,
                   enable_prefix_caching=options.enable_prefix_caching, enable_sleep_mode=options.sleep,
                   seed=options.seed, max_lora_rank=max_lora_rank, llm_kwargs=llm_kwargs)

    def adapter(self, name: str) -> VLLMEngine:
        """A view of this engine that generates through LoRA adapter ``name`` (loaded with ``load_adapter``).

        The view shares the engine, its weights and its request queue: requests of both roles run in the same
        batches, and one ``wait`` returns them all.
        """
        view = copy.copy(self)
        view.adapter_name = name
        return view

    def load_adapter(self, name: str, path: str | os.PathLike[str]) -> float:
        """Load (or reload in place) LoRA adapter ``name`` from a peft directory; returns the seconds it took.

        The prefix cache is cleared: keys and values computed through the old adapter are stale.

        Raises:
            ValueError: the engine was started without ``max_lora_rank``.
            RuntimeError: requests are still running.
        """
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise ValueError("VLLMEngine.load_adapter: the engine serves no LoRA; start it with max_lora_rank")
        self._idle("load_adapter")
        start = time.perf_counter()
        known = self._adapters.get(name)
        lora_id = known.lora_int_id if known is not None else len(self._adapters) + 1
        self.llm.llm_engine.add_lora(self._lora_request(name, lora_id, str(path), load_inplace=True))
        self._adapters[name] = self._lora_request(name, lora_id, str(path))
        self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - start
        self.sync_seconds.append(seconds)
        return seconds

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One continuation per prompt, in order, with the engine's log-probability of each generated token.

        Requests submitted earlier (``submit``) keep running in the same batches; those that finish meanwhile are
        kept for the next ``wait``.
        """
        tickets = [self.submit(p, params) for p in prompts]
        wanted = set(tickets)
        while not wanted.issubset(self.queue.done):
            self._step()
        return [self.queue.done.pop(t) for t in tickets]

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        """Queue one prompt and return its ticket; it runs in the engine's next steps, beside every other request.

        This is what lets a multi-turn rollout schedule per episode: each episode's next turn joins the running
        batch as soon as its previous turn ends (``EpisodeRunner`` with ``rollout.continuous``).
        """
        if self.asleep:
            raise RuntimeError("VLLMEngine.submit: the engine is asleep; call wake_up() first")
        lora = None
        if self.adapter_name is not None:
            lora = self._adapters.get(self.adapter_name)
            if lora is None:
                raise RuntimeError(f"VLLMEngine: LoRA adapter {self.adapter_name!r} was never loaded "
                                   "(load_adapter)")
        ticket = self.queue.next_ticket
        self.queue.next_ticket += 1
        self.llm.llm_engine.add_request(str(ticket), self._tokens_prompt(prompt_token_ids=list(prompt)),
                                        self._params(params), lora_request=lora)
        self.queue.running.add(ticket)
        return ticket

    def wait(self) -> list[tuple[int, Generation]]:
        """Run the engine until at least one submitted request has finished; every finished one, with its ticket.

        Raises:
            RuntimeError: nothing was submitted that has not already been returned.
        """
        queue = self.queue
        if not queue.running and not queue.done:
            raise RuntimeError("VLLMEngine.wait: no request is running")
        while not queue.done:
            self._step()
        finished = sorted(queue.done.items())
        queue.done.clear()
        return finished

    @property
    def generated_tokens(self) -> int:
        """Tokens generated so far (by every view of this engine's queue)."""
        return self.queue.generated_tokens

    def _step(self) -> None:
        """One engine step; finished requests move from running to done."""
        queue = self.queue
        for output in self.llm.llm_engine.step():
            if output.finished:
                ticket = int(output.request_id)
                gen = self._generation(output.outputs[0])
                queue.generated_tokens += len(gen.token_ids)
                queue.running.discard(ticket)
                queue.done[ticket] = gen

    def _params(self, params: SamplingParams) -> Any:
        return self._sampling(
            max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            min_tokens=params.min_new_tokens, stop_token_ids=self.stop_ids, logprobs=0, detokenize=False,
            output_kind=self._final_only,  # a request reports once, when it ends
        )

    def _generation(self, completion: Any) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [step[token].logprob for token, step in zip(ids, completion.logprobs or [])]
        finished = bool(ids) and ids[-1] in self.stop_ids
        return Generation(ids, finished, logprobs if len(logprobs) == len(ids) else None)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Give the engine new weights (Hugging Face names); returns the seconds it took.

        The prefix cache is cleared: its keys and values came from the old weights.
        """
        self._idle("load_weights")
        start = time.perf_counter()
        count = [0]

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                count[0] += 1
                yield name, tensor.detach()

        self.llm.collective_rpc(_load_into_model, args=(counted(),))  # in process: read one weight at a time
        if count[0] == 0:
            raise ValueError("VLLMEngine.load_weights: no weights given")
        self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - start
        self.sync_seconds.append(seconds)
        return seconds

    def close(self) -> None:
        """Shut the engine down and free what it holds (weights, KV cache, its process group); unusable after.

        Another engine can then start in this process (a benchmark measuring several models, one at a time).
        """
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        shutdown = getattr(getattr(self.llm.llm_engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        del self.llm
        cleanup_dist_env_and_memory()

    def _idle(self, what: str) -> None:
        if self.queue.running or self.queue.done:
            raise RuntimeError(f"VLLMEngine.{what}: requests are still running or unread; new weights would change "
                               "them mid-generation")

    def sleep(self) -> None:
        """Release the engine's GPU memory (weights and KV cache) while the trainer updates (GPU only)."""
        if torch.cuda.is_available():
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Take the memory back after ``sleep``."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _lora_rank_slot(rank: int) -> int:
    """The smallest LoRA rank vLLM accepts as ``max_lora_rank`` that holds ``rank``."""
    for slot in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise ValueError(f"VLLMEngine: LoRA rank {rank} is above vLLM's largest (512)")


@dataclass
class _Queue:
    """The requests of one engine (shared by its role adapters' views): tickets, running ones, finished unread ones."""

    next_ticket: int = 0
    running: set[int] = field(default_factory=set)
    done: dict[int, Generation] = field(default_factory=dict)
    generated_tokens: int = 0


def _load_into_model(worker: Any, named: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs on the engine's worker: vLLM's in-place ``reload_weights``.

    It maps checkpoint names onto fused and repacked layers, then runs the layers' own post-load processing; a vLLM
    without it gets the model's ``load_weights``.
    """
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=named, is_checkpoint_format=True)
        return
    model = worker.model_runner.model
    device = next(model.parameters()).device
    model.load_weights((name, t.to(device)) for name, t in named)
