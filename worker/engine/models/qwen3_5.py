"""Qwen3.5 (dense; its text model): Gated DeltaNet layers (``linear_attn``) interleaved
with attention whose queries come with a per-head output gate, per-head q/k norms and
a partial rotary (its multimodal rope, with the one text position on every axis, is
plain rope); zero-centred RMSNorms (scaling by ``1 + weight``)."""

from worker.engine.models.family import Family, QKNorm, StateLayer
from worker.engine.models.gated_deltanet import GatedDeltaNet

FAMILY = Family(
    "qwen3_5",
    ("qwen3_5_text",),
    norm_offset=1.0,
    qk_norm=QKNorm.PER_HEAD,
    attn_gate=True,
    state=StateLayer("linear_attention", "linear_attn", GatedDeltaNet.qwen3_5),
)
