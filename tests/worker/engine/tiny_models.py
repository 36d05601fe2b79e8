"""Tiny random-weight models of every family the engine describes, and transformers'
greedy references on them.

Each model is built from a transformers config (``AutoConfig.for_model``), seeded,
with weights large enough (``initializer_range`` 0.2, and every norm weight and sink
perturbed) that windows, soft-caps and sinks change the greedy tokens, and saved
with the default model's tokenizer beside it. A :class:`TinySpec` names the
features its test must show to matter: the reference with each one switched off
differs from the reference with it on. Hybrid models (:data:`HYBRID_SPECS`) show
their recurrent and convolution layers' state to matter the same way: ``generate``
with that state dropped before every decode step gives other tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WINDOW = 12
HEAD_DIM = 16
BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": HEAD_DIM,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "initializer_range": 0.2,
    "bos_token_id": 1,
    "eos_token_id": None,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
ALTERNATE = ["sliding_attention", "full_attention"] * 2
# Long factors for longrope: what the long context rotates with, per frequency.
LONG_FACTORS = [1.0 + i for i in range(HEAD_DIM // 2)]


@dataclass(frozen=True)
class TinySpec:
    name: str
    model_type: str
    overrides: dict[str, Any] = field(default_factory=dict)
    # "window", "softcap", "final_softcap", "sinks", "rope", "state"
    features: tuple[str, ...] = ()
    max_model_len: int | None = None


def _rope(rope_type: str, **params: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, **params}}


SPECS = (
    TinySpec("llama", "llama"),
    TinySpec("llama-linear", "llama", _rope("linear", factor=2.0)),
    TinySpec(
        "llama-llama3",
        "llama",
        _rope(
            "llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
    ),
    TinySpec("llama-yarn", "llama", _rope("yarn", factor=4.0, original_max_position_embeddings=64)),
    TinySpec(
        "llama-dynamic",
        "llama",
        {"max_position_embeddings": 40, **_rope("dynamic", factor=4.0)},
        ("rope",),
        max_model_len=128,
    ),
    TinySpec(
        "llama-longrope",
        "llama",
        _rope(
            "longrope",
            short_factor=[1.0] * (HEAD_DIM // 2),
            long_factor=LONG_FACTORS,
            original_max_position_embeddings=40,
        ),
        ("rope",),
    ),
    TinySpec("mistral", "mistral", {"sliding_window": WINDOW}, ("window",)),
    TinySpec(
        "qwen2",
        "qwen2",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
        ("window",),
    ),
    TinySpec(
        "qwen3",
        "qwen3",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
        ("window",),
    ),
    TinySpec(
        "qwen3_moe",
        "qwen3_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    TinySpec(
        "mixtral",
        "mixtral",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
        ("window",),
    ),
    TinySpec(
        "gemma2",
        "gemma2",
        {
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 3.0,
            "final_logit_softcapping": 4.0,
        },
        ("window", "softcap", "final_softcap"),
    ),
    TinySpec(
        "gemma3",
        "gemma3_text",
        {
            "sliding_window": WINDOW,
            "layer_types": ALTERNATE,
            "query_pre_attn_scalar": 24,
            "final_logit_softcapping": 4.0,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 2.0},
            },
        },
        ("window", "final_softcap"),
    ),
    TinySpec(
        "phi3",
        "phi3",
        {"sliding_window": WINDOW, **_rope("default", partial_rotary_factor=0.5)},
        ("window",),
    ),
    TinySpec(
        "phi3-longrope",
        "phi3",
        {
            "original_max_position_embeddings": 40,  # Phi-3's config sets it for its rope
            **_rope(
                "longrope",
                short_factor=[1.0] * (HEAD_DIM // 2),
                long_factor=LONG_FACTORS,
                original_max_position_embeddings=40,
            ),
        },
        ("rope",),
    ),
    TinySpec("olmo2", "olmo2"),
    TinySpec(
        "olmo3",
        "olmo3",
        {"sliding_window": WINDOW, "layer_types": ALTERNATE},
        ("window",),
    ),
    TinySpec(
        "granite",
        "granite",
        {
            "embedding_multiplier": 4.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.2,
            "logits_scaling": 2.0,
        },
    ),
    TinySpec(
        "smollm3",
        "smollm3",
        {"no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": WINDOW},
        ("window",),
    ),
    TinySpec(
        "gpt_oss",
        "gpt_oss",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "sliding_window": WINDOW,
            "layer_types": ALTERNATE,
        },
        ("window", "sinks"),
    ),
)
# Hybrids: state layers on alternate layers; attention wide enough (4 KiB of KV cache a
# token) that a 1 MiB budget holds a few of the prompts at once, not all of them.
WIDE_KV = {"num_key_value_heads": 4, "head_dim": 64}
GATED_DELTANET = {
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    **WIDE_KV,
}
MAMBA = {
    "layer_types": ["mamba", "attention"] * 2,
    "mamba_n_heads": 4,
    "mamba_d_state": 16,
    "mamba_chunk_size": 32,  # a 57-token prompt spans two of the scan's chunks
    "shared_intermediate_size": 64,
    "embedding_multiplier": 2.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.125,
    "logits_scaling": 2.0,
    **WIDE_KV,
}
SHARED_EXPERT = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}
HYBRID_SPECS = (
    TinySpec("qwen3_5", "qwen3_5_text", GATED_DELTANET, ("state",)),
    TinySpec("qwen3_5_moe", "qwen3_5_moe_text", {**GATED_DELTANET, **SHARED_EXPERT}, ("state",)),
    TinySpec(
        "qwen3_next",
        "qwen3_next",
        {**GATED_DELTANET, **SHARED_EXPERT, "mlp_only_layers": [1], "norm_topk_prob": True},
        ("state",),
    ),
    TinySpec(
        "lfm2", "lfm2", {"layer_types": ["conv", "full_attention"] * 2, **WIDE_KV}, ("state",)
    ),
    # Granite 4.0-H: no rotary, MoE beside the shared MLP; and a dense one with rotary.
    TinySpec(
        "granitemoehybrid",
        "granitemoehybrid",
        {**MAMBA, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
        ("state",),
    ),
    TinySpec(
        "granitemoehybrid-dense",
        "granitemoehybrid",
        {**MAMBA, "num_local_experts": 0, "position_embedding_type": "rope"},
        ("state",),
    ),
)
SPECS_BY_NAME = {spec.name: spec for spec in (*SPECS, *HYBRID_SPECS)}


def make_config(spec: TinySpec, **changes: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(spec.model_type, **{**BASE, **spec.overrides, **changes})


def build_model(config: Any, seed: int = 0) -> Any:
    """A random-weight causal LM of ``config`` (seeded), its norms and sinks perturbed
    so that a misplaced norm or a dropped sink changes the output."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, dtype=torch.float32
    )
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith("sinks"):
                param.copy_(2.0 * torch.randn(param.shape, generator=generator))
    return model.eval()


