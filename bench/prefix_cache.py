"""Prefix caching on and off, on a web app's traffic: one long system prompt shared by
every request, a short question each.

    python bench/prefix_cache.py    # shared_prefix64: a 570-token system prompt, 64 questions
    python bench/prefix_cache.py --tenant acme    # each request salted as acme's, as a
                                                  # worker salts a tenant's requests

All requests are submitted at once to a warmed-up engine whose cache holds nothing
of the system prompt yet; the figures are time to first token (median and p90) and
the time to finish them all, with caching on and off, in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import Item, Run, at_once, drain, load  # bench/engine.py

from shared.cache_scope import cache_salt
from shared.models import TENANT, GenerationRequest
from shared.settings import Settings
from worker.engine import Engine, EngineConfig

WORKLOADS = Path(__file__).resolve().parent / "workloads"
WARM_UP = [Item(list(range(1000, 1000 + n)), 4, 50) for n in (40, 300, 600)]


def measure(engine: Engine, items: list[Item], salt: bytes = b"") -> Run:
    drain(engine, at_once(WARM_UP))  # prompts that share nothing with the workload
    arrivals = at_once(items)
    for _, req in arrivals:
        req.cache_salt = salt
    return drain(engine, arrivals)


def tenant_salt(tenant: str | None) -> bytes:
    """The cache salt a worker gives ``tenant``'s requests (shared.cache_scope)."""
    if tenant is None:
        return b""
    req = GenerationRequest(model="m", prompt="-", metadata={TENANT: tenant})
    return cache_salt(req, Settings())


def report(name: str, engine: Engine, run: Run) -> float:
    ttfts = sorted(run.ttft_s.values())
    median = statistics.median(ttfts)
    kv = engine.kv_cache
    hit_rate = kv.num_hit_tokens / max(kv.num_queried_tokens, 1)
    print(
        f"prefix caching {name}: TTFT median {median * 1000:.0f} ms, "
        f"p90 {ttfts[int(0.9 * (len(ttfts) - 1))] * 1000:.0f} ms; "
        f"all done in {run.wall_s:.2f} s; prefix-cache hit rate {hit_rate:.0%} of prompt tokens"
    )
    return median


def main() -> None:
    args = parse_args()
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        num_threads=args.threads,
        kv_cache_mib=args.kv_cache_mib,
    )
    results: dict[str, tuple[float, float]] = {}
    for name, enabled in (("off", False), ("on", True)):
        engine = Engine(dataclasses.replace(config, enable_prefix_caching=enabled))
        items = load(Path(args.workload), engine)
        if name == "off":
            print(
                f"{Path(args.workload).name}: {len(items)} requests, prompts of "
                f"{min(len(it.prompt_ids) for it in items)}-"
                f"{max(len(it.prompt_ids) for it in items)} tokens; {engine.runner.device}, "
                f"torch threads {torch.get_num_threads()}"
            )
        run = measure(engine, items, tenant_salt(args.tenant))
        results[name] = (report(name, engine, run), run.wall_s)
        del engine
    (ttft_off, wall_off), (ttft_on, wall_on) = results["off"], results["on"]
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"median TTFT {ttft_off / ttft_on:.1f}x lower with caching (goal >= 3x); "
        f"total time {wall_off / wall_on:.1f}x lower; peak RSS {rss_mib:.0f} MiB"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default=str(WORKLOADS / "shared_prefix64.jsonl"))
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs)
    parser.add_argument("--kv-cache-mib", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tenant", default=None, help="salt every request as this tenant's")
    return parser.parse_args()


if __name__ == "__main__":
    main()
