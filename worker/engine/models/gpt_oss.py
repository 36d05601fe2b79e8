"""gpt-oss: attention with biases and per-head sinks, a window on alternate layers, and
a sparse MLP whose router has a bias and softmaxes over its top-k logits, whose
experts' gate and up are interleaved and go through a clamped SwiGLU."""

from worker.engine.models.family import ExpertActivation, Family, Moe, Router, layer_type_windows

FAMILY = Family(
    "gpt_oss",
    ("gpt_oss",),
    windows=layer_type_windows,
    sinks=True,
    moe=Moe(
        router="router",
        rule=Router.TOPK_SOFTMAX,
        transposed=True,
        activation=ExpertActivation.CLAMPED_SWIGLU,
    ),
)
