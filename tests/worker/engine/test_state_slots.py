"""A hybrid model's state slots on the scheduler's side (no model): a sequence runs only
with blocks and a slot, gives both back when it finishes or is preempted, and the
memory budget is split between slots and blocks so that it holds whatever runs."""

from __future__ import annotations

import pytest

from shared.models import FinishReason
from tests.worker.engine.test_scheduler import make_seq, plan, run_step
from worker.engine.errors import ModelLoadError
from worker.engine.kv_cache import KVCacheManager
from worker.engine.request import SeqStatus
from worker.engine.scheduler import Scheduler
from worker.engine.state_slots import CacheSizes, split_budget

MIB = 1 << 20


def hybrid_scheduler(num_blocks: int = 100, num_slots: int = 2, **kwargs: int) -> Scheduler:
    kv_cache = KVCacheManager(num_blocks, 4, enable_prefix_caching=True, num_state_slots=num_slots)
    return Scheduler(kv_cache, kwargs.get("max_num_seqs", 8), kwargs.get("budget", 64))


def test_a_sequence_is_admitted_only_with_a_free_slot_and_takes_the_freed_one() -> None:
    scheduler = hybrid_scheduler(num_slots=2)
    a, b, c = make_seq(6, rid="a"), make_seq(6, rid="b"), make_seq(6, rid="c")
    for seq in (a, b, c):
        scheduler.add(seq)
    assert plan(run_step(scheduler)) == [("a", 0, 6, True), ("b", 0, 6, True)]
    assert {a.state_slot, b.state_slot} == {0, 1} and c.state_slot is None
    assert c.status is SeqStatus.WAITING  # blocks were free; the slots were not
    freed = a.state_slot
    scheduler.finish(a, FinishReason.STOP)
    assert a.state_slot is None
    assert plan(run_step(scheduler)) == [("b", 6, 1, True), ("c", 0, 6, True)]
    assert c.state_slot == freed


def test_preemption_frees_the_victims_slot_for_the_sequence_that_needs_room() -> None:
    # Four blocks of 4 tokens: two 6-token prompts fit, until the ninth token of each.
    scheduler = hybrid_scheduler(num_blocks=4, num_slots=2)
    urgent, late = make_seq(6, rid="urgent", priority=90), make_seq(6, rid="late", priority=10)
    scheduler.add(urgent)
    scheduler.add(late)
    outs = [run_step(scheduler) for _ in range(4)]
    assert [[s.request_id for s in out.preempted] for out in outs] == [[], [], [], ["late"]]
    assert late.state_slot is None and late.status is SeqStatus.WAITING
    assert urgent.state_slot is not None
    assert scheduler.kv_cache.state_slots is not None
    assert scheduler.kv_cache.state_slots.num_free == 1


def test_a_hybrid_cache_never_serves_a_prefix_from_cached_blocks() -> None:
    """A cached block holds keys and values, not the state after it."""
    kv_cache = KVCacheManager(100, 4, enable_prefix_caching=True, num_state_slots=4)
    first = make_seq(prompt=list(range(100, 120)))
    assert kv_cache.allocate(first, 20) is not None
    first.num_computed_tokens = 20
    kv_cache.cache_full_blocks(first)
    assert not kv_cache.enable_prefix_caching
    assert kv_cache.cached_prefix(make_seq(prompt=list(range(100, 120)))) == []


def test_without_state_layers_the_budget_is_all_blocks() -> None:
    assert split_budget("m", 64 * MIB, MIB, 0, 80) == CacheSizes(64, 0)


def test_each_sequence_that_may_run_gets_a_slot_where_half_the_budget_holds_them() -> None:
    assert split_budget("m", 64 * MIB, MIB // 2, MIB // 4, 80) == CacheSizes(88, 80)


def test_a_tight_budget_gives_slots_half_of_it_and_blocks_the_rest() -> None:
    # 2 MiB a slot: 16 slots in the first half of 64 MiB, 32 one-MiB blocks after.
    assert split_budget("m", 64 * MIB, MIB, 2 * MIB, 80) == CacheSizes(32, 16)


def test_a_budget_without_room_for_one_state_and_a_block_is_refused() -> None:
    with pytest.raises(ModelLoadError) as refused:
        split_budget("tiny-hybrid", 8 * MIB, MIB, 8 * MIB, 80)
    message = str(refused.value)
    assert message.startswith("model tiny-hybrid:") and "--kv-cache-mib" in message
