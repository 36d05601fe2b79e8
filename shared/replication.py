"""Waiting for replicas (``TOKENQ_REDIS_MIN_REPLICAS``): a round trip whose writes decide
a request's fate returns only once that many replicas have them.

WAIT counts replicas that have every write the waiting connection made, so it is sent
on one connection after a write of its own (a short-lived barrier key on the slot of a
key the round trip touched): replication is one ordered stream per primary, so the
barrier reaching a replica means every write before it did. On one Redis (or one found
through Sentinel) the barrier and WAIT end the round trip's own pipeline; on a Redis
Cluster they go to each primary the flow wrote to, on a connection of their own.
Redis calls WAIT best effort: it says how many replicas have a write, not that a
failover will pick one of them, so Sentinel's and the cluster's own settings (a
replica that fell behind is not promoted) complete the promise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from shared.errors import ReplicationTimeout
from shared.settings import Settings

BARRIER_TTL_MS = 60_000


@dataclass(frozen=True)
class Replicas:
    """How many replicas must have a fate-deciding write, and how long to wait for them."""

    wanted: int = 0
    timeout_ms: int = 2_000

    @classmethod
    def of(cls, settings: Settings) -> Replicas:
        return cls(settings.redis_min_replicas, settings.redis_replica_timeout_ms)

    def commands(self, key: str) -> list[tuple[Any, ...]]:
        """The barrier on ``key``'s slot and the WAIT, to end a pipeline with."""
        barrier = ("SET", barrier_key(key), 1, "PX", BARRIER_TTL_MS)
        return [barrier, ("WAIT", self.wanted, self.timeout_ms)]

    def check(self, acked: Any, what: str) -> None:
        if int(acked) < self.wanted:
            raise ReplicationTimeout(what, int(acked), self.wanted, self.timeout_ms)


NO_REPLICAS = Replicas()


def barrier_key(key: str) -> str:
    """A key on ``key``'s hash slot: its hash tag, or ``key`` itself as the tag."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start >= 0 and end > start + 1:
        return key[: end + 1] + ":replicated"
    return "{" + key + "}:replicated"


def first_keys(commands: Iterable[Any]) -> list[str]:
    """The key each command names first (a script's KEYS[1], a command's first
    argument), for finding the primaries a flow wrote to."""
    found = []
    for command in commands:
        keys = getattr(command, "keys", None)
        if keys:
            found.append(str(keys[0]))
        elif isinstance(command, tuple) and len(command) > 1:
            found.append(str(command[1]))
    return found


def confirm_cluster(
    cluster: RedisCluster, keys: Sequence[str], replicas: Replicas, what: str
) -> None:
    """Barrier and WAIT on each primary holding one of ``keys``."""
    by_node: dict[str, tuple[Any, str]] = {}
    for key in keys:
        node = cluster.get_node_from_key(key)  # type: ignore[no-untyped-call]
        by_node.setdefault(node.name, (node, key))
    for node, key in by_node.values():
        pipe = node.redis_connection.pipeline(transaction=False)
        for command in replicas.commands(key):
            pipe.execute_command(*command)
        replicas.check(pipe.execute()[-1], what)


async def confirm_cluster_async(
    cluster: AsyncRedisCluster, keys: Sequence[str], replicas: Replicas, what: str
) -> None:
    """The asyncio twin of ``confirm_cluster`` (a short-lived connection per primary)."""
    by_node: dict[str, tuple[Any, str]] = {}
    for key in keys:
        node = cluster.get_node_from_key(key)
        if node is not None:
            by_node.setdefault(node.name, (node, key))
    for node, key in by_node.values():
        pool = redis.asyncio.ConnectionPool(
            connection_class=node.connection_class, max_connections=1, **node.connection_kwargs
        )
        client = redis.asyncio.Redis.from_pool(pool)
        try:
            pipe = client.pipeline(transaction=False)
            for command in replicas.commands(key):
                pipe.execute_command(*command)
            replicas.check((await pipe.execute())[-1], what)
        finally:
            await client.aclose()


@dataclass(frozen=True)
class Confirm:
    """A round trip's request to wait for replicas: the keys of every write its flow
    made since the last confirmed round trip, and what to call it in an error."""

    keys: Sequence[str]
    what: str
