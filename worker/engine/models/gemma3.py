"""Gemma 3 (text): Gemma 2's layers with per-head q/k norms and rope parameters per
layer type (local and global); transformers applies no attention soft-cap."""

from worker.engine.models.family import (
    SANDWICH_NORM,
    Family,
    QKNorm,
    bidirectional,
    layer_type_windows,
    rope_per_layer_type,
)

FAMILY = Family(
    "gemma3",
    ("gemma3_text",),
    norms=SANDWICH_NORM,
    norm_offset=1.0,
    qk_norm=QKNorm.PER_HEAD,
    windows=layer_type_windows,
    rope_sets=rope_per_layer_type,
    final_softcap="final_logit_softcapping",
    embed_scale=lambda config: float(config.hidden_size**0.5),
    unsupported=bidirectional,
)
