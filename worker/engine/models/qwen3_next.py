"""Qwen3-Next: Qwen3.5's layers with the Gated DeltaNet's projections grouped per key
head, and sparse MLPs (softmax router, top-k renormalised when ``norm_topk_prob``)
beside a shared expert scaled by a sigmoid gate; dense MLPs on ``mlp_only_layers``."""

from worker.engine.models.family import Family, Moe, QKNorm, StateLayer
from worker.engine.models.gated_deltanet import GatedDeltaNet

FAMILY = Family(
    "qwen3_next",
    ("qwen3_next",),
    norm_offset=1.0,
    qk_norm=QKNorm.PER_HEAD,
    attn_gate=True,
    state=StateLayer("linear_attention", "linear_attn", GatedDeltaNet.qwen3_next),
    moe=Moe(
        renormalize=lambda config: bool(config.norm_topk_prob),
        shared="mlp.shared_expert",
        shared_gate="mlp.shared_expert_gate",
    ),
)
