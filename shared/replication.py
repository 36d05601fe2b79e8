"""Waiting for replicas (``TOKENQ_REDIS_MIN_REPLICAS``): a round trip whose writes decide
a request's fate returns only once that many replicas have them.

WAIT counts replicas that have every write the waiting connection made, so it is sent
on one connection after a write of its own (a short-lived barrier key on the slot of a
key the round trip touched): replication is one ordered stream per primary, so the
barrier reaching a replica means every write before it did. On one Redis (or one found
through Sentinel) the barrier and WAIT end the round trip's own pipeline; on a Redis
Cluster they go to each primary the flow wrote to, on a connection of their own.
Redis calls WAIT best effort: it says how many replicas have a write, not that a
failover will pick one of them. Sentinel picks the replica with the largest offset in
its last INFO of each, which can be seconds old, so with two replicas and WAIT 1 it can
promote the one that lacked the write. So a round trip waits for every replica its
primary listed online and keeping up at the last look (ROLE, read with each confirmed
write, and first where the last look could be from before a failover), and never for
fewer than wanted: whichever of them is promoted has the write.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from shared.errors import ReplicationTimeout
from shared.settings import Settings

BARRIER_TTL_MS = 60_000


@dataclass(frozen=True)
class Look:
    """What a primary's ROLE said: how many replicas to wait for, its replication
    offset, and when it was read."""

    replicas: int
    offset: int
    at: float


@dataclass
class Replicas:
    """How many replicas must have a fate-deciding write, and how long to wait for them;
    and how many each primary had keeping up at the last look (a write waits for them
    all)."""

    wanted: int = 0
    timeout_ms: int = 2_000
    # primary ("" for the one of a plain connection) -> its last look
    _looks: dict[str, Look] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, settings: Settings) -> Replicas:
        return cls(settings.redis_min_replicas, settings.redis_replica_timeout_ms)

    def stale(self, primary: str = "") -> bool:
        """Whether ``primary``'s replicas are to be looked at (``note`` a ROLE) before
        the next write: never read, or not since before a failover could have begun."""
        look = self._looks.get(primary)
        return look is None or time.monotonic() - look.at > LOOK_VALID_S

    def note(self, role: Any, primary: str = "") -> None:
        """A ROLE reply: the replicas it lists online that have acknowledged everything
        the primary had at the look before (all of them at a first look) are the ones
        the next write waits for. So a replica that hangs, still connected, costs a
        write or two the timeout, not every write until the primary drops it."""
        kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
        if kind != "master":
            self._looks[primary] = Look(0, 0, time.monotonic())
            return
        before = self._looks.get(primary)
        floor = 0 if before is None else before.offset
        keeping_up = sum(int(replica[2]) >= floor for replica in role[2])
        self._looks[primary] = Look(keeping_up, int(role[1]), time.monotonic())

    def commands(self, key: str, primary: str = "") -> list[tuple[Any, ...]]:
        """The barrier on ``key``'s slot, the WAIT for every replica keeping up at the
        last look (at least ``wanted``) and a ROLE for the next look, to end a pipeline
        with (``CONFIRM_REPLIES`` replies, read by ``check``)."""
        barrier = ("SET", barrier_key(key), 1, "PX", BARRIER_TTL_MS)
        look = self._looks.get(primary)
        asked = max(self.wanted, 0 if look is None else look.replicas)
        return [barrier, ("WAIT", asked, self.timeout_ms), ("ROLE",)]

    def check(self, replies: Sequence[Any], what: str, primary: str = "") -> None:
        """Raise unless enough replicas acknowledged; look at the replicas again."""
        self.note(replies[-1], primary)
        acked = int(replies[-2])
        if acked < self.wanted:
            raise ReplicationTimeout(what, acked, self.wanted, self.timeout_ms)

    def forget(self) -> None:
        """A primary was unreachable (a failover, maybe): look at its replicas again."""
        self._looks.clear()


# A look at a primary's replicas holds this long. Under load every confirmed round trip
# looks again for free; a failover takes longer than this (Sentinel's down-after and
# its election), so the first write on a new primary looks first, and does not wait
# for a replica the old primary had.
LOOK_VALID_S = 0.5
CONFIRM_REPLIES = 3  # the replies of ``Replicas.commands``


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
        if replicas.stale(node.name):
            replicas.note(node.redis_connection.execute_command("ROLE"), node.name)
        for command in replicas.commands(key, node.name):
            pipe.execute_command(*command)
        replicas.check(pipe.execute(), what, node.name)


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
            if replicas.stale(node.name):
                replicas.note(await client.execute_command("ROLE"), node.name)  # type: ignore[no-untyped-call]
            for command in replicas.commands(key, node.name):
                pipe.execute_command(*command)
            replicas.check(await pipe.execute(), what, node.name)
        finally:
            await client.aclose()


@dataclass(frozen=True)
class Confirm:
    """A round trip's request to wait for replicas: the keys of every write its flow
    made since the last confirmed round trip, and what to call it in an error."""

    keys: Sequence[str]
    what: str
