"""The gateway's stream hub: every stream its clients follow, read together.

A blocking read per subscriber would hold one Redis connection and one round trip per
token per stream; the hub instead keeps one connection blocked on all followed streams
at once (one per node, polling, on a Redis Cluster; see ``producer.streams``), so a
worker step that publishes to 500 streams reaches the gateway as one reply.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio

from producer.streams.aio import AsyncHub, async_source
from producer.streams.core import parse_cursor
from producer.streams.entries import Entry, readable_entries
from producer.streams.starts import lifecycle_starts
from shared.connection import is_cluster
from shared.keys import Keys

__all__ = ["StreamHub", "gateway_hub", "parse_cursor"]
log = logging.getLogger(__name__)
StreamHub = AsyncHub[Entry]


# After a read that returned entries, the next waits this long: at most this much added
# stream latency, for far fewer XREADs while tokens flow (each costs Redis per stream it
# names; docs/benchmarks.md has what the wait saves).
GATHER_S = 0.025


def gateway_hub(
    connection: redis.asyncio.Redis,
    idle_s: float = 2.0,
    gather_s: float = GATHER_S,
    keys: Keys | None = None,
) -> StreamHub:
    """A hub reading with its own connections to ``connection``'s Redis or cluster;
    raw replies, since redis-py's dict per entry costs as much as the rest of the hub.
    With ``keys`` (on one Redis), streams of requests that have not started are named
    in a read only once a second until their start is announced on the lifecycle
    channel (``producer.streams.core``): each stream named costs every read."""
    starts = None if keys is None or is_cluster(connection) else lifecycle_starts(connection, keys)
    source = async_source(connection, raw=True)
    return AsyncHub(source, parse_gateway_entry, idle_s, gather_s, starts)


def parse_gateway_entry(key: str, entry_id: str, fields: Any) -> list[Entry]:
    """An entry no one can read is skipped with a warning (the stream goes on)."""
    return readable_entries(key, [(entry_id, fields)])
