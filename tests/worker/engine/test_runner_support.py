"""The runner's dtype choice: bf16 weights on the CPU only where it computes in bf16."""

from __future__ import annotations

import pytest
import torch

from worker.engine import runner_support
from worker.engine.runner_support import pick_dtype


def test_bf16_on_a_cpu_without_native_bf16_is_refused_and_served_where_it_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(runner_support, "native_bf16", lambda: False)
    with pytest.raises(ValueError, match="no native bf16"):
        pick_dtype("bfloat16", cpu)
    assert pick_dtype("auto", cpu) is torch.float32
    monkeypatch.setattr(runner_support, "native_bf16", lambda: True)
    assert pick_dtype("bf16", cpu) is torch.bfloat16
    assert pick_dtype("auto", cpu) is torch.float32  # fp32 stays the CPU's default


def test_native_bf16_reads_the_cpus_flags() -> None:
    with open("/proc/cpuinfo") as f:
        flags = next((line for line in f if line.startswith("flags")), "")
    expected = "avx512_bf16" in flags.split() or "amx_bf16" in flags.split()
    assert runner_support.native_bf16() is expected
