"""One measurement of bench/scale.py: start workers and a web app against a Redis (one
server or a cluster), let them run for a window, and read Redis's own counters."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis, free_port
from shared.connection import connect
from shared.errors import QueueFull
from shared.keys import Keys, model_tag
from shared.registry import mark_served
from shared.scripts import SCRIPT_NAMES, load_source
from shared.settings import Settings
from tests.cluster import LocalCluster
from worker.sim import SimConfig


@dataclass(frozen=True)
class Figures:
    workers: int
    tokens_per_s: float
    commands_per_token: float
    redis_cpu_us_per_token: float
    redis_cpu_s_per_s: float
    coalesce_p99_ms: float
    # Per master of a cluster: (name, share of stream entries, share of Redis CPU).
    per_node: list[tuple[str, float, float]] = field(default_factory=list)
    # Per command over the window, all nodes: name -> (calls, usec) (INFO commandstats).
    command_stats: dict[str, tuple[int, int]] = field(default_factory=dict)
    tokens: int = 0
    io: dict[str, int] = field(default_factory=dict)  # socket reads and writes, bytes
    # From a SLOWLOG sample (``sample_s`` of the window): EVALSHA by script name and
    # every other command -> (calls, usec), and the tokens generated over the sample.
    sampled: dict[str, tuple[int, int]] = field(default_factory=dict)
    sampled_tokens: int = 0


@dataclass
class Target:
    """A Redis to measure against: its URL and a plain connection to each node."""

    kind: str
    url: str
    nodes: dict[str, redis.Redis]

    def any_node(self) -> redis.Redis:
        return next(iter(self.nodes.values()))


@contextmanager
def single_target(replicas: int = 0) -> Iterator[Target]:
    """One Redis with the shipped config, and ``replicas`` replicas of it (their CPU is
    not counted: in production they are other machines)."""
    server = EmbeddedRedis().start()
    followers: list[subprocess.Popen[bytes]] = []
    try:
        primary = redis.Redis.from_url(server.url)
        for _ in range(replicas):
            port = free_port()
            args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            args += ["--replicaof", "127.0.0.1", str(server.port)]
            followers.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
        _wait_for_replicas(primary, replicas)
        kind = server.kind + (f" + {replicas} replica(s)" if replicas else "")
        yield Target(kind, server.url, {"one": primary})
    finally:
        for proc in followers:
            proc.terminate()
            proc.wait(timeout=30)
        server.stop()


def _wait_for_replicas(primary: redis.Redis, n: int, timeout_s: float = 30) -> None:
    give_up = time.monotonic() + timeout_s

    def online() -> int:
        info = primary.info("replication")
        return sum(isinstance(v, dict) and v.get("state") == "online" for v in info.values())

    while online() < n:
        if time.monotonic() > give_up:
            raise TimeoutError(f"{n} replica(s) did not connect")
        time.sleep(0.1)


@contextmanager
def cluster_target() -> Iterator[Target]:
    cluster = LocalCluster().start()
    nodes = {str(p): redis.Redis(port=p) for p in cluster.ports}
    try:
        yield Target("3-master Redis Cluster", cluster.url, nodes)
    finally:
        cluster.stop()


CommandStats = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class Totals:
    commands: int
    cpu_s: float
    stream_entries: int
    by_command: CommandStats = field(default_factory=dict)
    io: dict[str, int] = field(default_factory=dict)

    def __sub__(self, other: Totals) -> Totals:
        return Totals(
            self.commands - other.commands,
            self.cpu_s - other.cpu_s,
            self.stream_entries - other.stream_entries,
            _combine(self.by_command, other.by_command, -1),
            {k: self.io.get(k, 0) - other.io.get(k, 0) for k in self.io.keys() | other.io.keys()},
        )

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.commands + other.commands,
            self.cpu_s + other.cpu_s,
            self.stream_entries + other.stream_entries,
            _combine(self.by_command, other.by_command, 1),
            {k: self.io.get(k, 0) + other.io.get(k, 0) for k in self.io.keys() | other.io.keys()},
        )


def _combine(a: CommandStats, b: CommandStats, sign: int) -> CommandStats:
    names = a.keys() | b.keys()
    zero = (0, 0)
    return {
        n: (
            a.get(n, zero)[0] + sign * b.get(n, zero)[0],
            a.get(n, zero)[1] + sign * b.get(n, zero)[1],
        )
        for n in names
    }


def node_totals(node: redis.Redis) -> Totals:
    stats, cpu, commands = node.info("stats"), node.info("cpu"), node.info("commandstats")
    by_command = {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in commands.items()
    }
    cpu_s = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
    xadd = by_command.get("xadd", (0, 0))[0]
    io = {k: int(stats.get(k, 0)) for k in IO_STATS}
    return Totals(int(stats["total_commands_processed"]), cpu_s, xadd, by_command, io)


IO_STATS = ("total_reads_processed", "total_writes_processed", "total_net_input_bytes",
            "total_net_output_bytes")  # fmt: skip


def start_workers(
    n: int, url: str, model: str, coalesce_ms: int, min_replicas: int = 0
) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "TOKENQ_DRAIN_TIMEOUT_S": "0",
        "TOKENQ_PUBLISH_COALESCE_MS": str(coalesce_ms),
        "TOKENQ_REDIS_MIN_REPLICAS": str(min_replicas),
    }
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", url, "--model", model]
    return [subprocess.Popen([*cmd, "--log-level", "WARNING"], env=env) for _ in range(n)]


def start_webapp(
    url: str, model: str, depth: int, max_tokens: int, gather_ms: float, min_replicas: int = 0
) -> subprocess.Popen[bytes]:
    args = [url, model, str(depth), str(max_tokens), str(gather_ms)]
    cmd = [sys.executable, "-m", "bench.webapp", *args]
    env = {**os.environ, "TOKENQ_REDIS_MIN_REPLICAS": str(min_replicas)}
    return subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], env=env)


def wait_registered(connection: redis.Redis, n: int, timeout_s: float = 300) -> None:
    give_up = time.monotonic() + timeout_s
    while connection.zcard(Keys().workers()) < n:
        if time.monotonic() > give_up:
            raise TimeoutError(f"only {connection.zcard(Keys().workers())} of {n} workers came up")
        time.sleep(0.2)


class FinishCounter(threading.Thread):
    """Counts 'finished' lifecycle events while ``counting`` is set (on a cluster, any
    node hears every PUBLISH)."""

    def __init__(self, node: redis.Redis) -> None:
        super().__init__(daemon=True)
        self.pubsub = node.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(Keys().lifecycle_channel())
        self.counting, self.done, self.finished = threading.Event(), threading.Event(), 0

    def run(self) -> None:
        while not self.done.is_set():
            message = self.pubsub.get_message(timeout=0.2)
            if message and self.counting.is_set() and b'"finished"' in message["data"]:
                self.finished += 1


def coalesce_p99_ms(connection: redis.Redis) -> float:
    """The largest p99 coalescing delay the workers report in their registry entries."""
    keys = Keys()
    ids = connection.zrange(keys.workers(), 0, -1)
    values = [connection.hget(keys.worker(i.decode()), "coalesce_p99_ms") for i in ids]
    return max((float(v) for v in values if v is not None), default=0.0)


def prepare(target: Target, connection: redis.Redis, model: str) -> None:
    for node in target.nodes.values():
        node.flushall()
    pipe = connection.pipeline(transaction=False)
    mark_served(pipe, Keys(), Settings(redis_url=target.url), model)
    pipe.execute()


def measure(
    target: Target,
    n: int,
    model: str,
    coalesce_ms: int,
    window_s: float,
    max_tokens: int,
    readers: bool = True,
    gather_ms: float = 0.0,
    sample_s: float = 0.0,
    min_replicas: int = 0,
) -> Figures:
    connection = connect(target.url)
    prepare(target, connection, model)
    batch = SimConfig.parse(model).max_num_seqs
    workers = start_workers(n, target.url, model, coalesce_ms, min_replicas)
    depth = 2 * n * batch
    feeder: Feeder | subprocess.Popen[bytes]
    webapp = (target.url, model, depth, max_tokens, gather_ms, min_replicas)
    feeder = start_webapp(*webapp) if readers else Feeder(
        Client(settings=Settings(redis_url=target.url, max_queued=1_000_000)), model, depth,
        max_tokens,
    )  # fmt: skip
    counter = FinishCounter(target.any_node())
    try:
        wait_registered(connection, n)
        counter.start()
        if isinstance(feeder, Feeder):
            feeder.start()
        time.sleep(3 + 2 * max_tokens * SimConfig.parse(model).step_s(batch))  # warm-up
        before = {name: node_totals(node) for name, node in target.nodes.items()}
        counter.counting.set()
        sample = Sample(target, counter) if sample_s > 0 else None
        time.sleep(sample_s)
        sampled = sample.stop(max_tokens) if sample else ({}, 0)
        time.sleep(window_s - sample_s)
        counter.counting.clear()
        after = {name: node_totals(node) for name, node in target.nodes.items()}
        p99_ms = coalesce_p99_ms(connection)
    finally:
        stop(feeder, counter, workers)
    f = figures(n, counter.finished * max_tokens, window_s, before, after, p99_ms)
    return replace(f, sampled=sampled[0], sampled_tokens=sampled[1])


SAMPLE_MAX_LEN = 200_000


class Sample:
    """Every command's time for a while, from SLOWLOG at threshold 0 (EVALSHA named by
    its script). The log itself costs Redis some CPU, so it runs for part of the window."""

    def __init__(self, target: Target, counter: FinishCounter) -> None:
        self.nodes, self.counter = list(target.nodes.values()), counter
        self.finished = counter.finished
        for node in self.nodes:
            node.config_set("slowlog-max-len", SAMPLE_MAX_LEN)
            node.slowlog_reset()
            node.config_set("slowlog-log-slower-than", 0)

    def stop(self, max_tokens: int) -> tuple[dict[str, tuple[int, int]], int]:
        for node in self.nodes:
            node.config_set("slowlog-log-slower-than", 10_000)
        tokens = (self.counter.finished - self.finished) * max_tokens
        names = {script_sha(n): n for n in SCRIPT_NAMES}
        stats: dict[str, tuple[int, int]] = {}
        for node in self.nodes:
            for entry in node.slowlog_get(SAMPLE_MAX_LEN):
                words = entry["command"].split(b" ")
                name = words[0].decode().lower()
                if name == "evalsha" and len(words) > 1:
                    name = "script:" + names.get(words[1].decode(), "?")
                calls, usec = stats.get(name, (0, 0))
                stats[name] = (calls + 1, usec + int(entry["duration"]))
            node.slowlog_reset()
        return stats, tokens


def script_sha(name: str) -> str:
    return hashlib.sha1(load_source(name).encode()).hexdigest()


def figures(
    n: int,
    tokens: int,
    window_s: float,
    before: dict[str, Totals],
    after: dict[str, Totals],
    p99_ms: float,
) -> Figures:
    per_token = max(tokens, 1)
    deltas = {name: after[name] - before[name] for name in after}
    total = sum(deltas.values(), Totals(0, 0.0, 0))
    shares = [
        (name, d.stream_entries / max(total.stream_entries, 1), d.cpu_s / max(total.cpu_s, 1e-9))
        for name, d in deltas.items()
    ]
    return Figures(
        n,
        tokens / window_s,
        total.commands / per_token,
        total.cpu_s * 1e6 / per_token,
        total.cpu_s / window_s,
        p99_ms,
        shares if len(deltas) > 1 else [],
        total.by_command,
        tokens,
        total.io,
    )


def stop(
    feeder: Feeder | subprocess.Popen[bytes],
    counter: FinishCounter,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    if isinstance(feeder, Feeder):
        feeder.done.set()
    else:
        feeder.terminate()
        end(feeder)
    counter.done.set()
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        end(w)


def end(process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Feeder(threading.Thread):
    """Without readers: keeps at least ``depth`` requests queued until stopped."""

    def __init__(self, client: Client, model: str, depth: int, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.client, self.depth = client, depth
        self.body = {"model": model, "prompt": "a b c d", "sampling": {"max_tokens": max_tokens}}
        self.done = threading.Event()
        self.queue_key = Keys().queue(model_tag(model))

    def run(self) -> None:
        while not self.done.wait(0.05):
            missing = self.depth - int(self.client.redis.zcard(self.queue_key))
            if missing > 0:
                with contextlib.suppress(QueueFull):  # full: the next round tops it up
                    self.client.submit_many([self.body] * missing)
