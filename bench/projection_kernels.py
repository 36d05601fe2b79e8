"""Which kernel reads a decode step's weights fastest on this CPU: each projection of
the default model (a layer's fused q/k/v, output, fused gate/up and down, and the LM
head) timed alone, one thread, at 1, 4 and 8 rows, through every candidate torch has:

- ``fp32``: oneDNN's linear on its packed fp32 weight (the engine's fp32 path);
- ``int8``: ``aten._weight_int8pack_mm``, int8 weights and bf16 activations
  (``--quantization int8``);
- ``w8a8``: fbgemm's dynamic int8 linear, each row's activations quantized to 8 bits
  (``--quantization w8a8``; rows one at a time, as the engine runs them);
- ``int4``: ``aten._weight_int4pack_mm_for_cpu``, 4-bit weights in groups of 32 and
  bf16 activations (what an ``int4`` method would run);
- ``bf16``: oneDNN's linear on bf16 weights and activations (``--dtype bfloat16``).

    python bench/projection_kernels.py              # rows 1 4 8
    python bench/projection_kernels.py --rows 1
    python bench/projection_kernels.py --rows 1 --from-memory

``--from-memory`` times a step as the engine reads it instead: every layer's projections
held as weights of their own (30 layers' worth, and the LM head), each called once a
pass, so every byte comes from memory, not the caches. Beside each kernel it prints the
bytes its weights hold, the rate it read them at, and two bounds: the time this CPU
takes to stream the same bytes (a plain sum over a buffer that size: the floor for a
step bound by reading its weights) and the kernel's fixed cost, one call on a 64 x 64
weight, paid once per projection a step.

Each figure is the mean of many calls on one weight, which then sits in the CPU's
caches: a whole step, which reads every layer's weights once, is slower. The sum
over a step (every layer once and the LM head) ranks the kernels; ``bench/latency.py``
measures the steps themselves.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.engine.quantization import w8a8_available
from worker.model_store import resolve_model

INT4_GROUP = 32
CALLS = 200
WARM_UP_CALLS = 5


def projections(model: str) -> dict[str, tuple[int, int, int]]:
    """Each projection's ``(out, in, times a step runs it)``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model(model))
    hidden, inner = config.hidden_size, config.intermediate_size
    head = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head
    layers = config.num_hidden_layers
    return {
        "q/k/v": (config.num_attention_heads * head + 2 * kv, hidden, layers),
        "output": (hidden, config.num_attention_heads * head, layers),
        "gate/up": (2 * inner, hidden, layers),
        "down": (hidden, inner, layers),
        "LM head": (config.vocab_size, hidden, 1),
    }


Kernel = Callable[[torch.Tensor], torch.Tensor]


def kernels(weight: torch.Tensor) -> dict[str, Kernel]:
    """Every candidate's call on ``weight`` ``[out, in]``, its weights prepared once."""
    out_features, in_features = weight.shape
    scales = weight.abs().amax(dim=1) / 127
    values = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    bf16_scales = scales.to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    bf16 = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16))
    found: dict[str, Kernel] = {
        "fp32": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "int8": lambda x: torch.ops.aten._weight_int8pack_mm(
            x.to(torch.bfloat16), values, bf16_scales
        ),
    }
    if w8a8_available():
        with warnings.catch_warnings():  # torch 2.13 calls quantized tensors deprecated
            warnings.simplefilter("ignore")
            zero_points = torch.zeros(out_features, dtype=torch.long)
            quantized = torch._make_per_channel_quantized_tensor(
                values, scales.double(), zero_points, 0
            )
            torch.backends.quantized.engine = "fbgemm"
            prepacked = torch.ops.quantized.linear_prepack(quantized, None)
        found["w8a8"] = lambda x: torch.cat(
            [
                torch.ops.quantized.linear_dynamic(x[i : i + 1], prepacked, False)
                for i in range(len(x))
            ]
        )
    groups = weight.view(out_features, in_features // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    step = (high - low).clamp(min=1e-8) / 15
    nibbles = torch.round((groups - low[..., None]) / step[..., None]).clamp(0, 15)
    int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        nibbles.to(torch.int32).view(out_features, in_features), 1
    )
    # Scales and zero points ``[groups, out, 2]``, the zero point at the middle code.
    scales_zeros = torch.stack([step.t(), (low + 8 * step).t()], dim=-1).to(torch.bfloat16)
    found["int4"] = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.to(torch.bfloat16), int4, INT4_GROUP, scales_zeros.contiguous()
    )
    found["bf16"] = lambda x: torch.ops.mkldnn._linear_pointwise(
        x.to(torch.bfloat16), bf16, None, "none", [], ""
    )
    return found


