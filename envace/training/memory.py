"""Peak memory of a training run, estimated before its first step and checked against the memory the run has.

A run that does not fit should stop in its first second with one line naming the key to lower, not be killed by the
kernel minutes in. The estimate adds what one rank holds at its peak:

- the weights (and, under bf16/fp16 autocast, the low-precision copies autocast keeps of them during a step),
  gradients and optimiser state of the trainable parameters (Adam-type: two float32 values per parameter);
- a frozen reference copy for the KL term, when one is kept;
- the activations of the largest micro-batch, per token and layer from the model's config
  (``activation_bytes_per_token``), plus its vocabulary projection on the scored positions;
- the generation engine's keys and values: the rows it generates at once, each up to its context budget, plus the
  prefix store's token bound (``rollout.cache_tokens``).

The per-token constants were measured on SmolLM2-135M (docs/performance.md, "Memory") and err high; the check
refuses only a run whose estimate exceeds the memory available, so a rough overestimate costs nothing in a run
that fits comfortably.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from envace.errors import UserError
from envace.policy.checkpointing import checkpointed_layers

GIB = 1024**3

LOGIT_BYTES = 8
"""Bytes per scored position and vocabulary entry at the update's peak: the logits (kept for backward) and the
gradient that flows back through them, at up to 4 bytes each. The float32 log-softmax runs on
``envace.policy.logprobs.SCORE_CHUNK`` positions at a time and is recomputed in backward, so it adds no per-position
term."""

PROCESS_BYTES = int(1.0 * GIB)
"""Python, torch, transformers, the tokenizer and the task sets: what an idle envace process holds before a model."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part of a run's peak, and the config key that lowers each part.

    Attributes:
        parts: bytes of each part (``weights``, ``gradients``, ``optimizer``, ``activations``, ``engine_cache``...).
        keys: for each part, the key (and the direction) that lowers it.
    """

    parts: dict[str, int]
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The estimated peak, in bytes."""
        return sum(self.parts.values())

    def largest(self) -> str:
        """The part with the most bytes among those a key can lower."""
        lowerable = {k: v for k, v in self.parts.items() if k in self.keys} or self.parts
        return max(lowerable, key=lambda k: lowerable[k])

    def summary(self) -> str:
        """``total 7.9 GiB (weights 0.5, gradients 0.5, ...)``."""
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.parts.items() if v)
        return f"{self.total / GIB:.1f} GiB ({parts})"


def model_config(model: nn.Module) -> Any:
    """The transformers config of a (peft- or FSDP-wrapped) causal LM, or None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "config", None)


def _dims(config: Any) -> tuple[int, int, int, int, int]:
    """``(layers, hidden, intermediate, kv_width, vocab)`` of a decoder config; kv_width = kv heads x head dim."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text.hidden_size)
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    return int(text.num_hidden_layers), hidden, intermediate, kv_heads * head_dim, int(text.vocab_size)


