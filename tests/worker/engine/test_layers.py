"""The fused forward's projections: oneDNN with a reordered weight on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from worker.engine.models.layers import Projection


@pytest.mark.parametrize("num_rows", [1, 7, 64, 300])
def test_a_projection_gives_what_functional_linear_gives(num_rows: int) -> None:
    generator = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(960, 576, generator=generator)
    x = torch.randn(num_rows, 576, generator=generator)
    with torch.inference_mode():
        out = Projection(weight)(x)
        expected = functional.linear(x, weight)
    assert out.shape == (num_rows, 960) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


def test_a_projection_reads_a_strided_input() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(576, 1536, generator=generator)
    wide = torch.randn(16, 3072, generator=generator)
    gate = wide[:, :1536]  # a view with a row stride of 3072, as a chunk gives
    with torch.inference_mode():
        torch.testing.assert_close(
            Projection(weight)(gate), functional.linear(gate, weight), rtol=1e-5, atol=1e-4
        )


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),  # type: ignore[no-untyped-call]
    reason="a torch build without oneDNN runs functional.linear",
)
def test_on_the_cpu_fp32_weights_are_reordered_once_for_onednn() -> None:
    projection = Projection(torch.randn(64, 32))
    assert projection.packed is not None and projection.packed.is_mkldnn
    assert Projection(torch.randn(64, 32, dtype=torch.bfloat16)).packed is None