# Bytes each kernel's weights hold per value (the scales and packing aside).
BYTES_PER_VALUE = {"fp32": 4.0, "int8": 1.0, "w8a8": 1.0, "int4": 0.5, "bf16": 2.0}
PASSES = 10
FIXED_COST_SIDE = 64  # the weight whose call is all fixed cost


def timed_ms(call: Callable[[], object], calls: int = PASSES, warm_up: int = 1) -> float:
    """The mean time of ``call``, in ms, after ``warm_up`` calls."""
    for _ in range(warm_up):
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e3


def time_ms(kernel: Kernel, x: torch.Tensor) -> float:
    return timed_ms(lambda: kernel(x), CALLS, WARM_UP_CALLS)


def stream_ms(num_bytes: int) -> float:
    """How long this CPU takes to read ``num_bytes`` once, streaming (a sum over them)."""
    buffer = torch.ones(num_bytes // 8, dtype=torch.int64)
    return timed_ms(buffer.sum)


def from_memory(shapes: dict[str, tuple[int, int, int]], rows: int) -> None:
    """A step's projections read from memory, kernel by kernel, against the floor."""
    weights = [
        (kernels(torch.randn(out_features, in_features) * 0.02), torch.randn(rows, in_features))
        for out_features, in_features, times in shapes.values()
        for _ in range(times)
    ]
    values = sum(out * inp * times for out, inp, times in shapes.values())
    fixed = kernels(torch.randn(FIXED_COST_SIDE, FIXED_COST_SIDE))
    tiny = torch.randn(rows, FIXED_COST_SIDE)
    print(f"{rows} row(s), a step's {len(weights)} projections read from memory, one thread")
    for name in weights[0][0]:

        def one_pass(name: str = name) -> None:
            for found, x in weights:
                found[name](x)

        ms = timed_ms(one_pass)
        num_bytes = int(values * BYTES_PER_VALUE[name])
        floor = stream_ms(num_bytes)
        fixed_us = time_ms(fixed[name], tiny) * 1e3
        print(
            f"  {name:5s} {ms:6.1f} ms a step  {num_bytes / 1e6:5.0f} MB at "
            f"{num_bytes / ms / 1e6:5.1f} GB/s  streaming them: {floor:5.1f} ms "
            f"({ms / floor:4.2f}x that)  fixed cost {fixed_us:5.1f} us a call "
            f"({fixed_us * len(weights) / 1e3:4.1f} ms a step)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument(
        "--from-memory", action="store_true", help="a whole step's weights, read from memory"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = projections(args.model)
    for rows in args.rows:
        if args.from_memory:
            from_memory(shapes, rows)
            continue
        step: dict[str, float] = {}
        print(f"{rows} row(s): ms per call, one thread")
        for name, (out_features, in_features, times) in shapes.items():
            weight = torch.randn(out_features, in_features) * 0.02
            x = torch.randn(rows, in_features)
            figures = {k: time_ms(kernel, x) for k, kernel in kernels(weight).items()}
            for kernel, ms in figures.items():
                step[kernel] = step.get(kernel, 0.0) + ms * times
            print(f"  {name:8s} " + "  ".join(f"{k} {ms:7.3f}" for k, ms in figures.items()))
        summed = (f"{k} {ms:6.1f} ms ({step['fp32'] / ms:4.2f}x fp32)" for k, ms in step.items())
        print("  a step's projections, summed: " + "  ".join(summed))


if __name__ == "__main__":
    main()
