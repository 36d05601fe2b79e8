"""Tools for the fault tests: a restartable redis-server, stream audits, waiting."""

from __future__ import annotations

import itertools
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from producer.client import Client
from producer.embedded import free_port, wait_for_redis
from shared.keys import Keys
from shared.models import FinalEvent, TokenEvent
from shared.records import stream_event
from shared.replies import text

SHIPPED_CONFIG = str(Path(__file__).parents[2] / "deploy" / "redis.conf")


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    give_up = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


@dataclass
class StreamAudit:
    """What a client reading one request's stream saw."""

    token_ids: list[int]
    indexes_contiguous: bool
    duplicated_tokens: int
    longest_gap_ms: int
    final: FinalEvent | None
    stamps_ms: list[int] = field(default_factory=list)  # when each event was written

    def silence_across(self, at_ms: int) -> tuple[int, int]:
        """How long the stream was silent around ``at_ms``: from its last event at or
        before it to its first after it, and from ``at_ms`` to that first event after
        it; (0, 0) when it had none before or none after."""
        before = [s for s in self.stamps_ms if s <= at_ms]
        after = [s for s in self.stamps_ms if s > at_ms]
        return (after[0] - before[-1], after[0] - at_ms) if before and after else (0, 0)

    def longest_gap_outside_ms(self, at_ms: list[int]) -> int:
        """The longest silence that spans none of the moments ``at_ms``."""
        gaps = itertools.pairwise(self.stamps_ms)
        return max((b - a for a, b in gaps if not any(a <= t < b for t in at_ms)), default=0)


def audit_stream(connection: redis.Redis, request_id: str) -> StreamAudit:
    entries: Any = connection.xrange(Keys().stream(request_id))
    events = [stream_event(i, f) for i, f in entries]
    tokens = [e.event for e in events if isinstance(e.event, TokenEvent)]
    expected, contiguous, duplicated = 0, True, 0
    for t in tokens:
        if t.index < expected:
            duplicated += expected - t.index
        contiguous &= t.index == expected
        expected = max(expected, t.index + len(t.token_ids))
    stamps = [int(e.id.split("-")[0]) for e in events]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    final = events[-1].event if events and isinstance(events[-1].event, FinalEvent) else None
    ids = [tid for t in tokens for tid in t.token_ids]
    return StreamAudit(ids, contiguous, duplicated, max(gaps, default=0), final, stamps)


@dataclass
class RedisProcess:
    """A redis-server with the shipped durability settings that a test can kill."""

    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        args = [
            "redis-server",
            SHIPPED_CONFIG,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_for_redis(self.url)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def redis_now_ms(connection: redis.Redis) -> int:
    """Redis's clock, the one its stream ids are stamped with."""
    seconds, micros = connection.time()
    return int(seconds) * 1000 + int(micros) // 1000


def running_on(connection: redis.Redis, request_ids: list[str], pid: int) -> list[str]:
    """The requests whose hash says a worker process ``pid`` runs them."""
    pipe = connection.pipeline(transaction=False)
    for rid in request_ids:
        pipe.hmget(Keys().request(rid), "state", "worker")
    held = []
    for rid, (state, worker) in zip(request_ids, pipe.execute(), strict=True):
        if state == b"running" and worker is not None and f"-{pid}-" in worker.decode():
            held.append(rid)
    return held


def serving(connection: redis.Redis, pid: int) -> bool:
    """Whether the worker process ``pid`` has loaded its model and serves (its registry
    entry says so; while it loads, the entry says ``loading``)."""
    keys = Keys()
    for raw in connection.zrange(keys.workers(), 0, -1):
        worker_id = text(raw)
        if f"-{pid}-" in worker_id:
            return connection.hget(keys.worker(worker_id), "state") == b"serving"
    return False


def wait_all_done(client: Client, ids: list[str], timeout_s: float) -> None:
    """Until every request has ended; on timeout, says where each one is."""
    try:
        wait_until(all_done(client, ids), timeout_s, "every request to end")
    except AssertionError as e:
        statuses = [client.handle(i).status() for i in ids]
        where = Counter((s.state.value, s.attempts, s.num_generated > 0) for s in statuses)
        raise AssertionError(f"{e}; (state, attempts, started) counts: {dict(where)}") from e


def all_done(client: Client, ids: list[str]) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return all(client.handle(i).status().state.terminal for i in ids)
        except redis.ConnectionError:
            return False

    return check
