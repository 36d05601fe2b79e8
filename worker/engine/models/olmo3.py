"""OLMo 3: OLMo 2 with a window on the sliding layers and rope parameters per layer type."""

from worker.engine.models.family import (
    POST_NORM,
    Family,
    QKNorm,
    layer_type_windows,
    rope_per_layer_type,
)

FAMILY = Family(
    "olmo3",
    ("olmo3",),
    norms=POST_NORM,
    qk_norm=QKNorm.WHOLE,
    windows=layer_type_windows,
    rope_sets=rope_per_layer_type,
)
