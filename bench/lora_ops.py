"""Three ways to add per-row LoRA deltas at one projection site, timed in one run.

    python bench/lora_ops.py [--tokens 32 512] [--loras 4] [--rank 16]

Shapes are the default model's q/k/v site (576 in; 576 + 192 + 192 out). Each row
uses one of ``--loras`` adapters or none (a quarter of the rows). Printed: each
method's time per call against the base projection's own matmul, for a decode-sized
and a prefill-sized step. ``masked`` is what worker/engine/lora.py does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.engine.lora import Site, _SiteBuffers
from worker.engine.lora_weights import LoraWeights

SITE = Site("qkv", ("q_proj", "k_proj", "v_proj"), 576, (576, 192, 192))


def _adapters(num_loras: int, rank: int) -> list[LoraWeights]:
    out = []
    for n in range(num_loras):
        pairs = {
            (0, part): (torch.randn(rank, SITE.in_features), torch.randn(size, rank))
            for part, size in zip(SITE.parts, SITE.out_features, strict=True)
        }
        out.append(LoraWeights(f"lora{n}", rank, pairs))
    return out


def _time(fn: Callable[[], torch.Tensor], repeat: int = 50) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    args = _args()
    torch.manual_seed(0)
    buffers = _SiteBuffers(SITE, args.loras, args.rank, dtype=torch.float32)
    adapters = _adapters(args.loras, args.rank)
    for slot, weights in enumerate(adapters, start=1):
        buffers.write(slot, 0, weights)
    weight = torch.randn(sum(SITE.out_features), SITE.in_features)
    a = buffers.a.view(args.loras, len(SITE.parts) * args.rank, -1)
    for num_tokens in args.tokens:
        x = torch.randn(num_tokens, SITE.in_features)
        slots = torch.randint(0, args.loras + 1, (num_tokens,))
        with torch.inference_mode():
            _report(buffers, a, weight, x, slots, args)


def _report(
    buffers: _SiteBuffers,
    a: torch.Tensor,
    weight: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    args: argparse.Namespace,
) -> None:
    mask = (slots[:, None] == torch.arange(1, args.loras + 1)[None]).float()
    masked = buffers.delta(x, mask)
    for other in (_segmented(buffers, a, x, slots), _gathered(buffers, a, x, slots)):
        torch.testing.assert_close(other, masked, rtol=1e-4, atol=1e-3)
    base = _time(lambda: functional.linear(x, weight))
    timings = {
        "masked (dense over the slots)": _time(lambda: buffers.delta(x, mask)),
        "segmented (per adapter)": _time(lambda: _segmented(buffers, a, x, slots)),
        "gathered (bmm per token)": _time(lambda: _gathered(buffers, a, x, slots)),
    }
    print(
        f"{x.shape[0]} tokens, {args.loras} adapters, rank {args.rank}: "
        f"base matmul {base * 1e6:.0f} us (the three agree)"
    )
    for name, seconds in timings.items():
        print(f"  {name}: {seconds * 1e6:.0f} us = {seconds / base:.2f}x the base matmul")


def _segmented(
    buffers: _SiteBuffers, a: torch.Tensor, x: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    out = torch.zeros(x.shape[0], sum(SITE.out_features))
    rank = buffers.rank
    for slot in range(1, a.shape[0] + 1):
        rows = (slots == slot).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        xa = x[rows] @ a[slot - 1].T
        parts = [
            xa[:, p * rank : (p + 1) * rank] @ bt[(slot - 1) * rank : slot * rank]
            for p, bt in enumerate(buffers.bt)
        ]
        out.index_add_(0, rows, torch.cat(parts, dim=-1))
    return out


def _gathered(
    buffers: _SiteBuffers, a: torch.Tensor, x: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    rank, index = buffers.rank, (slots - 1).clamp(min=0)
    keep = (slots > 0).to(x.dtype)[:, None, None]
    xa = torch.bmm(a[index], x[:, :, None]) * keep  # [T, parts * rank, 1]
    parts = []
    for p, bt in enumerate(buffers.bt):
        b = bt.view(a.shape[0], rank, -1)[index]  # [T, rank, out_p]
        parts.append(torch.bmm(xa[:, p * rank : (p + 1) * rank].transpose(1, 2), b)[:, 0])
    return torch.cat(parts, dim=-1)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--loras", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    return parser.parse_args()


if __name__ == "__main__":
    main()