def save_tiny(spec: TinySpec, out_dir: Path, tokenizer_dir: str | Path) -> Path:
    """The spec's model saved at ``out_dir / spec.name``, with the default tokenizer."""
    from transformers import AutoTokenizer

    path = out_dir / spec.name
    build_model(make_config(spec)).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path


def prompts(num: int = 4, seed: int = 7) -> list[list[int]]:
    """Prompts longer than the window, of different lengths (35 crosses the rope
    switch at 40 while decoding; the others start past it)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [35, 41, 50, 57][:num]
    return [
        torch.randint(3, BASE["vocab_size"], (n,), generator=generator).tolist() for n in lengths
    ]


@dataclass
class Greedy:
    token_ids: list[int]
    logprobs: list[float]


def greedy(model: Any, prompt: list[int], max_new_tokens: int) -> Greedy:
    """transformers ``generate`` on one prompt alone: greedy tokens and their logprobs."""
    from transformers import GenerationConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers is untyped here
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    _reset_rotary(model)
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            generation_config=config,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [
        float(torch.log_softmax(step[0].float(), dim=-1)[token])
        for step, token in zip(out.logits, tokens, strict=True)
    ]
    return Greedy(tokens, logprobs)


def greedy_dropping_state(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from a cached forward whose recurrent and convolution states are
    zeroed before every decode step: what a hybrid gives with its state not kept."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    tokens: list[int] = []
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids, cache=cache, use_cache=True).logits
            tokens.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([[tokens[-1]]])
            for layer in cache.layers:
                for states in (
                    getattr(layer, "conv_states", {}),
                    getattr(layer, "recurrent_states", {}),
                ):
                    for state in states.values():
                        if state is not None:
                            state.zero_()
    return tokens


def _reset_rotary(model: Any) -> None:
    """A fresh start for rope kinds whose frequencies transformers updates as a
    sequence grows (``dynamic``): the reference is ``generate`` on a fresh model."""
    rotary = model.get_decoder().rotary_emb
    if (
        rotary is not None
        and hasattr(rotary, "original_inv_freq")
        and isinstance(rotary.rope_type, str)
    ):
        rotary.inv_freq = rotary.original_inv_freq.clone()
        rotary.max_seq_len_cached = rotary.original_max_seq_len


def load_reference_model(path: Path, **config_changes: Any) -> Any:
    """The saved model in eager attention (transformers' canonical attention math),
    with ``config_changes`` applied (a feature switched off)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, **config_changes)
    model: Any = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def feature_off(spec: TinySpec, feature: str) -> dict[str, Any]:
    """Config changes that switch ``feature`` off (sinks are switched off in weights)."""
    if feature == "window":
        return {"sliding_window": 10_000}
    if feature == "softcap":
        return {"attn_logit_softcapping": None}
    if feature == "final_softcap":
        return {"final_logit_softcapping": None}
    if feature == "rope":
        return _rope("default")
    return {}


def without_sinks(model: Any) -> Any:
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            layer.self_attn.sinks.fill_(-math.inf)
    return model