def activation_bytes_per_token(config: Any, mixed: bool, checkpointed: int = 0, selective: int = 0,
                               light: int = 0) -> int:
    """Bytes of activations a training forward keeps per token for backward, over every layer.

    Per decoder layer, under bf16/fp16 autocast: the float32 residual stream and normalisations (about 40 bytes per
    hidden unit, the attention projections included) and the MLP's gate, up, activation and product in 16 bits (10
    bytes per intermediate unit). float32 training keeps the same tensors at 4 bytes (x1.6). Of the ``checkpointed``
    layers (activation checkpointing, ``full``) only the float32 input is kept; of the ``selective`` ones the input
    and the outputs of the matrix products and the attention kernel (queries, keys, values, attention output, output
    projection, gate, up and down: ``4 * hidden + 2 * kv + 2 * intermediate`` values); plus one layer's activations
    while a checkpointed layer is recomputed. A ``light`` layer keeps its two normalisations' float32 inputs and
    their outputs, the queries, keys, values and attention output, and the MLP's gate, up and product
    (``8 * hidden`` bytes and ``4 * hidden + 2 * kv + 3 * intermediate`` values), nothing recomputed at layer scale.
    """
    layers, hidden, intermediate, kv, _ = _dims(config)
    per_layer = 40 * hidden + 10 * intermediate + 8 * kv
    if not mixed:
        per_layer = int(per_layer * 1.6)
    checkpointed = min(max(checkpointed, 0), layers)
    selective = min(max(selective, 0), layers - checkpointed)
    light = min(max(light, 0), layers - checkpointed - selective)
    width = 2 if mixed else 4
    kept = width * (4 * hidden + 2 * kv + 2 * intermediate) + 4 * hidden
    kept_light = width * (4 * hidden + 2 * kv + 3 * intermediate) + 8 * hidden
    plain = layers - checkpointed - selective - light
    return (plain * per_layer + checkpointed * 4 * hidden + selective * kept + light * kept_light
            + (per_layer if checkpointed or selective else 0))


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes of keys and values one token holds in a generation cache, over every layer."""
    layers, _, _, kv, _ = _dims(config)
    return 2 * layers * kv * dtype_bytes


@dataclass(frozen=True)
class Workload:
    """What one rank runs at its peak, in tokens (the sizes ``estimate`` turns into bytes).

    Attributes:
        micro_batch_tokens: padded tokens of the largest training micro-batch.
        scored_tokens: positions of that micro-batch whose log-probs are computed (the vocabulary projection).
        generation_rows: rows the engine generates at once.
        generation_tokens: context budget of one such row (its prompt and new tokens).
        store_tokens: the engine's prefix-store bound (0: none kept).
        budget_key: the config key of the training token budget.
        generation_key: the config key that lowers the generation rows.
    """

    micro_batch_tokens: int
    scored_tokens: int
    generation_rows: int = 0
    generation_tokens: int = 0
    store_tokens: int = 0
    budget_key: str = "micro_batch_tokens"
    generation_key: str = "rollout.generate_batch_size"


def estimate(model: nn.Module, work: Workload, *, mixed: bool, reference: nn.Module | None = None,
             optimizer_states: int = 2) -> MemoryEstimate:
    """The peak of one rank running ``work`` with ``model`` (see the module docstring for the parts).

    Args:
        model: the policy (parameters counted as they are now: sharded parameters count their local shard).
        work: the token sizes of the run.
        mixed: bf16/fp16 autocast (activations in 16 bits, a 16-bit copy of the weights during a step); 16-bit
            weights (``bf16-true``) keep 16-bit activations too.
        reference: a frozen copy kept for the KL term.
        optimizer_states: float32 values the optimiser keeps per trainable parameter (Adam, AdamW: 2).
    """
    config = model_config(model)
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    trainable_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    parts = {
        "process": PROCESS_BYTES,
        "weights": weights + (sum(p.numel() for p in params) * 2 if mixed else 0),
        "gradients": trainable_bytes,
        "optimizer": trainable * 4 * optimizer_states,
    }
    if reference is not None:
        parts["reference"] = sum(p.numel() * p.element_size() for p in reference.parameters())
    low = mixed or any(p.element_size() == 2 and p.is_floating_point() for p in params[:1])  # 16-bit activations
    if config is not None:
        layers = checkpointed_layers(model)  # peft wrappers are looked through
        parts["activations"] = work.micro_batch_tokens * activation_bytes_per_token(
            config, low, layers["full"], layers["selective"], layers["light"])
        parts["logits"] = work.scored_tokens * _dims(config)[4] * LOGIT_BYTES
        kv = kv_bytes_per_token(config, 2 if low else 4)
        parts["engine_cache"] = work.generation_rows * work.generation_tokens * kv
        parts["prefix_store"] = work.store_tokens * kv
    keys = {"activations": f"{work.budget_key} (the computed tokens of one micro-batch)",
            "logits": f"{work.budget_key} (the computed tokens of one micro-batch)",
            "engine_cache": f"{work.generation_key} (rows generated at once) or rollout.max_context_tokens",
            "prefix_store": "rollout.cache_tokens (tokens the rollout keeps for prefix reuse)",
            "optimizer": "model.policy.init_args.lora (train adapters, not every weight)",
            "gradients": "model.policy.init_args.lora (train adapters, not every weight)"}
    return MemoryEstimate(parts, keys)


def available_memory(device: torch.device) -> int:
    """The memory this rank may use, in bytes.

    On CUDA the GPU's total; on CPU, the machine's memory (or the container's limit, if lower) that other processes
    leave free, counting what this process already holds.
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    info = _meminfo()
    free = info.get("MemAvailable", info.get("MemTotal", 0)) + _rss()
    limit = _cgroup_limit()
    return min(free, limit) if limit else free


def _meminfo() -> dict[str, int]:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


def _rss() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cgroup_limit() -> int:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return 0


class OutOfMemoryPlan(UserError, MemoryError):
    """A run whose estimated peak exceeds the memory it has (raised before its first step)."""


def check_fits(estimated: MemoryEstimate, available: int, what: str) -> None:
    """Stop with one line naming the key to lower when ``estimated`` exceeds ``available`` bytes.

    Raises:
        OutOfMemoryPlan: the run would not fit.
    """
    if estimated.total <= available:
        return
    part = estimated.largest()
    raise OutOfMemoryPlan(
        f"{what}: the estimated peak memory, {estimated.summary()}, exceeds the {available / GIB:.1f} GiB "
        f"available; lower {estimated.keys.get(part, part)} (its largest part, {part}, is "
        f"{estimated.parts[part] / GIB:.1f} GiB), or set memory_limit_gb: 0 to start without this check"
    )


def return_freed_memory() -> bool:
    """Give the host memory freed since the last call back to the operating system; True where that was done.

    glibc's allocator keeps freed blocks below its mmap threshold (which grows to 32 MiB as large tensors are freed)
    for reuse, and rows of another length fragment them, so a CPU run's resident memory creeps up step after step
    though its live tensors do not (measured on SmolLM2 SFT: 4.1, 4.7, 5.7 GB after steps 1-3, at the same live
    size). ``malloc_trim`` returns those blocks; ``FreedMemory`` decides when the training modules call it. A no-op
    (False) on other C libraries.
    """
    trim = _malloc_trim()
    return bool(trim is not None and trim(0) >= 0)


LONGER = 1.25
"""``FreedMemory.before``: how much longer than the rows since the last trim a micro-batch's rows must be for the heap
to be trimmed before it (rows within it reuse the freed blocks well enough)."""


class FreedMemory:
    """When a CPU training run gives freed host memory back to the system: when the allocator holds more than needed.

    Returning memory is not free: the next micro-batch faults its pages back in (about 0.2 s a GiB on a 2-core
    machine), and trimming after every micro-batch and step cost SmolLM2 SFT a tenth of its step time. Keeping it for
    reuse is free until fragmentation (freed blocks of rows of other lengths) makes the held memory grow. So:

    - the floor is the resident memory after a trim between steps (``release``: the weights, the optimiser state);
    - a micro-batch run on a freshly trimmed heap measures the working set: its resident memory after backward, over
      the floor; the largest since the last ``restart`` is kept;
    - after every micro-batch, optimiser step and rollout (whose engine freed its keys and values), resident memory
      more than ``1 + slack`` times that working set over the floor is trimmed back (``check``); memory within it
      stays for the next micro-batches to reuse. The first step, before any floor, trims after every micro-batch;
    - before a micro-batch whose rows are longer (by ``LONGER``) than every row since the last trim, the heap is
      trimmed first (``before``): the blocks shorter rows freed do not fit a longer row's tensors, so they would
      stay beside the ones it allocates anew (measured on SmolLM2 RL, bank tasks with 600-token tool responses: a
      2048-token row after rows of 812 peaked 0.4 GB higher than on a trimmed heap). Rows come longest first within
      a role, so this happens about once a role a step;
    - ``restart`` (after a validation, which leaves the heap in another shape) trims, takes the floor and measures
      the working set again from the next micro-batch: what an earlier heap measured does not raise the ceiling for
      the rest of the run.

    So resident memory at every micro-batch's and step's end stays within ``slack`` of the largest working set
    measured since the last validation (none by default), and a run whose heap does not fragment trims nothing
    (docs/performance.md, "Memory").
    """

    def __init__(self, slack: float = 0.0) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.slack = slack
        self.floor: int | None = None
        """Resident bytes after the last trim between steps (None: none yet)."""
        self.working = 0
        """The largest resident bytes over ``floor`` that a micro-batch on a freshly trimmed heap left."""
        self.fresh = False
        self.trims = 0
        self.longest = 0
        """The longest row (tokens) of the micro-batches since the last trim (0: none)."""

    def before(self, length: int) -> bool:
        """Before a micro-batch of rows ``length`` tokens long: trim if they are too long for the freed blocks.

        That is, longer than the rows since the last trim by more than ``LONGER``; True if trimmed. The first step (no
        floor yet) trims after every micro-batch anyway.
        """
        if self.floor is not None and self.longest and length > LONGER * self.longest:
            done = self._trim()
            self.longest = length
            return done
        self.longest = max(self.longest, length)
        return False

    def check(self, step_end: bool = False) -> bool:
        """After a micro-batch's backward (``step_end``: an optimiser step): trim if over the ceiling; True if so."""
        if self.floor is None:  # the first step measures nothing: every micro-batch runs on a trimmed heap
            return self.release() if step_end else self._trim()
        over = _rss() - self.floor
        if self.fresh and not step_end:
            self.working = max(self.working, over)
        if over <= (1 + self.slack) * self.working:
            self.fresh = self.fresh and step_end
            return False
        return self.release() if step_end else self._trim()

    def release(self) -> bool:
        """Trim and take the floor (between steps: a step over the ceiling); True if trimmed."""
        done = self._trim()
        self.floor = _rss()
        return done

    def restart(self) -> bool:
        """Trim, take the floor and forget the working set (after a validation); True if trimmed."""
        self.working = 0
        return self.release()

    def _trim(self) -> bool:
        self.fresh, self.trims, self.longest = True, self.trims + 1, 0
        return return_freed_memory()


@functools.cache
def _malloc_trim() -> Any:
    """The C library's ``malloc_trim`` (glibc), or None where it has none."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
