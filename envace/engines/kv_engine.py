"""A generation engine that reuses the KV cache across turns and drops finished rows from the batch.

A multi-turn rollout calls the engine once per turn, and every act prompt extends the previous one: the same stream
plus the turn just generated plus the tool responses. ``transformers`` ``generate`` re-reads each prompt from scratch
and keeps a finished row in the batch until the longest row ends. ``CachedEngine`` does neither:

- **Prefix reuse.** Inside a rollout session (``session()``, which ``EpisodeRunner.run`` opens) the engine keeps the
  keys and values of every sequence it generated, indexed by token-id prefix (``PrefixStore``). A prompt that shares a
  prefix with a stored sequence computes only its new suffix. The store is emptied when the session closes, so
  cached keys and values never outlive the weights that computed them (the update changes the weights between
  rollouts).
- **Finished rows leave the batch.** A row that produced a stop token or reached its budget is removed from the
  batch (and its cache) at once; columns that only finished rows used are dropped when they become a large share.

Sampling is ``transformers``' own logits warpers (temperature, top-k, top-p) on float32 logits, the distribution
``HFEngine`` samples from. Token ids go in and come out; nothing is decoded. Only models whose cache is plain full
attention (no sliding-window or linear-attention layers) can reuse a prefix; others run through ``generate`` (the
``HFEngine`` path) and only lose the speed-up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from peft import PeftModel
from torch import Tensor, nn
from transformers import DynamicCache, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from envace.engines.base import Generation, HFEngine, SamplingParams
from envace.policy.logprobs import cache_kwarg, prefix_runs

KV = list[tuple[Tensor, Tensor]]
"""Per layer, keys and values of one sequence: ``[kv_heads, tokens, head_dim]`` each."""


@dataclass
class _Entry:
    ids: list[int]
    kv: KV
    hashes: list[int]


class PrefixStore:
    """Sequences with their keys and values, looked up by the longest common token-id prefix.

    Prefixes are indexed by a hash chain over blocks of ``block`` tokens (a match is then verified token by token and
    extended inside the next block), so a lookup costs one pass over the prompt, whatever the number of entries.

    Args:
        max_entries: most sequences kept; the least recently used one is evicted first.
        block: hash-chain block length; prefixes shorter than one block are not reused.
        max_tokens: most tokens the kept sequences hold together (their keys and values are the store's memory);
            least recently used sequences are evicted first, the newest is always kept. 0: no token bound.
    """

    def __init__(self, max_entries: int = 256, block: int = 16, max_tokens: int = 0) -> None:
        if max_entries < 1 or block < 1 or max_tokens < 0:
            raise ValueError(f"max_entries and block must be at least 1 and max_tokens >= 0, got {max_entries}, "
                             f"{block} and {max_tokens}")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self.block = block
        self._tokens = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[int, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens held, over all entries."""
        return self._tokens

    def lookup(self, ids: list[int]) -> tuple[KV | None, int, int | None]:
        """The stored keys/values sharing the longest prefix with ``ids``, that prefix's length, and the entry key."""
        hashes = _chain(ids, self.block)
        for j in range(len(hashes) - 1, -1, -1):
            key = self._index.get(hashes[j])
            if key is None:
                continue
            entry = self._entries[key]
            n = (j + 1) * self.block
            if entry.ids[:n] != ids[:n]:  # a hash collision: never trust a hash alone
                continue
            limit = min(len(entry.ids), len(ids))
            while n < limit and entry.ids[n] == ids[n]:
                n += 1
            self._entries.move_to_end(key)
            return entry.kv, n, key
        return None, 0, None

    def add(self, ids: list[int], kv: KV, supersedes: int | None = None) -> None:
        """Keep ``ids`` with their keys/values; ``supersedes``: an entry that is a prefix of ``ids`` (dropped)."""
        if supersedes is not None and supersedes in self._entries:
            old = self._entries[supersedes]
            if len(old.ids) <= len(ids) and old.ids == ids[: len(old.ids)]:
                self._remove(supersedes)
        key, self._next = self._next, self._next + 1
        entry = _Entry(ids, kv, _chain(ids, self.block))
        self._entries[key] = entry
        self._tokens += len(ids)
        for h in entry.hashes:
            self._index[h] = key  # the newest sequence answers a shared prefix
        while len(self._entries) > self.max_entries or (
            self.max_tokens and self._tokens > self.max_tokens and len(self._entries) > 1
        ):
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._index.clear()
        self._tokens = 0

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._tokens -= len(entry.ids)
        for h in entry.hashes:
            if self._index.get(h) == key:
                del self._index[h]


def _chain(ids: list[int], block: int) -> list[int]:
    """Hash of every whole-block prefix of ``ids``, each chained on the one before."""
    out, h = [], 0
    for start in range(0, len(ids) - block + 1, block):
        h = hash((h, tuple(ids[start : start + block])))
        out.append(h)
    return out


class _BufferLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new keys/values into a preallocated buffer instead of concatenating.

    ``DynamicLayer`` copies its whole cache at every decoding step (``torch.cat``); this layer reserves room for the
    call's longest possible row once, so a step writes one column. ``keys``/``values`` are views of the filled part.
    """

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room  # columns reserved past the first write
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._n = 0

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Append the new keys/values; the filled keys and values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        m = key_states.shape[-2]
        if self._k is None or self._n + m > self._k.shape[-2]:
            self._grow(key_states, value_states, m)
        assert self._k is not None and self._v is not None
        self._k[:, :, self._n : self._n + m] = key_states
        self._v[:, :, self._n : self._n + m] = value_states
        self._n += m
        self._views()
        return self.keys, self.values

    def set(self, keys: Tensor, values: Tensor) -> None:
        """Start from ``keys``/``values`` ``[B, kv_heads, T, head_dim]``."""
        self.lazy_initialization(keys, values)
        self._k, self._v, self._n = None, None, 0
        self._grow(keys, values, keys.shape[-2])
        self.update(keys, values)

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep rows ``indices``."""
        if self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]  # type: ignore[index]
            self._views()

    def keep_columns(self, columns: Tensor) -> None:
        """Keep the filled columns ``columns`` (increasing), with the free room after them."""
        assert self._k is not None and self._v is not None
        free = self._k.shape[-2] - self._n
        kept = torch.cat([columns, torch.arange(self._n, self._n + free, device=columns.device)])
        self._k, self._v = self._k[:, :, kept], self._v[:, :, kept]
        self._n = columns.numel()
        self._views()

    def _grow(self, like_k: Tensor, like_v: Tensor, needed: int) -> None:
        size = self._n + needed + self.room
        k = like_k.new_zeros((*like_k.shape[:2], size, like_k.shape[-1]))
        v = like_v.new_zeros((*like_v.shape[:2], size, like_v.shape[-1]))
        if self._k is not None and self._v is not None:
            k[:, :, : self._n] = self._k[:, :, : self._n]
            v[:, :, : self._n] = self._v[:, :, : self._n]
        self._k, self._v = k, v

    def _views(self) -> None:
        assert self._k is not None and self._v is not None
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]


