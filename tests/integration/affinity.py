"""A fleet of real workers on the default model for prefix-affinity runs (the
integration test and bench/affinity.py): start it with affinity on or off, run a load
of requests that share a few long prefixes, and read the fleet's prefix-cache figures
from the worker registry."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from producer.client import Client
from shared.keys import Keys
from shared.models import Result
from shared.replies import text
from shared.settings import DEFAULT_MODEL
from tests.integration.workers import worker_processes

# Heartbeats often enough that a worker's warm set follows its cache closely; a request
# passed over for a warm match waits up to a few of its service times on the CPU (the
# default, 1 s, is for GPU steps); a torch thread per worker, so that workers sharing a
# few cores do not fight over them.
FLEET_ENV = {
    "TOKENQ_WORKER_HEARTBEAT_MS": "200",
    "TOKENQ_PREFIX_AFFINITY_MAX_WAIT_MS": "30000",
    "OMP_NUM_THREADS": "1",
}
TOPICS = ("tides", "glaciers", "bridges", "orchards", "comets", "harbors", "deserts", "mills",
          "lighthouses", "canals", "volcanoes", "libraries")  # fmt: skip


def preamble(n: int, num_sentences: int) -> str:
    """A long, distinct leading text: its first characters already differ from the others'."""
    topic = TOPICS[n % len(TOPICS)]
    lines = [f"Handbook {n} on {topic}. Read it before you answer."]
    lines += [
        f"Rule {i} about {topic}: entry {i * 7 % 31} is filed under shelf {(i * n + 3) % 13}."
        for i in range(num_sentences)
    ]
    return "\n".join(lines)


@contextmanager
def fleet(
    url: str,
    n: int,
    affinity: bool,
    log_dir: Path,
    *worker_args: str,
    env: dict[str, str] | None = None,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` real worker processes on the default model, killed at the end."""
    switch = {"TOKENQ_PREFIX_AFFINITY": "true" if affinity else "false"}
    name = f"worker-{'on' if affinity else 'off'}"
    full_env = {**FLEET_ENV, **switch, **(env or {})}
    with worker_processes(url, DEFAULT_MODEL, n, full_env, log_dir, name, worker_args) as procs:
        yield procs


def serving(connection: redis.Redis) -> int:
    keys = Keys()
    ids = [text(i) for i in connection.zrange(keys.workers(), 0, -1)]
    return sum(connection.hget(keys.worker(i), "state") == b"serving" for i in ids)


@dataclass(frozen=True)
class FleetFigures:
    prompt_tokens: int  # looked up in the prefix caches
    hit_tokens: int  # of those, found cached
    affinity_claims: int

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / max(self.prompt_tokens, 1)


def fleet_figures(connection: redis.Redis) -> FleetFigures:
    """Summed over the live workers' registry entries (their last heartbeat)."""
    keys = Keys()
    entries = [connection.hgetall(keys.worker(text(i)))
               for i in connection.zrange(keys.workers(), 0, -1)]  # fmt: skip

    def total(field: bytes) -> int:
        return sum(int(e.get(field, b"0")) for e in entries)

    return FleetFigures(
        total(b"prefix_cache_queries"), total(b"prefix_cache_hits"), total(b"affinity_claims")
    )


@dataclass(frozen=True)
class Outcome:
    results: list[Result]
    total_s: float
    figures: FleetFigures

    def ttft_s(self, q: float) -> float:
        ttfts = sorted(r.timings.ttft_s or 0.0 for r in self.results)
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))]

    @property
    def median_ttft_s(self) -> float:
        return statistics.median(r.timings.ttft_s or 0.0 for r in self.results)


def run_load(
    client: Client, bodies: Sequence[dict[str, Any]], timeout_s: float, heartbeat_s: float = 0.5
) -> Outcome:
    """Submit every body at once, wait for all to end, then one heartbeat for the figures."""
    start = time.monotonic()
    handles = client.submit_many(bodies)
    give_up = start + timeout_s
    results = [h.result(timeout=max(give_up - time.monotonic(), 0.1)) for h in handles]
    total_s = time.monotonic() - start
    time.sleep(heartbeat_s)
    return Outcome(results, total_s, fleet_figures(client.redis))
