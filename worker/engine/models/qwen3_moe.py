"""Qwen3-MoE: Qwen3's attention; sparse MLPs (softmax router, top-k renormalised when
``norm_topk_prob``), dense ones on ``mlp_only_layers``; a window on every layer
where ``use_sliding_window`` sets one."""

from worker.engine.models.family import Family, Moe, QKNorm, every_layer_window

FAMILY = Family(
    "qwen3_moe",
    ("qwen3_moe",),
    qk_norm=QKNorm.PER_HEAD,
    windows=every_layer_window,
    moe=Moe(renormalize=lambda config: bool(config.norm_topk_prob)),
)
