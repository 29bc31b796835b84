"""Per-token log-probabilities of a causal LM, the one forward pass every loss term is computed from."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils.checkpoint
import transformers.modeling_utils
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

MASK_LOGITS_TO_KEEP = hasattr(transformers.modeling_utils, "slice_logits_to_keep")
"""This transformers release accepts a boolean 2-D ``logits_to_keep`` (older ones take an int or 1-D indices only)."""


def token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperatures: Tensor | None = None,
    *,
    with_entropy: bool = False,
    positions: Tensor | None = None,
    share_prefix: int = 0,
    groups: list[tuple[list[int], int]] | None = None,
    carry: PrefixCarry | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of each token given its prefix, under the sampling temperature of its row.

    Args:
        model: a causal LM returning ``.logits``. With ``positions``, a boolean 2-D ``logits_to_keep`` is passed
            where the installed transformers supports it (``MASK_LOGITS_TO_KEEP``); otherwise, or when the model
            returns every position anyway, the kept positions are selected from the full logits.
        input_ids: right-padded rows.  # [N, T]
        attention_mask: 1 on real tokens.  # [N, T]
        temperatures: per-row sampling temperature; logits are divided by it so that the log-probs are those of
            the distribution the tokens were sampled from (0 = greedy is treated as 1).  # [N]
        with_entropy: also return the per-token entropy of that distribution (no gradient).
        positions: the tokens whose log-probs are needed (e.g. the loss mask); the vocabulary projection is then
            computed for those positions only, which is most of a small model's cost and most of a large
            vocabulary's memory. Other positions get 0. None computes every position.  # [N, T]
        share_prefix: with ``positions``, group the rows by the prefixes they share (``prefix_groups``): each group
            whose rows begin with a common prefix of at least this many tokens that holds no scored position runs
            it once and its rows on top of its keys and values (gradients flow into it through every row) instead
            of once per row. Rows of one role share the system prompt and tool schemas; the rehearse rows of one
            task and tool share most of their prompt. The log-probs are those of the plain forward up to float
            rounding. 0 (the default) never shares. Needs a model that takes a cache (Hugging Face causal LMs with
            full attention); works with activation checkpointing (``ReadOnlyPrefix``).
        groups: with ``positions``, the prefix groups to run instead of ``share_prefix``'s own (``(rows, prefix)``
            pairs, as ``prefix_groups`` returns them; every row in exactly one): a step planned across micro-batches
            (``envace.training.update.micro_batches``) keeps a group's prefix the same in each micro-batch its rows
            span.
        carry: shared prefixes that outlive this call (``PrefixCarry``): a group's prefix is computed by the first
            call that reads it and reused by the later ones.

    Returns:
        ``logps`` with 0 at position 0, at padding and outside ``positions``, and the entropy (or None).
        # [N, T], [N, T]
    """
    if positions is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # [N, T-1, V]
        valid = attention_mask[:, 1:].bool()  # [N, T-1]
        return _scores(logits, input_ids[:, 1:], valid, temperatures, with_entropy, _shift_right)
    keep = kept_positions(positions, attention_mask)  # [N, T]
    if groups is None:
        groups = prefix_groups(input_ids, attention_mask, keep, share_prefix) if share_prefix else []
    if any(prefix for _, prefix in groups):
        logits = _kept_logits_grouped(model, input_ids, attention_mask, keep, groups, carry)  # [K, V]
    else:
        logits = _kept_logits(model, input_ids, attention_mask, keep)  # [K, V]
    targets = input_ids[:, 1:][keep[:, :-1]]  # [K]
    rows = torch.nonzero(keep[:, :-1], as_tuple=True)[0]  # [K]

    target_mask = _shift_right(keep[:, :-1])  # [N, T]: the positions whose tokens were scored

    def scatter(flat: Tensor) -> Tensor:  # [K] -> [N, T]
        return torch.zeros(input_ids.shape, dtype=flat.dtype, device=flat.device).masked_scatter(target_mask, flat)

    row_temps = temperatures[rows] if temperatures is not None else None
    return _scores(logits, targets, None, row_temps, with_entropy, scatter)


def _kept_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, keep: Tensor) -> Tensor:
    """The logits of the ``keep`` positions only, in row-major order ([K, V])."""
    if MASK_LOGITS_TO_KEEP:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
        return logits[keep] if logits.dim() == 3 else logits  # a model that ignores the mask computes every position
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[keep]


