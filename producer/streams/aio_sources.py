"""Where an asyncio hub's reads go: one Redis (a blocking XREAD that a new follower cuts
short with CLIENT UNBLOCK) or a Redis Cluster (pipelined rounds per node, see ``slots``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from producer.streams.core import raw_reply, xread_entries
from producer.streams.slots import COUNT, Pacer, is_redirect, plan_reads, xread_args
from shared.connection import refresh_async

log = logging.getLogger(__name__)
Entries = list[tuple[str, Any, Any]]
UNBLOCK_TRIES = 20
UNBLOCK_RETRY_S = 0.002
# Without CLIENT UNBLOCK (a proxy that refuses CLIENT), a new follower waits this long.
UNBLOCKABLE_BLOCK_MS = 100


def own_reader(connection: redis.asyncio.Redis, raw: bool) -> redis.asyncio.Redis:
    """A one-connection client to the Redis of ``connection``, for a blocking reader. It
    must not reconnect behind the hub's back: CLIENT UNBLOCK targets its id."""
    pool = connection.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    own = redis.asyncio.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    reader = redis.asyncio.Redis(connection_pool=own, single_connection_client=True)
    reader.auto_close_connection_pool = True  # its own pool goes when it closes
    if raw:
        reader.set_response_callback("XREAD", raw_reply)
    return reader


class AsyncBlockingSource:
    """One blocking XREAD over every followed stream of one Redis."""

    def __init__(
        self, reader: redis.asyncio.Redis, control: redis.asyncio.Redis, block_ms: int = 1_000
    ) -> None:
        self._reader = reader  # single-connection client, blocked in XREAD
        self._control = control  # any other connection, for CLIENT UNBLOCK
        self._block_ms = block_ms
        self._client_id: int | None = None
        self._reading = False
        self._unblocking = False

    async def read(self, cursors: dict[str, str], changed: asyncio.Event) -> Entries:
        if self._client_id is None:
            self._client_id = await self._own_id()
        block_ms = 1 if changed.is_set() else self._block_ms
        if self._client_id < 0:
            block_ms = min(block_ms, UNBLOCKABLE_BLOCK_MS)
        self._reading = True
        try:
            reply = await self._reader.xread(cursors, block=block_ms, count=COUNT)  # type: ignore[arg-type]
        except redis.RedisError:
            self._client_id = None  # a new connection gets a new id
            raise
        finally:
            self._reading = False
        return list(xread_entries(reply))

    async def _own_id(self) -> int:
        try:
            return int(await self._reader.client_id())
        except redis.ResponseError as e:
            log.warning(
                "CLIENT ID refused (%s): new followers wait up to %d ms", e, UNBLOCKABLE_BLOCK_MS
            )
            return -1

    async def pause(self, changed: asyncio.Event) -> None:
        return None  # the next blocking read waits on Redis itself

    async def interrupt(self) -> None:
        """Make a blocked read return now, so it starts over with a new follower."""
        client_id = self._client_id
        if not self._reading or self._unblocking or client_id is None or client_id < 0:
            return
        self._unblocking = True
        try:
            await self._unblock(client_id)
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

    async def close(self) -> None:
        await self._reader.aclose()


class AsyncClusterSource:
    """Pipelined rounds of non-blocking XREADs, one pipeline per node, nodes in parallel."""

    def __init__(self, cluster: AsyncRedisCluster, raw: bool = False) -> None:
        self._cluster = cluster
        self._raw = raw
        self._nodes: dict[str, redis.asyncio.Redis] = {}
        self._pacer = Pacer()

    async def read(self, cursors: dict[str, str], changed: asyncio.Event) -> Entries:
        await self._cluster.initialize()  # at once if it already is
        plan = plan_reads(cursors, self._cluster.nodes_manager.get_node_from_slot)
        rounds = [self._read_node(reads.node, reads.reads) for reads in plan.values()]
        found: Entries = []
        # Every node's round ends before an error is raised: a round still running on a
        # node's one connection would collide with the next.
        for entries in await asyncio.gather(*rounds, return_exceptions=True):
            if isinstance(entries, BaseException):
                raise entries
            found.extend(entries)
        self._pacer.after_round(bool(found))
        return found

    async def _read_node(self, node: Any, reads: list[dict[str, str]]) -> Entries:
        pipe = self._connection(node).pipeline(transaction=False)
        for streams in reads:
            pipe.execute_command(*xread_args(streams))
        try:
            replies = await pipe.execute(raise_on_error=False)
        except redis.RedisError:
            await self._forget(node.name)
            raise
        return await self._entries(node.name, replies)

    async def _entries(self, name: str, replies: Iterable[Any]) -> Entries:
        found: Entries = []
        for reply in replies:
            if isinstance(reply, Exception):
                await self._forget(name, refresh=is_redirect(reply))
                raise reply if isinstance(reply, redis.RedisError) else redis.RedisError(reply)
            found.extend(xread_entries(reply))
        return found

    def _connection(self, node: Any) -> redis.asyncio.Redis:
        connection = self._nodes.get(node.name)
        if connection is None:
            pool = redis.asyncio.ConnectionPool(
                connection_class=node.connection_class, max_connections=1,
                **node.connection_kwargs,
            )  # fmt: skip
            connection = self._nodes[node.name] = redis.asyncio.Redis.from_pool(pool)
            if self._raw:
                connection.set_response_callback("XREAD", raw_reply)
        return connection

    async def _forget(self, name: str, refresh: bool = True) -> None:
        connection = self._nodes.pop(name, None)
        if connection is not None:
            await connection.aclose()
        if refresh:  # a failover or a resharding: read the slot map again
            await refresh_async(self._cluster)

    async def pause(self, changed: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), self._pacer.delay_s)

    async def interrupt(self) -> None:
        return None  # the pause ends when ``changed`` is set

    async def close(self) -> None:
        for name in list(self._nodes):
            await self._forget(name, refresh=False)
