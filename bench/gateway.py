"""What the HTTP gateway costs: latency added per token over reading the Redis Stream
directly, and how many concurrent SSE streams one gateway process holds with p99 added
latency under 50 ms.

A synthetic publisher plays a worker: it claims the requests and, every step, publishes
one token to each of them in one pipelined round trip (the publish script, as a worker
does). Each token's text is its publish time in ns. At each concurrency level the same
load is read twice: directly (one multiplexed XREAD, the cheapest possible reader) and
through the gateway (one SSE connection per request); the difference is the gateway's.

    python bench/gateway.py [--levels 100,250,500,750,1000] [--seconds 5] [--tokens-per-s 20]

Everything runs on loopback: its own redis-server and one gateway process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producer.embedded import EmbeddedRedis, free_port
from shared.gc_policy import freeze_startup_objects
from shared.keys import Keys, model_tag, new_request_id
from shared.models import FinalEvent, FinishReason, GenerationRequest, dumps
from shared.registry import mark_served
from shared.scripts import (
    AsyncScripts,
    TokenPublish,
    claim_call,
    enqueue_call,
    finish_call,
    load_source,
    parse_claim,
    publish_call,
    renew_call,
)
from shared.settings import Settings

MODEL = "bench-model"
STAMP = re.compile(rb"(\d{19}) ")
GOAL_ADDED_P99_MS = 50.0
WARMUP_S = 0.5
CONNECT_TIMEOUT_S = 60.0
MAX_LEVEL_S = 120.0
OnToken = Callable[[bytes, int], None]
TOKEN_JSON = '{"type":"token","index":%d,"token_ids":[%d],"text":"%d ","logprobs":null}'


@dataclass
class Latencies:
    """Publish-to-receive times (ms) of tokens published after the warm-up."""

    tokens_per_s: float = 0.0
    num_received: int = 0
    # While the publisher ran: the gateway's CPU seconds, wall seconds, tokens received.
    window_cpu_s: float = 0.0
    window_client_cpu_s: float = 0.0  # this process: publisher and readers
    window_s: float = 0.0
    window_tokens: int = 0
    after_ns: int = 0
    ms: list[float] = field(default_factory=list)

    def record(self, data: bytes, received_ns: int) -> None:
        for match in STAMP.finditer(data):
            self.num_received += 1
            sent_ns = int(match.group(1))
            if sent_ns >= self.after_ns:
                self.ms.append((received_ns - sent_ns) / 1e6)

    def pct(self, q: float) -> float:
        if not self.ms:
            return float("nan")
        return statistics.quantiles(self.ms, n=1000, method="inclusive")[int(q * 10) - 1]


@dataclass
class Bench:
    redis_url: str
    gateway_url: str
    gateway_pid: int
    settings: Settings
    tokens_per_s: float
    seconds: float

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.tag = model_tag(MODEL)


# The synthetic worker.
async def enqueue(r: redis.asyncio.Redis, b: Bench, n: int) -> list[str]:
    scripts, ids = AsyncScripts(r), [new_request_id(MODEL) for _ in range(n)]
    req = GenerationRequest(model=MODEL, prompt="bench")
    pipe = r.pipeline(transaction=False)
    for request_id in ids:
        await scripts.run(enqueue_call(b.keys, b.settings, request_id, req), pipe)
    await pipe.execute()
    return ids


async def claim_all(r: redis.asyncio.Redis, b: Bench) -> dict[str, str]:
    ids = [_text(i) for i in await r.zrange(b.keys.queue(b.tag), 0, -1)]
    tokens: dict[str, str] = {}
    for start in range(0, len(ids), 200):
        call = claim_call(b.keys, b.settings, b.tag, "bench", ids[start : start + 200])
        tokens.update(
            {c.request_id: c.lease_token for c in parse_claim(await AsyncScripts(r).run(call))}
        )
    return tokens


async def publish(r: redis.asyncio.Redis, b: Bench, held: dict[str, str], until: float) -> int:
    """One token per request per step, in one publish call (as a worker's step does),
    until ``until``, renewing the leases; then each request's final event. The event is
    built by hand (as ``dumps(TokenEvent)`` would) so that the stamp is close to the moment
    it is sent."""
    sha = await r.script_load(load_source("publish"))
    interval_s, index = 1.0 / b.tokens_per_s, 0
    renew_every_s, renewed = b.settings.lease_ms / 3_000, time.monotonic()
    while time.monotonic() < until:
        step_started = time.monotonic()
        if step_started - renewed > renew_every_s:  # as a worker's heartbeat does
            await AsyncScripts(r).run(renew_call(b.keys, b.settings, b.tag, held))
            renewed = step_started
        event = (TOKEN_JSON % (index, index, time.time_ns())).encode()
        step = [TokenPublish(i, token, event, index, 1) for i, token in held.items()]
        call = publish_call(b.keys, step)
        await r.evalsha(sha, len(call.keys), *call.keys, *call.args)
        index += 1
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - step_started)))
    await finish(r, b, held, index)
    return index


async def finish(r: redis.asyncio.Redis, b: Bench, held: dict[str, str], n: int) -> None:
    final, output = (
        dumps(FinalEvent(finish_reason=FinishReason.LENGTH)),
        orjson.dumps({"text": "", "token_ids": []}),
    )
    pipe = r.pipeline(transaction=False)
    for request_id, token in held.items():
        call = finish_call(b.keys, b.settings, request_id, token, final, output, "finished")
        await AsyncScripts(r).run(call, pipe)
    await pipe.execute()


# Readers.
async def read_direct(r: redis.asyncio.Redis, b: Bench, ids: list[str], on_token: OnToken) -> None:
    """One XREAD over every stream until each has its final event."""
    cursors: dict[str | bytes, str | bytes] = {b.keys.stream(i): "0-0" for i in ids}
    while cursors:
        reply: Any = await r.xread(cursors, block=1_000, count=1_000)  # type: ignore[arg-type]
        now = time.time_ns()
        for key, entries in reply or []:
            for entry_id, fields in entries:
                on_token(fields[b"e"], now)
                cursors[_text(key)] = entry_id
                if b'"final"' in fields[b"e"]:
                    del cursors[_text(key)]


class SSEReader(asyncio.Protocol):
    """A lean SSE client: stamps bytes as they arrive, in the loop's read callback, so
    one reader's turn never delays another's timestamp (a task per stream would)."""

    def __init__(self, path: str, on_token: OnToken, connected: asyncio.Event) -> None:
        self.path, self.on_token, self.connected = path, on_token, connected
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(f"GET {self.path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        received_ns = time.time_ns()
        if not self.connected.is_set() and b"\r\n\r\n" in data:
            self.connected.set()  # headers in; the body follows (chunk sizes never match STAMP)
        self.on_token(data, received_ns)
        if b"event: final" in data and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def read_sse(b: Bench, request_id: str, on_token: OnToken, connected: asyncio.Event) -> None:
    host, port = b.gateway_url.removeprefix("http://").split(":")
    path = f"/v1/requests/{request_id}/events"
    loop = asyncio.get_running_loop()
    _, reader = await loop.create_connection(
        lambda: SSEReader(path, on_token, connected), host, int(port)
    )
    await reader.done


# One level.
async def run_level(r: redis.asyncio.Redis, b: Bench, n: int, through_gateway: bool) -> Latencies:
    await asyncio.sleep(1.0)  # let the previous level's connections drain
    ids = await enqueue(r, b, n)
    held = await claim_all(r, b)
    lat = Latencies(b.tokens_per_s)
    readers = await start_readers(r, b, ids, lat, through_gateway)
    lat.after_ns = time.time_ns() + int(WARMUP_S * 1e9)
    cpu_before, wall_before, tokens_before = (
        cpu_s(b.gateway_pid),
        time.monotonic(),
        lat.num_received,
    )
    client_before = time.process_time()
    await publish(r, b, held, time.monotonic() + WARMUP_S + b.seconds)
    lat.window_client_cpu_s = time.process_time() - client_before
    lat.window_cpu_s = cpu_s(b.gateway_pid) - cpu_before
    lat.window_s = time.monotonic() - wall_before
    lat.window_tokens = lat.num_received - tokens_before
    async with asyncio.timeout(MAX_LEVEL_S):
        await asyncio.gather(*readers)
    return lat


async def start_readers(
    r: redis.asyncio.Redis, b: Bench, ids: list[str], lat: Latencies, through_gateway: bool
) -> list[asyncio.Future[None]]:
    if not through_gateway:
        return [asyncio.ensure_future(read_direct(r, b, ids, lat.record))]
    events = [asyncio.Event() for _ in ids]
    readers: list[asyncio.Future[None]] = [
        asyncio.ensure_future(read_sse(b, i, lat.record, e))
        for i, e in zip(ids, events, strict=True)
    ]
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        await asyncio.gather(*(e.wait() for e in events))
    return readers


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Row = tuple[int, Latencies, Latencies]  # streams, direct, through the gateway


async def bench_levels(b: Bench, levels: list[int]) -> list[Row]:
    r = redis.asyncio.Redis.from_url(b.redis_url, max_connections=64)
    pipe = r.pipeline()
    mark_served(pipe, b.keys, b.settings, MODEL)
    await pipe.execute()
    rows = []
    for n in levels:
        direct = await run_level(r, b, n, through_gateway=False)
        gateway = await run_level(r, b, n, through_gateway=True)
        rows.append((n, direct, gateway))
        report_row(n, direct, gateway)
        await r.flushdb()
        pipe = r.pipeline()
        mark_served(pipe, b.keys, b.settings, MODEL)
        await pipe.execute()
    await r.aclose()
    return rows


# Output.
def report_row(n: int, direct: Latencies, gw: Latencies) -> None:
    added = (gw.pct(50) - direct.pct(50), gw.pct(99) - direct.pct(99))
    print(
        f"{n:>7} {direct.pct(50):>8.2f} {direct.pct(99):>8.2f} {gw.pct(50):>8.2f} "
        f"{gw.pct(99):>8.2f} {added[0]:>+8.2f} {added[1]:>+8.2f} "
        f"{gw.window_tokens / gw.window_s:>8.0f} {gw.window_cpu_s / gw.window_s * 100:>6.0f}% "
        f"{us_per_token(gw):>7.0f} {gw.window_client_cpu_s / gw.window_s * 100:>6.0f}% "
        f"{len(gw.ms):>8}",
        flush=True,
    )


def us_per_token(lat: Latencies) -> float:
    return lat.window_cpu_s * 1e6 / lat.window_tokens if lat.window_tokens else float("nan")


def machine_load() -> str:
    """Load average and CPU pressure (PSI): on a shared box these, not the gateway, may
    bound the figures, and a reader should know."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()[1:3]
    except OSError:
        some = ["n/a"]
    return f"load average {' '.join(load)}; CPU pressure (some) {' '.join(some)}"


def summary(rows: list[Row]) -> None:
    n, direct, gateway = rows[0]
    print(
        f"\nadded per token at {n} streams: p50 {gateway.pct(50) - direct.pct(50):+.2f} ms, "
        f"p99 {gateway.pct(99) - direct.pct(99):+.2f} ms "
        f"(gateway/direct: p50 x{gateway.pct(50) / direct.pct(50):.2f}, "
        f"p99 x{gateway.pct(99) / direct.pct(99):.2f})"
    )
    held = [n for n, d, g in rows if g.pct(99) - d.pct(99) < GOAL_ADDED_P99_MS and g.ms]
    best = max(held, default=0)
    n, _, gateway = rows[-1]
    us = us_per_token(gateway)
    print(
        f"gateway CPU per token delivered (at {n} streams): {us:.0f} us, so one whole core "
        f"would push ~{1e6 / us:,.0f} tokens/s (~{1e6 / us / gateway.tokens_per_s:,.0f} "
        f"streams at {gateway.tokens_per_s:g} tokens/s each)"
    )
    print(f"machine after the run: {machine_load()}")
    print(
        f"most concurrent SSE streams with p99 added < {GOAL_ADDED_P99_MS:g} ms: {best} "
        f"(of levels tried: {', '.join(str(r[0]) for r in rows)}; goal 500: "
        f"{'met' if best >= 500 else 'NOT met'})"
    )


def start_gateway(redis_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "producer.gateway",
        "--redis",
        redis_url,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--log-level",
        "WARNING",
    ]
    env = {
        **os.environ,
        "TOKENQ_API_KEYS": "",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the gateway did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="100,250,500,750,1000", help="concurrent streams")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level")
    parser.add_argument("--tokens-per-s", type=float, default=20.0, help="tokens/s per stream")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    server = EmbeddedRedis().start()
    proc, url = start_gateway(server.url)
    try:
        b = Bench(
            server.url,
            url,
            proc.pid,
            Settings(redis_url=server.url, max_queued=100_000),
            args.tokens_per_s,
            args.seconds,
        )
        print(
            f"tokenq gateway bench: {os.cpu_count()} CPUs, {server.kind}, one gateway process, "
            f"{args.tokens_per_s:g} tokens/s per stream, {args.seconds:g} s per level "
            f"(latencies in ms, publish to receive)"
        )
        print(f"machine before the run: {machine_load()}")
        print(
            f"{'streams':>7} {'dir p50':>8} {'dir p99':>8} {'gw p50':>8} {'gw p99':>8} "
            f"{'add p50':>8} {'add p99':>8} {'gw tok/s':>8} {'gw cpu':>7} {'us/tok':>7} "
            f"{'cli cpu':>7} {'samples':>8}"
        )
        # The load generator's own full collections would stall its readers' stamps.
        freeze_startup_objects()
        summary(asyncio.run(bench_levels(b, levels)))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.stop()


if __name__ == "__main__":
    main()