def cache_kwarg(model: nn.Module) -> str:
    """The keyword a causal LM's ``forward`` takes its key/value cache as: ``cache`` or ``past_key_values``.

    transformers 5.24 renamed it; a peft wrapper is looked through.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


GROUP_OVERHEAD = 32
"""Tokens a prefix group must save to be worth its own forward pass (``prefix_groups``)."""


def prefix_groups(input_ids: Tensor, attention_mask: Tensor, keep: Tensor, min_prefix: int,
                  overhead: int = GROUP_OVERHEAD) -> list[tuple[list[int], int]]:
    """Partition the rows into groups that each compute one shared prefix once, saving the most tokens.

    The rows are ordered by their token ids, so rows that share a prefix are neighbours; a group is a run of them,
    and its prefix is the longest one all its rows share that ends before any of its rows' kept positions and
    before its shortest row ends (every row keeps at least one token of its own). A group of ``k`` rows with a
    prefix of ``p`` tokens saves ``(k - 1) * p`` tokens and costs one more forward pass (``overhead`` tokens'
    worth); the runs are chosen by dynamic programming to save the most. Rows left out of every group form one last
    group with prefix 0 (one plain forward).

    Args:
        input_ids: right-padded rows.  # [N, T]
        attention_mask: 1 on real tokens.  # [N, T]
        keep: the positions whose logits are needed.  # [N, T]
        min_prefix: shortest prefix worth sharing.
        overhead: tokens a group must save beyond ``min_prefix`` sharing to be formed.

    Returns:
        ``(rows, prefix)`` per group, rows ascending; the plain group (prefix 0), if any, last.
    """
    rows, limits = shareable_rows(input_ids, attention_mask.sum(-1).tolist(), keep)
    return prefix_runs(rows, limits, min_prefix, overhead)


def kept_positions(positions: Tensor, attention_mask: Tensor) -> Tensor:
    """The positions whose logits score a wanted token (position ``t`` predicts token ``t + 1``).

    Args:
        positions: the wanted tokens (e.g. the loss mask).  # [N, T]
        attention_mask: 1 on real tokens.  # [N, T]
    """
    return nn.functional.pad(positions[:, 1:].bool() & attention_mask[:, 1:].bool(), (0, 1))


def shareable_rows(input_ids: Tensor, lengths: list[int], keep: Tensor) -> tuple[list[list[int]], list[int]]:
    """Each row's real tokens, and the longest prefix of it that may be computed once for several rows.

    A shared prefix ends before the row's first kept position and before its last token (every row keeps at least
    one token of its own).
    """
    first_kept = [int(row.nonzero()[0].item()) if row.any() else lengths[i] for i, row in enumerate(keep)]
    rows = [input_ids[i, : lengths[i]].tolist() for i in range(input_ids.shape[0])]
    return rows, [min(first_kept[i], lengths[i] - 1) for i in range(len(rows))]


def prefix_runs(rows: list[list[int]], limits: list[int], min_prefix: int,
                overhead: int = GROUP_OVERHEAD) -> list[tuple[list[int], int]]:
    """``prefix_groups`` on token lists: ``limits[i]`` is the longest prefix row ``i`` may share.

    Returns:
        ``(rows, prefix)`` per group, rows ascending; the rows in no group, if any, last with prefix 0.
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    lcp = [common_length(rows[a], rows[b]) for a, b in zip(order, order[1:])]  # neighbours in the order
    n = len(order)
    best = [0] * (n + 1)  # best[i]: tokens saved by the first i rows of the order
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (start of the last run, its prefix)
    for end in range(1, n + 1):
        best[end], cut[end] = best[end - 1], (end - 1, 0)  # row end-1 alone
        prefix = limits[order[end - 1]]
        for start in range(end - 2, -1, -1):  # the run order[start:end]
            prefix = min(prefix, lcp[start], limits[order[start]])
            if prefix < min_prefix:
                break
            saved = best[start] + (end - start - 1) * prefix - overhead
            if saved > best[end]:
                best[end], cut[end] = saved, (start, prefix)
    groups, plain, end = [], [], n
    while end > 0:
        start, prefix = cut[end]
        members = sorted(order[start:end])
        if prefix:
            groups.append((members, prefix))
        else:
            plain.extend(members)
        end = start
    groups.reverse()
    return groups + ([(sorted(plain), 0)] if plain else [])


