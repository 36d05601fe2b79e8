"""LoRA adapters on families other than Llama (tiny random-weight models): each
family's adapter sites follow its own projections (Phi-3's fused ``qkv_proj``, a MoE
model's attention only), and the output equals transformers' with the adapter merged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.lora_adapters import AdapterSpec, make_adapter, merged_greedy
from tests.worker.engine.factories import make_request
from tests.worker.engine.tiny_models import SPECS_BY_NAME, prompts, save_tiny
from worker.engine import Engine, EngineConfig, RequestOutput
from worker.engine.lora_weights import AdapterError
from worker.engine.request import LoraRef

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

MAX_TOKENS = 8
TARGETS = {
    "qwen3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "qwen3_moe": ("q_proj", "k_proj", "v_proj", "o_proj"),  # experts take no adapter
}


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def generate(engine: Engine, lora: LoraRef | None) -> list[list[int]]:
    requests = [make_request(p, max_tokens=MAX_TOKENS, lora=lora) for p in prompts(2)]
    results = engine.generate(requests)
    return [tokens_of(results[r.request_id]) for r in requests]


@pytest.mark.parametrize("family", list(TARGETS))
def test_a_familys_adapter_gives_transformers_merged_output(
    family: str, model_path: str, tmp_path: Path
) -> None:
    path = save_tiny(SPECS_BY_NAME[family], tmp_path, model_path)
    spec = AdapterSpec(f"{family}-lora", 5, 8, 16, TARGETS[family])
    adapter = make_adapter(str(path), spec, tmp_path)
    engine = Engine(EngineConfig(model=str(path), device="cpu", kv_cache_mib=2, max_loras=2))
    lora = LoraRef(spec.name, str(adapter))
    got = generate(engine, lora)
    assert got == merged_greedy(str(path), adapter, prompts(2), MAX_TOKENS)
    assert got != generate(engine, None)  # the adapter changes the output


def test_an_adapter_on_projections_a_family_does_not_take_is_refused(
    model_path: str, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    path = save_tiny(SPECS_BY_NAME["qwen3_moe"], tmp_path, model_path)
    adapter = tmp_path / "dense-mlp.safetensors"
    prefix = "base_model.model.model.layers.1.mlp.down_proj"  # layer 1 of this model is dense
    save_file(
        {
            f"{prefix}.lora_A.weight": torch.ones(4, 128),
            f"{prefix}.lora_B.weight": torch.ones(64, 4),
        },
        str(adapter),
    )
    engine = Engine(EngineConfig(model=str(path), device="cpu", kv_cache_mib=2, max_loras=1))
    request = make_request(prompts(1)[0], lora=LoraRef("dense-mlp", str(adapter)))
    with pytest.raises(AdapterError, match="trains down_proj, which this model's forward"):
        engine.add_request(request)
