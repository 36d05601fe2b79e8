"""What tracing costs the worker: tracing off against on through Redis, in one run.

Each round runs a `tokenq worker` on its own redis-server twice, once with no OTLP
endpoint and once exporting every request's spans over OTLP/HTTP to a sink in this
process (which reads and drops them), the order alternated between rounds so that a
drifting load counts against both alike. The bench's own client does not trace.

    python bench/tracing.py [--workload bench/workloads/mixed200.jsonl] [--rounds 3]
    python bench/tracing.py --timed-forward-ms 4.3 --max-num-seqs 256 --repeat 5
    python bench/tracing.py --sim   # the worker's own CPU per token, simulated engine

Prints tokens/s each way and the ratio on / off (goal >= 0.97), and with ``--sim`` the
worker process's CPU µs per token each way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
from through_redis import SIM, WORKLOADS, cpu_s, load, through_redis, wait_ready

from producer.embedded import EmbeddedRedis
from shared import tracing
from shared.settings import DEFAULT_MODEL, Settings


@dataclass
class Sink:
    num_exports: int = 0
    num_bytes: int = 0


@contextmanager
def otlp_sink() -> Iterator[tuple[str, Sink]]:
    """An OTLP/HTTP receiver on loopback that counts what it is sent and drops it."""
    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            sink.num_exports, sink.num_bytes = sink.num_exports + 1, sink.num_bytes + len(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sink
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Run:
    tokens_per_s: float
    cpu_us_per_token: float


def worker_run(
    rows: list[dict[str, Any]], model: str, flags: list[str], env: dict[str, str]
) -> Run:
    server = EmbeddedRedis().start()
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", server.url]
    cmd += ["--model", model, "--log-level", "WARNING", *flags]
    worker = subprocess.Popen(cmd, env={**os.environ, **env})
    try:
        wait_ready(redis.Redis.from_url(server.url), Settings(redis_url=server.url))
        cpu0 = cpu_s(worker.pid)
        rate, tokens = through_redis(server.url, rows, model)
        cpu1 = cpu_s(worker.pid)
    finally:
        worker.terminate()
        worker.wait(timeout=120)
        server.stop()
    return Run(rate, (cpu1 - cpu0) / tokens * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", type=Path, default=WORKLOADS / "mixed200.jsonl")
    parser.add_argument("--repeat", type=int, default=1, help="the workload this many times")
    parser.add_argument("--rounds", type=int, default=3, help="off and on alternated, this many")
    parser.add_argument("--sim", nargs="?", const=SIM, default=None, help="the simulated engine")
    parser.add_argument("--timed-forward-ms", type=float, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]  # each round as it ends
    assert tracing.tracer() is None, "unset OTEL_EXPORTER_OTLP_ENDPOINT: the client stays untraced"
    rows = load(args.workload) * args.repeat
    model = args.sim or DEFAULT_MODEL
    flags = ["--device", args.device]
    if args.timed_forward_ms is not None:
        flags += ["--timed-forward-ms", str(args.timed_forward_ms)]
    if args.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(args.max_num_seqs)]
    print(f"workload: {args.workload.name} x{args.repeat} ({len(rows)} requests); {model}")
    ratios = []
    with otlp_sink() as (endpoint, sink):
        on_env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
        for round_no in range(args.rounds):
            order = [False, True] if round_no % 2 == 0 else [True, False]
            runs = {on: worker_run(rows, model, flags, on_env if on else {}) for on in order}
            ratio = runs[True].tokens_per_s / runs[False].tokens_per_s
            ratios.append(ratio)
            print(
                f"round {round_no + 1}: off {runs[False].tokens_per_s:8.1f} tok/s"
                f" ({runs[False].cpu_us_per_token:6.1f} µs CPU/token),"
                f" on {runs[True].tokens_per_s:8.1f} tok/s"
                f" ({runs[True].cpu_us_per_token:6.1f} µs CPU/token): on/off {ratio:.3f}"
            )
        print(f"the sink took {sink.num_exports} exports, {sink.num_bytes / 1e6:.1f} MB of spans")
    print(
        f"tracing on / off: median {statistics.median(ratios):.3f} over {args.rounds} round(s)"
        f" (goal >= 0.97); load now {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
