"""The KV cache's warm fingerprints: a request's prefix fingerprint is warm while every
full block up to its cut is cached, and stops being warm when one is evicted."""

from __future__ import annotations

import itertools

from shared.models import SamplingParams
from tests.worker.engine.test_kv_cache import admit
from worker.engine.kv_cache import KVCacheManager
from worker.engine.request import EngineRequest, Sequence

_numbers = itertools.count()


def seq_with_cuts(tokens: list[int], cuts: tuple[tuple[str, int], ...]) -> Sequence:
    n = next(_numbers)
    request = EngineRequest(f"f{n}", tokens, SamplingParams(), prefix_cuts=cuts)
    return Sequence.from_request(request, n)


def test_a_fingerprint_is_warm_while_its_blocks_are_cached() -> None:
    kv_cache = KVCacheManager(num_blocks=6, block_size=4)
    system = list(range(100, 108))  # two blocks
    first = seq_with_cuts([*system, 1, 2, 3], (("sys", 8), ("whole", 11)))
    admit(kv_cache, first)
    assert kv_cache.warm_fingerprints(10) == ["whole", "sys"]
    kv_cache.free(first)
    assert kv_cache.warm_fingerprints(10) == ["whole", "sys"]  # freed, still cached
    # Another prompt takes every block: the cached ones are evicted, and go cold.
    other = seq_with_cuts(list(range(500, 524)), (("other", 16),))
    admit(kv_cache, other)
    assert kv_cache.warm_fingerprints(10) == ["other"]


def test_a_hit_makes_a_fingerprint_the_newest_and_the_limit_keeps_the_newest() -> None:
    kv_cache = KVCacheManager(num_blocks=20, block_size=4)
    a = seq_with_cuts([*range(100, 108), 1], (("a", 8),))
    b = seq_with_cuts([*range(200, 208), 1], (("b", 8),))
    for seq in (a, b):
        admit(kv_cache, seq)
        kv_cache.free(seq)
    again = seq_with_cuts([*range(100, 108), 7, 7, 7, 7, 7], (("a", 8),))
    assert len(admit(kv_cache, again)) == 2  # a hit on a's blocks
    assert kv_cache.warm_fingerprints(10) == ["a", "b"]
    assert kv_cache.warm_fingerprints(1) == ["a"]


def test_a_cut_shorter_than_a_block_is_not_tracked() -> None:
    kv_cache = KVCacheManager(num_blocks=4, block_size=4)
    admit(kv_cache, seq_with_cuts([1, 2, 3, 4, 5, 6], (("tiny", 3),)))
    assert kv_cache.warm_fingerprints(10) == []
