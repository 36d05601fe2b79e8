"""Redis CPU and commands per generated token of the request lifecycle, driven straight
through the scripts (no engine, no timers), so the figures do not move with how busy
the host is: entries per token and requests per write are fixed here, where in
bench/scale.py they follow the worker's coalescing, which a loaded host shortens.

``--workers`` simulated workers of ``--batch`` rows each and a look-ahead of
``--lookahead``: per write round every worker claims what the engine would
(``EngineConfig.num_to_claim``: once the batch is full, the look-ahead two at a time),
writes one stream entry of ``--tokens-per-entry`` tokens per running request (the final
with the last) and, in the same round trip, settles what its last write ended (with its
usage), as worker/queue.py does; then one XREAD names every running request's stream
from its cursor, as the gateway's hub does; submits keep the queue topped up. Workers
start staggered, one request a round, so about one request ends per write.

    python bench/request_cost.py [--requests 600] [--max-tokens 32] [--rounds 3]
    python bench/request_cost.py --min-replicas 1     # one replica, each wait for it

A copy of this file in another checkout drives that checkout's scripts: run both at
once to compare them under the same load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/...`

import orjson
import redis

from bench.scale_run import Target, node_totals, prepare, single_target
from producer.client import Client
from shared.connection import connect
from shared.keys import Keys
from shared.models import FinalEvent, FinishReason, Usage, token_wire
from shared.ops.claim import Claimed
from shared.ops.moves import Fate, Settle
from shared.ops.publish import Final, Publish, TokenPublish
from shared.settings import Settings
from shared.usage import record_call
from worker.engine.config import EngineConfig
from worker.queue import ModelQueue

MODEL = "sim:step_ms=20,knee=16,max_num_seqs=16"
TOKEN_ID = 42


@dataclass
class Row:
    claimed: Claimed
    num_written: int = 0


@dataclass
class Worker:
    queue: ModelQueue
    batch: int
    config: EngineConfig
    rows: list[Row] = field(default_factory=list)  # running
    waiting: list[Row] = field(default_factory=list)  # claimed, in the look-ahead
    claimed: int = 0
    finished: int = 0

    def turn(self, limit: int, tokens_per_entry: int, max_tokens: int) -> None:
        # What the engine would claim (EngineConfig.num_to_claim), up to ``limit``.
        free = self.config.num_to_claim(self.batch, len(self.rows) + len(self.waiting))
        room = min(free, limit)
        if room > 0:
            claimed = self.queue.claim(room, room, None)
            self.waiting += [Row(c) for c in claimed]
            self.claimed += len(claimed)
        while self.waiting and len(self.rows) < self.batch:
            self.rows.append(self.waiting.pop(0))
        if not self.rows:
            return
        events = [self._event(r, tokens_per_entry, max_tokens) for r in self.rows]
        q = self.queue
        # As ModelQueue.write: what the last write ended is settled in this round trip.
        written = q.publish(Publish(events), ends=any(e.final for e in events))
        moved = [w.finished.moved for w in written if w.finished is not None]
        for row, event in zip(self.rows, events, strict=True):
            row.num_written += event.num_tokens
        self.rows = [r for r in self.rows if r.num_written < max_tokens]
        if moved:
            used = [(None, Usage(prompt_tokens=4, completion_tokens=max_tokens))] * len(moved)
            settle = Settle(q.tag, moved).call(q.keys)
            q.settle_later([settle, record_call(q.keys, q.settings, used)])
            self.finished += len(moved)

    @staticmethod
    def _event(row: Row, tokens_per_entry: int, max_tokens: int) -> TokenPublish:
        n = min(tokens_per_entry, max_tokens - row.num_written)
        index = row.num_written
        wire = token_wire(index, [TOKEN_ID] * n, " a" * n)
        final = None
        if index + n >= max_tokens:
            usage = Usage(prompt_tokens=4, completion_tokens=max_tokens)
            event = FinalEvent(finish_reason=FinishReason.LENGTH, usage=usage)
            output = orjson.dumps({"text": " a" * max_tokens, "token_ids": [TOKEN_ID] * max_tokens})
            final = Final.of(event, output, Fate.FINISHED)
        c = row.claimed
        return TokenPublish(c.request_id, c.lease_token, wire, index, n, final)


class Reader:
    """One XREAD a round over every stream of a running request, from its cursor."""

    def __init__(self, connection: redis.Redis) -> None:
        self.connection, self.cursors = connection, dict[str, str]()

    def read(self, workers: list[Worker]) -> None:
        keys = Keys()
        running = {keys.stream(r.claimed.request_id) for w in workers for r in w.rows}
        self.cursors = {k: self.cursors.get(k, "0-0") for k in running}
        if not self.cursors:
            return
        reply: Any = self.connection.xread(self.cursors)  # type: ignore[arg-type]
        for key, entries in reply or ():
            self.cursors[key.decode()] = entries[-1][0].decode()


@dataclass(frozen=True)
class Cost:
    tokens: int
    cpu_us_per_token: float
    commands_per_token: float
    evalsha_per_token: float
    script_us_per_token: float  # the scripts' own time (INFO commandstats): no kernel in it


def measure(target: Target, args: argparse.Namespace) -> list[Cost]:
    settings = Settings(
        redis_url=target.url, max_queued=1_000_000, redis_min_replicas=args.min_replicas
    )
    connection = connect(target.url)
    prepare(target, connection, MODEL)
    client = Client(settings=settings)
    config = EngineConfig(model=MODEL, num_lookahead_slots=args.lookahead)
    workers = [
        Worker(ModelQueue(connect(target.url), settings, MODEL, f"w{n}"), args.batch, config)
        for n in range(args.workers)
    ]
    reader = Reader(connect(target.url))
    body = {"model": MODEL, "prompt": "a b c d", "sampling": {"max_tokens": args.max_tokens}}
    node = target.any_node()
    costs, round_no, submitted = [], 0, 0
    for measured in range(args.rounds + 1):  # the first round warms up
        start, done = node_totals(node), sum(w.finished for w in workers)
        while sum(w.finished for w in workers) - done < args.requests:
            # The queue's depth counted here, not asked of Redis: a web app does not poll
            # it, and its round trip would be the bench's cost, not the lifecycle's.
            queued = submitted - sum(w.claimed for w in workers)
            missing = 2 * args.workers * args.batch - queued
            if missing > 0:
                client.submit_many([body] * missing)
                submitted += missing
            for w in workers:
                # Staggered start: one more row a round until the batch is full.
                w.turn(1 if round_no < w.batch else w.batch, args.tokens_per_entry,
                       args.max_tokens)  # fmt: skip
            reader.read(workers)
            round_no += 1
        if measured:
            delta = node_totals(node) - start
            tokens = (sum(w.finished for w in workers) - done) * args.max_tokens
            evalsha, script_us = delta.by_command.get("evalsha", (0, 0))
            cpu_us, commands = delta.cpu_s * 1e6 / tokens, delta.commands / tokens
            costs.append(Cost(tokens, cpu_us, commands, evalsha / tokens, script_us / tokens))
    return costs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--lookahead", type=int, default=EngineConfig.num_lookahead_slots,
        help="look-ahead slots beside the batch (EngineConfig.num_lookahead_slots)",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=600, help="finished per round")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--tokens-per-entry", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-replicas", type=int, default=0, help="TOKENQ_REDIS_MIN_REPLICAS")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with single_target(args.min_replicas) as target:
        costs = measure(target, args)
    print(
        f"{target.kind}, TOKENQ_REDIS_MIN_REPLICAS={args.min_replicas}; {args.workers} "
        f"workers x {args.batch} rows; {args.requests} requests of {args.max_tokens} tokens "
        f"a round, {args.tokens_per_entry} tokens an entry"
    )
    for c in costs:
        print(
            f"  {c.cpu_us_per_token:6.2f} us Redis CPU per token, {c.commands_per_token:.2f} "
            f"commands per token ({c.evalsha_per_token:.3f} script calls, "
            f"{c.script_us_per_token:.2f} us in them)"
        )
    median = statistics.median(c.cpu_us_per_token for c in costs)
    print(f"median {median:.2f} us Redis CPU per token")


if __name__ == "__main__":
    main()
