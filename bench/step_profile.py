"""Where a decode step goes on the CPU: ms per step, torch ops per step, and the
Python time outside the model's forward, at 1, 8 and 64 rows, fp32 and int8 (bf16
weights with ``--weights bf16``), eager and with ``--compile`` (``--modes compile``).

    python bench/step_profile.py                          # the default model, 1 thread
    python bench/step_profile.py --rows 1 8 --steps 40 --weights int8 bf16
    python bench/step_profile.py --rows 1 8 --weights fp32 --modes eager compile

Each configuration loads its engine, starts ``rows`` requests and runs them until
every one decodes, then times ``--steps`` decode steps (``Engine.step``), the
model's forward within them (its ``forward_fn``; "fwd cpu" is the CPU time of the
thread that ran it, which other processes on a busy machine disturb less), and
counts the aten operations a step dispatches (all of them, and those of the forward;
a compiled layer's kernels are not aten operations). "outside" is a step's time
outside the forward: building inputs, sampling, detokenizing and outputs. Timings on
a busy machine are noisy: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.models import SamplingParams
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.model_store import resolve_model

PROMPT_TOKENS = 32


class CountOps(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts every aten operation dispatched while it is on."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


class TimedForward:
    """The runner's forward, timed, and its ops counted while ``counting`` is set."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.counter: CountOps | None = None

    def __call__(self, batch: Any) -> Any:
        started, cpu_started = time.perf_counter(), time.thread_time()
        if self.counter is not None:
            with self.counter:
                result = self.forward(batch)
        else:
            result = self.forward(batch)
        self.seconds.append(time.perf_counter() - started)
        self.cpu_seconds.append(time.thread_time() - cpu_started)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.forward, name)


# What each name in ``--weights`` loads: the engine's dtype and its quantization.
WEIGHTS = {
    "fp32": ("float32", None),
    "int8": ("float32", "int8"),
    "w8a8": ("float32", "w8a8"),
    "bf16": ("bfloat16", None),
}


def decoding_engine(model: str, rows: int, weights: str, args: Any, mode: str = "eager") -> Engine:
    """An engine whose ``rows`` requests have all passed their prefill; with ``mode``
    "compile", its steps of up to ``rows`` tokens run through compiled layers."""
    dtype, quantization = WEIGHTS[weights]
    engine = Engine(
        EngineConfig(
            model=model,
            num_threads=args.threads,
            kv_cache_mib=256,
            max_num_seqs=max(rows, 1),
            dtype=dtype,
            quantization=quantization,
            compile=mode == "compile",
            compile_max_tokens=max(rows, 1),
        )
    )
    sampling = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)
    for row in range(rows):
        prompt = [(row * 31 + i) % 1000 + 100 for i in range(PROMPT_TOKENS)]
        engine.add_request(EngineRequest(f"r{row}", prompt, sampling))
    while len(engine.scheduler.running) < rows or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
    ):
        engine.step()
    for _ in range(3):  # warm: the first decode steps allocate
        engine.step()
    return engine


def profile(engine: Engine, num_steps: int) -> dict[str, float]:
    timed = TimedForward(engine.runner.forward_fn)
    engine.runner.forward_fn = timed  # type: ignore[assignment]
    step_s = []
    for _ in range(num_steps):
        started = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - started)
    forward_s = timed.seconds[-num_steps:]
    forward_cpu_s = timed.cpu_seconds[-num_steps:]
    counter = CountOps()
    with counter:  # one more step, its ops counted (not timed)
        timed.counter = CountOps()
        engine.step()
    engine.runner.forward_fn = timed.forward
    step_ms = statistics.median(step_s) * 1e3
    forward_ms = statistics.median(forward_s) * 1e3
    return {
        "step_ms": step_ms,
        "forward_ms": forward_ms,
        "forward_cpu_ms": statistics.median(forward_cpu_s) * 1e3,
        "outside_ms": step_ms - forward_ms,
        "ops": sum(counter.counts.values()),
        "forward_ops": sum(timed.counter.counts.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--weights", nargs="+", choices=sorted(WEIGHTS), default=["fp32", "int8"])
    parser.add_argument("--modes", nargs="+", choices=["eager", "compile"], default=["eager"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = str(resolve_model(args.model))
    print(
        f"{'weights':7s} {'mode':7s} {'rows':>4s} {'ms/step':>8s} {'forward':>8s} {'fwd cpu':>8s} "
        f"{'outside':>8s} "
        f"{'ops/step':>8s} {'fwd ops':>8s} {'ms/row':>7s}"
    )
    for method in args.weights:
        for rows in args.rows:
            for mode in args.modes:
                engine = decoding_engine(model, rows, method, args, mode)
                f = profile(engine, args.steps)
                print(
                    f"{method:7s} {mode:7s} {rows:4d} {f['step_ms']:8.2f} {f['forward_ms']:8.2f} "
                    f"{f['forward_cpu_ms']:8.2f} "
                    f"{f['outside_ms']:8.2f} {f['ops']:8.0f} {f['forward_ops']:8.0f} "
                    f"{f['step_ms'] / rows:7.2f}"
                )
                del engine


if __name__ == "__main__":
    main()
