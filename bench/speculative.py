"""Speculative decoding's gain for one stream: the engine with n-gram speculation
against the engine without it, alternated request by request in one run, on an
input-grounded workload of its own (summaries, code edits, extraction:
``workloads/grounded12.jsonl``).

    python bench/speculative.py                     # 2 rounds, one thread, k=4
    python bench/speculative.py --rounds 3 --num-speculative-tokens 3
    python bench/speculative.py --streams 1 2 4 8 16 --rounds 2
    python bench/speculative.py --draft-model SmolLM2-135M-Instruct --draft-quantization w8a8

``--draft-model NAME`` proposes with that model (method ``draft_model``) instead of
n-grams, its weights quantized by ``--draft-quantization`` where given: the default
model in ``w8a8`` drafts for itself in fp32, the only draft at hand sharing its tokenizer.

Each request runs alone (one stream) on one engine, then on the other, so a busy
neighbour slows both alike: compare the ratio, not absolutes across runs. Both
engines' greedy outputs are the same tokens (checked), so they do the same work.
Printed: tokens/s of each over the whole workload (median of the rounds), their
ratio, and the speculative engine's acceptance rate, tokens per verified step and
decode steps per generated token.

``--streams N ...`` runs the workload N requests at once instead (in groups of N,
cycled to at least one group), each group on one engine then the other, the order
swapped every round, speculating at every N. Printed per N: tokens/s off and on
(medians), on/off (the median of the rounds' ratios), the acceptance, and the
largest N where on/off stays above 1.0: where speculation stops paying
(``disable_by_batch_size``). ``--batch-sizes 1,2,4,8`` is the older spelling.
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
from worker.engine.config import CPU_DEFAULTS, QUANTIZATION_METHODS
from worker.engine.speculative.config import SpeculativeConfig
from worker.model_store import resolve_model

WORKLOADS = Path(__file__).resolve().parent / "workloads"
CPU_MAX_NUM_SEQS = CPU_DEFAULTS["max_num_seqs"]
# Each request's chat prompt as token ids, and max_tokens.
Workload = list[tuple[list[int], int]]


def load(name: str, engine: Engine) -> Workload:
    """Each row's chat prompt as token ids, and max_tokens."""
    rows = [json.loads(line) for line in (WORKLOADS / name).read_text().splitlines() if line]
    return [(engine.encode_chat(row["messages"]), row["max_tokens"]) for row in rows]


