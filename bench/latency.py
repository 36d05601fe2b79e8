"""One stream's speed: one request of 128 greedy tokens at a time, on one thread, the
engine in fp32 against the engine with ``--quantization int8``, alternated in one run.

    python bench/latency.py                      # 5 rounds, the default model
    python bench/latency.py --rounds 3 --agreement mixed32.jsonl
    python bench/latency.py --bf16                # and bf16 weights beside them

Each round runs the same request on each engine in turn (both loaded in this
process), so a busy neighbour slows both alike; compare the ratio, not absolutes
across runs. Figures are tokens per second over the whole request (prefill
included) and over its decode steps alone (after the first token), the median of
the rounds. ``--agreement`` also runs a workload (all of it in flight, at most
four rows a step on the quantized engine, so its decode steps read int8) and
prints how far the quantized engine's greedy output agrees with fp32's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.models import SamplingParams
from tests.worker.engine.quant_agreement import agreement, greedy_steps, workload_prompts
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.model_store import resolve_model

WORKLOADS = Path(__file__).resolve().parent / "workloads"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# The agreement run's quantized engine takes at most this many rows a step, so that
# its decode steps run the int8 kernel (worker.engine.quantization.MAX_INT8_ROWS).
AGREEMENT_MAX_NUM_SEQS = 4


def one_stream(engine: Engine, prompt: list[int], num_tokens: int) -> tuple[float, float]:
    """Tokens/s over the whole request and over its decode steps."""
    sampling = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineRequest(f"lat-{time.monotonic_ns()}", prompt, sampling))
    started = time.perf_counter()
    first = None
    while engine.has_unfinished_requests():
        engine.step()
        first = first or time.perf_counter()
    ended = time.perf_counter()
    assert first is not None
    return num_tokens / (ended - started), (num_tokens - 1) / max(ended - first, 1e-9)


def engines(model: str, methods: list[str | None], bf16: bool = False) -> dict[str, Engine]:
    loaded = {
        method or "fp32": Engine(
            EngineConfig(model=model, num_threads=1, kv_cache_mib=64, quantization=method)
        )
        for method in methods
    }
    if bf16:  # bf16 weights (refused on a CPU without native bf16)
        config = EngineConfig(model=model, num_threads=1, kv_cache_mib=64, dtype="bfloat16")
        loaded["bf16"] = Engine(config)
    return loaded


def latency(loaded: dict[str, Engine], rounds: int, num_tokens: int) -> None:
    tokenizer = next(iter(loaded.values())).runner.tokenizer
    messages = [{"role": "user", "content": PROMPT}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    prompt = list(encoded["input_ids"])  # type: ignore[call-overload,index]
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in loaded}
    for number in range(rounds):
        for name, engine in loaded.items():
            figures[name].append(one_stream(engine, prompt, num_tokens))
            whole, decode = figures[name][-1]
            print(f"round {number + 1} {name:5s}: {whole:6.1f} tok/s ({decode:6.1f} decoding)")
    medians = {n: statistics.median(w for w, _ in f) for n, f in figures.items()}
    print(f"one stream, {num_tokens} tokens, 1 thread, median of {rounds} rounds:")
    for name, value in medians.items():
        ratio = value / medians["fp32"]
        print(f"  {name:5s} {value:6.1f} tok/s  {ratio:4.2f}x fp32")


def agreement_run(model: str, loaded: dict[str, Engine], workload: str) -> None:
    rows = [json.loads(line) for line in (WORKLOADS / workload).read_text().splitlines() if line]
    prompts = workload_prompts(loaded["fp32"].runner.tokenizer, rows)
    expected = greedy_steps(loaded["fp32"], prompts)
    for name in loaded:
        if name == "fp32":
            continue
        config = EngineConfig(
            model=model, quantization=name, max_num_seqs=AGREEMENT_MAX_NUM_SEQS, kv_cache_mib=256
        )
        if name == "bf16":
            config = EngineConfig(model=model, dtype="bfloat16", kv_cache_mib=256)
        got = greedy_steps(Engine(config), prompts)
        print(f"{workload}, {name} against fp32: {agreement(expected, got).summary()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--quantization", default="int8")
    parser.add_argument("--agreement", metavar="WORKLOAD", help="e.g. mixed32.jsonl")
    parser.add_argument(
        "--bf16", action="store_true", help="also bf16 weights (a CPU with native bf16)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = str(resolve_model(args.model))
    loaded = engines(model, [None, args.quantization], args.bf16)
    latency(loaded, args.rounds, args.tokens)
    if args.agreement:
        agreement_run(model, loaded, args.agreement)


if __name__ == "__main__":
    main()
