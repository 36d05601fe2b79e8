"""One blocking XREAD for every stream the gateway follows.

A blocking read per subscriber would hold one Redis connection and one round trip per
token per stream; the hub instead keeps one connection blocked on all followed streams
at once, so a worker step that publishes to 500 streams reaches the gateway as one
reply. A new subscriber interrupts the blocked read with CLIENT UNBLOCK so it is read
from at once. (On Redis Cluster this would need one hub per hash slot.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
from pydantic import ValidationError

from shared.models import StreamEvent
from shared.records import stream_event

log = logging.getLogger(__name__)
Cursor = tuple[int, int]
UNBLOCK_TRIES = 20
UNBLOCK_RETRY_S = 0.002


def parse_cursor(stream_id: str) -> Cursor:
    """``"<ms>-<seq>"`` as a comparable pair; raises ValueError for anything else."""
    ms, sep, seq = stream_id.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream id: {stream_id!r}")
    return int(ms), int(seq)


@dataclass(eq=False)
class Subscription:
    key: str
    cursor: Cursor
    queue: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)

    def offer(self, event: StreamEvent, event_cursor: Cursor) -> None:
        if event_cursor > self.cursor:
            self.cursor = event_cursor
            self.queue.put_nowait(event)


class StreamHub:
    """Fans the entries of many Redis Streams out to per-subscriber queues."""

    def __init__(self, reader: redis.asyncio.Redis, control: redis.asyncio.Redis,
                 block_ms: int = 1_000, count: int = 512) -> None:  # fmt: skip
        self._reader = reader  # single-connection client, blocked in XREAD
        self._control = control  # any other connection, for CLIENT UNBLOCK
        self._subs: dict[str, set[Subscription]] = {}
        self._changed = asyncio.Event()
        self._client_id: int | None = None
        self._reading = False
        self._unblocking = False
        self._block_ms = block_ms
        self._count = count
        self._task: asyncio.Task[None] | None = None

    @property
    def num_subscriptions(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tokenq-stream-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.aclose()

    async def subscribe(self, key: str, after: str = "0-0", idle_s: float = 2.0,
                        ) -> AsyncIterator[StreamEvent | None]:  # fmt: skip
        """Events of stream ``key`` after ``after``; ``None`` after each ``idle_s`` of silence."""
        sub = Subscription(key, parse_cursor(after))
        self._subs.setdefault(key, set()).add(sub)
        await self._wake()
        try:
            while True:
                try:
                    yield await asyncio.wait_for(sub.queue.get(), idle_s)
                except TimeoutError:
                    yield None
        finally:
            self._unsubscribe(sub)

    def _unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]

    async def _wake(self) -> None:
        """Make the blocked read start over with the current subscriptions."""
        self._changed.set()
        if not self._reading or self._unblocking or self._client_id is None:
            return
        self._unblocking = True
        try:
            await self._unblock(self._client_id)
        finally:
            self._unblocking = False

    async def _unblock(self, client_id: int) -> None:
        # The XREAD may not have reached the server yet, so an unblock that finds it
        # not blocked is retried briefly; past that the read ends within block_ms.
        for _ in range(UNBLOCK_TRIES):
            try:
                if not self._reading or await self._control.client_unblock(client_id):
                    return
            except redis.RedisError as e:
                log.debug("CLIENT UNBLOCK failed: %s", e)
                return
            await asyncio.sleep(UNBLOCK_RETRY_S)

    async def _run(self) -> None:
        backoff_s = 0.05
        while True:
            try:
                await self._step()
                backoff_s = 0.05
            except redis.RedisError as e:
                self._reading, self._client_id = False, None
                log.warning("stream hub: %s; retrying in %.2fs", e, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    async def _step(self) -> None:
        if not self._subs:
            await self._changed.wait()
        self._changed.clear()
        streams: dict[Any, Any] = {key: _min_cursor(s) for key, s in self._subs.items()}
        if not streams:
            return
        if self._client_id is None:
            self._client_id = int(await self._reader.client_id())
        block_ms = 1 if self._changed.is_set() else self._block_ms
        self._reading = True
        try:
            reply = await self._reader.xread(streams, block=block_ms, count=self._count)
        finally:
            self._reading = False
        self._dispatch(_entries(reply))

    def _dispatch(self, entries: Iterable[tuple[str, Any, Any]]) -> None:
        for key, entry_id, fields in entries:
            subs = self._subs.get(key)
            if not subs:
                continue
            try:
                event = stream_event(entry_id, fields)
            except (ValidationError, ValueError) as e:
                log.warning("skipping unreadable entry %s of %s: %s", entry_id, key, e)
                continue
            cursor = parse_cursor(event.id)
            for sub in subs:
                sub.offer(event, cursor)


def _min_cursor(subs: set[Subscription]) -> str:
    ms, seq = min(s.cursor for s in subs)
    return f"{ms}-{seq}"


def _entries(reply: Any) -> Iterable[tuple[str, Any, Any]]:
    """(stream key, entry id, fields) from an XREAD reply, RESP2 list or RESP3 map."""
    if not reply:
        return
    pairs = reply.items() if isinstance(reply, dict) else reply
    for key, entries in pairs:
        name = key.decode() if isinstance(key, bytes) else str(key)
        for entry_id, fields in entries:
            yield name, entry_id, fields
