"""Three ways to add per-row LoRA deltas at one projection site, timed in one run.

    python bench/lora_ops.py [--tokens 32 512] [--loras 4] [--rank 16]

Shapes are the default model's q/k/v site (576 in; 576 + 192 + 192 out). Each row
uses one of ``--loras`` adapters or none, at random. Printed: each method's time per
call against the base projection's own matmul, for a decode-sized and a prefill-sized
step (``--threads`` sets torch's threads). ``grouped`` is what worker/engine/lora.py
does.
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
    for slot, weights in enumerate(_adapters(args.loras, args.rank), start=1):
        buffers.write(slot, 0, weights)
    weight = torch.randn(sum(SITE.out_features), SITE.in_features)
    for num_tokens in args.tokens:
        x = torch.randn(num_tokens, SITE.in_features)
        slots = torch.randint(0, args.loras + 1, (num_tokens,))
        with torch.inference_mode():
            _report(buffers, weight, x, slots, args)


def _report(
    buffers: _SiteBuffers,
    weight: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    args: argparse.Namespace,
) -> None:
    groups, rows = _groups(slots, args.loras)
    a_rows = buffers.at.transpose(1, 2).reshape(-1, SITE.in_features).contiguous()
    mask = (slots[:, None] == torch.arange(1, args.loras + 1)[None]).float()
    methods: dict[str, Callable[[], torch.Tensor]] = {
        "grouped (bmm over the adapters' row groups; the engine's)": lambda: _grouped(
            buffers, x, groups, rows
        ),
        "masked (dense over every slot, one-hot mask)": lambda: _masked(buffers, a_rows, x, mask),
        "segmented (a matmul pair per adapter)": lambda: _segmented(buffers, x, slots),
        "gathered (each token's own A and B, bmm)": lambda: _gathered(buffers, x, slots),
    }
    results = [method() for method in methods.values()]
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=1e-4, atol=1e-3)
    base = _time(lambda: functional.linear(x, weight))
    print(
        f"{x.shape[0]} tokens, {args.loras} adapters, rank {args.rank}, "
        f"torch threads {torch.get_num_threads()}: base matmul {base * 1e6:.0f} us "
        "(the four agree)"
    )
    for name, method in methods.items():
        seconds = _time(method)
        print(f"  {name}: {seconds * 1e6:.0f} us = {seconds / base:.2f}x the base matmul")


def _groups(slots: torch.Tensor, num_loras: int) -> tuple[torch.Tensor, torch.Tensor]:
    members = [(slots == s).nonzero().squeeze(1).tolist() for s in range(1, num_loras + 1)]
    width, pad = max(len(m) for m in members), slots.shape[0]
    groups = [[*m, *[pad] * (width - len(m))] for m in members]
    rows = [i if i < pad else 0 for g in groups for i in g]
    return torch.tensor(groups), torch.tensor(rows)


def _grouped(
    buffers: _SiteBuffers, x: torch.Tensor, groups: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], sum(SITE.out_features))
    return out.index_add_(0, rows, buffers.delta(x, groups).view(-1, out.shape[1]))


def _masked(
    buffers: _SiteBuffers, a_rows: torch.Tensor, x: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    num_tokens, n, rank = x.shape[0], mask.shape[1], buffers.rank
    xa = functional.linear(x, a_rows).view(num_tokens, n, len(SITE.parts), rank)
    xa = xa * mask[:, :, None, None]
    outs = [
        xa[:, :, p, :].reshape(num_tokens, n * rank) @ bt.reshape(n * rank, -1)
        for p, bt in enumerate(buffers.bt)
    ]
    return torch.cat(outs, dim=-1)


def _segmented(buffers: _SiteBuffers, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], sum(SITE.out_features))
    rank = buffers.rank
    for slot in range(1, buffers.at.shape[0] + 1):
        rows = (slots == slot).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        xa = x[rows] @ buffers.at[slot - 1]
        parts = [xa[:, p * rank : (p + 1) * rank] @ bt[slot - 1] for p, bt in enumerate(buffers.bt)]
        out.index_add_(0, rows, torch.cat(parts, dim=-1))
    return out


def _gathered(buffers: _SiteBuffers, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    rank, index = buffers.rank, (slots - 1).clamp(min=0)
    keep = (slots > 0).to(x.dtype)[:, None, None]
    xa = torch.bmm(x[:, None, :], buffers.at[index]) * keep  # [T, 1, parts * rank]
    parts = [
        torch.bmm(xa[:, :, p * rank : (p + 1) * rank], bt[index])[:, 0]
        for p, bt in enumerate(buffers.bt)
    ]
    return torch.cat(parts, dim=-1)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--loras", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


if __name__ == "__main__":
    main()
