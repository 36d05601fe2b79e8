"""Qwen3.5-MoE (its text model): Qwen3.5's layers with a sparse MLP on every layer
(softmax router, top-k renormalised) beside a shared expert scaled by a sigmoid gate."""

from worker.engine.models.family import Family, Moe, QKNorm, StateLayer
from worker.engine.models.gated_deltanet import GatedDeltaNet

FAMILY = Family(
    "qwen3_5_moe",
    ("qwen3_5_moe_text",),
    norm_offset=1.0,
    qk_norm=QKNorm.PER_HEAD,
    attn_gate=True,
    state=StateLayer("linear_attention", "linear_attn", GatedDeltaNet.qwen3_5),
    moe=Moe(shared="mlp.shared_expert", shared_gate="mlp.shared_expert_gate"),
)
