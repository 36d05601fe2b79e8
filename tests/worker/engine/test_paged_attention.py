"""The paged Triton kernel equals attention over each token's gathered context, with a
sliding window, soft-capped scores and per-head sinks: on the CPU through Triton's
interpreter (``TRITON_INTERPRET=1``), and on CUDA (``-m cuda``)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from worker.engine import paged_attention

BLOCK_SIZE = 16
HEAD_DIM = 16
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "window": {"window": 7},
    "softcap": {"softcap": 2.0},
    "sinks": {"sinks": True},
    "all": {"window": 20, "softcap": 3.0, "sinks": True},
}


def reference(
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    tables: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    options: dict[str, Any],
) -> torch.Tensor:
    """Each token against its gathered context, computed plainly in fp32."""
    k_cache, v_cache = caches
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q, dtype=torch.float32)
    for t, (row, pos) in enumerate(zip(rows.tolist(), positions.tolist(), strict=True)):
        if pos < 0:
            continue
        first = max(0, pos + 1 - options["window"]) if options.get("window") else 0
        context = torch.arange(first, pos + 1, device=q.device)
        slots = tables[row][context // BLOCK_SIZE].long() * BLOCK_SIZE + context % BLOCK_SIZE
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)
        values = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,chd->hc", q[t].float(), keys) / math.sqrt(q.shape[-1])
        if options.get("softcap"):
            scores = options["softcap"] * torch.tanh(scores / options["softcap"])
        if options.get("sinks") is not None:
            scores = torch.cat([scores, options["sinks"][:, None]], dim=1)
        probs = torch.softmax(scores, dim=-1)[:, : len(context)]
        out[t] = torch.einsum("hc,chd->hd", probs, values)
    return out


def check_kernel(device: torch.device, dtype: torch.dtype, name: str, tolerance: float) -> None:
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return (2 * torch.randn(*shape, generator=generator)).to(device, dtype)

    caches = (randn(24 * BLOCK_SIZE, 2, HEAD_DIM), randn(24 * BLOCK_SIZE, 2, HEAD_DIM))
    tables = torch.randperm(24, generator=generator)[:18].view(3, 6).int().to(device)
    # Decode rows, a chunk's consecutive tokens, a token at position 0, and padding.
    rows = torch.tensor([0, 1, 1, 1, 1, 2, 2, 0], dtype=torch.int32, device=device)
    positions = torch.tensor([90, 30, 31, 32, 33, 0, 57, -1], dtype=torch.int32, device=device)
    q = randn(8, 6, HEAD_DIM)
    options = dict(OPTIONS[name])
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(6, generator=generator).to(device) * 3
    out = paged_attention.paged_attention(
        q, *caches, tables, rows, positions, HEAD_DIM**-0.5, BLOCK_SIZE, **options
    )
    expected = reference(q, caches, tables, rows, positions, options)
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    assert out[7].abs().max().item() == 0  # a padding token reads nothing
    if name != "plain":  # the option changes the result: the comparison is not vacuous
        plain = reference(q, caches, tables, rows, positions, {})
        assert (plain - expected).abs().max().item() > 10 * tolerance


def check_all_interpreted() -> None:
    """Every option set through the interpreter; each failure reported by name."""
    failures = []
    for name in OPTIONS:
        try:
            check_kernel(torch.device("cpu"), torch.float32, name, 1e-4)
        except AssertionError as e:
            failures.append(f"{name}: {e}")
    if failures:
        raise AssertionError("\n".join(failures))


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="the dev extra installs triton"
)
def test_the_kernel_through_tritons_interpreter_equals_gathered_attention() -> None:
    # The interpreter takes over only where TRITON_INTERPRET is set before triton loads:
    # a process of its own, which checks every option set.
    code = f"from {__name__} import check_all_interpreted; check_all_interpreted()"
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_kernel_on_cuda_equals_gathered_attention(name: str) -> None:
    check_kernel(torch.device("cuda"), torch.float32, name, 1e-3)
    check_kernel(torch.device("cuda"), torch.bfloat16, name, 3e-2)
