"""Horizontal scaling and Redis cost per token: SIMULATED workers against a real Redis.

Each worker runs the simulated backend (`--model sim:...`: a timer with a GPU-like
batch curve, no model), so many fit on one small host and what is measured is
tokenq's coordination through Redis, not model speed. A web app process
(bench/webapp.py) keeps the queue topped up (always more work than slots) and reads
every request's stream to its final event through the gateway's stream hub, as web
apps do; finished requests are counted from the lifecycle channel over a window.

Every worker count runs twice in the same run: "before", one stream entry per engine
step and a hub that reads again as soon as a read returns (`TOKENQ_PUBLISH_COALESCE_MS=0`,
hub gather 0), and "after", the defaults (the worker's coalescing window, the hub's
gather). Printed per run: throughput relative to one worker (goal >= 0.9 x N), Redis
commands and Redis CPU per generated token (INFO stats and cpu), and the p99 delay
coalescing added to a step's tokens (what the workers report in their registry).

`--cluster-workers N` then runs N workers with the defaults, every stream read (unless
`--no-readers`), against one Redis and against a 3-master Redis Cluster started here
(as tests/cluster.py does): throughput and Redis CPU per token of each, and each
master's share of the token traffic (stream entries written, and Redis CPU).

    python bench/scale.py [--workers 1,2,4,8,16] [--window-s 10] [--cluster-workers 8]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/...`

from bench.scale_run import Figures, Target, cluster_target, measure, single_target
from producer.gateway.hub import GATHER_S
from shared.settings import Settings


@dataclass(frozen=True)
class Config:
    name: str
    coalesce_ms: int
    gather_ms: float


BEFORE = Config("before", 0, 0.0)
AFTER = Config("after", Settings().publish_coalesce_ms, GATHER_S * 1000)
HEADER = ("workers", "config", "tok/s", "x one", "/ N", "cmds/token", "CPU us/token", "p99 ms")
ROW = "{:>7} {:>7} {:>9} {:>7} {:>6} {:>10} {:>12} {:>7}"


def sim_model(step_ms: int, batch: int) -> str:
    return f"sim:step_ms={step_ms},knee={batch},max_num_seqs={batch}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2,4,8,16")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--step-ms", type=int, default=20, help="a GPU decode step's time")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-readers", action="store_true", help="no web app reads streams")
    parser.add_argument("--cluster-workers", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    model = sim_model(args.step_ms, args.batch)
    readers = "no readers" if args.no_readers else "every stream read through the stream hub"
    print(f"SIMULATED workers ({model}), {args.max_tokens} tokens a request; {readers}")
    print(
        f"before: coalesce {BEFORE.coalesce_ms} ms, hub gather {BEFORE.gather_ms:g} ms; "
        f"after: coalesce {AFTER.coalesce_ms} ms, hub gather {AFTER.gather_ms:g} ms"
    )
    counts = [int(n) for n in args.workers.split(",")]
    results: dict[tuple[int, str], Figures] = {}
    with single_target() as target:
        print(f"one Redis: {target.kind}; window {args.window_s:g}s")
        print(ROW.format(*HEADER))
        for config in (BEFORE, AFTER):
            for n in counts:
                f = results[n, config.name] = run(target, n, model, config, args)
                print_row(config, f, results[counts[0], config.name], counts[0])
    for config in (BEFORE, AFTER):
        print_marginal(config, results[counts[0], config.name], results[counts[-1], config.name])
    for n in counts:
        print_before_after(n, results[n, BEFORE.name], results[n, AFTER.name])
    if args.cluster_workers:
        compare_cluster(args, model)


def run(target: Target, n: int, model: str, config: Config, args: argparse.Namespace) -> Figures:
    return measure(
        target, n, model, config.coalesce_ms, args.window_s, args.max_tokens,
        readers=not args.no_readers, gather_ms=config.gather_ms,
    )  # fmt: skip


def print_row(config: Config, f: Figures, first: Figures, first_n: int) -> None:
    ratio = f.tokens_per_s / first.tokens_per_s * first_n
    print(
        ROW.format(
            f.workers, config.name, f"{f.tokens_per_s:.0f}", f"{ratio:.2f}",
            f"{ratio / f.workers:.2f}", f"{f.commands_per_token:.2f}",
            f"{f.redis_cpu_us_per_token:.1f}", f"{f.coalesce_p99_ms:.0f}",
        ),
        flush=True,
    )  # fmt: skip


def print_marginal(config: Config, first: Figures, last: Figures) -> None:
    """Redis CPU per token once fixed costs (polling, cron) are taken out: the slope
    between the smallest and the largest run."""
    extra_tokens = last.tokens_per_s - first.tokens_per_s
    if extra_tokens <= 0:
        return
    slope_us = (last.redis_cpu_s_per_s - first.redis_cpu_s_per_s) * 1e6 / extra_tokens
    print(
        f"{config.name}: marginal Redis CPU {slope_us:.1f} us per token "
        f"(one Redis core saturates near {1e6 / slope_us:,.0f} tokens/s)"
    )


def print_before_after(n: int, before: Figures, after: Figures) -> None:
    cpu = after.redis_cpu_us_per_token / before.redis_cpu_us_per_token
    commands = after.commands_per_token / before.commands_per_token
    print(f"{n} workers, after / before: Redis CPU per token {cpu:.2f}, commands {commands:.2f}")


def compare_cluster(args: argparse.Namespace, model: str) -> None:
    n = args.cluster_workers
    readers = "no readers" if args.no_readers else "every stream read"
    print(f"\n{n} workers, after, {readers}, window {2 * args.window_s:g}s: one Redis against")
    print("a 3-master Redis Cluster (its nodes without AOF; the one Redis with deploy/redis.conf)")
    results: list[Figures] = []
    cluster_args = argparse.Namespace(**vars(args))
    cluster_args.window_s = 2 * args.window_s  # more requests, so the shares settle
    for make in (single_target, cluster_target):
        with make() as target:
            f = run(target, n, model, AFTER, cluster_args)
            results.append(f)
            print(
                f"{target.kind:>24}: {f.tokens_per_s:,.0f} tok/s, "
                f"{f.redis_cpu_us_per_token:.1f} us Redis CPU per token (all nodes), "
                f"p99 coalescing {f.coalesce_p99_ms:.0f} ms",
                flush=True,
            )
    single, cluster = results
    print(f"cluster / one Redis throughput: {cluster.tokens_per_s / single.tokens_per_s:.2f}")
    for name, entries, cpu in cluster.per_node:
        print(f"  master :{name}: {entries:.1%} of stream entries, {cpu:.1%} of Redis CPU")
    print("  (a third is 33.3%; within 20% of it is 26.7-40.0%)")


if __name__ == "__main__":
    main()
