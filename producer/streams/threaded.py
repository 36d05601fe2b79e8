"""Many followed streams on few connections, for threads: ``aio``'s hub with a reader
thread, followers waking on a ``threading.Event``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, cast

import redis
from redis.cluster import RedisCluster

from producer.streams.core import E, Followers, Parse, Subscription
from producer.streams.sync_sources import BlockingSource, ClusterSource, Entries, own_reader
from shared.connection import UNREACHABLE, is_cluster

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0


class Source(Protocol):
    def read(self, cursors: dict[str, str], changed: threading.Event) -> Entries: ...

    def pause(self, changed: threading.Event) -> None: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


def sync_source(connection: redis.Redis) -> Source:
    if is_cluster(connection):
        return ClusterSource(cast(RedisCluster, connection))
    return BlockingSource(own_reader(connection), connection)


class Follower(Generic[E]):
    def __init__(self, sub: Subscription[E], ready: threading.Event, lock: threading.Lock):
        self._sub, self._ready, self._lock = sub, ready, lock

    def next(self, timeout_s: float) -> list[E]:
        """What has arrived since the last call, waiting up to ``timeout_s`` for it
        (empty if nothing came)."""
        self._ready.wait(timeout_s)
        with self._lock:
            return self._sub.take()


class ThreadHub(Generic[E]):
    """Fans the entries of many Redis Streams out to followers in any thread."""

    def __init__(self, source: Source, parse: Parse[E]) -> None:
        self._source = source
        self._followers = Followers[E](parse)
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tokenq-streams", daemon=True)

    @property
    def num_subscriptions(self) -> int:
        with self._lock:
            return self._followers.num_subscriptions

    def start(self) -> ThreadHub[E]:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()
        self._source.interrupt()
        self._thread.join(STOP_TIMEOUT_S)
        self._source.close()

    @contextmanager
    def follow(self, key: str, after: str = "0-0") -> Iterator[Follower[E]]:
        """Follow stream ``key`` from after ``after`` (ValueError for a bad id) until the
        block is left."""
        ready = threading.Event()
        with self._lock:
            sub = self._followers.add(key, after, ready)
        try:
            self._changed.set()
            self._source.interrupt()
            yield Follower(sub, ready, self._lock)
        finally:
            with self._lock:
                self._followers.remove(sub)

    def _run(self) -> None:
        backoff_s = 0.05
        while not self._stopping:
            try:
                self._step()
                backoff_s = 0.05
            except (redis.RedisError, *UNREACHABLE) as e:
                log.warning("stream reader: %s; retrying in %.2fs", e, backoff_s)
                self._changed.wait(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    def _step(self) -> None:
        with self._lock:
            idle = not self._followers
        if idle:
            self._changed.wait()
        self._changed.clear()
        with self._lock:
            read_from = self._followers.cursors()
        if not read_from or self._stopping:
            return
        entries = self._source.read(read_from, self._changed)
        with self._lock:
            self._followers.dispatch(entries, read_from)
        self._source.pause(self._changed)
