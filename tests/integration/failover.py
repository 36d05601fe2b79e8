"""Load for the failover tests and bench/failover.py: simulated worker processes, a
client that keeps submitting (retrying with its idempotency key until a submit is
acknowledged) while readers follow every accepted request's stream live, and what
they saw, audited."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from producer.client import Client
from shared.errors import NotFound, RequestTimeout, TokenqError
from shared.keys import Keys
from shared.models import FinalEvent, TokenEvent
from shared.records import stream_event
from shared.settings import Settings
from tests.integration.faults import StreamAudit, audit_stream
from tests.integration.workers import worker_processes

SIM_MODEL = "sim:step_ms=20,knee=8,max_num_seqs=8"
# Short leases and beats, so a request whose worker lost it resumes within seconds.
FAILOVER_ENV = {"TOKENQ_LEASE_MS": "2000", "TOKENQ_WORKER_HEARTBEAT_MS": "400"}
RETRY_S = 0.05  # between tries of a submit that Redis did not acknowledge


@contextmanager
def sim_workers(
    url: str, n: int, env: dict[str, str], log_dir: Path, model: str = SIM_MODEL
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` simulated worker processes on ``url`` (logs in ``log_dir``), killed at the end."""
    with worker_processes(url, model, n, {**FAILOVER_ENV, **env}, log_dir) as procs:
        yield procs


@dataclass
class Seen:
    """What one live reader of one request saw."""

    token_ids: list[int] = field(default_factory=list)
    stamps_s: list[float] = field(default_factory=list)  # when each token event arrived
    finals: int = 0
    error: str = ""

    def longest_silence_s(self) -> float:
        gaps = [b - a for a, b in zip(self.stamps_s, self.stamps_s[1:], strict=False)]
        return max(gaps, default=0.0)


@dataclass
class Load:
    """Submits ``total`` requests of ``max_tokens`` tokens, ``per_s`` a second, each
    retried with its idempotency key until acknowledged, and follows each accepted one."""

    client: Client
    total: int
    max_tokens: int
    per_s: float
    model: str = SIM_MODEL
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> request id
    refusals: list[str] = field(default_factory=list)  # what failed submits said
    submit_s: list[float] = field(default_factory=list)  # acknowledged submits' latency
    seen: dict[str, Seen] = field(default_factory=dict)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        feeder = threading.Thread(target=self._feed, daemon=True)
        feeder.start()
        self._threads.append(feeder)
        return self

    def _feed(self) -> None:
        for n in range(self.total):
            began = time.monotonic()
            self._submit(f"load-{n}")
            time.sleep(max(0.0, 1 / self.per_s - (time.monotonic() - began)))

    def _submit(self, key: str) -> None:
        body = {"model": self.model, "prompt": f"request {key}", "idempotency_key": key,
                "sampling": {"max_tokens": self.max_tokens}}  # fmt: skip
        while True:
            began = time.monotonic()
            try:
                (handle,) = self.client.submit_many([body])
            except (redis.RedisError, TokenqError) as e:
                self.refusals.append(f"{type(e).__name__}: {e}")
                time.sleep(RETRY_S)
                continue
            self.submit_s.append(time.monotonic() - began)
            self.accepted[key] = handle.id
            reader = threading.Thread(target=self._follow, args=(handle.id,), daemon=True)
            reader.start()
            self._threads.append(reader)
            return

    def _follow(self, request_id: str) -> None:
        seen = self.seen.setdefault(request_id, Seen())
        try:
            for event in self.client.handle(request_id).stream(timeout=120):
                if isinstance(event.event, TokenEvent):
                    seen.token_ids += event.event.token_ids
                    seen.stamps_s.append(time.monotonic())
                elif isinstance(event.event, FinalEvent):
                    seen.finals += 1
        except (NotFound, RequestTimeout, redis.RedisError) as e:
            seen.error = f"{type(e).__name__}: {e}"

    def wait(self, timeout_s: float) -> None:
        give_up = time.monotonic() + timeout_s
        while self._threads:
            self._threads.pop(0).join(timeout=max(0.1, give_up - time.monotonic()))
            if time.monotonic() > give_up:
                raise AssertionError(f"the load did not end within {timeout_s}s")


@dataclass(frozen=True)
class Outcome:
    """The load's audit: what clients were told, what the new primary holds."""

    accepted: int
    finished: int
    lost: list[str]  # accepted, yet gone (no hash, or never ended)
    finished_twice: list[str]
    bad_streams: list[str]  # a gap, a repeat, or other tokens than an uninterrupted run
    bad_reads: list[str]  # what a live reader saw: the same checks
    longest_silence_s: float  # the longest a live reader waited between two token events

    def report(self) -> dict[str, object]:
        return {
            "accepted": self.accepted, "finished": self.finished, "lost": len(self.lost),
            "finished_twice": len(self.finished_twice), "bad_streams": len(self.bad_streams),
            "bad_reads": len(self.bad_reads),
            "longest_silence_s": round(self.longest_silence_s, 2),
        }  # fmt: skip


def audit(load: Load, connection: redis.Redis) -> Outcome:
    expected = list(range(load.max_tokens))  # a simulated model writes 0, 1, 2, ...
    lost, twice, bad_streams, bad_reads, finished = [], [], [], [], 0
    for request_id in load.accepted.values():
        stream = audit_stream(connection, request_id)
        if stream.final is None:
            lost.append(request_id)
            continue
        finished += 1
        if _finals(connection, request_id) != 1:
            twice.append(request_id)
        if not _whole(stream, expected):
            bad_streams.append(f"{request_id}: {_described(stream)}")
        seen = load.seen.get(request_id, Seen())
        if seen.token_ids != expected or seen.finals != 1:
            bad_reads.append(f"{request_id}: {seen.token_ids} {seen.finals} {seen.error}")
    silence = max((s.longest_silence_s() for s in load.seen.values()), default=0.0)
    return Outcome(len(load.accepted), finished, lost, twice, bad_streams, bad_reads, silence)


def _whole(stream: StreamAudit, expected: list[int]) -> bool:
    return (
        stream.indexes_contiguous and not stream.duplicated_tokens and stream.token_ids == expected
    )


def _described(stream: StreamAudit) -> str:
    return (
        f"tokens {stream.token_ids}, contiguous {stream.indexes_contiguous}, "
        f"repeated {stream.duplicated_tokens}, final {stream.final}"
    )


def _finals(connection: redis.Redis, request_id: str) -> int:
    entries: Any = connection.xrange(Keys().stream(request_id))
    return sum(isinstance(stream_event(i, f).event, FinalEvent) for i, f in entries)


def settings_for(url: str, min_replicas: int) -> Settings:
    return Settings(redis_url=url, redis_min_replicas=min_replicas, max_queued=100_000,
                    redis_replica_timeout_ms=2000)  # fmt: skip
