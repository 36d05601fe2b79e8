"""Which requests start, as they start: the lifecycle channel's 'started' events as the
stream keys a hub follows (``AsyncHub``'s ``starts``). Pub/sub loses what is published
while no one listens (a reconnect, a failover): the hub's sweep covers that, so a lost
message costs a late first token, never a lost one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import redis
import redis.asyncio

from shared.connection import UNREACHABLE
from shared.keys import Keys

log = logging.getLogger(__name__)
STARTED = b'"started"'


def lifecycle_starts(
    connection: redis.asyncio.Redis, keys: Keys
) -> Callable[[], AsyncIterator[str]]:
    """For a hub on one Redis (or one found through Sentinel)."""

    async def starts() -> AsyncIterator[str]:
        backoff_s = 0.05
        while True:
            try:
                async for key in _listen(connection, keys):
                    backoff_s = 0.05
                    yield key
            except (redis.RedisError, *UNREACHABLE) as e:
                log.warning("lifecycle channel: %s; listening again in %.2fs", e, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    return starts


async def _listen(connection: redis.asyncio.Redis, keys: Keys) -> AsyncIterator[str]:
    async with connection.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe(keys.lifecycle_channel())
        async for message in pubsub.listen():
            key = started_stream(message, keys)
            if key is not None:
                yield key


def started_stream(message: Any, keys: Keys) -> str | None:
    """The stream key of a 'started' event, else None (other events, or garbage)."""
    data = message.get("data") if isinstance(message, dict) else None
    if not isinstance(data, bytes | str) or STARTED not in _bytes(data):
        return None
    try:
        event = orjson.loads(data)
        return keys.stream(str(event["id"])) if event.get("event") == "started" else None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _bytes(data: bytes | str) -> bytes:
    return data if isinstance(data, bytes) else data.encode()
