"""A step's state rows (``worker.engine.models.state``) with a plain recurrence, a running
sum: decode rows and prefill chunks of different sequences in one step each read and
write their own slot only, a chunk carries on from where its sequence's last one ended,
and a row at its sequence's start begins from zeros whatever its slot held."""

from __future__ import annotations

import math

import torch

from tests.worker.engine.test_scheduler import make_seq
from worker.engine.models.state import StateCache, StateStep, scan_rows
from worker.engine.outputs import ScheduledSeq
from worker.engine.step_inputs import StepInputs

NUM_SLOTS = 4
SCRATCH = NUM_SLOTS


def running_sum(
    xs: tuple[torch.Tensor, ...], states: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each row's tokens ``[rows, tokens, 1]`` added up from its state ``[rows, 1]``."""
    (x,) = xs
    (total,) = states
    out = total[:, None] + x.cumsum(dim=1)
    return out, [out[:, -1]]


def cache_holding(values: list[float]) -> StateCache:
    cache = StateCache([[((1,), torch.float32)]], NUM_SLOTS, torch.device("cpu"))
    cache.pools[0][0][:, 0] = torch.tensor(values)
    return cache


def row(tokens: list[int], start_pos: int, num_tokens: int, slot: int) -> ScheduledSeq:
    seq = make_seq(prompt=tokens)
    seq.state_slot, seq.block_table = slot, [0] * 8
    return ScheduledSeq(seq, start_pos, num_tokens, sample=True)


def test_rows_of_one_step_each_advance_their_own_slot() -> None:
    cache = cache_holding([100.0, 5.0, 7.0, math.nan, 0.0])
    scheduled = [
        row([9, 9, 9, 9, 9, 1], 5, 1, slot=2),  # a decode row: 7 + 1
        row([1, 2, 3], 0, 3, slot=0),  # a first chunk: from zeros, not the stale 100
        row([9, 9, 9, 9, 10, 20], 4, 2, slot=1),  # a later chunk: from 5
        row([4], 0, 1, slot=3),  # a one-token prompt, a decode row: from zeros, not NaN
    ]
    inputs = StepInputs.build(scheduled, block_size=16)
    step = cache.step(inputs)
    assert step.decode_index is not None and step.decode_index.tolist() == [0, 6]
    assert [(c.token_start, c.token_end, c.slot, c.fresh) for c in step.chunks] == [
        (1, 4, 0, True),
        (4, 6, 1, False),
    ]
    x = torch.tensor(inputs.token_ids, dtype=torch.float32)[:, None]
    out = scan_rows(step, 0, (x,), running_sum)
    assert out[:, 0].tolist() == [8.0, 1.0, 3.0, 6.0, 15.0, 35.0, 4.0]
    assert cache.pools[0][0][:, 0].tolist() == [6.0, 35.0, 8.0, 4.0, 0.0]


def test_a_step_of_decode_rows_only_runs_them_at_once_in_token_order() -> None:
    cache = cache_holding([1.0, 2.0, 3.0, 4.0, 0.0])
    scheduled = [row([5, 6], 1, 1, slot=3), row([7, 8], 1, 1, slot=0)]
    step = cache.step(StepInputs.build(scheduled, block_size=16))
    assert step.decode_index is None and not step.chunks
    out = scan_rows(step, 0, (torch.tensor([[6.0], [8.0]]),), running_sum)
    assert out[:, 0].tolist() == [10.0, 9.0]
    assert cache.pools[0][0][:, 0].tolist() == [9.0, 2.0, 3.0, 10.0, 0.0]


def test_a_graphs_padding_rows_touch_the_scratch_slot_only() -> None:
    """A captured step's static buffers: two rows padded to four, the padding rows at
    the scratch slot and fresh, so whatever it held stays out of every real row."""
    cache = cache_holding([1.0, 2.0, 3.0, 4.0, math.nan])
    slots = torch.tensor([2, 0, SCRATCH, SCRATCH])
    fresh = torch.tensor([False, False, True, True])
    step = StateStep.decode_only(cache.pools, slots, fresh)
    out = scan_rows(step, 0, (torch.tensor([[1.0], [1.0], [5.0], [5.0]]),), running_sum)
    assert out[:2, 0].tolist() == [4.0, 2.0]
    assert cache.pools[0][0][:SCRATCH, 0].tolist() == [2.0, 2.0, 4.0, 4.0]