def common_length(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _kept_logits_grouped(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, keep: Tensor,
                         groups: list[tuple[list[int], int]], carry: PrefixCarry | None = None) -> Tensor:
    """The kept logits in row-major order, each group run on its own shared prefix (prefix 0: a plain forward).

    A one-row group runs plain, unless a ``carry`` holds (or will hold) its prefix for other micro-batches.
    """
    per_row: dict[int, Tensor] = {}
    for members, prefix in groups:
        idx = torch.tensor(members, device=input_ids.device)
        width = int(attention_mask[idx].sum(-1).max().item())
        ids, mask, kept = input_ids[idx, :width], attention_mask[idx, :width], keep[idx, :width]
        if prefix and (len(members) > 1 or carry is not None):
            logits = _kept_logits_shared(model, ids, mask, kept, prefix, carry)
        else:
            logits = _kept_logits(model, ids, mask, kept)
        for row, part in zip(members, logits.split(kept.sum(-1).tolist())):
            per_row[row] = part
    return torch.cat([per_row[row] for row in range(input_ids.shape[0])])


def _kept_logits_shared(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, keep: Tensor,
                        prefix: int, carry: PrefixCarry | None = None) -> Tensor:
    """``_kept_logits`` with the common ``prefix`` computed once: its keys and values are repeated for every row.

    The rows' suffixes attend to the repeated states, which they read and never extend (``ReadOnlyPrefix``); backward
    sums each row's gradient into the one prefix pass. No kept position lies in the prefix (``prefix_groups``), so
    the kept logits are all the suffixes'. Under activation checkpointing both passes recompute their checkpointed
    layers in backward: the prefix pass fills its cache once (``FillOnce``), and the suffix pass reads the same
    prefix states (``ReadOnlyPrefix``). With a ``carry`` the prefix may come from an earlier micro-batch.
    """
    rows, head, head_mask = input_ids.shape[0], input_ids[:1, :prefix], attention_mask[:1, :prefix]
    if carry is not None:
        cache = carry.read(model, head, head_mask, rows)
    else:
        cache = ReadOnlyPrefix(prefix_states(model, head, head_mask), rows)
    tail_keep = keep[:, prefix:]
    kwargs = {"logits_to_keep": tail_keep} if MASK_LOGITS_TO_KEEP else {}
    with _layer_flags(model, _can_checkpoint_with_cache=True):
        logits = model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, use_cache=False,
                       **{cache_kwarg(model): cache}, **kwargs).logits
    return logits[tail_keep] if logits.dim() == 3 else logits


def prefix_states(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> FillOnce:
    """One row's keys and values, every layer, as the forward of its continuation reads them.

    Args:
        model: a causal LM that takes a cache (``cache_kwarg``).
        input_ids: the prefix.  # [1, P]
        attention_mask: its mask (all ones).  # [1, P]
    """
    cache = FillOnce()
    with _layer_flags(model, _can_checkpoint_with_cache=True):
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1,
              **{cache_kwarg(model): cache})
    if cache.get_seq_length() != input_ids.shape[1]:
        raise RuntimeError(f"share_prefix: the model kept {cache.get_seq_length()} of the {input_ids.shape[1]} prefix "
                           "positions in its cache; turn share_prefix off for this model")
    return cache


