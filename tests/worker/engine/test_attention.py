"""Attention on the CPU (worker.engine.cpu_attention): decode rows grouped by context
length, and a step's attention against attention written out row by row."""

from __future__ import annotations

import pytest
import torch

from worker.engine.attention import AttentionSpec
from worker.engine.cpu_attention import (
    GROUP_SHARE,
    MAX_DECODE_GROUPS,
    CpuBackend,
    CpuStep,
    group_by_length,
)
from worker.engine.step_inputs import StepInputs


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


# One step's attention on the CPU against attention written out row by row.

BLOCK_SIZE, NUM_BLOCKS, KV_HEADS, HEADS, HEAD_DIM = 4, 40, 2, 4, 8
NULL_SLOT = (NUM_BLOCKS - 1) * BLOCK_SIZE  # the last block is the always-zero one


def _attend(lens: list[int], spec: AttentionSpec) -> tuple[CpuStep, torch.Tensor, torch.Tensor]:
    """A step of one decode row per context length in ``lens`` over a random cache, each
    row's blocks drawn from a shuffled pool: the backend's step, what its attention gave,
    and attention written out row by row."""
    gen = torch.Generator().manual_seed(len(lens))
    shape = (NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    k_cache[NULL_SLOT:], v_cache[NULL_SLOT:] = 0, 0
    free = torch.randperm(NUM_BLOCKS - 1, generator=gen).tolist()
    inputs = StepInputs()
    for row, length in enumerate(lens):
        table = [free.pop() for _ in range(-(-length // BLOCK_SIZE))]
        last = length - 1
        inputs.tables.append(table)
        inputs.row_starts.append(row)
        inputs.row_start_pos.append(last)
        inputs.row_num_tokens.append(1)
        inputs.slot_mapping.append(table[last // BLOCK_SIZE] * BLOCK_SIZE + last % BLOCK_SIZE)
    q = torch.randn(len(lens), HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(len(lens), KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(len(lens), KV_HEADS, HEAD_DIM, generator=gen)
    keys_after, values_after = k_cache.clone(), v_cache.clone()
    keys_after[inputs.slot_mapping], values_after[inputs.slot_mapping] = k, v
    expected = []
    for row, length in enumerate(lens):
        first = 0 if spec.window is None else max(0, length - spec.window)
        table = inputs.tables[row]
        slots = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(first, length)]
        group = HEADS // KV_HEADS
        keys = keys_after[slots].repeat_interleave(group, dim=1)  # [context, heads, dim]
        values = values_after[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,chd->hc", q[row], keys) * spec.scale
        if spec.softcap is not None:
            scores = torch.tanh(scores / spec.softcap) * spec.softcap
        expected.append(torch.einsum("hc,chd->hd", scores.softmax(-1), values))
    windows: set[int | None] = set() if spec.window is None else {spec.window}
    step = CpuBackend([k_cache], [v_cache], BLOCK_SIZE, NULL_SLOT, windows).step(inputs)
    return step, step.attend(0, q, k, v, spec), torch.stack(expected)


PLAIN = AttentionSpec(scale=HEAD_DIM**-0.5)
SOFTCAPPED = AttentionSpec(scale=HEAD_DIM**-0.5, softcap=2.0)


@pytest.mark.parametrize("spec", [PLAIN, SOFTCAPPED], ids=["sdpa", "softcap"])
def test_one_decode_row_attends_its_whole_context_with_no_mask(spec: AttentionSpec) -> None:
    step, got, expected = _attend([23], spec)
    assert step.decode_groups[0].contexts[None].mask is None  # nothing padded
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", [PLAIN, SOFTCAPPED], ids=["sdpa", "softcap"])
def test_rows_of_one_group_come_back_in_their_own_places(spec: AttentionSpec) -> None:
    # One group (every length within the share of the longest), not longest first:
    # each row's output must land on its own token, its padding masked.
    step, got, expected = _attend([30, 34, 31, 34], spec)
    assert len(step.decode_groups) == 1 and not step.prefills
    assert step.decode_groups[0].contexts[None].mask is not None
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_rows_of_equal_length_need_no_mask() -> None:
    step, got, expected = _attend([17, 17, 17], PLAIN)
    assert step.decode_groups[0].contexts[None].mask is None
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_rows_in_several_groups_each_land_on_their_own_token() -> None:
    step, got, expected = _attend([3, 40, 9, 38, 20], PLAIN)
    assert len(step.decode_groups) > 1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_sliding_window_reads_only_its_window() -> None:
    spec = AttentionSpec(scale=HEAD_DIM**-0.5, window=6)
    step, got, expected = _attend([25, 27], spec)
    assert step.decode_groups[0].contexts[6].mask is None  # both windows are 6 wide
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
