"""The engine through Redis against the engine alone, measured in one run.

A real redis-server, a `tokenq worker` process on the default model, and every
request of the workload submitted at once with `producer.Client.submit_many`;
timing runs from the first submit to the last final event. The same requests then
(or first) run in process on the engine alone, with the same engine settings.

    python bench/through_redis.py [--workload bench/workloads/mixed200.jsonl]
    python bench/through_redis.py --device cuda --repeat 10   # 2,000 requests on a GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.models import SamplingParams
from shared.settings import DEFAULT_MODEL, Settings
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.model_store import resolve_model

WORKLOADS = Path(__file__).resolve().parent / "workloads"


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def engine_alone(rows: list[dict[str, Any]], device: str) -> float:
    """Useful new tokens per second, all requests added at once."""
    engine = Engine(EngineConfig(model=str(resolve_model(DEFAULT_MODEL)), device=device))
    reqs = [
        EngineRequest(
            f"r{i}",
            engine.encode_chat(r["messages"]),
            SamplingParams(max_tokens=r["max_tokens"], temperature=0, ignore_eos=True),
            priority=50,
        )
        for i, r in enumerate(rows)
    ]
    start = time.perf_counter()
    outputs = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    return sum(len(o.new_token_ids) for outs in outputs.values() for o in outs) / elapsed


def start_worker(url: str, device: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", url, "--device", device]
    return subprocess.Popen([*cmd, "--log-level", "WARNING"])


def wait_ready(
    connection: redis.Redis, settings: Settings, timeout_s: float = 300
) -> dict[str, str]:
    """The worker's registry entry once it has loaded its model."""
    from shared.keys import Keys

    keys, give_up = Keys(settings.namespace), time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        for member in connection.zrange(keys.workers(), 0, -1):
            info = connection.hgetall(keys.worker(member.decode()))
            # A worker registers as "loading" before its weights load; time from serving.
            if info and info.get(b"state") not in (None, b"loading"):
                return {k.decode(): v.decode() for k, v in info.items()}
        time.sleep(0.2)
    raise TimeoutError("the worker did not register")


def through_redis(url: str, rows: list[dict[str, Any]]) -> tuple[float, int]:
    """Tokens per second from first submit to last final event, and completion tokens."""
    client = Client(settings=Settings(redis_url=url))
    bodies = [
        {
            "model": DEFAULT_MODEL,
            "messages": r["messages"],
            "priority": r["priority"],
            "sampling": {"max_tokens": r["max_tokens"], "temperature": 0, "ignore_eos": True},
        }
        for r in rows
    ]
    start = time.perf_counter()
    handles: list[Handle] = client.submit_many(bodies)
    tokens = sum(h.result(timeout=3600).usage.completion_tokens for h in handles)
    return tokens / (time.perf_counter() - start), tokens


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", type=Path, default=WORKLOADS / "mixed200.jsonl")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (auto: cuda if any)")
    parser.add_argument("--repeat", type=int, default=1, help="the workload this many times")
    args = parser.parse_args()
    rows = load(args.workload) * args.repeat
    alone = engine_alone(rows, args.device)
    server = EmbeddedRedis().start()
    worker = start_worker(server.url, args.device)
    try:
        info = wait_ready(redis.Redis.from_url(server.url), Settings(redis_url=server.url))
        rate, tokens = through_redis(server.url, rows)
        rss = peak_rss_mib(worker.pid)
    finally:
        worker.terminate()
        worker.wait(timeout=120)
        server.stop()
    print(f"workload: {args.workload.name} ({len(rows)} requests, {tokens} new tokens)")
    print(f"engine alone:         {alone:7.1f} tok/s")
    ratio = rate / alone
    print(
        f"through Redis:        {rate:7.1f} tok/s  = {ratio:.2f}x engine alone "
        "(goal >= 0.95 on the CPU, 0.9 on a GPU)"
    )
    print(f"worker peak RSS:      {rss:7.0f} MiB;  KV cache: {info.get('kv_cache_mib', '?')} MiB")


if __name__ == "__main__":
    main()
