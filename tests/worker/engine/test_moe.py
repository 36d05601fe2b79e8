"""A MoE layer on the CPU: each expert's projections run through oneDNN with their
weights reordered once (as the dense layers' are), and give what the grouped matmul
over transformers' own expert tensors gives."""

from __future__ import annotations

import pytest
import torch

from tests.worker.engine.tiny_models import SPECS, TinySpec, build_model, make_config
from worker.engine.models import family_for
from worker.engine.models.moe import SparseMoe

MOE_SPECS = [s for s in SPECS if s.name in ("qwen3_moe", "mixtral", "gpt_oss")]


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),  # type: ignore[no-untyped-call]
    reason="a torch build without oneDNN runs the grouped matmul",
)
@pytest.mark.parametrize("spec", MOE_SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("num_tokens", [1, 5, 64])
def test_the_experts_run_packed_on_the_cpu_and_equal_the_grouped_matmul(
    spec: TinySpec, num_tokens: int
) -> None:
    config = make_config(spec)
    model = build_model(config)
    family = family_for(config)
    assert family is not None and family.moe is not None
    layer = next(layer for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    moe = SparseMoe(layer.mlp, family.moe, config)
    assert moe.packed is not None and len(moe.packed) == moe.num_experts
    grouped = SparseMoe(layer.mlp, family.moe, config)
    grouped.packed = None
    generator = torch.Generator().manual_seed(num_tokens)
    h = torch.randn(num_tokens, config.hidden_size, generator=generator)
    with torch.inference_mode():
        out, expected = moe(h, None, 0), grouped(h, None, 0)
        reference = layer.mlp(h[None])
    reference = reference[0] if isinstance(reference, tuple) else reference
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, reference[0], rtol=1e-4, atol=1e-4)
