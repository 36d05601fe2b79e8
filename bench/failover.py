"""Redis failing over under load, and what waiting for replicas costs: one run.

A real primary with two replicas behind three sentinels (tests/sentinel.py), SIMULATED
workers, a client submitting a paced load and reading every accepted stream live
(tests/integration/failover.py). For TOKENQ_REDIS_MIN_REPLICAS = 0 and = 1 in turn:

* failover: the primary is SIGKILLed a third of the way into the load; printed are the
  requests accepted, lost (accepted but never finished), finished twice, streams with a
  gap or a repeat (on the new primary, and as live readers saw them), the failover's own
  time and the longest a live reader waited between two token events;
* cost, without a failover: the latency of single submits (p50/p99), and the tokens/s a
  worker on a simulated engine that takes no time pushes through Redis (every write
  that ends requests waits for the replica with N = 1), with N = 1 as a ratio to N = 0.

    python bench/failover.py [--requests 150] [--max-tokens 32] [--submits 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/...`

from producer.client import Client
from shared.connection import connect
from shared.keys import Keys
from tests.integration.failover import Load, audit, settings_for, sim_workers
from tests.integration.faults import wait_until
from tests.sentinel import LocalSentinel

FAST_SIM = "sim:step_ms=0,knee=64,max_num_seqs=64"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=150, help="the failover's load")
    parser.add_argument("--per-s", type=float, default=25.0, help="its submits a second")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--submits", type=int, default=300, help="single submits timed")
    parser.add_argument("--drain", type=int, default=400, help="requests a fast worker drains")
    return parser.parse_args()


# Longer than the tests' second: on a busy box a second without an answer is not rare,
# and a sentinel would take a live primary for dead.
DOWN_AFTER_MS = 2000


def failover(min_replicas: int, args: argparse.Namespace) -> dict[str, object]:
    local = LocalSentinel(num_replicas=2, down_after_ms=DOWN_AFTER_MS).start()
    try:
        connection = connect(local.url)
        client = Client(connection=connection, settings=settings_for(local.url, min_replicas))
        env = {"TOKENQ_REDIS_MIN_REPLICAS": str(min_replicas)}
        with (
            tempfile.TemporaryDirectory() as logs,
            sim_workers(local.url, args.workers, env, Path(logs)),
        ):
            wait_until(lambda: connection.zcard(Keys().workers()) >= args.workers, 120, "workers")
            load = Load(client, args.requests, args.max_tokens, args.per_s).start()
            wait_until(lambda: len(load.accepted) >= args.requests // 3, 120, "a third")
            old = local.primary_port()
            killed = time.monotonic()
            local.kill(old)
            local.wait_for_failover(old)
            failover_s = time.monotonic() - killed
            load.wait(300)
            outcome = audit(load, connection)
        client.close()
        return {"failover_s": round(failover_s, 2), **outcome.report()}
    finally:
        local.stop()


def cost(min_replicas: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """(submit p50 ms, submit p99 ms, tokens/s through Redis)."""
    local = LocalSentinel(num_replicas=2, down_after_ms=DOWN_AFTER_MS).start()
    try:
        connection = connect(local.url)
        client = Client(connection=connection, settings=settings_for(local.url, min_replicas))
        env = {"TOKENQ_REDIS_MIN_REPLICAS": str(min_replicas)}
        with tempfile.TemporaryDirectory() as logs:
            with sim_workers(local.url, 1, env, Path(logs), model=FAST_SIM):
                wait_until(lambda: connection.zcard(Keys().workers()) >= 1, 120, "a worker")
            p50, p99 = submit_latency(client, args.submits)
            body = {"model": FAST_SIM, "prompt": "x", "sampling": {"max_tokens": args.max_tokens}}
            handles = client.submit_many([body] * args.drain)
            with sim_workers(local.url, 1, env, Path(logs), model=FAST_SIM):
                started = time.monotonic()
                for h in handles:
                    h.result(timeout=300)
                elapsed = time.monotonic() - started
        client.close()
        return p50, p99, args.drain * args.max_tokens / elapsed
    finally:
        local.stop()


def submit_latency(client: Client, n: int) -> tuple[float, float]:
    """Single submits one after another, each cancelled (so none runs): p50 and p99 ms."""
    times = []
    for i in range(n):
        began = time.perf_counter()
        handle = client.submit(f"latency {i}", model=FAST_SIM, max_tokens=1)
        times.append((time.perf_counter() - began) * 1000)
        handle.cancel()
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))]


def main() -> None:
    args = parse_args()
    print("Sentinel: a primary, 2 replicas, 3 sentinels on loopback; "
          f"{args.workers} SIMULATED workers; {args.requests} requests of "
          f"{args.max_tokens} tokens, {args.per_s:g}/s")  # fmt: skip
    print(f"{'N':>2} {'accepted':>8} {'lost':>5} {'twice':>5} {'bad streams':>11} "
          f"{'bad reads':>9} {'failover s':>10} {'longest silence s':>17}")  # fmt: skip
    for n in (0, 1):
        r = failover(n, args)
        print(f"{n:>2} {r['accepted']:>8} {r['lost']:>5} {r['finished_twice']:>5} "
              f"{r['bad_streams']:>11} {r['bad_reads']:>9} {r['failover_s']:>10} "
              f"{r['longest_silence_s']:>17}", flush=True)  # fmt: skip
    print(f"\ncost without a failover: {args.submits} single submits; {args.drain} requests "
          f"drained by one worker on an engine that takes no time ({FAST_SIM})")  # fmt: skip
    figures = {n: cost(n, args) for n in (0, 1)}
    for n, (p50, p99, rate) in figures.items():
        print(
            f"N={n}: submit p50 {p50:.2f} ms, p99 {p99:.2f} ms; {rate:,.0f} tokens/s through Redis"
        )
    (p50_0, p99_0, rate_0), (p50_1, p99_1, rate_1) = figures[0], figures[1]
    print(
        f"N=1 / N=0: submit p50 x{p50_1 / p50_0:.2f}, p99 x{p99_1 / p99_0:.2f}, "
        f"tokens/s x{rate_1 / rate_0:.2f}"
    )


if __name__ == "__main__":
    main()
