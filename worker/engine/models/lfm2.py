"""LFM2: short convolution layers (``conv``) interleaved with attention (per-head q/k
norms named ``q_layernorm``/``k_layernorm``, output ``out_proj``); its MLP is
``feed_forward`` (``w1`` gate, ``w3`` up, ``w2`` down, SiLU), its norms
``operator_norm`` and ``ffn_norm``, its final norm ``embedding_norm``."""

from worker.engine.models.family import Family, Norms, QKNorm, StateLayer
from worker.engine.models.short_conv import ShortConv

FAMILY = Family(
    "lfm2",
    ("lfm2",),
    norms=Norms("operator_norm", None, "ffn_norm", None),
    qk_norm=QKNorm.PER_HEAD,
    qk_norms=("q_layernorm", "k_layernorm"),
    attn_out="out_proj",
    mlp="feed_forward",
    gate_up=("w1", "w3"),
    down="w2",
    final_norm="embedding_norm",
    state=StateLayer("conv", "conv", ShortConv),
)
