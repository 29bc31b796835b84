"""``engine_correction``: hand-computed weights and drift statistics (envace.losses.engine_gap)."""

from __future__ import annotations

import math

import pytest
import torch

from envace.losses.engine_gap import engine_correction

NAN = math.nan


def test_weights_and_statistics_by_hand() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    engine = torch.tensor([[-1.5, -1.0, NAN, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is not trained
    weights, stats = engine_correction(old, engine, mask, cap=1.5)
    # log ratios on known trained tokens: 0.5 and -1.0; the third is unknown (NaN), the fourth untrained
    assert weights[0].tolist() == pytest.approx([1.5, math.exp(-1.0), 1.0, 1.0])  # exp(0.5)=1.65 capped at 1.5
    assert stats["engine_gap_logp"].tolist() == pytest.approx([1.5, 2.0])
    kl = (math.exp(0.5) - 1 - 0.5) + (math.exp(-1.0) - 1 + 1.0)
    assert stats["engine_gap_kl"].tolist() == pytest.approx([kl, 2.0])
    assert stats["engine_gap_tis_clipped"].tolist() == [1.0, 2.0]


def test_without_a_cap_it_only_measures() -> None:
    old = torch.tensor([[-1.0, -2.0]])
    engine = torch.tensor([[-3.0, -2.0]])
    weights, stats = engine_correction(old, engine, torch.ones(1, 2), cap=None)
    assert weights.tolist() == [[1.0, 1.0]]
    assert stats["engine_gap_logp"].tolist() == pytest.approx([2.0, 2.0])
    assert stats["engine_gap_tis_clipped"].tolist() == [0.0, 2.0]


def test_an_engine_that_reports_nothing_leaves_the_update_alone() -> None:
    old = torch.tensor([[-1.0, -2.0]])
    weights, stats = engine_correction(old, torch.full((1, 2), NAN), torch.ones(1, 2), cap=2.0)
    assert weights.tolist() == [[1.0, 1.0]]
    assert all(v.tolist() == [0.0, 0.0] for v in stats.values())


def test_the_weights_carry_no_gradient() -> None:
    old = torch.tensor([[-1.0]], requires_grad=True)
    weights, _ = engine_correction(old, torch.tensor([[-1.2]]), torch.ones(1, 1), cap=2.0)
    assert not weights.requires_grad
