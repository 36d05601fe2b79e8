"""One blocking XREAD for every stream the gateway follows.

A blocking read per subscriber would hold one Redis connection and one round trip per
token per stream; the hub instead keeps one connection blocked on all followed streams
at once, so a worker step that publishes to 500 streams reaches the gateway as one
reply. A new subscriber interrupts the blocked read with CLIENT UNBLOCK so it is read
from at once. (On Redis Cluster this would need one hub per hash slot.) An XREAD costs
Redis in proportion to the streams it names, so the hub reads at most about every
``gather_s`` while entries keep coming, each read carrying many workers' writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from producer.gateway.entries import Entry, parse_entry
from shared.replies import text

log = logging.getLogger(__name__)
Cursor = tuple[int, int]
MAX_ID_PART = 2**64 - 1
IDLE_TICKS = 4
UNBLOCK_TRIES = 20
UNBLOCK_RETRY_S = 0.002
# After a read that returned entries, the next waits this long: at most this much added
# stream latency, for about a third of the XREAD work in Redis (bench/scale.py).
GATHER_S = 0.015


def parse_cursor(stream_id: str) -> Cursor:
    """``"<ms>-<seq>"`` as a comparable pair; raises ValueError for anything else (an id
    Redis would refuse must never reach the shared XREAD, where it would fail every stream)."""
    ms, sep, seq = stream_id.partition("-")
    if not sep or not ms.isascii() or not ms.isdigit() or not seq.isascii() or not seq.isdigit():
        raise ValueError(f"not a stream id: {stream_id!r}")
    cursor = int(ms), int(seq)
    if max(cursor) > MAX_ID_PART:
        raise ValueError(f"stream id {stream_id!r} is out of range")
    return cursor


@dataclass(eq=False)
class Subscription:
    key: str
    cursor: Cursor
    pending: list[Entry] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    quiet_ticks: int = 0

    def offer(self, entry: Entry, entry_cursor: Cursor) -> None:
        if entry_cursor > self.cursor:
            self.cursor = entry_cursor
            self.pending.append(entry)
            self.quiet_ticks = 0
            self.ready.set()

    def tick(self, ticks_to_idle: int) -> None:
        self.quiet_ticks += 1
        if self.quiet_ticks >= ticks_to_idle:
            self.quiet_ticks = 0
            self.ready.set()  # wakes the subscriber with nothing: a quiet spell

    def take(self) -> list[Entry]:
        self.ready.clear()
        batch, self.pending = self.pending, []
        return batch


class StreamHub:
    """Fans the entries of many Redis Streams out to their subscribers, in batches."""

    def __init__(
        self,
        reader: redis.asyncio.Redis,
        control: redis.asyncio.Redis,
        block_ms: int = 1_000,
        count: int = 512,
        idle_s: float = 2.0,
        gather_s: float = GATHER_S,
    ) -> None:
        self._reader = reader  # single-connection client, blocked in XREAD
        # Raw replies: redis-py's dict per entry costs as much as the rest of the hub.
        reader.set_response_callback("XREAD", _raw_reply)
        self._control = control  # any other connection, for CLIENT UNBLOCK
        self._subs: dict[str, set[Subscription]] = {}
        # Where the next XREAD starts in each followed stream: at or before every one
        # of its subscribers' cursors, kept as the id string XREAD takes.
        self._cursors: dict[str, str] = {}
        self._changed = asyncio.Event()
        self._client_id: int | None = None
        self._reading = False
        self._unblocking = False
        self._block_ms = block_ms
        self._count = count
        self._idle_s = idle_s
        self._gather_s = gather_s
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def num_subscriptions(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._tick())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._reader.aclose()

    async def subscribe(self, key: str, after: str = "0-0") -> AsyncGenerator[list[Entry]]:
        """Entries of stream ``key`` after ``after``, in batches of what has arrived; an
        empty batch after ``idle_s`` or so of silence. One timer serves every subscriber,
        since a timer per wait costs more than the rest of a token's trip."""
        sub = Subscription(key, parse_cursor(after))
        self._subs.setdefault(key, set()).add(sub)
        self._follow_from(key, sub.cursor)
        await self._wake()
        try:
            while True:
                await sub.ready.wait()
                yield sub.take()
        finally:
            self._unsubscribe(sub)

    async def _tick(self) -> None:
        interval_s = self._idle_s / IDLE_TICKS
        while True:
            await asyncio.sleep(interval_s)
            for subs in self._subs.values():
                for sub in subs:
                    sub.tick(IDLE_TICKS)

    def _follow_from(self, key: str, cursor: Cursor) -> None:
        current = self._cursors.get(key)
        if current is None or cursor < parse_cursor(current):
            self._cursors[key] = _format(cursor)

    def _unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]
                del self._cursors[sub.key]

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
        if not self._cursors:
            return
        if self._client_id is None:
            self._client_id = int(await self._reader.client_id())
        block_ms = 1 if self._changed.is_set() else self._block_ms
        self._reading = True
        try:
            reply = await self._reader.xread(
                self._cursors,  # type: ignore[arg-type]
                block=block_ms,
                count=self._count,
            )
        finally:
            self._reading = False
        self._dispatch(_entries(reply))
        if reply and self._gather_s > 0:
            # An XREAD costs Redis in proportion to the streams it follows, whether they
            # have news or not: the next one waits a moment to carry many workers' writes.
            await asyncio.sleep(self._gather_s)

    def _dispatch(self, entries: Iterable[tuple[str, Any, Any]]) -> None:
        for key, entry_id, fields in entries:
            subs = self._subs.get(key)
            if not subs:
                continue
            # Every subscriber's cursor is now at or past this entry: read on after it,
            # even when it cannot be read (else the next XREAD returns it again at once).
            self._cursors[key] = text_id = text(entry_id)
            try:
                entry = parse_entry(text_id, fields)
            except ValueError as e:
                log.warning("skipping unreadable entry %s of %s: %s", text_id, key, e)
                continue
            ms, _, seq = text_id.partition("-")  # Redis's own ids need no checking
            cursor = int(ms), int(seq)
            for sub in subs:
                sub.offer(entry, cursor)


def _raw_reply(response: Any, **_: Any) -> Any:
    return response


def _format(cursor: Cursor) -> str:
    return f"{cursor[0]}-{cursor[1]}"


def _entries(reply: Any) -> Iterable[tuple[str, Any, Any]]:
    """(stream key, entry id, fields) from an XREAD reply, RESP2 list or RESP3 map."""
    if not reply:
        return
    pairs = reply.items() if isinstance(reply, dict) else reply
    for key, entries in pairs:
        name = text(key)
        for entry_id, fields in entries:
            yield name, entry_id, fields
