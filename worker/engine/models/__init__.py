"""Model families on one fused forward (see ``decoder``), each described as data.

A family is a short file here: a :class:`~worker.engine.models.family.Family` naming
the shared parts it uses. :func:`family_for` finds a config's family, and
:func:`refusal` says, from the config alone and before any weight loads, why a
model cannot be run exactly (None when nothing is known against it).
"""

from __future__ import annotations

from typing import Any

from worker.engine.models import (
    gemma2,
    gemma3,
    gpt_oss,
    granite,
    granitemoehybrid,
    lfm2,
    llama,
    mistral,
    mixtral,
    olmo2,
    olmo3,
    phi3,
    qwen2,
    qwen3,
    qwen3_5,
    qwen3_5_moe,
    qwen3_moe,
    qwen3_next,
    smollm3,
)
from worker.engine.models.family import Family

FAMILIES: tuple[Family, ...] = tuple(
    module.FAMILY
    for module in (
        llama,
        mistral,
        qwen2,
        qwen3,
        qwen3_moe,
        mixtral,
        gemma2,
        gemma3,
        phi3,
        olmo2,
        olmo3,
        granite,
        smollm3,
        gpt_oss,
        qwen3_5,
        qwen3_5_moe,
        qwen3_next,
        lfm2,
        granitemoehybrid,
    )
)
_BY_MODEL_TYPE = {model_type: f for f in FAMILIES for model_type in f.model_types}

# Layers that keep a recurrent or convolution state per sequence, by the layer type
# their configs name, and model types that have them: served where a family describes
# them (hybrids: ``Family.state``), refused otherwise.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
STATE_SPACE_MODEL_TYPES = frozenset(
    {
        "mamba",
        "mamba2",
        "falcon_mamba",
        "rwkv",
        "xlstm",
        "recurrent_gemma",
        "jamba",
        "bamba",
        "zamba",
        "zamba2",
        "falcon_h1",
        "granitemoehybrid",
        "nemotron_h",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "lfm2",
        "lfm2_moe",
        "kimi_linear",
        "olmo_hybrid",
        "bailing_hybrid",
    }
)


def family_for(config: Any) -> Family | None:
    """The described family of a (text) config, or None."""
    return _BY_MODEL_TYPE.get(config.model_type)


def refusal(config: Any) -> str | None:
    """Why the engine cannot run a model exactly, from its text config; None if no
    known reason (a family without a description may still pass the self-check)."""
    family = family_for(config)
    reason = _architecture_refusal(config)
    if reason is None and family is not None:
        reason = family.unsupported(config)
    return reason


def _architecture_refusal(config: Any) -> str | None:
    if getattr(config, "kv_lora_rank", None):
        return "multi-head latent attention (MLA) is not supported"
    if getattr(config, "attention_chunk_size", None):
        return "chunked attention (as in Llama 4) is not supported"
    family = family_for(config)
    if family is not None and family.state is not None:
        return _hybrid_refusal(config, family.state.layer_type)
    layer_types = set(getattr(config, "layer_types", None) or ())
    if config.model_type in STATE_SPACE_MODEL_TYPES or layer_types - ATTENTION_LAYER_TYPES:
        kinds = ", ".join(sorted(layer_types - ATTENTION_LAYER_TYPES)) or config.model_type
        return (
            f"layers with recurrent or convolution state ({kinds}) are not supported in this "
            f"family (the hybrids served are {HYBRIDS})"
        )
    return None


HYBRIDS = "Qwen3.5 and Qwen3.5-MoE, Qwen3-Next, LFM2 and Granite 4.0-H"


def _hybrid_refusal(config: Any, state_type: str) -> str | None:
    """A described hybrid runs full attention and its own state layers, nothing else."""
    layer_types = list(config.layer_types)
    unknown = set(layer_types) - {"full_attention", state_type}
    if unknown:
        return f"layers of type {', '.join(sorted(unknown))} are not supported in this family"
    if "full_attention" not in layer_types:
        return "a model of state layers only, with no attention layer, is not supported"
    return None
