"""Granite: Llama with multipliers on the embeddings, the residual branches and the
attention scores (its attention module's ``scaling``), and logits divided by
``logits_scaling``."""

from worker.engine.models.family import Family

FAMILY = Family(
    "granite",
    ("granite",),
    embed_scale=lambda config: float(config.embedding_multiplier),
    residual_scale="residual_multiplier",
    logit_divisor="logits_scaling",
)
