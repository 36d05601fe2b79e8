"""What claiming only the LoRA requests a worker can serve costs, timed in one run.

    python bench/claim_lora.py [--rounds 200] [--batch 8]

On a redis-server of its own: the time of one claim.lua call (a worker's intake of
``--batch`` queue heads) over base requests as before adapters were told apart
(``any``), the same with the worker's rank looked up (``rank 16``), a base-only
worker whose heads are adapter requests with base work behind them (``look past``:
it skips the heads and takes base work up to 64 entries further), and one facing
adapter requests only (``nothing``: it claims none). Printed: each against ``any``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys, model_tag
from shared.loras import new_adapter, register_lora
from shared.ops.claim import CLAIM_LOOK_PAST, Claim
from shared.registry import mark_served
from shared.scripts import Scripts
from shared.settings import Settings

MODEL = "bench-model"
TAG = model_tag(MODEL)
KEYS = Keys()


def fill(client: Client, num_lora: int, num_base: int) -> None:
    lora = {"model": MODEL, "prompt": "x", "lora": "poet", "priority": "high"}
    base = {"model": MODEL, "prompt": "x"}
    for body, n in ((lora, num_lora), (base, num_base)):
        for start in range(0, n, 500):
            client.submit_many([body] * min(500, n - start))


def time_claims(r: redis.Redis, settings: Settings, rank: int | None, args: Any) -> float:
    """Median seconds of one claim.lua call over ``args.rounds`` intakes."""
    scripts, times = Scripts(r), []
    for _ in range(args.rounds):
        call = Claim(TAG, "bench", settings.lease_ms, args.batch, args.batch, rank).call(KEYS)
        started = time.perf_counter()
        scripts.run(call)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def case(client: Client, num_lora: int, base: bool, rank: int | None, args: Any) -> float:
    """A fresh queue of ``num_lora`` adapter requests ahead of enough base ones for every
    round (or none), claimed with ``rank``."""
    r = client.redis
    r.flushall()
    pipe = r.pipeline()
    mark_served(pipe, KEYS, client.settings, MODEL)
    pipe.execute()
    register_lora(r, KEYS, new_adapter(MODEL, "poet", "/adapters/poet", rank=8))
    fill(client, num_lora, args.rounds * args.batch + 100 if base else 0)
    return time_claims(r, client.settings, rank, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    server = EmbeddedRedis().start()
    try:
        r = redis.Redis.from_url(server.url)
        client = Client(connection=r, settings=Settings(max_queued=10**6))
        wall = CLAIM_LOOK_PAST  # the base work starts where a base-only look ends
        results = {
            "any": case(client, 0, True, None, args),
            "rank 16": case(client, 0, True, 16, args),
            "look past": case(client, wall, True, 0, args),
            "nothing": case(client, wall + args.batch, False, 0, args),
        }
    finally:
        server.stop()
    base = results["any"]
    for name, seconds in results.items():
        print(f"{name:>10}: {seconds * 1e6:7.1f} us per claim  ({seconds / base:4.2f}x any)")


if __name__ == "__main__":
    main()
