"""The stream hub against a real redis-server (one blocking XREAD for many streams) and
a real Redis Cluster (one pipelined round per node)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest
import redis
import redis.asyncio

from producer.embedded import EmbeddedRedis
from producer.gateway.hub import StreamHub, gateway_hub, parse_cursor, parse_gateway_entry
from producer.streams.aio import AsyncHub
from producer.streams.aio_sources import AsyncBlockingSource, own_reader
from producer.streams.entries import Entry
from producer.streams.starts import lifecycle_starts
from shared.connection import connect_async
from shared.keys import Keys, new_request_id
from shared.models import FinalEvent, FinishReason, TokenEvent, dumps

BACKENDS = ["redis-server", "redis-cluster"]


@dataclass
class Rig:
    hub: StreamHub
    redis: redis.asyncio.Redis


async def _rig(request: pytest.FixtureRequest) -> Rig:
    if request.param == "redis-cluster":
        request.getfixturevalue("cluster_redis")  # flushed
        url = request.getfixturevalue("redis_cluster").url
        connection = connect_async(url)
        return Rig(gateway_hub(connection, idle_s=0.1), connection)
    connection = connect_async(request.getfixturevalue("redis_server").url)
    await connection.flushall()
    # Blocks for 5 s, so a test sees whether a new subscriber cuts the read short.
    source = AsyncBlockingSource(own_reader(connection, raw=True), connection, block_ms=5_000)
    return Rig(AsyncHub(source, parse_gateway_entry, idle_s=0.1), connection)


@pytest.fixture(params=BACKENDS)
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    r = await _rig(request)
    r.hub.start()
    yield r
    await r.hub.stop()
    await r.redis.aclose()


async def _add(rig: Rig, key: str, event: TokenEvent | FinalEvent) -> str:
    entry_id = await rig.redis.xadd(key, {"e": dumps(event)})
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


async def _take(stream: AsyncIterator[list[Entry]], n: int) -> list[Entry]:
    out: list[Entry] = []
    async with asyncio.timeout(5):
        async for batch in stream:
            out.extend(batch)
            if len(out) >= n:
                return out
    return out


def _token(i: int) -> TokenEvent:
    return TokenEvent(index=i, token_ids=(i,), text=f"t{i}")


async def test_a_new_subscriber_is_served_at_once_while_the_read_blocks(rig: Rig) -> None:
    first = rig.hub.subscribe("s:a")
    await _add(rig, "s:a", _token(0))
    assert [e.token() for e in await _take(first, 1)] == [_token(0)]
    # The hub is now blocked (5 s) on s:a alone; s:b must not wait for that to end.
    second = rig.hub.subscribe("s:b")
    pending = asyncio.ensure_future(_take(second, 1))
    await asyncio.sleep(0.05)
    await _add(rig, "s:b", _token(7))
    async with asyncio.timeout(1):
        assert [e.token() for e in await pending] == [_token(7)]
    await first.aclose()
    await second.aclose()
    assert rig.hub.num_subscriptions == 0


async def test_subscribers_of_one_stream_each_get_what_follows_their_cursor(rig: Rig) -> None:
    ids = [await _add(rig, "s:x", _token(i)) for i in range(3)]
    whole, resumed = rig.hub.subscribe("s:x"), rig.hub.subscribe("s:x", after=ids[1])
    await _add(rig, "s:x", FinalEvent(finish_reason=FinishReason.STOP))
    assert [e.id for e in await _take(whole, 4)][:3] == ids
    assert [e.type for e in await _take(resumed, 2)] == ["token", "final"]
    await whole.aclose()
    await resumed.aclose()


async def test_a_quiet_stream_yields_an_empty_batch_now_and_then(rig: Rig) -> None:
    quiet = rig.hub.subscribe("s:quiet")
    async with asyncio.timeout(1):
        assert await anext(quiet) == []
    await quiet.aclose()


async def test_unreadable_entries_are_skipped(rig: Rig) -> None:
    stream = rig.hub.subscribe("s:junk")
    await rig.redis.xadd("s:junk", {"e": b"not json"})
    await rig.redis.xadd("s:junk", {"e": b'{"type": "token"}'})
    await _add(rig, "s:junk", _token(1))
    assert [e.token() for e in await _take(stream, 1)] == [_token(1)]
    await stream.aclose()


@pytest.mark.parametrize("bad", ["", "1", "1-", "-1", "a-1", "1-2-3", f"{2**64}-0", "١-٢"])
def test_cursors_redis_would_refuse_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="stream id"):
        parse_cursor(bad)


def test_cursors_compare_as_stream_ids() -> None:
    assert parse_cursor("10-0") > parse_cursor("9-5") > parse_cursor("0-0")


async def test_an_unreadable_last_entry_is_read_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    stream = rig.hub.subscribe("s:tail")
    pending = asyncio.ensure_future(_take(stream, 1))
    await rig.redis.xadd("s:tail", {"e": b"not json"})
    await asyncio.sleep(0.3)  # a hub that read it again would warn on every read
    warnings = [r for r in caplog.records if "unreadable entry" in r.getMessage()]
    assert len(warnings) == 1 and "of s:tail" in warnings[0].getMessage()
    await _add(rig, "s:tail", _token(2))
    assert [e.token() for e in await pending] == [_token(2)]
    await stream.aclose()


async def test_a_stream_named_only_once_its_request_starts_gets_its_first_token_at_once(
    redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    """A gateway's hub leaves the streams of requests not started yet out of its reads
    (but for one look when followed, and a sweep, here once a minute); the lifecycle
    channel's 'started' event brings one in at once, cutting a blocked read short."""
    connection = connect_async(redis_server.url)
    source = AsyncBlockingSource(own_reader(connection, raw=True), connection, block_ms=200)
    starts = lifecycle_starts(connection, Keys())
    hub = AsyncHub(source, parse_gateway_entry, idle_s=5.0, starts=starts, sweep_s=60.0)
    hub.start()
    request_id = new_request_id("m")
    key = Keys().stream(request_id)
    try:
        pending = asyncio.ensure_future(_take(hub.subscribe(key), 1))
        await asyncio.sleep(0.5)  # looked at once, found empty: dormant now
        await connection.xadd(key, {"e": dumps(_token(0))})
        await asyncio.sleep(0.5)
        assert not pending.done()  # not named: the entry waits for the start (or a sweep)
        started = orjson.dumps({"event": "started", "id": request_id})
        await connection.publish(Keys().lifecycle_channel(), started)
        async with asyncio.timeout(0.5):
            assert [e.token() for e in await pending] == [_token(0)]
    finally:
        await hub.stop()
        await connection.aclose()
