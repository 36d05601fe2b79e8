"""A reused idempotency key through the Python clients: the typed error, exported."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

import producer
from producer.aio import AsyncClient
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.settings import Settings
from tests.conftest import serve

KEYS = '{"sk-a": {"tenant": "acme", "weight": 2}, "sk-b": {"tenant": "beta"}}'


def test_the_sync_client_and_a_keyed_one_raise_the_typed_error(real_redis: redis.Redis) -> None:
    serve(real_redis, "m")
    settings = Settings(api_keys=KEYS)
    client = Client(connection=real_redis, settings=settings)
    first = client.submit("a", model="m", idempotency_key="k")
    with pytest.raises(producer.IdempotencyKeyReused, match="'k' was already used"):
        client.submit("b", model="m", idempotency_key="k")
    keyed = Client(connection=real_redis, settings=settings, api_key="sk-a")
    mine = keyed.submit("a", model="m", idempotency_key="k")
    assert mine.id != first.id  # its tenant's own key
    assert keyed.submit("a", model="m", idempotency_key="k").id == mine.id
    with pytest.raises(producer.InvalidRequest):  # a kind of InvalidRequest
        keyed.submit("a", model="m", idempotency_key="k", temperature=0)


async def test_the_async_client_raises_the_typed_error(redis_server: EmbeddedRedis) -> None:
    connection = redis.asyncio.Redis.from_url(redis_server.url)
    await connection.flushall()
    serve(redis.Redis.from_url(redis_server.url), "m")
    async with AsyncClient(connection=connection, settings=Settings()) as client:
        first = await client.submit("a", model="m", idempotency_key="k")
        assert (await client.submit("a", model="m", idempotency_key="k")).id == first.id
        with pytest.raises(producer.IdempotencyKeyReused) as refused:
            await client.submit("a", model="m", idempotency_key="k", priority="high")
    assert refused.value.request_id == first.id
