"""Micro-batch packing: row cap, padded-token budget, longest-first order, oversize rows alone."""

from __future__ import annotations

import torch

from envace.training.update import pack_rows


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
    # rows in any length order: [4, 9] pads to 2 x 9 = 18 <= 20, adding 3 would
    # pad to 3 x 9 = 27; [3, 6] = 12, adding 5 = 18, adding 2 = 24 > 20
    assert chunks([4, 9, 3, 6, 5, 2], max_rows=8, max_tokens=20) == [[0, 1], [2, 3, 4], [5]]
