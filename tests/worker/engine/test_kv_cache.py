"""The block manager: a result or None, never a silent overcommit; prefix caching
that shares blocks by reference count and reuses freed ones least recently used first."""

from __future__ import annotations

import itertools

from shared.models import SamplingParams
from worker.engine.kv_cache import KVCacheManager
from worker.engine.request import EngineRequest, LoraRef, Sequence

_seq_numbers = itertools.count()


def make_seq(tokens: list[int] | int) -> Sequence:
    token_ids = list(range(100, 100 + tokens)) if isinstance(tokens, int) else tokens
    seq_no = next(_seq_numbers)
    request = EngineRequest(f"r{seq_no}", token_ids, SamplingParams())
    return Sequence.from_request(request, seq_no)


def admit(kv_cache: KVCacheManager, seq: Sequence) -> list[int]:
    """What the scheduler does: take the cached prefix, allocate the rest, compute
    it all (as one step) and cache the blocks that became full. Returns the hits."""
    cached = kv_cache.cached_prefix(seq)
    num_cached_tokens = len(cached) * kv_cache.block_size
    table = kv_cache.allocate(seq, seq.num_tokens - num_cached_tokens, cached)
    assert table is not None
    seq.num_computed_tokens = seq.num_tokens
    kv_cache.cache_full_blocks(seq)
    return cached


def test_allocate_rounds_up_to_blocks_and_extends_the_block_table() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4)
    seq = make_seq(9)
    assert kv_cache.allocate(seq, 9) == [0, 1, 2]
    assert kv_cache.num_free_blocks == 7
    seq.num_computed_tokens = 9
    assert kv_cache.allocate(seq, 3) == [0, 1, 2]  # fills block 3: nothing new
    assert kv_cache.allocate(seq, 4) == [0, 1, 2, 3]
    assert kv_cache.num_free_blocks == 6


def test_allocate_returns_none_and_takes_nothing_when_blocks_run_out() -> None:
    kv_cache = KVCacheManager(num_blocks=2, block_size=4)
    seq = make_seq(9)
    assert not kv_cache.can_allocate(seq, 9)
    assert kv_cache.allocate(seq, 9) is None
    assert kv_cache.num_free_blocks == 2 and seq.block_table == []


def test_free_returns_every_block_and_usage_follows() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4)
    a, b = make_seq(8), make_seq(4)
    kv_cache.allocate(a, 8)
    kv_cache.allocate(b, 4)
    assert kv_cache.usage == 0.3
    kv_cache.free(a)
    assert kv_cache.num_free_blocks == 9 and a.block_table == []
    assert kv_cache.usage == 0.1


def test_a_shared_prefix_is_computed_once_and_shared_by_reference() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4)
    prefix = list(range(10))
    first = make_seq([*prefix, 50, 51])
    assert admit(kv_cache, first) == []
    second = make_seq([*prefix, 60])
    # Two full blocks of the prefix hit; the third differs at token 10.
    assert admit(kv_cache, second) == first.block_table[:2]
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]
    assert [kv_cache.ref_counts[b] for b in first.block_table] == [2, 2, 1]
    assert (kv_cache.num_queried_tokens, kv_cache.num_hit_tokens) == (12 + 11, 8)


def test_a_different_earlier_token_changes_every_later_block() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4)
    admit(kv_cache, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Same second block, different first: the second block's digest differs too.
    assert kv_cache.cached_prefix(make_seq([0, 2, 3, 4, 5, 6, 7, 8, 9])) == []


def test_one_token_is_always_left_to_compute() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4)
    first = make_seq(8)
    admit(kv_cache, first)
    # All 8 tokens are cached, but the last must be computed for the logits: the
    # second block is computed again (into a block of its own).
    assert kv_cache.cached_prefix(make_seq(8)) == first.block_table[:1]
    assert kv_cache.cached_prefix(make_seq(9)) == first.block_table


def test_blocks_of_a_finished_request_stay_cached_until_the_pool_needs_them() -> None:
    kv_cache = KVCacheManager(num_blocks=4, block_size=4)
    finished = make_seq(9)
    admit(kv_cache, finished)
    table = list(finished.block_table)
    kv_cache.free(finished)
    assert kv_cache.num_free_blocks == 4
    assert admit(kv_cache, make_seq(9)) == table[:2]


