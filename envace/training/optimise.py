"""The role-wise GRPO update's optimise loop, a base class of ``EnvACEModule``.

``GRPOUpdate`` owns what one rollout batch's update does once the batch is sampled, scored and baselined: the
behaviour and reference log-probs, the shuffled mini-batches, one optimiser step per mini-batch with its gradients
accumulated over token-budgeted micro-batches (``envace.training.update.micro_batches``), the loss of one micro-batch
(``envace.losses.objective.envace_objective``, with the separate engine's correction), the non-finite checks that skip
a step, and the zero-weight passes that keep ranks with fewer micro-batches in their peers' collectives.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from envace.losses.aggregation import TokenAggregator, TokenMean, role_weights
from envace.losses.engine_gap import engine_correction
from envace.losses.objective import LossWeights, envace_objective
from envace.losses.policy import ClippedPolicyLoss
from envace.policy.hf import adapter_context
from envace.policy.logprobs import PrefixCarry, token_logps
from envace.rollout.collate import RolloutBatch, role_rows
from envace.rollout.config import RolloutConfig
from envace.runtime.distributed import peer_any, peer_max
from envace.training.base import PolicyModule
from envace.training.update import Groups, GRPOConfig, MicroBatch, micro_batches, sum_heads
from envace.types import Role

NONFINITE_CHECKS = ("loss_act", "loss_rehearse", "loss_align", "loss_imitate", "kl", "loss")
"""The objective's heads (and total) whose finiteness an optimiser step checks, besides the gradient."""

RATE_STATS = ("clip_frac", "dual_clip_frac", "approx_kl")
"""Per-role token rates of the objective, reduced over micro-batches weighted by their tokens (``sum_heads``)."""


