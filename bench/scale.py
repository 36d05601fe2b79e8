"""Horizontal scaling: 1, 2, 4, 8 and 16 SIMULATED workers against one real Redis.

Each worker runs the simulated backend (`--model sim:...`: a timer with a GPU-like
batch curve, no model), so many fit on one small host and what is measured is
tokenq's coordination through Redis, not model speed. A feeder keeps the queue
topped up (a steady stream, always more work than slots); finished requests are
counted from the lifecycle channel over a fixed window.

Prints throughput relative to one worker (goal: >= 0.9 x N), Redis commands per
generated token and Redis CPU time per token, from which the deploy README works
out the Redis budget at 1,000 workers.

    python bench/scale.py [--workers 1,2,4,8,16] [--window-s 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.errors import QueueFull
from shared.keys import Keys, model_tag
from shared.registry import mark_served
from shared.settings import Settings

MAX_TOKENS = 16


@dataclass(frozen=True)
class Figures:
    workers: int
    tokens_per_s: float
    commands_per_token: float
    redis_cpu_us_per_token: float
    redis_cpu_s_per_s: float


def sim_model(step_ms: int, batch: int) -> str:
    return f"sim:step_ms={step_ms},knee={batch},max_num_seqs={batch}"


def start_workers(n: int, url: str, model: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "TOKENQ_DRAIN_TIMEOUT_S": "0"}
    cmd = [
        sys.executable,
        "-m",
        "producer.cli",
        "worker",
        "--redis",
        url,
        "--model",
        model,
        "--log-level",
        "WARNING",
    ]
    return [subprocess.Popen(cmd, env=env) for _ in range(n)]


def wait_registered(connection: redis.Redis, n: int, timeout_s: float = 300) -> None:
    give_up = time.monotonic() + timeout_s
    while connection.zcard(Keys().workers()) < n:
        if time.monotonic() > give_up:
            raise TimeoutError(f"only {connection.zcard(Keys().workers())} of {n} workers came up")
        time.sleep(0.2)


class Feeder(threading.Thread):
    """Keeps at least ``depth`` requests queued until stopped."""

    def __init__(self, client: Client, model: str, depth: int) -> None:
        super().__init__(daemon=True)
        self.client, self.model, self.depth = client, model, depth
        self.done = threading.Event()
        self.queue_key = Keys().queue(model_tag(model))

    def run(self) -> None:
        body = {"model": self.model, "prompt": "a b c d", "sampling": {"max_tokens": MAX_TOKENS}}
        while not self.done.wait(0.05):
            missing = self.depth - int(self.client.redis.zcard(self.queue_key))
            if missing > 0:
                with contextlib.suppress(QueueFull):  # full: the next round tops it up
                    self.client.submit_many([body] * missing)


class FinishCounter(threading.Thread):
    """Counts 'finished' lifecycle events while ``counting`` is set."""

    def __init__(self, connection: redis.Redis) -> None:
        super().__init__(daemon=True)
        self.pubsub = connection.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(Keys().lifecycle_channel())
        self.counting, self.done, self.finished = threading.Event(), threading.Event(), 0

    def run(self) -> None:
        while not self.done.is_set():
            message = self.pubsub.get_message(timeout=0.2)
            if message and self.counting.is_set() and b'"finished"' in message["data"]:
                self.finished += 1


def redis_totals(connection: redis.Redis) -> tuple[int, float]:
    stats, cpu = connection.info("stats"), connection.info("cpu")
    return int(stats["total_commands_processed"]), float(cpu["used_cpu_sys"]) + float(
        cpu["used_cpu_user"]
    )


def measure(n: int, url: str, step_ms: int, batch: int, window_s: float) -> Figures:
    model, step_s = sim_model(step_ms, batch), step_ms / 1000
    connection = redis.Redis.from_url(url)
    connection.flushall()
    settings = Settings(redis_url=url, max_queued=1_000_000)
    pipe = connection.pipeline()
    mark_served(pipe, Keys(), settings, model)
    pipe.execute()
    workers = start_workers(n, url, model)
    counter, feeder = (
        FinishCounter(connection),
        Feeder(Client(settings=settings), model, 2 * n * batch),
    )
    try:
        wait_registered(connection, n)
        counter.start()
        feeder.start()
        time.sleep(2 * MAX_TOKENS * step_s)  # warm-up: every batch full and turning over
        commands0, cpu0 = redis_totals(connection)
        counter.counting.set()
        time.sleep(window_s)
        counter.counting.clear()
        commands1, cpu1 = redis_totals(connection)
    finally:
        feeder.done.set()
        counter.done.set()
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=120)
    tokens = counter.finished * MAX_TOKENS
    per_token = max(tokens, 1)
    cpu_s = cpu1 - cpu0
    commands = (commands1 - commands0) / per_token
    return Figures(n, tokens / window_s, commands, cpu_s * 1e6 / per_token, cpu_s / window_s)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2,4,8,16")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--step-ms", type=int, default=100)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    model = sim_model(args.step_ms, args.batch)
    server = EmbeddedRedis().start()
    print(f"SIMULATED workers ({model}); Redis: {server.kind}; window {args.window_s:g}s")
    header = ("workers", "tok/s", "x one", "/ N", "cmds/token", "redis CPU us/token")
    print("{:>7} {:>9} {:>7} {:>6} {:>11} {:>19}".format(*header))
    try:
        runs: list[Figures] = []
        for n in (int(x) for x in args.workers.split(",")):
            f = measure(n, server.url, args.step_ms, args.batch, args.window_s)
            runs.append(f)
            base = runs[0].tokens_per_s
            ratio = f.tokens_per_s / base
            print(
                f"{n:>7} {f.tokens_per_s:>9.0f} {ratio:>7.2f} {ratio / n:>6.2f} "
                f"{f.commands_per_token:>11.2f} {f.redis_cpu_us_per_token:>19.1f}",
                flush=True,
            )
        print_marginal(runs[0], runs[-1])
    finally:
        server.stop()


def print_marginal(first: Figures, last: Figures) -> None:
    """Redis CPU per token once fixed costs (polling, cron) are taken out: the slope
    between the smallest and the largest run."""
    extra_tokens = last.tokens_per_s - first.tokens_per_s
    if extra_tokens <= 0:
        return
    slope_us = (last.redis_cpu_s_per_s - first.redis_cpu_s_per_s) * 1e6 / extra_tokens
    print(
        f"marginal Redis CPU: {slope_us:.1f} us per token "
        f"(one Redis core saturates near {1e6 / slope_us:,.0f} tokens/s)"
    )


if __name__ == "__main__":
    main()
