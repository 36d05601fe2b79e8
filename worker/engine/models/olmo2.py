"""OLMo 2: RMSNorms after attention and MLP only, one RMSNorm over all of q (and k)."""

from worker.engine.models.family import POST_NORM, Family, QKNorm

FAMILY = Family("olmo2", ("olmo2",), norms=POST_NORM, qk_norm=QKNorm.WHOLE)
