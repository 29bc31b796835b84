"""Update settings and mechanics: ``GRPOConfig``, packing rows into micro-batches, reducing statistics.

Pure functions; the LightningModules own the optimiser and call these. Every path that trains or scores rows (the
SFT warm start and its validation loss, the RL update, its old and reference log-probs) packs them with
``micro_batches``, under a row cap and a budget of computed tokens: peak activation memory is then set by the budget,
not by the batch size, the number of rows per task or the length of a task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from envace.policy.logprobs import PrefixCarry, kept_positions, prefix_groups
from envace.rollout.collate import RolloutBatch
from envace.types import Role

DEFAULT_MICRO_BATCH_TOKENS = 4096
"""The default budget of computed tokens of one forward/backward (``micro_batch_tokens``): see docs/performance.md for
the peak memory it gives on SmolLM2-135M, and lower it (or raise it) with that one key."""


@dataclass
class GRPOConfig:
    """Role-wise GRPO settings.

    Attributes:
        group_size: episodes sampled per task (G); advantages are baselined per (task, role) group.
        ppo_epochs: passes over each rollout batch.
        mini_batches: optimiser steps per pass over a rollout batch (its rows are shuffled and split into this many
            parts; every rank makes the same number of steps).
        micro_batch_size: most rows per forward/backward (gradient accumulation inside a mini-batch).
        micro_batch_tokens: most computed tokens (rows x the longest row; with ``share_prefix`` their shared prefix
            once) per forward/backward; rows are sorted by length first, so similar lengths share a micro-batch,
            and a row longer than the budget goes alone. This
            bounds the update's activation memory whatever the batch size; 0 disables the token budget (then one
            micro-batch can hold ``micro_batch_size`` rows of any length).
        baseline: ``episode`` (each episode weighs once in its group's mean) or ``row`` (the reference's
            step-weighted mean over all rows).
        scale_by_std: divide advantages by the group's reward std (GRPO) or not (Dr.GRPO, the reference).
        act_weight: weight of the act head.
        rehearse_weight: weight of the rehearse head.
        align_weight: weight of the world-model alignment cross-entropy (0 turns it off).
        kl_weight: weight of the k3 KL to the reference policy (0 turns it off; with LoRA the reference is the
            adapter-disabled base, otherwise a frozen copy is kept).
        align_max_per_task: most alignment rows per task per step.
        align_live: also align on this step's live pairs: each call a real environment or the cache answered, and
            each call of an audited episode, with the episode's own history and the real response as the target
            (with ``align_weight`` > 0). Not with a thinking rehearse role (``think``): a live pair has no working, and
            a row of the result alone would teach the rehearse role to answer without one.
        align_live_max: most live alignment rows per step.
        imitate_weight: weight of the imitation cross-entropy on the demonstrations' act turns (the act-role
            analogue of the alignment term: each step's tasks that keep a reference trajectory add it as a
            teacher-forced act row; 0 turns it off).
        grad_clip: gradient-norm clip (0 disables).
        tis_cap: truncated importance sampling against a separate rollout engine's log-probs (``rollout.engine:
            vllm``): each generated token's policy-gradient term is weighted by ``min(pi_trainer / pi_engine,
            tis_cap)`` (verl's and TRL's correction for the engine's small mismatch; 2 is their usual cap). None
            leaves the update alone; the mismatch is logged either way (``engine_gap_*``).
        max_nonfinite_steps: an optimiser step whose loss (any head) or gradient is not finite is skipped (gradients
            zeroed, no ``optimizer.step``; ranks agree); this many consecutive skips stop training with an error that
            names the step and the heads. 0: never stop.
        max_failed_steps: a training step whose every episode failed (a broken environment, reward or world) skips
            its update; this many such steps in a row stop training with an error that names the causes (an
            always-failing setup would otherwise loop forever, since skipped steps never reach ``max_steps``).
            0: never stop.
        share_prefix: compute a prefix that rows share (the system prompt and tool schemas: most of a short row)
            once per step instead of once per row, when it is at least this many tokens (``micro_batches``,
            ``envace.policy.logprobs.token_logps``, ``envace.policy.logprobs.PrefixCarry`` on one rank); micro-batches
            then hold one role each, so act rows share the act prompt and rehearse rows the rehearse prompt. 0 (the
            default) turns it off. Works with activation checkpointing (``policy.gradient_checkpointing``, every mode).
    """

    group_size: int = 4
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 8
    micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS
    baseline: Literal["episode", "row"] = "episode"
    scale_by_std: bool = False
    act_weight: float = 1.0
    rehearse_weight: float = 1.0
    align_weight: float = 0.0
    kl_weight: float = 0.0
    align_max_per_task: int = 4
    align_live: bool = True
    align_live_max: int = 64
    grad_clip: float = 1.0
    imitate_weight: float = 0.0
    max_nonfinite_steps: int = 3
    max_failed_steps: int = 10
    share_prefix: int = 0
    tis_cap: float | None = None

    def __post_init__(self) -> None:
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"grpo.tis_cap must be > 0 or null, got {self.tis_cap}")
        for name in ("group_size", "ppo_epochs", "mini_batches", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"grpo.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("act_weight", "rehearse_weight", "align_weight", "kl_weight", "imitate_weight",
                     "micro_batch_tokens", "grad_clip", "align_live_max", "max_nonfinite_steps",
                     "max_failed_steps", "share_prefix"):
            if getattr(self, name) < 0:
                raise ValueError(f"grpo.{name} must be >= 0, got {getattr(self, name)}")


def pack_rows(rows: Tensor, lengths: list[int], max_rows: int, max_tokens: int) -> Iterator[Tensor]:
    """Greedy consecutive chunks of ``rows`` under a row cap and a budget of computed tokens.

    A chunk's cost is ``rows_in_chunk * its_longest_row`` padded tokens (rows sorted longest first keep it low); a
    single row longer than the budget gets a chunk of its own. ``max_tokens`` 0 means no token budget.
    """
    start = 0
    while start < len(rows):
        end, longest = start + 1, lengths[start]
        while end < len(rows) and end - start < max_rows:
            wider = max(longest, lengths[end])
            if max_tokens > 0 and (end - start + 1) * wider > max_tokens:
                break
            longest, end = wider, end + 1
        yield rows[start:end]
        start = end


Groups = list[tuple[list[int], int]]
"""Prefix groups: ``(rows, prefix)`` pairs, the rows computing their first ``prefix`` tokens once (0: plain rows)."""


class MicroBatch(NamedTuple):
    """One forward/backward's rows, and (with ``share_prefix``) the prefix groups its forward runs."""

    rows: Tensor
    """Indices of the rows in their batch.  # [n]"""
    groups: Groups | None = None
    """``(positions in rows, prefix)`` for ``logprobs.token_logps(groups=...)``; None: no sharing planned."""


def part_cost(rows: list[int], prefix: int, lengths: list[int]) -> int:
    """Tokens a group part computes and holds: its prefix once and its rows' suffixes padded to the longest."""
    return prefix + len(rows) * (max(lengths[r] for r in rows) - prefix)


def computed_tokens(micro: MicroBatch, lengths: list[int]) -> int:
    """Tokens a micro-batch computes and holds: its groups' ``part_cost``, or its rows padded to the longest."""
    rows = micro.rows.tolist()
    groups = micro.groups if micro.groups is not None else [(list(range(len(rows))), 0)]
    return sum(part_cost([rows[m] for m in members], prefix, lengths) for members, prefix in groups)


def pack_groups(groups: Groups, lengths: list[int], max_rows: int, max_tokens: int) -> list[Groups]:
    """Chunks of prefix groups under a row cap and a budget of computed tokens, groups split where they must be.

    The groups are taken in order and their rows longest first; a chunk's cost is the sum of its parts'
    ``part_cost``. A group too large for the room left goes on in the next chunk with the same prefix (a
    ``PrefixCarry`` then computes it once for all its parts; every part counts it, since its activations are held). A
    single row longer than the budget gets a chunk of its own. ``max_tokens`` 0 means no token budget.

    Returns:
        per chunk, its ``(rows, prefix)`` parts (indices as in ``groups``).
    """
    chunks: list[Groups] = []
    chunk: Groups = []
    cost = count = 0  # the closed parts of the open chunk
    for members, prefix in groups:
        part: list[int] = []
        for row in sorted(members, key=lambda r: -lengths[r]):
            full = count + len(part) >= max_rows
            over = max_tokens > 0 and cost + part_cost([*part, row], prefix, lengths) > max_tokens
            if (chunk or part) and (full or over):
                chunks.append([*chunk, (part, prefix)] if part else chunk)
                chunk, cost, count, part = [], 0, 0, []
            part.append(row)
        chunk.append((part, prefix))
        cost, count = cost + part_cost(part, prefix, lengths), count + len(part)
    return [*chunks, chunk] if chunk else chunks


def micro_batches(batch: RolloutBatch, rows: Tensor, max_rows: int, max_tokens: int, *, by_role: bool = False,
                  share_prefix: int = 0) -> Iterator[MicroBatch]:
    """Split ``rows`` of ``batch`` into micro-batches under a row cap and a budget of computed tokens.

    Rows are sorted longest first, so rows of similar length share a micro-batch (less padding; ``pack_rows``). With
    ``by_role`` (role adapters) or ``share_prefix``, every micro-batch holds rows of one role only. With
    ``share_prefix`` the prefix groups are planned once for all the rows of a role
    (``envace.policy.logprobs.prefix_groups``: the act rows' system prompt and tool schemas, each task's rehearse
    prompt) and packed group by group (``pack_groups``, a prefix costed once per micro-batch); a group that spans
    micro-batches keeps its prefix, so a ``PrefixCarry`` (``prefix_carry``) can compute it once.

    Args:
        batch: the rows' batch.
        rows: indices of the rows to pack.  # [n]
        max_rows: most rows per micro-batch.
        max_tokens: most computed tokens per micro-batch: padded rows, a shared prefix once (0: no token budget).
        by_role: never mix act and rehearse rows in one micro-batch.
        share_prefix: the shared-prefix threshold of the forward pass (0: off).
    """
    parts = [rows]
    if by_role or share_prefix:
        roles = batch.row_role[rows]
        parts = [rows[roles == int(r)] for r in (Role.ACT, Role.REHEARSE)]
    lengths = batch.attention_mask.sum(-1)  # [N]
    for part in parts:
        if not share_prefix:
            part = part[torch.argsort(lengths[part], descending=True, stable=True)]
            yield from (MicroBatch(chunk) for chunk in pack_rows(part, lengths[part].tolist(), max_rows, max_tokens))
            continue
        mask = batch.attention_mask[part]
        groups = prefix_groups(batch.input_ids[part], mask, kept_positions(batch.loss_mask[part], mask), share_prefix)
        for chunk in pack_groups(groups, lengths[part].tolist(), max_rows, max_tokens):
            order = [row for members, _ in chunk for row in members]
            yield MicroBatch(part[torch.tensor(order, dtype=torch.long, device=part.device)], _renumbered(chunk))


def _renumbered(chunk: Groups) -> Groups:
    """A chunk's groups with their rows numbered by position in the chunk (its groups' rows, in order)."""
    out, start = [], 0
    for members, prefix in chunk:
        out.append((list(range(start, start + len(members))), prefix))
        start += len(members)
    return out


def prefix_carry(batch: RolloutBatch, plan: list[MicroBatch], scale: float = 1.0) -> PrefixCarry | None:
    """A ``PrefixCarry`` for a step planned by ``micro_batches``: how many micro-batches read each shared prefix.

    None when no prefix is read by more than one micro-batch (nothing to carry).
    """
    uses: Counter[tuple[int, ...]] = Counter()
    for micro in plan:
        for members, prefix in micro.groups or []:
            if prefix:
                uses[tuple(batch.input_ids[micro.rows[members[0]], :prefix].tolist())] += 1
    return PrefixCarry(uses, scale) if any(n > 1 for n in uses.values()) else None


def sum_heads(stats: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Reduce the statistics of one optimiser step's micro-batches.

    Loss heads are sums (their weights were normalised over the whole mini-batch); entropies, engine gaps and
    per-role rates (clip fractions, approximate KL) are token-weighted means (their entries are ``[sum, count]``
    pairs), so none depends on how the rows were split; anything else is averaged over micro-batches. An empty list
    (a rank whose mini-batch had no rows) gives an empty dict.
    """
    out: dict[str, Tensor] = {}
    for key in stats[0] if stats else ():
        values = torch.stack([s[key].float() for s in stats])
        if values.dim() == 2:  # [sum, count] pairs
            total = values.sum(0)
            out[key] = total[0] / total[1].clamp(min=1.0)
        elif key.startswith(("loss", "kl")):
            out[key] = values.sum()
        else:
            out[key] = values.mean()
    return out


def mean_stats(stats: list[dict[str, Tensor]]) -> dict[str, float]:
    """Average each statistic over the optimiser steps of a training step (steps without rows are skipped)."""
    stats = [s for s in stats if s]
    if not stats:
        return {}
    return {k: float(torch.stack([s[k] for s in stats]).mean()) for k in stats[0]}
