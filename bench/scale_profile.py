"""Where Redis's CPU goes per generated token, in one run of bench/scale.py's setup
(SIMULATED workers, a web app reading every stream through the stream hub).

Printed per token: Redis CPU in all (INFO cpu), the time Redis spent executing each
command (INFO commandstats: a script's own redis.call commands are counted both under
their names and inside EVALSHA), and the rest (reading and writing sockets, the AOF,
the event loop, cron). Then, from a SLOWLOG sample of part of the window, the time of
each script (EVALSHA by script name) and each plain command, per token.

    python bench/scale_profile.py [--workers 4] [--window-s 10] [--sample-s 2]
    python bench/scale_profile.py --max-tokens 32 --sample-s 0 --min-replicas 1   # WAIT's cost
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/...`

from bench.scale import AFTER, BEFORE, sim_model
from bench.scale_run import Figures, measure, single_target

TOP = 16
ROW = "  {:<20} {:>11.3f} {:>8.2f} {:>9.2f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--step-ms", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--before", action="store_true", help="the 'before' config")
    parser.add_argument("--coalesce-ms", type=int, help="instead of the config's window")
    parser.add_argument("--min-replicas", type=int, default=0, help="TOKENQ_REDIS_MIN_REPLICAS")
    parser.add_argument("--replicas", type=int, help="the Redis's replicas (default: as many)")
    parser.add_argument("--gather-ms", type=float, help="instead of the config's hub gather")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = BEFORE if args.before else AFTER
    if args.coalesce_ms is not None:
        config = replace(config, coalesce_ms=args.coalesce_ms)
    if args.gather_ms is not None:
        config = replace(config, gather_ms=args.gather_ms)
    model = sim_model(args.step_ms, args.batch)
    replicas = args.min_replicas if args.replicas is None else args.replicas
    with single_target(replicas) as target:
        f = measure(
            target, args.workers, model, config.coalesce_ms, args.window_s, args.max_tokens,
            readers=True, gather_ms=config.gather_ms, sample_s=args.sample_s,
            min_replicas=args.min_replicas,
        )  # fmt: skip
    print(f"{target.kind}, TOKENQ_REDIS_MIN_REPLICAS={args.min_replicas}")
    print(f"{args.workers} workers, {config}: {f.tokens_per_s:.0f} tok/s, ", end="")
    print(f"{f.redis_cpu_us_per_token:.1f} us Redis CPU per token, p99 {f.coalesce_p99_ms:.0f} ms")
    print(f"{f.tokens // args.max_tokens} requests finished in the window; ", end="")
    print(f"{f.commands_per_token:.2f} Redis commands per token (a script's own count one each)")
    print_commandstats(f)
    print_sample(f)


def print_commandstats(f: Figures) -> None:
    """Commands called from scripts count under their own names and inside EVALSHA."""
    tokens = max(f.tokens, 1)
    print(f"\nINFO commandstats over the window, per token ({tokens} tokens):")
    print(f"  {'command':<20} {'calls/token':>11} {'us/call':>8} {'us/token':>9}")
    rows = sorted(f.command_stats.items(), key=lambda kv: -kv[1][1])
    for name, (calls, usec) in rows[:TOP]:
        print(ROW.format(name, calls / tokens, usec / max(calls, 1), usec / tokens))
    io = {k: v for k, v in f.io.items()}
    print("  per token: " + ", ".join(f"{k} {v / tokens:.3f}" for k, v in io.items()))


def print_sample(f: Figures) -> None:
    tokens = max(f.sampled_tokens, 1)
    total = sum(usec for _, usec in f.sampled.values())
    print(f"\nSLOWLOG sample ({tokens} tokens): command or script, per token")
    print(f"  {'name':<20} {'calls/token':>11} {'us/call':>8} {'us/token':>9}")
    for name, (calls, usec) in sorted(f.sampled.items(), key=lambda kv: -kv[1][1])[:TOP]:
        print(ROW.format(name, calls / tokens, usec / max(calls, 1), usec / tokens))
    print(f"  all top-level commands executed: {total / tokens:.2f} us/token (the rest of")
    print("  Redis's CPU is sockets, the AOF, the event loop and cron, and the log itself)")


if __name__ == "__main__":
    main()
