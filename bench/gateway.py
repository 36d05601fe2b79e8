"""What the HTTP gateway costs: latency added per token over reading the Redis Stream
directly, and how many concurrent SSE streams one gateway process holds with p99 added
latency under 50 ms.

A synthetic publisher plays a worker, in a process of its own: it claims the requests
and, every step, publishes one token to each of them in one pipelined round trip (the
publish script, as a worker does). Each token's text is its publish time in ns. At each
concurrency level every token is read twice at once: directly, by one multiplexed XREAD
in another process of its own (the cheapest possible reader), and through the gateway,
by one SSE connection per request in this process. What the gateway adds to a token is
the time it reached its SSE reader less the time it reached the direct reader; the
percentiles of that, token by token, are the figures (publisher and Redis delays are in
both and cancel).

``--api native`` (the default) follows requests queued beforehand on the native events
route; ``--api openai`` submits each one as an OpenAI streaming chat completion and reads
its chunks, as the ``openai`` package would.

    python bench/gateway.py [--levels 100,250,500,750,1000] [--seconds 5] [--tokens-per-s 20]
                            [--api native|openai]

Everything runs on loopback: its own redis-server and one gateway process.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import orjson
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producer.embedded import EmbeddedRedis, free_port
from shared.flows import accepted, claim_flow, drive_async, enqueue_flow, finish_flow
from shared.gc_policy import freeze_startup_objects
from shared.keys import Keys, model_tag
from shared.models import FinalEvent, FinishReason, GenerationRequest
from shared.ops.claim import Claim
from shared.ops.moves import Fate
from shared.ops.publish import Finish, Publish, TokenPublish
from shared.ops.renew import Renew
from shared.registry import mark_served
from shared.replies import text
from shared.scripts import AsyncScripts
from shared.settings import Settings

MODEL = "bench-model"
STAMP = re.compile(rb"(\d{19}) ")
GOAL_ADDED_P99_MS = 50.0
WARMUP_S = 0.5
CONNECT_TIMEOUT_S = 60.0
MAX_LEVEL_S = 120.0
OnToken = Callable[[str, bytes, int], None]
REQUEST_ID_HEADER = re.compile(rb"(?i)\r\nx-tokenq-request-id: ([0-9a-f-]+)\r\n")
TOKEN_JSON = '{"type":"token","index":%d,"token_ids":[%d],"text":"%d ","logprobs":null}'


Token = tuple[str, int]  # request id, publish stamp (ns)


@dataclass
class Arrivals:
    """When each token published after ``after_ns`` (the warm-up) reached a reader."""

    after_ns: int
    at: dict[Token, int] = field(default_factory=dict)
    num_received: int = 0

    def record(self, request_id: str, data: bytes, received_ns: int) -> None:
        for match in STAMP.finditer(data):
            self.num_received += 1
            sent_ns = int(match.group(1))
            if sent_ns >= self.after_ns:
                self.at[request_id, sent_ns] = received_ns


@dataclass
class Window:
    """While the publisher ran: the gateway's and this process's CPU seconds, wall
    seconds, tokens received through the gateway."""

    cpu_s: float
    client_cpu_s: float
    wall_s: float
    tokens: int


@dataclass
class Level:
    streams: int
    tokens_per_s: float
    direct_ms: list[float]  # publish to receive
    gateway_ms: list[float]
    added_ms: list[float]  # per token: through the gateway less directly
    missing: int  # tokens the direct reader got and the gateway's readers did not
    window: Window

    @classmethod
    def paired(
        cls, streams: int, tokens_per_s: float, direct: Arrivals, gw: Arrivals, window: Window
    ) -> Level:
        common = direct.at.keys() & gw.at.keys()
        return cls(
            streams,
            tokens_per_s,
            [(t - sent) / 1e6 for (_, sent), t in direct.at.items()],
            [(t - sent) / 1e6 for (_, sent), t in gw.at.items()],
            [(gw.at[k] - direct.at[k]) / 1e6 for k in common],
            len(direct.at.keys() - gw.at.keys()),
            window,
        )

    @property
    def us_per_token(self) -> float:
        w = self.window
        return w.cpu_s * 1e6 / w.tokens if w.tokens else math.nan


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return math.nan
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


@dataclass
class Bench:
    redis_url: str
    gateway_url: str
    gateway_pid: int
    settings: Settings
    tokens_per_s: float
    seconds: float
    api: str = "native"

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.tag = model_tag(MODEL)


# The synthetic worker.
async def enqueue(r: redis.asyncio.Redis, b: Bench, n: int) -> list[str]:
    reqs = [GenerationRequest(model=MODEL, prompt="bench") for _ in range(n)]
    enqueued = await drive_async(AsyncScripts(r), enqueue_flow(b.keys, b.settings, reqs))
    return accepted(enqueued, reqs, b.settings)


async def claim_all(r: redis.asyncio.Redis, b: Bench) -> dict[str, str]:
    tokens: dict[str, str] = {}
    while await r.zcard(b.keys.queue(b.tag)):
        claim = Claim(b.tag, "bench", b.settings.lease_ms, 200, 200)
        flow = claim_flow(b.keys, b.settings, claim)
        tokens.update(
            {c.request_id: c.lease_token for c in await drive_async(AsyncScripts(r), flow)}
        )
    return tokens


async def publish(r: redis.asyncio.Redis, b: Bench, held: dict[str, str], seconds: float) -> None:
    """One token per request per step, in one round trip (as a worker's step does),
    for ``seconds``, renewing the leases; then each request's final event. The event is
    built by hand (as ``dumps(TokenEvent)`` would) so that the stamp is close to the moment
    it is sent."""
    scripts = AsyncScripts(r)
    interval_s, index = 1.0 / b.tokens_per_s, 0
    renew_every_s, renewed = b.settings.lease_ms / 3_000, time.monotonic()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        step_started = time.monotonic()
        if step_started - renewed > renew_every_s:  # as a worker's heartbeat does
            await scripts.send([Renew(b.tag, held).call(b.keys, b.settings.lease_ms)])
            renewed = step_started
        event = (TOKEN_JSON % (index, index, time.time_ns())).encode()
        step = [TokenPublish(i, token, event, index, 1) for i, token in held.items()]
        await scripts.send(Publish(step).calls(b.keys, b.settings.result_ttl_s, cluster=False))
        index += 1
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - step_started)))
    await finish(r, b, held, index)


async def finish(r: redis.asyncio.Redis, b: Bench, held: dict[str, str], n: int) -> None:
    final, output = (
        FinalEvent(finish_reason=FinishReason.LENGTH),
        orjson.dumps({"text": "", "token_ids": []}),
    )
    scripts = AsyncScripts(r)
    for request_id, token in held.items():
        finish = Finish(request_id, token, final, output, Fate.FINISHED)
        await drive_async(scripts, finish_flow(b.keys, b.settings, finish))


async def read_direct(r: redis.asyncio.Redis, b: Bench, ids: list[str], after_ns: int) -> Arrivals:
    """One XREAD over every stream until each has its final event."""
    arrivals = Arrivals(after_ns)
    request_of = {b.keys.stream(i): i for i in ids}
    cursors: dict[str | bytes, str | bytes] = {key: "0-0" for key in request_of}
    while cursors:
        reply: Any = await r.xread(cursors, block=1_000, count=1_000)  # type: ignore[arg-type]
        now = time.time_ns()
        for raw_key, entries in reply or []:
            key = text(raw_key)
            for entry_id, fields in entries:
                arrivals.record(request_of[key], fields[b"e"], now)
                cursors[key] = entry_id
                if b'"final"' in fields[b"e"]:
                    del cursors[key]
    return arrivals


class Sidecar:
    """A process of its own that runs one job at a time (``publish`` or ``read_direct``),
    so that the synthetic worker and the direct reader never share a loop, nor a core's
    turn, with the SSE readers (a worker does not share its clients' process)."""

    JOBS: ClassVar[dict[str, Callable[..., Awaitable[Any]]]] = {
        "publish": publish,
        "read_direct": read_direct,
    }

    def __init__(self, b: Bench) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._conn, child = spawn.Pipe()
        self._proc = spawn.Process(target=_sidecar_main, args=(b, child), daemon=True)
        self._proc.start()

    async def run(self, job: str, *args: Any) -> Any:
        self._conn.send((job, args))
        return await asyncio.to_thread(self._conn.recv)

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(timeout=10)


def _sidecar_main(b: Bench, conn: Any) -> None:
    async def serve() -> None:
        r = redis.asyncio.Redis.from_url(b.redis_url)
        while (job := conn.recv()) is not None:
            name, args = job
            conn.send(await Sidecar.JOBS[name](r, b, *args))
        await r.aclose()

    freeze_startup_objects()
    asyncio.run(serve())


# Through the gateway.
class SSEReader(asyncio.Protocol):
    """A lean SSE client: stamps bytes as they arrive, in the loop's read callback, so
    one reader's turn never delays another's timestamp (a task per stream would). It
    sends ``request``; with no ``request_id`` it learns it from the response headers."""

    def __init__(
        self, request: bytes, request_id: str, on_token: OnToken, connected: asyncio.Event
    ) -> None:
        self.request, self.request_id = request, request_id
        self.on_token, self.connected = on_token, connected
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        received_ns = time.time_ns()
        if not self.connected.is_set() and b"\r\n\r\n" in data:
            if not self.request_id and (found := REQUEST_ID_HEADER.search(data)):
                self.request_id = found.group(1).decode()
            self.connected.set()  # headers in; the body follows (chunk sizes never match STAMP)
        self.on_token(self.request_id, data, received_ns)
        if (b"event: final" in data or b"data: [DONE]" in data) and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


def native_request(request_id: str) -> bytes:
    path = f"/v1/requests/{request_id}/events"
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


def openai_request() -> bytes:
    messages = [{"role": "user", "content": "bench"}]
    body = orjson.dumps({"model": MODEL, "messages": messages, "stream": True})
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def read_sse(b: Bench, reader: SSEReader) -> None:
    host, port = b.gateway_url.removeprefix("http://").split(":")
    await asyncio.get_running_loop().create_connection(lambda: reader, host, int(port))
    await reader.done


async def connect_sse(
    b: Bench, requests: list[tuple[bytes, str]], on_token: OnToken
) -> tuple[list[asyncio.Future[None]], list[str]]:
    """One reader per (HTTP request, request id or ''), connected and past the headers;
    the readers and the request ids."""
    events = [asyncio.Event() for _ in requests]
    readers = [SSEReader(req, i, on_token, e) for (req, i), e in zip(requests, events, strict=True)]
    running: list[asyncio.Future[None]] = [asyncio.ensure_future(read_sse(b, x)) for x in readers]
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        await asyncio.gather(*(e.wait() for e in events))
    return running, [x.request_id for x in readers]


async def connect_level(
    r: redis.asyncio.Redis, b: Bench, n: int, on_token: OnToken
) -> tuple[list[asyncio.Future[None]], list[str], dict[str, str]]:
    """``n`` requests queued, claimed by the synthetic worker, and followed over SSE."""
    if b.api == "openai":  # each reader submits its own request
        readers, ids = await connect_sse(b, [(openai_request(), "")] * n, on_token)
        if not all(ids):
            raise RuntimeError("a chat completion answered without its request id")
        return readers, ids, await claim_all(r, b)
    ids = await enqueue(r, b, n)
    held = await claim_all(r, b)
    readers, _ = await connect_sse(b, [(native_request(i), i) for i in ids], on_token)
    return readers, ids, held


# One level.
async def run_level(
    r: redis.asyncio.Redis, b: Bench, publisher: Sidecar, direct_reader: Sidecar, n: int
) -> Level:
    await asyncio.sleep(1.0)  # let the previous level's connections drain
    gw = Arrivals(after_ns=0)  # nothing is published before the window
    sse_readers, ids, held = await connect_level(r, b, n, gw.record)
    gw.after_ns = time.time_ns() + int(WARMUP_S * 1e9)
    direct = asyncio.ensure_future(direct_reader.run("read_direct", ids, gw.after_ns))
    cpu_before, wall_before = cpu_s(b.gateway_pid), time.monotonic()
    client_before = time.process_time()
    await publisher.run("publish", held, WARMUP_S + b.seconds)
    window = Window(
        cpu_s(b.gateway_pid) - cpu_before,
        time.process_time() - client_before,
        time.monotonic() - wall_before,
        gw.num_received,
    )
    async with asyncio.timeout(MAX_LEVEL_S):
        await asyncio.gather(*sse_readers)
        return Level.paired(n, b.tokens_per_s, await direct, gw, window)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_levels(b: Bench, levels: list[int]) -> list[Level]:
    r = redis.asyncio.Redis.from_url(b.redis_url, max_connections=64)
    pipe = r.pipeline()
    mark_served(pipe, b.keys, b.settings, MODEL)
    await pipe.execute()
    rows: list[Level] = []
    publisher, direct_reader = Sidecar(b), Sidecar(b)
    try:
        for n in levels:
            rows.append(await run_level(r, b, publisher, direct_reader, n))
            report_row(rows[-1])
            await r.flushdb()
            pipe = r.pipeline()
            mark_served(pipe, b.keys, b.settings, MODEL)
            await pipe.execute()
    finally:
        publisher.close()
        direct_reader.close()
        await r.aclose()
    return rows


# Output.
HEADER = (
    f"{'streams':>7} {'dir p50':>8} {'dir p99':>8} {'gw p50':>8} {'gw p99':>8} "
    f"{'add p50':>8} {'add p99':>8} {'gw tok/s':>8} {'gw cpu':>7} {'us/tok':>7} "
    f"{'cli cpu':>7} {'samples':>8}"
)


def report_row(lv: Level) -> None:
    w = lv.window
    print(
        f"{lv.streams:>7} {pct(lv.direct_ms, 50):>8.2f} {pct(lv.direct_ms, 99):>8.2f} "
        f"{pct(lv.gateway_ms, 50):>8.2f} {pct(lv.gateway_ms, 99):>8.2f} "
        f"{pct(lv.added_ms, 50):>+8.2f} {pct(lv.added_ms, 99):>+8.2f} "
        f"{w.tokens / w.wall_s:>8.0f} {w.cpu_s / w.wall_s * 100:>6.0f}% "
        f"{lv.us_per_token:>7.0f} {w.client_cpu_s / w.wall_s * 100:>6.0f}% "
        f"{len(lv.added_ms):>8}"
        + (f"  ({lv.missing} tokens not delivered!)" if lv.missing else ""),
        flush=True,
    )


def machine_load() -> str:
    """Load average and CPU pressure (PSI): on a shared box these, not the gateway, may
    bound the figures, and a reader should know."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()[1:3]
    except OSError:
        some = ["n/a"]
    return f"load average {' '.join(load)}; CPU pressure (some) {' '.join(some)}"


def summary(rows: list[Level]) -> None:
    first = rows[0]
    print(
        f"\nadded per token at {first.streams} streams: p50 {pct(first.added_ms, 50):+.2f} ms, "
        f"p99 {pct(first.added_ms, 99):+.2f} ms"
    )
    held = [
        lv.streams
        for lv in rows
        if pct(lv.added_ms, 99) < GOAL_ADDED_P99_MS and lv.added_ms and not lv.missing
    ]
    best = max(held, default=0)
    last = rows[-1]
    us = last.us_per_token
    print(
        f"gateway CPU per token delivered (at {last.streams} streams): {us:.0f} us, so one "
        f"whole core would push ~{1e6 / us:,.0f} tokens/s (~{1e6 / us / last.tokens_per_s:,.0f} "
        f"streams at {last.tokens_per_s:g} tokens/s each)"
    )
    print(f"machine after the run: {machine_load()}")
    print(
        f"most concurrent SSE streams with p99 added < {GOAL_ADDED_P99_MS:g} ms: {best} "
        f"(of levels tried: {', '.join(str(lv.streams) for lv in rows)}; goal 500: "
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
    parser.add_argument(
        "--api", choices=["native", "openai"], default="native", help="which SSE route to read"
    )
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
            args.api,
        )
        print(
            f"tokenq gateway bench ({args.api} SSE): {os.cpu_count()} CPUs, {server.kind}, "
            "one gateway process, "
            f"{args.tokens_per_s:g} tokens/s per stream, {args.seconds:g} s per level "
            f"(latencies in ms, publish to receive)"
        )
        print(f"machine before the run: {machine_load()}")
        print(HEADER)
        # The load generator's own full collections would stall its readers' stamps.
        freeze_startup_objects()
        summary(asyncio.run(bench_levels(b, levels)))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.stop()


if __name__ == "__main__":
    main()
