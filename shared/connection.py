"""Reaching Redis: one Redis, a Redis Cluster or a primary found through Sentinel
(``shared.sentinel``), backoff, the URL as it may be printed, and waiting for Redis at
start."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, RedisClusterException, TryAgainError

from shared.errors import InvalidRequest
from shared.sentinel import (
    connect_sentinel,
    connect_sentinel_async,
    is_sentinel_url,
    shown_sentinel_url,
)

log = logging.getLogger(__name__)
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# A sync or asyncio connection to one Redis or to a Redis Cluster.
SyncRedis = redis.Redis | RedisCluster
AsyncRedis = redis.asyncio.Redis | AsyncRedisCluster

# What "Redis is not there (yet)" looks like, or is failing over (a cluster without a
# master for some slots answers CLUSTERDOWN until a replica is promoted; its client
# may find no node to ask meanwhile); anything else is a real error.
UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    TryAgainError,
    RedisClusterException,
)


def cluster_url(url: str, cluster: bool = False) -> str | None:
    """The plain URL of a cluster node when ``url`` names a cluster (a ``redis+cluster://``
    URL, or any URL with ``cluster`` set: TOKENQ_REDIS_CLUSTER), else None."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}"
    return url if cluster else None


def connect(url: str, cluster: bool = False, **options: Any) -> redis.Redis:
    """A sync connection: redis-py's cluster client for a cluster, its Sentinel client
    for a ``redis+sentinel://`` URL, else a plain one. Typed as ``redis.Redis``: the
    cluster client takes the same commands and pipelines that tokenq sends (every script
    and multi-key command stays on one slot), so the code that uses a connection needs no
    second annotation."""
    if is_sentinel_url(url):
        _not_a_cluster(url, cluster)
        return connect_sentinel(url, **options)
    node = cluster_url(url, cluster)
    if node is None:
        return redis.Redis.from_url(url, **options)
    client = RedisCluster.from_url(node, **options)
    note_masters(client)
    return cast(redis.Redis, client)


def connect_async(url: str, cluster: bool = False, **options: Any) -> redis.asyncio.Redis:
    """The asyncio twin of ``connect``."""
    if is_sentinel_url(url):
        _not_a_cluster(url, cluster)
        return connect_sentinel_async(url, **options)
    node = cluster_url(url, cluster)
    if node is None:
        return redis.asyncio.Redis.from_url(url, **options)
    return cast(redis.asyncio.Redis, AsyncRedisCluster.from_url(node, **options))


def _not_a_cluster(url: str, cluster: bool) -> None:
    if cluster:
        raise InvalidRequest(
            f"{shown_url(url)} names a Sentinel service, not a Redis Cluster: unset "
            "TOKENQ_REDIS_CLUSTER (or give a redis+cluster:// URL)"
        )


def is_cluster(connection: Any) -> bool:
    return isinstance(connection, RedisCluster | AsyncRedisCluster)


def refresh(connection: Any) -> None:
    """After an error, have a cluster client read the slot map again (a master may have
    failed over), so its next command goes to the new one; nothing for one Redis."""
    try:
        if isinstance(connection, RedisCluster):
            connection.nodes_manager.initialize()
            note_masters(connection)
    except (redis.RedisError, RedisClusterException) as e:
        log.debug("cluster slot map refresh failed: %s", e)


async def refresh_async(connection: Any) -> None:
    try:
        if isinstance(connection, AsyncRedisCluster):
            await connection.nodes_manager.initialize()
            note_masters(connection)
    except (redis.RedisError, RedisClusterException) as e:
        log.debug("cluster slot map refresh failed: %s", e)


# The masters this process last saw in each cluster it talks to (told apart by their
# nodes): a master not seen before (a replica promoted) is said once in the log, as
# Sentinel's change of primary is, whichever of the process's clients sees it first.
@dataclass
class _SeenCluster:
    nodes: set[str]
    masters: frozenset[str]


_clusters_seen: list[_SeenCluster] = []
_seen_lock = threading.Lock()


def note_masters(connection: Any) -> None:
    """Record a cluster client's masters; log a failover the first time one is seen.
    Called when a client connects, re-reads its slot map, or works again after errors
    (redis-py may have re-read the slot map by itself); nothing for one Redis."""
    if not isinstance(connection, RedisCluster | AsyncRedisCluster):
        return
    masters = frozenset(node.name for node in connection.get_primaries())
    if not masters:
        return  # an asyncio client that has not read its slot map yet
    nodes = {node.name for node in connection.get_nodes()}
    with _seen_lock:
        seen = next((c for c in _clusters_seen if c.nodes & nodes), None)
        if seen is None:
            _clusters_seen.append(_SeenCluster(nodes, masters))
            return
        seen.nodes |= nodes
        before = seen.masters
        if masters < before:
            return  # a dead master not replaced yet: wait for the promotion
        seen.masters = masters
    if masters - before:
        log.warning(
            "Redis Cluster failed over: %s now master (was: %s)",
            ", ".join(sorted(masters - before)),
            ", ".join(sorted(before - masters)) or "none",
        )


def close(connection: SyncRedis) -> None:
    """Close ``connection`` and its sockets (a cluster client's ``close`` leaves the
    pools of its nodes' connections open)."""
    connection.close()
    if isinstance(connection, RedisCluster):
        for node in connection.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


class Backoff:
    """Exponential backoff with a ceiling, for reconnecting to Redis."""

    def __init__(self, first_s: float = 0.1, max_s: float = 5.0) -> None:
        self.first_s, self.max_s, self.next_s = first_s, max_s, first_s

    def wait(self) -> float:
        delay, self.next_s = self.next_s, min(self.next_s * 2, self.max_s)
        time.sleep(delay)
        return delay

    def reset(self) -> None:
        self.next_s = self.first_s


def shown_url(url: str) -> str:
    """``url`` with any password replaced, fit for logs and error messages."""
    if is_sentinel_url(url):
        return shown_sentinel_url(url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    netloc = f"{user}{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def unreachable_message(url: str, error: BaseException) -> str:
    return f"cannot reach Redis at {shown_url(url)}: {error}"


def wait_for_redis(connection: redis.Redis, url: str, log: logging.Logger) -> None:
    """Return once Redis answers a PING; until then say so and retry with backoff."""
    backoff = Backoff(first_s=0.5)
    while True:
        try:
            connection.ping()
            return
        except UNREACHABLE as e:
            log.warning("%s; retrying in %.1fs", unreachable_message(url, e), backoff.next_s)
            backoff.wait()


async def wait_for_redis_async(
    connection: redis.asyncio.Redis, url: str, log: logging.Logger
) -> None:
    """The asyncio twin of ``wait_for_redis``; also says when Redis answers at last."""
    backoff, failed = Backoff(first_s=0.5), False
    while True:
        try:
            await connection.ping()
        except UNREACHABLE as e:
            failed = True
            log.warning("%s; retrying in %.1fs", unreachable_message(url, e), backoff.next_s)
            await asyncio.sleep(backoff.next_s)
            backoff.next_s = min(backoff.next_s * 2, backoff.max_s)
            continue
        if failed:
            log.info("Redis at %s answers", shown_url(url))
        return
