"""Decode rows are grouped by context length before attention (worker.engine.cpu_attention)."""

from __future__ import annotations

from worker.engine.cpu_attention import GROUP_SHARE, MAX_DECODE_GROUPS, group_by_length


def test_every_row_lands_in_exactly_one_group() -> None:
    lens = [5, 170, 40, 41, 120, 9, 170, 66, 1]
    groups = group_by_length(lens)
    assert sorted(r for g in groups for r in g) == list(range(len(lens)))


def test_rows_of_similar_length_share_a_group_and_short_ones_are_not_padded_to_long() -> None:
    groups = group_by_length([100, 20, 95, 18, 90, 19])
    assert groups == [[0, 2, 4], [1, 5, 3]]  # longest first; 20 < 0.6 x 100


def test_within_a_group_no_row_is_shorter_than_the_share_of_its_longest() -> None:
    lens = [200, 150, 119, 80, 60, 50, 31, 12, 7, 3, 2, 1]
    for group in group_by_length(lens)[: MAX_DECODE_GROUPS - 1]:
        assert min(lens[r] for r in group) >= GROUP_SHARE * lens[group[0]]


def test_the_number_of_groups_is_bounded_whatever_the_spread() -> None:
    lens = [2**i for i in range(20)]
    groups = group_by_length(lens)
    assert len(groups) == MAX_DECODE_GROUPS
    assert groups[-1][-1] == 0  # the shortest rows go with the last group


def test_no_rows_no_groups() -> None:
    assert group_by_length([]) == []
