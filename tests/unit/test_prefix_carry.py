"""A shared prefix carried across micro-batches (``PrefixCarry``): computed once, its gradient that of one pass.

Tolerance: the tiny policy in float32. Reading the prefix in parts changes only how sums are ordered and blocked: the
rows' suffix matrix products run on 2 or 1 rows instead of 4, and the prefix's gradient is the sum of three parts'
(accumulated in its detached copies) instead of one. Each such sum differs by a few float32 ulps per term
(eps = 1.2e-7) of the sum of their magnitudes, which for an entry made of opposite terms can be as large as the
tensor's largest entry: so every entry is allowed ``1e-5`` of the largest entry of its tensor (measured: at most
6e-7 absolute, under 1e-6 of the largest), an order of magnitude of margin, while a lost or doubled part of the
prefix's gradient moves the gradients by a third or more.
"""

from __future__ import annotations

import pytest
import torch
from helpers import counting_prefix_passes, shared_rows
from torch import Tensor

from envace.policy import TinyPolicy
from envace.policy.checkpointing import checkpoint_layers
from envace.policy.logprobs import PrefixCarry, token_logps
from envace.rollout.collate import RolloutBatch
from envace.training.update import MicroBatch, computed_tokens, micro_batches, pack_groups, prefix_carry
from envace.types import Role

RTOL, ATOL = 1e-5, 1e-7


def _close(b: Tensor, a: Tensor) -> None:
    torch.testing.assert_close(b, a, rtol=RTOL, atol=RTOL * float(a.abs().max()))
PREFIX = 40
PARTS = [[0, 1], [2], [3]]


def _rows() -> tuple[Tensor, Tensor, Tensor]:
    """Four right-padded rows sharing a 40-token prefix, scored from token 42 on."""
    return shared_rows(PREFIX, [10, 25, 7, 18], first_scored=PREFIX + 2)


def _model(mode: str | None) -> torch.nn.Module:
    torch.manual_seed(0)
    model, _ = TinyPolicy(hidden=64, layers=4).build()
    if mode is not None:
        checkpoint_layers(model, 1.0, mode)
    return model.train()


