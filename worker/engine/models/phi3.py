"""Phi-3: q/k/v and gate/up already fused in the checkpoint, partial rotary where
configured, longrope for the long-context models (whose ``generate`` recomputes a
sequence whole when it grows past the original context), a window on every layer
where set."""

from worker.engine.models.family import Family, every_layer_window

FAMILY = Family(
    "phi3",
    ("phi3",),
    qkv=("qkv_proj",),
    gate_up=("gate_up_proj",),
    windows=every_layer_window,
    recompute_on_rope_switch=True,
)
