"""Many followed streams on few connections, for asyncio: one reader per Redis (one
blocking XREAD over every followed stream) or per cluster node (see ``slots``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Generic, Protocol, cast

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from producer.streams.aio_sources import (
    AsyncBlockingSource,
    AsyncClusterSource,
    Entries,
    own_reader,
)
from producer.streams.core import E, Followers, Parse, Subscription
from shared.connection import UNREACHABLE, is_cluster

log = logging.getLogger(__name__)
IDLE_TICKS = 4
# How often a read names streams whose requests have not started (see ``starts``).
SWEEP_S = 1.0
Starts = Callable[[], AsyncIterator[str]]


class AsyncSource(Protocol):
    async def read(self, cursors: dict[str, str], changed: asyncio.Event) -> Entries: ...

    async def pause(self, changed: asyncio.Event) -> None: ...

    async def interrupt(self) -> None: ...

    async def close(self) -> None: ...


def async_source(connection: redis.asyncio.Redis, raw: bool = False) -> AsyncSource:
    """The reader for ``connection``'s Redis or Redis Cluster (its own connections)."""
    if is_cluster(connection):
        return AsyncClusterSource(cast(AsyncRedisCluster, connection), raw)
    return AsyncBlockingSource(own_reader(connection, raw), connection)


class AsyncFollower(Generic[E]):
    def __init__(self, sub: Subscription[E], ready: asyncio.Event) -> None:
        self._sub, self._ready = sub, ready

    async def next(self) -> list[E]:
        """What has arrived since the last call, waiting for it; empty after a quiet
        spell (the hub's ``idle_s`` or so)."""
        await self._ready.wait()
        return self._sub.take()


class AsyncHub(Generic[E]):
    """Fans the entries of many Redis Streams out to their followers, in batches."""

    def __init__(
        self,
        source: AsyncSource,
        parse: Parse[E],
        idle_s: float = 2.0,
        gather_s: float = 0.0,
        starts: Starts | None = None,
        sweep_s: float = SWEEP_S,
    ) -> None:
        """``starts``: the stream keys whose requests start, as they start (the lifecycle
        channel): with it, streams of requests not started yet are left out of reads
        but for a sweep every SWEEP_S (``producer.streams.core``), so a pub/sub message
        lost costs a late first token, never a lost one (``sweep_s`` for tests)."""
        self._source = source
        self._followers = Followers[E](parse, dormancy=starts is not None)
        self._starts = starts
        self._sweep_s = sweep_s
        self._swept_s = time.monotonic()
        self._changed = asyncio.Event()
        self._idle_s = idle_s
        # After a read that returned entries, the next waits up to this long (a new
        # follower ends the wait): at most this much added latency, for far fewer
        # XREADs while entries keep coming (an XREAD costs Redis per stream it names).
        self._gather_s = gather_s
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def num_subscriptions(self) -> int:
        return self._followers.num_subscriptions

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._tick())]
        if self._starts is not None:
            self._tasks.append(asyncio.create_task(self._follow_starts(self._starts)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._source.close()

    @asynccontextmanager
    async def follow(self, key: str, after: str = "0-0") -> AsyncIterator[AsyncFollower[E]]:
        """Follow stream ``key`` from after ``after`` (ValueError for a bad id) until the
        block is left."""
        ready = asyncio.Event()
        sub = self._followers.add(key, after, ready)
        try:
            await self._wake()
            yield AsyncFollower(sub, ready)
        finally:
            self._followers.remove(sub)

    async def subscribe(self, key: str, after: str = "0-0") -> AsyncGenerator[list[E]]:
        """Entries of stream ``key`` after ``after``, in batches of what has arrived; an
        empty batch after ``idle_s`` or so of silence. One timer serves every follower,
        since a timer per wait costs more than the rest of a token's trip."""
        async with self.follow(key, after) as follower:
            while True:
                yield await follower.next()

    async def _wake(self) -> None:
        """Make a blocked read start over with the current followers."""
        self._changed.set()
        await self._source.interrupt()

    async def _tick(self) -> None:
        interval_s = self._idle_s / IDLE_TICKS
        while True:
            await asyncio.sleep(interval_s)
            self._followers.tick(IDLE_TICKS)

    async def _follow_starts(self, starts: Starts) -> None:
        async for key in starts():
            if self._followers.started(key):
                await self._wake()

    async def _run(self) -> None:
        backoff_s = 0.05
        task = asyncio.current_task()
        # A stop() that lands in a blocked read can be swallowed by the client (it drops
        # the connection and returns, or raises a connection error): checked each turn.
        while task is None or not task.cancelling():
            try:
                await self._step()
                backoff_s = 0.05
            except (redis.RedisError, *UNREACHABLE) as e:
                if task is not None and task.cancelling():
                    break
                log.warning("stream reader: %s; retrying in %.2fs", e, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    async def _step(self) -> None:
        if not self._followers:
            await self._changed.wait()
        self._changed.clear()
        now_s = time.monotonic()
        sweep = now_s - self._swept_s >= self._sweep_s
        if sweep:
            self._swept_s = now_s
        read_from = self._followers.cursors(sweep)
        if not read_from:  # every followed stream is dormant: until a start, or the sweep
            await _wait(self._changed, self._swept_s + self._sweep_s - now_s)
            return
        entries = await self._source.read(read_from, self._changed)
        self._followers.dispatch(entries, read_from)
        if entries and self._gather_s > 0:
            await _wait(self._changed, self._gather_s)
        await self._source.pause(self._changed)


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` passes. (``asyncio.timeout``, not
    ``wait_for``: on Python 3.11 a cancel that lands as the wait ends can be lost.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
