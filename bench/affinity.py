"""Cache-aware claims: prefix affinity on against off, in one run.

Two real workers on the default model (CPU), each with a KV budget holding about 6 of
12 system prompts of ~830 tokens; 240 short chat questions cycle over the 12 prompts,
all submitted at once. Without affinity each worker claims the queue's heads, so it
cycles through all 12 prompts and evicts each before it comes back; with it, each
claims first the questions whose system prompt it holds warm, and leaves those the
other holds warm to it. `critical` requests with prompts of their own are submitted one
by one as the load goes (after each of --critical equal shares of it has finished);
their queue times show that affinity never holds them back (one alone is mostly the
luck of when a row frees up: hence several).

Prints, per mode: prompt tokens computed (not found in a prefix cache), the fleet's
prefix hit rate, claims made by affinity, total time, p50/p99 time to first token, the
critical requests' queue times (median, max); then the ratios on/off.

    python bench/affinity.py [--prompts 12] [--questions 240] [--kv-cache-mib 236]
        [--modes off,on] [--critical 5] [--tenant NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.models import TENANT, Result
from shared.registry import mark_served
from shared.replies import text
from shared.settings import DEFAULT_MODEL, Settings
from tests.integration.affinity import FleetFigures, fleet, fleet_figures, preamble, serving
from tests.integration.faults import wait_until

SENTENCES = 44  # ~830 tokens of SmolLM2's tokenizer


@dataclass(frozen=True)
class Run:
    results: list[Result]
    total_s: float
    figures: FleetFigures
    critical_queued_s: list[float]
    placement: dict[str, set[int]]  # worker -> the system prompts it served

    def ttft_s(self, q: float) -> float:
        ttfts = sorted(r.timings.ttft_s or 0.0 for r in self.results)
        return ttfts[min(len(ttfts) - 1, round(q * (len(ttfts) - 1)))]

    @property
    def critical_median_s(self) -> float:
        return statistics.median(self.critical_queued_s) if self.critical_queued_s else 0.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--questions", type=int, default=240)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--kv-cache-mib", type=int, default=236, help="per worker: ~6 prompts")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument(
        "--max-wait-ms",
        type=int,
        default=30_000,
        help="TOKENQ_PREFIX_AFFINITY_MAX_WAIT_MS: a few CPU service times",
    )
    parser.add_argument("--modes", default="off,on", help="affinity modes to run, in order")
    parser.add_argument("--critical", type=int, default=5, help="critical requests per mode")
    parser.add_argument("--tenant", default=None, help="submit every request as this tenant")
    return parser.parse_args()


def chat(system: str, question: str, max_tokens: int, **kw: object) -> dict[str, object]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    sampling = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return {"model": DEFAULT_MODEL, "messages": messages, "sampling": sampling, **kw}


def run(url: str, affinity: bool, args: argparse.Namespace, logs: Path) -> Run:
    connection = redis.Redis.from_url(url)
    connection.flushall()
    settings = Settings(redis_url=url, max_queued=100_000)
    pipe = connection.pipeline()
    mark_served(pipe, Keys(), settings, DEFAULT_MODEL)
    pipe.execute()
    client = Client(connection=connection, settings=settings)
    systems = [preamble(n, SENTENCES) for n in range(args.prompts)]
    tenant = {"metadata": {TENANT: args.tenant}} if args.tenant else {}
    bodies = [chat(systems[i % args.prompts], f"Question {i}: which shelf holds entry "
                   f"{i % 31}? Answer in one line.", args.max_tokens, **tenant)
              for i in range(args.questions)]  # fmt: skip
    worker_args = ("--kv-cache-mib", str(args.kv_cache_mib), "--no-self-check",
                   "--max-num-seqs", str(args.max_num_seqs))  # fmt: skip
    env = {"OMP_NUM_THREADS": str(args.threads),
           "TOKENQ_PREFIX_AFFINITY_MAX_WAIT_MS": str(args.max_wait_ms)}  # fmt: skip
    with fleet(url, 2, affinity, logs, *worker_args, env=env):
        wait_until(lambda: serving(connection) == 2, 900, "two workers serving")
        start = time.monotonic()
        handles = client.submit_many(bodies)
        results: list[Result] = []
        critical = []
        for n in range(args.critical):
            share = handles[len(handles) * n // (args.critical + 1) :
                            len(handles) * (n + 1) // (args.critical + 1)]  # fmt: skip
            results += [h.result(timeout=1800) for h in share]
            urgent = chat(preamble(90 + n, 8), "An urgent question.", args.max_tokens,
                          priority="critical", **tenant)  # fmt: skip
            critical.append(client.submit_request(urgent))
        rest = handles[len(handles) * args.critical // (args.critical + 1) :]
        results += [h.result(timeout=1800) for h in rest]
        total_s = time.monotonic() - start
        critical_queued_s = [c.result(timeout=60).timings.queued_s or 0.0 for c in critical]
        time.sleep(0.6)  # a heartbeat: the registry's figures include the last requests
        figures = fleet_figures(connection)
    placed = placement(connection, [h.id for h in handles], args.prompts)
    connection.close()
    return Run(results, total_s, figures, critical_queued_s, placed)


def placement(connection: redis.Redis, ids: list[str], num_prompts: int) -> dict[str, set[int]]:
    """Which worker served which system prompt (request n has prompt n % num_prompts)."""
    keys, out = Keys(), {}
    for n, rid in enumerate(ids):
        worker = connection.hget(keys.request(rid), "worker")
        out.setdefault(text(worker) if worker else "?", set()).add(n % num_prompts)
    return out


def report(name: str, run: Run) -> None:
    f = run.figures
    print(
        f"{name:>12}: prompt tokens computed {f.computed_tokens:>7} of {f.prompt_tokens}, "
        f"fleet prefix hit rate {f.hit_rate:.2f}, claims by affinity {f.affinity_claims:>3}, "
        f"total {run.total_s:6.1f} s, TTFT p50 {run.ttft_s(0.5):6.2f} s "
        f"p99 {run.ttft_s(0.99):6.2f} s, critical queued median {run.critical_median_s:.2f} s "
        f"max {max(run.critical_queued_s, default=0.0):.2f} s "
        f"({' '.join(f'{q:.2f}' for q in run.critical_queued_s)})"
    )
    served = sorted(len(p) for p in run.placement.values())
    both = len(set.intersection(*run.placement.values())) if run.placement else 0
    print(f"{'':>14}system prompts served per worker {served}, by every worker {both}")


def main() -> None:
    args = parse_args()
    print(f"2 workers ({DEFAULT_MODEL}, CPU), {args.prompts} system prompts of ~830 tokens, "
          f"{args.questions} questions cycling over them, max_tokens {args.max_tokens}, "
          f"KV budget {args.kv_cache_mib} MiB per worker (~6 prompts), "
          f"max {args.max_num_seqs} sequences per worker")  # fmt: skip
    server = EmbeddedRedis().start()
    runs: dict[str, Run] = {}
    try:
        with tempfile.TemporaryDirectory() as logs:
            for mode in args.modes.split(","):
                runs[mode] = run(server.url, mode == "on", args, Path(logs))
                report(f"affinity {mode}", runs[mode])
    finally:
        server.stop()
    if {"off", "on"} <= runs.keys():
        compare(runs["off"], runs["on"])


def compare(off: Run, on: Run) -> None:
    print(
        f"with affinity: {off.total_s / on.total_s:.2f}x throughput, "
        f"{off.figures.computed_tokens / max(on.figures.computed_tokens, 1):.2f}x fewer prompt "
        f"tokens computed, hit rate {on.figures.hit_rate:.2f} vs {off.figures.hit_rate:.2f}, "
        f"TTFT p50 {off.ttft_s(0.5) / max(on.ttft_s(0.5), 1e-9):.2f}x lower, critical queued "
        f"median {on.critical_median_s:.2f} s vs {off.critical_median_s:.2f} s"
    )


if __name__ == "__main__":
    main()
