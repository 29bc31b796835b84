"""Loss terms: clipped PG with dual clip, aggregators, k3 KL, alignment NLL and the combined objective."""

from __future__ import annotations

import math

import pytest
import torch

from envace.losses import (
    ClippedPolicyLoss,
    ConstantNorm,
    LossWeights,
    SeqMeanTokenMean,
    TokenAggregator,
    TokenMean,
    alignment_nll,
    envace_objective,
    k3_kl,
    role_weights,
)
from envace.types import Role

E = math.e
ACT, REHEARSE = int(Role.ACT), int(Role.REHEARSE)


def _one_token(log_ratio: float, advantage: float, loss: ClippedPolicyLoss) -> tuple[float, dict[str, float]]:
    """Loss of a single masked token whose log-ratio is ``log_ratio``."""
    per_token, stats = loss(torch.tensor([[log_ratio]]), torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1))
    return per_token.item(), {k: v.item() for k, v in stats.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Clipped policy loss
# ---------------------------------------------------------------------------------------------------------------------


def test_positive_advantage_clipped_high() -> None:
    # ratio = e, A = 1: pg1 = -e = -2.718, pg2 = -clamp(e, 0.8, 1.2) = -1.2 -> max = -1.2, clipped branch active
    value, stats = _one_token(1.0, 1.0, ClippedPolicyLoss(clip_high=0.2))
    assert value == pytest.approx(-1.2)
    assert stats["clip_frac"] == 1.0 and stats["dual_clip_frac"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(E)
    assert stats["approx_kl"] == pytest.approx(0.5)  # 0.5 * 1^2


def test_negative_advantage_unclipped_below_dual_clip() -> None:
    # ratio = e, A = -1: pg1 = e, pg2 = 1.2 -> max = e (unclipped branch); dual: min(e, 3) = e (inactive)
    value, stats = _one_token(1.0, -1.0, ClippedPolicyLoss())
    assert value == pytest.approx(E)
    assert stats["clip_frac"] == 0.0 and stats["dual_clip_frac"] == 0.0


def test_negative_advantage_dual_clip_active() -> None:
    # ratio = e^2 = 7.389, A = -1: max(7.389, 1.2) = 7.389; dual: min(7.389, -A * 3) = 3
    value, stats = _one_token(2.0, -1.0, ClippedPolicyLoss(dual_clip=3.0))
    assert value == pytest.approx(3.0)
    assert stats["dual_clip_frac"] == 1.0
    # without dual clip the loss stays e^2
    value, stats = _one_token(2.0, -1.0, ClippedPolicyLoss(dual_clip=None))
    assert value == pytest.approx(E**2)
    assert stats["dual_clip_frac"] == 0.0


def test_low_clip() -> None:
    # ratio = 1/e = 0.368, A = -1: pg1 = 0.368, pg2 = clamp(0.368, 0.8, 1.2) = 0.8 -> 0.8, clipped
    value, stats = _one_token(-1.0, -1.0, ClippedPolicyLoss(clip_low=0.2))
    assert value == pytest.approx(0.8)
    assert stats["clip_frac"] == 1.0
    # A = +1: pg1 = -0.368, pg2 = -0.8 -> -0.368, not clipped
    value, stats = _one_token(-1.0, 1.0, ClippedPolicyLoss(clip_low=0.2))
    assert value == pytest.approx(-1 / E)
    assert stats["clip_frac"] == 0.0


def test_masked_tokens_contribute_nothing() -> None:
    logps = torch.tensor([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    per_token, stats = ClippedPolicyLoss()(logps, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask)
    # only token (0, 1) counts: ratio e, A = 1 -> -1.2; everything else exactly 0
    assert torch.equal(per_token.detach(), torch.tensor([[0.0, -1.2, 0.0], [0.0, 0.0, 0.0]]))
    assert stats["clip_frac"].item() == 1.0  # 1 clipped of 1 masked token
    per_token.sum().backward()
    assert torch.equal(logps.grad, torch.zeros(2, 3))  # the one token is clipped: no gradient either


def test_unclipped_gradient_is_minus_advantage_times_ratio() -> None:
    # ratio = 1 at logps == old: d(-A * ratio)/dlogp = -A * ratio = -2 for A = 2
    logps = torch.zeros(1, 2, requires_grad=True)
    per_token, _ = ClippedPolicyLoss()(logps, torch.zeros(1, 2), torch.tensor([2.0]), torch.tensor([[1.0, 0.0]]))
    per_token.sum().backward()
    assert torch.equal(logps.grad, torch.tensor([[-2.0, 0.0]]))


def test_stats_are_detached_zero_dim() -> None:
    logps = torch.zeros(2, 2, requires_grad=True)
    _, stats = ClippedPolicyLoss()(logps, torch.zeros(2, 2), torch.ones(2), torch.ones(2, 2))
    assert set(stats) == {"clip_frac", "dual_clip_frac", "ratio_mean", "approx_kl"}
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    _, empty = ClippedPolicyLoss()(logps, torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 2))
    assert all(v.item() == 0.0 for v in empty.values())  # empty mask: 0, not NaN


def test_policy_loss_validation() -> None:
    with pytest.raises(ValueError, match="dual_clip"):
        ClippedPolicyLoss(dual_clip=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        ClippedPolicyLoss(clip_low=1.0)
    loss = ClippedPolicyLoss()
    with pytest.raises(ValueError, match="advantages"):
        loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="finite"):
        loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([float("nan")]), torch.ones(1, 3))
    with pytest.raises(ValueError, match="old_logps"):
        loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------------------------------
# Aggregators
# ---------------------------------------------------------------------------------------------------------------------

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
LOSS = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0], [99.0, 99.0, 99.0, 99.0]])


