"""Reaching Redis: one Redis or a Redis Cluster, backoff, the URL as it may be printed,
and waiting for Redis at start."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# A sync or asyncio connection to one Redis or to a Redis Cluster.
SyncRedis = redis.Redis | RedisCluster
AsyncRedis = redis.asyncio.Redis | AsyncRedisCluster

# What "Redis is not there (yet)" looks like; anything else is a real error.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def cluster_url(url: str, cluster: bool = False) -> str | None:
    """The plain URL of a cluster node when ``url`` names a cluster (a ``redis+cluster://``
    URL, or any URL with ``cluster`` set: TOKENQ_REDIS_CLUSTER), else None."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}"
    return url if cluster else None


def connect(url: str, cluster: bool = False, **options: Any) -> redis.Redis:
    """A sync connection: redis-py's cluster client for a cluster, else a plain one.
    Typed as ``redis.Redis``: the cluster client takes the same commands and pipelines
    that tokenq sends (every script and multi-key command stays on one slot), so the
    code that uses a connection needs no second annotation."""
    node = cluster_url(url, cluster)
    if node is None:
        return redis.Redis.from_url(url, **options)
    return cast(redis.Redis, RedisCluster.from_url(node, **options))


def connect_async(url: str, cluster: bool = False, **options: Any) -> redis.asyncio.Redis:
    """The asyncio twin of ``connect``."""
    node = cluster_url(url, cluster)
    if node is None:
        return redis.asyncio.Redis.from_url(url, **options)
    return cast(redis.asyncio.Redis, AsyncRedisCluster.from_url(node, **options))


def is_cluster(connection: Any) -> bool:
    return isinstance(connection, RedisCluster | AsyncRedisCluster)


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
