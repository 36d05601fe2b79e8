"""The stream hub against a real redis-server: one XREAD for many streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from producer.embedded import EmbeddedRedis
from producer.gateway.entries import Entry
from producer.gateway.hub import StreamHub, parse_cursor
from shared.models import FinalEvent, FinishReason, TokenEvent, dumps


@pytest.fixture
async def hub(redis_server: EmbeddedRedis) -> AsyncIterator[StreamHub]:
    control = redis.asyncio.Redis.from_url(redis_server.url)
    await control.flushall()
    reader = redis.asyncio.Redis.from_url(redis_server.url, single_connection_client=True)
    h = StreamHub(reader, control, block_ms=5_000, idle_s=0.1)
    h.start()
    yield h
    await h.stop()
    await control.aclose()


async def _add(hub: StreamHub, key: str, event: TokenEvent | FinalEvent) -> str:
    entry_id = await hub._control.xadd(key, {"e": dumps(event)})
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


async def test_a_new_subscriber_is_served_at_once_while_the_read_blocks(hub: StreamHub) -> None:
    first = hub.subscribe("s:a")
    await _add(hub, "s:a", _token(0))
    assert [e.token() for e in await _take(first, 1)] == [_token(0)]
    # The hub is now blocked (5 s) on s:a alone; s:b must not wait for that to end.
    second = hub.subscribe("s:b")
    pending = asyncio.ensure_future(_take(second, 1))
    await asyncio.sleep(0.05)
    await _add(hub, "s:b", _token(7))
    async with asyncio.timeout(1):
        assert [e.token() for e in await pending] == [_token(7)]
    await first.aclose()
    await second.aclose()
    assert hub.num_subscriptions == 0


async def test_subscribers_of_one_stream_each_get_what_follows_their_cursor(hub: StreamHub) -> None:
    ids = [await _add(hub, "s:x", _token(i)) for i in range(3)]
    whole, resumed = hub.subscribe("s:x"), hub.subscribe("s:x", after=ids[1])
    await _add(hub, "s:x", FinalEvent(finish_reason=FinishReason.STOP))
    assert [e.id for e in await _take(whole, 4)][:3] == ids
    assert [e.type for e in await _take(resumed, 2)] == ["token", "final"]
    await whole.aclose()
    await resumed.aclose()


async def test_a_quiet_stream_yields_an_empty_batch_now_and_then(hub: StreamHub) -> None:
    quiet = hub.subscribe("s:quiet")
    async with asyncio.timeout(1):
        assert await anext(quiet) == []
    await quiet.aclose()


async def test_unreadable_entries_are_skipped(hub: StreamHub) -> None:
    stream = hub.subscribe("s:junk")
    await hub._control.xadd("s:junk", {"e": b"not json"})
    await hub._control.xadd("s:junk", {"e": b'{"type": "token"}'})
    await _add(hub, "s:junk", _token(1))
    assert [e.token() for e in await _take(stream, 1)] == [_token(1)]
    await stream.aclose()


@pytest.mark.parametrize("bad", ["", "1", "1-", "-1", "a-1", "1-2-3", f"{2**64}-0", "١-٢"])
def test_cursors_redis_would_refuse_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="stream id"):
        parse_cursor(bad)


def test_cursors_compare_as_stream_ids() -> None:
    assert parse_cursor("10-0") > parse_cursor("9-5") > parse_cursor("0-0")


async def test_an_unreadable_last_entry_is_read_once(
    hub: StreamHub, caplog: pytest.LogCaptureFixture
) -> None:
    stream = hub.subscribe("s:tail")
    pending = asyncio.ensure_future(_take(stream, 1))
    await hub._control.xadd("s:tail", {"e": b"not json"})
    await asyncio.sleep(0.3)  # a hub that read it again would warn on every read
    warnings = [r for r in caplog.records if "unreadable entry" in r.getMessage()]
    assert len(warnings) == 1 and "of s:tail" in warnings[0].getMessage()
    await _add(hub, "s:tail", _token(2))
    assert [e.token() for e in await pending] == [_token(2)]
    await stream.aclose()