def one_stream_round(plain: Engine, spec: Engine, workload: Workload) -> dict[str, float]:
    """Every request alone on each engine in turn; tokens/s of each, and agreement."""
    totals = {"plain_s": 0.0, "spec_s": 0.0, "tokens": 0.0, "steps": 0.0, "mismatches": 0.0}
    for prompt, max_tokens in workload:
        (expected,), plain_s = run_group(plain, [(prompt, max_tokens)])
        steps_before = spec.num_steps
        (got,), spec_s = run_group(spec, [(prompt, max_tokens)])
        totals["steps"] += spec.num_steps - steps_before - 1  # its decode steps
        totals["plain_s"] += plain_s
        totals["spec_s"] += spec_s
        totals["tokens"] += len(expected)
        totals["mismatches"] += got != expected
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--workload", default="grounded12.jsonl")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="0: torch's default")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument(
        "--streams", type=int, nargs="+", default=[], metavar="N", help="e.g. 1 2 4 8 16"
    )
    parser.add_argument("--draft-model", help="propose with this model instead of n-grams")
    parser.add_argument("--draft-quantization", choices=QUANTIZATION_METHODS)
    parser.add_argument("--batch-sizes", default="", help="the same as --streams, as 1,2,4,8")
    parser.add_argument("--no-one-stream", action="store_true", help="--streams only")
    parser.add_argument(
        "--kv-cache-mib", type=int, default=1024, help="each engine's (64 streams need ~800)"
    )
    args = parser.parse_args()
    sizes = args.streams + [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if args.rounds < 1 or any(size < 1 for size in sizes):
        parser.error("--rounds and every number of streams must be at least 1")
    if args.draft_quantization and not args.draft_model:
        parser.error("--draft-quantization quantizes the --draft-model: name one")
    model = str(resolve_model(args.model))
    # N streams run at once: room for all of them in a step and in the KV cache.
    config = EngineConfig(
        model=model,
        num_threads=args.threads or None,
        kv_cache_mib=args.kv_cache_mib,
        max_num_seqs=max([CPU_MAX_NUM_SEQS, *sizes]),
    )
    speculative = SpeculativeConfig(
        method="ngram" if args.draft_model is None else "draft_model",
        num_speculative_tokens=args.num_speculative_tokens,
        prompt_lookup_max=args.prompt_lookup_max,
        prompt_lookup_min=args.prompt_lookup_min,
        disable_by_batch_size=1 << 20,  # measured at every batch size here
        model=None if args.draft_model is None else str(resolve_model(args.draft_model)),
        quantization=args.draft_quantization,
    )
    plain, spec = Engine(config), Engine(replace(config, speculative_config=speculative))
    workload = load(args.workload, plain)
    print(f"{len(workload)} requests, {torch.get_num_threads()} thread(s), {speculative}")
    if not (args.no_one_stream or args.streams):  # --streams 1 is the one stream
        one_stream(plain, spec, workload, args.rounds)
    if sizes:
        streams(plain, spec, workload, sizes, args.rounds)


def one_stream(plain: Engine, spec: Engine, workload: Workload, rounds: int) -> None:
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


def groups(workload: Workload, num_streams: int) -> list[Workload]:
    """The workload's (prompt, max_tokens) in groups of ``num_streams``, cycled so that
    every request runs and the last group is full."""
    count = -(-max(len(workload), num_streams) // num_streams) * num_streams
    rows = [workload[i % len(workload)] for i in range(count)]
    return [rows[i : i + num_streams] for i in range(0, count, num_streams)]


def run_group(engine: Engine, rows: list[tuple[list[int], int]]) -> tuple[list[list[int]], float]:
    """Greedy outputs of ``rows`` (prompt, max_tokens) run at once, and the wall time."""
    tag = time.monotonic_ns()
    requests = [
        EngineRequest(f"spec-{tag}-{i}", p, SamplingParams(max_tokens=m, temperature=0.0))
        for i, (p, m) in enumerate(rows)
    ]
    started = time.perf_counter()
    results = engine.generate(requests)
    elapsed_s = time.perf_counter() - started
    return [
        [t for o in results[r.request_id] for t in o.new_token_ids] for r in requests
    ], elapsed_s


def streams_round(
    plain: Engine, spec: Engine, workload: Workload, num_streams: int, spec_first: bool
) -> tuple[float, float, int]:
    """Tokens/s off and on over the workload run ``num_streams`` at once, each group on
    both engines back to back (speculation first when ``spec_first``), and how many
    outputs differed."""
    plain_s = spec_s = 0.0
    num_tokens = mismatches = 0
    for rows in groups(workload, num_streams):
        if spec_first:
            got, on_s = run_group(spec, rows)
            expected, off_s = run_group(plain, rows)
        else:
            expected, off_s = run_group(plain, rows)
            got, on_s = run_group(spec, rows)
        plain_s, spec_s = plain_s + off_s, spec_s + on_s
        num_tokens += sum(map(len, expected))
        mismatches += sum(g != e for g, e in zip(got, expected, strict=True))
    return num_tokens / plain_s, num_tokens / spec_s, mismatches


def streams(plain: Engine, spec: Engine, workload: Workload, sizes: list[int], rounds: int) -> None:
    """On/off at each number of streams; the largest where speculation still pays."""
    ratios: dict[int, float] = {}
    print("streams | tok/s off | tok/s on | on/off | acceptance | outputs differing")
    for size in sizes:
        before = spec.stats()
        figures = [streams_round(plain, spec, workload, size, n % 2 == 1) for n in range(rounds)]
        after = spec.stats()
        drafted = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
        kept = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
        ratio = statistics.median(on / off for off, on, _ in figures)
        rounds_text = ", ".join(f"{on / off:.2f}x" for off, on, _ in figures)
        print(
            f"{size:7d} | {statistics.median(f[0] for f in figures):9.1f} | "
            f"{statistics.median(f[1] for f in figures):8.1f} | {ratio:5.2f}x | "
            f"{kept / max(drafted, 1):10.2f} | {sum(f[2] for f in figures)}"
            f"   (rounds: {rounds_text})",
            flush=True,
        )
        ratios[size] = ratio
    cutoff = 0
    for size, ratio in sorted(ratios.items()):
        if ratio <= 1.0:
            break
        cutoff = size
    print(f"speculation pays (on/off > 1.0) up to {cutoff} stream(s) at once")


if __name__ == "__main__":
    main()
