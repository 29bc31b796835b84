"""Per-token log-probabilities of a causal LM, the one forward pass every loss term is computed from."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import transformers.modeling_utils
from torch import Tensor, nn
from transformers import DynamicCache

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
        share_prefix: with ``positions``, when the rows begin with a common prefix of at least this many tokens
            that holds no scored position, run it once and the rows on top of its keys and values (gradients flow
            into it through every row) instead of once per row. Rows of one role usually share the system prompt
            and tool schemas, most of a short row. The log-probs are those of the plain forward up to float
            rounding. 0 (the default) never shares. Needs a model that takes ``past_key_values`` (Hugging Face
            causal LMs; not with gradient checkpointing, which turns the cache off).

    Returns:
        ``logps`` with 0 at position 0, at padding and outside ``positions``, and the entropy (or None).
        # [N, T], [N, T]
    """
    if positions is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()  # [N, T-1, V]
        valid = attention_mask[:, 1:].bool()  # [N, T-1]
        return _scores(logits, input_ids[:, 1:], valid, temperatures, with_entropy, _shift_right)
    keep = nn.functional.pad(positions[:, 1:].bool() & attention_mask[:, 1:].bool(), (0, 1))  # [N, T]: predicts t+1
    prefix = shared_prefix_length(input_ids, attention_mask, keep) if share_prefix else 0
    if share_prefix and prefix >= share_prefix and input_ids.shape[0] > 1:
        logits = _kept_logits_shared(model, input_ids, attention_mask, keep, prefix).float()  # [K, V]
    else:
        logits = _kept_logits(model, input_ids, attention_mask, keep).float()  # [K, V]
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


def shared_prefix_length(input_ids: Tensor, attention_mask: Tensor, keep: Tensor) -> int:
    """Length of the longest prefix that can be computed once for every row.

    It is the same real tokens in every row, ends at or before the first kept position of any row (so none of its
    logits is needed), and before the shortest row ends (every row keeps at least one token of its own).
    """
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)  # [T]
    limit = int(same.long().cumprod(0).sum().item())
    kept = keep.any(0).nonzero()
    if kept.numel():
        limit = min(limit, int(kept[0].item()))
    return min(limit, int(attention_mask.sum(-1).min().item()) - 1)


def _kept_logits_shared(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, keep: Tensor,
                        prefix: int) -> Tensor:
    """``_kept_logits`` with the common ``prefix`` computed once: its keys and values are repeated for every row.

    The rows' suffixes attend to the repeated cache; backward sums each row's gradient into the one prefix pass.
    No kept position lies in the prefix (``shared_prefix_length``), so the kept logits are all the suffixes'.
    """
    name = cache_kwarg(model)
    cache = DynamicCache()
    model(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True,
          logits_to_keep=1, **{name: cache})
    if cache.get_seq_length() != prefix:  # gradient checkpointing turns the cache off in training
        raise RuntimeError(f"share_prefix: the model kept {cache.get_seq_length()} of the {prefix} prefix positions "
                           "in its cache (gradient checkpointing disables it); turn share_prefix off")
    cache.batch_repeat_interleave(input_ids.shape[0])
    tail_keep = keep[:, prefix:]
    kwargs = {"logits_to_keep": tail_keep} if MASK_LOGITS_TO_KEEP else {}
    logits = model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, use_cache=True,
                   **{name: cache}, **kwargs).logits
    return logits[tail_keep] if logits.dim() == 3 else logits


def _shift_right(x: Tensor) -> Tensor:
    """[N, T-1] -> [N, T]: a value about token t+1 moves to column t+1 (column 0 is 0/False)."""
    return nn.functional.pad(x, (1, 0))


def _scores(logits: Tensor, targets: Tensor, valid: Tensor | None, temperatures: Tensor | None, with_entropy: bool,
            place: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` (and entropy) from ``logits`` [..., V], laid out as [N, T] by ``place``.

    ``temperatures`` has one entry per leading index of ``logits`` (a row, or a kept position).
    """
    if temperatures is not None:
        t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).to(logits)
        logits = logits / t.reshape(t.shape + (1,) * (logits.dim() - t.dim()))
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    scores = picked - lse
    if valid is not None:
        scores = scores * valid.to(scores.dtype)
    logps = place(scores)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            ent = lse - (probs * logits).sum(-1)
            if valid is not None:
                ent = ent * valid.to(ent.dtype)
            entropy = place(ent)
    return logps, entropy
