"""Fair shares between tenants under a skewed load, against plain FIFO, in one run.

One heavy tenant submits a large backlog at ``normal``; a few light tenants submit a
little work just after it. Both orders run on the same simulated fleet (threads with
``worker.sim``, no model) against one real redis-server:

* ``fifo``: every request goes in with no tenant, so the queue is first come, first
  served (the tenant is kept in other metadata for the figures);
* ``fair``: each request carries its tenant (weight 1), so claims follow the
  weighted fair order of ``shared.fairness``.

Prints, per order, each tenant's time to first token (mean and p90) and Jain's
fairness index over a window while all are backlogged: x_i is the service (tokens
started) tenant i got over its max-min fair share of what was served (water-filling
over the tenants' demands), so 1.0 is a perfectly fair split. Then the ratios of the
light tenants' TTFT and of the index, fair against FIFO.

    python bench/fairness.py [--heavy 1200] [--light 4x25] [--workers 4] [--window-s 2]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.models import TENANT
from shared.registry import mark_served
from shared.replies import text
from shared.settings import Settings
from worker.sim_fleet import sim_fleet

SIM = "sim:step_ms=5,knee=8,max_num_seqs=8"
MAX_TOKENS = 8
LABEL = "bench_tenant"  # the tenant as the figures see it, in both orders


@dataclass(frozen=True)
class Run:
    ttft_s: dict[str, list[float]]
    jain: float


def load(num_heavy: int, light: tuple[int, int]) -> list[tuple[str, int]]:
    """(tenant, count) in submit order: the heavy backlog first, then each light tenant."""
    num_light, per_light = light
    return [("heavy", num_heavy), *((f"light{n}", per_light) for n in range(num_light))]


def run(url: str, order: str, plan: list[tuple[str, int]], workers: int, window_s: float) -> Run:
    conn = redis.Redis.from_url(url)
    conn.flushall()
    settings = Settings(redis_url=url, max_queued=100_000)
    pipe = conn.pipeline()
    mark_served(pipe, Keys(), settings, SIM)
    pipe.execute()
    client = Client(connection=conn, settings=settings)
    ids: dict[str, list[str]] = {}
    with sim_fleet(url, SIM, workers, settings):
        start_ms = _redis_ms(conn)
        for tenant, count in plan:
            meta = {LABEL: tenant, **({TENANT: tenant} if order == "fair" else {})}
            body = {"model": SIM, "prompt": "a b c d", "metadata": meta}
            reqs = [{**body, "sampling": {"max_tokens": MAX_TOKENS}} for _ in range(count)]
            ids[tenant] = [h.id for h in client.submit_many(reqs)]
        for tenant_ids in ids.values():
            for rid in tenant_ids:
                client.handle(rid).result(timeout=600)
    return _figures(conn, ids, start_ms, window_s)


def _redis_ms(conn: redis.Redis) -> int:
    seconds, micros = conn.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _figures(conn: redis.Redis, ids: dict[str, list[str]], start_ms: int, window_s: float) -> Run:
    ttft: dict[str, list[float]] = {}
    served: dict[str, int] = {}
    for tenant, tenant_ids in ids.items():
        pipe = conn.pipeline(transaction=False)
        for rid in tenant_ids:
            pipe.hmget(Keys().request(rid), "created_ms", "first_token_ms", "started_ms")
        rows = [[int(text(v)) for v in row] for row in pipe.execute()]
        ttft[tenant] = [(first - created) / 1000 for created, first, _ in rows]
        served[tenant] = sum(
            MAX_TOKENS for *_, started in rows if started - start_ms <= window_s * 1000
        )
    demand = {t: len(v) * MAX_TOKENS for t, v in ids.items()}
    return Run(ttft, jain(served, demand))


def fair_shares(capacity: float, demand: dict[str, int]) -> dict[str, float]:
    """Max-min fair split of ``capacity`` (water-filling): nobody gets over its demand."""
    shares: dict[str, float] = {}
    left, todo = capacity, sorted(demand, key=lambda t: demand[t])
    while todo:
        each = left / len(todo)
        tenant = todo[0]
        if demand[tenant] <= each:
            shares[tenant] = demand[tenant]
            left -= demand[tenant]
            todo.pop(0)
        else:
            for t in todo:
                shares[t] = each
            break
    return shares


def jain(served: dict[str, int], demand: dict[str, int]) -> float:
    """Jain's index of service over max-min fair share: 1.0 is perfectly fair."""
    shares = fair_shares(sum(served.values()), demand)
    x = [served[t] / shares[t] for t in served if shares[t] > 0]
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if x else 1.0


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def report(name: str, result: Run) -> None:
    print(f"\n{name}: Jain's fairness index {result.jain:.3f}")
    print(f"  {'tenant':<8} {'requests':>8} {'TTFT mean':>10} {'TTFT p90':>9}")
    for tenant, values in result.ttft_s.items():
        print(
            f"  {tenant:<8} {len(values):>8} {statistics.mean(values):>9.3f}s {p90(values):>8.3f}s"
        )


def light_mean(result: Run) -> float:
    return statistics.mean(v for t, vs in result.ttft_s.items() if t != "heavy" for v in vs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy", type=int, default=1200)
    parser.add_argument("--light", default="4x25", help="light tenants x requests each")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=2.0)
    args = parser.parse_args()
    num_light, per_light = (int(x) for x in args.light.split("x"))
    plan = load(args.heavy, (num_light, per_light))
    server = EmbeddedRedis().start()
    try:
        fifo = run(server.url, "fifo", plan, args.workers, args.window_s)
        fair = run(server.url, "fair", plan, args.workers, args.window_s)
    finally:
        server.stop()
    print(f"{args.workers} simulated workers ({SIM}), {MAX_TOKENS} tokens per request;")
    print(f"heavy: {args.heavy} requests, then {num_light} light tenants x {per_light}")
    report("FIFO (no tenants)", fifo)
    report("fair (tenants, weight 1)", fair)
    print(f"\nlight tenants' mean TTFT, fair / FIFO: {light_mean(fair) / light_mean(fifo):.3f}")
    print(
        f"Jain's index over the first {args.window_s:g}s, fair / FIFO: {fair.jain / fifo.jain:.3f}"
    )


if __name__ == "__main__":
    main()
