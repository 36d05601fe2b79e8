"""Stored responses on a real redis-server and a real Redis Cluster: kept in the request's
own hash (one slot), read with its state and stream in one round trip, the first record
standing, another tenant's answering 404, and nothing left behind for an expired one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from producer.openai.errors import ApiError
from producer.openai.tools import plan_tools
from producer.responses import store
from producer.responses.record import StoredResponse
from shared.connection import connect_async
from shared.keys import Keys, new_request_id
from shared.models import FinalEvent, FinishReason, RequestState, TokenEvent, dumps

KEYS = Keys()


@pytest.fixture(params=["redis-server", "redis-cluster"])
async def connection(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    if request.param == "redis-cluster":
        request.getfixturevalue("cluster_redis")  # flushed
        url = request.getfixturevalue("redis_cluster").url
    else:
        url = request.getfixturevalue("redis_server").url
    r = connect_async(url)
    if request.param == "redis-server":
        await r.flushall()
    yield r
    await r.aclose()


def record(request_id: str, instructions: str = "first") -> StoredResponse:
    base = StoredResponse(model="m", input=[], instructions=instructions,
                          tool_plan=plan_tools(None, None).to_dict())  # fmt: skip
    return base.stored(request_id, 1.0)


async def a_request(connection: redis.asyncio.Redis, tenant: str = "acme") -> str:
    request_id = new_request_id("m")
    await connection.hset(KEYS.request(request_id), mapping={"state": "running", "tenant": tenant})
    return request_id


async def test_a_record_is_read_with_its_state_and_stream(connection: redis.asyncio.Redis) -> None:
    request_id = await a_request(connection)
    stored = await store.save(connection, KEYS, record(request_id))
    again = await store.save(connection, KEYS, record(request_id, "second"))
    assert again == stored and again.instructions == "first"  # a repeated key: the first stands
    stream = KEYS.stream(request_id)
    await connection.xadd(stream, {"e": TokenEvent(index=0, token_ids=(1,), text="hi").wire()})
    await connection.xadd(stream, {"e": dumps(FinalEvent(finish_reason=FinishReason.STOP))})
    view = await store.read(connection, KEYS, request_id, "acme")
    assert (view.record, view.state) == (stored, RequestState.RUNNING)
    assert [e.text for e in view.entries] == ["hi", ""] and view.entries[-1].is_final
    assert view.last_id == view.entries[-1].id


async def test_another_tenants_or_a_deleted_response_is_not_found(
    connection: redis.asyncio.Redis,
) -> None:
    request_id = await a_request(connection)
    await store.save(connection, KEYS, record(request_id))
    assert (await store.read(connection, KEYS, request_id, None)).record.request_id == request_id
    with pytest.raises(ApiError) as raised:
        await store.read(connection, KEYS, request_id, "beta")
    assert raised.value.status == 404
    await store.delete(connection, KEYS, request_id)
    with pytest.raises(ApiError, match="does not exist"):
        await store.read(connection, KEYS, request_id, "acme")
    assert (
        await connection.hget(KEYS.request(request_id), "state") == b"running"
    )  # the request stays


async def test_saving_for_a_request_that_expired_leaves_nothing(
    connection: redis.asyncio.Redis,
) -> None:
    request_id = new_request_id("m")  # its hash has gone
    with pytest.raises(ApiError):
        await store.save(connection, KEYS, record(request_id))
    assert not await connection.exists(KEYS.request(request_id))