class PrefixCarry:
    """Shared prefixes that outlive a micro-batch: each computed once per step, however many micro-batches read it.

    Under a token budget the rows of one prefix group (the act rows' system prompt and tool schemas) may span several
    micro-batches (``envace.training.update.micro_batches`` plans how many read each prefix: ``uses``, keyed by the
    prefix's token ids). The first reader computes the prefix; it and the later readers but the last read detached
    copies of its keys and values (leaves), whose gradients accumulate over their backward passes; the last reads the
    prefix's own states, and its loss gets ``term()``, whose gradient with respect to those states is the leaves'
    accumulated gradient. So the prefix's backward runs once, in the last reader's backward pass, with every reader's
    gradient, and the step makes as many backward passes as micro-batches (what distributed strategies count on). The
    prefix's activations are held from its first reader to its last: the packer counts a prefix in every micro-batch
    that reads it. Without a gradient (scoring) the readers share the states and nothing is accumulated.

    Args:
        uses: how many calls will read each prefix.
        scale: the factor a gradient scaler multiplies the loss by in backward (the leaves' gradients carry it).
    """

    def __init__(self, uses: Mapping[tuple[int, ...], int], scale: float = 1.0) -> None:
        self._left = dict(uses)
        self._held: dict[tuple[int, ...], tuple[FillOnce, list[tuple[Tensor, Tensor]]]] = {}
        self._terms: list[Tensor] = []
        self.scale = scale

    def read(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, rows: int) -> ReadOnlyPrefix:
        """The prefix ``input_ids`` ([1, P]) for ``rows`` rows: computed on its first read, released on its last."""
        key = tuple(input_ids[0].tolist())
        left = self._left.get(key, 1) - 1
        self._left[key] = left
        if key not in self._held:
            cache = prefix_states(model, input_ids, attention_mask)
            if left <= 0:
                return ReadOnlyPrefix(cache, rows)
            leaves = [(k.detach().requires_grad_(k.requires_grad), v.detach().requires_grad_(v.requires_grad))
                      for k, v in _states(cache)]
            self._held[key] = (cache, leaves)
            return ReadOnlyPrefix(cache, rows, leaves)
        cache, leaves = self._held[key]
        if left > 0:
            return ReadOnlyPrefix(cache, rows, leaves)
        del self._held[key]
        for own, leaf in zip((t for kv in _states(cache) for t in kv), (t for kv in leaves for t in kv)):
            if leaf.grad is not None:
                self._terms.append((own.float() * (leaf.grad.float() / self.scale)).sum())
        return ReadOnlyPrefix(cache, rows)

    def term(self) -> Tensor | None:
        """What the reading call's loss adds for the prefixes it released: 0 in value, their readers' gradient."""
        if not self._terms:
            return None
        total, self._terms = torch.stack(self._terms).sum(), []
        return total - total.detach()

    def check_done(self) -> None:
        """Raise if a prefix was never read its planned number of times (its earlier readers' gradient is lost)."""
        if self._held or self._terms:
            raise RuntimeError(f"{len(self._held)} shared prefixes were not read as often as planned; their gradient "
                               "would be lost (a micro-batch plan that does not match the forward)")


def _states(cache: DynamicCache) -> list[tuple[Tensor, Tensor]]:
    """Each layer's keys and values."""
    return [(layer.keys, layer.values) for layer in cache.layers]


class FillOnce(DynamicCache):
    """A cache that a prefix pass fills once per layer: a layer recomputed in backward gets its states back unstored.

    Under activation checkpointing a layer's forward runs again in backward; a plain cache would append the
    recomputed keys and values a second time. The first update of a layer stores its states and returns them, as
    ``DynamicCache`` does on an empty layer; a later one (the recomputation, the same numbers) returns its arguments
    and stores nothing, so the recomputed attention reads exactly what the forward read.
    """

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Store layer ``layer_idx``'s states the first time; afterwards return them as given."""
        if layer_idx < len(self.layers) and self.layers[layer_idx].is_initialized:
            return key_states, value_states
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class ReadOnlyPrefix(DynamicCache):
    """A shared prefix's keys and values that a forward reads and never extends.

    Each layer attends to the prefix's states followed by its own; the cache keeps only the prefix, so a layer that
    is recomputed in backward (activation checkpointing) reads exactly what its forward read, and a transformers
    layer may keep it under checkpointing (``_can_checkpoint_with_cache``).

    Args:
        prefix: the prefix's cache, one row.
        rows: the rows that read it (its states are expanded to them, not copied).
        states: other tensors to read in place of ``prefix``'s own, one ``(keys, values)`` per layer (``PrefixCarry``'s
            detached copies).
    """

    def __init__(self, prefix: DynamicCache, rows: int = 1,
                 states: list[tuple[Tensor, Tensor]] | None = None) -> None:
        super().__init__()
        kinds = {type(layer).__name__ for layer in prefix.layers if type(layer) is not DynamicLayer}
        if kinds:
            raise TypeError(f"share_prefix: the model's cache has {', '.join(sorted(kinds))} layers; only full "
                            "attention layers can share a prefix (turn share_prefix off)")
        self.layers = []
        for layer, (keys, values) in zip(prefix.layers, states if states is not None else _states(prefix)):
            view = copy.copy(layer)
            view.keys, view.values = keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1)
            self.layers.append(view)

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        """The prefix's states of layer ``layer_idx`` followed by ``key_states`` / ``value_states``; nothing stored."""
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


