"""Speculative decoding's gain for one stream: the engine with n-gram speculation
against the engine without it, alternated request by request in one run, on an
input-grounded workload of its own (summaries, code edits, extraction:
``workloads/grounded12.jsonl``).

    python bench/speculative.py                     # 2 rounds, one thread, k=4
    python bench/speculative.py --rounds 3 --num-speculative-tokens 3
    python bench/speculative.py --batch-sizes 1,2,4,8 --rounds 1

Each request runs alone (one stream) on one engine, then on the other, so a busy
neighbour slows both alike: compare the ratio, not absolutes across runs. Both
engines' greedy outputs are the same tokens (checked), so they do the same work.
Printed: tokens/s of each over the whole workload (median of the rounds), their
ratio, and the speculative engine's acceptance rate, tokens per verified step and
decode steps per generated token. ``--batch-sizes`` also runs that many requests at
once on each, speculating at every batch size, to find where speculation stops
paying (``disable_by_batch_size``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from shared.models import SamplingParams
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.speculative.config import SpeculativeConfig
from worker.model_store import resolve_model

WORKLOADS = Path(__file__).resolve().parent / "workloads"


def load(name: str, engine: Engine) -> list[tuple[str, list[int], int]]:
    """Each row's task, chat prompt as token ids, and max_tokens."""
    rows = [json.loads(line) for line in (WORKLOADS / name).read_text().splitlines() if line]
    return [(row["task"], engine.encode_chat(row["messages"]), row["max_tokens"]) for row in rows]


def run(engine: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy outputs of ``prompts`` run at once, and the wall time they took."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    requests = [
        EngineRequest(f"spec-{time.monotonic_ns()}-{i}", p, sampling) for i, p in enumerate(prompts)
    ]
    started = time.perf_counter()
    results = engine.generate(requests)
    elapsed_s = time.perf_counter() - started
    return [
        [t for o in results[r.request_id] for t in o.new_token_ids] for r in requests
    ], elapsed_s


def one_stream_round(
    plain: Engine, spec: Engine, workload: list[tuple[str, list[int], int]]
) -> dict[str, float]:
    """Every request alone on each engine in turn; tokens/s of each, and agreement."""
    totals = {"plain_s": 0.0, "spec_s": 0.0, "tokens": 0.0, "steps": 0.0, "mismatches": 0.0}
    for _, prompt, max_tokens in workload:
        (expected,), plain_s = run(plain, [prompt], max_tokens)
        steps_before = spec.num_steps
        (got,), spec_s = run(spec, [prompt], max_tokens)
        totals["steps"] += spec.num_steps - steps_before - 1  # its decode steps
        totals["plain_s"] += plain_s
        totals["spec_s"] += spec_s
        totals["tokens"] += len(expected)
        totals["mismatches"] += got != expected
    return totals


def batch_round(plain: Engine, spec: Engine, prompts: list[list[int]], max_tokens: int) -> float:
    """The speculative engine's tokens/s over the plain one's, ``prompts`` at once."""
    expected, plain_s = run(plain, prompts, max_tokens)
    got, spec_s = run(spec, prompts, max_tokens)
    if got != expected:
        print("  warning: outputs differ", file=sys.stderr)
    return plain_s / spec_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--workload", default="grounded12.jsonl")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="0: torch's default")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--batch-sizes", default="", help="e.g. 1,2,4,8 (off by default)")
    parser.add_argument("--no-one-stream", action="store_true", help="batch sizes only")
    args = parser.parse_args()
    model = str(resolve_model(args.model))
    config = EngineConfig(model=model, num_threads=args.threads or None, kv_cache_mib=256)
    speculative = SpeculativeConfig(
        num_speculative_tokens=args.num_speculative_tokens,
        prompt_lookup_max=args.prompt_lookup_max,
        prompt_lookup_min=args.prompt_lookup_min,
        disable_by_batch_size=1 << 20,  # measured at every batch size here
    )
    plain, spec = Engine(config), Engine(replace(config, speculative_config=speculative))
    workload = load(args.workload, plain)
    print(f"{len(workload)} requests, {torch.get_num_threads()} thread(s), {speculative}")
    if not args.no_one_stream:
        one_stream(plain, spec, workload, args.rounds)
    if args.batch_sizes:
        batches(plain, spec, workload, [int(b) for b in args.batch_sizes.split(",")], args.rounds)


def one_stream(
    plain: Engine, spec: Engine, workload: list[tuple[str, list[int], int]], rounds: int
) -> None:
    rates: list[tuple[float, float]] = []
    before = spec.stats()
    for number in range(rounds):
        totals = one_stream_round(plain, spec, workload)
        plain_rate, spec_rate = (
            totals["tokens"] / totals["plain_s"],
            totals["tokens"] / totals["spec_s"],
        )
        rates.append((plain_rate, spec_rate))
        print(
            f"round {number + 1}: off {plain_rate:.1f} tok/s, on {spec_rate:.1f} tok/s "
            f"({spec_rate / plain_rate:.2f}x); {totals['steps'] / totals['tokens']:.2f} decode "
            f"steps per token; outputs differing: {int(totals['mismatches'])}"
        )
    after = spec.stats()
    drafted = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
    kept = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    drafts = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
    plain_rate = statistics.median(r[0] for r in rates)
    spec_rate = statistics.median(r[1] for r in rates)
    print(
        f"one stream: off {plain_rate:.1f} tok/s, on {spec_rate:.1f} tok/s, "
        f"ratio {spec_rate / plain_rate:.2f}x; acceptance {kept / max(drafted, 1):.2f}, "
        f"tokens per verified step {1 + kept / max(drafts, 1):.2f}"
    )


def batches(
    plain: Engine,
    spec: Engine,
    workload: list[tuple[str, list[int], int]],
    sizes: list[int],
    rounds: int,
) -> None:
    prompts = [prompt for _, prompt, _ in workload]
    max_tokens = min(m for _, _, m in workload)
    for size in sizes:
        batch = [prompts[i % len(prompts)] for i in range(size)]
        ratios = [batch_round(plain, spec, batch, max_tokens) for _ in range(rounds)]
        print(f"batch of {size}: on/off tokens/s {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