class GRPOUpdate(PolicyModule):
    """The optimise loop of a role-wise GRPO LightningModule (manual optimisation); ``EnvACEModule`` is the one.

    The subclass sets the attributes declared here in its constructor and calls ``_behaviour_logps``, then
    ``_optimise`` on each of ``_mini_batches``, from its ``training_step``.
    """

    grpo: GRPOConfig
    rollout: RolloutConfig
    policy_loss: ClippedPolicyLoss
    aggregation: TokenAggregator
    role_adapters: tuple[str, str] | None
    log_entropy: bool
    reference: torch.nn.Module | None
    _nonfinite_streak: int  # consecutive optimiser steps skipped for a non-finite loss or gradient
    _nonfinite_skips: int  # optimiser steps skipped so far in this training step

    def _behaviour_logps(self, batch: RolloutBatch) -> None:
        """Old log-probs when the update takes several steps per rollout; reference log-probs for the KL term."""
        several = self.grpo.ppo_epochs > 1 or self.grpo.mini_batches > 1
        with torch.no_grad():
            if several:
                batch.old_logps = self._logps_in_chunks(batch, self.model, nullcontext)
            if self.grpo.kl_weight > 0:
                reference = self.reference or self.model
                context = nullcontext if self.reference is not None else self.model.disable_adapter
                batch.ref_logps = self._logps_in_chunks(batch, reference, context)

    def _logps_in_chunks(
        self, batch: RolloutBatch, model: torch.nn.Module, context: Any
    ) -> Tensor:
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)  # [N, T]
        micro_batches = list(self._micro_batches(batch, torch.arange(len(batch), device=batch.input_ids.device)))
        passes = self._peer_max(len(micro_batches))  # before any pass: no other collective may interleave with it
        carry = self.prefix_carry(batch, micro_batches)
        for idx, groups in micro_batches:
            micro = batch.rows(idx)
            with context(), self._role_adapter(micro):
                logps, _ = token_logps(model, micro.input_ids, micro.attention_mask, micro.temperatures,
                                        positions=micro.loss_mask, share_prefix=self.grpo.share_prefix,
                                        groups=groups, carry=carry)
            out[idx, : logps.shape[1]] = logps
        if carry is not None:
            carry.check_done()
        for _ in range(passes - len(micro_batches)):
            with context():
                self._join_peers(model, backward=False)
        return out

    def _mini_batches(self, n: int) -> list[Tensor]:
        """``grpo.mini_batches`` shuffled parts of the rows: the same count on every rank (a part may be empty)."""
        order = torch.randperm(n, generator=torch.Generator().manual_seed(int(self.global_step)))
        return [part.to(self.device) for part in torch.tensor_split(order, self.grpo.mini_batches)]

    def _peer_max(self, count: int) -> int:
        """The largest ``count`` over all ranks: every rank must make the same number of model passes."""
        return peer_max(count, self.device) if self.trainer.world_size > 1 else count

    def _join_peers(self, model: torch.nn.Module, backward: bool) -> None:
        """A zero-weight one-token pass, so that a rank with fewer micro-batches joins its peers' collectives."""
        ids = torch.full((1, 1), self.tokenizer.pad_token_id, dtype=torch.long, device=self.device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        if backward:
            self.manual_backward(logits.sum() * 0.0)

    def _micro_batches(self, batch: RolloutBatch, rows: Tensor) -> Iterator[MicroBatch]:
        """``update.micro_batches`` under ``grpo``'s caps; one role per micro-batch with role adapters."""
        g = self.grpo
        return micro_batches(batch, rows, g.micro_batch_size, g.micro_batch_tokens, by_role=bool(self.role_adapters),
                             share_prefix=g.share_prefix)

    def _optimise(self, mb: RolloutBatch) -> dict[str, Tensor]:
        """One optimiser step on a mini-batch, accumulating gradients over its micro-batches."""
        optimizer = self.optimizers()
        stats = self._accumulate(mb)
        nonfinite = self._nonfinite(stats, optimizer)
        if nonfinite:  # skipped on every rank (the flags are reduced): no rank steps while another skips
            optimizer.zero_grad(set_to_none=True)
            self._skip_nonfinite(nonfinite)
            return {}
        self._nonfinite_streak = 0
        self.step_optimizer(optimizer, self.grpo.grad_clip)
        return sum_heads(stats)

    def _accumulate(self, mb: RolloutBatch) -> list[dict[str, Tensor]]:
        """Forward and backward every micro-batch of a mini-batch; the gradients add up to the mini-batch's.

        Each head's aggregation weights are computed once on the whole mini-batch and sliced per micro-batch, so the
        accumulated loss and gradients equal the single-batch ones (up to float rounding) whatever the token budget.
        Returns each micro-batch's statistics.
        """
        weights = {
            "act": role_weights(self.aggregation, mb.loss_mask, role_rows(mb, Role.ACT)),
            "rehearse": role_weights(self.aggregation, mb.loss_mask, role_rows(mb, Role.REHEARSE)),
            "align": role_weights(TokenMean(), mb.loss_mask, mb.is_align & (mb.row_role == int(Role.REHEARSE))),
            "imitate": role_weights(TokenMean(), mb.loss_mask, mb.is_align & (mb.row_role == int(Role.ACT))),
        }
        micro_batches = list(self._micro_batches(mb, torch.arange(len(mb), device=mb.input_ids.device)))
        passes = self._peer_max(len(micro_batches))  # before any pass: no other collective may interleave with it
        stats: list[dict[str, Tensor]] = []
        carry = self.prefix_carry(mb, micro_batches)
        lengths = mb.attention_mask.sum(-1).tolist()
        for planned in micro_batches:
            idx, groups = planned
            micro = mb.rows(idx)
            self.before_micro_batch(micro.input_ids.shape[1])
            w = {k: v[idx][:, : micro.input_ids.shape[1]] for k, v in weights.items()}
            with self._role_adapter(micro), self.over_budget(planned, lengths, self.grpo.micro_batch_tokens):
                loss, micro_stats = self._micro_loss(micro, w, groups, carry)
                self.manual_backward(self.with_carry(loss, carry))
            self.return_freed_memory("micro_batch")
            stats.append(micro_stats)
        if carry is not None:
            carry.check_done()
        for _ in range(passes - len(micro_batches)):
            self._join_peers(self.model, backward=True)
        return stats

    def _nonfinite(self, stats: list[dict[str, Tensor]], optimizer: Any) -> list[str]:
        """The loss heads (``NONFINITE_CHECKS``) and ``grad_norm`` that are not finite on some rank; [] if none.

        One collective on several ranks, so every rank gets the same answer. The gradient is checked on the
        optimiser's own parameters (this rank's shard under FSDP), except under a float16 ``GradScaler``, whose own
        step skips overflowing gradients and lowers its scale (skipping before it would keep the scale too high).
        """
        flags = torch.zeros(len(NONFINITE_CHECKS) + 1, device=self.device)  # [H + 1]
        if stats:
            heads = torch.stack([torch.stack([s[h].float() for h in NONFINITE_CHECKS]) for s in stats])  # [M, H]
            flags[:-1] = (~torch.isfinite(heads)).any(0).float()
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        grads = [] if scaled else [p.grad for group in optimizer.param_groups for p in group["params"]
                                   if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # FSDP2: this rank's shard
        if grads:
            flags[-1] = (~torch.stack([torch.isfinite(g).all() for g in grads]).all()).float()
        if self.trainer.world_size > 1:
            peer_any(flags)
        return [name for name, flag in zip((*NONFINITE_CHECKS, "grad_norm"), flags.tolist()) if flag]

    def _skip_nonfinite(self, nonfinite: list[str]) -> None:
        """Count a skipped optimiser step; stop training after ``grpo.max_nonfinite_steps`` in a row."""
        self._nonfinite_skips += 1
        self._nonfinite_streak += 1
        step, names = int(self.global_step), ", ".join(nonfinite)
        limit = self.grpo.max_nonfinite_steps
        if 0 < limit <= self._nonfinite_streak:
            raise RuntimeError(
                f"{self._nonfinite_streak} consecutive optimiser steps had a non-finite loss or gradient (the last at "
                f"optimiser step {step}: non-finite {names}); training stops (grpo.max_nonfinite_steps={limit}). "
                "Check the rewards and advantages, lower the learning rate, or train in float32")
        rank_zero_warn(f"optimiser step {step}: non-finite {names}; the step is skipped (gradients zeroed), "
                       f"{self._nonfinite_streak} in a row")

    def _micro_loss(self, micro: RolloutBatch, w: dict[str, Tensor], groups: Groups | None = None,
                    carry: PrefixCarry | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        logps, entropy = token_logps(
            self.model, micro.input_ids, micro.attention_mask, micro.temperatures, with_entropy=self.log_entropy,
            positions=micro.loss_mask, share_prefix=self.grpo.share_prefix, groups=groups, carry=carry,
        )
        old = micro.old_logps if micro.old_logps is not None else logps.detach()
        g = self.grpo
        gap: dict[str, Tensor] = {}
        if self.rollout.engine == "vllm":  # every rank logs the same keys, with or without engine log-probs here
            engine = micro.engine_logps if micro.engine_logps is not None else torch.full_like(old, float("nan"))
            trained = micro.loss_mask * (~micro.is_align).float()[:, None]
            tis, gap = engine_correction(old, engine, trained, g.tis_cap)
            w = {**w, "act": w["act"] * tis, "rehearse": w["rehearse"] * tis}
        loss, stats = envace_objective(
            logps, old, micro.ref_logps, micro.advantages, micro.loss_mask, micro.row_role, micro.is_align,
            w["act"], w["rehearse"], w["align"], self.policy_loss,
            LossWeights(g.act_weight, g.rehearse_weight, g.align_weight, g.kl_weight, g.imitate_weight),
            weights_imitate=w["imitate"],
        )
        stats.update(gap)
        for name, role in (("act", Role.ACT), ("rehearse", Role.REHEARSE)):  # rates as [sum, count]: token-weighted
            count = (micro.loss_mask * role_rows(micro, role).float()[:, None]).sum()
            for key in RATE_STATS:
                stats[f"{key}_{name}"] = torch.stack([stats[f"{key}_{name}"] * count, count])
        if entropy is not None:
            for name, role in (("act", Role.ACT), ("rehearse", Role.REHEARSE)):
                mask = micro.loss_mask * role_rows(micro, role).float()[:, None]
                stats[f"entropy_{name}"] = torch.stack([(entropy * mask).sum(), mask.sum()])
        return loss, stats

    def _role_adapter(self, micro: RolloutBatch) -> AbstractContextManager[None]:
        if not self.role_adapters:
            return nullcontext()
        name = self.role_adapters[0] if int(micro.row_role[0]) == int(Role.ACT) else self.role_adapters[1]
        return adapter_context(self.model, name)

