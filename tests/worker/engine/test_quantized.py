"""Quantized checkpoints: FP8 (block scales) is dequantized on load, scales applied, and
serves what transformers' dequantized model generates; anything still quantized after
loading is refused rather than have its scales dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.worker.engine.test_families import run
from tests.worker.engine.tiny_models import SPECS_BY_NAME, greedy, prompts, save_tiny
from worker.engine import Engine, EngineConfig
from worker.engine.errors import UnsupportedModel
from worker.engine.loader import check_dequantized

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
BLOCK = 32


def to_fp8(path: Path) -> dict[str, torch.Tensor]:
    """Rewrite a saved model's projections as FP8 with per-block scales (as DeepSeek and
    Qwen publish them); returns each projection's dequantized weight."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    expected = {}
    for name, weight in list(tensors.items()):
        if not name.endswith("proj.weight"):
            continue
        rows, cols = weight.shape
        blocks = weight.view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)) / 448.0
        quantized = (blocks / scale[:, None, :, None]).view(rows, cols).to(torch.float8_e4m3fn)
        tensors[name] = quantized
        tensors[name.replace(".weight", ".weight_scale_inv")] = scale
        dequantized = quantized.float().view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
        expected[name] = (dequantized * scale[:, None, :, None]).view(rows, cols)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
    }
    (path / "config.json").write_text(json.dumps(config))
    return expected


def test_an_fp8_checkpoint_is_dequantized_with_its_scales_and_serves(
    model_path: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    path = save_tiny(SPECS_BY_NAME["qwen3"], tmp_path, model_path)
    expected_weights = to_fp8(path)
    engine = Engine(EngineConfig(model=str(path), device="cpu", kv_cache_mib=2))
    q_proj = engine.runner.model.model.layers[0].self_attn.q_proj.weight
    assert q_proj.dtype == torch.float32
    name = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(q_proj, expected_weights[name], rtol=0, atol=0)
    # transformers' own dequantization (a GPU would otherwise run it in FP8).
    dequantize = FineGrainedFP8Config(dequantize=True, weight_block_size=(BLOCK, BLOCK))
    reference: object = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=dequantize
    )
    expected = [greedy(reference, prompt, 10).token_ids for prompt in prompts()]
    assert [g.token_ids for g in run(engine)] == expected


def test_a_layer_still_quantized_after_loading_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    check_dequantized("plain", model)  # a plain model passes
    model[0].register_parameter("weight_scale", torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(UnsupportedModel, match=r"0.weight_scale .* is still quantized"):
        check_dequantized("scaled", model)
    packed = torch.nn.Sequential(torch.nn.Linear(4, 4))
    packed[0].weight = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False)
    with pytest.raises(UnsupportedModel, match=r"0.weight \(torch.int8\) is still quantized"):
        check_dequantized("packed", packed)
