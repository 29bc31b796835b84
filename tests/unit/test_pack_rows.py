"""Micro-batch packing: row cap, padded-token budget, longest-first order, oversize rows alone."""

from __future__ import annotations

import torch

from envace.update import pack_rows


def chunks(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    rows = torch.arange(len(lengths))
    return [c.tolist() for c in pack_rows(rows, lengths, max_rows, max_tokens)]


def test_row_cap_only() -> None:
    assert chunks([9, 8, 7, 6, 5], max_rows=2, max_tokens=0) == [[0, 1], [2, 3], [4]]


def test_token_budget_counts_padding_to_the_longest_row() -> None:
    # budget 20: [9, 8] pads to 2 x 9 = 18 <= 20, adding 7 would pad to 3 x 9 = 27; then [7, 6] = 14, adding 5 = 21.
    assert chunks([9, 8, 7, 6, 5], max_rows=8, max_tokens=20) == [[0, 1], [2, 3], [4]]


def test_a_row_longer_than_the_budget_goes_alone() -> None:
    assert chunks([50, 4, 3], max_rows=8, max_tokens=10) == [[0], [1, 2]]


def test_every_row_exactly_once() -> None:
    lengths = [31, 30, 22, 17, 17, 9, 4, 1]
    flat = [r for c in chunks(lengths, max_rows=3, max_tokens=64) for r in c]
    assert flat == list(range(len(lengths)))


def test_unsorted_rows_pad_to_the_longest_so_far() -> None:
    # token-ordered rows (share_prefix) come in any length order: [4, 9] pads to 2 x 9 = 18 <= 20, adding 3 would
    # pad to 3 x 9 = 27; [3, 6] = 12, adding 5 = 18, adding 2 = 24 > 20
    assert chunks([4, 9, 3, 6, 5, 2], max_rows=8, max_tokens=20) == [[0, 1], [2, 3, 4], [5]]


def test_rows_by_tokens_puts_shared_prefixes_side_by_side() -> None:
    from envace.update import by_tokens

    ids = torch.tensor([[5, 6, 7, 0], [1, 2, 3, 4], [5, 6, 1, 0], [1, 2, 9, 9]])
    lengths = torch.tensor([3, 4, 3, 4])
    assert by_tokens(ids, lengths).tolist() == [1, 3, 2, 0]  # [1,2,3,4] < [1,2,9,9] < [5,6,1] < [5,6,7]


def test_a_shared_prefix_is_costed_once() -> None:
    # three rows of 10 sharing 6 tokens: [r0, r1, r2] costs 6 + 3 x (10 - 6) = 18 <= 20, padded it would be 30
    rows = torch.arange(3)
    assert [c.tolist() for c in pack_rows(rows, [10, 10, 10], 8, 20, shared=[0, 6, 6])] == [[0, 1, 2]]
    # the chunk's prefix is the smallest shared with a neighbour: [r0, r1] = 6 + 2 x 4 = 14; adding r2 (shares 2)
    # costs 2 + 3 x 8 = 26 > 20
    assert [c.tolist() for c in pack_rows(rows, [10, 10, 10], 8, 20, shared=[0, 6, 2])] == [[0, 1], [2]]


def test_shared_prefixes_stop_before_the_first_scored_token_and_the_threshold() -> None:
    from envace.update import shared_prefixes

    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [1, 2, 3, 7, 7, 0], [8, 2, 3, 7, 7, 0]])
    lengths = torch.tensor([6, 6, 5, 5])
    scored = torch.zeros(4, 6)
    scored[:, 5] = 1.0
    scored[1, 3] = 1.0  # row 1's first scored token is at 3: its logit is at 2, so it shares at most 2 tokens
    # row 1 vs 0: common 4, cut to 2 by row 1; row 2 vs 1: common 3, cut to 2; row 3 vs 2: common 0
    assert shared_prefixes(ids, lengths, scored, min_prefix=1) == [0, 2, 2, 0]
    assert shared_prefixes(ids, lengths, scored, min_prefix=3) == [0, 0, 0, 0]  # under the threshold: not shared
