"""Engine throughput and priority isolation against transformers, in one run.

    python bench/engine.py             # mixed200, every peer (~15 min on 2 quiet cores)
    python bench/engine.py --quick     # mixed32, static-32 peer only
    python bench/engine.py --device cuda --repeat 10   # 2,000 requests on a GPU
    python bench/engine.py --quick --loras 4   # spread over 4 LoRA adapters vs the base
    python bench/engine.py --timed-forward-ms 4.3 --max-num-seqs 256 --repeat 10

``--timed-forward-ms`` replaces the model's forward with a wait of that long that
leaves the host free (as a GPU's forward does), everything else real, and runs the
workload with asynchronous scheduling and without, in the same run: the ceiling is
the tokens that back-to-back steps of that length at the engine's own batch sizes
give, so the figure is the host's share of a step on a device as fast as the wait.

Figures are useful new tokens per second (each request's own budget, ``ignore_eos``,
greedy; fp32 on the CPU, bf16 on CUDA) over the whole workload, every request
submitted at once. The peers run in the same process right after the engine, on
the same device, so compare ratios, not absolutes across runs (the machine is
shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.models import SamplingParams
from shared.priority import Priority, parse_priority
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import Sequence
from worker.engine.step_inputs import StepInputs

WORKLOADS = Path(__file__).resolve().parent / "workloads"


@dataclass
class Item:
    prompt_ids: list[int]
    max_tokens: int
    priority: int


@dataclass
class Run:
    """What one drain of the engine saw."""

    num_tokens: int = 0
    wall_s: float = 0.0
    ttft_s: dict[str, float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)


def load(path: Path, engine: Engine) -> list[Item]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        Item(engine.encode_chat(r["messages"]), r["max_tokens"], parse_priority(r["priority"]))
        for r in rows
    ]


def request(i: int, item: Item) -> EngineRequest:
    sampling = SamplingParams(max_tokens=item.max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(f"r{i}", item.prompt_ids, sampling, item.priority, float(i))


def drain(engine: Engine, arrivals: list[tuple[float, EngineRequest]]) -> Run:
    """Add each request when its offset (s) comes and step until all are done."""
    pending = sorted(arrivals, key=lambda a: a[0])
    run = Run()
    submitted: dict[str, float] = {}
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= time.perf_counter() - start:
            offset, req = pending.pop(0)
            submitted[req.request_id] = offset
            engine.add_request(req)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - start)))
            continue
        for out in engine.step():
            run.num_tokens += len(out.new_token_ids)
            now = time.perf_counter() - start
            if out.new_token_ids and out.request_id not in run.ttft_s:
                run.ttft_s[out.request_id] = now - submitted[out.request_id]
            if out.finish_reason is not None:
                run.finished.add(out.request_id)
    run.wall_s = time.perf_counter() - start
    return run


def at_once(items: list[Item]) -> list[tuple[float, EngineRequest]]:
    return [(0.0, request(i, it)) for i, it in enumerate(items)]


def priority_run(engine: Engine, items: list[Item], engine_tps: float, overload: float) -> Run:
    """Requests arrive in file order ``overload`` times faster than the engine drains
    them, so the engine is saturated when each critical request comes."""
    span_s = sum(it.max_tokens for it in items) / engine_tps / overload
    return drain(engine, [(span_s * i / len(items), request(i, it)) for i, it in enumerate(items)])


def idle_ttft(engine: Engine, items: list[Item], num: int = 8) -> float:
    critical = [(i, it) for i, it in enumerate(items) if it.priority == Priority.CRITICAL][:num]
    times: list[float] = []
    for i, item in critical:
        run = drain(engine, [(0.0, request(i, item))])
        times.extend(run.ttft_s.values())
    return statistics.median(times)


def static_batches(model: Any, items: list[Item], batch_size: int) -> float:
    """transformers ``generate``: left-padded batches, each to its longest budget."""
    pad = model.generation_config.pad_token_id or 0
    start = time.perf_counter()
    for b in range(0, len(items), batch_size):
        batch = items[b : b + batch_size]
        width = max(len(it.prompt_ids) for it in batch)
        ids = [[pad] * (width - len(it.prompt_ids)) + it.prompt_ids for it in batch]
        mask = [[0] * (width - len(it.prompt_ids)) + [1] * len(it.prompt_ids) for it in batch]
        with torch.inference_mode():
            model.generate(
                input_ids=torch.tensor(ids, device=model.device),
                attention_mask=torch.tensor(mask, device=model.device),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=pad,
                max_new_tokens=max(it.max_tokens for it in batch),
            )
    synchronize(model)
    return sum(it.max_tokens for it in items) / (time.perf_counter() - start)


def generate_batch(model: Any, items: list[Item]) -> float:
    """transformers' continuous batching (the manager behind ``generate_batch``),
    each request with its own budget and no EOS stop."""
    from transformers import GenerationConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers is untyped here
        do_sample=False,
        max_new_tokens=max(it.max_tokens for it in items),
        eos_token_id=-1,
        pad_token_id=model.generation_config.pad_token_id,
    )
    num_tokens, done = 0, 0
    start = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=config, block=True) as cb:
        for i, it in enumerate(items):
            cb.add_request(it.prompt_ids, request_id=f"g{i}", max_new_tokens=it.max_tokens)
        while done < len(items):
            result = cb.get_result(timeout=1)
            if result is not None and result.is_finished():
                done += 1
                num_tokens += len(result.generated_tokens)
    return num_tokens / (time.perf_counter() - start)


def graph_ceiling(engine: Engine, batch_size: int, context: int = 128, steps: int = 200) -> float:
    """The engine's own captured step graph replayed for a decode of ``batch_size``
    rows at ``context`` tokens, with nothing around it: the GPU's time per decode
    step. It writes the first blocks of the pool, so it runs after the engine's runs."""
    graphs = engine.runner.graphs
    if graphs is None:
        raise RuntimeError("the graph ceiling needs a CUDA engine with graphs captured")
    size = engine.kv_cache.block_size
    inputs = StepInputs.build(_decode_rows(batch_size, context, size), size)
    with torch.inference_mode():
        graphs.run(inputs)  # loads the static buffers
    graph = graphs.graphs[next(s for s in graphs.sizes if s >= batch_size)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    return batch_size * steps / (time.perf_counter() - start)


def host_syncs_per_step(
    engine: Engine, items: list[Item], num_steps: int = 50
) -> tuple[float, float]:
    """Per engine step over steps of the workload in flight: the device-to-host
    synchronisations torch's sync debug mode flags, and the host's waits for a step's
    sampled ids (an event's, which that mode does not see)."""
    for i, item in enumerate(items[:num_steps]):
        engine.add_request(request(10**6 + i, item))
    for _ in range(3):
        engine.step()
    torch.cuda.set_sync_debug_mode("warn")
    waits = engine.num_host_waits
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            steps = 0
            while engine.has_unfinished_requests() and steps < num_steps:
                engine.step()
                steps += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    waits = engine.num_host_waits - waits
    while engine.has_unfinished_requests():
        engine.step()
    flagged = sum("synchroniz" in str(w.message) for w in caught)
    return flagged / max(steps, 1), waits / max(steps, 1)


def raw_ceiling(model: Any, batch_size: int, context: int = 128, steps: int = 16) -> float:
    """A batched decode forward over a ~128-token cache with nothing around it."""
    from transformers import DynamicCache

    ids = torch.randint(100, 1000, (batch_size, context), device=model.device)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        synchronize(model)
        start = time.perf_counter()
        for _ in range(steps):
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1)
        synchronize(model)
        return batch_size * steps / (time.perf_counter() - start)