def test_reuse_takes_uncached_blocks_first_then_the_least_recently_freed() -> None:
    kv_cache = KVCacheManager(num_blocks=4, block_size=2)
    old, new = make_seq([1, 2, 3]), make_seq([7, 8, 9])
    admit(kv_cache, old)  # block 0 full and cached, block 1 partial
    admit(kv_cache, new)  # block 2 cached, block 3 partial
    kv_cache.free(old)
    kv_cache.free(new)
    # Partial blocks go first; then old's cached block, freed before new's.
    taker = make_seq(6)
    assert kv_cache.allocate(taker, 6) == [3, 1, 0]
    assert kv_cache.cached_prefix(make_seq([1, 2, 3])) == []
    assert kv_cache.cached_prefix(make_seq([7, 8, 9])) == [2]


def test_a_hit_takes_a_freed_cached_block_out_of_the_free_pool() -> None:
    kv_cache = KVCacheManager(num_blocks=3, block_size=2)
    done = make_seq([1, 2, 3, 4, 5])
    admit(kv_cache, done)
    full_blocks = done.block_table[:2]
    kv_cache.free(done)
    reader = make_seq([1, 2, 3, 4, 6])
    assert admit(kv_cache, reader) == full_blocks
    assert kv_cache.num_free_blocks == 0
    # With every block held, nothing is evicted, and a newcomer does not fit.
    assert kv_cache.allocate(make_seq(2), 2) is None
    assert kv_cache.cached_prefix(make_seq([1, 2, 3, 4, 9])) == reader.block_table[:2]


def test_a_block_read_by_a_running_request_is_never_handed_out() -> None:
    kv_cache = KVCacheManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    admit(kv_cache, a)
    b = make_seq([1, 2, 3, 4, 6])
    admit(kv_cache, b)
    shared = a.block_table[:2]
    kv_cache.free(a)  # b still reads the shared blocks
    assert [kv_cache.ref_counts[block] for block in shared] == [1, 1]
    taken = kv_cache.allocate(make_seq(2), 2)
    assert taken is not None and not set(taken) & set(shared)
    assert kv_cache.allocate(make_seq(2), 2) is None


def test_a_prefix_shared_by_running_and_finished_requests() -> None:
    kv_cache = KVCacheManager(num_blocks=12, block_size=4)
    system = list(range(8))
    seqs = [make_seq([*system, 40 + n, 41 + n, 42 + n]) for n in range(4)]
    admit(kv_cache, seqs[0])
    for seq in seqs[1:]:
        assert admit(kv_cache, seq) == seqs[0].block_table[:2]
    kv_cache.free(seqs[0])
    kv_cache.free(seqs[1])
    shared = seqs[2].block_table[:2]
    assert [kv_cache.ref_counts[block] for block in shared] == [2, 2]
    late = make_seq([*system, 99])
    assert admit(kv_cache, late) == shared
    for seq in (seqs[2], seqs[3], late):
        kv_cache.free(seq)
    assert kv_cache.num_free_blocks == 12
    assert kv_cache.cached_prefix(make_seq([*system, 1])) == shared


def test_a_preempted_request_takes_its_own_blocks_back_from_the_cache() -> None:
    kv_cache = KVCacheManager(num_blocks=8, block_size=4)
    seq = make_seq(10)
    admit(kv_cache, seq)
    seq.token_ids.append(7)  # sampled, then preempted before its next step
    kv_cache.free(seq)
    seq.num_computed_tokens = 0
    cached = kv_cache.cached_prefix(seq)
    assert len(cached) == 2
    assert kv_cache.allocate(seq, seq.num_tokens - 8, cached) is not None
    assert seq.block_table[:2] == cached


def test_without_prefix_caching_nothing_is_shared_or_counted() -> None:
    kv_cache = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    admit(kv_cache, make_seq(9))
    assert kv_cache.cached_prefix(make_seq(9)) == []
    assert (kv_cache.num_queried_tokens, kv_cache.num_hit_tokens) == (0, 0)


def test_the_same_prompt_under_another_adapter_shares_no_blocks() -> None:
    kv_cache = KVCacheManager(num_blocks=20, block_size=4)
    tokens = list(range(100, 113))

    def with_lora(name: str | None) -> Sequence:
        seq = make_seq(tokens)
        seq.request.lora = None if name is None else LoraRef(name, f"/adapters/{name}")
        return seq

    admit(kv_cache, with_lora("poet"))
    assert admit(kv_cache, with_lora(None)) == []
    assert admit(kv_cache, with_lora("pirate")) == []
    assert len(admit(kv_cache, with_lora("poet"))) == 3  # its own adapter's blocks
    assert len(admit(kv_cache, with_lora(None))) == 3
