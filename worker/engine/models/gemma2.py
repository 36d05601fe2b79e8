"""Gemma 2: RMSNorms scaling by ``1 + weight`` before and after attention and MLP,
embeddings scaled by sqrt(hidden), the scale ``query_pre_attn_scalar ** -0.5`` (its
attention module's ``scaling``), attention and final logits soft-capped, a window on
alternate layers."""

from worker.engine.models.family import SANDWICH_NORM, Family, bidirectional, layer_type_windows

FAMILY = Family(
    "gemma2",
    ("gemma2",),
    norms=SANDWICH_NORM,
    norm_offset=1.0,
    windows=layer_type_windows,
    attn_softcap="attn_logit_softcapping",
    final_softcap="final_logit_softcapping",
    embed_scale=lambda config: float(config.hidden_size**0.5),
    unsupported=bidirectional,
)