def test_token_mean() -> None:
    # 4 masked tokens -> weight 1/4 each; loss = (1 + 2 + 3 + 4) / 4 = 2.5
    w = TokenMean().weights(MASK)
    torch.testing.assert_close(w, MASK / 4)
    assert (LOSS * w).sum().item() == pytest.approx(2.5)


def test_seq_mean_token_mean() -> None:
    # row counts (3, 1, 0), 2 rows with tokens: row 0 weight 1/(3*2) = 1/6, row 1 weight 1/(1*2) = 1/2
    # loss = ((1 + 2 + 3) / 3 + 4 / 1) / 2 = (2 + 4) / 2 = 3
    w = SeqMeanTokenMean().weights(MASK)
    torch.testing.assert_close(w, MASK * torch.tensor([[1 / 6], [1 / 2], [0.0]]))
    assert (LOSS * w).sum().item() == pytest.approx(3.0)


def test_constant_norm() -> None:
    # constant 4, 2 rows with tokens: weight 1/(4*2) = 1/8; loss = ((1 + 2 + 3) / 4 + 4 / 4) / 2 = (1.5 + 1) / 2 = 1.25
    w = ConstantNorm(4.0).weights(MASK)
    torch.testing.assert_close(w, MASK / 8)
    assert (LOSS * w).sum().item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="constant"):
        ConstantNorm(0.0)


@pytest.mark.parametrize("aggregator", [TokenMean(), SeqMeanTokenMean(), ConstantNorm(8.0)])
def test_empty_mask_gives_zero_weights(aggregator: TokenAggregator) -> None:
    assert torch.equal(aggregator.weights(torch.zeros(2, 3)), torch.zeros(2, 3))


def test_role_weights_selects_rows() -> None:
    # rows 0 and 2 selected: only row 0 has tokens (3) -> 1/3 each on row 0, 0 elsewhere
    w = role_weights(TokenMean(), MASK, torch.tensor([True, False, True]))
    torch.testing.assert_close(w, MASK * torch.tensor([[1 / 3], [0.0], [0.0]]))
    with pytest.raises(ValueError, match="select"):
        role_weights(TokenMean(), MASK, torch.tensor([True, False]))


