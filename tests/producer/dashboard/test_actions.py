from __future__ import annotations

from typing import cast

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from producer.dashboard.actions import AsyncAdmin
from producer.dashboard.errors import Conflict, NotFoundError
from shared.errors import NotFound
from shared.keys import model_tag
from shared.models import FinishReason, RequestState
from shared.scripts import AsyncScripts
from tests.cluster import LocalCluster
from tests.producer.dashboard.conftest import MODEL, World

TAG = model_tag(MODEL)


def _admin(world: World) -> AsyncAdmin:
    return AsyncAdmin(world.aio, world.keys, world.settings, AsyncScripts(world.aio))


def _dead(world: World, n: int) -> list[str]:
    ids = world.submit(n)
    for claimed in world.claim("w1", *ids):
        world.finish(claimed, FinishReason.ERROR, state="dead")
    return ids


async def test_purge_on_a_redis_cluster_deletes_dead_requests(
    cluster_redis: RedisCluster, redis_cluster: LocalCluster
) -> None:
    aio = AsyncRedisCluster.from_url(redis_cluster.node_url)
    world = World(cast(redis.Redis, cluster_redis), cast(redis.asyncio.Redis, aio))
    ids = _dead(world, 3)
    try:
        assert await _admin(world).purge_dead([TAG], max_requests=10) == 3
    finally:
        await aio.aclose()
    assert not any(cluster_redis.exists(world.keys.request(i), world.keys.stream(i)) for i in ids)
    assert cluster_redis.zcard(world.keys.dead(TAG)) == 0


async def test_cancel_a_queued_request_ends_its_stream(world: World) -> None:
    [rid] = world.submit(1)
    assert await _admin(world).cancel(rid) == "cancelled"
    result = world.client.handle(rid).result(timeout=5)
    assert result.finish_reason is FinishReason.CANCELLED


async def test_cancel_a_running_request_asks_its_worker(world: World) -> None:
    [rid] = world.submit(1)
    world.claim("w1", rid)
    assert await _admin(world).cancel(rid) == "requested"
    assert world.client.handle(rid).status().cancel_requested is True


async def test_cancel_unknown_request(world: World) -> None:
    with pytest.raises(NotFound):
        await _admin(world).cancel(f"{TAG}-{'1' * 24}")


async def test_retry_a_dead_request_queues_it_again(world: World) -> None:
    [rid] = _dead(world, 1)
    await _admin(world).retry(rid)
    status = world.client.handle(rid).status()
    assert (status.state, status.attempts) == (RequestState.QUEUED, 0)


async def test_retry_refuses_a_request_that_is_not_dead(world: World) -> None:
    [rid] = world.submit(1)
    with pytest.raises(Conflict, match="not in the dead-letter set"):
        await _admin(world).retry(rid)


async def test_purge_deletes_dead_requests_up_to_the_limit(world: World) -> None:
    ids = _dead(world, 3)
    assert await _admin(world).purge_dead([TAG], max_requests=2) == 2
    assert world.sync.zcard(world.keys.dead(TAG)) == 1
    assert await _admin(world).purge_dead([TAG], max_requests=10) == 1
    assert not any(world.sync.exists(world.keys.request(rid)) for rid in ids)


async def test_pause_and_resume(world: World) -> None:
    admin = _admin(world)
    await admin.set_paused(TAG, True)
    assert world.sync.exists(world.keys.paused(TAG))
    await admin.set_paused(TAG, False)
    assert not world.sync.exists(world.keys.paused(TAG))
    with pytest.raises(NotFoundError, match="no model has queue tag"):
        await admin.set_paused("ffffffff", True)


async def test_drain_orders_a_live_worker(world: World) -> None:
    world.register_worker("w1")
    await _admin(world).drain("w1")
    assert world.sync.get(world.keys.worker_control("w1")) == b"drain"
    with pytest.raises(NotFoundError, match="not live"):
        await _admin(world).drain("gone")
