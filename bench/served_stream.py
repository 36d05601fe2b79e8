"""``bench/latency.py --served``: one stream through a real redis-server, a `tokenq
worker` on the default model and the HTTP gateway, read as the ``openai`` package reads
a streaming chat completion."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import orjson
import redis

from bench.gateway import start_gateway
from bench.through_redis import start_worker, wait_ready
from producer.embedded import EmbeddedRedis
from shared.settings import Settings

TIMEOUT_S = 600.0


@contextlib.contextmanager
def served(model: str, worker_flags: tuple[str, ...], num_threads: int) -> Iterator[str]:
    """The gateway's URL, with a worker serving ``model`` on ``num_threads`` threads
    behind it, until the block ends."""
    server = EmbeddedRedis().start()
    if server.kind != "redis-server":
        server.stop()
        raise SystemExit("--served needs redis-server (make redis-server)")
    worker = gateway = None
    try:
        # The forward's threads by the worker's option, and OpenMP's for the rest of it.
        env = {"OMP_NUM_THREADS": str(num_threads)}
        flags = (*worker_flags, "--num-threads", str(num_threads))
        worker = start_worker(server.url, "cpu", model, flags=flags, env=env)
        wait_ready(redis.Redis.from_url(server.url), Settings(redis_url=server.url))
        gateway, url = start_gateway(server.url)
        yield url
    finally:
        for process in (gateway, worker):
            if process is not None:
                process.terminate()
                process.wait(timeout=120)
        server.stop()


def one_stream(
    url: str, model: str, messages: list[dict[str, str]], num_tokens: int
) -> tuple[float, float]:
    """Tokens/s over a streamed chat completion of ``num_tokens`` greedy tokens, from
    sending it to its last chunk, and over its decode (after the first token's chunk)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": num_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    completion_tokens, first = None, None
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT_S) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line.removeprefix("data: "))
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter()
            if chunk.get("usage"):
                completion_tokens = chunk["usage"]["completion_tokens"]
    ended = time.perf_counter()
    if completion_tokens != num_tokens or first is None:
        raise RuntimeError(f"the gateway streamed {completion_tokens} tokens, not {num_tokens}")
    return num_tokens / (ended - started), (num_tokens - 1) / max(ended - first, 1e-9)
