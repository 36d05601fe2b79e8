"""KV cache accounting: a result or None, never a silent overcommit."""

from __future__ import annotations

from shared.models import SamplingParams
from worker.engine.kv_cache import KVCacheManager
from worker.engine.request import EngineRequest, Sequence


def make_seq(num_tokens: int, seq_no: int = 0) -> Sequence:
    request = EngineRequest(f"r{seq_no}", list(range(num_tokens)), SamplingParams())
    return Sequence.from_request(request, seq_no)


def test_allocate_rounds_up_to_blocks_and_hands_out_the_lowest_slot() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4, num_slots=3)
    seq = make_seq(9)
    assert kv_cache.allocate(seq, 9) == 0
    assert seq.num_blocks == 3 and kv_cache.num_free_blocks == 7
    seq.num_computed_tokens = 9
    assert kv_cache.allocate(seq, 3) == 0  # fills block 3: nothing new
    assert kv_cache.num_free_blocks == 7


def test_allocate_returns_none_when_blocks_run_out() -> None:
    kv_cache = KVCacheManager(num_blocks=2, block_size=4, num_slots=3)
    seq = make_seq(9)
    assert not kv_cache.can_allocate(seq, 9)
    assert kv_cache.allocate(seq, 9) is None
    assert kv_cache.num_free_blocks == 2 and seq.slot is None


def test_allocate_returns_none_when_slots_run_out() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4, num_slots=1)
    assert kv_cache.allocate(make_seq(1, 0), 1) == 0
    assert kv_cache.allocate(make_seq(1, 1), 1) is None


def test_free_returns_blocks_and_the_slot() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4, num_slots=2)
    a, b = make_seq(4, 0), make_seq(4, 1)
    kv_cache.allocate(a, 4)
    kv_cache.allocate(b, 4)
    kv_cache.free(a)
    assert kv_cache.num_free_blocks == 9 and a.slot is None and a.num_blocks == 0
    assert kv_cache.allocate(make_seq(4, 2), 4) == 0


def test_compact_moves_the_highest_slots_into_the_lowest_holes() -> None:
    kv_cache = KVCacheManager(num_blocks=20, block_size=4, num_slots=5)
    seqs = [make_seq(4, n) for n in range(5)]
    for seq in seqs:
        kv_cache.allocate(seq, 4)
    kv_cache.free(seqs[0])
    kv_cache.free(seqs[2])
    running = [seqs[1], seqs[3], seqs[4]]
    moves = kv_cache.compact(running)
    assert [(seq.request_id, old, new) for seq, old, new in moves] == [("r4", 4, 0), ("r3", 3, 2)]
    assert sorted(seq.slot for seq in running) == [0, 1, 2]
    assert kv_cache.compact(running) == []
    assert kv_cache.allocate(make_seq(4, 5), 4) == 3