def _grads(model: torch.nn.Module) -> list[Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", [None, "full", "selective", "light"])
def test_a_carried_prefix_is_computed_once_and_gives_the_one_pass_values(tiny_tokenizer, mode) -> None:
    ids, mask, scored = _rows()
    model = _model(mode)
    whole, _ = token_logps(model, ids, mask, positions=scored, share_prefix=8)
    whole.sum().backward()
    whole_grads = _grads(model)

    model = _model(mode)
    carry = PrefixCarry({tuple(ids[0, :PREFIX].tolist()): len(PARTS)})
    calls, counting = counting_prefix_passes()
    parts = []
    with counting:
        for rows in PARTS:
            logps, _ = token_logps(model, ids[rows], mask[rows], positions=scored[rows],
                                   groups=[(list(range(len(rows))), PREFIX)], carry=carry)
            term = carry.term()
            assert (term is None) == (rows != PARTS[-1])  # the last reader releases the prefix
            loss = logps.sum() if term is None else logps.sum() + term
            assert term is None or float(term.detach()) == 0.0  # a gradient, not a value
            loss.backward()
            parts.append(logps.detach())
    carry.check_done()
    assert calls == [PREFIX]  # one prefix pass for the three micro-batches
    torch.testing.assert_close(torch.cat([p[:, : whole.shape[1]] for p in parts]), whole.detach(), rtol=RTOL,
                               atol=ATOL)
    for a, b in zip(whole_grads, _grads(model)):
        _close(b, a)


def test_without_a_gradient_the_readers_share_the_states(tiny_tokenizer) -> None:
    ids, mask, scored = _rows()
    model = _model(None).eval()
    with torch.no_grad():
        whole, _ = token_logps(model, ids, mask, positions=scored, share_prefix=8)
        carry = PrefixCarry({tuple(ids[0, :PREFIX].tolist()): len(PARTS)})
        parts = [token_logps(model, ids[r], mask[r], positions=scored[r], groups=[(list(range(len(r))), PREFIX)],
                             carry=carry)[0] for r in PARTS]
    carry.check_done()
    assert carry.term() is None
    torch.testing.assert_close(torch.cat([p[:, : whole.shape[1]] for p in parts]), whole, rtol=RTOL, atol=ATOL)


def test_a_prefix_read_fewer_times_than_planned_is_an_error(tiny_tokenizer) -> None:
    ids, mask, scored = _rows()
    model = _model(None)
    carry = PrefixCarry({tuple(ids[0, :PREFIX].tolist()): 3})
    token_logps(model, ids[:2], mask[:2], positions=scored[:2], groups=[([0, 1], PREFIX)], carry=carry)
    with pytest.raises(RuntimeError, match="not read as often as planned"):
        carry.check_done()


def test_a_gradient_scaler_is_not_applied_twice(tiny_tokenizer) -> None:
    """Under a float16 ``GradScaler`` every backward is of the scaled loss: the leaves' gradient carries the scale
    already, so the term that hands it on is divided by it (scale 1024, a power of 2: exact)."""
    ids, mask, scored = _rows()
    results = []
    for scale in (1.0, 1024.0):
        model = _model(None)
        carry = PrefixCarry({tuple(ids[0, :PREFIX].tolist()): len(PARTS)}, scale=scale)
        for rows in PARTS:
            logps, _ = token_logps(model, ids[rows], mask[rows], positions=scored[rows],
                                   groups=[(list(range(len(rows))), PREFIX)], carry=carry)
            term = carry.term()
            ((logps.sum() if term is None else logps.sum() + term) * scale).backward()
        results.append([g / scale for g in _grads(model)])
    for a, b in zip(*results):
        _close(b, a)


def test_pack_groups_splits_a_group_that_overflows_and_keeps_its_prefix() -> None:
    # four rows of 10 sharing 6 tokens, budget 16: [r0, r1] costs 6 + 2 x 4 = 14; adding r2 would cost 18
    assert pack_groups([([0, 1, 2, 3], 6)], [10] * 4, 8, 16) == [[([0, 1], 6)], [([2, 3], 6)]]
    # then a plain group of rows 7 and 5 long: 14 + 7 = 21 > 20 closes the chunk; [7, 5] pads to 2 x 7 = 14
    assert pack_groups([([0, 1, 2], 6), ([3, 4], 0)], [10, 10, 10, 5, 7], 8, 20) == [[([0, 1, 2], 6)],
                                                                                     [([4, 3], 0)]]
    # small groups share a chunk, each costed on its own: 6 + 2 x 2 = 10, then 3 + 2 x 3 = 9; 19 <= 20
    assert pack_groups([([0, 1], 6), ([2, 3], 3)], [8, 8, 6, 6], 8, 20) == [[([0, 1], 6), ([2, 3], 3)]]
    # a row longer than the budget goes alone; the row cap closes a chunk too
    assert pack_groups([([0, 1, 2], 0)], [50, 4, 3], 8, 10) == [[([0], 0)], [([1, 2], 0)]]
    assert pack_groups([([0, 1, 2], 2)], [5, 5, 5], 2, 0) == [[([0, 1], 2)], [([2], 2)]]


def test_computed_tokens_counts_a_shared_prefix_once_and_pads_the_suffixes() -> None:
    lengths = [10, 9, 12, 5, 7]
    # rows 2 and 0 share 6 tokens (6 + 2 x (12 - 6) = 18), rows 3 and 4 are plain (2 x 7 = 14): 32
    micro = MicroBatch(torch.tensor([2, 0, 3, 4]), [([0, 1], 6), ([2, 3], 0)])
    assert computed_tokens(micro, lengths) == 32
    # without planned groups, every row is padded to the longest: 3 x 12
    assert computed_tokens(MicroBatch(torch.tensor([1, 2, 3])), lengths) == 36


def test_micro_batches_plan_one_prefix_per_group_and_the_carry_counts_its_readers() -> None:
    ids, mask, scored = _rows()
    batch = RolloutBatch(
        input_ids=ids, attention_mask=mask, loss_mask=scored, row_role=torch.full((4,), int(Role.ACT)),
        is_align=torch.zeros(4, dtype=torch.bool), rewards=torch.zeros(4), advantages=torch.zeros(4),
        temperatures=torch.ones(4), group_ids=torch.zeros(4, dtype=torch.long), episode_ids=torch.arange(4),
    )
    plan = list(micro_batches(batch, torch.arange(4), 64, 100, share_prefix=8))
    # the group's cost: 40 + 4 x 25 = 140 > 100, so it splits; every part keeps the step's prefix of 40
    assert len(plan) == 2 and sorted(torch.cat([m.rows for m in plan]).tolist()) == [0, 1, 2, 3]
    assert [prefix for m in plan for _, prefix in m.groups] == [PREFIX, PREFIX]
    for micro in plan:
        lengths = mask[micro.rows].sum(-1)
        assert PREFIX + len(micro.rows) * (int(lengths.max()) - PREFIX) <= 100
    carry = prefix_carry(batch, plan)
    assert carry is not None and carry._left == {tuple(ids[0, :PREFIX].tolist()): 2}
    assert prefix_carry(batch, list(micro_batches(batch, torch.arange(4), 64, 0, share_prefix=8))) is None
