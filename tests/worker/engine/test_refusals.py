"""A model the engine cannot load or run exactly is refused from ``Engine(...)`` with
one line naming the model and what is wrong, before any weight loads where the
config alone shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.engine import Engine, EngineConfig
from worker.engine.errors import ModelLoadError, UnsupportedModel


def save_config(directory: Path, model_type: str, **fields: Any) -> Path:
    """A model directory holding only its config: a refusal from the config alone must
    come before the (absent) weights are looked for."""
    from transformers import AutoConfig

    directory.mkdir(parents=True)
    AutoConfig.for_model(model_type, **fields).save_pretrained(directory)
    return directory


def refusal(path: Path | str, **config: Any) -> str:
    with pytest.raises(ModelLoadError) as raised:
        Engine(EngineConfig(model=str(path), **config))
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize(
    ("model_type", "fields", "reason"),
    [
        ("deepseek_v3", {}, "multi-head latent attention (MLA)"),
        # Hybrids without a description: their state layers are refused by name.
        ("nemotron_h", {}, "recurrent or convolution state (linear_attention, mlp, moe)"),
        ("jamba", {}, "recurrent or convolution state (linear_attention)"),
        ("lfm2_moe", {}, "recurrent or convolution state (lfm2_moe)"),
        # A described hybrid with layers its description does not know, or no attention.
        (
            "qwen3_5_text",
            {"layer_types": ["linear_attention", "sliding_attention"], "num_hidden_layers": 2},
            "layers of type sliding_attention are not supported",
        ),
        ("granitemoehybrid", {}, "state layers only, with no attention layer"),
        ("llama4_text", {}, "chunked attention"),
        ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional attention"),
    ],
)
def test_an_architecture_the_engine_cannot_run_is_refused_by_name(
    tmp_path: Path, model_type: str, fields: dict[str, Any], reason: str
) -> None:
    path = save_config(tmp_path / model_type, model_type, **fields)
    with pytest.raises(UnsupportedModel):
        Engine(EngineConfig(model=str(path)))
    message = refusal(path)
    assert reason in message and model_type in message


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes", "mxfp4"])
def test_a_quantization_the_engine_cannot_dequantize_is_refused_by_name(
    tmp_path: Path, method: str
) -> None:
    path = save_config(
        tmp_path / method, "llama", quantization_config={"quant_method": method, "bits": 4}
    )
    assert f"{method} quantization is not supported" in refusal(path)


def test_a_path_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    assert refusal(missing) == f"model {missing}: no such file or directory"
    assert "no such file" in refusal(tmp_path / "model.gguf")


def test_a_hub_name_without_a_hub_says_the_hub_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = refusal("someone/some-model-tokenq-never-saw")
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE=1" in message


def test_a_model_needing_its_own_code_is_refused_unless_trusted(tmp_path: Path) -> None:
    path = tmp_path / "custom"
    path.mkdir()
    config = {
        "model_type": "tokenq_custom",
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"},
    }
    (path / "config.json").write_text(json.dumps(config))
    assert "--trust-remote-code" in refusal(path)


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path: Path) -> None:
    path = save_config(tmp_path / "t5", "t5")
    assert "not a causal language model" in refusal(path)