@dataclass
class _Batch:
    """The rows still generating, aligned on the batch dimension of ``mask`` and the cache."""

    rows: list[int]  # index of each row's prompt in the request
    fed: list[list[int]]  # per row, the ids whose keys/values are in the cache, in order
    reused: list[int | None]  # per row, the store entry its prefix came from
    mask: Tensor  # [B, T] 1 where the cache column holds one of the row's tokens
    cache: DynamicCache
    new: list[list[int]] = field(default_factory=list)


class CachedEngine(HFEngine):
    """``HFEngine`` with prefix reuse across calls of a session and finished rows leaving the batch.

    Args:
        model: the causal LM (plain, peft-wrapped or FSDP-wrapped).
        pad_id: padding token id.
        stop_ids: ids that end a turn.
        max_batch_size: most prompts per batch; longer lists are split.
        synced_gpus: every rank runs the same number of forwards (sharded models); a rank whose rows are done joins
            its peers' steps with a one-token forward.
        adapter_context: optional context-manager factory entered around generation.
        cache_entries: most sequences a session keeps (``PrefixStore.max_entries``); each holds its keys and values,
            ``2 x layers x kv_heads x head_dim`` values per token.
        cache_tokens: most tokens those sequences hold together (``PrefixStore.max_tokens``; 0: no bound).
        min_reuse: shortest prefix worth reusing, in tokens (also the store's hash block).
    """

    def __init__(
        self,
        model: nn.Module,
        pad_id: int,
        stop_ids: list[int],
        max_batch_size: int = 64,
        synced_gpus: bool = False,
        adapter_context: Callable[[], AbstractContextManager[object]] | None = None,
        cache_entries: int = 256,
        min_reuse: int = 16,
        cache_tokens: int = 0,
    ) -> None:
        super().__init__(model, pad_id, stop_ids, max_batch_size, synced_gpus, adapter_context)
        self.store = PrefixStore(cache_entries, min_reuse, cache_tokens)
        self.reused_tokens = 0  # prompt tokens read from the store instead of being recomputed
        self.prefilled_tokens = 0  # prompt tokens computed
        self._sessions = 0
        hf_model = _hf_model(model)
        self._cache_kwarg = cache_kwarg(hf_model)
        self.reusable = _plain_attention(hf_model)

    @contextmanager
    def session(self) -> Iterator[None]:
        """Keep generated sequences for reuse until the outermost session closes (re-entrant)."""
        self._sessions += 1
        try:
            yield
        finally:
            self._sessions -= 1
            if self._sessions == 0:
                self.store.clear()

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not self.reusable:
            return super()._generate_chunk(prompts, params)
        if any(not p for p in prompts):
            raise ValueError("CachedEngine.generate: every prompt needs at least one token")
        with self._generation_mode(), torch.no_grad():
            return self._run(prompts, params)

    # -- one batch --------------------------------------------------------------------------------------------------

    def _run(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        device = next(self.model.parameters()).device
        batch, logits = self._prefill(prompts, params.max_new_tokens, device)
        warp = _warpers(params)
        stops = torch.tensor(self.stop_ids, device=device)
        out: list[Generation | None] = [None] * len(prompts)
        step = 0
        while self._any_rank(bool(batch.rows)):  # synced: every rank makes one forward per iteration
            tokens = None
            if batch.rows:
                tokens = self._sample(logits, warp, params, step, stops)  # [B]
                step += 1
                tokens = self._advance(batch, tokens, step >= params.max_new_tokens, stops, out)
            if batch.rows:
                logits = self._decode(batch, tokens)
            elif self._synced():  # done here, not everywhere: join the peers' forward
                self._forward(torch.full((1, 1), self.pad_id, device=device), None, None, None)
        assert all(g is not None for g in out)
        return out  # type: ignore[return-value]

    def _advance(self, batch: _Batch, tokens: Tensor, budget_spent: bool, stops: Tensor,
                 out: list[Generation | None]) -> Tensor:
        """Append the sampled tokens; finished rows leave the batch (stored first). The remaining rows' tokens."""
        stopped = torch.isin(tokens, stops).tolist()
        for i, t in enumerate(tokens.tolist()):
            batch.new[i].append(t)
        done = [s or budget_spent for s in stopped]
        for i in (i for i, d in enumerate(done) if d):
            out[batch.rows[i]] = Generation(batch.new[i], stopped[i])
            self._keep(batch, i)
        keep = [i for i, d in enumerate(done) if not d]
        if len(keep) < len(done):
            _select_rows(batch, keep)
            tokens = tokens[keep]
        return tokens

    def _prefill(self, prompts: list[list[int]], max_new_tokens: int, device: torch.device) -> tuple[_Batch, Tensor]:
        """Build the batch: stored prefixes left-padded into the cache, new suffixes right-aligned after them."""
        self._store_shared_prefixes(prompts, device)
        found = [self._lookup(p) for p in prompts]
        reuse = [n for _, n, _ in found]
        past_width = max(reuse)
        suffix_width = max(len(p) - n for p, n in zip(prompts, reuse))
        n = len(prompts)
        input_ids = torch.full((n, suffix_width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, past_width + suffix_width), dtype=torch.long)
        positions = torch.ones((n, suffix_width), dtype=torch.long)
        for i, (p, k) in enumerate(zip(prompts, reuse)):
            s = len(p) - k
            input_ids[i, suffix_width - s :] = torch.tensor(p[k:], dtype=torch.long)
            mask[i, past_width - k : past_width] = 1
            mask[i, past_width + suffix_width - s :] = 1
            positions[i, suffix_width - s :] = torch.arange(k, len(p))
        cache = _padded_cache([kv for kv, _, _ in found], reuse, past_width, suffix_width + max_new_tokens, device)
        self.reused_tokens += sum(reuse)
        self.prefilled_tokens += sum(len(p) for p in prompts) - sum(reuse)
        batch = _Batch(list(range(n)), [list(p) for p in prompts], [key for _, _, key in found], mask.to(device),
                       cache, [[] for _ in prompts])
        logits = self._forward(input_ids.to(device), batch.mask, positions.to(device), cache)
        return batch, logits

    def _store_shared_prefixes(self, prompts: list[list[int]], device: torch.device) -> None:
        """Compute once, and store, each prefix that several prompts share and the store does not hold yet.

        The prompts of one call share a system prompt and tool schemas (act), or a tool schema and a task's world
        (rehearse); ``logprobs.prefix_runs`` picks the groups that save the most. Each group's prefix is fed once,
        on top of whatever the store already holds of it, so that every prompt's lookup then finds it. Only inside
        a session, and not with ``synced_gpus`` (the ranks would make different numbers of forwards).
        """
        if self._sessions == 0 or self._synced() or len(prompts) < 2:
            return
        for members, prefix in prefix_runs(prompts, [len(p) - 1 for p in prompts], self.store.block):
            if prefix and len(members) > 1:
                self._store_prefix(prompts[members[0]][:prefix], device)

    def _store_prefix(self, ids: list[int], device: torch.device) -> None:
        """Feed ``ids`` past what the store holds of them, and store their keys and values."""
        kv, n, key = self.store.lookup(ids)
        if n >= len(ids) - self.store.block:  # (almost) all there already
            return
        n = n if kv is not None and n >= self.store.block else 0
        cache = _padded_cache([kv if n else None], [n], n, len(ids) - n, device)
        mask = torch.ones((1, len(ids)), dtype=torch.long, device=device)
        positions = torch.arange(n, len(ids), device=device)[None]
        self._forward(torch.tensor([ids[n:]], device=device), mask, positions, cache)
        self.reused_tokens += n
        self.prefilled_tokens += len(ids) - n
        self.store.add(list(ids), [(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers],
                       supersedes=key if n else None)

    def _lookup(self, prompt: list[int]) -> tuple[KV | None, int, int | None]:
        if self._sessions == 0:
            return None, 0, None
        kv, n, key = self.store.lookup(prompt)
        n = min(n, len(prompt) - 1)  # the last prompt token is always fed: its logits start the generation
        return (kv, n, key) if n >= self.store.block else (None, 0, None)

    def _decode(self, batch: _Batch, tokens: Tensor) -> Tensor:
        """Feed each row's last sampled token; the logits of the next one."""
        positions = batch.mask.sum(dim=1, keepdim=True)  # [B, 1] the row's own token count: its next position
        batch.mask = torch.cat([batch.mask, torch.ones_like(positions)], dim=1)
        for i, t in enumerate(tokens.tolist()):
            batch.fed[i].append(t)
        return self._forward(tokens[:, None], batch.mask, positions, batch.cache)

    def _forward(self, input_ids: Tensor, mask: Tensor | None, positions: Tensor | None,
                 cache: DynamicCache | None) -> Tensor:
        """Last-position logits in float32, ``[B, vocab]``; ``cache`` grows by the fed tokens."""
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions,
                                  "use_cache": cache is not None, "logits_to_keep": 1}
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        return self.model(**kwargs).logits[:, -1, :].float()

    def _sample(self, logits: Tensor, warp: LogitsProcessorList, params: SamplingParams, step: int,
                stops: Tensor) -> Tensor:
        if step < params.min_new_tokens:
            logits[:, stops] = float("-inf")
        if params.temperature <= 0:
            return logits.argmax(dim=-1)
        return sample_categorical(torch.softmax(warp(None, logits), dim=-1))

    def _keep(self, batch: _Batch, i: int) -> None:
        """Store a finished row's fed ids with their keys/values (inside a session)."""
        if self._sessions == 0 or len(batch.fed[i]) < self.store.block:
            return
        columns = batch.mask[i].nonzero().squeeze(1)
        kv = [(layer.keys[i][:, columns].clone(), layer.values[i][:, columns].clone()) for layer in batch.cache.layers]
        assert columns.numel() == len(batch.fed[i]), "cache columns out of step with the fed ids"
        self.store.add(batch.fed[i], kv, supersedes=batch.reused[i])

    def _synced(self) -> bool:
        return self.synced_gpus and torch.distributed.is_initialized()

    def _any_rank(self, active: bool) -> bool:
        if not self._synced():
            return active
        flag = torch.tensor([int(active)], device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())


def sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One index per row of ``probs`` ``[B, V]``, drawn with probability ``probs`` (inverse-CDF sampling).

    One uniform draw per row against the row's cumulative sum (in float64), instead of ``torch.multinomial``, which
    costs ten times more on CPU at a 3k vocabulary. Zero-probability entries are never drawn.
    """
    cdf = probs.double().cumsum(dim=-1)  # [B, V]
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device, generator=generator) * cdf[:, -1:]
    index = torch.searchsorted(cdf, u, right=True).squeeze(1)  # first entry whose cumulative sum exceeds u
    last = probs.shape[1] - 1 - (probs.flip(-1) > 0).to(torch.uint8).argmax(dim=-1)  # last nonzero entry
    return torch.minimum(index, last)  # u rounding up to the total would point past it


def _warpers(params: SamplingParams) -> LogitsProcessorList:
    """``transformers``' sampling warpers, in ``generate``'s order."""
    warp = LogitsProcessorList()
    if params.temperature > 0 and params.temperature != 1.0:
        warp.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warp.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warp.append(TopPLogitsWarper(params.top_p))
    return warp


def _padded_cache(found: list[KV | None], reuse: list[int], width: int, room: int,
                  device: torch.device) -> DynamicCache:
    """A cache holding each row's reused keys/values, left-padded to ``width`` columns, with ``room`` free columns."""
    cache = DynamicCache()
    if width == 0:
        cache.layer_class_to_replicate = partial(_BufferLayer, room)  # filled by the first forward
        return cache
    template = next(kv for kv in found if kv is not None)
    cache.layers = []
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(found), k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((len(found), v0.shape[0], width, v0.shape[2]))
        for i, (kv, n) in enumerate(zip(found, reuse)):
            if kv is not None and n > 0:
                keys[i, :, width - n :] = kv[layer][0][:, :n]
                values[i, :, width - n :] = kv[layer][1][:, :n]
        buffer = _BufferLayer(room)
        buffer.set(keys.to(device), values.to(device))
        cache.layers.append(buffer)
    return cache


def _select_rows(batch: _Batch, keep: list[int]) -> None:
    """Drop the finished rows; drop the cache columns no remaining row uses once they are a quarter or more."""
    index = torch.tensor(keep, device=batch.mask.device)
    batch.rows = [batch.rows[i] for i in keep]
    batch.fed = [batch.fed[i] for i in keep]
    batch.reused = [batch.reused[i] for i in keep]
    batch.new = [batch.new[i] for i in keep]
    if not keep:
        return
    batch.mask = batch.mask[index]
    batch.cache.batch_select_indices(index)
    used = batch.mask.any(dim=0)
    if used.sum() <= 0.75 * used.numel():
        columns = used.nonzero().squeeze(1)
        batch.mask = batch.mask[:, columns]
        for layer in batch.cache.layers:
            layer.keep_columns(columns)


def _hf_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if isinstance(model, PeftModel) else model


def _plain_attention(hf_model: nn.Module) -> bool:
    """The model's cache is full attention in every layer, so keys/values can be cut and pasted per row."""
    config = getattr(hf_model, "config", None)
    if config is None or not hasattr(hf_model, "generate"):
        return False
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # noqa: BLE001 (an unusual config: fall back to generate, which handles it)
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