@contextmanager
def _layer_flags(model: nn.Module, **flags: bool) -> Iterator[None]:
    """Set attributes on the model's transformers decoder layers (``GradientCheckpointingLayer``) for a while."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    saved = [{k: m.__dict__[k] for k in flags if k in m.__dict__} for m in layers]
    for layer in layers:
        for key, value in flags.items():
            setattr(layer, key, value)
    try:
        yield
    finally:
        for layer, before in zip(layers, saved):
            for key in flags:
                if key in before:
                    setattr(layer, key, before[key])
                else:
                    delattr(layer, key)


def _shift_right(x: Tensor) -> Tensor:
    """[N, T-1] -> [N, T]: a value about token t+1 moves to column t+1 (column 0 is 0/False)."""
    return nn.functional.pad(x, (1, 0))


SCORE_CHUNK = 128
"""Positions whose vocabulary-wide float32 work (log-softmax, entropy) runs at once; see ``_scores``."""


def _scores(logits: Tensor, targets: Tensor, valid: Tensor | None, temperatures: Tensor | None, with_entropy: bool,
            place: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` (and entropy) from ``logits`` [..., V], laid out as [N, T] by ``place``.

    ``temperatures`` has one entry per leading index of ``logits`` (a row, or a kept position). The float32 work runs
    on ``SCORE_CHUNK`` positions at a time and, when a gradient is wanted, is recomputed per chunk in backward
    (activation checkpointing): a chunk keeps only its slice of the model's logits (bf16 under mixed precision), not
    the float32 copies, the log-sum-exp's input and the softmax of every kept position at once, which on a 49k
    vocabulary are about 200 KB a position each. The values are the unchunked ones: every operation is per position.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # [M, V]
    temps = None
    if temperatures is not None:
        t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).float()
        temps = t.reshape(t.shape + (1,) * (logits.dim() - 1 - t.dim())).expand(logits.shape[:-1]).reshape(-1)  # [M]
    picked = targets.reshape(-1).split(SCORE_CHUNK)  # [M] in chunks
    chunk_temps = temps.split(SCORE_CHUNK) if temps is not None else [None] * len(picked)
    parts, entropies = [], []
    # split, not slicing: its backward concatenates the chunks' gradients once, where each slice's backward would
    # write its chunk into a zeroed [M, V] tensor (quadratic in the positions)
    for chunk, chunk_targets, chunk_temp in zip(flat.split(SCORE_CHUNK), picked, chunk_temps):
        if torch.is_grad_enabled() and chunk.requires_grad:
            scores, ent = torch.utils.checkpoint.checkpoint(_chunk_scores, chunk, chunk_targets, chunk_temp,
                                                            with_entropy, use_reentrant=False)
        else:
            scores, ent = _chunk_scores(chunk, chunk_targets, chunk_temp, with_entropy)
        parts.append(scores)
        if ent is not None:
            entropies.append(ent)
    scores = torch.cat(parts).reshape(logits.shape[:-1]) if parts else flat.new_zeros(logits.shape[:-1]).float()
    if valid is not None:
        scores = scores * valid.to(scores.dtype)
    logps = place(scores)
    entropy = None
    if with_entropy:
        ent = torch.cat(entropies).reshape(logits.shape[:-1]) if entropies else torch.zeros_like(scores)
        if valid is not None:
            ent = ent * valid.to(ent.dtype)
        entropy = place(ent)
    return logps, entropy


def _chunk_scores(logits: Tensor, targets: Tensor, temperatures: Tensor | None,
                  with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """Each position's log-softmax(logits / T) at its target, and its entropy (no gradient), in float32.

    Shapes: logits [C, V], targets [C], temperatures [C]; returns [C] and [C] (or None).
    """
    logits = logits.float()
    if temperatures is not None:
        logits = logits / temperatures[:, None]
    lse = torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - lse, entropy
