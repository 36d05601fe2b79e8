from __future__ import annotations

import time

import redis.asyncio

from producer.embedded import EmbeddedRedis
from producer.gateway.registry import ModelRegistry
from shared.keys import Keys


async def test_live_models_come_from_workers_whose_hash_still_exists(
    redis_server: EmbeddedRedis,
) -> None:
    r = redis.asyncio.Redis.from_url(redis_server.url)
    await r.flushall()
    keys, now = Keys(), time.time()
    await r.zadd(keys.workers(), {"w1": now, "w2": now - 5, "w3": now, "gone": now - 60})
    for worker, model in (("w1", "a"), ("w2", "a"), ("w3", "b")):
        await r.hset(keys.worker(worker), mapping={"model": model, "state": "serving"})
    live = await ModelRegistry(r, keys, cache_s=0).live()
    await r.aclose()
    assert sorted(live) == ["a", "b"]
    assert (live["a"].num_workers, live["a"].created_s) == (2, int(now - 5))


async def test_a_models_embedding_size_is_the_smallest_its_workers_report(
    redis_server: EmbeddedRedis,
) -> None:
    r = redis.asyncio.Redis.from_url(redis_server.url)
    await r.flushall()
    keys, now = Keys(), time.time()
    await r.zadd(keys.workers(), {"w1": now, "w2": now, "w3": now, "w4": now})
    sizes = (("w1", "a", "576"), ("w2", "a", None), ("w3", "a", "512"), ("w4", "b", None))
    for worker, model, size in sizes:
        await r.hset(keys.worker(worker), "model", model)
        if size is not None:
            await r.hset(keys.worker(worker), "embedding_size", size)
    live = await ModelRegistry(r, keys, cache_s=0).live()
    await r.aclose()
    assert (live["a"].num_workers, live["a"].embedding_size) == (3, 512)
    assert live["b"].embedding_size is None
