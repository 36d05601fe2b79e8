"""Loading a model for the engine, or saying in one line why it cannot be served.

The config is read and judged first (architecture, options, quantization), so that
most refusals come before any weight loads; then the tokenizer and the weights, with
checkpoints transformers can dequantize (FP8, compressed-tensors) dequantized; then
every parameter is checked for anything quantized left behind, whose scales the
fused forward would drop. Every failure is a :class:`ModelLoadError` (or
:class:`UnsupportedModel`) whose message names the model and what is wrong.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from worker.engine.errors import ModelLoadError, UnsupportedModel
from worker.engine.models import family_for, refusal
from worker.engine.models.family import Family

log = logging.getLogger(__name__)

# Parameters a quantized linear layer keeps beside its weight: a checkpoint still
# holding them was not dequantized, and a fused weight would drop them.
QUANTIZATION_PARAMS = frozenset(
    {
        "weight_scale",
        "weight_scale_inv",
        "input_scale",
        "weight_zero_point",
        "weight_global_scale",
        "weight_packed",
        "qweight",
        "qzeros",
        "scales",
        "g_idx",
    }
)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class LoadedModel:
    model: Any  # the transformers causal LM, on its device, in eval mode
    tokenizer: PreTrainedTokenizerBase
    family: Family | None  # None: no description; transformers' forward, if it passes the check


def load_model(
    name: str,
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """The model at ``path`` (``name`` is what the operator asked for, for messages)."""
    config = read_config(name, path, trust_remote_code)
    text_config = config.get_text_config()
    reason = refusal(text_config)
    if reason is not None:
        raise UnsupportedModel(f"model {name} ({text_config.model_type}): {reason}")
    quantization = _quantization(name, config)
    tokenizer = _load(name, AutoTokenizer, path, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    model = _load(name, AutoModelForCausalLM, path, **kwargs)
    model.to(device).eval()
    check_dequantized(name, model)
    return LoadedModel(model, tokenizer, family_for(text_config))


def read_config(name: str, path: str | Path, trust_remote_code: bool) -> Any:
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise _load_error(name, path, e) from e


def _load(name: str, kind: Any, path: str | Path, **kwargs: Any) -> Any:
    try:
        return kind.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as e:
        raise _load_error(name, path, e) from e


def _load_error(name: str, path: str | Path, error: Exception) -> ModelLoadError:
    """One line for what transformers raised (its own messages run to paragraphs)."""
    text = str(error)
    if "trust_remote_code" in text:
        return UnsupportedModel(
            f"model {name} needs code from its own repository (trust_remote_code): start the "
            "worker with --trust-remote-code if you trust that code"
        )
    if "Unrecognized configuration class" in text or "does not recognize this architecture" in text:
        return UnsupportedModel(f"model {name}: not a causal language model transformers can load")
    if isinstance(error, OSError) and not Path(path).exists():
        return ModelLoadError(_hub_reason(name))
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return ModelLoadError(f"model {name}: cannot be loaded: {first_line}")


def _hub_reason(name: str) -> str:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        why = "the hub is switched off here (HF_HUB_OFFLINE=1)"
    else:
        why = "the Hugging Face hub cannot be reached (no network?)"
    return (
        f"model {name}: not a local path, and not in the Hugging Face cache while {why}; "
        "download it where the hub is reachable, or pass a local directory or .gguf file"
    )


def _quantization(name: str, config: Any) -> Any:
    """What to load a quantized checkpoint with (dequantized), or None for a plain one;
    a quantization the engine cannot run is refused by name."""
    raw = getattr(config, "quantization_config", None)
    if raw is None:
        return None
    settings = raw if isinstance(raw, dict) else raw.to_dict()
    method = str(settings.get("quant_method", "unknown"))
    if method == "fp8":
        from transformers import FineGrainedFP8Config

        fp8 = FineGrainedFP8Config.from_dict(  # type: ignore[no-untyped-call]
            {**settings, "dequantize": True}
        )
        return fp8
    if method == "compressed-tensors":
        if importlib.util.find_spec("compressed_tensors") is None:
            raise UnsupportedModel(
                f"model {name}: compressed-tensors checkpoints need the compressed-tensors "
                "package to be dequantized (pip install compressed-tensors)"
            )
        from transformers import CompressedTensorsConfig

        return CompressedTensorsConfig.from_dict(  # type: ignore[no-untyped-call]
            {**settings, "run_compressed": False}
        )
    raise UnsupportedModel(
        f"model {name}: {method} quantization is not supported (only FP8 and compressed-tensors "
        "checkpoints, dequantized); use an unquantized checkpoint"
    )


def check_dequantized(name: str, model: Any) -> None:
    """Refuse a model with anything quantized left in it (see the module docs)."""
    for module_name, module in model.named_modules():
        for param_name, param in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]:
            quantized = param_name in QUANTIZATION_PARAMS or (
                param_name.endswith(("weight", "bias")) and param.dtype not in FLOAT_DTYPES
            )
            if quantized:
                where = f"{module_name}.{param_name}" if module_name else param_name
                raise UnsupportedModel(
                    f"model {name}: {where} ({param.dtype}) is still quantized after loading; "
                    "its scales would be dropped, so it is not served"
                )
