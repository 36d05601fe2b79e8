"""Granite 4.0-H (``granitemoehybrid``): Mamba-2 layers (``mamba``) interleaved with
attention (rope only where ``position_embedding_type`` is "rope"), Granite's
multipliers (embeddings, residual branches, attention scores, logits), and on every
layer a shared gated MLP (``shared_mlp``: ``input_linear`` gate and up, then
``output_linear``) beside a sparse MoE (``block_sparse_moe``: the top-k router
logits, softmaxed) where the model has experts."""

from typing import Any

from worker.engine.models.family import Family, Moe, Router, StateLayer
from worker.engine.models.mamba2 import Mamba2


def _rope_sets(config: Any) -> list[str | None]:
    uses_rope = config.position_embedding_type == "rope"
    return ["" if uses_rope else None] * config.num_hidden_layers


FAMILY = Family(
    "granitemoehybrid",
    ("granitemoehybrid",),
    mlp="block_sparse_moe",
    gate_up=("input_linear",),
    down="output_linear",
    rope_sets=_rope_sets,
    embed_scale=lambda config: float(config.embedding_multiplier),
    residual_scale="residual_multiplier",
    logit_divisor="logits_scaling",
    state=StateLayer("linear_attention", "mamba", Mamba2),
    moe=Moe(router="router", rule=Router.TOPK_SOFTMAX, shared="shared_mlp"),
)
