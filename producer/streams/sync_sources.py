"""Where a threaded hub's reads go: the blocking twins of ``aio_sources``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from producer.streams.aio_sources import UNBLOCK_RETRY_S, UNBLOCK_TRIES, UNBLOCKABLE_BLOCK_MS
from producer.streams.core import xread_entries
from producer.streams.slots import COUNT, Pacer, is_redirect, plan_reads, xread_args
from shared.connection import refresh

log = logging.getLogger(__name__)
Entries = list[tuple[str, Any, Any]]


def own_reader(connection: redis.Redis) -> redis.Redis:
    """As ``aio_sources.own_reader``."""
    pool = connection.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    own = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    reader = redis.Redis(connection_pool=own, single_connection_client=True)
    reader.auto_close_connection_pool = True
    return reader


class BlockingSource:
    """One blocking XREAD over every followed stream of one Redis."""

    def __init__(self, reader: redis.Redis, control: redis.Redis, block_ms: int = 1_000) -> None:
        self._reader, self._control, self._block_ms = reader, control, block_ms
        self._client_id: int | None = None
        self._reading = threading.Event()
        self._unblocking = threading.Lock()

    def read(self, cursors: dict[str, str], changed: threading.Event) -> Entries:
        if self._client_id is None:
            self._client_id = self._own_id()
        block_ms = 1 if changed.is_set() else self._block_ms
        if self._client_id < 0:
            block_ms = min(block_ms, UNBLOCKABLE_BLOCK_MS)
        self._reading.set()
        try:
            reply = self._reader.xread(cursors, block=block_ms, count=COUNT)  # type: ignore[arg-type]
        except redis.RedisError:
            self._client_id = None
            raise
        finally:
            self._reading.clear()
        return list(xread_entries(reply))

    def _own_id(self) -> int:
        try:
            return int(self._reader.client_id())
        except redis.ResponseError as e:
            log.warning("CLIENT ID refused (%s): new followers wait up to %d ms", e,
                        UNBLOCKABLE_BLOCK_MS)  # fmt: skip
            return -1

    def pause(self, changed: threading.Event) -> None:
        return None

    def interrupt(self) -> None:
        """Make a blocked read return now (called from a follower's thread). One thread
        unblocks at a time: the read it restarts picks up the others' followers too."""
        client_id = self._client_id
        if client_id is None or client_id < 0 or not self._unblocking.acquire(blocking=False):
            return
        try:
            self._unblock(client_id)
        finally:
            self._unblocking.release()

    def _unblock(self, client_id: int) -> None:
        for _ in range(UNBLOCK_TRIES):
            try:
                if not self._reading.is_set() or self._control.client_unblock(client_id):
                    return
            except redis.RedisError as e:
                log.debug("CLIENT UNBLOCK failed: %s", e)
                return
            self._reading.wait(UNBLOCK_RETRY_S)  # a short sleep

    def close(self) -> None:
        self._reader.close()


class ClusterSource:
    """Rounds of non-blocking XREADs, one pipeline per node (over the cluster client's
    own connection to that node)."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._pacer = Pacer()

    def read(self, cursors: dict[str, str], changed: threading.Event) -> Entries:
        cluster = self._cluster
        plan = plan_reads(cursors, cluster.nodes_manager.get_node_from_slot)
        found: Entries = []
        for reads in plan.values():
            found.extend(self._read_node(reads.node, reads.reads))
        self._pacer.after_round(bool(found))
        return found

    def _read_node(self, node: Any, reads: list[dict[str, str]]) -> Entries:
        connection = node.redis_connection
        if connection is None:
            raise redis.ConnectionError(f"no connection to cluster node {node.name}")
        pipe = connection.pipeline(transaction=False)
        for streams in reads:
            pipe.execute_command(*xread_args(streams))
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError:
            self._refresh()
            raise
        return self._entries(replies)

    def _entries(self, replies: Iterable[Any]) -> Entries:
        found: Entries = []
        for reply in replies:
            if isinstance(reply, Exception):
                if is_redirect(reply):
                    self._refresh()
                raise reply if isinstance(reply, redis.RedisError) else redis.RedisError(reply)
            found.extend(xread_entries(reply))
        return found

    def _refresh(self) -> None:
        refresh(self._cluster)

    def pause(self, changed: threading.Event) -> None:
        changed.wait(self._pacer.delay_s)

    def interrupt(self) -> None:
        return None

    def close(self) -> None:
        return None  # the connections are the cluster client's