def _random_batch(n: int, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logps = (-torch.rand(n, t) * 2).requires_grad_(True)
    old_logps = logps.detach() + 0.3 * torch.randn(n, t)
    mask = (torch.rand(n, t) < 0.6).float()
    mask[1] = 0.0  # a row without tokens
    return logps, old_logps, torch.randn(n), mask


@pytest.mark.parametrize("aggregator", [TokenMean(), SeqMeanTokenMean(), ConstantNorm(8.0)])
def test_micro_batch_gradient_invariance(aggregator: TokenAggregator) -> None:
    logps, old_logps, adv, mask = _random_batch(6, 7)
    loss = ClippedPolicyLoss()
    weights = aggregator.weights(mask)  # computed once on the whole minibatch
    full = (loss(logps, old_logps, adv, mask)[0] * weights).sum()
    (grad_full,) = torch.autograd.grad(full, logps)
    grad_micro = torch.zeros_like(logps)
    for rows in (slice(0, 2), slice(2, 6)):
        part = logps.detach()[rows].requires_grad_(True)
        micro = (loss(part, old_logps[rows], adv[rows], mask[rows])[0] * weights[rows]).sum()
        micro.backward()
        grad_micro[rows] = part.grad
    assert grad_full.abs().sum() > 0  # the check is not vacuous
    torch.testing.assert_close(grad_micro, grad_full)


# ---------------------------------------------------------------------------------------------------------------------
# KL and alignment
# ---------------------------------------------------------------------------------------------------------------------


def test_k3_kl_values() -> None:
    logps = torch.tensor([[-1.0, -2.0, -0.5]])
    assert torch.equal(k3_kl(logps, logps.clone()), torch.zeros(1, 3))
    # ref - logp = 1: e^1 - 1 - 1 = 0.718281828; ref - logp = -1: e^-1 + 1 - 1 = 0.367879441
    kl = k3_kl(torch.tensor([[-2.0, -1.0]]), torch.tensor([[-1.0, -2.0]]))
    torch.testing.assert_close(kl, torch.tensor([[E - 2, 1 / E]]))
    # clamped at 20: a log-ratio of 100 gives e^20 - 20 - 1, finite
    big = k3_kl(torch.tensor([[-100.0]]), torch.tensor([[0.0]]))
    assert big.item() == pytest.approx(math.exp(20) - 21, rel=1e-6)
    with pytest.raises(ValueError, match="shape"):
        k3_kl(torch.zeros(1, 2), torch.zeros(1, 3))


def test_alignment_nll_values() -> None:
    logps = torch.tensor([[-0.5, -1.5, -3.0]])
    target = torch.tensor([[1.0, 1.0, 0.0]])
    # -(-0.5) = 0.5, -(-1.5) = 1.5, masked -> 0
    assert torch.equal(alignment_nll(logps, target), torch.tensor([[0.5, 1.5, 0.0]]))
    with pytest.raises(ValueError, match="shape"):
        alignment_nll(logps, torch.ones(1, 2))


# ---------------------------------------------------------------------------------------------------------------------
# Combined objective
# ---------------------------------------------------------------------------------------------------------------------


def _objective_inputs(n: int = 6, t: int = 5) -> dict[str, torch.Tensor]:
    logps, old_logps, adv, mask = _random_batch(n, t)
    mask[0, 1] = mask[2, 0] = 1.0  # row 0 (act) and row 2 (rehearse) surely have tokens
    row_role = torch.tensor([ACT, ACT, REHEARSE, REHEARSE, REHEARSE, ACT])[:n]
    is_align = torch.tensor([False, False, False, True, False, False])[:n]
    adv[3] = float("nan")  # alignment rows carry no advantage
    act = ~is_align & (row_role == ACT)
    rehearse = ~is_align & (row_role == REHEARSE)
    agg = SeqMeanTokenMean()
    return {
        "logps": logps,
        "old_logps": old_logps,
        "ref_logps": logps.detach() + 0.2 * torch.randn(n, t),
        "advantages": adv,
        "mask": mask,
        "row_role": row_role,
        "is_align": is_align,
        "weights_act": role_weights(agg, mask, act),
        "weights_rehearse": role_weights(agg, mask, rehearse),
        "weights_align": role_weights(TokenMean(), mask, is_align),
    }


def test_objective_hand_example() -> None:
    # rows: act (A = 1, 2 tokens), rehearse (A = -2, 1 token), align (logps -0.5, -1.5); ratio 1 everywhere
    logps = torch.tensor([[0.0, -1.0, -1.0], [0.0, -2.0, 0.0], [0.0, -0.5, -1.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    role, align = torch.tensor([ACT, REHEARSE, REHEARSE]), torch.tensor([False, False, True])
    total, stats = envace_objective(
        logps, logps.clone(), None, torch.tensor([1.0, -2.0, float("nan")]), mask, role, align,
        role_weights(TokenMean(), mask, torch.tensor([True, False, False])),
        role_weights(TokenMean(), mask, torch.tensor([False, True, False])),
        role_weights(TokenMean(), mask, align),
        ClippedPolicyLoss(), LossWeights(act=1.0, rehearse=1.0, align=0.5, kl=0.1),
    )  # fmt: skip
    # act: -A * ratio = -1 per token, mean over 2 tokens = -1; rehearse: -(-2) * 1 = 2; align: (0.5 + 1.5) / 2 = 1
    # kl: no reference -> 0; total = 1 * -1 + 1 * 2 + 0.5 * 1 + 0.1 * 0 = 1.5
    assert stats["loss_act"].item() == pytest.approx(-1.0)
    assert stats["loss_rehearse"].item() == pytest.approx(2.0)
    assert stats["loss_align"].item() == pytest.approx(1.0)
    assert stats["kl"].item() == 0.0
    assert total.item() == pytest.approx(1.5)
    assert stats["clip_frac_act"].item() == 0.0 and stats["clip_frac_rehearse"].item() == 0.0


def test_objective_total_is_weighted_sum_of_heads() -> None:
    inputs = _objective_inputs()
    w = LossWeights(act=1.0, rehearse=0.5, align=0.1, kl=0.05)
    total, stats = envace_objective(**inputs, policy_loss=ClippedPolicyLoss(), loss_weights=w)
    expected = w.act * stats["loss_act"] + w.rehearse * stats["loss_rehearse"]
    expected = expected + w.align * stats["loss_align"] + w.kl * stats["kl"]
    torch.testing.assert_close(total.detach(), expected)
    assert stats["kl"].item() > 0 and stats["loss_align"].item() > 0
    assert {"loss", "loss_act", "loss_rehearse", "loss_align", "kl", "clip_frac_act", "clip_frac_rehearse"} <= set(
        stats
    )
    assert torch.isfinite(total)


def test_objective_heads_do_not_see_other_roles() -> None:
    inputs = _objective_inputs()
    policy, weights = ClippedPolicyLoss(), LossWeights()
    _, before = envace_objective(**inputs, policy_loss=policy, loss_weights=weights)
    perturbed = dict(inputs)
    rehearse_rows = torch.tensor([False, False, True, False, True, False])
    perturbed["logps"] = inputs["logps"].detach() + 0.7 * rehearse_rows.float()[:, None]  # only rehearse rows move
    _, after = envace_objective(**perturbed, policy_loss=policy, loss_weights=weights)
    assert after["loss_act"].item() == before["loss_act"].item()
    assert after["kl"].item() != before["kl"].item()  # the perturbation is seen (KL covers rehearse tokens)
    # gradient of the act head is zero on every non-act row
    logps = inputs["logps"]
    total, _ = envace_objective(**inputs, policy_loss=policy, loss_weights=LossWeights(act=1.0, rehearse=0.0))
    (grad,) = torch.autograd.grad(total, logps)
    assert torch.equal(grad[1:5], torch.zeros_like(grad[1:5])) and grad[0].abs().sum() > 0


def test_objective_micro_batch_invariance() -> None:
    inputs = _objective_inputs()
    policy, weights = ClippedPolicyLoss(), LossWeights(act=1.0, rehearse=0.7, align=0.3, kl=0.1)
    total, _ = envace_objective(**inputs, policy_loss=policy, loss_weights=weights)
    (grad_full,) = torch.autograd.grad(total, inputs["logps"])
    grad_micro = torch.zeros_like(grad_full)
    for rows in (slice(0, 3), slice(3, 6)):
        part = {k: v[rows] for k, v in inputs.items()}
        part["logps"] = inputs["logps"].detach()[rows].requires_grad_(True)
        micro, _ = envace_objective(**part, policy_loss=policy, loss_weights=weights)
        micro.backward()
        grad_micro[rows] = part["logps"].grad
    torch.testing.assert_close(grad_micro, grad_full)


def test_objective_shape_errors() -> None:
    inputs = _objective_inputs()
    inputs["weights_align"] = inputs["weights_align"][:, :3]
    with pytest.raises(ValueError, match="weights_align"):
        envace_objective(**inputs, policy_loss=ClippedPolicyLoss(), loss_weights=LossWeights())


def test_objective_imitation_rows_are_their_own_head() -> None:
    # rows: align (rehearse role, logps -0.5, -1.5) and imitation (act role, logps -1, -2, -3); both teacher-forced
    logps = torch.tensor([[-0.5, -1.5, 0.0], [-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    role, forced = torch.tensor([REHEARSE, ACT]), torch.tensor([True, True])
    align_rows, imitate_rows = forced & (role == REHEARSE), forced & (role == ACT)
    none = torch.tensor([False, False])
    total, stats = envace_objective(
        logps, logps.clone(), None, torch.tensor([float("nan")] * 2), mask, role, forced,
        role_weights(TokenMean(), mask, none), role_weights(TokenMean(), mask, none),
        role_weights(TokenMean(), mask, align_rows), ClippedPolicyLoss(),
        LossWeights(act=1.0, rehearse=1.0, align=0.5, imitate=2.0),
        weights_imitate=role_weights(TokenMean(), mask, imitate_rows),
    )  # fmt: skip
    # align: (0.5 + 1.5) / 2 = 1; imitate: (1 + 2 + 3) / 3 = 2; no policy-gradient rows
    # total = 0.5 * 1 + 2.0 * 2 = 4.5
    assert stats["loss_align"].item() == pytest.approx(1.0)
    assert stats["loss_imitate"].item() == pytest.approx(2.0)
    assert stats["loss_act"].item() == 0.0 and stats["loss_rehearse"].item() == 0.0
    assert total.item() == pytest.approx(4.5)
    # without weights_imitate the imitation row trains nothing (and never leaks into the alignment head)
    _, plain = envace_objective(
        logps, logps.clone(), None, torch.tensor([float("nan")] * 2), mask, role, forced,
        role_weights(TokenMean(), mask, none), role_weights(TokenMean(), mask, none),
        role_weights(TokenMean(), mask, align_rows), ClippedPolicyLoss(), LossWeights(align=0.5, imitate=2.0),
    )  # fmt: skip
    assert plain["loss_imitate"].item() == 0.0 and plain["loss_align"].item() == pytest.approx(1.0)