def forward_ceiling(engine: Engine, batch_size: int, context: int = 128, steps: int = 16) -> float:
    """The engine's own forward (no scheduler, input building or sampling) for a
    decode of ``batch_size`` rows at ``context`` tokens: what the engine's kernels
    give with nothing around them. It writes the first blocks of the pool, so it
    runs after the engine's runs."""
    runner = engine.runner
    num_blocks = -(-context // runner.block_size)
    inputs = runner.prepare(_decode_rows(batch_size, context, runner.block_size))
    for cache in (*runner.key_cache, *runner.value_cache):
        cache[: batch_size * num_blocks * runner.block_size].zero_()
    with torch.inference_mode():
        runner.forward(inputs)
        start = time.perf_counter()
        for _ in range(steps):
            runner.forward(inputs)
        return batch_size * steps / (time.perf_counter() - start)


def _decode_rows(batch_size: int, context: int, block_size: int) -> list[ScheduledSeq]:
    """A decode step of ``batch_size`` rows at ``context`` tokens, each on blocks of its
    own from the first of the pool."""
    num_blocks = -(-context // block_size)
    scheduled = []
    for row in range(batch_size):
        req = EngineRequest(f"c{row}", [100 + row] * context, SamplingParams(max_tokens=1), 0, 0.0)
        seq = Sequence.from_request(req, row)
        seq.block_table = list(range(row * num_blocks, (row + 1) * num_blocks))
        scheduled.append(ScheduledSeq(seq, context - 1, 1, sample=True))
    return scheduled


def synchronize(model: Any) -> None:
    """Wait for the GPU's queued work, so that a timer reads finished work."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def report_engine(engine: Engine, items: list[Item]) -> float:
    drain(engine, at_once(items[:8]))  # warm-up
    before = engine.scheduler.num_preemptions
    run = drain(engine, at_once(items))
    tps = run.num_tokens / run.wall_s
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    config = engine.config
    print(
        f"engine: {tps:.1f} tok/s ({run.num_tokens} tokens in {run.wall_s:.1f} s; "
        f"max_num_seqs {config.max_num_seqs}, {config.max_num_batched_tokens} tokens/step, "
        f"{'CUDA graphs, ' if engine.runner.graphs is not None else ''}"
        f"{engine.scheduler.num_preemptions - before} preemptions)"
    )
    largest = max(len(it.prompt_ids) + it.max_tokens for it in items)
    print(
        f"  peak RSS {rss_mib:.0f} MiB; KV cache pool {engine.kv_cache_budget_bytes >> 20} MiB "
        f"({engine.kv_cache.num_blocks} blocks of {engine.kv_cache.block_size} tokens, "
        f"allocated once); largest context served {largest} tokens, "
        f"the most one request may hold {engine.max_model_len}"
    )
    if engine.runner.device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated(engine.runner.device) >> 20
        print(f"  peak GPU memory allocated {peak_mib} MiB ({torch.cuda.get_device_name()})")
    return tps


def report_priority(engine: Engine, items: list[Item], engine_tps: float, overload: float) -> None:
    idle = idle_ttft(engine, items)
    run = priority_run(engine, items, engine_tps, overload)
    critical = [
        run.ttft_s[f"r{i}"] for i, it in enumerate(items) if it.priority == Priority.CRITICAL
    ]
    lows = [f"r{i}" for i, it in enumerate(items) if it.priority == Priority.LOW]
    busy = statistics.median(critical)
    print(
        f"priority (arrivals {overload:g}x the drain rate): "
        f"critical TTFT idle {idle * 1000:.0f} ms, "
        f"saturated median {busy * 1000:.0f} ms = {busy / idle:.2f}x (target <= 3x); "
        f"low finished {sum(r in run.finished for r in lows)}/{len(lows)}"
    )


def report_ceiling(engine: Engine, items: list[Item], engine_tps: float) -> None:
    batch = engine.config.num_seqs
    if engine.runner.graphs is not None:
        flagged, waits = host_syncs_per_step(engine, items)
        print(
            f"host syncs per engine step: {flagged + waits:.2f} (target 1): {flagged:.2f} that"
            f" torch's sync debug mode flags, {waits:.2f} waits for a step's sampled ids"
        )
        ceiling = graph_ceiling(engine, batch)
        kind, target = "replaying the engine's captured step graph", 80
    else:
        own = forward_ceiling(engine, batch)
        print(
            f"the engine's own forward (batch {batch}, 128-token context, no scheduling or "
            f"sampling): {own:.1f} tok/s; engine {100 * engine_tps / own:.0f}% of it"
        )
        ceiling = raw_ceiling(engine.runner.model, batch)
        kind, target = "transformers' eager forward", 85
    print(
        f"raw ceiling ({kind}; batch {batch}, 128-token context): {ceiling:.1f} tok/s; "
        f"engine {100 * engine_tps / ceiling:.0f}% of it (target >= {target}%)"
    )


def report_peers(
    model: Any, items: list[Item], engine_tps: float, args: argparse.Namespace
) -> None:
    if not args.skip_static:
        static = static_batches(model, items, 32)
        print(
            f"static batches of 32: {static:.1f} tok/s; engine {engine_tps / static:.2f}x "
            "(target >= 2.6x)"
        )
    if not args.quick and not args.skip_generate_batch:
        cb = generate_batch(model, items)
        target = 5 if model.device.type == "cuda" else 3
        print(
            f"generate_batch: {cb:.1f} tok/s; engine {engine_tps / cb:.2f}x (target >= {target}x)"
        )


def report_timed(args: argparse.Namespace) -> None:
    """The engine on the timed forward, asynchronous and synchronous, against the
    forward-bound ceiling (see the module docs)."""
    step_s = args.timed_forward_ms / 1000
    for async_scheduling in (True, False):
        engine = make_engine(
            args, timed_forward_ms=args.timed_forward_ms, async_scheduling=async_scheduling
        )
        items = load(Path(args.workload), engine) * args.repeat
        drain(engine, at_once(items[:8]))  # warm-up
        steps, waits, cpu_s = engine.num_steps, engine.num_host_waits, time.process_time()
        run = drain(engine, at_once(items))
        steps, waits = engine.num_steps - steps, engine.num_host_waits - waits
        cpu_ms = (time.process_time() - cpu_s) / steps * 1000
        ceiling = run.num_tokens / (steps * step_s)
        mode = "async" if async_scheduling else "sync "
        print(
            f"timed-forward ({mode}): {run.num_tokens / run.wall_s:.0f} tok/s, {run.num_tokens} "
            f"tokens in {steps} steps of {args.timed_forward_ms:g} ms ({run.wall_s:.2f} s); "
            f"ceiling {ceiling:.0f} tok/s; host waits per step {waits / steps:.2f}; "
            f"process CPU {cpu_ms:.2f} ms per step (load average {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} CPUs)"
        )
        print(
            f"timed-forward: engine at {100 * steps * step_s / run.wall_s:.0f}% of the "
            f"forward-bound ceiling ({'asynchronous' if async_scheduling else 'synchronous'}"
            f" scheduling; goal >= 90% asynchronous)"
        )


def make_engine(args: argparse.Namespace, **changes: Any) -> Engine:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_threads=args.threads,
        kv_cache_mib=args.kv_cache_mib,
        enforce_eager=args.enforce_eager,
        max_loras=max(args.loras, EngineConfig.max_loras),
        async_scheduling=args.async_scheduling,
    )
    return Engine(replace(config, **changes))


def main() -> None:
    args = parse_args()
    if args.timed_forward_ms is not None:
        return report_timed(args)
    engine = make_engine(args)
    items = load(Path(args.workload), engine) * args.repeat
    if args.loras:
        from bench.lora_mix import report_loras

        return report_loras(engine, [r for _, r in at_once(items)], args.loras, drain)
    print(
        f"{Path(args.workload).name}: {len(items)} requests, "
        f"{sum(it.max_tokens for it in items)} new tokens, "
        f"{sum(len(it.prompt_ids) for it in items)} prompt tokens; "
        f"{engine.runner.device} {str(engine.runner.dtype).removeprefix('torch.')}, "
        f"torch threads {torch.get_num_threads()}"
    )
    engine_tps = report_engine(engine, items)
    if args.skip_priority or not any(it.priority == Priority.CRITICAL for it in items):
        print("critical TTFT: not measured (skipped, or the workload has no critical request)")
    else:
        report_priority(engine, items, engine_tps, args.overload)
    if not args.skip_peers:
        model = engine.runner.model
        model.set_attn_implementation("sdpa")
        report_ceiling(engine, items, engine_tps)
        report_peers(model, items, engine_tps, args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default=None, help="a jsonl workload (default mixed200)")
    parser.add_argument("--quick", action="store_true", help="mixed32, static-32 peer only")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (auto: cuda if any)")
    parser.add_argument("--dtype", default="auto", help="auto: fp32 on the CPU, bf16 on CUDA")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: the device's")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="the workload this many times")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kv-cache-mib", type=int, default=None, help="default: share of free")
    parser.add_argument("--overload", type=float, default=2.0, help="arrival over drain rate")
    parser.add_argument("--skip-priority", action="store_true")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--skip-static", action="store_true", help="no static-batch peer")
    parser.add_argument("--skip-generate-batch", action="store_true", help="no generate_batch")
    parser.add_argument("--loras", type=int, default=0, help="only: N adapters vs the base")
    parser.add_argument(
        "--timed-forward-ms",
        type=float,
        default=None,
        help="a forward that waits this long (GIL released): asynchronous vs synchronous",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule the next step while one runs (default: on)",
    )
    args = parser.parse_args()
    if args.workload is None:
        args.workload = str(WORKLOADS / ("mixed32.jsonl" if args.quick else "mixed200.jsonl"))
    return args


if __name__ == "__main__":
    main()
