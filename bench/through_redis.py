"""The engine through Redis against the engine alone, measured in one run.

A real redis-server, a `tokenq worker` process on the default model, and every
request of the workload submitted at once with `producer.Client.submit_many`;
timing runs from the first submit to the last final event. The same requests then
(or first) run in process on the engine alone, with the same engine settings.

    python bench/through_redis.py [--workload bench/workloads/mixed200.jsonl]
    python bench/through_redis.py --device cuda --repeat 10   # 2,000 requests on a GPU
    python bench/through_redis.py --timed-forward-ms 4.3 --max-num-seqs 256 --repeat 10
    python bench/through_redis.py ... --engine-process both   # the worker each way
    python bench/through_redis.py ... --rounds 3   # alternated 3 times; the median ratio

``--timed-forward-ms`` runs both on the timed forward (``EngineConfig.timed_forward_ms``:
a wait that leaves the host free, as a GPU's forward does, everything else real), so
that the CPU measures the worker's share of a device-bound step.

``--sim`` measures the worker's own cost per token, without a GPU: the worker runs
the simulated engine (``worker/sim.py``; by default its steps take no time), and the
bench reads the worker process's CPU time from /proc, less what the simulated engine
costs alone (measured here in process on the same requests). ``--baseline DIR`` runs
the same worker from another checkout (e.g. ``git archive main | tar -x -C DIR``),
back to back in the same run, for a before/after:

    python bench/through_redis.py --sim --repeat 10 [--baseline /tmp/tokenq-main]

``--engine vllm`` runs vLLM's engine (``bench/vllm_bench.py``; vLLM from ``.venv-vllm``,
``make vllm-setup``): ``LLM.generate`` alone against ``tokenq worker --engine vllm``
through Redis, then the built-in engine both ways, alternated, same dtype; engine
arguments as ``--vllm-arg KEY=VALUE`` (e.g. ``enforce_eager=true`` to skip compiling):

    python bench/through_redis.py --engine vllm --workload bench/workloads/mixed32.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.models import SamplingParams
from shared.settings import DEFAULT_MODEL, Settings
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.model_store import resolve_model
from worker.sim import SimConfig, SimEngine

WORKLOADS = Path(__file__).resolve().parent / "workloads"
SIM = "sim:step_ms=0,knee=256,max_num_seqs=256"
# The H100 run of issue 17: 256 rows a step, ~9.3 ms a step.
H100_ENGINE_US_PER_TOKEN = 9.3e3 / 256
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def engine_requests(rows: list[dict[str, Any]], engine: Engine | SimEngine) -> list[EngineRequest]:
    return [
        EngineRequest(
            f"r{i}",
            engine.encode_chat(r["messages"]),
            SamplingParams(max_tokens=r["max_tokens"], temperature=0, ignore_eos=True),
            priority=50,
        )
        for i, r in enumerate(rows)
    ]


def engine_alone(rows: list[dict[str, Any]], device: str, extra: dict[str, Any]) -> float:
    """Useful new tokens per second, all requests added at once."""
    model = str(resolve_model(DEFAULT_MODEL))
    engine = Engine(EngineConfig(model=model, device=device, **extra))
    reqs = engine_requests(rows, engine)
    start = time.perf_counter()
    outputs = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    return sum(len(o.new_token_ids) for outs in outputs.values() for o in outs) / elapsed


@dataclass(frozen=True)
class Alone:
    tokens_per_s: float
    cpu_us_per_token: float


def sim_alone(rows: list[dict[str, Any]], spec: str) -> Alone:
    """The simulated engine in process, fed as a worker feeds it (requests join as rows
    free up): its tokens per second and its own CPU per token."""
    engine = SimEngine(SimConfig.parse(spec))
    waiting = deque(engine_requests(rows, engine))
    num_tokens = 0
    wall_s, cpu_s = time.perf_counter(), time.process_time()
    while waiting or engine.has_unfinished_requests():
        for _ in range(min(engine.num_free_slots(), len(waiting))):
            engine.add_request(waiting.popleft())
        num_tokens += sum(len(o.new_token_ids) for o in engine.step())
    wall_s, cpu_s = time.perf_counter() - wall_s, time.process_time() - cpu_s
    return Alone(num_tokens / wall_s, cpu_s / num_tokens * 1e6)


def start_worker(
    url: str,
    device: str,
    model: str | None = None,
    pythonpath: Path | None = None,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", url, "--device", device]
    cmd += flags
    if model is not None:
        cmd += ["--model", model]
    env = {**os.environ, **(env or {})}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.Popen([*cmd, "--log-level", "WARNING"], env=env, cwd=pythonpath)


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


def through_redis(url: str, rows: list[dict[str, Any]], model: str) -> tuple[float, int]:
    """Tokens per second from first submit to last final event, and completion tokens."""
    client = Client(settings=Settings(redis_url=url))
    bodies = [
        {
            "model": model,
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


def cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of a process (all its threads) or of one thread."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime


@dataclass(frozen=True)
class WorkerRun:
    tokens_per_s: float
    num_tokens: int
    cpu_us_per_token: float  # the whole worker process
    loop_us_per_token: float  # its main thread: the loop that steps the engine


def sim_worker(rows: list[dict[str, Any]], spec: str, pythonpath: Path | None) -> WorkerRun:
    """A `tokenq worker` on the simulated engine against its own redis-server."""
    server = EmbeddedRedis().start()
    worker = start_worker(server.url, "cpu", spec, pythonpath)
    try:
        wait_ready(redis.Redis.from_url(server.url), Settings(redis_url=server.url))
        cpu0, loop0 = cpu_s(worker.pid), cpu_s(worker.pid, worker.pid)
        rate, tokens = through_redis(server.url, rows, spec)
        cpu1, loop1 = cpu_s(worker.pid), cpu_s(worker.pid, worker.pid)
    finally:
        worker.terminate()
        worker.wait(timeout=120)
        server.stop()
    return WorkerRun(rate, tokens, (cpu1 - cpu0) / tokens * 1e6, (loop1 - loop0) / tokens * 1e6)


def report_sim(name: str, run: WorkerRun, alone: Alone) -> float:
    """Prints one worker's figures; returns its loop thread's µs per token outside the
    engine."""
    outside = run.cpu_us_per_token - alone.cpu_us_per_token
    loop_outside = run.loop_us_per_token - alone.cpu_us_per_token
    h100 = H100_ENGINE_US_PER_TOKEN / (H100_ENGINE_US_PER_TOKEN + loop_outside)
    print(
        f"{name}: {run.tokens_per_s:8.0f} tok/s through Redis"
        f" = {run.tokens_per_s / alone.tokens_per_s:.2f}x engine alone\n"
        f"    worker CPU {run.cpu_us_per_token:5.1f} µs/token, {outside:5.1f} outside the engine;"
        f" loop thread {run.loop_us_per_token:5.1f}, {loop_outside:5.1f} outside the engine\n"
        f"    at the H100's {H100_ENGINE_US_PER_TOKEN:.1f} µs/token engine step:"
        f" through Redis ~= {h100:.2f}x"
        " the engine alone (loop thread only)"
    )
    return loop_outside


def main_sim(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    alone = sim_alone(rows, args.sim)
    print(f"workload: {args.workload.name} x{args.repeat} ({len(rows)} requests); {args.sim}")
    print(
        f"simulated engine alone: {alone.tokens_per_s:8.0f} tok/s,"
        f" {alone.cpu_us_per_token:.1f} µs CPU/token (load {os.getloadavg()[0]:.2f})"
    )
    here = report_sim("worker (this tree)", sim_worker(rows, args.sim, None), alone)
    if args.baseline is not None:
        before = report_sim(
            f"worker ({args.baseline})", sim_worker(rows, args.sim, args.baseline), alone
        )
        print(f"loop thread outside the engine: this tree / baseline = {here / before:.2f}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", type=Path, default=WORKLOADS / "mixed200.jsonl")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (auto: cuda if any)")
    parser.add_argument("--repeat", type=int, default=1, help="the workload this many times")
    parser.add_argument(
        "--sim", nargs="?", const=SIM, default=None, help=f"the simulated engine (default {SIM})"
    )
    parser.add_argument("--baseline", type=Path, help="with --sim: also a worker from this tree")
    parser.add_argument("--timed-forward-ms", type=float, default=None, help="a timed forward")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: the device's")
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the engine alone and the worker alike (default: the device's)",
    )
    parser.add_argument(
        "--engine-process",
        choices=("off", "on", "both"),
        default="off",
        help="the worker's engine in a child process (tokenq worker --engine-process); "
        "both: a worker each way, back to back, against the same engine-alone figure",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="engine alone and worker alternated, this many times"
    )
    parser.add_argument("--engine", choices=("builtin", "vllm"), default="builtin")
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="with --engine vllm: KEY=VALUE"
    )
    args = parser.parse_args()
    rows = load(args.workload) * args.repeat
    if args.engine == "vllm":
        from bench.vllm_bench import main_vllm
        from worker.vllm_engine.options import parse_pairs

        main_vllm(rows, parse_pairs(args.vllm_arg), args.rounds)
        return
    if args.sim is not None:
        main_sim(args, rows)
        return
    extra: dict[str, Any] = {}
    flags: list[str] = []
    if args.timed_forward_ms is not None:
        extra["timed_forward_ms"] = args.timed_forward_ms
        flags += ["--timed-forward-ms", str(args.timed_forward_ms)]
    if args.max_num_seqs is not None:
        extra["max_num_seqs"] = args.max_num_seqs
        flags += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.async_scheduling is not None:
        extra["async_scheduling"] = args.async_scheduling
        flags += ["--async-scheduling" if args.async_scheduling else "--no-async-scheduling"]
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.engine_process]
    ratios: dict[bool, list[float]] = {p: [] for p in modes}
    for round_no in range(args.rounds):  # alternated: the box's load moves both alike
        alone = engine_alone(rows, args.device, extra)
        runs = [worker_run(args.device, rows, (*flags, *(["--engine-process"] * p))) for p in modes]
        if round_no == 0:
            tokens = runs[0].num_tokens
            print(f"workload: {args.workload.name} ({len(rows)} requests, {tokens} new tokens)")
            if args.timed_forward_ms is not None:
                print(f"timed forward: {args.timed_forward_ms:g} ms a step (no model compute)")
        print(f"round {round_no + 1}: engine alone {alone:7.1f} tok/s")
        for in_child, run in zip(modes, runs, strict=True):
            ratios[in_child].append(run.tokens_per_s / alone)
            print(
                f"  through Redis ({_how(in_child)}): {run.tokens_per_s:7.1f} tok/s = "
                f"{run.tokens_per_s / alone:.2f}x engine alone; worker peak RSS "
                f"{run.rss_mib:.0f} MiB{' (its child not counted)' * in_child}; "
                f"KV cache {run.kv_cache_mib} MiB"
            )
    for in_child in modes:
        print(
            f"through Redis ({_how(in_child)}): median {statistics.median(ratios[in_child]):.2f}x "
            f"the engine alone over {args.rounds} round(s) (goal >= 0.9 on the timed forward "
            "and on a GPU, 0.95 on the CPU's own model)"
        )


def _how(in_child: bool) -> str:
    return "the engine in a child process" if in_child else "one process"


@dataclass(frozen=True)
class Served:
    tokens_per_s: float
    num_tokens: int
    rss_mib: float
    kv_cache_mib: str


def worker_run(device: str, rows: list[dict[str, Any]], flags: tuple[str, ...]) -> Served:
    """A `tokenq worker` with ``flags`` against its own redis-server, every request at once."""
    server = EmbeddedRedis().start()
    worker = start_worker(server.url, device, flags=flags)
    try:
        info = wait_ready(redis.Redis.from_url(server.url), Settings(redis_url=server.url))
        rate, tokens = through_redis(server.url, rows, DEFAULT_MODEL)
        rss = peak_rss_mib(worker.pid)
    finally:
        worker.terminate()
        worker.wait(timeout=120)
        server.stop()
    return Served(rate, tokens, rss, info.get("kv_cache_mib", "?"))


if __name__ == "__main__":
    main()
