"""collate / RolloutBatch: right padding, masks, per-row fields, row selection and trimming, device moves."""

from __future__ import annotations

import pytest
import torch

from envace.rollout.collate import RolloutBatch, collate, role_rows, trained_length
from envace.types import Role, Sample

PAD = 9
ACT, REH, TOOL, SYS = int(Role.ACT), int(Role.REHEARSE), int(Role.TOOL), int(Role.SYSTEM)


def _samples() -> list[Sample]:
    return [
        # act row, 3 tokens, group 0, episode 0
        Sample([1, 2, 3], [SYS, ACT, ACT], [0, 1, 1], Role.ACT, episode_index=0, group_index=0, reward=1.0),
        # rehearse row, 5 tokens, group 0, episode 0
        Sample([4, 5, 6, 7, 8], [SYS, SYS, REH, REH, REH], [0, 0, 1, 1, 1], Role.REHEARSE, 0, 0, reward=0.5),
        # alignment row (rehearse head), 4 tokens, group 1, no episode
        Sample([10, 11, 12, 13], [SYS, SYS, TOOL, TOOL], [0, 0, 1, 1], Role.REHEARSE, -1, 1, align=True),
        # act row, 2 tokens, group 1, episode 1
        Sample([14, 15], [SYS, ACT], [0, 1], Role.ACT, episode_index=1, group_index=1, reward=-0.25),
    ]


def _batch() -> RolloutBatch:
    return collate(_samples(), [0.7, 0.9, 1.0, 0.7], PAD)


def test_right_padding_and_masks() -> None:
    b = _batch()
    assert b.input_ids.tolist() == [
        [1, 2, 3, PAD, PAD],
        [4, 5, 6, 7, 8],
        [10, 11, 12, 13, PAD],
        [14, 15, PAD, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 0, 0, 0]]
    assert b.input_ids.dtype == torch.long and b.loss_mask.dtype == torch.float32
    assert len(b) == 4


def test_rows_are_cut_after_their_last_trained_token() -> None:
    """An untrained tail (a tool response and template tokens after the last act turn) never reaches the update;
    a row with no trained token keeps its length."""
    tail = Sample([1, 2, 3, 4, 5, 6], [SYS, ACT, ACT, TOOL, TOOL, SYS], [0, 1, 1, 0, 0, 0], Role.ACT, 0, 0)
    untrained = Sample([7, 8, 9], [SYS, SYS, SYS], [0, 0, 0], Role.ACT, 1, 0)
    assert trained_length(tail) == 3 and trained_length(untrained) == 3
    b = collate([tail, untrained], [1.0, 1.0], PAD)
    assert b.input_ids.tolist() == [[1, 2, 3], [7, 8, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert b.loss_mask.tolist() == [[0, 1, 1], [0, 0, 0]]


def test_per_row_fields() -> None:
    b = _batch()
    assert b.row_role.tolist() == [ACT, REH, REH, ACT]
    assert b.is_align.tolist() == [False, False, True, False]
    assert b.rewards.tolist() == [1.0, 0.5, 0.0, -0.25]
    assert b.advantages.tolist() == [0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(b.temperatures, torch.tensor([0.7, 0.9, 1.0, 0.7]))
    assert b.group_ids.tolist() == [0, 0, 1, 1]
    assert b.episode_ids.tolist() == [0, 0, -1, 1]
    assert b.old_logps is None and b.ref_logps is None
    assert b.episodes == [] and b.metrics == {}


def test_role_rows_excludes_alignment_rows() -> None:
    b = _batch()
    assert role_rows(b, Role.ACT).tolist() == [True, False, False, True]
    assert role_rows(b, Role.REHEARSE).tolist() == [False, True, False, False]  # row 2 is an alignment row


def test_rows_trims_to_longest_selected_row_and_keeps_order() -> None:
    b = _batch()
    b.old_logps = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    sub = b.rows(torch.tensor([3, 0]))
    # rows 3 (2 tokens) and 0 (3 tokens): width 3, in the order asked
    assert sub.input_ids.tolist() == [[14, 15, PAD], [1, 2, 3]]
    assert sub.attention_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert sub.loss_mask.tolist() == [[0, 1, 0], [0, 1, 1]]
    assert sub.old_logps is not None and sub.old_logps.tolist() == [[15.0, 16.0, 17.0], [0.0, 1.0, 2.0]]
    assert sub.rewards.tolist() == [-0.25, 1.0]
    assert sub.episode_ids.tolist() == [1, 0]
    assert sub.temperatures.tolist() == pytest.approx([0.7, 0.7])
    assert sub.ref_logps is None
    assert len(b) == 4 and b.input_ids.shape == (4, 5)  # the original is untouched


def test_rows_with_boolean_mask_and_empty_selection() -> None:
    b = _batch()
    sub = b.rows(role_rows(b, Role.REHEARSE))
    assert sub.input_ids.tolist() == [[4, 5, 6, 7, 8]]
    empty = b.rows(torch.zeros(4, dtype=torch.bool))
    assert len(empty) == 0 and empty.input_ids.shape == (0, 0)
    assert len(b.rows(torch.tensor([], dtype=torch.long))) == 0


def test_to_moves_every_tensor_and_keeps_the_rest() -> None:
    b = _batch()
    b.metrics = {"rollout_time_s": 1.5}
    moved = b.to(torch.device("meta"))
    for name in ("input_ids", "attention_mask", "loss_mask", "row_role", "rewards", "temperatures", "episode_ids"):
        assert getattr(moved, name).device.type == "meta", name
    assert moved.old_logps is None
    assert moved.metrics == {"rollout_time_s": 1.5}
    assert b.input_ids.device.type == "cpu"  # a new batch, the original stays


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="temperature"):
        collate(_samples(), [1.0], PAD)
    with pytest.raises(ValueError, match="at least one row"):
        collate([], [], PAD)
    broken = Sample([1, 2], [ACT, ACT], [1], Role.ACT, 0, 0)
    with pytest.raises(ValueError, match="row 0: loss_mask has 1 entries for 2 tokens"):
        collate([broken], [1.0], PAD)
