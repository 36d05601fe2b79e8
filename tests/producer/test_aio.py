"""The asyncio client against a real redis-server."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from producer.aio import AsyncClient
from producer.embedded import EmbeddedRedis
from shared.errors import RateLimited
from shared.models import FinishReason, RequestState
from shared.settings import Settings
from tests.conftest import serve


async def test_submit_status_cancel_result(redis_server: EmbeddedRedis) -> None:
    connection = redis.asyncio.Redis.from_url(redis_server.url)
    await connection.flushall()
    serve(redis.Redis.from_url(redis_server.url), "SmolLM2-135M-Instruct", "m")
    async with AsyncClient(connection=connection, settings=Settings()) as client:
        first = await client.submit("a", priority="low")
        second = await client.submit(messages=[{"role": "user", "content": "b"}], priority="high")
        assert (await second.position(), await first.position()) == (0, 1)
        assert (await first.status()).state is RequestState.QUEUED
        assert await first.cancel() == "cancelled"
        events = [e async for e in first.stream()]
        assert len(events) == 1
        result = await first.result(timeout=1)
        assert result.finish_reason is FinishReason.CANCELLED
        handles = await client.submit_many([{"model": "m", "prompt": "x"}] * 3)
        assert len({h.id for h in handles}) == 3


async def test_a_client_with_a_key_submits_as_its_tenant_under_its_limits(
    redis_server: EmbeddedRedis,
) -> None:
    connection = redis.asyncio.Redis.from_url(redis_server.url)
    await connection.flushall()
    serve(redis.Redis.from_url(redis_server.url), "m")
    keys = '{"sk-a": {"tenant": "acme", "weight": 2, "requests_per_min": 2}}'
    settings = Settings(api_keys=keys)
    async with AsyncClient(connection=connection, settings=settings, api_key="sk-a") as client:
        handles = [await client.submit("x", model="m") for _ in range(2)]
        with pytest.raises(RateLimited, match="2 requests per minute"):
            await client.submit("x", model="m")
        status = await handles[0].status()
    assert status.tenant == "acme"
