"""Following many streams at once: one Redis against a 3-master Redis Cluster, and on
the cluster request tags on the bounded slots (``shared.keys.REQUEST_SLOTS``) against a
slot per request (the tags before them).

A writer thread appends an entry to every stream every ``--step-ms`` for ``--rounds``
rounds (one pipelined round trip a round, as a worker's coalesced write lands); one
gateway stream hub (``producer.gateway.hub``) follows every stream and hands each entry
to its follower, as a gateway serving SSE does. Printed per case: wall time until every
follower had every entry, the XREADs Redis ran and their time (INFO commandstats, all
nodes), Redis CPU (all nodes, the writer's XADDs included) and the hub thread's CPU.

    python bench/scale_readers.py [--streams 2000] [--rounds 40] [--step-ms 25]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/...`

from bench.scale_run import Target, cluster_target, single_target
from producer.gateway.hub import gateway_hub
from shared.connection import close, connect, connect_async
from shared.keys import (
    HEAD_CHARS,
    NUM_REQUEST_SLOTS,
    NUM_SLOTS,
    Keys,
    model_tag,
    new_request_id,
    slot_tag,
)

MODEL = "bench-readers"
EVENT = b'{"type":"token","index":0,"token_ids":[1,2],"text":"a b ","logprobs":null}'


@dataclass(frozen=True)
class Case:
    name: str
    target: Callable[[], AbstractContextManager[Target]]
    new_id: Callable[[], str]


def per_request_slot_id() -> str:
    """An id as made before the bounded slots: a random 16-hex tag, on any slot."""
    return f"{model_tag(MODEL)}-{secrets.token_hex(8)}{secrets.token_hex(4)}"


def bounded_id(num_slots: int) -> Callable[[], str]:
    """Ids as ``new_request_id`` makes them, on ``num_slots`` slots spread evenly."""
    slots = [i * NUM_SLOTS // num_slots for i in range(num_slots)]

    def new_id() -> str:
        tag = slot_tag(secrets.token_hex(6)[:HEAD_CHARS], secrets.choice(slots))
        return f"{model_tag(MODEL)}-{tag}{secrets.token_hex(4)}"

    return new_id


def cases(slot_counts: list[int]) -> list[Case]:
    return [
        Case("one Redis", single_target, lambda: new_request_id(MODEL)),
        Case("cluster, a slot per request", cluster_target, per_request_slot_id),
        *(Case(f"cluster, {n} slots", cluster_target, bounded_id(n)) for n in slot_counts),
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--step-ms", type=float, default=25.0)
    parser.add_argument(
        "--slots", default=str(NUM_REQUEST_SLOTS), help="request slot counts to try, e.g. 48,96"
    )
    return parser.parse_args()


@dataclass
class Counters:
    xread_calls: int
    xread_usec: int
    cpu_s: float


def counters(nodes: dict[str, redis.Redis]) -> Counters:
    total = Counters(0, 0, 0.0)
    for node in nodes.values():
        xread = node.info("commandstats").get("cmdstat_xread", {})
        cpu = node.info("cpu")
        total.xread_calls += int(xread.get("calls", 0))
        total.xread_usec += int(xread.get("usec", 0))
        total.cpu_s += float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
    return total


def write(url: str, keys: list[str], rounds: int, step_s: float) -> None:
    connection = connect(url)
    try:
        for _ in range(rounds):
            pipe = connection.pipeline(transaction=False)
            for key in keys:
                pipe.xadd(key, {"e": EVENT})
            pipe.execute()
            time.sleep(step_s)
    finally:
        close(connection)


async def follow_all(url: str, keys: list[str], rounds: int, step_s: float) -> float:
    """Hub CPU seconds (this thread) until every follower had ``rounds`` entries."""
    connection = connect_async(url)
    hub = gateway_hub(connection)
    hub.start()

    async def follow(key: str) -> None:
        seen = 0
        async for batch in hub.subscribe(key):
            seen += len(batch)
            if seen >= rounds:
                return

    tasks = [asyncio.create_task(follow(k)) for k in keys]
    await asyncio.sleep(0.5)  # every follower is in the hub's reads
    cpu = time.thread_time()
    writer = threading.Thread(target=write, args=(url, keys, rounds, step_s))
    writer.start()
    await asyncio.gather(*tasks)
    cpu = time.thread_time() - cpu
    writer.join()
    await hub.stop()
    await connection.aclose()
    return cpu


@contextmanager
def timed() -> Iterator[list[float]]:
    out: list[float] = []
    start = time.monotonic()
    yield out
    out.append(time.monotonic() - start)


def run(case: Case, args: argparse.Namespace, one_redis_hub_us: float | None) -> float:
    """Prints the case's figures; returns the hub's CPU per entry (us)."""
    with case.target() as target:
        keys = [Keys().stream(case.new_id()) for _ in range(args.streams)]
        before = counters(target.nodes)
        with timed() as wall:
            hub_cpu_s = asyncio.run(follow_all(target.url, keys, args.rounds, args.step_ms / 1000))
        after = counters(target.nodes)
    entries = args.streams * args.rounds
    calls, usec = after.xread_calls - before.xread_calls, after.xread_usec - before.xread_usec
    redis_cpu_s, hub_us = after.cpu_s - before.cpu_s, hub_cpu_s * 1e6 / entries
    ratio = "" if one_redis_hub_us is None else f" ({hub_us / one_redis_hub_us:.2f}x one Redis's)"
    print(
        f"{case.name:>28}: {wall[0]:5.1f} s, {calls:6d} XREADs ({calls / args.rounds:6.1f} a round)"
        f" {usec / entries:5.2f} us/entry, Redis CPU {redis_cpu_s * 1e6 / entries:5.2f} us/entry,"
        f" hub CPU {hub_us:6.1f} us/entry{ratio}",
        flush=True,
    )
    return hub_us


def main() -> None:
    args = parse_args()
    print(
        f"{args.streams} streams followed by one gateway hub; {args.rounds} rounds of an entry"
        f" to every stream every {args.step_ms:g} ms"
    )
    one_redis_hub_us: float | None = None
    for case in cases([int(n) for n in args.slots.split(",")]):
        hub_us = run(case, args, one_redis_hub_us)
        one_redis_hub_us = one_redis_hub_us or hub_us


if __name__ == "__main__":
    main()
