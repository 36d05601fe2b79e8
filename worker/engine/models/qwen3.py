"""Qwen3: Qwen2's layers with a per-head RMSNorm on queries and keys."""

from worker.engine.models.family import Family, QKNorm, layer_type_windows

FAMILY = Family("qwen3", ("qwen3",), qk_norm=QKNorm.PER_HEAD, windows=layer_type_windows)
